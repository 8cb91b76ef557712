//! The transfer thread: it takes a free device slot, copies a host batch into it on stoker's
//! stream (GPU decode of the samples the host left to it included) and hands the slot on.

use super::pool::{DeviceSlot, Pool, Release, SideBuf};
use crate::driver::{DeviceMem, Gpu, Stream};
use crate::gpu_decode::Consumer;
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoker::shell::kind::HostBatch;
use stoker::telemetry::Telemetry;
use stoker::trace::{Args as TraceArgs, Tracer};
use stoker::{Error, Next, Result};

const POLL: Duration = Duration::from_millis(20);

/// A stage's GPU decode: the decoder (used by one transfer thread at a time), the share's
/// tuner and what it has done.
pub struct GpuDecode {
    decoder: Mutex<crate::gpu_decode::GpuDecoder>,
    split: crate::gpu_decode::Split,
    backend: &'static str,
    images: std::sync::atomic::AtomicU64,
    fallback: std::sync::atomic::AtomicU64,
}

impl GpuDecode {
    /// `decoder` decoding the share `split` tunes.
    pub fn new(decoder: crate::gpu_decode::GpuDecoder, split: crate::gpu_decode::Split) -> Self {
        let backend = decoder.backend();
        GpuDecode {
            decoder: Mutex::new(decoder),
            split,
            backend,
            images: Default::default(),
            fallback: Default::default(),
        }
    }

    /// What GPU decode has done so far.
    pub fn stats(&self) -> GpuDecodeStats {
        GpuDecodeStats {
            backend: self.backend,
            images: self.images.load(Ordering::Relaxed),
            cpu_fallback: self.fallback.load(Ordering::Relaxed),
            share: f64::from(self.split.permille()) / 1000.0,
        }
    }
}

/// What a stage's GPU decode has done, for reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuDecodeStats {
    /// nvJPEG's backend for batches: `hardware` (JPEG engines) or `default`.
    pub backend: &'static str,
    /// Samples decoded by nvJPEG.
    pub images: u64,
    /// Samples nvJPEG refused, decoded on the CPU by the transfer thread instead.
    pub cpu_fallback: u64,
    /// The share of each batch left to the GPU now.
    pub share: f64,
}

/// What the transfer thread works with.
pub(super) struct Transfer {
    pub(super) gpu: Arc<Gpu>,
    pub(super) stream: Arc<Stream>,
    pub(super) pool: Arc<Pool>,
    pub(super) cancel: Arc<AtomicBool>,
    pub(super) telemetry: Option<Arc<Telemetry>>,
    pub(super) detached: Vec<usize>,
    pub(super) tracer: Option<Arc<Tracer>>,
    pub(super) gpu_decode: Option<Arc<GpuDecode>>,
}

/// A host batch whose copy may still be reading it: dropping it (on an error or an unwinding
/// panic) waits for stoker's stream first, so host memory never goes back to its pool early.
struct InFlight<'a, B> {
    host: Option<B>,
    stream: &'a Stream,
}

impl<B> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        if self.host.is_some() {
            let _ = self.stream.synchronize();
        }
    }
}

impl Transfer {
    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }

    /// Takes a free device slot whose release points have passed; `None`: cancelled.
    fn take_slot(&self) -> Result<Option<DeviceSlot>> {
        let Some(mut slot) = stoker::shell::ordered::take_free(&self.pool.slots.free_rx, &self.cancel) else {
            return Ok(None);
        };
        // Detached buffers of an undelivered batch (a run shut down early) go back.
        for (region, buf) in slot.side.drain(..) {
            self.pool.side.put(region, buf);
        }
        match slot.release.wait(&self.cancel) {
            Ok(true) => Ok(Some(slot)),
            Ok(false) => {
                self.pool.slots.give_back(slot);
                Ok(None)
            }
            Err(e) => {
                self.pool.slots.give_back(slot);
                Err(e)
            }
        }
    }

    /// A buffer for detached region `region`: a free one whose release points have passed,
    /// else a new one. `None`: cancelled.
    fn side_buf(&self, region: usize) -> Result<Option<SideBuf>> {
        let found = {
            let mut free = self.pool.side.0.lock().unwrap_or_else(|p| p.into_inner());
            let at = free.iter().position(|(r, b)| *r == region && b.release.events_passed());
            at.map(|i| free.swap_remove(i).1)
        };
        match found {
            Some(mut buf) => Ok(buf.release.wait(&self.cancel)?.then_some(buf)),
            None => {
                let mem = DeviceMem::new(&self.gpu, self.pool.capacities[region])?;
                Ok(Some(SideBuf { mem, release: Release::new(&self.gpu) }))
            }
        }
    }

    /// Forwards host batches until the input ends (`Ok`), the run is cancelled (`Ok`) or
    /// something fails (the error, delivered after the batches before it).
    pub(super) fn forward<B, P>(&self, mut poll: P, done: &Sender<DeviceSlot>) -> Result<()>
    where
        B: HostBatch,
        P: FnMut(Duration) -> Next<B>,
    {
        self.gpu.bind_forever()?;
        let tel = self.telemetry.as_deref();
        if let Some(gd) = &self.gpu_decode {
            gd.split.restart();
        }
        let mut regions = Vec::new();
        let mut deferred = Vec::new();
        for seq in 0.. {
            let host = loop {
                if self.cancelled() {
                    return Ok(());
                }
                match poll(POLL) {
                    Next::NotYet => continue,
                    Next::End => return Ok(()),
                    Next::Item(r) => break r?,
                }
            };
            let host = InFlight { host: Some(host), stream: &self.stream };
            let t0 = Instant::now();
            let Some(mut slot) = self.take_slot()? else { return Ok(()) };
            let t1 = Instant::now();
            if let Some(t) = tel {
                t.transfer.add_wait(t1 - t0);
            }
            if let Some(t) = &self.tracer {
                t.span("wait_device_buffer", "transfer", t0, t1, TraceArgs::numbers(&[("seq", seq as f64)]));
            }
            let b = host.host.as_ref().expect("host batch present until the copy completed");
            regions.clear();
            b.regions(&mut regions);
            let enqueued = (|| -> Result<bool> {
                if regions.len() != slot.regions.len() {
                    return Err(Error::Internal(format!(
                        "a batch of {} regions for a device slot of {}",
                        regions.len(),
                        slot.regions.len()
                    )));
                }
                for &r in &self.detached {
                    match self.side_buf(r)? {
                        Some(buf) => slot.side.push((r, buf)),
                        None => return Ok(false),
                    }
                }
                slot.start.record(self.stream.raw())?;
                for (i, (&(src, len), dst)) in regions.iter().zip(&slot.regions).enumerate() {
                    let dst = slot.side.iter().find(|(r, _)| *r == i).map_or(dst, |(_, b)| &b.mem);
                    // SAFETY: `host` (which owns the source memory, pinned by the loader's
                    // allocator) is kept alive below until the `ready` event has completed,
                    // and `InFlight` waits for the stream if this thread leaves early.
                    unsafe { dst.copy_from_host(src, len, &self.stream)? };
                }
                deferred.clear();
                b.deferred(&mut deferred);
                if !deferred.is_empty() {
                    let Some(gd) = &self.gpu_decode else {
                        return Err(Error::Internal("a batch left samples to a GPU decode this stage lacks".into()));
                    };
                    let (src, len) = regions[0];
                    // SAFETY: region 0 of the host batch, alive (and unmodified) until its
                    // `ready` event has completed (as for the copy above).
                    let host_images = unsafe { std::slice::from_raw_parts(src, len) };
                    let mut dec = gd.decoder.lock().unwrap_or_else(|p| p.into_inner());
                    // SAFETY: as above for `host_images`; the destination is this slot's region
                    // 0 (at least `len` bytes, the copy's length); the previous batch's `ready`
                    // was waited for below, so no earlier work reads the scratch memory.
                    let done = unsafe { dec.run(host_images, &deferred, slot.regions[0].ptr(), &self.stream)? };
                    gd.images.fetch_add(done.gpu as u64, Ordering::Relaxed);
                    gd.fallback.fetch_add(done.fallback as u64, Ordering::Relaxed);
                }
                slot.ready.record(self.stream.raw())?;
                Ok(true)
            })();
            match enqueued {
                Ok(true) => {}
                Ok(false) => {
                    self.pool.slots.give_back(slot);
                    return Ok(());
                }
                Err(e) => {
                    let _ = self.stream.synchronize();
                    self.pool.slots.give_back(slot);
                    return Err(e);
                }
            }
            let (start, ready) = (slot.start.clone(), slot.ready.clone());
            slot.lens = regions.iter().map(|r| r.1).collect();
            let bytes: usize = slot.lens.iter().sum();
            slot.seq = seq;
            slot.meta = Some(Box::new(b.meta()));
            // The run's queue holds at most `slots` slots and this one is out of the pool, so
            // the send never blocks; it fails only when the run was shut down.
            let sent = match done.send(slot) {
                Ok(()) => true,
                Err(crossbeam_channel::SendError(slot)) => {
                    self.pool.slots.give_back(slot);
                    false
                }
            };
            // The consumer already has the batch (its stream waits on `ready`); this thread
            // waits for the copy only to hand the pinned host buffer back to its pool.
            let copied = ready.synchronize();
            let ms = copied.as_ref().ok().and_then(|_| ready.elapsed_since(&start).ok());
            copied?;
            if let (Some(gd), Some(t)) = (&self.gpu_decode, tel) {
                // `auto` weighs the consumer's interval between batches (its counters are fed
                // by the device iterator's pass).
                let c = &t.consumer;
                gd.split.batch(Consumer { batches: c.items(), busy_ns: c.busy_ns(), wait_ns: c.wait_ns() });
            }
            let mut host = host;
            drop(host.host.take());
            if let (Some(t), Some(ms)) = (tel, ms) {
                t.add_transfer(bytes, Duration::from_secs_f64(f64::from(ms) * 1e-3));
            }
            if let Some(t) = &self.tracer {
                let ms = ms.map_or(f64::NAN, f64::from);
                let args = TraceArgs::numbers(&[("seq", seq as f64), ("bytes", bytes as f64), ("gpu_ms", ms)]);
                t.span("copy", "transfer", t1, Instant::now(), args);
            }
            if !sent {
                return Ok(());
            }
        }
        Ok(())
    }
}
