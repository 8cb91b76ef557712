//! Cheap always-on counters per stage, and the verdict a user needs: which stage starves the
//! consumer, and what to change.
//!
//! Each stage counts items, busy time (doing its work) and wait time (blocked on its input or
//! output). The consumer counts the time it waited inside `next()`: the *starvation* fraction,
//! the single most important number for a training job.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Counters of one stage.
#[derive(Debug, Default)]
pub struct StageCounters {
    items: AtomicU64,
    busy_ns: AtomicU64,
    wait_ns: AtomicU64,
}

impl StageCounters {
    /// Adds one item that took `busy`.
    #[inline]
    pub fn record(&self, busy: Duration) {
        self.items.fetch_add(1, Ordering::Relaxed);
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds busy time without an item.
    #[inline]
    pub fn add_busy(&self, busy: Duration) {
        self.busy_ns.fetch_add(busy.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds waiting time.
    #[inline]
    pub fn add_wait(&self, wait: Duration) {
        self.wait_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Total busy nanoseconds so far.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns.load(Ordering::Relaxed)
    }

    /// Total waiting nanoseconds so far.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns.load(Ordering::Relaxed)
    }

    fn snapshot(&self, name: &str, threads: usize, wall: f64) -> StageReport {
        let busy = self.busy_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        StageReport {
            name: name.to_string(),
            threads,
            items: self.items.load(Ordering::Relaxed),
            busy_seconds: busy,
            wait_seconds: self.wait_ns.load(Ordering::Relaxed) as f64 * 1e-9,
            utilization: if wall > 0.0 && threads > 0 { busy / (wall * threads as f64) } else { 0.0 },
        }
    }

    fn reset(&self) {
        self.items.store(0, Ordering::Relaxed);
        self.busy_ns.store(0, Ordering::Relaxed);
        self.wait_ns.store(0, Ordering::Relaxed);
    }
}

/// Measures the consumer of an iterator: the time between batches is its busy time, the time
/// inside `next()` until a batch arrives is its wait (starvation). One per iteration; `None`
/// counters measure nothing (an iterator whose caller only forwards batches).
#[derive(Debug, Default)]
pub struct ConsumerClock {
    last_return: Option<Instant>,
    wait_started: Option<Instant>,
}

impl ConsumerClock {
    /// At the start of every `next()` call: the first call of a wait counts the time since the
    /// last batch as busy time.
    pub fn waiting(&mut self, counters: Option<&StageCounters>) {
        let t0 = *self.wait_started.get_or_insert_with(Instant::now);
        if let (Some(last), Some(c)) = (self.last_return.take(), counters) {
            c.add_busy(t0 - last);
        }
    }

    /// When a batch is handed over: counts the wait since the first `waiting` call.
    pub fn delivered(&mut self, counters: Option<&StageCounters>) {
        let now = Instant::now();
        if let (Some(t0), Some(c)) = (self.wait_started.take(), counters) {
            c.add_wait(now - t0);
            c.record(Duration::ZERO);
        }
        self.last_return = Some(now);
    }
}

/// A sample that was skipped, with its path and reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// Dataset index.
    pub index: u32,
    /// The file.
    pub path: String,
    /// Why it was skipped.
    pub reason: String,
}

/// All counters of a loader.
#[derive(Debug)]
pub struct Telemetry {
    /// Reading bytes from storage.
    pub read: StageCounters,
    /// Decoding (header, entropy decode, IDCT, colour conversion).
    pub decode: StageCounters,
    /// Resampling and writing the slot (flip, normalise, dtype, layout).
    pub ops: StageCounters,
    /// The scheduler waiting for a free batch buffer (backpressure).
    pub buffers: StageCounters,
    /// The consumer: busy = time between batches, wait = time blocked in `next()`.
    pub consumer: StageCounters,
    /// Host-to-device copies (GPU batches only): items = batches, busy = GPU time of the
    /// copies (measured with CUDA events), wait = time waiting for a free device buffer.
    pub transfer: StageCounters,
    transfer_bytes: AtomicU64,
    device: Mutex<DeviceReport>,
    samples: AtomicU64,
    skipped: Mutex<Vec<Skipped>>,
    skipped_total: AtomicU64,
    decode_warnings: AtomicU64,
    restart_decodes: AtomicU64,
    started: Mutex<Option<Instant>>,
    wall_ns: AtomicU64,
}

/// Cap on the skip list kept in memory (the count is always exact).
pub const MAX_SKIPPED_LISTED: usize = 10_000;

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            read: StageCounters::default(),
            decode: StageCounters::default(),
            ops: StageCounters::default(),
            buffers: StageCounters::default(),
            consumer: StageCounters::default(),
            transfer: StageCounters::default(),
            transfer_bytes: AtomicU64::new(0),
            device: Mutex::new(DeviceReport::default()),
            samples: AtomicU64::new(0),
            skipped: Mutex::new(Vec::new()),
            skipped_total: AtomicU64::new(0),
            decode_warnings: AtomicU64::new(0),
            restart_decodes: AtomicU64::new(0),
            started: Mutex::new(None),
            wall_ns: AtomicU64::new(0),
        }
    }
}

/// One stage in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageReport {
    /// Stage name.
    pub name: String,
    /// Threads working in it.
    pub threads: usize,
    /// Items processed.
    pub items: u64,
    /// Total busy seconds (summed over threads).
    pub busy_seconds: f64,
    /// Total waiting seconds (summed over threads).
    pub wait_seconds: f64,
    /// busy / (wall * threads).
    pub utilization: f64,
}

/// The bottleneck verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Bottleneck {
    /// `consumer`, `decode`, `ops`, `storage` or `buffers`.
    pub stage: String,
    /// What the numbers say.
    pub reason: String,
    /// What to change.
    pub suggestion: String,
}

/// Where batches are delivered, as asked and as done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    /// The device asked for (`cpu`, `cuda`, `cuda:N`, `auto`).
    pub requested: String,
    /// The device batches are delivered on (`cpu` or `cuda:N`).
    pub used: String,
    /// Why `used` differs from what a reader would expect (e.g. `auto` found no GPU).
    pub note: Option<String>,
}

impl Default for DeviceReport {
    fn default() -> Self {
        DeviceReport { requested: "cpu".into(), used: "cpu".into(), note: None }
    }
}

/// Host-to-device copy totals (GPU batches only).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferReport {
    /// Batches copied.
    pub batches: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// GPU time of the copies (CUDA events), seconds.
    pub copy_seconds: f64,
    /// `bytes / copy_seconds`, GB/s (10^9 bytes).
    pub gbps: f64,
}

/// A telemetry snapshot.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Seconds the consumer spent iterating (busy + waiting).
    pub wall_seconds: f64,
    /// Samples delivered.
    pub samples: u64,
    /// Per-stage counters.
    pub stages: Vec<StageReport>,
    /// Fraction of the consumer's time spent waiting for data.
    pub starvation: f64,
    /// Which stage limits throughput, and what to do.
    pub bottleneck: Bottleneck,
    /// Number of skipped samples.
    pub skipped_count: u64,
    /// The skipped samples (at most [`MAX_SKIPPED_LISTED`]).
    pub skipped: Vec<Skipped>,
    /// Images decoded and delivered despite a libjpeg warning (corrupt data that libjpeg
    /// recovered from, in the header or the scan data: Pillow and torchvision load them too).
    pub decode_warnings: u64,
    /// JPEGs whose crop was decoded from the restart intervals it touches alone (files packed
    /// with `stoker pack --random-access`, or with tiling restart markers from their source).
    pub restart_decodes: u64,
    /// Where batches go.
    pub device: DeviceReport,
    /// Host-to-device copies, when batches go to a GPU.
    pub transfer: Option<TransferReport>,
    /// The decoded-pixel cache's counters, when the loader has one.
    pub cache: Option<crate::image::cache::CacheReport>,
    /// Threads, prefetch and the host-wide CPU share: as set or as tuned (image loaders).
    pub tuning: Option<TuningReport>,
}

impl Telemetry {
    /// Marks the start of consumption (idempotent until reset).
    pub fn start(&self) {
        let mut s = self.started.lock().expect("telemetry lock");
        if s.is_none() {
            *s = Some(Instant::now());
        }
    }

    /// Marks the end of a consumption period (accumulates wall time).
    pub fn stop(&self) {
        if let Some(t) = self.started.lock().expect("telemetry lock").take() {
            self.wall_ns.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// Records where batches are delivered (shown in every report).
    pub fn set_device(&self, device: DeviceReport) {
        *self.device.lock().expect("telemetry lock") = device;
    }

    /// Counts one host-to-device copy of `bytes` that took `gpu_time` on the copy engine.
    pub fn add_transfer(&self, bytes: usize, gpu_time: Duration) {
        self.transfer.record(gpu_time);
        self.transfer_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts delivered samples.
    pub fn add_samples(&self, n: usize) {
        self.samples.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a skipped sample.
    pub fn skip(&self, s: Skipped) {
        self.skipped_total.fetch_add(1, Ordering::Relaxed);
        let mut l = self.skipped.lock().expect("telemetry lock");
        if l.len() < MAX_SKIPPED_LISTED {
            l.push(s);
        }
    }

    /// Counts `n` images decoded despite a libjpeg warning (see [`Report::decode_warnings`]).
    pub fn add_decode_warnings(&self, n: u64) {
        if n > 0 {
            self.decode_warnings.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts `n` JPEGs decoded from their restart intervals alone (see
    /// [`Report::restart_decodes`]).
    pub fn add_restart_decodes(&self, n: u64) {
        if n > 0 {
            self.restart_decodes.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Zeroes every counter.
    pub fn reset(&self) {
        for s in [&self.read, &self.decode, &self.ops, &self.buffers, &self.consumer, &self.transfer] {
            s.reset();
        }
        self.transfer_bytes.store(0, Ordering::Relaxed);
        self.samples.store(0, Ordering::Relaxed);
        self.skipped.lock().expect("telemetry lock").clear();
        self.skipped_total.store(0, Ordering::Relaxed);
        self.decode_warnings.store(0, Ordering::Relaxed);
        self.restart_decodes.store(0, Ordering::Relaxed);
        *self.started.lock().expect("telemetry lock") = None;
        self.wall_ns.store(0, Ordering::Relaxed);
    }

    /// A snapshot with the bottleneck verdict; `threads`/`io_threads` size the pools.
    pub fn report(&self, threads: usize, io_threads: usize, allowance: usize) -> Report {
        let mut wall = self.wall_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        if let Some(t) = *self.started.lock().expect("telemetry lock") {
            wall += t.elapsed().as_secs_f64();
        }
        let mut stages = vec![
            self.read.snapshot("read", io_threads, wall),
            self.decode.snapshot("decode", threads, wall),
            self.ops.snapshot("ops", threads, wall),
            self.buffers.snapshot("buffer wait", 1, wall),
            self.consumer.snapshot("consumer", 1, wall),
        ];
        let device = self.device.lock().expect("telemetry lock").clone();
        let transfer = if device.used.starts_with("cuda") {
            let st = self.transfer.snapshot("transfer", 1, wall);
            let bytes = self.transfer_bytes.load(Ordering::Relaxed);
            let gbps = if st.busy_seconds > 0.0 { bytes as f64 / st.busy_seconds * 1e-9 } else { 0.0 };
            let t = TransferReport { batches: st.items, bytes, copy_seconds: st.busy_seconds, gbps };
            stages.push(st);
            Some(t)
        } else {
            None
        };
        let c = &stages[4];
        let starvation = if c.busy_seconds + c.wait_seconds > 0.0 {
            c.wait_seconds / (c.busy_seconds + c.wait_seconds)
        } else {
            0.0
        };
        let bottleneck = verdict(&stages, starvation, threads, allowance);
        Report {
            wall_seconds: wall,
            samples: self.samples.load(Ordering::Relaxed),
            stages,
            starvation,
            bottleneck,
            skipped_count: self.skipped_total.load(Ordering::Relaxed),
            skipped: self.skipped.lock().expect("telemetry lock").clone(),
            decode_warnings: self.decode_warnings.load(Ordering::Relaxed),
            restart_decodes: self.restart_decodes.load(Ordering::Relaxed),
            device,
            transfer,
            cache: None,
            tuning: None,
        }
    }
}

fn verdict(stages: &[StageReport], starvation: f64, threads: usize, allowance: usize) -> Bottleneck {
    let (read, decode, ops, buffers) = (&stages[0], &stages[1], &stages[2], &stages[3]);
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    if starvation < 0.05 {
        return Bottleneck {
            stage: "consumer".into(),
            reason: format!("the consumer waited {} of its time for data", pct(starvation)),
            suggestion: "none: stoker keeps up, the training step (GPU) is the limit".into(),
        };
    }
    let worker_util = decode.utilization + ops.utilization;
    if let Some(t) = stages.get(5).filter(|t| t.utilization > 0.7) {
        return Bottleneck {
            stage: "transfer".into(),
            reason: format!(
                "bus-bound: host-to-device copies keep the bus {} busy while decode threads are {} busy",
                pct(t.utilization),
                pct(worker_util)
            ),
            suggestion: "send uint8 over the bus (dtype uint8 or a GPU-normalised preset), smaller crops, \
                         or check the PCIe link with `stoker doctor`"
                .into(),
        };
    }
    if read.utilization > 0.7 && worker_util < 0.7 {
        return Bottleneck {
            stage: "storage".into(),
            reason: format!(
                "reads keep {} I/O threads {} busy while decode threads are only {} busy",
                read.threads,
                pct(read.utilization),
                pct(worker_util)
            ),
            suggestion: "raise io_threads, use faster storage, or pack small files into shards".into(),
        };
    }
    if worker_util < 0.5 && buffers.wait_seconds > 0.25 * decode.busy_seconds.max(1e-9) {
        return Bottleneck {
            stage: "buffers".into(),
            reason: "the scheduler often waits for a free batch buffer while workers idle".into(),
            suggestion: "raise prefetch or memory_limit, or release batches sooner".into(),
        };
    }
    let more = if threads < allowance {
        format!("raise threads (now {threads}, allowance {allowance})")
    } else {
        format!("all {threads} allowed CPUs are used: give the job more CPUs")
    };
    if decode.busy_seconds >= ops.busy_seconds {
        Bottleneck {
            stage: "decode".into(),
            reason: format!(
                "decode-bound: decode takes {} of worker time, threads are {} busy",
                pct(decode.busy_seconds / (decode.busy_seconds + ops.busy_seconds).max(1e-9)),
                pct(worker_util)
            ),
            suggestion: format!(
                "{more}, or pre-resized shards (`stoker pack --max-side 512`: smaller JPEGs decode faster)"
            ),
        }
    } else {
        Bottleneck {
            stage: "ops".into(),
            reason: format!(
                "ops-bound: resize/normalise take {} of worker time, threads are {} busy",
                pct(ops.busy_seconds / (decode.busy_seconds + ops.busy_seconds).max(1e-9)),
                pct(worker_util)
            ),
            suggestion: format!("{more}, output uint8 and normalise on the GPU, or pre-resize images"),
        }
    }
}

impl Report {
    /// A short human summary with the stage table and the verdict.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "{} samples in {:.2} s ({:.1} samples/s); consumer starvation {:.1}%\n",
            self.samples,
            self.wall_seconds,
            if self.wall_seconds > 0.0 { self.samples as f64 / self.wall_seconds } else { 0.0 },
            self.starvation * 100.0
        ));
        s.push_str(&format!(
            "{:<12} {:>7} {:>10} {:>10} {:>10} {:>6}\n",
            "stage", "threads", "items", "busy s", "wait s", "util"
        ));
        for st in &self.stages {
            s.push_str(&format!(
                "{:<12} {:>7} {:>10} {:>10.2} {:>10.2} {:>5.0}%\n",
                st.name,
                st.threads,
                st.items,
                st.busy_seconds,
                st.wait_seconds,
                st.utilization * 100.0
            ));
        }
        if let Some(t) = &self.transfer {
            s.push_str(&format!(
                "transfer to {}: {} batches, {:.1} MiB, {:.3} s of copies ({:.1} GB/s)\n",
                self.device.used,
                t.batches,
                t.bytes as f64 / (1 << 20) as f64,
                t.copy_seconds,
                t.gbps
            ));
        }
        if let Some(c) = &self.cache {
            let mib = |b: u64| b as f64 / (1 << 20) as f64;
            s.push_str(&format!(
                "cache {}: {} hits, {} misses; stored {} ({:.1} MiB, {} over budget), read {:.1} MiB; \
                 used {:.1} of {:.1} MiB; decode time saved {:.2} s (lookups {:.2} s, fills {:.2} s)\n",
                c.dir,
                c.hits,
                c.misses,
                c.stored,
                mib(c.stored_bytes),
                c.not_stored_budget,
                mib(c.read_bytes),
                mib(c.used_bytes),
                mib(c.budget_bytes),
                c.decode_seconds_saved,
                c.lookup_seconds,
                c.fill_seconds
            ));
            if c.held_by_others_bytes > 0 && c.not_stored_budget > 0 {
                s.push_str(&format!(
                    "  cache budget: {:.1} MiB of it held by other datasets in use under {} (not evictable while \
                     they run); {} misses not stored. `stoker cache --dir {}` lists them\n",
                    mib(c.held_by_others_bytes),
                    c.root,
                    c.not_stored_budget,
                    c.root
                ));
            }
            if c.evicted_groups > 0 {
                s.push_str(&format!(
                    "  cache: {} idle group(s) of other datasets removed ({:.1} MiB) to make room or past their \
                     time to live\n",
                    c.evicted_groups,
                    mib(c.evicted_bytes)
                ));
            }
            if c.verify_failures > 0 || c.lock_timeouts > 0 {
                s.push_str(&format!(
                    "  cache: {} entries failed their pixel checksums (decoded and rewritten); {} lock waits timed \
                     out (entries not stored)\n",
                    c.verify_failures, c.lock_timeouts
                ));
            }
        }
        if let Some(t) = &self.tuning {
            s.push_str(&tuning_text(t));
        }
        if let Some(n) = &self.device.note {
            s.push_str(&format!("device: {} (asked {}): {n}\n", self.device.used, self.device.requested));
        }
        s.push_str(&format!(
            "bottleneck: {} ({})\n  -> {}\n",
            self.bottleneck.stage, self.bottleneck.reason, self.bottleneck.suggestion
        ));
        if self.decode_warnings > 0 {
            s.push_str(&format!(
                "decoded {} image(s) despite libjpeg warnings (corrupt data libjpeg recovered from)\n",
                self.decode_warnings
            ));
        }
        if self.skipped_count > 0 {
            s.push_str(&format!("skipped {} bad sample(s):\n", self.skipped_count));
            for k in self.skipped.iter().take(20) {
                s.push_str(&format!("  {}: {}\n", k.path, k.reason));
            }
            if self.skipped_count > 20 {
                s.push_str(&format!("  ... and {} more\n", self.skipped_count - 20));
            }
        }
        s
    }
}

/// One change the tuner made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Decision {
    /// Batches delivered when it was made.
    pub batch: u64,
    /// `threads`, `prefetch` or `share`.
    pub knob: String,
    /// The value before.
    pub from: usize,
    /// The value after.
    pub to: usize,
    /// Why.
    pub reason: String,
}

/// The tuning state in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TuningReport {
    /// Whether threads are autotuned.
    pub threads_auto: bool,
    /// Decode workers allowed to take work now.
    pub threads_active: usize,
    /// Decode workers started.
    pub threads_max: usize,
    /// Whether prefetch is autotuned.
    pub prefetch_auto: bool,
    /// Batches allowed ahead of the consumer now.
    pub prefetch_active: usize,
    /// The most batches the pool allows ahead.
    pub prefetch_max: usize,
    /// The CPU budget, cores.
    pub cpu_budget: f64,
    /// Whether this loader takes part in the host-wide registry.
    pub shared: bool,
    /// The registry file.
    pub registry: Option<String>,
    /// Cores of the host this loader may use (its share), when shared.
    pub share: Option<usize>,
    /// The host's cores, when shared.
    pub host_cores: Option<usize>,
    /// Processes in the registry (this one included), when shared.
    pub processes_sharing: Option<usize>,
    /// The smallest share this loader has had, when shared.
    pub share_min: Option<usize>,
    /// The most processes that shared the host with it at once, when shared.
    pub processes_sharing_max: Option<usize>,
    /// Whether the first epoch's tuning is over (the setting holds).
    pub converged: bool,
    /// Why sharing is off, if it is.
    pub note: Option<String>,
    /// Sharing was skipped because another process held the registry's lock past
    /// [`crate::observe::budget::LOCK_WAIT`] when this loader started (`note` says more).
    pub registry_busy: bool,
    /// Re-reads of the share that found the registry's lock held by another process and kept
    /// the last share.
    pub registry_busy_refreshes: u64,
    /// The tuner's changes, oldest first (at most 64).
    pub decisions: Vec<Decision>,
}

/// The tuning lines of [`Report::to_text`].
fn tuning_text(t: &TuningReport) -> String {
    let mode = |auto: bool| if auto { "auto" } else { "fixed" };
    let mut s = format!(
        "threads {} ({}, {} started, cpu_budget {}); prefetch {} ({}, up to {})",
        t.threads_active,
        mode(t.threads_auto),
        t.threads_max,
        t.cpu_budget,
        t.prefetch_active,
        mode(t.prefetch_auto),
        t.prefetch_max
    );
    if t.threads_auto || t.prefetch_auto {
        s.push_str(if t.converged { ", tuned" } else { ", tuning" });
    }
    s.push('\n');
    match (t.share, t.host_cores, t.processes_sharing) {
        (Some(share), Some(cores), Some(p)) => s.push_str(&format!(
            "cpu share: {share} of {cores} host cores, {p} process(es) sharing (at least {} core(s), at most {} \
             process(es) so far; {})\n",
            t.share_min.unwrap_or(share),
            t.processes_sharing_max.unwrap_or(p),
            t.registry.as_deref().unwrap_or("")
        )),
        _ => {
            if let Some(n) = &t.note {
                s.push_str(&format!("cpu share: not shared: {n}\n"));
            }
        }
    }
    for d in &t.decisions {
        s.push_str(&format!("  tune @batch {}: {} {} -> {} ({})\n", d.batch, d.knob, d.from, d.to, d.reason));
    }
    s
}
