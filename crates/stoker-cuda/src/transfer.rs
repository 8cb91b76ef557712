//! The transfer stage: finished host batches (in pinned memory) are copied to the GPU on
//! stoker's own stream, and the consumer's stream waits on an event instead of the host.
//!
//! ```text
//! host iterator ──► transfer thread ──(cuMemcpyHtoDAsync on stoker's stream, event `ready`)──► consumer
//!                    │ waits for `ready`, then returns the host buffer to its pool
//!                    └ takes a device slot only after its release events have passed
//! consumer: stream.wait(ready) … uses the tensors … drops them → release event recorded on
//!           that stream → the slot goes back to the device pool
//! ```
//!
//! A device slot is written again only after the consumer released the batch *and* every
//! stream it was used on has passed the release point, so a batch still being read by queued
//! kernels is never overwritten (the race PyTorch's caching allocator leaves open for
//! side-stream copies). The host buffer returns to its pool as soon as its copy has completed.
//! No call on the consumer's thread waits for the GPU.
//!
//! The thread, the queue of copied slots, cancellation and shutdown are the engine's shared
//! ordered [`Run`] (the one under the image pipeline and `ArrayLoader`): the transfer thread is
//! started by [`Run::spawn`] (a panic becomes the consumer's error, never a wait), a consumer
//! holding every device slot gets an error instead of a hang, shutting a run down returns every
//! undelivered slot to the device pool, and a run replaced by a newer [`DeviceStage::run`] is
//! stale (its iterator says so).
//!
//! Regions named by [`DeviceStage::with_detached`] (an image loader's labels) are copied into
//! small buffers of their own instead of the slot, handed out as [`DeviceRegion`]s: a consumer
//! that keeps the labels of every batch (metrics, logging) does not keep the batch's images
//! buffer, so the slot goes back to the pool when the images are dropped. Those small buffers
//! follow the same release rule (written again only after their consumer streams passed the
//! release point) and are allocated on demand, so keeping them costs only their few bytes.

use crate::driver::{DeviceMem, Event, Gpu, Stream};
use crate::gpu_decode::Consumer;
use crossbeam_channel::Sender;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoker::shell::epochs::Active;
use stoker::shell::grow::MakeSlot;
use stoker::shell::grow::SlotPool;
use stoker::shell::kind::HostBatch;
use stoker::shell::ordered::Run;
use stoker::shell::pass::{FailureBudget, Observe, Pass, PassHooks, PassSlot};
use stoker::telemetry::Telemetry;
use stoker::trace::{Args as TraceArgs, Tracer};
use stoker::{Error, Next, Result};

const POLL: Duration = Duration::from_millis(20);

/// The region capacities of an image loader's batches: the images buffer, then the labels,
/// then an image-text pair batch's caption ids and mask or a mixed batch's soft labels.
pub fn image_regions(loader: &stoker::Loader) -> Vec<usize> {
    let batch_size = loader.sampler().spec().batch_size;
    let mut regions = vec![loader.pool().batch_bytes(), batch_size * 8];
    // An image-text pair batch's caption ids and mask (int32 rows).
    if let Some(n) = loader.context_length() {
        regions.extend([batch_size * n * 4; 2]);
    }
    // A mixed batch's soft labels (float32 rows; the images are mixed on the GPU).
    if let Some(m) = loader.mix() {
        regions.push(batch_size * m.num_classes * 4);
    }
    regions
}

/// The streams a batch was used on, for its release events.
#[derive(Default)]
struct Consumers {
    streams: Vec<usize>,
    unknown: bool,
}

/// What the consumer's views of one copy share: the copy's `ready` event and the streams they
/// were used on.
struct Views {
    ready: Arc<Event>,
    consumers: Mutex<Consumers>,
}

impl Views {
    fn new(ready: Arc<Event>) -> Self {
        Views { ready, consumers: Mutex::new(Consumers::default()) }
    }

    fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
        let mut c = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        match stream {
            None => c.unknown = true,
            Some(s) => {
                self.ready.wait_on(s as cudarc::driver::sys::CUstream)?;
                if !c.streams.contains(&s) {
                    c.streams.push(s);
                }
            }
        }
        Ok(())
    }

    fn take(&self) -> Consumers {
        std::mem::take(&mut *self.consumers.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The release points of one piece of device memory: events recorded on the consumer's
/// streams when it let go of the memory. The memory is written again only after they passed.
struct Release {
    events: Vec<Event>,
    pending: usize,
    /// The memory was used on a stream stoker was not told about: wait for the whole device.
    full_sync: bool,
    gpu: Arc<Gpu>,
}

impl Release {
    fn new(gpu: &Arc<Gpu>) -> Self {
        Release { events: vec![], pending: 0, full_sync: false, gpu: gpu.clone() }
    }

    /// Records a release event on every stream in `c` (on the consumer's thread: enqueues
    /// only, never waits).
    fn record(&mut self, c: Consumers) {
        self.full_sync |= c.unknown;
        for s in c.streams {
            if self.events.len() == self.pending {
                match Event::new(&self.gpu, false) {
                    Ok(ev) => self.events.push(ev),
                    Err(_) => {
                        self.full_sync = true;
                        continue;
                    }
                }
            }
            if self.events[self.pending].record(s as cudarc::driver::sys::CUstream).is_ok() {
                self.pending += 1;
            } else {
                self.full_sync = true;
            }
        }
    }

    /// Whether every release event has passed (never waits; a pending full-device sync is
    /// left to [`Release::wait`]).
    fn events_passed(&self) -> bool {
        self.events[..self.pending].iter().all(|e| e.is_done().unwrap_or(false))
    }

    /// Waits (polling, so `cancel` is honoured) until every release point has passed.
    /// `Ok(false)`: cancelled.
    fn wait(&mut self, cancel: &AtomicBool) -> Result<bool> {
        for ev in &self.events[..self.pending] {
            let mut nap = Duration::from_micros(20);
            while !ev.is_done()? {
                if cancel.load(Ordering::Acquire) {
                    return Ok(false);
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
        self.pending = 0;
        if self.full_sync {
            self.gpu.synchronize()?;
            self.full_sync = false;
        }
        Ok(true)
    }

    /// Blocks until every release point has passed (before the memory is freed).
    fn wait_all(&mut self) {
        for ev in &self.events[..self.pending] {
            let _ = ev.synchronize();
        }
        self.pending = 0;
        if self.full_sync {
            let _ = self.gpu.synchronize();
            self.full_sync = false;
        }
    }
}

/// One device slot: a buffer per region, the copy's events, the release events recorded on
/// the consumer's streams, and (between the copy and the hand-off) the batch it holds.
struct DeviceSlot {
    regions: Vec<DeviceMem>,
    start: Arc<Event>,
    ready: Arc<Event>,
    release: Release,
    /// Sequence number of the batch in this run (what the ordered run waits for).
    seq: usize,
    /// The batch's description (a `HostBatch::Meta`), until the consumer takes it.
    meta: Option<Box<dyn Any + Send + Sync>>,
    /// Bytes copied per region.
    lens: Vec<usize>,
    /// The detached regions of the batch in this slot: `(region, buffer)`.
    side: Vec<(usize, SideBuf)>,
}

/// A small buffer a detached region is copied into (see [`DeviceStage::with_detached`]).
struct SideBuf {
    mem: DeviceMem,
    release: Release,
}

impl Drop for SideBuf {
    fn drop(&mut self) {
        // Never free memory that queued consumer work may still read.
        self.release.wait_all();
    }
}

impl Drop for DeviceSlot {
    fn drop(&mut self) {
        // Never free memory that queued consumer work may still read.
        self.release.wait_all();
        let _ = self.ready.synchronize();
    }
}

struct Pool {
    /// The device slots (grown while the consumer keeps every device batch).
    slots: SlotPool<DeviceSlot>,
    capacities: Vec<usize>,
    /// Free buffers for detached regions.
    side: Arc<SideList>,
}

/// Free buffers for detached regions, by region. Shared with the live [`DeviceRegion`]s
/// apart from the pool, so that kept labels never keep the pool's slots alive.
#[derive(Default)]
struct SideList(Mutex<Vec<(usize, SideBuf)>>);

impl SideList {
    fn put(&self, region: usize, buf: SideBuf) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((region, buf));
    }
}

/// One region of a batch in a device buffer of its own (an image batch's labels): it keeps
/// only that small buffer alive, not the batch's slot. Same stream rules as [`DeviceBatch`].
pub struct DeviceRegion {
    buf: Option<SideBuf>,
    region: usize,
    len: usize,
    views: Views,
    side: Arc<SideList>,
    gpu: Arc<Gpu>,
}

impl std::fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegion").field("region", &self.region).field("len", &self.len).finish()
    }
}

impl DeviceRegion {
    fn mem(&self) -> &DeviceMem {
        &self.buf.as_ref().expect("live region has a buffer").mem
    }

    /// Device address of the bytes.
    pub fn ptr(&self) -> u64 {
        self.mem().ptr()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// CUDA ordinal of the device holding it.
    pub fn ordinal(&self) -> u32 {
        self.gpu.ordinal()
    }

    /// As [`DeviceBatch::sync_stream`].
    pub fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
        self.views.sync_stream(stream)
    }

    /// Blocks the calling thread until the copy has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.views.ready.synchronize()
    }

    /// Reads the bytes back (waits for the copy first): for checks, never on a training path.
    pub fn read(&self, out: &mut Vec<u8>) -> Result<()> {
        self.synchronize()?;
        out.resize(self.len, 0);
        self.mem().read_into(out)
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        let Some(mut buf) = self.buf.take() else { return };
        buf.release.record(self.views.take());
        self.side.put(self.region, buf);
    }
}

/// A batch in device memory. Its bytes are valid on a stream only after
/// [`DeviceBatch::sync_stream`] (or on the host after [`DeviceBatch::synchronize`]); dropping
/// it records release events on those streams and returns the memory to stoker's device pool.
pub struct DeviceBatch<M> {
    slot: Option<DeviceSlot>,
    lens: Vec<usize>,
    meta: M,
    /// Regions copied into buffers of their own, by region index.
    detached: Vec<Option<Arc<DeviceRegion>>>,
    pool: Arc<Pool>,
    views: Views,
    gpu: Arc<Gpu>,
}

impl<M> std::fmt::Debug for DeviceBatch<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch").field("lens", &self.lens).finish()
    }
}

impl<M> DeviceBatch<M> {
    fn slot(&self) -> &DeviceSlot {
        self.slot.as_ref().expect("live batch has a slot")
    }

    /// The batch's description.
    pub fn meta(&self) -> &M {
        &self.meta
    }

    /// CUDA ordinal of the device holding the batch.
    pub fn ordinal(&self) -> u32 {
        self.gpu.ordinal()
    }

    /// Device address of region `i` (images = 0, labels = 1; or array columns in order).
    pub fn region_ptr(&self, i: usize) -> u64 {
        match self.detached.get(i) {
            Some(Some(r)) => r.ptr(),
            _ => self.slot().regions[i].ptr(),
        }
    }

    /// Region `i` when it lives in a buffer of its own ([`DeviceStage::with_detached`]): a
    /// view of it that keeps only that buffer alive, not this batch's slot.
    pub fn detached(&self, i: usize) -> Option<&Arc<DeviceRegion>> {
        self.detached.get(i).and_then(|r| r.as_ref())
    }

    /// Bytes of region `i` in this batch.
    pub fn region_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// Number of regions.
    pub fn regions(&self) -> usize {
        self.lens.len()
    }

    /// Makes `stream` (a raw `CUstream` handle; `0`/`1` the legacy default stream, `2` the
    /// per-thread one) wait on the GPU for the copy, and remembers it for the release. `None`:
    /// the caller synchronises by other means; the memory is then reused only after the whole
    /// device has gone idle past the release.
    pub fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
        self.views.sync_stream(stream)
    }

    /// Blocks the calling thread until the copy has completed (for host-side readers).
    pub fn synchronize(&self) -> Result<()> {
        self.views.ready.synchronize()
    }

    /// Reads region `i` back from the GPU into `out` (waits for the copy first): for checks and
    /// digests, never on a training path.
    pub fn read_region(&self, i: usize, out: &mut Vec<u8>) -> Result<()> {
        if let Some(r) = self.detached(i) {
            return r.read(out);
        }
        self.synchronize()?;
        out.resize(self.lens[i], 0);
        self.slot().regions[i].read_into(out)
    }
}

impl<M> Drop for DeviceBatch<M> {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else { return };
        slot.release.record(self.views.take());
        // A grown slot is freed here: its drop waits for the consumer's queued work on it.
        self.pool.slots.release(slot);
    }
}

/// A loader's GPU side: its device, its own stream and a fixed pool of device buffers.
pub struct DeviceStage {
    gpu: Arc<Gpu>,
    stream: Arc<Stream>,
    pool: Arc<Pool>,
    active: Active,
    /// Regions copied into buffers of their own.
    detached: Vec<usize>,
    /// The loader's trace recorder, if tracing is on.
    tracer: Option<Arc<Tracer>>,
    /// GPU decode of the samples the host left to it, and the tuner of its share.
    gpu_decode: Option<Arc<GpuDecode>>,
}

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

impl std::fmt::Debug for DeviceStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStage")
            .field("gpu", &self.gpu)
            .field("slots", &self.pool.slots.slots())
            .field("capacities", &self.pool.capacities)
            .finish()
    }
}

impl DeviceStage {
    /// Allocates `slots` device slots on `gpu`, each with one buffer per entry of
    /// `capacities` (bytes), plus a stream for the copies; the pool grows within
    /// `memory_limit` while the consumer keeps every device batch (`stoker::shell::grow`).
    pub fn new(gpu: Arc<Gpu>, capacities: Vec<usize>, slots: usize, memory_limit: Option<u64>) -> Result<Self> {
        if slots == 0 {
            return Err(Error::config("prefetch", "the device pool needs at least one slot"));
        }
        let stream = Arc::new(Stream::new(&gpu)?);
        let make: MakeSlot<DeviceSlot> = {
            let (gpu, capacities) = (gpu.clone(), capacities.clone());
            Arc::new(move || {
                let regions = capacities.iter().map(|&c| DeviceMem::new(&gpu, c)).collect::<Result<Vec<_>>>()?;
                Ok(DeviceSlot {
                    regions,
                    start: Arc::new(Event::new(&gpu, true)?),
                    ready: Arc::new(Event::new(&gpu, true)?),
                    release: Release::new(&gpu),
                    seq: 0,
                    meta: None,
                    lens: vec![],
                    side: vec![],
                })
            })
        };
        let slots = SlotPool::new(slots, capacities.iter().sum(), memory_limit, "device batch", make)?;
        let pool = Arc::new(Pool { slots, capacities, side: Arc::default() });
        Ok(DeviceStage {
            gpu,
            stream,
            pool,
            active: Active::default(),
            detached: vec![],
            tracer: None,
            gpu_decode: None,
        })
    }

    /// Decodes the samples the host leaves to the GPU (region 0's records) with `decode`.
    pub fn with_gpu_decode(mut self, decode: GpuDecode) -> Self {
        self.gpu_decode = Some(Arc::new(decode));
        self
    }

    /// The stage's GPU decode, when the host leaves samples to it.
    pub fn gpu_decode(&self) -> Option<&Arc<GpuDecode>> {
        self.gpu_decode.as_ref()
    }

    /// Copies regions `regions` (indexes into the capacities) into small buffers of their own
    /// instead of the slot, so that a consumer keeping them does not keep the slot: an image
    /// loader's labels (region 1). Out-of-range indexes are ignored.
    pub fn with_detached(mut self, regions: &[usize]) -> Self {
        self.detached = regions.iter().copied().filter(|&r| r < self.pool.capacities.len()).collect();
        self
    }

    /// Records the copies (`copy` spans with bytes and GPU time), the waits for a free device
    /// buffer and the consumer's waits and deliveries into `tracer` (a loader's
    /// [`stoker::Loader::tracer`]); `None` records nothing.
    pub fn with_tracer(mut self, tracer: Option<Arc<Tracer>>) -> Self {
        self.tracer = tracer;
        self
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device slots.
    pub fn slots(&self) -> usize {
        self.pool.slots.slots()
    }

    /// Bytes of device memory held by the pool.
    pub fn device_bytes(&self) -> usize {
        self.pool.slots.slots() * self.pool.capacities.iter().sum::<usize>()
    }

    /// Stops the running transfer (if any) now: its thread is joined, undelivered slots go
    /// back to the pool, and its iterator ends with a stale error naming `why`.
    pub fn stop(&self, why: &str) {
        self.active.retire(why);
    }

    /// Starts forwarding the batches that `poll` yields (a host iterator's `next_timeout`) to
    /// the GPU; a previous run of this stage is stopped first and its iterator becomes stale.
    /// Copies are counted in `telemetry`'s transfer stage, and the consumer's waits in its
    /// consumer stage.
    pub fn run<B, P>(&self, poll: P, telemetry: Option<Arc<Telemetry>>) -> Result<DeviceIter<B::Meta>>
    where
        B: HostBatch,
        P: FnMut(Duration) -> Next<B> + Send + 'static,
    {
        self.stop("a newer iteration of this loader started");
        let (run, done) = Run::new(self.pool.slots.slots(), self.pool.slots.free_tx.clone());
        let outcome = Arc::new(Mutex::new(None));
        let ctx = Transfer {
            gpu: self.gpu.clone(),
            stream: self.stream.clone(),
            pool: self.pool.clone(),
            cancel: run.cancel_flag(),
            telemetry: telemetry.clone(),
            detached: self.detached.clone(),
            tracer: self.tracer.clone(),
            gpu_decode: self.gpu_decode.clone(),
        };
        let (me, out) = (Arc::downgrade(&run), outcome.clone());
        run.spawn("stoker-transfer".into(), move || {
            let r = ctx.forward(poll, &done);
            if let Err(e) = r {
                *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            }
            if let Some(run) = me.upgrade() {
                run.finish();
            }
        })?;
        self.active.set(run.clone());
        let pool = &self.pool;
        let view = pool.slots.view();
        let observe = Observe::new(telemetry, self.tracer.clone(), None);
        let hooks = DeviceHooks { outcome };
        Ok(DeviceIter {
            pass: Pass::new(run, view, hooks, (0, None), FailureBudget::new(0, true), observe),
            pool: self.pool.clone(),
            gpu: self.gpu.clone(),
            _meta: std::marker::PhantomData,
        })
    }
}

impl Drop for DeviceStage {
    fn drop(&mut self) {
        self.stop("the loader was dropped");
    }
}

/// What the transfer thread works with.
struct Transfer {
    gpu: Arc<Gpu>,
    stream: Arc<Stream>,
    pool: Arc<Pool>,
    cancel: Arc<AtomicBool>,
    telemetry: Option<Arc<Telemetry>>,
    detached: Vec<usize>,
    tracer: Option<Arc<Tracer>>,
    gpu_decode: Option<Arc<GpuDecode>>,
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
    fn forward<B, P>(&self, mut poll: P, done: &Sender<DeviceSlot>) -> Result<()>
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

impl PassSlot for DeviceSlot {
    fn batch(&self) -> usize {
        self.seq
    }

    fn samples(&self) -> Option<usize> {
        None
    }
}

/// The transfer stage's part of a pass: the thread's error, delivered after the batches
/// before it.
struct DeviceHooks {
    outcome: Arc<Mutex<Option<Error>>>,
}

impl PassHooks for DeviceHooks {
    fn ended(&self) -> Option<Error> {
        self.outcome.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

/// Batches on the GPU, in order. Dropping it stops the transfer thread and the host pipeline.
pub struct DeviceIter<M> {
    pass: Pass<DeviceSlot, DeviceHooks>,
    pool: Arc<Pool>,
    gpu: Arc<Gpu>,
    _meta: std::marker::PhantomData<fn() -> M>,
}

impl<M> std::fmt::Debug for DeviceIter<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceIter").field("next", &self.pass.next_batch()).finish()
    }
}

impl<M: Send + 'static> DeviceIter<M> {
    /// Like [`Iterator::next`], but gives up after `timeout` ([`Next::NotYet`]).
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<DeviceBatch<M>> {
        let next = self.pass.poll_timeout(timeout);
        self.wrap(next)
    }

    fn wrap(&mut self, next: Next<DeviceSlot>) -> Next<DeviceBatch<M>> {
        match next {
            Next::Item(Ok(slot)) => {
                let r = self.hand_off(slot);
                if r.is_err() {
                    self.pass.shutdown();
                }
                Next::Item(r)
            }
            Next::Item(Err(e)) => Next::Item(Err(e)),
            Next::End => Next::End,
            Next::NotYet => Next::NotYet,
        }
    }

    /// Wraps a copied slot into the consumer's batch.
    fn hand_off(&self, mut slot: DeviceSlot) -> Result<DeviceBatch<M>> {
        let meta = match slot.meta.take().map(|m| m.downcast::<M>()) {
            Some(Ok(m)) => *m,
            _ => {
                self.pool.slots.release(slot);
                return Err(Error::Internal("a device batch without its description (please report this)".into()));
            }
        };
        let lens = std::mem::take(&mut slot.lens);
        let mut detached: Vec<Option<Arc<DeviceRegion>>> = (0..lens.len()).map(|_| None).collect();
        for (region, buf) in slot.side.drain(..) {
            if let Some(d) = detached.get_mut(region) {
                *d = Some(Arc::new(DeviceRegion {
                    buf: Some(buf),
                    region,
                    len: lens[region],
                    views: Views::new(slot.ready.clone()),
                    side: self.pool.side.clone(),
                    gpu: self.gpu.clone(),
                }));
            }
        }
        let views = Views::new(slot.ready.clone());
        Ok(DeviceBatch {
            slot: Some(slot),
            lens,
            meta,
            detached,
            pool: self.pool.clone(),
            views,
            gpu: self.gpu.clone(),
        })
    }
}

impl<M: Send + 'static> Iterator for DeviceIter<M> {
    type Item = Result<DeviceBatch<M>>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.pass.poll(None);
        self.wrap(next).into_item()
    }
}
