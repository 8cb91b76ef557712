//! The token kind's part of its report: [`TokenStats`], the counters its threads record
//! (documents, tokens, padding, time per stage), the report's [`TokenSection`] built from them
//! (with the tokenizer and the token cache), the token stages and the token verdict.

use crate::observe::report::{percent, Bottleneck, Report, Section, StageReport};
use crate::tokens::autocache::TokenCacheReport;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The report of a token loader.
pub type TokenReport = Report<TokenSection>;

/// Counters of one loader, over its life.
#[derive(Debug, Default)]
pub struct TokenStats {
    /// Documents packed (failed ones included).
    pub documents: AtomicU64,
    /// Documents that failed (skipped).
    pub failed: AtomicU64,
    /// Document tokens delivered.
    pub tokens: AtomicU64,
    /// Padding tokens delivered.
    pub padding: AtomicU64,
    /// Documents split over rows (best fit: longer than a row).
    pub split: AtomicU64,
    /// Tokens of epoch tails dropped (concat), and of dropped last batches.
    pub dropped: AtomicU64,
    /// Rows delivered.
    pub rows: AtomicU64,
    /// Bytes of documents read.
    pub bytes: AtomicU64,
    /// Nanoseconds spent reading, tokenizing (all threads) and packing.
    pub read_ns: AtomicU64,
    /// See `read_ns`.
    pub tokenize_ns: AtomicU64,
    /// See `read_ns`.
    pub pack_ns: AtomicU64,
    /// When the loader's first iteration started.
    pub started: std::sync::OnceLock<Instant>,
}

/// The counters of a token loader at one moment ([`TokenStats::counts`]): `stats()` in Python,
/// and the counting part of the report's [`TokenSection`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenCounts {
    /// Documents packed (failed ones included).
    pub documents: u64,
    /// Documents that failed (skipped).
    pub failed_documents: u64,
    /// Document tokens delivered.
    pub tokens: u64,
    /// Padding tokens delivered.
    pub padding_tokens: u64,
    /// `padding_tokens / (tokens + padding_tokens)`.
    pub padding_fraction: f64,
    /// Documents split over rows.
    pub split_documents: u64,
    /// Tokens of epoch tails and dropped last batches.
    pub dropped_tokens: u64,
    /// Rows delivered.
    pub rows: u64,
    /// Bytes of documents read.
    pub bytes_read: u64,
    /// Seconds per stage.
    pub seconds: TokenSeconds,
}

/// Seconds spent per stage of a token loader.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenSeconds {
    /// Reading documents.
    pub read: f64,
    /// Tokenizing (summed over the threads).
    pub tokenize: f64,
    /// Packing rows.
    pub pack: f64,
    /// The consumer waiting for batches.
    pub consumer_wait: f64,
}

/// The tokenizer of a token loader, in its report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenizerReport {
    /// Its `tokenizer.json`.
    pub path: std::path::PathBuf,
    /// What runs it: stoker's byte-level BPE or `tokenizers`.
    pub engine: &'static str,
    /// Why that engine.
    pub why: String,
}

/// The token kind's section of its report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenSection {
    /// The counters.
    #[serde(flatten)]
    pub counts: TokenCounts,
    /// The tokenizer (`None`: token files, or a cache read without one).
    pub tokenizer: Option<TokenizerReport>,
    /// The token cache's counters, when the loader has one.
    pub cache: Option<TokenCacheReport>,
}

impl Section for TokenSection {
    fn items(&self) -> &'static str {
        "rows"
    }

    /// Tokens, padding and failed documents, and the token cache.
    fn text(&self) -> String {
        let c = &self.counts;
        let mut s = format!(
            "{} documents ({} failed), {} tokens, padding {:.1}%\n",
            c.documents,
            c.failed_documents,
            c.tokens,
            c.padding_fraction * 100.0
        );
        if let Some(k) = &self.cache {
            s.push_str(&format!(
                "token cache {}: {} hits, {} misses, {} stored; {} of {} documents cached\n",
                k.group.dir, k.group.hits, k.group.misses, k.group.stored, k.documents_cached, k.documents
            ));
        }
        s
    }
}

impl TokenStats {
    /// The counters now, with the `consumer_wait` seconds the pass measured (the shell's
    /// consumer counters).
    pub fn counts(&self, consumer_wait: f64) -> TokenCounts {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = |a: &AtomicU64| g(a) as f64 / 1e9;
        let (tokens, padding) = (g(&self.tokens), g(&self.padding));
        TokenCounts {
            documents: g(&self.documents),
            failed_documents: g(&self.failed),
            tokens,
            padding_tokens: padding,
            padding_fraction: if tokens + padding > 0 { padding as f64 / (tokens + padding) as f64 } else { 0.0 },
            split_documents: g(&self.split),
            dropped_tokens: g(&self.dropped),
            rows: g(&self.rows),
            bytes_read: g(&self.bytes),
            seconds: TokenSeconds {
                read: s(&self.read_ns),
                tokenize: s(&self.tokenize_ns),
                pack: s(&self.pack_ns),
                consumer_wait,
            },
        }
    }

    /// The token stages over `wall` seconds: `read` (one thread, documents), `tokenize`
    /// (`threads`, documents) and `pack` (one thread, rows); their wait is not measured.
    pub fn stages(&self, wall: f64, threads: usize) -> Vec<StageReport> {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let stage = |name: &str, threads: usize, items: u64, busy_ns: &AtomicU64| {
            let busy = g(busy_ns) as f64 * 1e-9;
            let utilization = if wall > 0.0 { busy / (wall * threads as f64) } else { 0.0 };
            StageReport { name: name.into(), threads, items, busy_seconds: busy, wait_seconds: 0.0, utilization }
        };
        let documents = g(&self.documents);
        vec![
            stage("read", 1, documents, &self.read_ns),
            stage("tokenize", threads.max(1), documents, &self.tokenize_ns),
            stage("pack", 1, g(&self.rows), &self.pack_ns),
        ]
    }

    /// The stage that limits the rate over `wall` seconds, with `threads` tokenizer threads
    /// (`tokenizes`: text, not stored token ids) and a consumer that waited `consumer_wait`
    /// seconds. A consumer that waited for less than a tenth
    /// of the time is the limit (the loader keeps up); else the busiest stage, per thread of
    /// it, unless none is busy for a third of the time (the batches' handover then dominates).
    /// The reason gives the consumer's waited share and the busiest stage's busy share.
    pub fn bottleneck(&self, wall: f64, threads: usize, tokenizes: bool, consumer_wait: f64) -> Bottleneck {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        let wall = wall.max(1e-9);
        let waited = consumer_wait / wall;
        let stages = [
            ("read", s(&self.read_ns)),
            ("tokenize", s(&self.tokenize_ns) / threads.max(1) as f64),
            ("pack", s(&self.pack_ns)),
        ];
        let (stage, busy) = stages.iter().copied().fold(("read", 0.0), |a, s| if s.1 > a.1 { s } else { a });
        let limit = if waited < 0.1 {
            "consumer"
        } else if busy < 0.3 * wall {
            "handover"
        } else {
            stage
        };
        let advice = match limit {
            "tokenize" if !tokenizes => "turning stored token ids into rows limits the rate: give more threads",
            "tokenize" => {
                "tokenizing limits the rate: tokenize once (`stoker tokenize DATA --tokenizer T OUT`, then load OUT), \
                 or give more threads"
            }
            "read" => "reading limits the rate: faster storage, or uncompressed files",
            "pack" => "packing limits the rate: a larger batch_size or seq_len amortises it",
            "handover" => {
                "no stage is busy: the batches are so small that handing them between threads dominates; \
                 a larger batch_size amortises it"
            }
            _ => "the consumer (the training step) limits the rate: the loader keeps up",
        };
        let per_thread = if stage == "tokenize" { " per thread" } else { "" };
        let reason = format!(
            "the consumer waited {} of the time; the busiest stage, {stage}, was busy {}{per_thread}",
            percent(waited),
            percent(busy / wall)
        );
        Bottleneck { stage: limit.into(), reason, suggestion: advice.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(read: f64, tokenize: f64, pack: f64) -> TokenStats {
        let s = TokenStats::default();
        let ns = |x: f64| (x * 1e9) as u64;
        s.read_ns.store(ns(read), Ordering::Relaxed);
        s.tokenize_ns.store(ns(tokenize), Ordering::Relaxed);
        s.pack_ns.store(ns(pack), Ordering::Relaxed);
        s
    }

    #[test]
    fn the_verdict_names_the_consumer_the_busiest_stage_per_thread_or_the_handover() {
        // The consumer hardly waited: the loader keeps up, whatever the stages did.
        assert_eq!(stats(9.0, 40.0, 1.0).bottleneck(10.0, 4, true, 0.5).stage, "consumer");
        // 40 s of tokenizing over 4 threads (10 s each) beats 9 s of reading.
        let b = stats(9.0, 40.0, 1.0).bottleneck(10.0, 4, true, 5.0);
        assert_eq!(b.stage, "tokenize");
        assert_eq!(
            b.reason,
            "the consumer waited 50% of the time; the busiest stage, tokenize, was busy 100% per thread"
        );
        assert!(b.suggestion.contains("stoker tokenize"), "{}", b.suggestion);
        // Over 8 threads tokenizing is 5 s each: reading is the limit.
        assert_eq!(stats(9.0, 40.0, 1.0).bottleneck(10.0, 8, true, 5.0).stage, "read");
        // Stored ids have no tokenizer to advise about.
        assert!(!stats(1.0, 40.0, 1.0).bottleneck(10.0, 4, false, 5.0).suggestion.contains("stoker tokenize"));
        // Nothing busy for a third of the time while the consumer waits: the handover.
        assert_eq!(stats(1.0, 4.0, 1.0).bottleneck(10.0, 4, true, 5.0).stage, "handover");
        // Packing busy 9.5 of 10 s beats reading's 9 s.
        assert_eq!(stats(9.0, 4.0, 9.5).bottleneck(10.0, 4, true, 5.0).stage, "pack");
    }

    #[test]
    fn the_counts_and_stages_are_the_counters() {
        let s = TokenStats::default();
        s.documents.store(10, Ordering::Relaxed);
        s.tokens.store(300, Ordering::Relaxed);
        s.padding.store(100, Ordering::Relaxed);
        s.rows.store(4, Ordering::Relaxed);
        s.tokenize_ns.store(8_000_000_000, Ordering::Relaxed);
        let c = s.counts(1.5);
        assert_eq!((c.documents, c.tokens, c.padding_tokens, c.rows), (10, 300, 100, 4));
        assert_eq!((c.padding_fraction, c.seconds.tokenize, c.seconds.consumer_wait), (0.25, 8.0, 1.5));
        let st = s.stages(2.0, 4);
        let names: Vec<&str> = st.iter().map(|x| x.name.as_str()).collect();
        assert_eq!(names, ["read", "tokenize", "pack"]);
        // 8 s of tokenizing over 4 threads in 2 s: all busy.
        assert_eq!((st[1].threads, st[1].items, st[1].utilization), (4, 10, 1.0));
        assert_eq!(st[2].items, 4);
    }
}
