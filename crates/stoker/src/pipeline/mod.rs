//! The running pipeline: a dispatcher, a small I/O pool and a decode pool joined by bounded
//! queues, delivering batches in order.
//!
//! ```text
//! dispatcher ──tasks──► I/O threads ──bytes──► decode threads ──done──► consumer (reorders)
//!     ▲ waits for a free slot                        │ write samples straight into the slot
//!     └──────────────── slot returns when the Batch is dropped ◄──────────────────┘
//! ```
//!
//! Reads are kept apart from decode so slow storage does not idle the decoders. Shutdown: the
//! consumer sets a cancel flag and drops its end; every blocking wait either observes the flag
//! (with a short timeout) or sees its channel disconnect, and `Drop` joins every thread.
//! A bad sample is skipped (policy `skip`): its batch is delivered *shorter* (the good samples
//! compacted in order), never with a garbage slot; a batch whose samples all failed is not
//! delivered. Under policy `raise` the batch holding the first bad sample yields the error and
//! the iteration ends.

mod ordered;

pub use ordered::{panic_message, Run, Wait};

use crate::buffer::{BufferPool, HeapAllocator, HostAllocator, Slot};
use crate::decode::{DecodeOptions, Decoder};
use crate::error::{Error, Result};
use crate::ops::{DType, Layout, Resampler, TransformPlan, TransformSpec};
use crate::rng::{self, Rng};
use crate::sampler::{Fingerprint, Position, Sampler, SamplerSpec, SamplerState};
use crate::source::Source;
use crate::telemetry::{ConsumerClock, Report, Skipped, Telemetry};
use crate::trace::{Args as TraceArgs, TraceSpec, Tracer};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What to do with a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    /// Skip it, count it, list it in the report (the default).
    Skip,
    /// Stop the iteration with its error.
    Raise,
}

impl ErrorPolicy {
    /// Parses `skip` / `raise`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(ErrorPolicy::Skip),
            "raise" => Ok(ErrorPolicy::Raise),
            _ => Err(Error::config("on_error", format!("unknown policy {s:?}; allowed: skip, raise"))),
        }
    }
}

/// Everything a loader needs besides its source: a plain, serialisable description.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LoaderConfig {
    /// Order, sharding and batch size.
    pub sampler: SamplerSpec,
    /// The transform.
    pub transform: TransformSpec,
    /// Decode threads (`None`: autotuned within `cpu_budget`, see [`crate::tune`]; a set
    /// `STOKER_NUM_THREADS` is a fixed count).
    pub threads: Option<usize>,
    /// I/O threads (`None`: 2, or fewer with a single decode thread).
    pub io_threads: Option<usize>,
    /// Finished batches that may wait ahead of the consumer (with `prefetch_auto`, the start).
    pub prefetch: usize,
    /// `prefetch="auto"`: tuned up to [`crate::tune::AUTO_PREFETCH_MAX`] within the memory cap.
    #[serde(default)]
    pub prefetch_auto: bool,
    /// Cores autotuned threads may use (`None`: the CPU allowance).
    #[serde(default)]
    pub cpu_budget: Option<f64>,
    /// Cap on the bytes of all batch buffers together.
    pub memory_limit: Option<u64>,
    /// Bad-sample policy.
    pub on_error: ErrorPolicy,
    /// Allow DCT-scaled JPEG decoding (on by default; off only to measure it).
    pub dct_scaling: bool,
    /// Allow region-of-interest JPEG decoding (on by default; off only to measure it).
    pub roi: bool,
    /// Images larger than this many pixels (from the header) are that sample's error.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
    /// Files (or shard members) larger than this many bytes are that sample's error.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// The failure budget of a pass: past it the iteration raises instead of delivering
    /// near-empty batches (a storage outage, a broken dataset).
    #[serde(default)]
    pub max_failures: MaxFailures,
    /// The decoded-pixel cache (`None`: decode every epoch). With a cache, every image is
    /// decoded whole (`roi` is not used), at full resolution (`dct_scaling` is not used either)
    /// unless the cache has a `max_side`, so batches are the same whether a sample's pixels came
    /// from the cache or from a decode.
    #[serde(default)]
    pub cache: Option<crate::cache::CacheSpec>,
    /// Record a trace of every sample's stages (see [`crate::trace`]); `None`: no tracing, at
    /// no cost.
    #[serde(default)]
    pub trace: Option<TraceSpec>,
}

/// How many samples of one pass over an epoch may fail (be skipped) before the iteration
/// raises. The default, 10% of the epoch's samples but at least 100, never trips on the few
/// corrupt files real datasets hold (well under 1%), and stops a job whose storage went away
/// after a tenth of an epoch instead of letting it train on empty batches.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaxFailures {
    /// 10% of the pass's samples, at least 100.
    #[default]
    Default,
    /// At most this many.
    Count(u64),
    /// At most this fraction (0 < f <= 1) of the pass's samples.
    Fraction(f64),
}

impl MaxFailures {
    /// The number of failures allowed in a pass over `samples` samples.
    pub fn limit(&self, samples: usize) -> u64 {
        match *self {
            MaxFailures::Default => ((samples as f64 * 0.1).ceil() as u64).max(100),
            MaxFailures::Count(n) => n,
            MaxFailures::Fraction(f) => (samples as f64 * f).floor() as u64,
        }
    }
}

fn default_max_pixels() -> u64 {
    crate::decode::DEFAULT_MAX_PIXELS
}

fn default_max_file_bytes() -> u64 {
    DEFAULT_MAX_FILE_BYTES
}

/// The default file-size limit: 256 MiB, far above any real training image (ImageNet's largest
/// JPEG is ~15 MiB) and small enough that every I/O thread may hold one in memory.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

impl LoaderConfig {
    /// A configuration with defaults for everything but the batch size and transform.
    pub fn new(batch_size: usize, transform: TransformSpec) -> Self {
        LoaderConfig {
            sampler: SamplerSpec { batch_size, ..SamplerSpec::default() },
            transform,
            threads: None,
            io_threads: None,
            prefetch: 2,
            prefetch_auto: false,
            cpu_budget: None,
            memory_limit: None,
            on_error: ErrorPolicy::Skip,
            dct_scaling: true,
            roi: true,
            max_pixels: default_max_pixels(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_failures: MaxFailures::Default,
            cache: None,
            trace: None,
        }
    }
}

struct Shared {
    source: Arc<dyn Source>,
    sampler: Sampler,
    plan: TransformPlan,
    pool: BufferPool,
    telemetry: Arc<Telemetry>,
    /// The trace recorder, when tracing is on (checked once per event site).
    tracer: Option<Arc<Tracer>>,
    threads: usize,
    io_threads: usize,
    allowance: usize,
    on_error: ErrorPolicy,
    decode_opts: DecodeOptions,
    max_file_bytes: u64,
    max_failures: MaxFailures,
    /// The decoded-pixel cache, if any.
    cache: Option<crate::cache::Cache>,
    /// Active threads, prefetch gate and CPU share (fixed settings included).
    tuner: crate::tune::Tuner,
    /// Computed on first use (it reads every sample's name).
    fingerprint: std::sync::OnceLock<Fingerprint>,
    /// Worker scratch (decoder, resampler) and read buffers kept between epochs, so a new
    /// epoch's threads start warm instead of re-growing their buffers.
    stash: Mutex<Stash>,
    /// The largest read buffer any I/O thread has needed: every buffer is grown to it at once,
    /// so the rotating buffers stop reallocating as soon as one of them has met the largest file.
    read_high_water: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Stash {
    workers: Vec<(Decoder, Resampler)>,
    bytes: Vec<Vec<u8>>,
}

/// A batch loader over a [`Source`].
pub struct Loader {
    shared: Arc<Shared>,
    state: Arc<Position>,
    active: Mutex<Option<Arc<IterCore>>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("samples", &self.shared.source.len())
            .field("threads", &self.shared.threads)
            .field("pool", &self.shared.pool)
            .finish()
    }
}

impl Loader {
    /// Validates `config` against `source` and allocates the buffer pool on the heap.
    pub fn new(source: Arc<dyn Source>, config: LoaderConfig) -> Result<Self> {
        Self::new_in(source, config, &HeapAllocator)
    }

    /// Like [`Loader::new`], with the batch buffers taken from `alloc` (e.g. page-locked memory
    /// from `stoker-cuda`, so the GPU copies them asynchronously).
    pub fn new_in(source: Arc<dyn Source>, config: LoaderConfig, alloc: &dyn HostAllocator) -> Result<Self> {
        if source.is_empty() {
            return Err(Error::Dataset("the dataset has no samples".into()));
        }
        let mut sampler = Sampler::new(source.len(), config.sampler.clone())?;
        if config.sampler.shard_window.is_some() {
            let groups = source.groups().ok_or_else(|| {
                Error::config("shuffle", "shard-aware shuffling ('shards') needs a dataset of tar shards")
            })?;
            sampler = sampler.with_groups(groups)?;
        }
        if sampler.num_batches() == 0 {
            return Err(Error::config(
                "batch_size",
                format!(
                    "{} with drop_last leaves no batch: this rank has only {} samples",
                    config.sampler.batch_size,
                    sampler.samples_per_rank()
                ),
            ));
        }
        let plan = TransformPlan::compile(&config.transform)?;
        let allowance = crate::cpu::allowance().effective;
        let fixed = match config.threads {
            Some(0) => return Err(Error::config("threads", "must be at least 1 (or auto)")),
            Some(n) => Some(n),
            None => crate::cpu::env_threads(),
        };
        let cpu_budget = config.cpu_budget.unwrap_or_else(crate::cpu::default_budget);
        // An autotuned loader starts a worker per whole core of its budget.
        let threads = fixed.unwrap_or((cpu_budget + 1e-9).floor().max(1.0) as usize);
        let io_threads = match config.io_threads {
            Some(0) => return Err(Error::config("io_threads", "must be at least 1")),
            Some(n) => n,
            None => {
                if threads == 1 {
                    1
                } else {
                    2
                }
            }
        };
        if config.prefetch == 0 {
            return Err(Error::config("prefetch", "must be at least 1"));
        }
        let batch_size = config.sampler.batch_size;
        let batch_bytes = batch_size * plan.sample_bytes();
        // One batch being filled, `prefetch` ready, one held by the consumer.
        let slots = if config.prefetch_auto {
            let limit = config.memory_limit.unwrap_or(crate::tune::AUTO_PREFETCH_BYTES.max(4 * batch_bytes as u64));
            BufferPool::plan(crate::tune::AUTO_PREFETCH_MAX + 2, batch_bytes, Some(limit))?
        } else {
            BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?
        };
        let pool = BufferPool::new_in(slots, batch_size, plan.sample_bytes(), alloc)?;
        let cache =
            config.cache.as_ref().map(|c| crate::cache::Cache::open(c, config.transform.apply_exif)).transpose()?;
        let tracer =
            config.trace.as_ref().map(|t| check_trace(t).map(|()| Arc::new(Tracer::from_spec(t)))).transpose()?;
        // A cache holds whole images: at full resolution every image is decoded that way, cached
        // or not; reduced to a `max_side`, DCT scaling (when allowed) makes the reduction cheap.
        // A miss that the budget cannot store is decoded like an uncached sample: around the
        // crop (`roi`), which at full resolution gives the same pixels within the crop.
        let full = cache.as_ref().is_some_and(|c| c.max_side().is_none());
        let decode_opts = DecodeOptions {
            apply_exif: config.transform.apply_exif,
            dct_scaling: config.dct_scaling && !full,
            roi: config.roi && (cache.is_none() || full),
            max_pixels: config.max_pixels,
        };
        let tuner = crate::tune::Tuner::new(
            crate::tune::TuneSpec {
                auto_threads: fixed.is_none(),
                threads_max: threads,
                auto_prefetch: config.prefetch_auto,
                prefetch_max: if config.prefetch_auto { slots.saturating_sub(2).max(1) } else { config.prefetch },
                prefetch: config.prefetch,
                cpu_budget: if fixed.is_some() { config.cpu_budget.unwrap_or(threads as f64) } else { cpu_budget },
                epoch_batches: sampler.num_batches(),
            },
            crate::budget::Registry::from_env(),
        );
        Ok(Loader {
            shared: Arc::new(Shared {
                source,
                sampler,
                plan,
                pool,
                telemetry: Arc::default(),
                tracer,
                threads,
                io_threads,
                allowance,
                on_error: config.on_error,
                decode_opts,
                max_file_bytes: config.max_file_bytes,
                max_failures: config.max_failures,
                cache,
                tuner,
                fingerprint: std::sync::OnceLock::new(),
                stash: Mutex::new(Stash::default()),
                read_high_water: std::sync::atomic::AtomicUsize::new(0),
            }),
            state: Arc::new(Position::default()),
            active: Mutex::new(None),
        })
    }

    /// Batches per epoch on this rank.
    pub fn len(&self) -> usize {
        self.shared.sampler.num_batches()
    }

    /// Whether an epoch has no batches (never true for a constructed loader).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decode threads started (autotuned: the most that may take work; see
    /// [`Report::tuning`] for how many do).
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// I/O threads.
    pub fn io_threads(&self) -> usize {
        self.shared.io_threads
    }

    /// The buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.shared.pool
    }

    /// The compiled transform.
    pub fn plan(&self) -> &TransformPlan {
        &self.shared.plan
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.shared.sampler
    }

    /// Selects the epoch for the next iteration. Changing it makes a running iteration stale
    /// (its next batch is an error) and forgets a restored position; setting the current epoch
    /// again changes nothing (so a restored state survives the usual `set_epoch` call).
    pub fn set_epoch(&self, epoch: u64) {
        if self.state.set_epoch(epoch) {
            self.retire(&format!("set_epoch({epoch}) was called after this iterator started"));
        }
    }

    /// Makes the running iteration, if any, stale.
    fn retire(&self, why: &str) {
        let old = self.active.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(old) = old {
            old.make_stale(&self.shared, why);
        }
    }

    /// The resumable state: where the next iteration would start.
    pub fn state(&self) -> SamplerState {
        self.state.state(self.shared.sampler.spec().seed)
    }

    /// Restores `st` exactly as another loader had it, including whether it was still to be
    /// resumed: how a fork child's rebuilt loader continues its parent's.
    pub fn adopt_state(&self, st: SamplerState, resume: bool) -> Result<()> {
        self.load_state(st)?;
        self.state.set_resume(resume);
        Ok(())
    }

    /// Lists entries of the dataset that are not samples (from [`crate::source::Dataset`]) in
    /// the report's skipped files, so a FIFO or a link loop is seen, not silently dropped.
    pub fn report_not_samples(&self, items: &[(std::path::PathBuf, String)]) {
        for (path, reason) in items {
            let path = path.display().to_string();
            self.shared.telemetry.skip(Skipped { index: u32::MAX, path, reason: reason.clone() });
        }
    }

    /// Whether a state was loaded and no iteration has started from it yet.
    pub fn resume_pending(&self) -> bool {
        self.state.resume_pending()
    }

    /// What a saved state is valid for (see [`Fingerprint`]); computed once, on first use.
    pub fn fingerprint(&self) -> &Fingerprint {
        self.shared.fingerprint.get_or_init(|| {
            let sh = &self.shared;
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for i in 0..sh.source.len() {
                h.update(sh.source.describe(i).as_os_str().as_encoded_bytes());
                h.update(&[0]);
                h.update(&sh.source.label(i).to_le_bytes());
            }
            let transform = serde_json::to_vec(&(sh.plan.spec(), sh.decode_opts.dct_scaling, sh.decode_opts.roi))
                .map(|b| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&b)))
                .unwrap_or_default();
            Fingerprint::new(sh.sampler.spec(), sh.source.len(), h.digest(), transform)
        })
    }

    /// Restores a state from [`Loader::state`]: the next iteration resumes there. A running
    /// iteration becomes stale.
    pub fn load_state(&self, st: SamplerState) -> Result<()> {
        self.state.restore(st, &self.shared.sampler)?;
        self.retire("load_state_dict was called after this iterator started");
        Ok(())
    }

    /// Telemetry since the loader was made (or last reset), with the bottleneck verdict.
    pub fn report(&self) -> Report {
        let tuning = self.shared.tuner.report();
        let mut r = self.shared.telemetry.report(tuning.threads_active, self.shared.io_threads, self.shared.allowance);
        r.cache = self.shared.cache.as_ref().map(|c| c.report());
        r.tuning = Some(tuning);
        r
    }

    /// The live counters (a transfer stage outside this crate records into them).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    /// The trace recorder, when tracing is on (a transfer stage outside this crate records
    /// into it).
    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.shared.tracer.as_ref()
    }

    /// The file the trace is written to: at the end of each completed pass and when the loader
    /// is dropped (and by [`Loader::write_trace`]).
    pub fn trace_path(&self) -> Option<&Path> {
        self.shared.tracer.as_ref().and_then(|t| t.path())
    }

    /// Writes the trace recorded so far (the last `trace_events` events) to `path` now,
    /// atomically (a temporary file, then a rename). An error when tracing is off.
    pub fn write_trace(&self, path: &Path) -> Result<()> {
        let tracer = self.shared.tracer.as_ref().ok_or_else(|| {
            Error::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
        })?;
        write_trace(&self.shared, tracer, path)
    }

    /// Zeroes the telemetry.
    pub fn reset_report(&self) {
        self.shared.telemetry.reset();
        if let Some(c) = &self.shared.cache {
            c.reset();
        }
    }

    /// Starts an iteration of the current epoch: at its first batch, or where a state loaded
    /// since the last iteration says. A previous iteration of this loader becomes stale (it
    /// stops, its buffers return to the pool, and its next batch is an error).
    pub fn iter(&self) -> Result<EpochIter> {
        // Stop the previous iteration and take its buffers back before starting.
        self.retire("a newer iteration of this loader was started");
        let (epoch, start) = self.state.start(self.len());
        let it = EpochIter::start(self.shared.clone(), self.state.clone(), epoch, start)?;
        *self.active.lock().unwrap_or_else(|p| p.into_inner()) = Some(it.core.clone());
        Ok(it)
    }
}

impl Drop for Loader {
    /// Writes the trace, when there is one with events not yet in its file. A failure is
    /// reported on stderr: a drop has no caller to return it to.
    fn drop(&mut self) {
        if let Some(t) = &self.shared.tracer {
            if let Some(path) = t.auto_path() {
                if let Err(e) = write_trace(&self.shared, t, path) {
                    eprintln!("stoker: {e}");
                }
            }
        }
    }
}

/// Refuses a trace file in a folder that does not exist, when the loader is made rather than
/// when the first pass ends.
fn check_trace(t: &TraceSpec) -> Result<()> {
    let dir = t.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(Error::config("trace", format!("the folder of {} does not exist", t.path.display())));
    }
    if t.path.is_dir() {
        return Err(Error::config(
            "trace",
            format!("{} is a folder; give a file such as trace.json", t.path.display()),
        ));
    }
    Ok(())
}

/// Writes `tracer`'s events to `path`, with the samples' paths from the source.
fn write_trace(sh: &Shared, tracer: &Tracer, path: &Path) -> Result<()> {
    let describe = |i: u32| sh.source.describe(i as usize).display().to_string();
    tracer.write(path, &describe).map(drop).map_err(|e| Error::io(path, &e))
}

/// A sample's trace arguments: dataset index and batch.
fn sample_args(task: &Task) -> TraceArgs {
    TraceArgs::Sample { index: task.slot.index(task.pos), batch: task.slot.batch.load(Ordering::Relaxed) as u32 }
}

struct Task {
    slot: Arc<Slot>,
    pos: usize,
}

struct Work {
    task: Task,
    bytes: Vec<u8>,
    read: Result<()>,
}

const POLL: Duration = Duration::from_millis(20);

/// One pass over (the rest of) an epoch; yields batches in order. Dropping it stops and joins
/// every thread.
pub struct EpochIter {
    shared: Arc<Shared>,
    state: Arc<Position>,
    core: Arc<IterCore>,
    next_batch: usize,
    end: usize,
    epoch: u64,
    clock: ConsumerClock,
    finished: bool,
    consumer_telemetry: bool,
    /// Samples that failed in this pass, the last few reasons, and how many may.
    failures: u64,
    last_failures: Vec<String>,
    failure_limit: u64,
    /// Samples delivered in this pass.
    delivered: u64,
    /// Tracing: when the current wait in `next()` began, and when (and which) batch was last
    /// handed over.
    trace_wait: Option<Instant>,
    trace_last: Option<(Instant, usize)>,
}

/// What an iteration shares with its loader, so that starting a new iteration (or
/// `set_epoch`, `load_state`) can stop this one and take its buffers back even while the old
/// iterator object is still alive: the generic ordered [`Run`] plus the read buffers.
struct IterCore {
    run: Arc<Run<Arc<Slot>>>,
    bytes_rx: Mutex<Option<Receiver<Vec<u8>>>>,
}

impl IterCore {
    /// Stops the threads, returns every slot to the pool and keeps the read buffers for the
    /// next epoch; idempotent.
    fn shutdown(&self, shared: &Shared) {
        self.run.shutdown();
        if let Some(rx) = self.bytes_rx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            stash.bytes.extend(rx.try_iter());
        }
    }

    /// Makes the iteration stale (`why`: what replaced it) and stops it.
    fn make_stale(&self, shared: &Shared, why: &str) {
        self.run.make_stale(why);
        self.shutdown(shared);
    }
}

impl std::fmt::Debug for EpochIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpochIter").field("epoch", &self.epoch).field("next_batch", &self.next_batch).finish()
    }
}

impl EpochIter {
    fn start(shared: Arc<Shared>, state: Arc<Position>, epoch: u64, start: usize) -> Result<Self> {
        let order = Arc::new(shared.sampler.epoch_order(epoch));
        let end = shared.sampler.num_batches();
        let bs = shared.sampler.spec().batch_size;
        let (task_tx, task_rx) = bounded::<Task>(bs.max(64));
        let work_cap = shared.threads * 2;
        let (work_tx, work_rx) = bounded::<Work>(work_cap);
        let nbytes = work_cap + shared.threads + shared.io_threads;
        let (bytes_tx, bytes_rx) = bounded::<Vec<u8>>(nbytes);
        {
            let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            for _ in 0..nbytes {
                bytes_tx.send(stash.bytes.pop().unwrap_or_default()).expect("room");
            }
        }
        let (run, done_tx) = Run::new(shared.pool.slots(), shared.pool.free_tx.clone());
        let core = Arc::new(IterCore { run: run.clone(), bytes_rx: Mutex::new(Some(bytes_rx.clone())) });
        let cancel = run.cancel_flag();
        let it = EpochIter {
            shared: shared.clone(),
            state,
            core: core.clone(),
            next_batch: start,
            end,
            epoch,
            clock: ConsumerClock::default(),
            finished: start >= end,
            consumer_telemetry: true,
            failures: 0,
            delivered: 0,
            last_failures: Vec::new(),
            failure_limit: shared.max_failures.limit(shared.sampler.samples_per_rank()),
            trace_wait: None,
            trace_last: None,
        };
        {
            let (sh, cancel, order) = (shared.clone(), cancel.clone(), order.clone());
            run.spawn("stoker-dispatch".into(), move || dispatch(&sh, &cancel, &order, start, end, task_tx))?;
        }
        for k in 0..shared.io_threads {
            let (sh, cancel, rx, tx, brx) =
                (shared.clone(), cancel.clone(), task_rx.clone(), work_tx.clone(), bytes_rx.clone());
            let done = done_tx.clone();
            run.spawn(format!("stoker-io-{k}"), move || io_loop(&sh, &cancel, rx, tx, brx, done))?;
        }
        drop(task_rx);
        drop(work_tx);
        for k in 0..shared.threads {
            let (sh, cancel, rx, btx, done) =
                (shared.clone(), cancel.clone(), work_rx.clone(), bytes_tx.clone(), done_tx.clone());
            run.spawn(format!("stoker-decode-{k}"), move || decode_loop(&sh, k, &cancel, epoch, rx, btx, done))?;
        }
        shared.tuner.consumed(start);
        shared.telemetry.start();
        Ok(it)
    }

    /// The epoch being iterated.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Stops counting this iterator's caller as the consumer: for a stage that forwards the
    /// batches (the GPU transfer) and measures the real consumer itself.
    pub fn forwarding(mut self) -> Self {
        self.consumer_telemetry = false;
        self
    }

    /// Batches left in this pass.
    pub fn remaining(&self) -> usize {
        self.end.saturating_sub(self.next_batch)
    }

    fn shutdown(&mut self) {
        if !self.finished {
            self.core.shutdown(&self.shared);
            self.shared.telemetry.stop();
            self.finished = true;
        }
    }

    /// Traces a delivery: the consumer's wait for it, its step since the previous batch, and
    /// the hand-over itself.
    fn trace_delivered(&mut self, batch: usize, samples: usize) {
        let Some(t) = &self.shared.tracer else { return };
        let now = Instant::now();
        let waited = self.trace_wait.take().unwrap_or(now);
        if let (Some((last, prev)), true) = (self.trace_last.take(), self.consumer_telemetry) {
            t.span("step", "consumer", last, waited, TraceArgs::fields(serde_json::json!({"after_batch": prev})));
        }
        t.span("wait", "consumer", waited, now, TraceArgs::fields(serde_json::json!({"batch": batch})));
        let args = serde_json::json!({"batch": batch, "epoch": self.epoch, "samples": samples});
        t.instant("deliver", "batch", now, TraceArgs::fields(args));
        self.trace_last = Some((now, batch));
    }

    /// At the end of a completed pass: writes the trace file (a failure goes to stderr, the
    /// iteration has ended well).
    fn trace_pass_end(&self) {
        if let Some(t) = &self.shared.tracer {
            if let Some(path) = t.auto_path() {
                if let Err(e) = write_trace(&self.shared, t, path) {
                    eprintln!("stoker: {e}");
                }
            }
        }
    }

    fn wait_for(&mut self, batch: usize, deadline: Option<Instant>) -> Result<Wait<Arc<Slot>>> {
        let pool = &self.shared.pool;
        self.core.run.wait_for(
            batch,
            deadline,
            |slot| slot.batch.load(Ordering::Relaxed),
            || {
                (pool.held() >= pool.slots()).then(|| {
                    Error::Memory(format!(
                        "all {} batch buffers ({} bytes each) are held by the consumer, so no new batch can be made; \
                         release batches (drop tensors) sooner or raise memory_limit/prefetch",
                        pool.slots(),
                        pool.batch_bytes()
                    ))
                })
            },
        )
    }

    /// Like [`Iterator::next`], but gives up after `timeout`: `None` means "not yet" (call
    /// again), `Some(None)` the end of the pass. For callers that must stay responsive, such as
    /// the Python binding checking for Ctrl-C between waits.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Option<Result<Batch>>> {
        self.poll(Some(Instant::now() + timeout))
    }

    fn poll(&mut self, deadline: Option<Instant>) -> Option<Option<Result<Batch>>> {
        let consumer = self.consumer_telemetry.then_some(&self.shared.telemetry.consumer);
        self.clock.waiting(consumer);
        if self.shared.tracer.is_some() {
            self.trace_wait.get_or_insert_with(Instant::now);
        }
        loop {
            if self.finished {
                return Some(None);
            }
            if let Some(e) = self.core.run.stale_error() {
                self.shutdown();
                return Some(Some(Err(e)));
            }
            if self.next_batch >= self.end && self.delivered == 0 && self.failures > 0 {
                // Not an empty epoch: a pass in which every sample failed is an error.
                self.shutdown();
                return Some(Some(Err(Error::Dataset(format!(
                    "every sample of this pass failed ({}); last errors: {}",
                    self.failures,
                    self.last_failures.join("; ")
                )))));
            }
            if self.next_batch >= self.end || self.core.run.cancelled() {
                let completed = self.next_batch >= self.end;
                self.shutdown();
                if completed {
                    self.trace_pass_end();
                }
                return Some(None);
            }
            let slot = match self.wait_for(self.next_batch, deadline) {
                Ok(Wait::Slot(s)) => s,
                Ok(Wait::TimedOut) => return None,
                Ok(Wait::Cancelled) => {
                    self.shutdown();
                    return Some(None);
                }
                Err(e) => {
                    self.shutdown();
                    return Some(Some(Err(e)));
                }
            };
            let first_err = {
                let mut errs = slot.errors.lock().unwrap_or_else(|p| p.into_inner());
                errs.sort_by_key(|(i, _)| *i);
                self.failures += errs.len() as u64;
                for (_, e) in errs.iter().rev().take(3).rev() {
                    if self.last_failures.len() == 3 {
                        self.last_failures.remove(0);
                    }
                    self.last_failures.push(e.to_string());
                }
                if self.shared.on_error == ErrorPolicy::Raise && !errs.is_empty() {
                    Some(errs.swap_remove(0).1)
                } else {
                    None
                }
            };
            if let Some(e) = first_err {
                // The position stays at the failing batch: a saved state resumes there.
                let _ = self.shared.pool.free_tx.send(slot);
                self.shutdown();
                return Some(Some(Err(e)));
            }
            if self.failures > self.failure_limit {
                let _ = self.shared.pool.free_tx.send(slot);
                self.shutdown();
                return Some(Some(Err(Error::Dataset(format!(
                    "{} samples of this epoch failed, more than max_failures ({}): is the storage reachable? \
                     last errors: {}",
                    self.failures,
                    self.failure_limit,
                    self.last_failures.join("; ")
                )))));
            }
            self.next_batch += 1;
            self.state.advance(self.next_batch);
            self.shared.tuner.consumed(self.next_batch);
            let len = slot.len.load(Ordering::Acquire);
            if len == 0 {
                let _ = self.shared.pool.free_tx.send(slot);
                continue;
            }
            let tel = &self.shared.telemetry;
            self.clock.delivered(self.consumer_telemetry.then_some(&tel.consumer));
            tel.add_samples(len);
            self.shared.tuner.on_batch(tel);
            self.delivered += len as u64;
            self.trace_delivered(self.next_batch - 1, len);
            self.shared.pool.held.fetch_add(1, Ordering::AcqRel);
            let plan = &self.shared.plan;
            return Some(Some(Ok(Batch {
                slot: Some(slot),
                free: self.shared.pool.free_tx.clone(),
                held: self.shared.pool.held.clone(),
                sample_shape: plan.sample_shape(),
                dtype: plan.spec().dtype,
                layout: plan.spec().layout,
                epoch: self.epoch,
            })));
        }
    }
}

impl Iterator for EpochIter {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).expect("no deadline, so no time-out")
    }
}

impl Drop for EpochIter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn dispatch(sh: &Shared, cancel: &AtomicBool, order: &[u32], start: usize, end: usize, tasks: Sender<Task>) {
    for b in start..end {
        let t0 = Instant::now();
        if sh.tuner.gate(b, cancel).is_none() {
            return;
        }
        let slot = loop {
            if cancel.load(Ordering::Acquire) {
                return;
            }
            match sh.pool.free_rx.recv_timeout(POLL) {
                Ok(s) => break s,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let t1 = Instant::now();
        sh.telemetry.buffers.add_wait(t1 - t0);
        if let Some(t) = &sh.tracer {
            t.span("wait_buffer", "backpressure", t0, t1, TraceArgs::fields(serde_json::json!({"batch": b})));
        }
        if cancel.load(Ordering::Acquire) {
            let _ = sh.pool.free_tx.send(slot);
            return;
        }
        let idx = sh.sampler.batch(order, b);
        slot.reset(b, idx);
        sh.telemetry.buffers.record(Duration::ZERO);
        for pos in 0..idx.len() {
            if tasks.send(Task { slot: slot.clone(), pos }).is_err() {
                return;
            }
        }
    }
}

/// Marks a task finished; the thread finishing the batch compacts it and hands it on.
fn complete(sh: &Shared, task: Task, label: Option<i64>, done: &Sender<Arc<Slot>>) {
    let Task { slot, pos } = task;
    if slot.finish(pos, label) {
        slot.compact();
        if let Err(e) = done.send(slot) {
            // The consumer is gone: give the buffer straight back to the pool.
            let _ = sh.pool.free_tx.send(e.into_inner());
        }
    }
}

fn fail(sh: &Shared, task: Task, err: Error, done: &Sender<Arc<Slot>>) {
    let index = task.slot.index(task.pos);
    let path = sh.source.describe(index as usize);
    let err = match err {
        Error::Decode { reason, .. } => Error::Decode { path: path.clone(), reason },
        other => other,
    };
    if let Some(t) = &sh.tracer {
        let batch = task.slot.batch.load(Ordering::Relaxed) as u32;
        t.instant("failed", "sample", Instant::now(), TraceArgs::Failure { index, batch, reason: err.reason().into() });
    }
    sh.telemetry.skip(Skipped { index, path: path.display().to_string(), reason: err.reason() });
    task.slot.errors.lock().expect("slot errors lock").push((index, err));
    complete(sh, task, None, done);
}

fn io_loop(
    sh: &Shared,
    cancel: &AtomicBool,
    tasks: Receiver<Task>,
    work: Sender<Work>,
    bytes: Receiver<Vec<u8>>,
    done: Sender<Arc<Slot>>,
) {
    while let Ok(task) = tasks.recv() {
        if cancel.load(Ordering::Acquire) {
            complete(sh, task, None, &done);
            continue;
        }
        let t_wait = Instant::now();
        let Ok(mut buf) = bytes.recv() else {
            complete(sh, task, None, &done);
            continue;
        };
        let t0 = Instant::now();
        sh.telemetry.read.add_wait(t0 - t_wait);
        let hw = sh.read_high_water.load(Ordering::Relaxed);
        if buf.capacity() < hw {
            buf.reserve_exact(hw - buf.len());
        }
        let read = sh.source.read(task.slot.index(task.pos) as usize, &mut buf, sh.max_file_bytes);
        sh.read_high_water.fetch_max(buf.capacity(), Ordering::Relaxed);
        let t1 = Instant::now();
        sh.telemetry.read.record(t1 - t0);
        if let Some(t) = &sh.tracer {
            t.span("read", "sample", t0, t1, sample_args(&task));
        }
        if let Err(e) = work.send(Work { task, bytes: buf, read }) {
            let w = e.into_inner();
            complete(sh, w.task, None, &done);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn decode_loop(
    sh: &Shared,
    k: usize,
    cancel: &AtomicBool,
    epoch: u64,
    work: Receiver<Work>,
    bytes: Sender<Vec<u8>>,
    done: Sender<Arc<Slot>>,
) {
    let stashed = sh.stash.lock().expect("stash lock").workers.pop();
    let made = match stashed {
        Some(w) => Ok(w),
        None => Decoder::new(sh.decode_opts).map(|d| (d, Resampler::new())),
    };
    let (mut decoder, mut resampler) = match made {
        Ok(w) => w,
        Err(e) => {
            // Cannot decode anything: fail every sample that reaches this worker.
            while let Ok(w) = work.recv() {
                let _ = bytes.send(w.bytes);
                fail(sh, w.task, Error::Internal(e.to_string()), &done);
            }
            return;
        }
    };
    loop {
        let t_wait = Instant::now();
        // Autotuned: only the first `threads_active` workers take work. A cancelled pass ends
        // the wait but not the loop: every queued task must still complete (below), or its
        // batch buffer never returns to the pool and the next pass waits for it forever.
        let _ = sh.tuner.wait_turn(k, cancel);
        let Ok(w) = work.recv() else {
            sh.stash.lock().expect("stash lock").workers.push((decoder, resampler));
            return;
        };
        sh.telemetry.decode.add_wait(t_wait.elapsed());
        let Work { task, bytes: buf, read } = w;
        if cancel.load(Ordering::Acquire) {
            let _ = bytes.send(buf);
            complete(sh, task, None, &done);
            continue;
        }
        let result = read.and_then(|_| {
            // A panic while processing one sample is that sample's error; the worker goes on
            // with a fresh decoder and resampler (the old ones may be mid-update).
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                process(sh, &mut decoder, &mut resampler, epoch, &task, &buf)
            }))
            .unwrap_or_else(|p| {
                if let Ok(d) = Decoder::new(sh.decode_opts) {
                    decoder = d;
                }
                resampler = Resampler::new();
                Err(Error::Internal(format!(
                    "panic while processing this sample: {} (please report this)",
                    ordered::panic_message(p.as_ref())
                )))
            })
        });
        let _ = bytes.send(buf);
        match result {
            Ok(label) => complete(sh, task, Some(label), &done),
            Err(e) => fail(sh, task, e, &done),
        }
    }
}

fn process(sh: &Shared, dec: &mut Decoder, rs: &mut Resampler, epoch: u64, task: &Task, data: &[u8]) -> Result<i64> {
    if let Some(cache) = &sh.cache {
        return process_cached(sh, cache, dec, rs, epoch, task, data);
    }
    let t0 = Instant::now();
    let nopath = Path::new("");
    let info = dec.info(data, nopath)?;
    let g = sh.plan.geometry(info.width, info.height, &mut augment_rng(sh, epoch, task));
    let region = dec.decode(data, nopath, &info, g.bbox, (g.dst[2], g.dst[3]))?;
    finish(sh, rs, task, t0, "decode", region.pixels, (region.width, region.height), region.bbox, &g)
}

/// The random stream of one sample's augmentations (seed, epoch, dataset index).
fn augment_rng(sh: &Shared, epoch: u64, task: &Task) -> Rng {
    let index = task.slot.index(task.pos);
    Rng::new(sh.sampler.spec().seed, rng::stream::AUGMENT ^ (epoch << 8), u64::from(index))
}

/// The ops of one sample whose pixels (`size` RGB8) are ready: resamples `bbox` of them as `g`
/// says into the sample's slot, records the decode time (since `t0`; traced as `got`:
/// `decode`, or `cache` for pixels read from the cache) and the ops time, and returns the label.
#[allow(clippy::too_many_arguments)]
fn finish(
    sh: &Shared,
    rs: &mut Resampler,
    task: &Task,
    t0: Instant,
    got: &'static str,
    pixels: &[u8],
    size: (usize, usize),
    bbox: [f64; 4],
    g: &crate::ops::Geometry,
) -> Result<i64> {
    let t1 = Instant::now();
    sh.telemetry.decode.record(t1 - t0);
    let (oh, ow) = sh.plan.output_size();
    let hwc = rs.resample(pixels, size.0, size.1, bbox, g.hard, g.dst, ow, oh)?;
    // SAFETY: this worker owns position `task.pos` of the slot until `complete` is called.
    let out = unsafe { task.slot.sample_mut(task.pos) };
    sh.plan.write(hwc, g.flip, out);
    let t2 = Instant::now();
    sh.telemetry.ops.record(t2 - t1);
    if let Some(t) = &sh.tracer {
        t.span(got, "sample", t0, t1, sample_args(task));
        t.span("ops", "sample", t1, t2, sample_args(task));
    }
    Ok(sh.source.label(task.slot.index(task.pos) as usize))
}

thread_local! {
    /// The rows of a cache entry that the sample in hand needs (one buffer per decode thread,
    /// reused: no allocation per sample once it has grown to the largest crop).
    static CACHE_ROWS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`process`] with a cache: the pixels of the whole image come from the cache entry of the
/// file's bytes, or from a decode of the whole image that is then stored. The ops see the same
/// pixels and the same source box either way, so batches do not depend on what the cache
/// holds. At full resolution they equal those of the uncached path with `dct_scaling` and
/// `roi` off, whose region is the whole image with the box unchanged; a miss that the budget
/// cannot store is decoded around the crop only, which at full resolution gives the same pixels
/// within it. With a `max_side`, the box is drawn on the source image's size (the same crops as
/// without a cache) and scaled to the stored pixels.
fn process_cached(
    sh: &Shared,
    cache: &crate::cache::Cache,
    dec: &mut Decoder,
    rs: &mut Resampler,
    epoch: u64,
    task: &Task,
    data: &[u8],
) -> Result<i64> {
    let t0 = Instant::now();
    let nopath = Path::new("");
    let mut rng = augment_rng(sh, epoch, task);
    let key = crate::cache::Cache::key(data);
    // The source box on the stored pixels: unchanged (exact) at full resolution.
    let scaled = |b: [f64; 4], (w, h): (usize, usize), (sw, sh): (usize, usize)| {
        if (w, h) == (sw, sh) {
            return b;
        }
        let (fx, fy) = (w as f64 / sw as f64, h as f64 / sh as f64);
        [b[0] * fx, b[1] * fy, b[2] * fx, b[3] * fy]
    };
    // The rows of the stored image the resampler reads, `y0..y1`. A crop box (hard) reads
    // nothing outside its integer hull, so at full resolution (integer boxes) a window around it
    // gives exactly the same pixels as the whole image. With a `max_side` (fractional boxes) a
    // window with the filter's reach as margin is used for hits and misses alike, so they agree.
    // Otherwise (a resize window at full resolution), every row.
    let window = |[_, by, _, bh]: [f64; 4], g: &crate::ops::Geometry, height: usize| {
        if !(g.hard || cache.max_side().is_some()) {
            return (0, height);
        }
        let my = crate::ops::resample::filter_margin(bh, g.dst[3].max(1));
        let y0 = ((by - my).floor().max(0.0) as usize).min(height - 1);
        (y0, ((by + bh + my).ceil() as usize).clamp(y0 + 1, height))
    };
    if let Some(e) = cache.get(key, sh.decode_opts.max_pixels, t0.elapsed()) {
        let g = sh.plan.geometry(e.source_width, e.source_height, &mut rng);
        let [bx, by, bw, bh] = scaled(g.bbox, (e.width, e.height), (e.source_width, e.source_height));
        let (y0, y1) = window([bx, by, bw, bh], &g, e.height);
        let read = CACHE_ROWS.with_borrow_mut(|buf| -> Result<i64> {
            let rows = cache
                .read_rows(&e, y0..y1, buf)
                .map_err(|err| Error::Internal(format!("cannot read a checked cache entry: {err}")))?;
            finish(sh, rs, task, t0, "cache", rows, (e.width, y1 - y0), [bx, by - y0 as f64, bw, bh], &g)
        });
        // An entry that cannot be read (truncated since it was checked) is decoded instead.
        if let Ok(label) = read {
            return Ok(label);
        }
        rng = augment_rng(sh, epoch, task);
    }
    let info = dec.info(data, nopath)?;
    let g = sh.plan.geometry(info.width, info.height, &mut rng);
    let source = (info.width, info.height);
    let (tw, th) = cache.stored_size(info.width, info.height);
    if cache.max_side().is_none() && !cache.may_store(key, tw.saturating_mul(th).saturating_mul(3)) {
        // Full resolution and no room left: decode as the uncached path does with
        // `dct_scaling` off.
        let region = dec.decode(data, nopath, &info, g.bbox, (g.dst[2], g.dst[3]))?;
        return finish(sh, rs, task, t0, "decode", region.pixels, (region.width, region.height), region.bbox, &g);
    }
    let whole = [0.0, 0.0, info.width as f64, info.height as f64];
    let td = Instant::now();
    // At full resolution, the whole image; with a `max_side`, the smallest DCT scale that
    // still covers the stored size, then resampled to it.
    let region = dec.decode(data, nopath, &info, whole, (tw, th))?;
    let reduced;
    let pixels = if (region.width, region.height) == (tw, th) {
        region.pixels
    } else if (tw, th) == source {
        return Err(Error::Internal("a full decode returned a part of the image".into()));
    } else {
        let whole = [0.0, 0.0, region.width as f64, region.height as f64];
        reduced =
            rs.resample(region.pixels, region.width, region.height, whole, false, [0, 0, tw, th], tw, th)?.to_vec();
        &reduced[..]
    };
    cache.put(key, pixels, tw, th, source, td.elapsed());
    let [bx, by, bw, bh] = scaled(g.bbox, (tw, th), source);
    let (y0, y1) = window([bx, by, bw, bh], &g, th);
    let rows = &pixels[y0 * tw * 3..y1 * tw * 3];
    finish(sh, rs, task, t0, "decode", rows, (tw, y1 - y0), [bx, by - y0 as f64, bw, bh], &g)
}

/// A finished batch: a view of one pool buffer. The buffer returns to the pool on drop.
pub struct Batch {
    slot: Option<Arc<Slot>>,
    free: Sender<Arc<Slot>>,
    held: Arc<std::sync::atomic::AtomicUsize>,
    sample_shape: [usize; 3],
    dtype: DType,
    layout: Layout,
    epoch: u64,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("index", &self.index())
            .field("shape", &self.shape())
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl Batch {
    fn slot(&self) -> &Slot {
        self.slot.as_ref().expect("live batch has a slot")
    }

    /// Samples in this batch (shorter than the batch size when samples were skipped, or at
    /// the end of an epoch without `drop_last`).
    pub fn len(&self) -> usize {
        self.slot().len.load(Ordering::Acquire)
    }

    /// Whether the batch is empty (never, for delivered batches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch number within the epoch.
    pub fn index(&self) -> usize {
        self.slot().batch.load(Ordering::Relaxed)
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Shape `[N, C, H, W]` or `[N, H, W, C]`.
    pub fn shape(&self) -> [usize; 4] {
        let s = self.sample_shape;
        [self.len(), s[0], s[1], s[2]]
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The batch's bytes (native-endian elements of [`Batch::dtype`]).
    pub fn data(&self) -> &[u8] {
        self.slot().data()
    }

    /// Address of the first byte (stable while the batch lives; for zero-copy hand-off).
    pub fn data_ptr(&self) -> *const u8 {
        self.slot().data.as_ptr()
    }

    /// Address of the labels (stable while the batch lives; for zero-copy hand-off).
    pub fn labels_ptr(&self) -> *const i64 {
        self.slot().labels().as_ptr()
    }

    /// The labels, one per sample.
    pub fn labels(&self) -> &[i64] {
        self.slot().labels()
    }

    /// The dataset indices of the samples, in batch order.
    pub fn indices(&self) -> Vec<u32> {
        self.slot().indices().collect()
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.held.fetch_sub(1, Ordering::AcqRel);
            let _ = self.free.send(slot);
        }
    }
}
