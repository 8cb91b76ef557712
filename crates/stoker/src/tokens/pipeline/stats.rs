//! [`TokenStats`]: the token loader's counters (documents, tokens, padding, time per stage) and
//! the [`Bottleneck`] verdict over them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

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

/// Which part of a token pipeline limits its rate, and what to change.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bottleneck {
    /// `consumer` (the training step: the loader keeps up), `read`, `tokenize`, `pack`, or
    /// `handover` (no stage busy: batches too small for the cost of passing them on).
    pub stage: &'static str,
    /// The busiest stage's share of the wall time (per thread for tokenizing).
    pub busy_fraction: f64,
    /// The share of the wall time the consumer waited for batches.
    pub consumer_waited_fraction: f64,
    /// What to change.
    pub advice: &'static str,
}

impl TokenStats {
    /// The counters as JSON, with the `consumer_wait` seconds the pass measured (the shell's
    /// consumer counters).
    pub fn to_json(&self, consumer_wait: f64) -> serde_json::Value {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let s = |a: &AtomicU64| g(a) as f64 / 1e9;
        let (tokens, padding) = (g(&self.tokens), g(&self.padding));
        serde_json::json!({
            "documents": g(&self.documents),
            "failed_documents": g(&self.failed),
            "tokens": tokens,
            "padding_tokens": padding,
            "padding_fraction": if tokens + padding > 0 { padding as f64 / (tokens + padding) as f64 } else { 0.0 },
            "split_documents": g(&self.split),
            "dropped_tokens": g(&self.dropped),
            "rows": g(&self.rows),
            "bytes_read": g(&self.bytes),
            "seconds": {"read": s(&self.read_ns), "tokenize": s(&self.tokenize_ns), "pack": s(&self.pack_ns),
                        "consumer_wait": consumer_wait},
        })
    }

    /// The stage that limits the rate over `wall` seconds, with `threads` tokenizer threads
    /// (`tokenizes`: text, not stored token ids) and a consumer that waited `consumer_wait`
    /// seconds. A consumer that waited for less than a tenth
    /// of the time is the limit (the loader keeps up); else the busiest stage, per thread of
    /// it, unless none is busy for a third of the time (the batches' handover then dominates).
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
        Bottleneck { stage: limit, busy_fraction: busy / wall, consumer_waited_fraction: waited, advice }
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
        assert_eq!((b.stage, b.busy_fraction), ("tokenize", 1.0));
        assert!(b.advice.contains("stoker tokenize"), "{}", b.advice);
        // Over 8 threads tokenizing is 5 s each: reading is the limit.
        assert_eq!(stats(9.0, 40.0, 1.0).bottleneck(10.0, 8, true, 5.0).stage, "read");
        // Stored ids have no tokenizer to advise about.
        assert!(!stats(1.0, 40.0, 1.0).bottleneck(10.0, 4, false, 5.0).advice.contains("stoker tokenize"));
        // Nothing busy for a third of the time while the consumer waits: the handover.
        assert_eq!(stats(1.0, 4.0, 1.0).bottleneck(10.0, 4, true, 5.0).stage, "handover");
        // Packing busy 9.5 of 10 s beats reading's 9 s.
        assert_eq!(stats(9.0, 4.0, 9.5).bottleneck(10.0, 4, true, 5.0).stage, "pack");
    }
}
