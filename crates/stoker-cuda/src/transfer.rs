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

use crate::driver::{DeviceMem, Event, Gpu, Stream};
use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use stoker::telemetry::{ConsumerClock, Telemetry};
use stoker::{DType, Error, Layout, Result};

const POLL: Duration = Duration::from_millis(20);

/// A host batch the transfer stage can copy: a fixed number of contiguous byte regions.
pub trait HostBatch: Send + 'static {
    /// What the consumer needs to know besides the bytes (shape, indices, ...).
    type Meta: Send + Sync + 'static;
    /// Appends the regions to copy, `(address, bytes)`, in order; always the same count. The
    /// memory stays valid while `self` lives.
    fn regions(&self, out: &mut Vec<(*const u8, usize)>);
    /// The batch's description.
    fn meta(&self) -> Self::Meta;
}

/// What a GPU image batch carries besides its bytes.
#[derive(Debug, Clone)]
pub struct ImageMeta {
    /// Batch number within the epoch.
    pub index: usize,
    /// The epoch.
    pub epoch: u64,
    /// Shape `[N, C, H, W]` or `[N, H, W, C]`.
    pub shape: [usize; 4],
    /// Element type of the images.
    pub dtype: DType,
    /// Layout of the images.
    pub layout: Layout,
    /// Dataset indices of the samples.
    pub indices: Vec<u32>,
}

/// The region capacities of an image loader's batches: the images buffer, then the labels.
pub fn image_regions(loader: &stoker::Loader) -> Vec<usize> {
    vec![loader.pool().batch_bytes(), loader.sampler().spec().batch_size * 8]
}

impl HostBatch for stoker::Batch {
    type Meta = ImageMeta;

    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        let data = self.data();
        out.push((data.as_ptr(), data.len()));
        out.push((self.labels_ptr().cast::<u8>(), self.len() * 8));
    }

    fn meta(&self) -> ImageMeta {
        ImageMeta {
            index: self.index(),
            epoch: self.epoch(),
            shape: self.shape(),
            dtype: self.dtype(),
            layout: self.layout(),
            indices: self.indices(),
        }
    }
}

/// What a GPU array batch carries besides its bytes.
#[derive(Debug, Clone)]
pub struct ArrayMeta {
    /// Batch number within the epoch.
    pub index: usize,
    /// Rows.
    pub len: usize,
    /// Dataset indices of the rows.
    pub indices: Vec<u32>,
}

impl HostBatch for stoker::arrays::ArrayBatch {
    type Meta = ArrayMeta;

    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        for c in 0..self.num_columns() {
            let col = self.column(c);
            out.push((col.as_ptr(), col.len()));
        }
    }

    fn meta(&self) -> ArrayMeta {
        ArrayMeta { index: self.index(), len: self.len(), indices: self.indices() }
    }
}

/// One device slot: a buffer per region, the copy's events, and the release events recorded
/// on the consumer's streams.
struct DeviceSlot {
    regions: Vec<DeviceMem>,
    start: Arc<Event>,
    ready: Arc<Event>,
    release: Vec<Event>,
    pending: usize,
    /// The batch was used on a stream stoker was not told about: wait for the whole device.
    full_sync: bool,
    gpu: Arc<Gpu>,
}

impl DeviceSlot {
    /// Waits (polling, so `cancel` is honoured) until every stream the last batch in this
    /// slot was used on has passed its release point. `Ok(false)`: cancelled.
    fn wait_released(&mut self, cancel: &AtomicBool) -> Result<bool> {
        for ev in &self.release[..self.pending] {
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
}

impl Drop for DeviceSlot {
    fn drop(&mut self) {
        // Never free memory that queued consumer work may still read.
        for ev in &self.release[..self.pending] {
            let _ = ev.synchronize();
        }
        if self.full_sync {
            let _ = self.gpu.synchronize();
        }
        let _ = self.ready.synchronize();
    }
}

struct Pool {
    free_tx: Sender<DeviceSlot>,
    free_rx: Receiver<DeviceSlot>,
    slots: usize,
    capacities: Vec<usize>,
    /// Batches the consumer has received and not yet dropped.
    held: AtomicUsize,
}

/// The streams a batch was used on, for its release events.
#[derive(Default)]
struct Consumers {
    streams: Vec<usize>,
    unknown: bool,
}

/// A batch in device memory. Its bytes are valid on a stream only after
/// [`DeviceBatch::sync_stream`] (or on the host after [`DeviceBatch::synchronize`]); dropping
/// it records release events on those streams and returns the memory to stoker's device pool.
pub struct DeviceBatch<M> {
    slot: Option<DeviceSlot>,
    lens: Vec<usize>,
    meta: M,
    pool: Arc<Pool>,
    consumers: Mutex<Consumers>,
    /// Handed to the consumer (counted in `pool.held`).
    received: AtomicBool,
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
        self.slot().gpu.ordinal()
    }

    /// Device address of region `i` (images = 0, labels = 1; or array columns in order).
    pub fn region_ptr(&self, i: usize) -> u64 {
        self.slot().regions[i].ptr()
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
        let mut c = self.consumers.lock().unwrap_or_else(|p| p.into_inner());
        match stream {
            None => c.unknown = true,
            Some(s) => {
                self.slot().ready.wait_on(s as cudarc::driver::sys::CUstream)?;
                if !c.streams.contains(&s) {
                    c.streams.push(s);
                }
            }
        }
        Ok(())
    }

    /// Blocks the calling thread until the copy has completed (for host-side readers).
    pub fn synchronize(&self) -> Result<()> {
        self.slot().ready.synchronize()
    }

    /// Reads region `i` back from the GPU into `out` (waits for the copy first): for checks and
    /// digests, never on a training path.
    pub fn read_region(&self, i: usize, out: &mut Vec<u8>) -> Result<()> {
        self.synchronize()?;
        out.resize(self.lens[i], 0);
        self.slot().regions[i].read_into(out)
    }
}

impl<M> Drop for DeviceBatch<M> {
    fn drop(&mut self) {
        let Some(mut slot) = self.slot.take() else { return };
        let c = std::mem::take(&mut *self.consumers.lock().unwrap_or_else(|p| p.into_inner()));
        slot.full_sync |= c.unknown;
        for s in c.streams {
            if slot.release.len() == slot.pending {
                match Event::new(&slot.gpu, false) {
                    Ok(ev) => slot.release.push(ev),
                    Err(_) => {
                        slot.full_sync = true;
                        continue;
                    }
                }
            }
            let k = slot.pending;
            if slot.release[k].record(s as cudarc::driver::sys::CUstream).is_ok() {
                slot.pending += 1;
            } else {
                slot.full_sync = true;
            }
        }
        if self.received.load(Ordering::Acquire) {
            self.pool.held.fetch_sub(1, Ordering::AcqRel);
        }
        let _ = self.pool.free_tx.send(slot);
    }
}

/// Stop flag and thread of one running transfer.
struct Run {
    cancel: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Run {
    fn stop(&self) {
        self.cancel.store(true, Ordering::Release);
        let t = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

/// A loader's GPU side: its device, its own stream and a fixed pool of device buffers.
pub struct DeviceStage {
    gpu: Arc<Gpu>,
    stream: Arc<Stream>,
    pool: Arc<Pool>,
    active: Mutex<Option<Arc<Run>>>,
}

impl std::fmt::Debug for DeviceStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStage")
            .field("gpu", &self.gpu)
            .field("slots", &self.pool.slots)
            .field("capacities", &self.pool.capacities)
            .finish()
    }
}

impl DeviceStage {
    /// Allocates `slots` device slots on `gpu`, each with one buffer per entry of
    /// `capacities` (bytes), plus a stream for the copies.
    pub fn new(gpu: Arc<Gpu>, capacities: Vec<usize>, slots: usize) -> Result<Self> {
        if slots == 0 {
            return Err(Error::config("prefetch", "the device pool needs at least one slot"));
        }
        let stream = Arc::new(Stream::new(&gpu)?);
        let (free_tx, free_rx) = bounded(slots);
        for _ in 0..slots {
            let regions = capacities.iter().map(|&c| DeviceMem::new(&gpu, c)).collect::<Result<Vec<_>>>()?;
            let slot = DeviceSlot {
                regions,
                start: Arc::new(Event::new(&gpu, true)?),
                ready: Arc::new(Event::new(&gpu, true)?),
                release: vec![],
                pending: 0,
                full_sync: false,
                gpu: gpu.clone(),
            };
            free_tx.send(slot).map_err(|_| Error::Internal("device pool channel full".into()))?;
        }
        let pool = Arc::new(Pool { free_tx, free_rx, slots, capacities, held: AtomicUsize::new(0) });
        Ok(DeviceStage { gpu, stream, pool, active: Mutex::new(None) })
    }

    /// The device.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Device slots.
    pub fn slots(&self) -> usize {
        self.pool.slots
    }

    /// Bytes of device memory held by the pool.
    pub fn device_bytes(&self) -> usize {
        self.pool.slots * self.pool.capacities.iter().sum::<usize>()
    }

    /// Starts forwarding the batches that `poll` yields (a host iterator's `next_timeout`) to
    /// the GPU; stops any previous run of this stage first. Copies are counted in `telemetry`'s
    /// transfer stage, and the consumer's waits in its consumer stage.
    pub fn run<B, P>(&self, poll: P, telemetry: Option<Arc<Telemetry>>) -> Result<DeviceIter<B::Meta>>
    where
        B: HostBatch,
        P: FnMut(Duration) -> Option<Option<Result<B>>> + Send + 'static,
    {
        if let Some(old) = self.active.lock().unwrap_or_else(|p| p.into_inner()).take() {
            old.stop();
        }
        let run = Arc::new(Run { cancel: AtomicBool::new(false), thread: Mutex::new(None) });
        let (tx, rx) = bounded(self.pool.slots);
        let (gpu, stream, pool, r, tel) =
            (self.gpu.clone(), self.stream.clone(), self.pool.clone(), run.clone(), telemetry.clone());
        let handle = std::thread::Builder::new()
            .name("stoker-transfer".into())
            .spawn(move || {
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    transfer_loop(&gpu, &stream, &pool, &r.cancel, poll, &tx, tel.as_deref())
                }));
                if res.is_err() {
                    let _ = tx.send(Err(Error::Internal("the transfer thread panicked".into())));
                }
            })
            .map_err(|e| Error::Internal(format!("cannot start the transfer thread: {e}")))?;
        *run.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        *self.active.lock().unwrap_or_else(|p| p.into_inner()) = Some(run.clone());
        Ok(DeviceIter { rx, run, pool: self.pool.clone(), telemetry, clock: ConsumerClock::default(), done: false })
    }
}

impl Drop for DeviceStage {
    fn drop(&mut self) {
        if let Some(run) = self.active.lock().unwrap_or_else(|p| p.into_inner()).take() {
            run.stop();
        }
    }
}

fn transfer_loop<B, P>(
    gpu: &Gpu,
    stream: &Stream,
    pool: &Arc<Pool>,
    cancel: &AtomicBool,
    mut poll: P,
    out: &Sender<Result<DeviceBatch<B::Meta>>>,
    tel: Option<&Telemetry>,
) where
    B: HostBatch,
    P: FnMut(Duration) -> Option<Option<Result<B>>>,
{
    if let Err(e) = gpu.bind_forever() {
        let _ = out.send(Err(e));
        return;
    }
    let mut regions = Vec::new();
    loop {
        if cancel.load(Ordering::Acquire) {
            return;
        }
        let host = match poll(POLL) {
            None => continue,
            Some(None) => return,
            Some(Some(Err(e))) => {
                let _ = out.send(Err(e));
                return;
            }
            Some(Some(Ok(b))) => b,
        };
        let t0 = Instant::now();
        let mut slot = loop {
            if cancel.load(Ordering::Acquire) {
                return;
            }
            match pool.free_rx.recv_timeout(POLL) {
                Ok(s) => break s,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        let step = (|| -> Result<bool> {
            if !slot.wait_released(cancel)? {
                return Ok(false);
            }
            if let Some(t) = tel {
                t.transfer.add_wait(t0.elapsed());
            }
            regions.clear();
            host.regions(&mut regions);
            if regions.len() != slot.regions.len() {
                return Err(Error::Internal(format!(
                    "a batch of {} regions for a device slot of {}",
                    regions.len(),
                    slot.regions.len()
                )));
            }
            slot.start.record(stream.raw())?;
            for (&(src, len), dst) in regions.iter().zip(&slot.regions) {
                // SAFETY: `host` (which owns the source memory, pinned by the loader's
                // allocator) is kept alive below until the `ready` event has completed.
                unsafe { dst.copy_from_host(src, len, stream)? };
            }
            slot.ready.record(stream.raw())?;
            Ok(true)
        })();
        match step {
            Ok(true) => {}
            Ok(false) => {
                let _ = pool.free_tx.send(slot);
                return;
            }
            Err(e) => {
                // Make sure no copy still reads the host batch before it is dropped.
                let _ = stream.synchronize();
                let _ = pool.free_tx.send(slot);
                let _ = out.send(Err(e));
                return;
            }
        }
        let (start, ready) = (slot.start.clone(), slot.ready.clone());
        let lens: Vec<usize> = regions.iter().map(|r| r.1).collect();
        let bytes: usize = lens.iter().sum();
        let batch = DeviceBatch {
            slot: Some(slot),
            lens,
            meta: host.meta(),
            pool: pool.clone(),
            consumers: Mutex::new(Consumers::default()),
            received: AtomicBool::new(false),
        };
        let sent = out.send(Ok(batch)).is_ok();
        // The consumer already has the batch (its stream waits on `ready`); this thread waits
        // for the copy only to hand the pinned host buffer back to its pool.
        let copied = ready.synchronize();
        let ms = copied.as_ref().ok().and_then(|_| ready.elapsed_since(&start).ok());
        drop(host);
        if let Err(e) = copied {
            let _ = out.send(Err(e));
            return;
        }
        if let (Some(t), Some(ms)) = (tel, ms) {
            t.add_transfer(bytes, Duration::from_secs_f64(f64::from(ms) * 1e-3));
        }
        if !sent {
            return;
        }
    }
}

/// Batches on the GPU, in order. Dropping it stops the transfer thread and the host pipeline.
pub struct DeviceIter<M> {
    rx: Receiver<Result<DeviceBatch<M>>>,
    run: Arc<Run>,
    pool: Arc<Pool>,
    telemetry: Option<Arc<Telemetry>>,
    clock: ConsumerClock,
    done: bool,
}

impl<M> std::fmt::Debug for DeviceIter<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceIter").field("done", &self.done).finish()
    }
}

impl<M> DeviceIter<M> {
    /// Like [`Iterator::next`], but gives up after `timeout`: `None` means "not yet",
    /// `Some(None)` the end of the pass.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<Option<Result<DeviceBatch<M>>>> {
        if self.done {
            return Some(None);
        }
        self.clock.waiting(self.telemetry.as_deref().map(|t| &t.consumer));
        match self.rx.recv_timeout(timeout) {
            Ok(Ok(b)) => {
                b.received.store(true, Ordering::Release);
                self.pool.held.fetch_add(1, Ordering::AcqRel);
                self.clock.delivered(self.telemetry.as_deref().map(|t| &t.consumer));
                Some(Some(Ok(b)))
            }
            Ok(Err(e)) => {
                self.finish();
                Some(Some(Err(e)))
            }
            Err(RecvTimeoutError::Timeout) => {
                // Waiting while holding every device buffer would never end: say so instead.
                let held = self.pool.held.load(Ordering::Acquire);
                if held >= self.pool.slots {
                    self.finish();
                    return Some(Some(Err(Error::Memory(format!(
                        "all {held} device batch buffers are held by the consumer, so no new batch can be copied; \
                         release batches (drop tensors) sooner or raise prefetch"
                    )))));
                }
                None
            }
            Err(RecvTimeoutError::Disconnected) => {
                self.finish();
                Some(None)
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        self.run.stop();
    }
}

impl<M> Iterator for DeviceIter<M> {
    type Item = Result<DeviceBatch<M>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(r) = self.next_timeout(Duration::from_secs(3600)) {
                return r;
            }
        }
    }
}

impl<M> Drop for DeviceIter<M> {
    fn drop(&mut self) {
        self.run.stop();
    }
}
