//! The consumer's side of a run: copied slots in order, wrapped into [`DeviceBatch`]es.

use super::batch::{DeviceBatch, DeviceRegion};
use super::pool::{DeviceSlot, Pool, Views};
use crate::driver::Gpu;
use std::sync::Arc;
use std::time::Duration;
use stoker::shell::grow::Lease;
use stoker::shell::pass::{Pass, PassSlot, ProducerError};
use stoker::{Error, Next, Result};

impl PassSlot for DeviceSlot {
    fn batch(&self) -> usize {
        self.seq
    }

    fn samples(&self) -> Option<usize> {
        None
    }
}

/// Batches on the GPU, in order. Dropping it stops the transfer thread and the host pipeline.
pub struct DeviceIter<M> {
    /// The pass over the transfer thread's run; its hooks are the thread's error, delivered
    /// after the batches before it.
    pub(super) pass: Pass<DeviceSlot, ProducerError>,
    pub(super) pool: Arc<Pool>,
    pub(super) gpu: Arc<Gpu>,
    pub(super) _meta: std::marker::PhantomData<fn() -> M>,
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

    fn wrap(&mut self, next: Next<Lease<DeviceSlot>>) -> Next<DeviceBatch<M>> {
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
    fn hand_off(&self, mut slot: Lease<DeviceSlot>) -> Result<DeviceBatch<M>> {
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

impl<M: Send + 'static> Iterator for DeviceIter<M> {
    type Item = Result<DeviceBatch<M>>;

    fn next(&mut self) -> Option<Self::Item> {
        let next = self.pass.poll(None);
        self.wrap(next).into_item()
    }
}
