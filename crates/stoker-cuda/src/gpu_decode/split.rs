//! `decode="auto"`: the share of each batch decoded on the GPU, moved batch by batch so that
//! the CPU threads and the GPU finish a batch together.
//!
//! The transfer thread sees both sides of every batch: how long it waited for the host to
//! finish the batch (the CPU threads are behind), and how long the GPU's decode of the batch
//! took (nvJPEG and the resampler, from events, plus the host time of the hybrid backend). The
//! GPU side is the bottleneck when its decode of a batch takes longer than the host takes to
//! make one; the CPU side when the transfer thread waits for batches while the GPU's decode is
//! shorter than that interval. The share moves one step (1/64) toward the side with room, and
//! settles where neither waits: both finish together. A fixed `decode="gpu"` share is left
//! alone.

use std::time::Duration;
use stoker::image::gpu_job::GpuShare;

/// One step of the share, in thousandths.
const STEP: u32 = 1000 / 64;
/// The GPU's decode may take this fraction of the host's interval before the share drops.
const GPU_HIGH: f64 = 0.9;
/// The transfer thread waiting longer than this fraction of the interval means the CPU side is
/// behind.
const HOST_WAIT: f64 = 0.1;

/// The tuner of an `auto` share.
#[derive(Debug)]
pub struct Split {
    share: GpuShare,
    auto: bool,
}

impl Split {
    /// Tunes `share` when `auto`, else leaves it as set.
    pub fn new(share: GpuShare, auto: bool) -> Self {
        Split { share, auto }
    }

    /// The share now, in thousandths.
    pub fn permille(&self) -> u32 {
        self.share.permille()
    }

    /// One batch: the interval since the previous batch arrived, how long of it the transfer
    /// thread waited for the host, and the GPU's decode time of the batch.
    pub fn batch(&self, interval: Duration, host_wait: Duration, gpu: Duration) {
        if !self.auto || interval.is_zero() {
            return;
        }
        let (i, w, g) = (interval.as_secs_f64(), host_wait.as_secs_f64(), gpu.as_secs_f64());
        let s = self.share.permille();
        if g > GPU_HIGH * i {
            self.share.set(s.saturating_sub(STEP).max(STEP));
        } else if w > HOST_WAIT * i {
            self.share.set((s + STEP).min(1000));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of a pipeline: the CPU decodes `(1 - share)` of a batch at `cpu` seconds per
    /// batch, the GPU `share` of it at `gpu` seconds per batch; a batch takes the longer of the
    /// two, and the transfer thread waits for the CPU's part beyond the GPU's.
    fn settle(cpu: f64, gpu: f64, auto: bool) -> f64 {
        let split = Split::new(GpuShare::new(500), auto);
        for _ in 0..400 {
            let s = f64::from(split.permille()) / 1000.0;
            let (c, g) = ((1.0 - s) * cpu, s * gpu);
            let interval = c.max(g);
            split.batch(
                Duration::from_secs_f64(interval),
                Duration::from_secs_f64((c - g).max(0.0)),
                Duration::from_secs_f64(g),
            );
        }
        f64::from(split.permille()) / 1000.0
    }

    #[test]
    fn the_share_settles_where_both_sides_finish_together() {
        // Balanced where (1 - s) * cpu = s * gpu: s = cpu / (cpu + gpu).
        for (cpu, gpu) in [(1.0, 1.0), (3.0, 1.0), (1.0, 3.0), (1.0, 0.2)] {
            let s = settle(cpu, gpu, true);
            let want = cpu / (cpu + gpu);
            assert!((s - want).abs() < 0.08, "cpu {cpu} gpu {gpu}: settled at {s}, balance at {want}");
        }
        // A fixed share is left alone.
        assert_eq!(settle(3.0, 1.0, false), 0.5);
    }
}
