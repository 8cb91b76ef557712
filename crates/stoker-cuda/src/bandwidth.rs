//! Host-to-device bandwidth, measured the way the transfer stage copies: from page-locked
//! memory on a non-blocking stream, and (for comparison) from ordinary pageable memory, which
//! the driver must stage through its own pinned buffer.

use crate::driver::{DeviceMem, Gpu, PinnedMem, Stream};
use std::sync::Arc;
use std::time::Instant;

/// Measured host-to-device copy rates.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bandwidth {
    /// Bytes per copy.
    pub bytes: usize,
    /// Copies timed per kind.
    pub repeats: usize,
    /// From page-locked memory, GB/s (10^9 bytes).
    pub pinned_gbps: f64,
    /// From pageable memory, GB/s.
    pub pageable_gbps: f64,
}

/// Copies `bytes` host→device `repeats` times from pinned and from pageable memory (after one
/// untimed warm-up copy each) and reports the rates (wall time around enqueue + stream sync).
pub fn measure_h2d(gpu: &Arc<Gpu>, bytes: usize, repeats: usize) -> stoker::Result<Bandwidth> {
    let repeats = repeats.max(1);
    let _g = gpu.bind()?;
    let stream = Stream::new(gpu)?;
    let dev = DeviceMem::new(gpu, bytes)?;
    let pinned = PinnedMem::new(gpu, bytes)?;
    let pageable = vec![1u8; bytes];
    let rate = |src: *const u8| -> stoker::Result<f64> {
        // SAFETY: `src` points to `bytes` live bytes (pinned or the Vec above), kept alive and
        // unmodified until the stream is synchronised below.
        unsafe { dev.copy_from_host(src, bytes, &stream)? };
        stream.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..repeats {
            // SAFETY: as above.
            unsafe { dev.copy_from_host(src, bytes, &stream)? };
        }
        stream.synchronize()?;
        Ok((bytes * repeats) as f64 / t0.elapsed().as_secs_f64() * 1e-9)
    };
    let pinned_gbps = rate(pinned.as_ptr())?;
    let pageable_gbps = rate(pageable.as_ptr())?;
    Ok(Bandwidth { bytes, repeats, pinned_gbps, pageable_gbps })
}
