//! The consumer's side of a run: copied slots in order, wrapped into [`DeviceBatch`]es.

use super::batch::{DeviceBatch, DeviceRegion};
use super::pool::{DeviceSlot, Pool, Views};
use crate::driver::Gpu;
use std::sync::Arc;
use stoker::shell::grow::Lease;
use stoker::shell::pass::{PassSlot, ProducerError};
use stoker::shell::stream::{Deliver, Stream};
use stoker::{Error, Result};

impl PassSlot for DeviceSlot {
    fn batch(&self) -> usize {
        self.seq
    }

    fn samples(&self) -> Option<usize> {
        None
    }
}

/// Batches on the GPU, in order: the shell's stream over the transfer thread's pass, its hooks
/// the thread's error (delivered after the batches before it). Dropping it stops the transfer
/// thread and the host pipeline.
pub type DeviceIter<M> = Stream<HandOff<M>>;

/// The transfer stage's side of an iteration: a copied slot becomes a [`DeviceBatch`].
pub struct HandOff<M> {
    pub(super) pool: Arc<Pool>,
    pub(super) gpu: Arc<Gpu>,
    pub(super) _meta: std::marker::PhantomData<fn() -> M>,
}

impl<M: Send + 'static> Deliver for HandOff<M> {
    type Slot = DeviceSlot;
    type Hooks = ProducerError;
    type Batch = DeviceBatch<M>;

    /// Wraps a copied slot into the consumer's batch.
    fn batch(&mut self, mut slot: Lease<DeviceSlot>) -> Result<DeviceBatch<M>> {
        let Some(Ok(meta)) = slot.meta.take().map(|m| m.downcast::<M>()) else {
            return Err(Error::Internal("a device batch without its description (please report this)".into()));
        };
        let meta = *meta;
        let lens = std::mem::take(&mut slot.lens);
        let mut detached: Vec<Option<Arc<DeviceRegion>>> = (0..lens.len()).map(|_| None).collect();
        let ready = slot.ready.clone();
        for (region, buf) in slot.side.drain(..) {
            if let Some(d) = detached.get_mut(region) {
                *d = Some(Arc::new(DeviceRegion {
                    buf: Some(buf),
                    region,
                    len: lens[region],
                    views: Views::new(ready.clone()),
                    side: self.pool.side.clone(),
                    gpu: self.gpu.clone(),
                }));
            }
        }
        let views = Views::new(ready);
        Ok(DeviceBatch { slot, lens, meta, detached, views, gpu: self.gpu.clone() })
    }
}
