//! [`TokenLoader`]: documents read, tokenized on stoker's threads and packed into batches of
//! `input_ids`, `labels`, `position_ids` and `cu_seqlens`, in pooled buffers.
//!
//! Threads of one iteration (all on the shell's [`Run`]):
//! - `stoker-text-read`: walks this rank's document order from the resume point, reads the
//!   documents (positional reads, or a decompressing stream) and sends them in chunks;
//! - `stoker-tokenize-K`: each owns a clone of the tokenizer; parses a chunk (JSON, UTF-8) and
//!   tokenizes it, without offsets;
//! - `stoker-pack`: puts chunks back in order and packs the document stream into rows
//!   ([`super::pack`]), a batch per pooled slot.
//!
//! A credit per chunk in flight bounds the memory between the reader and the packer, whatever
//! the thread count; the packer sees documents in order, so batches do not depend on it.

use super::docs::{json_text, too_long, DocSource, Format, ParquetCursor, StreamCursor};
use super::pack::{BestFit, Concat, Doc, Resume, RowInfo, RowOut};
use super::tokenizer::TextTokenizer;
use crate::buffer::{HeapAllocator, RawBuf};
use crate::error::{Error, Result};
use crate::pipeline::Run;
use crate::rng::{self, Rng};
use crate::shell::epochs::Active;
use crate::shell::grow::SlotPool;
use crate::shell::ordered::{take_free, POLL};
use crate::shell::pass::{FailureBudget, MakeSlot, Next, Observe, Pass, PassHooks, PassSlot};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, SendTimeoutError, Sender};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How documents are packed into rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PackMode {
    /// Joined and cut ([`Concat`]).
    Concat,
    /// Best-fit decreasing over blocks of documents ([`BestFit`]).
    BestFit,
}

/// Configuration of a [`TokenLoader`] (checked by [`crate::args::token_config`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TokenConfig {
    /// Rows per batch.
    pub batch_size: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// The packer.
    pub pack: PackMode,
    /// Documents per best-fit block.
    pub pack_window: u64,
    /// A seeded document order per epoch.
    pub shuffle: bool,
    /// The seed.
    pub seed: u64,
    /// This process's rank.
    pub rank: usize,
    /// Ranks sharing the documents.
    pub world_size: usize,
    /// Drop the epoch's last batch when it has fewer than `batch_size` rows.
    pub drop_last: bool,
    /// Go on into the next epoch's order instead of ending (step-based training).
    pub infinite: bool,
    /// For compressed files (read as streams): documents shuffled together within a file.
    pub shuffle_window: u64,
    /// Tokenizer threads (`None`: autotuned within `cpu_budget`).
    pub threads: Option<usize>,
    /// Cores autotuned threads may use (`None`: the CPU allowance).
    #[serde(default)]
    pub cpu_budget: Option<f64>,
    /// Finished batches that may wait ahead of the consumer.
    pub prefetch: usize,
    /// Cap on the bytes of all batch buffers together.
    pub memory_limit: Option<u64>,
    /// A longer document is skipped (and counted) unread.
    pub max_document_bytes: u64,
    /// The JSON key holding the text.
    pub text_key: String,
    /// Plain text files: a document per line (else per file).
    pub lines: bool,
    /// Bytes per token of `.bin` token files.
    pub token_bytes: u8,
    /// Put the BOS token before each document.
    pub add_bos: bool,
    /// Put the EOS token after each document.
    pub add_eos: bool,
    /// The BOS token's text (`None`: the usual names).
    pub bos_token: Option<String>,
    /// The EOS token's text (`None`: the usual names).
    pub eos_token: Option<String>,
    /// The EOS id of token files (their documents end at it), or an id to use as EOS.
    pub eos_id: Option<u32>,
    /// The id of padding (`None`: EOS, else 0).
    pub pad_id: Option<u32>,
    /// Failed documents allowed per pass before it ends with an error.
    pub max_failures: u64,
    /// Raise the first failed document instead of skipping it.
    pub raise: bool,
    /// Where document indexes are stored between runs (`None`: built at every open); see
    /// [`super::index`].
    pub index_dir: Option<std::path::PathBuf>,
    /// The trace file and ring size (`None`: no trace): spans of reading, tokenizing, packing
    /// and the consumer's waits, written when a pass completes and when the loader is dropped.
    pub trace: Option<crate::trace::TraceSpec>,
    /// The automatic token cache (`None`: every epoch tokenizes); see [`super::autocache`].
    #[serde(default)]
    pub cache: Option<crate::cache::CacheSpec>,
}

impl TokenConfig {
    /// Defaults for `batch_size` rows of `seq_len` tokens.
    pub fn new(batch_size: usize, seq_len: usize) -> Self {
        TokenConfig {
            batch_size,
            seq_len,
            pack: PackMode::Concat,
            pack_window: 1024,
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
            infinite: false,
            shuffle_window: 4096,
            threads: None,
            cpu_budget: None,
            prefetch: 2,
            memory_limit: None,
            max_document_bytes: 64 << 20,
            text_key: "text".into(),
            lines: false,
            token_bytes: 2,
            add_bos: false,
            add_eos: true,
            bos_token: None,
            eos_token: None,
            eos_id: None,
            pad_id: None,
            max_failures: u64::MAX,
            raise: false,
            index_dir: None,
            trace: None,
            cache: None,
        }
    }
}

/// The format of a file, from its name: `.jsonl`/`.json`, `.txt`, `.tar` (WebDataset shards;
/// each optionally `.gz`/`.zst`), `.parquet`, `.bin`/`.npy` token files (a `.bin` beside an
/// `.idx` is Megatron's indexed dataset).
pub fn format_of(path: &std::path::Path, cfg: &TokenConfig) -> Result<Format> {
    if path.is_dir() && super::cache::is_cache(path) {
        return Ok(Format::Cache(super::cache::read_meta(path)?.token_bytes));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let base = name.strip_suffix(".gz").or_else(|| name.strip_suffix(".zst")).unwrap_or(&name);
    if name.ends_with(".parquet") {
        Ok(Format::Parquet)
    } else if base.ends_with(".tar") || name.ends_with(".tgz") {
        Ok(Format::Tar)
    } else if base.ends_with(".jsonl") || base.ends_with(".json") || base.ends_with(".ndjson") {
        Ok(Format::Jsonl)
    } else if base.ends_with(".txt") || base.ends_with(".text") {
        Ok(if cfg.lines { Format::Lines } else { Format::File })
    } else if name.ends_with(".bin") || name.ends_with(".npy") {
        Ok(Format::Tokens(cfg.token_bytes))
    } else {
        Err(Error::config(
            "data",
            format!(
                "{}: unknown format: expected .jsonl, .txt, .tar (optionally .gz or .zst), .parquet, .bin or .npy",
                path.display()
            ),
        ))
    }
}

/// The data files of `specs`: each a file, a glob (`*`, `?` in the file name), a token cache
/// folder, or a folder (its files of a known format but `.json`, in name order).
pub fn expand_paths(specs: &[String]) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for s in specs {
        let p = std::path::Path::new(s);
        if crate::source::is_url(p) {
            out.extend(crate::source::expand_urls(s)?.into_iter().map(std::path::PathBuf::from));
        } else if p.is_dir() && super::cache::is_cache(p) {
            out.push(p.to_path_buf());
        } else if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|e| Error::io(p, &e))?;
            let mut files: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|f| {
                    // `.json` only when named: in a folder it is more often metadata than JSON Lines.
                    let meta = f.extension().is_some_and(|x| x == "json");
                    f.is_file() && !meta && format_of(f, &TokenConfig::new(1, 1)).is_ok()
                })
                .collect();
            if files.is_empty() {
                return Err(Error::Dataset(format!(
                    "{s}: no .jsonl, .txt, .tar, .parquet, .bin or .npy files in this folder"
                )));
            }
            files.sort();
            out.extend(files);
        } else {
            out.extend(crate::source::shards::expand_glob(p)?);
        }
    }
    if out.is_empty() {
        return Err(Error::config("data", "no files given"));
    }
    Ok(out)
}

/// One chunk of documents on its way to a tokenizer.
struct RawDoc {
    epoch: u64,
    cursor: u64,
    /// `(file, ordinal)`, for messages.
    at: (usize, usize),
    bytes: Result<Vec<u8>>,
    /// Tokens of it already delivered (an elastic resume).
    skip: u64,
    /// Its global number (the token cache's key).
    doc: u64,
    /// `bytes` are its tokens from the token cache, not its text.
    cached: bool,
}

/// A chunk's documents, tokenized; failed ones are empty with their error.
type Tokenized = Vec<(Doc, Option<Error>)>;

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
    /// Nanoseconds the consumer waited for batches.
    pub wait_ns: AtomicU64,
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
    /// The counters as JSON.
    pub fn to_json(&self) -> serde_json::Value {
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
                        "consumer_wait": s(&self.wait_ns)},
        })
    }

    /// The stage that limits the rate over `wall` seconds, with `threads` tokenizer threads
    /// (`tokenizes`: text, not stored token ids). A consumer that waited for less than a tenth
    /// of the time is the limit (the loader keeps up); else the busiest stage, per thread of
    /// it, unless none is busy for a third of the time (the batches' handover then dominates).
    pub fn bottleneck(&self, wall: f64, threads: usize, tokenizes: bool) -> Bottleneck {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        let wall = wall.max(1e-9);
        let waited = s(&self.wait_ns) / wall;
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

/// Where the ranks of a saved run stood in one epoch, for a resume on another number of ranks:
/// rank `r` of `world_size` had delivered its documents before `at[r]` (and `at[r].offset`
/// tokens of the one there). The remaining documents of that epoch's order are dealt anew.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Elastic {
    /// Ranks of the saved run.
    pub world_size: usize,
    /// Where each of them stood (all in the same epoch).
    pub at: Vec<Resume>,
    /// Best-fit packing: per saved rank, the documents of its current block (by cursor, at or
    /// after `at[r].cursor`) already delivered wholly (`u64::MAX`) or in part (the tokens of
    /// their start delivered).
    #[serde(default)]
    pub delivered: Vec<Vec<(u64, u64)>>,
    /// The saved run's own elastic base, when it continued another run on other ranks in
    /// this epoch (its ranks' orders are that base's remainder, dealt).
    #[serde(default)]
    pub base: Option<Box<Elastic>>,
}

/// Where iteration stands: the epoch, batches delivered in it, and where the next batch's
/// first row starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenState {
    /// The seed (checked on restore).
    pub seed: u64,
    /// The epoch selected by `set_epoch` (infinite loaders: the one the pass started in).
    pub epoch: u64,
    /// Batches delivered since that epoch's start.
    pub next_batch: u64,
    /// Where the next row starts.
    pub at: Resume,
    /// The saved run this epoch's order continues, when it was resumed on another number of
    /// ranks (`at.cursor` counts this rank's documents of the remaining ones).
    pub elastic: Option<Elastic>,
}

#[derive(Debug, Default)]
struct PositionInner {
    epoch: u64,
    next_batch: u64,
    at: Resume,
    resume: bool,
    elastic: Option<Elastic>,
}

/// What a saved state is valid for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenFingerprint {
    /// Documents in the source.
    pub documents: u64,
    /// A hash of the files and their indexes.
    pub data_hash: String,
    /// A hash of the tokenizer's JSON (`none` for token files).
    pub tokenizer_hash: String,
    /// Rows per batch.
    pub batch_size: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// `concat` or `best_fit`, with the block size.
    pub pack: String,
    /// Document order: `none`, `global` or `window:N`.
    pub order: String,
    /// BOS/EOS added.
    pub special: String,
    /// Ranks.
    pub world_size: usize,
    /// This rank.
    pub rank: usize,
}

struct TokenSlot {
    batch: AtomicUsize,
    rows: AtomicUsize,
    input: RawBuf,
    labels: RawBuf,
    positions: RawBuf,
    cu: RawBuf,
    cu_len: AtomicUsize,
    /// The resume point after this batch, its failures.
    after: Mutex<(Resume, Vec<Error>)>,
}

impl TokenSlot {
    /// The `i32` view of `buf`'s first `n` values.
    ///
    /// # Safety
    /// No one may write the range while the slice lives.
    unsafe fn ints(buf: &RawBuf, n: usize) -> &[i32] {
        // SAFETY: the buffer is 64-byte aligned and holds at least `n` i32s (allocated with
        // them); no writer is active per the caller's contract.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<i32>(), n) }
    }

    /// The mutable `i32` view of values `from..from + n` of `buf`.
    ///
    /// # Safety
    /// The caller must be the slot's only user (the packer, before the slot is sent).
    #[allow(clippy::mut_from_ref)]
    unsafe fn ints_mut(buf: &RawBuf, from: usize, n: usize) -> &mut [i32] {
        // SAFETY: aligned, in bounds (allocated for the whole batch) and unaliased per the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().cast::<i32>().add(from), n) }
    }
}

impl PassSlot for Arc<TokenSlot> {
    fn batch(&self) -> usize {
        self.batch.load(Ordering::Relaxed)
    }

    fn samples(&self) -> Option<usize> {
        Some(self.rows.load(Ordering::Acquire))
    }

    fn take_failures(&self) -> Vec<Error> {
        std::mem::take(&mut self.after.lock().unwrap_or_else(|p| p.into_inner()).1)
    }
}

struct Shared {
    source: DocSource,
    tokenizer: Option<TextTokenizer>,
    config: TokenConfig,
    threads: usize,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: u32,
    pool: SlotPool<Arc<TokenSlot>>,
    stats: Arc<TokenStats>,
    position: Mutex<PositionInner>,
    /// The last [`rows_per_rank`] answer and what it was for (`len()` asks every epoch).
    rows_memo: Mutex<Option<RowsMemo>>,
    /// The trace, when asked for.
    tracer: Option<Arc<crate::trace::Tracer>>,
    /// The automatic token cache, when asked for.
    autocache: Option<super::autocache::TokenCache>,
    /// `threads="auto"`: how many tokenizer threads take work (see [`crate::tune`]); a fixed
    /// count keeps them all working.
    tuner: crate::tune::Tuner,
}

impl Shared {
    /// Records a span on the trace, when there is one.
    fn span(&self, name: &'static str, start: Instant, args: &[(&str, f64)]) {
        if let Some(t) = &self.tracer {
            t.span(name, "tokens", start, Instant::now(), crate::trace::Args::numbers(args));
        }
    }

    /// Writes the trace file, when there is one with events not yet in it.
    fn write_trace(&self) -> Result<()> {
        match self.tracer.as_ref().and_then(|t| t.auto_path()) {
            Some(path) => self.write_trace_to(path),
            None => Ok(()),
        }
    }

    /// Writes the events recorded so far to `path`; tracing must be on.
    fn write_trace_to(&self, path: &std::path::Path) -> Result<()> {
        let t = self.tracer.as_ref().ok_or_else(|| {
            Error::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
        })?;
        t.write(path, &|i| format!("document {i}")).map(drop).map_err(|e| Error::io(path, &e))
    }
}

/// Batches of packed token rows from text or token files.
pub struct TokenLoader {
    shared: Arc<Shared>,
    active: Active,
}

impl std::fmt::Debug for TokenLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenLoader").field("documents", &self.shared.source.len()).finish()
    }
}

/// This rank's documents of one epoch, in order, and where each read group starts (a window
/// of a compressed file, read from its stream together).
struct EpochOrder {
    docs: Vec<u64>,
    groups: Vec<usize>,
    /// Tokens already delivered of some documents (by cursor): an elastic resume's partly
    /// used documents.
    skips: BTreeMap<u64, u64>,
}

/// Batches over which `threads="auto"` settles (a text epoch's batch count is known only once
/// it is tokenized); the setting then holds.
const TUNE_BATCHES: usize = 512;

/// Bytes of the documents of one shuffle window of a compressed file, at most.
const WINDOW_BYTES: u64 = 64 << 20;

fn epoch_order(src: &DocSource, cfg: &TokenConfig, epoch: u64, elastic: Option<&Elastic>) -> EpochOrder {
    let (all, bounds) = global_order(src, cfg, epoch);
    match elastic {
        None => rank_order(&all, &bounds, cfg.rank, cfg.world_size),
        Some(e) => elastic_order(&all, &bounds, e, cfg.rank, cfg.world_size),
    }
}

/// Rank `k` of `w`'s positions in a global order of `n` documents, each with the tokens of it
/// already delivered: every `w`-th position without a base; with one, every `w`-th of what
/// the saved run of `e.world_size` ranks left (the positions none of its ranks had finished,
/// in the global order; a partly used document with its used tokens). Chains: the saved
/// run's ranks' own positions come from its base, if it had one.
fn elastic_positions(n: usize, e: Option<&Elastic>, k: usize, w: usize) -> Vec<(usize, u64)> {
    let Some(e) = e else { return (k..n).step_by(w.max(1)).map(|p| (p, 0)).collect() };
    let mut remaining: Vec<(usize, u64)> = Vec::new(); // (position, tokens to skip)
    for q in 0..e.world_size {
        let at = e.at[q];
        let delivered: BTreeMap<u64, u64> = e.delivered.get(q).map(|d| d.iter().copied().collect()).unwrap_or_default();
        for (c, (p, skip)) in elastic_positions(n, e.base.as_deref(), q, e.world_size).into_iter().enumerate() {
            let c = c as u64;
            if c < at.cursor {
                continue;
            }
            let used = match delivered.get(&c) {
                Some(&u64::MAX) => continue,
                Some(&t) => t,
                None if c == at.cursor => at.offset,
                None => 0,
            };
            remaining.push((p, skip + used));
        }
    }
    remaining.sort_unstable();
    remaining.into_iter().skip(k).step_by(w.max(1)).collect()
}

/// Rank `k` of `w`'s part of what a saved run left of a global order (see
/// [`elastic_positions`]), with its read groups.
fn elastic_order(all: &[u64], bounds: &[usize], e: &Elastic, k: usize, w: usize) -> EpochOrder {
    let mine = elastic_positions(all.len(), Some(e), k, w);
    let docs = mine.iter().map(|&(p, _)| all[p]).collect();
    let skips = mine.iter().enumerate().filter(|(_, m)| m.1 > 0).map(|(c, m)| (c as u64, m.1)).collect();
    // A new read group wherever a document comes from another window of the order.
    let mut groups = vec![0];
    let mut last = None;
    for (c, &(p, _)) in mine.iter().enumerate() {
        let g = bounds.partition_point(|&b| b <= p);
        if last.is_some_and(|l| l != g) {
            groups.push(c);
        }
        last = Some(g);
    }
    groups.push(mine.len());
    groups.dedup();
    EpochOrder { docs, groups, skips }
}

/// Every document of `epoch` in order, and where each read group starts.
fn global_order(src: &DocSource, cfg: &TokenConfig, epoch: u64) -> (Vec<u64>, Vec<usize>) {
    let mut r = Rng::new(cfg.seed, rng::stream::PERMUTATION, epoch);
    let (mut all, mut bounds) = (Vec::with_capacity(src.len() as usize), vec![0usize]);
    if src.random_access() {
        all.extend(0..src.len());
        if cfg.shuffle {
            rng::shuffle(&mut all, &mut r);
        }
    } else {
        // Streams are read in windows of consecutive documents of one file (bounded by count
        // and bytes); shuffled, the files are permuted and each window shuffled.
        let mut files: Vec<usize> = (0..src.files.len()).collect();
        if cfg.shuffle {
            rng::shuffle(&mut files, &mut r);
        }
        let first = |f: usize| src.files[..f].iter().map(|x| x.docs.len() as u64).sum::<u64>();
        for f in files {
            let base = first(f);
            let docs = &src.files[f].docs;
            let mut s = 0;
            while s < docs.len() {
                let (mut e, mut bytes) = (s, 0u64);
                let parquet = src.files[f].compression == super::docs::Compression::Parquet;
                while e < docs.len()
                    && (e - s) < cfg.shuffle_window as usize
                    && (if parquet {
                        docs[e].offset == docs[s].offset
                    } else {
                        e == s || bytes + docs[e].len <= WINDOW_BYTES
                    })
                {
                    bytes += docs[e].len;
                    e += 1;
                }
                let from = all.len();
                all.extend((s..e).map(|k| base + k as u64));
                if cfg.shuffle {
                    rng::shuffle(&mut all[from..], &mut r);
                }
                bounds.push(all.len());
                s = e;
            }
        }
    }
    (all, bounds)
}

/// Rank `k` of `w`'s part of a global order: position p goes to rank p % w.
fn rank_order(all: &[u64], bounds: &[usize], k: usize, w: usize) -> EpochOrder {
    let docs: Vec<u64> = all.iter().skip(k).step_by(w).copied().collect();
    let mut groups: Vec<usize> = bounds.iter().map(|&b| ((b + w - 1 - k.min(b + w - 1)) / w).min(docs.len())).collect();
    groups.dedup();
    EpochOrder { docs, groups, skips: BTreeMap::new() }
}

/// Rows every rank delivers in `epoch` when the documents' token counts are known without
/// tokenizing (token files): the fewest any rank's documents fill, so that every rank has
/// the same number of batches. `None` for text (known only once tokenized).
/// `((epoch, elastic base), rows per rank)`.
type RowsMemo = ((u64, Option<Elastic>), Option<u64>);

fn rows_per_rank(sh: &Shared, epoch: u64, elastic: Option<&Elastic>) -> Option<u64> {
    let key = (epoch, elastic.cloned());
    let mut memo = sh.rows_memo.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((k, rows)) = memo.as_ref() {
        if *k == key {
            return *rows;
        }
    }
    let rows = count_rows_per_rank(sh, epoch, elastic);
    *memo = Some((key, rows));
    rows
}

fn count_rows_per_rank(sh: &Shared, epoch: u64, elastic: Option<&Elastic>) -> Option<u64> {
    let (cfg, src) = (&sh.config, &sh.source);
    if !matches!(src.format, Format::Tokens(_) | Format::Cache(_)) || cfg.infinite {
        return None;
    }
    // A cache's documents get BOS/EOS as text does.
    let extra = match src.format {
        Format::Cache(_) => usize::from(cfg.add_bos) + usize::from(cfg.add_eos),
        _ => 0,
    };
    let (all, bounds) = global_order(src, cfg, epoch);
    let len = cfg.seq_len;
    let tokens = |g: u64| {
        let (f, k) = src.locate(g);
        let file = &src.files[f];
        (file.docs[k].len / file.width.max(1) as u64) as usize + extra
    };
    (0..cfg.world_size)
        .map(|r| {
            let order = match elastic {
                None => rank_order(&all, &bounds, r, cfg.world_size),
                Some(e) => elastic_order(&all, &bounds, e, r, cfg.world_size),
            };
            let skipped: u64 = order.skips.values().sum();
            match cfg.pack {
                PackMode::Concat => (order.docs.iter().map(|&g| tokens(g) as u64).sum::<u64>() - skipped) / len as u64,
                PackMode::BestFit => order
                    .docs
                    .chunks(cfg.pack_window as usize)
                    .enumerate()
                    .map(|(b, block)| {
                        let first = b as u64 * cfg.pack_window;
                        let lens: Vec<usize> = block
                            .iter()
                            .enumerate()
                            .map(|(k, &g)| {
                                let skip = order.skips.get(&(first + k as u64)).copied().unwrap_or(0);
                                tokens(g).saturating_sub(skip as usize)
                            })
                            .collect();
                        super::pack::plan_rows(&lens, len).len() as u64
                    })
                    .sum(),
            }
        })
        .min()
}

/// Sends `v`, waiting in steps so that `cancel` is seen; false when cancelled or closed.
fn send<T>(tx: &Sender<T>, mut v: T, cancel: &AtomicBool) -> bool {
    loop {
        if cancel.load(Ordering::Acquire) {
            return false;
        }
        match tx.send_timeout(v, POLL) {
            Ok(()) => return true,
            Err(SendTimeoutError::Timeout(back)) => v = back,
            Err(SendTimeoutError::Disconnected(_)) => return false,
        }
    }
}

/// Receives, waiting in steps so that `cancel` is seen; `None` when cancelled or closed.
fn recv<T>(rx: &Receiver<T>, cancel: &AtomicBool) -> Option<T> {
    loop {
        if cancel.load(Ordering::Acquire) {
            return None;
        }
        match rx.recv_timeout(POLL) {
            Ok(v) => return Some(v),
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return None,
        }
    }
}

/// Documents or bytes per chunk sent to a tokenizer thread.
const CHUNK_DOCS: usize = 64;
const CHUNK_BYTES: usize = 256 << 10;

impl TokenLoader {
    /// Opens the documents of `paths` (text needs `tokenizer`; token files need none) and
    /// allocates the pool.
    pub fn new(paths: &[std::path::PathBuf], tokenizer: Option<TextTokenizer>, config: TokenConfig) -> Result<Self> {
        Self::new_in(paths, tokenizer, config, Arc::new(HeapAllocator))
    }

    /// As [`TokenLoader::new`], its batch buffers from `alloc` (page-locked memory when batches
    /// go on to a GPU).
    pub fn new_in(
        paths: &[std::path::PathBuf],
        tokenizer: Option<TextTokenizer>,
        config: TokenConfig,
        alloc: Arc<dyn crate::buffer::HostAllocator>,
    ) -> Result<Self> {
        let formats = paths.iter().map(|p| format_of(p, &config)).collect::<Result<Vec<_>>>()?;
        let format = *formats.first().ok_or_else(|| Error::config("data", "no files given"))?;
        // Text formats mix (JSON Lines beside text files and tar shards); token files and
        // caches are read as they are, one kind per loader.
        let tokens = |f: &Format| matches!(f, Format::Tokens(_) | Format::Cache(_));
        if let Some(k) = formats.iter().position(|f| {
            (tokens(f) || tokens(&format)) && std::mem::discriminant(f) != std::mem::discriminant(&format)
        }) {
            return Err(Error::config(
                "data",
                format!(
                    "mixes formats: {} is {:?}, {} is {:?}: token files and token caches are one kind per loader",
                    paths[0].display(),
                    format,
                    paths[k].display(),
                    formats[k]
                ),
            ));
        }
        let text = !matches!(format, Format::Tokens(_) | Format::Cache(_));
        let cache = match format {
            Format::Cache(_) => Some(super::cache::read_meta(&paths[0])?),
            _ => None,
        };
        if let Some(m) = &cache {
            for p in &paths[1..] {
                let other = super::cache::read_meta(p)?;
                if other.tokenizer_hash != m.tokenizer_hash {
                    return Err(Error::config(
                        "data",
                        format!("{}: a cache of another tokenizer than {}", p.display(), paths[0].display()),
                    ));
                }
            }
        }
        let tokenizer = match (text, tokenizer, &cache) {
            (true, None, _) => return Err(Error::config("tokenizer", "text needs a tokenizer (a tokenizer.json)")),
            (false, Some(t), Some(m)) => {
                let h = format!("{:016x}", t.hash);
                if h != m.tokenizer_hash {
                    return Err(Error::config(
                        "tokenizer",
                        format!(
                            "{}: the token cache {} was made with another tokenizer ({}, hash {}); this one's hash is {h}",
                            t.origin.display(),
                            paths[0].display(),
                            m.tokenizer.display(),
                            m.tokenizer_hash
                        ),
                    ));
                }
                Some(t)
            }
            (false, Some(_), None) => {
                return Err(Error::config("tokenizer", "token files are already tokenized: give no tokenizer"))
            }
            (_, t, _) => t,
        };
        let (bos, eos) = match (&tokenizer, &cache) {
            (Some(t), _) => (
                t.bos(config.bos_token.as_deref())?,
                match config.eos_id {
                    Some(id) => Some(id),
                    None => t.eos(config.eos_token.as_deref())?,
                },
            ),
            (None, Some(m)) => (m.bos_id, config.eos_id.or(m.eos_id)),
            (None, None) => (None, config.eos_id),
        };
        let text = text || cache.is_some(); // BOS/EOS are added as for text
        if config.add_eos && eos.is_none() && text {
            return Err(Error::config("eos_token", "the tokenizer has no known EOS token: name it, or add_eos=False"));
        }
        if config.add_bos && bos.is_none() {
            return Err(Error::config("bos_token", "the tokenizer has no known BOS token: name it, or add_bos=False"));
        }
        let source = DocSource::open(paths, &formats, if text { None } else { eos }, config.index_dir.as_deref())?;
        let autocache = match (&config.cache, &tokenizer) {
            (None, _) => None,
            (Some(spec), Some(t)) if text && cache.is_none() => {
                Some(super::autocache::TokenCache::open(spec, &source, t.hash, &config.text_key, t.id_width())?)
            }
            (Some(_), _) => {
                return Err(Error::config(
                    "cache",
                    "token files and token cache folders are already tokens: a token cache is for text",
                ))
            }
        };
        let cpu_budget = config.cpu_budget.unwrap_or_else(crate::cpu::default_budget);
        let threads = match config.threads {
            Some(0) => return Err(Error::config("threads", "must be at least 1 (or auto)")),
            Some(n) => n,
            None => (cpu_budget + 1e-9).floor().max(1.0) as usize,
        };
        let tuner = crate::tune::Tuner::new(
            crate::tune::TuneSpec {
                auto_threads: config.threads.is_none(),
                threads_max: threads,
                auto_prefetch: false,
                prefetch_max: config.prefetch,
                prefetch: config.prefetch,
                cpu_budget: if config.threads.is_some() { threads as f64 } else { cpu_budget },
                epoch_batches: TUNE_BATCHES,
            },
            crate::args::budget_registry(),
        );
        let (bs, len) = (config.batch_size, config.seq_len);
        let values = bs.checked_mul(len).filter(|v| *v <= (i32::MAX as usize)).ok_or_else(|| {
            Error::config("seq_len", format!("batch_size x seq_len = {bs} x {len} tokens: at most 2^31 a batch"))
        })?;
        let cu_values = values + bs + 1;
        let batch_bytes = (3 * values + cu_values) * 4;
        let slots = crate::buffer::BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?;
        let make: MakeSlot<Arc<TokenSlot>> = Arc::new(move || {
            let a = alloc.as_ref();
            Ok(Arc::new(TokenSlot {
                batch: AtomicUsize::new(0),
                rows: AtomicUsize::new(0),
                input: RawBuf::new_in(values * 4, a)?,
                labels: RawBuf::new_in(values * 4, a)?,
                positions: RawBuf::new_in(values * 4, a)?,
                cu: RawBuf::new_in(cu_values * 4, a)?,
                cu_len: AtomicUsize::new(0),
                after: Mutex::new((Resume::default(), Vec::new())),
            }))
        });
        let pool = SlotPool::new(slots, batch_bytes, config.memory_limit, "batch", make)?;
        let pad = config.pad_id.or(eos).unwrap_or(0);
        let tracer = config
            .trace
            .as_ref()
            .map(|t| t.check().map(|()| Arc::new(crate::trace::Tracer::from_spec(t))))
            .transpose()?;
        Ok(TokenLoader {
            shared: Arc::new(Shared {
                source,
                tokenizer,
                config,
                threads,
                bos,
                eos,
                pad,
                pool,
                stats: Arc::default(),
                position: Mutex::default(),
                rows_memo: Mutex::default(),
                tracer,
                autocache,
                tuner,
            }),
            active: Active::default(),
        })
    }

    /// Bytes of each array of a batch at most, in the order of [`TokenBatch::regions`]:
    /// `input_ids`, `labels`, `position_ids` (`batch_size x seq_len` int32 each), `cu_seqlens`.
    pub fn region_capacities(&self) -> Vec<usize> {
        let (bs, len) = (self.shared.config.batch_size, self.shared.config.seq_len);
        let values = bs * len;
        vec![values * 4, values * 4, values * 4, (values + bs + 1) * 4]
    }

    /// The counters ([`TokenStats::to_json`]) with the `tokenizer` (its file, the `engine` that
    /// runs it: stoker's byte-level BPE or `tokenizers`, and why), `wall_seconds` (since the
    /// first iteration started) and the `bottleneck` over that time (absent before any
    /// iteration).
    pub fn report(&self) -> serde_json::Value {
        let stats = self.stats();
        let mut v = stats.to_json();
        if let Some(t) = self.tokenizer() {
            let (engine, why) = t.engine();
            v["tokenizer"] = serde_json::json!({"path": t.origin, "engine": engine, "why": why});
        }
        if let Some(c) = &self.shared.autocache {
            v["cache"] = serde_json::to_value(c.report()).unwrap_or_default();
        }
        v["tuning"] = serde_json::to_value(self.shared.tuner.report()).unwrap_or_default();
        if let Some(t) = stats.started.get() {
            let wall = t.elapsed().as_secs_f64();
            v["wall_seconds"] = serde_json::json!(wall);
            let threads = self.shared.tuner.threads_active();
            v["bottleneck"] =
                serde_json::to_value(stats.bottleneck(wall, threads, self.tokenizer().is_some())).unwrap_or_default();
        }
        v
    }

    /// The `trace=` file, when tracing is on.
    pub fn trace_path(&self) -> Option<&std::path::Path> {
        self.shared.tracer.as_ref().and_then(|t| t.path())
    }

    /// Writes the events recorded so far to `path` now (atomically); tracing must be on.
    pub fn write_trace(&self, path: &std::path::Path) -> Result<()> {
        self.shared.write_trace_to(path)
    }

    /// Documents in the source (all ranks).
    pub fn documents(&self) -> u64 {
        self.shared.source.len()
    }

    /// Batches per epoch on this rank (the current epoch), when known before tokenizing:
    /// token files, where every rank has the same count. `None` for text and `infinite`.
    pub fn batches_per_epoch(&self) -> Option<usize> {
        let epoch = self.position().epoch;
        let elastic = self.position().elastic.clone();
        let rows = rows_per_rank(&self.shared, epoch, elastic.as_ref())? as usize;
        let bs = self.shared.config.batch_size;
        Some(if self.shared.config.drop_last { rows / bs } else { rows.div_ceil(bs) })
    }

    /// Tokenizer threads.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// The tokenizer (text and caches made with one given).
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.shared.tokenizer.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &TokenConfig {
        &self.shared.config
    }

    /// `(bos, eos, pad)` ids.
    pub fn special_ids(&self) -> (Option<u32>, Option<u32>, u32) {
        (self.shared.bos, self.shared.eos, self.shared.pad)
    }

    /// Batches held by the consumer.
    pub fn held(&self) -> usize {
        self.shared.pool.held()
    }

    /// The counters (documents, tokens, padding, time per stage).
    pub fn stats(&self) -> &TokenStats {
        &self.shared.stats
    }

    fn position(&self) -> std::sync::MutexGuard<'_, PositionInner> {
        self.shared.position.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Selects the epoch; changing it restarts at its first batch (a running iteration
    /// becomes stale).
    pub fn set_epoch(&self, epoch: u64) {
        let changed = {
            let mut p = self.position();
            let changed = p.epoch != epoch;
            if changed {
                *p = PositionInner {
                    epoch,
                    next_batch: 0,
                    at: Resume { epoch, cursor: 0, offset: 0 },
                    resume: false,
                    elastic: None,
                };
            }
            changed
        };
        if changed {
            self.active.retire(&format!("set_epoch({epoch}) was called after this iterator started"));
        }
    }

    /// The resumable state.
    pub fn state(&self) -> TokenState {
        let p = self.position();
        TokenState {
            seed: self.shared.config.seed,
            epoch: p.epoch,
            next_batch: p.next_batch,
            at: p.at,
            elastic: p.elastic.clone(),
        }
    }

    /// What a saved state is valid for.
    pub fn fingerprint(&self) -> TokenFingerprint {
        let (sh, c) = (&self.shared, &self.shared.config);
        let order = match (c.shuffle, sh.source.random_access()) {
            (false, _) => "none".to_string(),
            (true, true) => "global".to_string(),
            (true, false) => format!("window:{}", c.shuffle_window),
        };
        TokenFingerprint {
            documents: sh.source.len(),
            data_hash: format!("{:016x}", sh.source.hash()),
            tokenizer_hash: sh.tokenizer.as_ref().map_or("none".into(), |t| format!("{:016x}", t.hash)),
            batch_size: c.batch_size,
            seq_len: c.seq_len,
            pack: match c.pack {
                PackMode::Concat => "concat".into(),
                PackMode::BestFit => format!("best_fit:{}", c.pack_window),
            },
            order,
            special: format!("bos={:?}:{} eos={:?}:{} pad={}", sh.bos, c.add_bos, sh.eos, c.add_eos, sh.pad),
            world_size: c.world_size,
            rank: c.rank,
        }
    }

    /// Restores a state (checked by [`crate::args::token_state`]): the next iteration resumes
    /// there; a running one becomes stale.
    pub fn load_state(&self, st: TokenState) -> Result<()> {
        if st.seed != self.shared.config.seed {
            return Err(Error::config(
                "state",
                format!("seed {} does not match the loader's seed {}", st.seed, self.shared.config.seed),
            ));
        }
        if let Some(e) = &st.elastic {
            if e.at.len() != e.world_size || e.at.iter().any(|a| a.epoch != st.at.epoch) {
                return Err(Error::config("state", "an elastic base needs one position per saved rank, in one epoch"));
            }
        }
        *self.position() =
            PositionInner { epoch: st.epoch, next_batch: st.next_batch, at: st.at, resume: true, elastic: st.elastic };
        self.active.retire("load_state_dict was called after this iterator started");
        Ok(())
    }

    /// Continues a run saved by several ranks (`(state, rank, world_size)` of every one, any
    /// order) on this loader's ranks: every document that no saved rank had finished is dealt
    /// anew, each to exactly one rank (a partly used one without its used tokens). The states
    /// must be of one epoch; they may themselves continue a resume on other ranks (chains:
    /// 4 -> 3 -> 2). With `best_fit` packing, the documents of each saved rank's current block
    /// are tokenized again here to find which of them its delivered rows hold (a block's rows
    /// deliver whole documents, and the start of one longer than a row).
    pub fn load_states(&self, states: &[(TokenState, usize, usize)]) -> Result<()> {
        let (first, _, world) = states.first().ok_or_else(|| Error::config("state", "an empty list of states"))?;
        let mut at = vec![None; *world];
        for (st, rank, w) in states {
            if *w != *world || *rank >= *world {
                return Err(Error::config(
                    "state",
                    format!("rank {rank} of world_size {w} in a list for {world} ranks"),
                ));
            }
            if st.seed != first.seed || st.epoch != first.epoch || st.at.epoch != first.at.epoch {
                return Err(Error::config(
                    "state",
                    "the states are of different seeds or epochs: give one run's states",
                ));
            }
            if st.elastic != first.elastic {
                return Err(Error::config(
                    "state",
                    "the states continue different resumes on other ranks: give one run's states",
                ));
            }
            if at[*rank].replace(st.at).is_some() {
                return Err(Error::config("state", format!("two states of rank {rank}")));
            }
        }
        let at: Vec<Resume> = at
            .into_iter()
            .enumerate()
            .map(|(r, a)| a.ok_or_else(|| Error::config("state", format!("no state of rank {r} of {world}"))))
            .collect::<Result<_>>()?;
        let base = first.elastic.clone().filter(|b| b.at.first().is_some_and(|a| a.epoch == first.at.epoch));
        let mut elastic = Elastic { world_size: *world, at, delivered: Vec::new(), base: base.map(Box::new) };
        if self.shared.config.pack == PackMode::BestFit {
            elastic.delivered = self.best_fit_delivered(&elastic)?;
            for a in &mut elastic.at {
                a.offset = 0;
            }
        }
        let cursor_epoch = first.at.epoch;
        self.load_state(TokenState {
            seed: first.seed,
            epoch: first.epoch,
            next_batch: 0,
            at: Resume { epoch: cursor_epoch, cursor: 0, offset: 0 },
            elastic: Some(elastic),
        })
    }

    /// For each saved rank of `e` (best-fit packing, `at[r]` a block's start and the rows of it
    /// delivered): the documents of that block its delivered rows hold, wholly (`u64::MAX`) or
    /// their first tokens. The block's documents are read and tokenized again, and packed by
    /// the same plan as then.
    fn best_fit_delivered(&self, e: &Elastic) -> Result<Vec<Vec<(u64, u64)>>> {
        let sh = &self.shared;
        let cfg = &sh.config;
        let Some(epoch) = e.at.first().map(|a| a.epoch) else { return Ok(vec![]) };
        let (all, _) = global_order(&sh.source, cfg, epoch);
        let mut out = Vec::with_capacity(e.world_size);
        for (q, at) in e.at.iter().enumerate() {
            if at.offset == 0 {
                out.push(vec![]);
                continue;
            }
            let mine = elastic_positions(all.len(), e.base.as_deref(), q, e.world_size);
            let (b0, b1) = (at.cursor as usize, (at.cursor + cfg.pack_window).min(mine.len() as u64) as usize);
            let block = mine.get(b0..b1).unwrap_or(&[]);
            let docs: Vec<(u64, u64)> = block.iter().map(|&(p, skip)| (all[p], skip)).collect();
            let lens = self.token_counts(&docs)?;
            let rows = super::pack::plan_rows(&lens, cfg.seq_len);
            let mut used = vec![0u64; lens.len()];
            for row in rows.iter().take(at.offset as usize) {
                for &(k, s, n) in row {
                    if s as u64 != used[k] {
                        return Err(Error::Internal(
                            "a best-fit block delivered a document's pieces out of order".into(),
                        ));
                    }
                    used[k] += n as u64;
                }
            }
            out.push(
                lens.iter()
                    .zip(&used)
                    .enumerate()
                    .filter_map(|(k, (&n, &u))| {
                        let c = at.cursor + k as u64;
                        match u {
                            _ if n == 0 || u == n as u64 => Some((c, u64::MAX)),
                            0 => None,
                            u => Some((c, u)),
                        }
                    })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// The token counts of documents `(global number, tokens already used)`, read and
    /// tokenized (BOS/EOS as configured) on the calling thread; a failed document counts 0.
    fn token_counts(&self, docs: &[(u64, u64)]) -> Result<Vec<usize>> {
        let sh = &self.shared;
        let src = &sh.source;
        let mut order: Vec<(usize, usize, usize)> = docs
            .iter()
            .enumerate()
            .map(|(i, &(g, _))| {
                let (f, k) = src.locate(g);
                (f, k, i)
            })
            .collect();
        order.sort_unstable();
        let mut lens = vec![0usize; docs.len()];
        let mut streams: BTreeMap<usize, StreamCursor> = BTreeMap::new();
        let mut tables: BTreeMap<usize, ParquetCursor> = BTreeMap::new();
        for (f, k, i) in order {
            let file = &src.files[f];
            let entry = &file.docs[k];
            let max = sh.config.max_document_bytes;
            let mut buf = Vec::new();
            let bytes = if entry.len > max {
                Err(too_long(file, entry, max))
            } else if src.random_access() {
                crate::source::open_positioned(&file.path)
                    .and_then(|h| file.read_at(h.as_ref(), entry, &mut buf))
                    .map(|()| buf)
            } else if file.compression == super::docs::Compression::Parquet {
                let t = match tables.entry(f) {
                    std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(ParquetCursor::new(file, &sh.config.text_key)?)
                    }
                };
                t.read(file, entry, max, &mut buf).map(|()| buf)
            } else {
                if streams.get(&f).is_some_and(|s| s.position() > entry.offset) {
                    streams.remove(&f);
                }
                let c = match streams.entry(f) {
                    std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::btree_map::Entry::Vacant(v) => v.insert(StreamCursor::new(file)?),
                };
                c.read(file, entry, max, &mut buf).map(|()| buf)
            };
            let raw = RawDoc { epoch: 0, cursor: 0, at: (f, k), bytes, skip: docs[i].1, doc: docs[i].0, cached: false };
            let (d, _) = tokenize(sh, sh.tokenizer.as_ref(), raw);
            lens[i] = d.tokens.len();
        }
        Ok(lens)
    }

    /// Reads and tokenizes every document of this rank's order of the current epoch on the
    /// loader's threads and hands each to `sink` in order, with its error if it failed (then
    /// it is empty): what `stoker tokenize` writes. Memory stays bounded (a credit per chunk in
    /// flight); an error from `sink` stops every thread and is returned.
    pub fn for_each_document(&self, mut sink: impl FnMut(Doc, Option<Error>) -> Result<()>) -> Result<()> {
        self.active.retire("for_each_document was started");
        let sh = self.shared.clone();
        let epoch = self.position().epoch;
        let (free_tx, _free_rx) = bounded::<()>(1);
        let (run, _done) = Run::new(1, free_tx);
        let credits = sh.threads * 4 + 4;
        let (credit_tx, credit_rx) = bounded::<()>(credits);
        for _ in 0..credits {
            credit_tx.send(()).expect("room");
        }
        let results = spawn_tokenizing(&run, &sh, (Resume { epoch, cursor: 0, offset: 0 }, None), credit_rx)?;
        let mut early: BTreeMap<u64, Tokenized> = BTreeMap::new();
        let mut next = 0u64;
        let cancel = run.cancel_flag();
        let outcome = loop {
            if let Some(chunk) = early.remove(&next) {
                next += 1;
                let _ = credit_tx.try_send(());
                if let Some(e) = chunk.into_iter().try_for_each(|(d, e)| sink(d, e)).err() {
                    break Err(e);
                }
                continue;
            }
            match recv(&results, &cancel) {
                Some((seq, c)) => {
                    early.insert(seq, c);
                }
                None => break run.death_error().map_or(Ok(()), Err),
            }
        };
        run.shutdown();
        outcome
    }

    /// Whether a loaded state waits for the next iteration.
    pub fn resume_pending(&self) -> bool {
        self.position().resume
    }

    /// Starts an iteration: the current epoch from its first batch, or a restored position.
    pub fn iter(&self) -> Result<TokenIter> {
        self.active.retire("a newer iteration of this loader was started");
        self.shared.stats.started.get_or_init(Instant::now);
        let (from, first_batch, elastic) = {
            let mut p = self.position();
            let resume = std::mem::take(&mut p.resume);
            if resume {
                (p.at, p.next_batch, p.elastic.clone())
            } else {
                p.next_batch = 0;
                p.at = Resume { epoch: p.epoch, cursor: 0, offset: 0 };
                p.elastic = None;
                (p.at, 0, None)
            }
        };
        let sh = self.shared.clone();
        let (run, done_tx) = Run::new(sh.pool.slots(), sh.pool.free_tx.clone());
        let cancel = run.cancel_flag();
        let credits = sh.threads * 4 + 4;
        let (credit_tx, credit_rx) = bounded::<()>(credits);
        for _ in 0..credits {
            credit_tx.send(()).expect("room");
        }
        let res_rx = spawn_tokenizing(&run, &sh, (from, elastic.clone()), credit_rx)?;
        {
            let (sh, cancel, run2) = (sh.clone(), cancel.clone(), Arc::downgrade(&run));
            // Token files: every rank stops at the same row count (the rows before a resume
            // point are whole batches).
            let limit = rows_per_rank(&sh, from.epoch, elastic.as_ref())
                .map(|rows| rows.saturating_sub(first_batch * sh.config.batch_size as u64));
            run.spawn("stoker-pack".into(), move || {
                pack_batches(&sh, (from, first_batch, limit), &res_rx, &credit_tx, &done_tx, &cancel);
                if let Some(r) = run2.upgrade() {
                    r.finish();
                }
            })?;
        }
        self.active.set(run.clone());
        let pool = sh.pool.view();
        let budget = FailureBudget::new(sh.config.max_failures, sh.config.raise);
        let pass = Pass::new(run, pool, TokenHooks, (first_batch as usize, None), budget, Observe::default());
        Ok(TokenIter { shared: sh, pass })
    }
}

/// Starts the reader and the tokenizer threads of `run` over this rank's documents from
/// `from`: tokenized chunks arrive numbered in order on the returned receiver, and each chunk
/// the consumer has taken in order gives one credit back on the sender paired with `credits`.
fn spawn_tokenizing<S: Send + 'static>(
    run: &Arc<Run<S>>,
    sh: &Arc<Shared>,
    (from, elastic): (Resume, Option<Elastic>),
    credits: Receiver<()>,
) -> Result<Receiver<(u64, Tokenized)>> {
    let cancel = run.cancel_flag();
    let n = credits.capacity().unwrap_or(sh.threads * 4 + 4);
    let (job_tx, job_rx) = bounded::<(u64, Vec<RawDoc>)>(n);
    let (res_tx, res_rx) = bounded::<(u64, Tokenized)>(n);
    // Set when the reader has handed over its last chunk: a parked thread then leaves once no
    // chunk is left (it holds a sender of the results, whose end the packer waits for).
    let read_all = Arc::new(AtomicBool::new(false));
    {
        let (sh, cancel, read_all) = (sh.clone(), cancel.clone(), read_all.clone());
        run.spawn("stoker-text-read".into(), move || {
            // Object reads in flight are abandoned once the run is cancelled (a dropped loader
            // does not wait for a store that stopped answering).
            crate::source::with_stop(cancel.clone(), || read_docs(&sh, (from, elastic), &job_tx, &credits, &cancel));
            read_all.store(true, Ordering::Release);
        })?;
    }
    for k in 0..sh.threads {
        let (sh, rx, tx, cancel) = (sh.clone(), job_rx.clone(), res_tx.clone(), cancel.clone());
        let read_all = read_all.clone();
        run.spawn(format!("stoker-tokenize-{k}"), move || {
            let tok = sh.tokenizer.clone();
            loop {
                // Autotuned out: parked until the tuner wants this thread again or the work ends.
                while k >= sh.tuner.threads_active() {
                    if cancel.load(Ordering::Acquire) || (read_all.load(Ordering::Acquire) && rx.is_empty()) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let Some((seq, chunk)) = recv(&rx, &cancel) else { return };
                let t0 = Instant::now();
                let docs = chunk.len();
                let out: Tokenized = chunk.into_iter().map(|d| tokenize(&sh, tok.as_ref(), d)).collect();
                sh.stats.tokenize_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if sh.tracer.is_some() {
                    let tokens: usize = out.iter().map(|(d, _)| d.tokens.len()).sum();
                    sh.span(
                        "tokenize",
                        t0,
                        &[("chunk", seq as f64), ("documents", docs as f64), ("tokens", tokens as f64)],
                    );
                }
                if !send(&tx, (seq, out), &cancel) {
                    return;
                }
            }
        })?;
    }
    Ok(res_rx)
}

/// The token kind adds nothing to a pass: its position advances with each delivered slot (the
/// producer decides the end, which [`TokenIter`] sees, and writes the trace then).
struct TokenHooks;

impl PassHooks for TokenHooks {}

/// The reader thread: this rank's documents from `from`, in chunks, for each credit.
fn read_docs(
    sh: &Shared,
    (from, elastic): (Resume, Option<Elastic>),
    job_tx: &Sender<(u64, Vec<RawDoc>)>,
    credits: &Receiver<()>,
    cancel: &AtomicBool,
) {
    let cfg = &sh.config;
    let src = &sh.source;
    let mut files: Vec<Option<Box<dyn crate::source::PositionedRead>>> = (0..src.files.len()).map(|_| None).collect();
    let mut seq = 0u64;
    let mut chunk: Vec<RawDoc> = Vec::new();
    let mut chunk_bytes = 0usize;
    let mut flush = |chunk: &mut Vec<RawDoc>, bytes: &mut usize| -> bool {
        if chunk.is_empty() {
            return true;
        }
        if recv(credits, cancel).is_none() {
            return false;
        }
        let ok = send(job_tx, (seq, std::mem::take(chunk)), cancel);
        seq += 1;
        *bytes = 0;
        ok
    };
    let mut epoch = from.epoch;
    let mut start = from.cursor;
    loop {
        if let Some(c) = &sh.autocache {
            c.refresh(); // what this and other processes stored since: hits from now on
        }
        let order = epoch_order(src, cfg, epoch, elastic.as_ref().filter(|_| epoch == from.epoch));
        // A document whose tokens the token cache holds is not read.
        let from_cache = |doc: u64| -> Option<Vec<u8>> {
            let c = sh.autocache.as_ref()?;
            let mut buf = Vec::new();
            c.get(doc, &mut buf).then_some(buf)
        };
        let mut emit = |d: RawDoc, chunk: &mut Vec<RawDoc>, bytes: &mut usize| -> bool {
            *bytes += d.bytes.as_ref().map_or(0, |b| b.len());
            chunk.push(d);
            if chunk.len() >= CHUNK_DOCS || *bytes >= CHUNK_BYTES {
                return flush(chunk, bytes);
            }
            true
        };
        if src.random_access() {
            for c in start..order.docs.len() as u64 {
                let doc = order.docs[c as usize];
                let (f, k) = src.locate(doc);
                let file = &src.files[f];
                let entry = &file.docs[k];
                let t0 = Instant::now();
                let skip = order.skips.get(&c).copied().unwrap_or(0);
                if let Some(tokens) = from_cache(doc) {
                    sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    let d = RawDoc { epoch, cursor: c, at: (f, k), bytes: Ok(tokens), skip, doc, cached: true };
                    if !emit(d, &mut chunk, &mut chunk_bytes) {
                        return;
                    }
                    continue;
                }
                let bytes = if entry.len > cfg.max_document_bytes {
                    Err(too_long(file, entry, cfg.max_document_bytes))
                } else {
                    let handle = match &files[f] {
                        Some(h) => Ok(h),
                        None => crate::source::open_positioned(&file.path).map(|h| &*files[f].insert(h)),
                    };
                    handle.and_then(|h| {
                        let mut buf = Vec::new();
                        file.read_at(h.as_ref(), entry, &mut buf).map(|()| buf)
                    })
                };
                sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                sh.stats.bytes.fetch_add(entry.len.min(cfg.max_document_bytes), Ordering::Relaxed);
                sh.span("read", t0, &[("document", c as f64), ("bytes", entry.len as f64)]);
                let down = store_down(&bytes);
                if !emit(
                    RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false },
                    &mut chunk,
                    &mut chunk_bytes,
                ) {
                    return;
                }
                if down {
                    flush(&mut chunk, &mut chunk_bytes);
                    return;
                }
            }
        } else {
            // Read each group (a window of one file) from its stream in file order, then hand
            // its documents over in the epoch's order.
            let mut cursors: Vec<Option<StreamCursor>> = (0..src.files.len()).map(|_| None).collect();
            let mut tables: Vec<Option<ParquetCursor>> = (0..src.files.len()).map(|_| None).collect();
            for g in order.groups.windows(2) {
                let (gs, ge) = (g[0] as u64, g[1] as u64);
                if ge <= start {
                    continue;
                }
                let lo = gs.max(start);
                let mut got: BTreeMap<u64, RawDoc> = BTreeMap::new();
                let mut want: Vec<(usize, usize, u64)> = Vec::with_capacity((ge - lo) as usize);
                for c in lo..ge {
                    let doc = order.docs[c as usize];
                    let (f, k) = src.locate(doc);
                    let t0 = Instant::now();
                    match from_cache(doc) {
                        Some(tokens) => {
                            sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            let skip = order.skips.get(&c).copied().unwrap_or(0);
                            got.insert(
                                c,
                                RawDoc { epoch, cursor: c, at: (f, k), bytes: Ok(tokens), skip, doc, cached: true },
                            );
                        }
                        None => want.push((f, k, c)),
                    }
                }
                want.sort_unstable();
                for (f, k, c) in want {
                    let doc = order.docs[c as usize];
                    let file = &src.files[f];
                    let entry = &file.docs[k];
                    if cursors[f].as_ref().is_some_and(|s| s.position() > entry.offset) {
                        cursors[f] = None;
                    }
                    let t0 = Instant::now();
                    if file.compression == super::docs::Compression::Parquet {
                        let table = match &mut tables[f] {
                            Some(t) => Ok(t),
                            None => ParquetCursor::new(file, &cfg.text_key).map(|t| tables[f].insert(t)),
                        };
                        let bytes = table.and_then(|t| {
                            let mut buf = Vec::new();
                            t.read(file, entry, cfg.max_document_bytes, &mut buf).map(|()| buf)
                        });
                        sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        sh.stats.bytes.fetch_add(bytes.as_ref().map_or(0, |b| b.len() as u64), Ordering::Relaxed);
                        sh.span("read", t0, &[("document", c as f64)]);
                        let skip = order.skips.get(&c).copied().unwrap_or(0);
                        got.insert(c, RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false });
                        continue;
                    }
                    let cur = match &mut cursors[f] {
                        Some(s) => Ok(s),
                        None => StreamCursor::new(file).map(|s| cursors[f].insert(s)),
                    };
                    let bytes = cur.and_then(|s| {
                        let mut buf = Vec::new();
                        s.read(file, entry, cfg.max_document_bytes, &mut buf).map(|()| buf)
                    });
                    if bytes.is_err() {
                        cursors[f] = None; // a broken stream is reopened for the next document
                    }
                    sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    sh.stats.bytes.fetch_add(entry.len.min(cfg.max_document_bytes), Ordering::Relaxed);
                    sh.span("read", t0, &[("document", c as f64), ("bytes", entry.len as f64)]);
                    let skip = order.skips.get(&c).copied().unwrap_or(0);
                    let down = store_down(&bytes);
                    got.insert(c, RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false });
                    if cancel.load(Ordering::Acquire) {
                        return;
                    }
                    if down {
                        // No later read can succeed: hand over what was read, up to the error.
                        for (_, d) in got {
                            if !emit(d, &mut chunk, &mut chunk_bytes) {
                                return;
                            }
                        }
                        flush(&mut chunk, &mut chunk_bytes);
                        return;
                    }
                }
                for (_, d) in got {
                    if !emit(d, &mut chunk, &mut chunk_bytes) {
                        return;
                    }
                }
            }
        }
        if !cfg.infinite {
            break;
        }
        if order.docs.is_empty() {
            return; // a rank without documents would loop for ever
        }
        epoch += 1;
        start = 0;
    }
    flush(&mut chunk, &mut chunk_bytes);
}

/// Whether a document's read failed because its store is not answering: the reader stops
/// there (the error ends the pass; every later read would wait for its bound too).
fn store_down(bytes: &Result<Vec<u8>>) -> bool {
    matches!(bytes, Err(Error::Unavailable(_)))
}

/// Appends the little-endian ids of `width` bytes each (2 or 4) in `bytes` to `out`.
fn extend_ids(out: &mut Vec<u32>, bytes: &[u8], width: usize) {
    if width == 2 {
        out.extend(bytes.chunks_exact(2).map(|t| u16::from_le_bytes([t[0], t[1]]) as u32));
    } else {
        out.extend(bytes.chunks_exact(4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]])));
    }
}

/// Parses and tokenizes one document; a failure is an empty document with its error.
fn tokenize(sh: &Shared, tok: Option<&TextTokenizer>, d: RawDoc) -> (Doc, Option<Error>) {
    let skip = d.skip.min(usize::MAX as u64) as usize;
    let (mut doc, err) = tokenize_whole(sh, tok, d);
    doc.tokens.drain(..skip.min(doc.tokens.len()));
    (doc, err)
}

fn tokenize_whole(sh: &Shared, tok: Option<&TextTokenizer>, d: RawDoc) -> (Doc, Option<Error>) {
    let mut doc = Doc { epoch: d.epoch, cursor: d.cursor, tokens: Vec::new() };
    let file = &sh.source.files[d.at.0];
    let entry = &file.docs[d.at.1];
    let bytes = match d.bytes {
        Ok(b) => b,
        Err(e) => return (doc, Some(e)),
    };
    let fail = |why: String| Some(Error::decode(&file.path, format!("{}: {why}", file.place(entry))));
    if d.cached {
        // Tokens from the token cache: ids of its width, BOS/EOS added as for text.
        let w = sh.autocache.as_ref().map_or(4, |c| c.width() as usize);
        doc.tokens.reserve(bytes.len() / w + 2);
        if sh.config.add_bos {
            doc.tokens.extend(sh.bos);
        }
        extend_ids(&mut doc.tokens, &bytes, w);
        if sh.config.add_eos {
            doc.tokens.extend(sh.eos);
        }
        return (doc, None);
    }
    match (sh.source.format, tok) {
        (Format::Tokens(_) | Format::Cache(_), _) => {
            let cached = matches!(sh.source.format, Format::Cache(_));
            let w = file.width as usize;
            doc.tokens.reserve(bytes.len() / w.max(1) + 2);
            if cached && sh.config.add_bos {
                doc.tokens.extend(sh.bos);
            }
            extend_ids(&mut doc.tokens, &bytes, w);
            if cached && sh.config.add_eos {
                doc.tokens.extend(sh.eos);
            }
            (doc, None)
        }
        (_, Some(tok)) => {
            let format = sh.source.formats[d.at.0];
            let json = format == Format::Jsonl || file.tar == Some(super::docs::TarText::Json);
            let text = match json {
                true => match json_text(&bytes, &sh.config.text_key) {
                    Ok(t) => t,
                    Err(why) => return (doc, fail(why)),
                },
                false => match std::str::from_utf8(&bytes) {
                    Ok(t) => std::borrow::Cow::Borrowed(t),
                    Err(e) => return (doc, fail(format!("not UTF-8 text: {e}"))),
                },
            };
            if sh.config.add_bos {
                doc.tokens.extend(sh.bos);
            }
            let first = doc.tokens.len();
            if let Err(e) = tok.encode_into(&text, &mut doc.tokens) {
                doc.tokens.clear();
                return (doc, fail(e.to_string()));
            }
            if let Some(c) = &sh.autocache {
                c.put(d.doc, &doc.tokens[first..]);
            }
            if sh.config.add_eos {
                doc.tokens.extend(sh.eos);
            }
            (doc, None)
        }
        (_, None) => (doc, fail("no tokenizer".into())),
    }
}

/// The packer thread: chunks back in order, packed into rows, a batch per pooled slot.
fn pack_batches(
    sh: &Shared,
    (from, first_batch, mut limit): (Resume, u64, Option<u64>),
    results: &Receiver<(u64, Tokenized)>,
    credits: &Sender<()>,
    done: &Sender<Arc<TokenSlot>>,
    cancel: &AtomicBool,
) {
    let cfg = &sh.config;
    let (bs, len) = (cfg.batch_size, cfg.seq_len);
    let mut early: BTreeMap<u64, Tokenized> = BTreeMap::new();
    let mut next_seq = 0u64;
    let mut ready: std::collections::VecDeque<(Doc, Option<Error>)> = Default::default();
    let failures: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    // Nanoseconds the packer waited for tokenized documents (not counted as packing).
    let waited = AtomicU64::new(0);
    let mut pull = || -> Option<Doc> {
        loop {
            if let Some((d, e)) = ready.pop_front() {
                sh.stats.documents.fetch_add(1, Ordering::Relaxed);
                if let Some(e) = e {
                    sh.stats.failed.fetch_add(1, Ordering::Relaxed);
                    failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                }
                return Some(d);
            }
            if let Some(c) = early.remove(&next_seq) {
                next_seq += 1;
                let _ = credits.try_send(());
                ready.extend(c);
                continue;
            }
            let t = Instant::now();
            let got = recv(results, cancel);
            waited.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let (seq, c) = got?;
            early.insert(seq, c);
        }
    };
    enum Packer {
        Concat(Concat),
        BestFit(BestFit),
    }
    let mut packer = match cfg.pack {
        PackMode::Concat => Packer::Concat(Concat::new(from)),
        PackMode::BestFit => Packer::BestFit(BestFit::new(cfg.pack_window, sh.pad, from)),
    };
    let mut segments: Vec<u32> = Vec::with_capacity(len + 1);
    let mut batch = first_batch as usize;
    loop {
        let Some(slot) = take_free(&sh.pool.free_rx, cancel) else { return };
        let t0 = Instant::now();
        let mut rows = 0;
        let mut cu_len = 1;
        let mut ended = false;
        // SAFETY: the packer is this slot's only user until it is sent.
        unsafe { TokenSlot::ints_mut(&slot.cu, 0, 1)[0] = 0 };
        let mut info_sum = RowInfo::default();
        while rows < bs {
            if limit == Some(0) {
                ended = true;
                break;
            }
            segments.clear();
            let off = rows * len;
            // SAFETY: rows `rows` of the slot's buffers belong to the packer alone.
            let out = unsafe {
                RowOut {
                    input: TokenSlot::ints_mut(&slot.input, off, len),
                    labels: TokenSlot::ints_mut(&slot.labels, off, len),
                    positions: TokenSlot::ints_mut(&slot.positions, off, len),
                    segments: &mut segments,
                }
            };
            let r = match &mut packer {
                Packer::Concat(p) => p.row(&mut pull, out),
                Packer::BestFit(p) => p.row(&mut pull, out),
            };
            match r {
                Ok(info) => {
                    // SAFETY: as above; the row's segments fit: at most seq_len + 1 per row.
                    let cu = unsafe { TokenSlot::ints_mut(&slot.cu, cu_len, segments.len()) };
                    let mut acc = (rows * len) as i32;
                    for (c, &s) in cu.iter_mut().zip(&segments) {
                        acc += s as i32;
                        *c = acc;
                    }
                    cu_len += segments.len();
                    info_sum.tokens += info.tokens;
                    info_sum.pad += info.pad;
                    info_sum.split += info.split;
                    rows += 1;
                    limit = limit.map(|l| l - 1);
                }
                Err(tail) => {
                    sh.stats.dropped.fetch_add(tail as u64, Ordering::Relaxed);
                    ended = true;
                    break;
                }
            }
        }
        if cancel.load(Ordering::Acquire) {
            sh.pool.give_back(slot);
            return;
        }
        let keep = rows > 0 && !(ended && rows < bs && cfg.drop_last);
        if !keep {
            if rows > 0 {
                sh.stats.dropped.fetch_add((info_sum.tokens) as u64, Ordering::Relaxed);
            }
            let left = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
            if left.is_empty() {
                sh.pool.give_back(slot);
                return;
            }
            // Failed documents after the last row still count against the failure budget (and
            // raise under on_bad_document='raise'): an empty slot carries them to the pass.
            slot.batch.store(batch, Ordering::Relaxed);
            slot.rows.store(0, Ordering::Release);
            slot.cu_len.store(1, Ordering::Release);
            slot.after.lock().unwrap_or_else(|p| p.into_inner()).1 = left;
            if !send(done, slot.clone(), cancel) {
                sh.pool.give_back(slot);
            }
            return;
        }
        sh.stats.tokens.fetch_add(info_sum.tokens as u64, Ordering::Relaxed);
        sh.stats.padding.fetch_add(info_sum.pad as u64, Ordering::Relaxed);
        sh.stats.split.fetch_add(info_sum.split as u64, Ordering::Relaxed);
        sh.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        let resume = match &packer {
            Packer::Concat(p) => p.resume(),
            Packer::BestFit(p) => p.resume(),
        };
        slot.batch.store(batch, Ordering::Relaxed);
        slot.rows.store(rows, Ordering::Release);
        slot.cu_len.store(cu_len, Ordering::Release);
        {
            let mut a = slot.after.lock().unwrap_or_else(|p| p.into_inner());
            a.0 = resume;
            a.1 = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
        }
        let idle = waited.swap(0, Ordering::Relaxed);
        sh.stats.pack_ns.fetch_add((t0.elapsed().as_nanos() as u64).saturating_sub(idle), Ordering::Relaxed);
        sh.span("pack", t0, &[("batch", batch as f64), ("rows", rows as f64), ("waited_s", idle as f64 / 1e9)]);
        if !send(done, slot.clone(), cancel) {
            sh.pool.give_back(slot);
            return;
        }
        batch += 1;
        if ended {
            return;
        }
    }
}

impl Drop for TokenLoader {
    /// Writes the trace, when there is one with events not yet in its file (a failure goes to
    /// stderr: a drop has no caller to return it to).
    fn drop(&mut self) {
        if let Err(e) = self.shared.write_trace() {
            eprintln!("stoker: {e}");
        }
    }
}

/// One batch: `rows` rows of `seq_len` tokens in a pooled slot, returned to the pool on drop.
pub struct TokenBatch {
    slot: Option<Arc<TokenSlot>>,
    shared: Arc<Shared>,
}

impl TokenBatch {
    fn slot(&self) -> &TokenSlot {
        self.slot.as_ref().expect("live")
    }

    /// Rows in this batch.
    pub fn rows(&self) -> usize {
        self.slot().rows.load(Ordering::Acquire)
    }

    /// Tokens per row.
    pub fn seq_len(&self) -> usize {
        self.shared.config.seq_len
    }

    /// Batch number (since the epoch's start).
    pub fn index(&self) -> usize {
        self.slot().batch.load(Ordering::Relaxed)
    }

    fn values(&self) -> usize {
        self.rows() * self.seq_len()
    }

    /// `input_ids`, `rows x seq_len`.
    pub fn input_ids(&self) -> &[i32] {
        // SAFETY: a delivered batch is complete: nobody writes it until it returns to the pool.
        unsafe { TokenSlot::ints(&self.slot().input, self.values()) }
    }

    /// `labels`: the next token in the document, `-100` where there is none.
    pub fn labels(&self) -> &[i32] {
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().labels, self.values()) }
    }

    /// `position_ids`, restarting at each segment.
    pub fn position_ids(&self) -> &[i32] {
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().positions, self.values()) }
    }

    /// `cu_seqlens` over the flattened batch: 0, then the end of each segment.
    pub fn cu_seqlens(&self) -> &[i32] {
        let n = self.slot().cu_len.load(Ordering::Acquire);
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().cu, n) }
    }

    /// The longest segment (FlashAttention's `max_seqlen`).
    pub fn max_seqlen(&self) -> usize {
        self.cu_seqlens().windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0)
    }

    /// The four arrays as `(address, bytes)`: `input_ids`, `labels`, `position_ids`,
    /// `cu_seqlens` (what a transfer to a GPU copies).
    pub fn regions(&self) -> [(*const u8, usize); 4] {
        let r = |s: &[i32]| (s.as_ptr().cast::<u8>(), std::mem::size_of_val(s));
        [r(self.input_ids()), r(self.labels()), r(self.position_ids()), r(self.cu_seqlens())]
    }
}

impl Drop for TokenBatch {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.shared.pool.release(s);
        }
    }
}

/// One pass over (the rest of) an epoch, or for ever with `infinite`.
pub struct TokenIter {
    shared: Arc<Shared>,
    pass: Pass<Arc<TokenSlot>, TokenHooks>,
}

impl std::fmt::Debug for TokenIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIter").field("next", &self.pass.next_batch()).finish()
    }
}

impl TokenIter {
    /// Like `next`, but gives up after `timeout` ([`Next::NotYet`]).
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<TokenBatch> {
        self.poll(Some(Instant::now() + timeout))
    }

    fn poll(&mut self, deadline: Option<Instant>) -> Next<TokenBatch> {
        let t0 = Instant::now();
        let got = self.pass.poll(deadline);
        self.shared.stats.wait_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let shared = &self.shared;
        if matches!(got, Next::End) {
            // The pass ended (the trace's writer skips a ring with nothing new).
            if let Err(e) = shared.write_trace() {
                eprintln!("stoker: {e}"); // the iteration has ended well: no caller to return it to
            }
        }
        got.map(|slot| {
            shared.span("consumer wait", t0, &[("batch", slot.batch.load(Ordering::Relaxed) as f64)]);
            let s = &shared.stats;
            let wait = s.wait_ns.load(Ordering::Relaxed);
            let since = s.started.get().map_or(0, |t| t.elapsed().as_nanos() as u64);
            shared.tuner.on_batch_load(crate::tune::Load {
                consumer_wait_ns: wait,
                consumer_busy_ns: since.saturating_sub(wait),
                worker_busy_ns: s.tokenize_ns.load(Ordering::Relaxed),
            });
            let at = slot.after.lock().unwrap_or_else(|p| p.into_inner()).0;
            {
                let mut p = shared.position.lock().unwrap_or_else(|p| p.into_inner());
                p.next_batch += 1;
                p.at = at;
            }
            TokenBatch { slot: Some(slot), shared: shared.clone() }
        })
    }

    /// Stops the iteration now (every thread joined).
    pub fn close(&mut self) {
        self.pass.shutdown();
    }
}

impl Iterator for TokenIter {
    type Item = Result<TokenBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).into_item()
    }
}
