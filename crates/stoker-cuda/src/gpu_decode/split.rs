//! `decode="auto"`: the share of each batch decoded on the GPU, moved so that the consumer (the
//! training loop) gets more batches per second, and only then.
//!
//! GPU decode runs beside the training step on the same GPU: a share that balances the CPU
//! threads against the GPU's decode time can lengthen every step by more than it saves the
//! CPU. So the objective is the consumer's own interval between batches (its step plus its wait
//! in `next()`, from the loader's consumer counters), not the balance of the two decoders:
//!
//! - `auto` starts with every sample on the CPU (share 0).
//! - After each window of [`WINDOW`] batches at a held share, a consumer that waited for data
//!   more than [`STARVED`] of its time gets a probe one [`STEP`] up; one that hardly waited
//!   ([`FED`]) with a share above 0 gets a probe one step down (the CPU may keep up alone: the
//!   GPU is then left to training).
//! - A probe is measured over a window after [`SETTLE`] batches (those in flight were split at
//!   the old share). It is kept when the consumer's interval got shorter by [`BETTER`] (up) or
//!   no longer by more than [`WORSE`] (down); otherwise the share goes back, and that direction
//!   waits twice as many windows as last time before its next probe (at most [`MAX_BACKOFF`]).
//! - A probe that lengthens the interval by more than [`HARMFUL`] is undone after half a window,
//!   and its direction waits the longest: the GPU's decode costs the step far more than it
//!   saves.
//!
//! So a share the training step pays for is undone within one window, and probing costs a few
//! windows in a hundred once it has settled. A fixed `decode="gpu"` share is left alone, and a
//! stage without consumer counters keeps the share it started with.

use std::sync::Mutex;
use stoker::image::gpu_job::GpuShare;

/// One step of the share, in thousandths.
pub const STEP: u32 = 1000 / 16;
/// Batches after a change of the share before its window starts.
pub const SETTLE: u64 = 4;
/// Batches in a window.
pub const WINDOW: u64 = 8;
/// The consumer waiting more than this share of its time: the data is the limit.
pub const STARVED: f64 = 0.05;
/// The consumer waiting less than this share of its time: it is fed.
pub const FED: f64 = 0.02;
/// A probe up is kept when it shortens the consumer's interval by this fraction.
pub const BETTER: f64 = 0.03;
/// A probe down is kept when it lengthens the consumer's interval by at most this fraction.
pub const WORSE: f64 = 0.02;
/// The most windows a direction waits after its probes failed.
pub const MAX_BACKOFF: u32 = 128;
/// A probe that lengthens the consumer's interval by more than this fraction is undone early.
pub const HARMFUL: f64 = 0.15;

/// The consumer's counters, cumulative, as the transfer thread reads them after a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Consumer {
    /// Batches the consumer took.
    pub batches: u64,
    /// Its time between batches (its step), nanoseconds.
    pub busy_ns: u64,
    /// Its time waiting inside `next()`, nanoseconds.
    pub wait_ns: u64,
}

/// The tuner of an `auto` share.
#[derive(Debug)]
pub struct Split {
    share: GpuShare,
    climb: Option<Mutex<Climb>>,
}

impl Split {
    /// Tunes `share` when `auto`, else leaves it as set.
    pub fn new(share: GpuShare, auto: bool) -> Self {
        Split { share, climb: auto.then(|| Mutex::new(Climb::default())) }
    }

    /// The share now, in thousandths.
    pub fn permille(&self) -> u32 {
        self.share.permille()
    }

    /// A pass starts: its first batches fill the pipeline (the consumer waits for them whatever
    /// the share), so the window being measured starts again after them.
    pub fn restart(&self) {
        if let Some(c) = &self.climb {
            let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
            c.skip = SETTLE;
            c.start = None;
        }
    }

    /// One batch passed to the GPU; `consumer` is the consumer's counters now.
    pub fn batch(&self, consumer: Consumer) {
        if let Some(c) = &self.climb {
            c.lock().unwrap_or_else(|p| p.into_inner()).observe(&self.share, consumer);
        }
    }
}

/// One window: the consumer's mean interval per batch and the share of it spent waiting.
#[derive(Debug, Clone, Copy)]
struct Window {
    interval: f64,
    starved: f64,
}

#[derive(Debug, Clone, Copy)]
enum Probe {
    Up { from: u32, base: Window },
    Down { from: u32, base: Window },
}

/// The hill climb's state.
#[derive(Debug)]
struct Climb {
    /// Batches to let pass before the next window starts.
    skip: u64,
    /// The counters at the start of the window being measured.
    start: Option<Consumer>,
    probe: Option<Probe>,
    /// Windows each direction still waits before its next probe, and its next wait.
    wait: [u32; 2],
    backoff: [u32; 2],
}

impl Default for Climb {
    fn default() -> Self {
        // The first batches fill the pipeline: they are not the steady state.
        Climb { skip: SETTLE, start: None, probe: None, wait: [0; 2], backoff: [1; 2] }
    }
}

const UP: usize = 0;
const DOWN: usize = 1;

impl Climb {
    fn observe(&mut self, share: &GpuShare, now: Consumer) {
        if self.skip > 0 {
            self.skip -= 1;
            self.start = None;
            return;
        }
        let start = *self.start.get_or_insert(now);
        let n = now.batches.saturating_sub(start.batches);
        let busy = now.busy_ns.saturating_sub(start.busy_ns) as f64;
        let wait = now.wait_ns.saturating_sub(start.wait_ns) as f64;
        if n == 0 || busy + wait <= 0.0 {
            return;
        }
        let w = Window { interval: (busy + wait) / n as f64, starved: wait / (busy + wait) };
        if n < WINDOW {
            // Half a window into a probe that costs the consumer dearly: undone now.
            if let (Some(Probe::Up { from, base } | Probe::Down { from, base }), true) = (self.probe, n >= WINDOW / 2) {
                if w.interval > base.interval * (1.0 + HARMFUL) {
                    let d = if matches!(self.probe, Some(Probe::Up { .. })) { UP } else { DOWN };
                    self.probe = None;
                    self.backoff[d] = MAX_BACKOFF;
                    self.judge(share, d, from, false);
                }
            }
            return;
        }
        self.start = Some(now);
        let s = share.permille();
        match self.probe.take() {
            Some(Probe::Up { from, base }) => self.judge(share, UP, from, w.interval < base.interval * (1.0 - BETTER)),
            Some(Probe::Down { from, base }) => {
                self.judge(share, DOWN, from, w.interval <= base.interval * (1.0 + WORSE))
            }
            None => {
                for d in &mut self.wait {
                    *d = d.saturating_sub(1);
                }
                if w.starved > STARVED && s < 1000 && self.wait[UP] == 0 {
                    self.change(share, (s + STEP).min(1000), Probe::Up { from: s, base: w });
                } else if w.starved < FED && s > 0 && self.wait[DOWN] == 0 {
                    self.change(share, s.saturating_sub(STEP), Probe::Down { from: s, base: w });
                }
            }
        }
    }

    fn change(&mut self, share: &GpuShare, to: u32, probe: Probe) {
        share.set(to);
        self.probe = Some(probe);
        self.skip = SETTLE;
    }

    /// Keeps a probe in direction `d` (`kept`), or puts the share back to `from` and makes that
    /// direction wait.
    fn judge(&mut self, share: &GpuShare, d: usize, from: u32, kept: bool) {
        if kept {
            self.backoff[d] = 1;
            return;
        }
        share.set(from);
        self.skip = SETTLE;
        self.wait[d] = self.backoff[d];
        self.backoff[d] = (self.backoff[d] * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of a training job on one GPU, batch by batch: the CPU threads make the
    /// `(1 - share)` of a batch they decode in `cpu` seconds per whole batch; the GPU runs the
    /// training step (`step` seconds) and, on the same SMs, the decode of its share (`gpu`
    /// seconds per whole batch), one after the other. The consumer's interval is the slower
    /// side; it waits for data when that is the CPU. A batch is split when its samples are
    /// decoded, [`IN_FLIGHT`] batches before the consumer takes it. `noise` (a fraction) moves
    /// every interval by a deterministic pseudo-random amount, as real steps vary. Returns the
    /// mean interval over `batches` and the share at the end.
    fn run(cpu: f64, step: f64, gpu: f64, noise: f64, batches: usize) -> (f64, f64) {
        let split = Split::new(GpuShare::new(DecodeStart::AUTO), true);
        let mut c = Consumer::default();
        let mut total = 0.0;
        let mut rng = Jitter::new(noise);
        let mut in_flight = std::collections::VecDeque::from([0u32; IN_FLIGHT]);
        for _ in 0..batches {
            in_flight.push_back(split.permille());
            let s = f64::from(in_flight.pop_front().unwrap_or(0)) / 1000.0;
            let jitter = rng.next();
            let (host, device) = ((1.0 - s) * cpu * jitter, (step + s * gpu) * jitter);
            let interval = host.max(device);
            total += interval;
            c.batches += 1;
            c.busy_ns += (device * 1e9) as u64;
            c.wait_ns += ((interval - device) * 1e9) as u64;
            split.batch(c);
        }
        let out = (total / batches as f64, f64::from(split.permille()) / 1000.0);
        eprintln!("model cpu {cpu} step {step} gpu {gpu} noise {noise}: mean interval {:.5} s, share {}", out.0, out.1);
        out
    }

    /// Factors within `noise` of 1, the same sequence for every run (xorshift).
    struct Jitter {
        x: u64,
        noise: f64,
    }

    impl Jitter {
        fn new(noise: f64) -> Self {
            Jitter { x: 0x9e37_79b9_7f4a_7c15, noise }
        }

        fn next(&mut self) -> f64 {
            self.x ^= self.x << 13;
            self.x ^= self.x >> 7;
            self.x ^= self.x << 17;
            1.0 + self.noise * ((self.x % 2001) as f64 / 1000.0 - 1.0)
        }
    }

    /// Batches split before the consumer takes the one in hand (prefetch 2, one in the copy).
    const IN_FLIGHT: usize = 3;

    /// `auto`'s start, as the loader gives it.
    struct DecodeStart;
    impl DecodeStart {
        const AUTO: u32 = 0;
    }

    #[test]
    fn where_the_cpu_keeps_up_the_gpu_is_left_alone() {
        for noise in [0.0, 0.05] {
            let (interval, share) = run(0.018, 0.021, 0.010, noise, 2000);
            assert_eq!(share, 0.0, "noise {noise}");
            let cpu_alone = run_fixed(0.018, 0.021, 0.010, noise, 2000, 0.0);
            assert!(interval <= cpu_alone * 1.001, "noise {noise}: {interval} vs {cpu_alone}");
        }
    }

    /// The mean interval of a fixed share.
    fn run_fixed(cpu: f64, step: f64, gpu: f64, noise: f64, batches: usize, share: f64) -> f64 {
        let mut rng = Jitter::new(noise);
        let mut total = 0.0;
        for _ in 0..batches {
            let jitter = rng.next();
            total += ((1.0 - share) * cpu * jitter).max((step + share * gpu) * jitter);
        }
        total / batches as f64
    }

    #[test]
    fn a_starved_consumer_gets_the_share_that_shortens_its_interval() {
        // The CPU needs 30 ms a batch, the step 21 ms, the GPU's decode of a whole batch 20 ms:
        // the best share is where (1 - s) 30 = 21 + 20 s, s = 0.18 (interval 24.6 ms).
        for noise in [0.0, 0.03] {
            let (interval, share) = run(0.030, 0.021, 0.020, noise, 3000);
            assert!((0.10..=0.26).contains(&share), "noise {noise}: share {share}");
            let cpu_alone = run_fixed(0.030, 0.021, 0.020, noise, 3000, 0.0);
            assert!(interval < cpu_alone * 0.88, "noise {noise}: {interval} vs CPU alone {cpu_alone}");
        }
    }

    #[test]
    fn a_gpu_decode_that_lengthens_the_step_more_than_it_saves_is_undone() {
        // Host 1's case: the CPU nearly keeps up (22 ms against a 21 ms step) and the GPU's
        // decode is dear (a whole batch would add 60 ms to the step): balancing the decoders
        // would put a share on the GPU; the consumer's interval says to keep it small, and over
        // the run `auto` is no slower than the CPU alone.
        for noise in [0.0, 0.03, 0.06] {
            let (interval, share) = run(0.022, 0.021, 0.060, noise, 3000);
            let cpu_alone = run_fixed(0.022, 0.021, 0.060, noise, 3000, 0.0);
            assert!(interval <= cpu_alone * 1.005, "noise {noise}: {interval} vs CPU alone {cpu_alone}");
            assert!(share <= 0.07, "noise {noise}: share {share}");
        }
        // A GPU decode dearer than the CPU's: nothing to gain, the share stays at or returns
        // to 0.
        let (interval, share) = run(0.030, 0.021, 0.400, 0.02, 3000);
        assert!(share <= 0.07 && interval <= run_fixed(0.030, 0.021, 0.4, 0.02, 3000, 0.0) * 1.01, "{share}");
    }

    #[test]
    fn a_pass_s_first_batches_are_not_measured() {
        // Passes of 12 batches whose first batch the consumer waits 60 ms for (the pipeline's
        // fill) and then none: the consumer is fed, the share stays where it is.
        let split = Split::new(GpuShare::new(0), true);
        let mut c = Consumer::default();
        for b in 0..240 {
            if b % 12 == 0 {
                split.restart();
            }
            c.batches += 1;
            c.busy_ns += 40_000_000;
            c.wait_ns += if b % 12 == 0 { 60_000_000 } else { 0 };
            split.batch(c);
        }
        assert_eq!(split.permille(), 0);
    }

    #[test]
    fn a_fixed_share_is_left_alone() {
        let split = Split::new(GpuShare::new(250), false);
        for n in 1..100 {
            split.batch(Consumer { batches: n, busy_ns: n * 1_000_000, wait_ns: n * 5_000_000 });
        }
        assert_eq!(split.permille(), 250);
    }
}
