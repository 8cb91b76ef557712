//! The device pool: slots (a buffer per region, the copy's events), the release points recorded
//! on the consumer's streams, and the small buffers of detached regions.

use crate::driver::{DeviceMem, Event, Gpu};
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoker::shell::grow::SlotPool;
use stoker::Result;

/// The streams a batch was used on, for its release events.
#[derive(Default)]
pub(super) struct Consumers {
    pub(super) streams: Vec<usize>,
    pub(super) unknown: bool,
}

/// What the consumer's views of one copy share: the copy's `ready` event and the streams they
/// were used on.
pub(super) struct Views {
    pub(super) ready: Arc<Event>,
    pub(super) consumers: Mutex<Consumers>,
}

impl Views {
    pub(super) fn new(ready: Arc<Event>) -> Self {
        Views { ready, consumers: Mutex::new(Consumers::default()) }
    }

    pub(super) fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
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

    pub(super) fn take(&self) -> Consumers {
        std::mem::take(&mut *self.consumers.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The release points of one piece of device memory: events recorded on the consumer's
/// streams when it let go of the memory. The memory is written again only after they passed.
pub(super) struct Release {
    pub(super) events: Vec<Event>,
    pub(super) pending: usize,
    /// The memory was used on a stream stoker was not told about: wait for the whole device.
    pub(super) full_sync: bool,
    pub(super) gpu: Arc<Gpu>,
}

impl Release {
    pub(super) fn new(gpu: &Arc<Gpu>) -> Self {
        Release { events: vec![], pending: 0, full_sync: false, gpu: gpu.clone() }
    }

    /// Records a release event on every stream in `c` (on the consumer's thread: enqueues
    /// only, never waits).
    pub(super) fn record(&mut self, c: Consumers) {
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
    pub(super) fn events_passed(&self) -> bool {
        self.events[..self.pending].iter().all(|e| e.is_done().unwrap_or(false))
    }

    /// Waits (polling, so `cancel` is honoured) until every release point has passed.
    /// `Ok(false)`: cancelled.
    pub(super) fn wait(&mut self, cancel: &AtomicBool) -> Result<bool> {
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
    pub(super) fn wait_all(&mut self) {
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
pub struct DeviceSlot {
    pub(super) regions: Vec<DeviceMem>,
    pub(super) start: Arc<Event>,
    pub(super) ready: Arc<Event>,
    pub(super) release: Release,
    /// Sequence number of the batch in this run (what the ordered run waits for).
    pub(super) seq: usize,
    /// The batch's description (a `HostBatch::Meta`), until the consumer takes it.
    pub(super) meta: Option<Box<dyn Any + Send + Sync>>,
    /// Bytes copied per region.
    pub(super) lens: Vec<usize>,
    /// The detached regions of the batch in this slot: `(region, buffer)`.
    pub(super) side: Vec<(usize, SideBuf)>,
}

/// A small buffer a detached region is copied into (see
/// [`DeviceStage::with_detached`](super::DeviceStage::with_detached)).
pub(super) struct SideBuf {
    pub(super) mem: DeviceMem,
    pub(super) release: Release,
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

pub(super) struct Pool {
    /// The device slots (grown while the consumer keeps every device batch).
    pub(super) slots: SlotPool<DeviceSlot>,
    pub(super) capacities: Vec<usize>,
    /// Free buffers for detached regions.
    pub(super) side: Arc<SideList>,
}

/// Free buffers for detached regions, by region. Shared with the live [`DeviceRegion`](super::DeviceRegion)s
/// apart from the pool, so that kept labels never keep the pool's slots alive.
#[derive(Default)]
pub(super) struct SideList(pub(super) Mutex<Vec<(usize, SideBuf)>>);

impl SideList {
    pub(super) fn put(&self, region: usize, buf: SideBuf) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push((region, buf));
    }
}
