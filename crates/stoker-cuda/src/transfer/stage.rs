//! A loader's GPU side (its device, stream and pool) and how it starts a run of the transfer
//! thread.

use super::copy::{GpuDecode, Transfer};
use super::iter::{DeviceIter, HandOff};
use super::pool::{DeviceSlot, Pool, Release};
use crate::driver::{DeviceMem, Event, Gpu, Stream};
use std::sync::Arc;
use std::time::Duration;
use stoker::shell::epochs::Active;
use stoker::shell::grow::{MakeSlot, SlotPool};
use stoker::shell::kind::{HostBatch, Iter, Kind};
use stoker::shell::ordered::Run;
use stoker::shell::pass::{FailureBudget, Observe, Pass, ProducerError};
use stoker::telemetry::Telemetry;
use stoker::trace::Tracer;
use stoker::{Error, Next, Result};

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

    /// Starts forwarding a loader's iteration `host` to the GPU ([`DeviceStage::run`]): the stage
    /// measures the consumer's waits, and records the copies into the loader's counters.
    pub fn forward<K: Kind>(&self, host: Iter<K>) -> Result<DeviceIter<<K::Batch as HostBatch>::Meta>> {
        let telemetry = host.telemetry().clone();
        let mut host = host.forwarding();
        self.run(move |t| host.next_timeout(t), Some(telemetry))
    }

    /// Starts forwarding the batches that `poll` yields (a host iterator's `next_timeout`) to
    /// the GPU; a previous run of this stage is stopped first and its iterator becomes stale.
    /// Copies are counted in `telemetry`'s transfer stage, and the consumer's waits in its
    /// consumer stage.
    fn run<B, P>(&self, poll: P, telemetry: Option<Arc<Telemetry>>) -> Result<DeviceIter<B::Meta>>
    where
        B: HostBatch,
        P: FnMut(Duration) -> Next<B> + Send + 'static,
    {
        self.stop("a newer iteration of this loader started");
        let (run, done) = Run::new(self.pool.slots.slots(), self.pool.slots.free_tx.clone());
        let outcome = ProducerError::default();
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
                out.set(e);
            }
            if let Some(run) = me.upgrade() {
                run.finish();
            }
        })?;
        self.active.set(run.clone());
        let pool = &self.pool;
        let view = pool.slots.view();
        let observe = Observe::new(telemetry, self.tracer.clone(), None);
        let pass = Pass::new(run, view, outcome, (0, None), FailureBudget::new(0, true), observe);
        let hand_off = HandOff { pool: self.pool.clone(), gpu: self.gpu.clone(), _meta: std::marker::PhantomData };
        Ok(stoker::shell::stream::Stream::new(pass, hand_off))
    }
}

impl Drop for DeviceStage {
    fn drop(&mut self) {
        self.stop("the loader was dropped");
    }
}
