//! Cheap always-on counters: [`StageCounters`] for any stage (a kind keeps its own stages'
//! counters beside its work), and [`Telemetry`], the shell's counters every loader has (buffer
//! wait, consumer, transfer, samples, skipped samples, device, the wall clock and the process's
//! CPU clock over its passes, its workers' CPU time), from which a [`Report`] is made.
//!
//! Each stage counts items, busy time (doing its work) and wait time (blocked on its input or
//! output). The consumer counts the time it waited inside `next()`: the *starvation* fraction,
//! the single most important number for a training job.

use super::report::{CpuReport, DeviceReport, Report, Skipped, StageReport, TransferReport};
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

    /// Adds one item that waited `wait` (a thread that waited for a free batch buffer).
    #[inline]
    pub fn record_wait(&self, wait: Duration) {
        self.items.fetch_add(1, Ordering::Relaxed);
        self.add_wait(wait);
    }

    /// Adds waiting time.
    #[inline]
    pub fn add_wait(&self, wait: Duration) {
        self.wait_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Items so far.
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }

    /// Total busy nanoseconds so far.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns.load(Ordering::Relaxed)
    }

    /// Total waiting nanoseconds so far.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns.load(Ordering::Relaxed)
    }

    /// The stage `name` in a report over `wall` seconds, with `threads` working in it.
    pub fn snapshot(&self, name: &str, threads: usize, wall: f64) -> StageReport {
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

    /// Zeroes the counters.
    pub fn reset(&self) {
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

    /// When a batch is handed over: counts the wait since the first `waiting` call, and
    /// returns it.
    pub fn delivered(&mut self, counters: Option<&StageCounters>) -> Duration {
        let now = Instant::now();
        let mut waited = Duration::ZERO;
        if let (Some(t0), Some(c)) = (self.wait_started.take(), counters) {
            waited = now - t0;
            c.add_wait(waited);
            c.record(Duration::ZERO);
        }
        self.last_return = Some(now);
        waited
    }
}

/// The shell's counters of a loader: what every kind has.
#[derive(Debug)]
pub struct Telemetry {
    /// The producer waiting for a free batch buffer (backpressure).
    pub buffers: StageCounters,
    /// The consumer: busy = time between batches, wait = time blocked in `next()`.
    pub consumer: StageCounters,
    /// Host-to-device copies (GPU batches only): items = batches, busy = GPU time of the
    /// copies (measured with CUDA events), wait = time waiting for a free device buffer.
    pub transfer: StageCounters,
    /// The consumer's waits for each pass's first batch (the pipeline's fill), nanoseconds:
    /// part of its wait, left out of the steady-state starvation.
    fill_ns: AtomicU64,
    transfer_bytes: AtomicU64,
    device: Mutex<DeviceReport>,
    samples: AtomicU64,
    skipped: Mutex<Vec<Skipped>>,
    skipped_total: AtomicU64,
    /// The running pass's start: wall clock, the process's CPU clock and the host's.
    started: Mutex<Option<Start>>,
    wall_ns: AtomicU64,
    /// The host's busy and total CPU ticks over the passes.
    host: Mutex<(u64, u64)>,
    cpu_ns: AtomicU64,
    workers_cpu_ns: AtomicU64,
    allowance: std::sync::OnceLock<usize>,
}

/// The clocks at the start of a pass.
#[derive(Debug, Clone, Copy)]
struct Start {
    wall: Instant,
    cpu: Duration,
    host: Option<(u64, u64)>,
}

impl Start {
    fn now() -> Self {
        Start { wall: Instant::now(), cpu: super::cpu::process_cpu(), host: super::cpu::host_cpu() }
    }

    /// Wall seconds, process CPU seconds and the host's (busy, total) ticks since the start.
    fn since(&self) -> (f64, f64, (u64, u64)) {
        let host = match (self.host, super::cpu::host_cpu()) {
            (Some((b0, t0)), Some((b1, t1))) => (b1.saturating_sub(b0), t1.saturating_sub(t0)),
            _ => (0, 0),
        };
        let cpu = super::cpu::process_cpu().saturating_sub(self.cpu);
        (self.wall.elapsed().as_secs_f64(), cpu.as_secs_f64(), host)
    }
}

/// Cap on the skip list kept in memory (the count is always exact).
pub const MAX_SKIPPED_LISTED: usize = 10_000;

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            buffers: StageCounters::default(),
            consumer: StageCounters::default(),
            transfer: StageCounters::default(),
            fill_ns: AtomicU64::new(0),
            transfer_bytes: AtomicU64::new(0),
            device: Mutex::new(DeviceReport::default()),
            samples: AtomicU64::new(0),
            skipped: Mutex::new(Vec::new()),
            skipped_total: AtomicU64::new(0),
            started: Mutex::new(None),
            wall_ns: AtomicU64::new(0),
            host: Mutex::new((0, 0)),
            cpu_ns: AtomicU64::new(0),
            workers_cpu_ns: AtomicU64::new(0),
            allowance: std::sync::OnceLock::new(),
        }
    }
}

impl Telemetry {
    /// Marks the start of a pass (idempotent until [`Telemetry::stop`]).
    pub fn start(&self) {
        let mut s = self.started.lock().expect("telemetry lock");
        if s.is_none() {
            *s = Some(Start::now());
        }
    }

    /// Marks the end of a pass (accumulates wall time, the process's CPU time and the host's).
    pub fn stop(&self) {
        if let Some(start) = self.started.lock().expect("telemetry lock").take() {
            let (wall, cpu, (busy, total)) = start.since();
            self.wall_ns.fetch_add((wall * 1e9) as u64, Ordering::Relaxed);
            self.cpu_ns.fetch_add((cpu * 1e9) as u64, Ordering::Relaxed);
            let mut h = self.host.lock().expect("telemetry lock");
            *h = (h.0 + busy, h.1 + total);
        }
    }

    /// Seconds the passes ran so far (the one running included).
    pub fn wall_seconds(&self) -> f64 {
        let wall = self.wall_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        wall + self.started.lock().expect("telemetry lock").map_or(0.0, |s| s.wall.elapsed().as_secs_f64())
    }

    /// Wall seconds, the process's CPU seconds and the host's (busy, total) CPU ticks over the
    /// passes so far (the one running included).
    fn clocks(&self) -> (f64, f64, (u64, u64)) {
        let mut wall = self.wall_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        let mut cpu = self.cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        let mut host = *self.host.lock().expect("telemetry lock");
        if let Some(start) = *self.started.lock().expect("telemetry lock") {
            let (w, c, (b, t)) = start.since();
            (wall, cpu, host) = (wall + w, cpu + c, (host.0 + b, host.1 + t));
        }
        (wall, cpu, host)
    }

    /// Adds CPU time a worker thread used (its [`super::cpu::ThreadCpu`] laps): the threads
    /// that do the kind's per-sample work, whose busy share the verdict weighs.
    #[inline]
    pub fn add_workers_cpu(&self, cpu: Duration) {
        self.workers_cpu_ns.fetch_add(cpu.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Records where batches are delivered (shown in every report).
    pub fn set_device(&self, device: DeviceReport) {
        *self.device.lock().expect("telemetry lock") = device;
    }

    /// Counts the consumer's wait for a pass's first batch (also counted as its wait).
    pub fn add_fill(&self, wait: Duration) {
        self.fill_ns.fetch_add(wait.as_nanos() as u64, Ordering::Relaxed);
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

    /// Zeroes every counter; a pass still running is measured from now on.
    pub fn reset(&self) {
        for s in [&self.buffers, &self.consumer, &self.transfer] {
            s.reset();
        }
        self.transfer_bytes.store(0, Ordering::Relaxed);
        self.fill_ns.store(0, Ordering::Relaxed);
        self.samples.store(0, Ordering::Relaxed);
        self.skipped.lock().expect("telemetry lock").clear();
        self.skipped_total.store(0, Ordering::Relaxed);
        // A pass still running is measured from now on (a report reset after a warm-up
        // measures the steady state that follows it).
        let mut started = self.started.lock().expect("telemetry lock");
        if started.is_some() {
            *started = Some(Start::now());
        }
        self.wall_ns.store(0, Ordering::Relaxed);
        *self.host.lock().expect("telemetry lock") = (0, 0);
        self.cpu_ns.store(0, Ordering::Relaxed);
        self.workers_cpu_ns.store(0, Ordering::Relaxed);
    }

    /// The CPU clocks over the passes' `wall` seconds, with `threads` workers at work now.
    fn cpu(&self, wall: f64, process: f64, (busy, total): (u64, u64), threads: usize) -> CpuReport {
        let allowance = *self.allowance.get_or_init(|| super::cpu::allowance().effective);
        let workers = self.workers_cpu_ns.load(Ordering::Relaxed) as f64 * 1e-9;
        let per = |x: f64| if wall > 0.0 { x / wall } else { 0.0 };
        let mut c = CpuReport {
            process_seconds: process,
            process_cores: per(process),
            workers_seconds: workers,
            workers_busy: 0.0,
            threads,
            allowance,
            host_busy: (total > 0).then(|| busy as f64 / total as f64),
        };
        c.workers_busy = per(workers) / c.usable_cores() as f64;
        c
    }

    /// A report: the kind's stages (`stages` makes them over the wall seconds it is given),
    /// then the shell's (`buffer wait`, `consumer`, and `transfer` when batches go to a GPU),
    /// the consumer's starvation, the CPU clocks (with `threads` workers at work now), skipped
    /// samples, device and transfer, and the kind's `section`. The kind adds its verdict and
    /// its tuning.
    pub fn report<S>(&self, stages: impl FnOnce(f64) -> Vec<StageReport>, threads: usize, section: S) -> Report<S> {
        let (wall, process, host) = self.clocks();
        let mut stages = stages(wall);
        let consumer = self.consumer.snapshot("consumer", 1, wall);
        let spent = consumer.busy_seconds + consumer.wait_seconds;
        let starvation = if spent > 0.0 { consumer.wait_seconds / spent } else { 0.0 };
        let fill = (self.fill_ns.load(Ordering::Relaxed) as f64 * 1e-9).min(consumer.wait_seconds);
        let steady = if spent - fill > 0.0 { (consumer.wait_seconds - fill) / (spent - fill) } else { 0.0 };
        stages.push(self.buffers.snapshot("buffer wait", 1, wall));
        stages.push(consumer);
        let device = self.device.lock().expect("telemetry lock").clone();
        let transfer = device.used.starts_with("cuda").then(|| {
            let st = self.transfer.snapshot("transfer", 1, wall);
            let bytes = self.transfer_bytes.load(Ordering::Relaxed);
            let gbps = if st.busy_seconds > 0.0 { bytes as f64 / st.busy_seconds * 1e-9 } else { 0.0 };
            let t = TransferReport { batches: st.items, bytes, copy_seconds: st.busy_seconds, gbps };
            stages.push(st);
            t
        });
        Report {
            wall_seconds: wall,
            samples: self.samples.load(Ordering::Relaxed),
            stages,
            starvation,
            starvation_steady: steady,
            cpu: self.cpu(wall, process, host, threads),
            bottleneck: None,
            skipped_count: self.skipped_total.load(Ordering::Relaxed),
            skipped: self.skipped.lock().expect("telemetry lock").clone(),
            device,
            transfer,
            tuning: None,
            kind: section,
        }
    }
}
