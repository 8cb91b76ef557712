//! Autotuning: `threads="auto"` and `prefetch="auto"` settle, during the first epoch, on the
//! smallest setting that keeps the consumer from waiting, within `cpu_budget` (cores), the
//! host-wide share ([`crate::observe::budget`]) and the memory cap.
//!
//! - **Threads.** An autotuned loader starts `threads_max = floor(cpu_budget)` decode workers,
//!   but only the first `threads_active` take work; the others park (they poll the cancel flag,
//!   so shutdown stays prompt). It starts at the limit, `min(threads_max, share)`, and the tuner
//!   looks at windows of delivered batches (at least [`WINDOW_BATCHES`] batches and
//!   [`WINDOW_MIN`]): when the consumer waited more than [`STARVED`] of a window and the active
//!   workers were more than half busy (not held up by reads), it adds one; when the consumer
//!   did not wait and one worker fewer would still have done the window's work at most 80%
//!   busy, it removes one. A raise after starvation
//!   sets a floor that later lowering respects, so the search ends. After one epoch's batches the
//!   setting holds; the share is still re-read every [`crate::observe::budget::REFRESH`] and caps it, and a
//!   loader that settled below its budget lowers its demand in the registry, giving the rest to
//!   other processes.
//! - **Prefetch.** The pool holds buffers for up to `prefetch_max` batches ahead (8 within
//!   `memory_limit`, or within 1 GiB without one); the dispatcher lets at most `prefetch_active`
//!   batches get ahead of the consumer. The tuner raises it when the consumer waited although
//!   the dispatcher was held back by that gate (a bursty consumer), never past the pool.
//! - An explicit number keeps the fixed behaviour exactly: every worker takes work, no gate.
//! - The registry never blocks a loader: when another process holds its lock past
//!   [`crate::observe::budget::LOCK_WAIT`], the loader runs unshared and the report says so
//!   (`registry_busy`, `note`).

use crate::observe::budget::{Kind, Registration, Registry, Share};
pub use crate::observe::report::{Decision, TuningReport};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The fewest batches a tuning window holds.
pub const WINDOW_BATCHES: u64 = 3;
/// The shortest tuning window.
pub const WINDOW_MIN: Duration = Duration::from_millis(150);
/// The consumer counts as starved when it waited more than this fraction of a window.
pub const STARVED: f64 = 0.05;
/// The most batches `prefetch="auto"` may keep ahead.
pub const AUTO_PREFETCH_MAX: usize = 8;
/// Without a `memory_limit`, the pool of `prefetch="auto"` stays within this many bytes (but
/// holds at least the default 2 + 2 batches).
pub const AUTO_PREFETCH_BYTES: u64 = 1 << 30;
/// Decisions kept in the report.
const MAX_DECISIONS: usize = 64;

/// What a tuning window measures, from whichever counters a loader kind keeps: nanoseconds
/// (monotonic totals) the consumer waited for batches and spent between them, and the workers'
/// busy time summed over workers.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    /// The consumer's total wait.
    pub consumer_wait_ns: u64,
    /// The consumer's total time between batches (its step).
    pub consumer_busy_ns: u64,
    /// The tuned workers' total busy time.
    pub worker_busy_ns: u64,
}

/// A loader's workers and the CPU budget (cores) its tuner keeps: `threads` when given (the
/// budget then `cpu_budget`, else a core per thread), else a worker per whole core of
/// `cpu_budget` (default: [`crate::observe::cpu::default_budget`]), which the tuner lowers
/// while the consumer does not wait. The rule of every kind that tunes its threads.
pub fn workers(threads: Option<usize>, cpu_budget: Option<f64>) -> crate::error::Result<(usize, f64)> {
    Ok(match threads.map(crate::values::check_threads).transpose()? {
        Some(n) => (n, cpu_budget.unwrap_or(n as f64)),
        None => {
            let budget = cpu_budget.unwrap_or_else(crate::observe::cpu::default_budget);
            ((budget + 1e-9).floor().max(1.0) as usize, budget)
        }
    })
}

/// How a loader's knobs are set.
#[derive(Debug, Clone)]
pub struct TuneSpec {
    /// `threads="auto"`.
    pub auto_threads: bool,
    /// Decode workers started (the fixed count, or `floor(cpu_budget)` for auto).
    pub threads_max: usize,
    /// `prefetch="auto"`.
    pub auto_prefetch: bool,
    /// The prefetch the pool was sized for.
    pub prefetch_max: usize,
    /// The starting (or fixed) prefetch.
    pub prefetch: usize,
    /// The CPU budget in cores.
    pub cpu_budget: f64,
    /// Batches in one epoch (the tuning period).
    pub epoch_batches: usize,
}

#[derive(Debug, Clone, Copy)]
struct Snapshot {
    t: Instant,
    batches: u64,
    consumer_wait: u64,
    consumer_busy: u64,
    worker_busy: u64,
    gate_wait: u64,
}

#[derive(Debug)]
struct State {
    window: Option<Snapshot>,
    batches: u64,
    /// What the tuner chose (the share may cap it below).
    tuned: usize,
    /// Lowering stops here (set by a raise after starvation).
    floor: usize,
    converged: bool,
    /// After convergence: follow the share up to `threads_max` (the tuner was held by it).
    follow_share: bool,
    /// The thread limit (budget and share) at the last batch.
    last_limit: usize,
    share: Option<Share>,
    share_min: Option<usize>,
    processes_max: Option<usize>,
    decisions: Vec<Decision>,
}

/// A loader's tuner: the knobs the workers and the dispatcher read, and the logic that moves
/// them (run on the consumer's thread, after each delivered batch).
#[derive(Debug)]
pub struct Tuner {
    spec: TuneSpec,
    active: AtomicUsize,
    prefetch: AtomicUsize,
    consumed: AtomicUsize,
    gate_wait_ns: AtomicU64,
    registration: Option<Registration>,
    note: Option<String>,
    registry_busy: bool,
    state: Mutex<State>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tuner {
    /// A tuner for `spec`, registered in `registry` (`None`: not shared).
    pub fn new(spec: TuneSpec, registry: Option<Registry>) -> Self {
        let (kind, demand) =
            if spec.auto_threads { (Kind::Auto, spec.threads_max) } else { (Kind::Fixed, spec.threads_max) };
        let (registration, note, registry_busy) = match registry {
            None => (None, Some("sharing is off (STOKER_SHARED_BUDGET=0)".to_string()), false),
            Some(r) => match r.register(kind, demand) {
                Ok(reg) => (Some(reg), None, false),
                // A stopped or hung process holds the lock: go on alone rather than wait.
                Err(e) if e.is_busy() => (
                    None,
                    Some(format!(
                        "sharing skipped: {e} (a stopped or hung process?); this loader uses its own cpu_budget"
                    )),
                    true,
                ),
                Err(e) => (None, Some(format!("cannot use the CPU registry {}: {e}", r.path().display())), false),
            },
        };
        let share = registration.as_ref().and_then(|r| r.share(false));
        let limit = Self::limit_of(&spec, share.as_ref());
        let start = if spec.auto_threads { limit } else { spec.threads_max };
        let prefetch = spec.prefetch.min(spec.prefetch_max).max(1);
        Tuner {
            active: AtomicUsize::new(start),
            prefetch: AtomicUsize::new(prefetch),
            consumed: AtomicUsize::new(0),
            gate_wait_ns: AtomicU64::new(0),
            registration,
            note,
            registry_busy,
            state: Mutex::new(State {
                window: None,
                batches: 0,
                tuned: start,
                floor: 1,
                converged: !spec.auto_threads && !spec.auto_prefetch,
                follow_share: false,
                last_limit: limit,
                share_min: share.as_ref().map(|s| s.cores_for_me),
                processes_max: share.as_ref().map(|s| s.processes),
                share,
                decisions: vec![],
            }),
            spec,
        }
    }

    fn limit_of(spec: &TuneSpec, share: Option<&Share>) -> usize {
        share.map_or(spec.threads_max, |s| s.cores_for_me.min(spec.threads_max)).max(1)
    }

    /// Decode workers started.
    pub fn threads_max(&self) -> usize {
        self.spec.threads_max
    }

    /// Decode workers allowed to take work now.
    pub fn threads_active(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Waits until worker `k` may take work; `false` when `cancel` was set first.
    pub fn wait_turn(&self, k: usize, cancel: &AtomicBool) -> bool {
        loop {
            if cancel.load(Ordering::Acquire) {
                return false;
            }
            if k < self.active.load(Ordering::Relaxed) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Records where the consumer is: its next batch.
    pub fn consumed(&self, next_batch: usize) {
        self.consumed.store(next_batch, Ordering::Release);
    }

    /// With `prefetch="auto"`, waits until batch `b` may be started (at most `prefetch_active`
    /// batches ahead of the consumer); returns the time waited, or `None` when `cancel` was set.
    pub fn gate(&self, b: usize, cancel: &AtomicBool) -> Option<Duration> {
        if !self.spec.auto_prefetch {
            return Some(Duration::ZERO);
        }
        let t0 = Instant::now();
        while b > self.consumed.load(Ordering::Acquire) + self.prefetch.load(Ordering::Relaxed) {
            if cancel.load(Ordering::Acquire) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let w = t0.elapsed();
        self.gate_wait_ns.fetch_add(w.as_nanos() as u64, Ordering::Relaxed);
        Some(w)
    }

    fn snapshot(&self, load: Load, batches: u64) -> Snapshot {
        Snapshot {
            t: Instant::now(),
            batches,
            consumer_wait: load.consumer_wait_ns,
            consumer_busy: load.consumer_busy_ns,
            worker_busy: load.worker_busy_ns,
            gate_wait: self.gate_wait_ns.load(Ordering::Relaxed),
        }
    }

    fn decide(&self, st: &mut State, knob: &str, from: usize, to: usize, reason: String) {
        if st.decisions.len() < MAX_DECISIONS {
            st.decisions.push(Decision { batch: st.batches, knob: knob.into(), from, to, reason });
        }
    }

    /// After each delivered batch (on the consumer's thread), with the loader's counters now:
    /// re-reads the share and, during the first epoch (the tuning period), closes a window and
    /// moves the knobs.
    pub fn on_batch_load(&self, load: Load) {
        let mut st = lock(&self.state);
        st.batches += 1;
        if let Some(reg) = &self.registration {
            if let Some(s) = reg.share(false) {
                if st.share.as_ref().map(|o| o.cores_for_me) != Some(s.cores_for_me) && self.spec.auto_threads {
                    let old = st.share.as_ref().map_or(0, |o| o.cores_for_me);
                    let why = format!("{} process(es) share {} cores", s.processes, s.cores);
                    self.decide(&mut st, "share", old, s.cores_for_me, why);
                }
                st.share_min = Some(st.share_min.map_or(s.cores_for_me, |m| m.min(s.cores_for_me)));
                st.processes_max = Some(st.processes_max.map_or(s.processes, |m| m.max(s.processes)));
                st.share = Some(s);
            }
        }
        let limit = Self::limit_of(&self.spec, st.share.as_ref());
        if self.spec.auto_threads {
            // Held down by the share, the setting follows it up when it grows.
            if !st.converged && st.tuned >= st.last_limit && limit > st.last_limit {
                st.tuned = limit;
            }
            let want = if st.converged && st.follow_share { limit } else { st.tuned.min(limit) };
            self.active.store(want.max(1), Ordering::Relaxed);
        }
        st.last_limit = limit;
        if st.converged {
            return;
        }
        self.window(&mut st, load, limit);
        if st.batches >= self.spec.epoch_batches as u64 {
            st.converged = true;
            let tuned = st.tuned;
            st.follow_share = tuned >= limit;
            let why = format!("first epoch done: threads {tuned}, prefetch {}", self.prefetch.load(Ordering::Relaxed));
            self.decide(&mut st, "hold", tuned, tuned, why);
            if let (Some(reg), true) = (&self.registration, self.spec.auto_threads && !st.follow_share) {
                st.share = reg.set_demand(tuned).or(st.share.take());
            }
        }
    }

    /// Closes a tuning window when it is long enough and moves the knobs.
    fn window(&self, st: &mut State, load: Load, limit: usize) {
        let now = self.snapshot(load, st.batches);
        let Some(w0) = st.window else {
            st.window = Some(now);
            return;
        };
        let wall = now.t.duration_since(w0.t);
        if now.batches - w0.batches < WINDOW_BATCHES || wall < WINDOW_MIN {
            return;
        }
        st.window = Some(now);
        // Counters reset by `reset_report` restart the window.
        if now.consumer_wait < w0.consumer_wait || now.worker_busy < w0.worker_busy {
            return;
        }
        let wall_ns = wall.as_nanos() as f64;
        let waited = (now.consumer_wait - w0.consumer_wait) as f64;
        let busy = now.consumer_busy.saturating_sub(w0.consumer_busy) as f64;
        let starved = if waited + busy > 0.0 { waited / (waited + busy) } else { 0.0 };
        let workers = (now.worker_busy - w0.worker_busy) as f64 / wall_ns;
        let gated = now.gate_wait.saturating_sub(w0.gate_wait) as f64 / wall_ns;
        let active = self.active.load(Ordering::Relaxed);
        let pct = |x: f64| format!("{:.0}%", x * 100.0);
        if self.spec.auto_threads {
            let mut next = st.tuned.min(limit);
            if starved > STARVED && next < limit && workers > 0.5 * active as f64 {
                next += 1;
                st.floor = next;
                let why = format!("consumer waited {}, {workers:.2} workers busy", pct(starved));
                self.decide(st, "threads", active, next, why);
            } else if starved < STARVED / 2.0 && next > st.floor && workers < 0.8 * (next - 1) as f64 {
                next -= 1;
                let why = format!("consumer waited {}, only {workers:.2} workers busy", pct(starved));
                self.decide(st, "threads", active, next, why);
            }
            st.tuned = next;
            self.active.store(next, Ordering::Relaxed);
        }
        if self.spec.auto_prefetch {
            let p = self.prefetch.load(Ordering::Relaxed);
            let at_limit = !self.spec.auto_threads || self.active.load(Ordering::Relaxed) >= limit;
            if starved > STARVED
                && gated > 0.1
                && p < self.spec.prefetch_max
                && (at_limit || workers < 0.75 * active as f64)
            {
                let why = format!("consumer waited {} while the dispatcher was gated {}", pct(starved), pct(gated));
                self.decide(st, "prefetch", p, p + 1, why);
                self.prefetch.store(p + 1, Ordering::Relaxed);
            }
        }
    }

    /// The tuning state.
    pub fn report(&self) -> TuningReport {
        let st = lock(&self.state);
        let share = st.share.clone();
        TuningReport {
            threads_auto: self.spec.auto_threads,
            threads_active: self.active.load(Ordering::Relaxed),
            threads_max: self.spec.threads_max,
            prefetch_auto: self.spec.auto_prefetch,
            prefetch_active: self.prefetch.load(Ordering::Relaxed),
            prefetch_max: self.spec.prefetch_max,
            cpu_budget: self.spec.cpu_budget,
            shared: self.registration.is_some(),
            registry: self.registration.as_ref().map(|r| r.path().display().to_string()),
            share: share.as_ref().map(|s| s.cores_for_me),
            host_cores: share.as_ref().map(|s| s.cores),
            processes_sharing: share.as_ref().map(|s| s.processes),
            share_min: st.share_min,
            processes_sharing_max: st.processes_max,
            converged: st.converged,
            note: self.note.clone(),
            registry_busy: self.registry_busy,
            registry_busy_refreshes: self.registration.as_ref().map_or(0, |r| r.busy_refreshes()),
            decisions: st.decisions.clone(),
        }
    }
}
