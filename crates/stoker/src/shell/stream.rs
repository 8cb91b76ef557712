//! [`Stream`]: the consumer's side of a pass, the one iterator type stoker hands out: a loader
//! kind's ([`super::kind::Iter`]) and a transfer stage's (the CUDA crate's `DeviceIter`). The
//! pass delivers leased slots in order; the stream's [`Deliver`] turns each into the
//! consumer's batch. Polling with a time-out, the [`Iterator`], closing and what is left are
//! written here once.

use super::grow::Lease;
use super::pass::{Next, Pass, PassHooks, PassSlot};
use crate::error::Result;
use std::time::{Duration, Instant};

/// What turns a delivered slot into the consumer's batch.
pub trait Deliver: Send + 'static {
    /// The slots the pass delivers.
    type Slot: PassSlot;
    /// What the producer adds to the pass.
    type Hooks: PassHooks;
    /// The consumer's batch.
    type Batch;

    /// The consumer's batch of a delivered `slot` (lent: it goes back to its pool when the
    /// batch drops it); an error ends the pass.
    fn batch(&mut self, slot: Lease<Self::Slot>) -> Result<Self::Batch>;

    /// The pass ended well: its last batch delivered, or its producer found the end.
    fn completed(&mut self) {}
}

/// One pass, as the consumer iterates it: batches in order. Dropping it stops and joins every
/// thread of the pass.
pub struct Stream<D: Deliver> {
    pass: Pass<D::Slot, D::Hooks>,
    deliver: D,
}

impl<D: Deliver> std::fmt::Debug for Stream<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("of", &std::any::type_name::<D>())
            .field("next_batch", &self.pass.next_batch())
            .finish()
    }
}

impl<D: Deliver> Stream<D> {
    /// The consumer's side of `pass`, its slots made batches by `deliver`.
    pub fn new(pass: Pass<D::Slot, D::Hooks>, deliver: D) -> Self {
        Stream { pass, deliver }
    }

    /// Like [`Iterator::next`], but gives up after `timeout` ([`Next::NotYet`]): for callers
    /// that must stay responsive, such as the Python binding checking for Ctrl-C between waits.
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<D::Batch> {
        self.poll(Some(Instant::now() + timeout))
    }

    fn poll(&mut self, deadline: Option<Instant>) -> Next<D::Batch> {
        let got = self.pass.poll(deadline);
        if self.pass.take_completed() {
            self.deliver.completed();
        }
        match got {
            Next::Item(Ok(slot)) => {
                let batch = self.deliver.batch(slot);
                if batch.is_err() {
                    self.pass.shutdown();
                }
                Next::Item(batch)
            }
            Next::Item(Err(e)) => Next::Item(Err(e)),
            Next::End => Next::End,
            Next::NotYet => Next::NotYet,
        }
    }

    /// What turns this stream's slots into batches.
    pub fn delivery(&self) -> &D {
        &self.deliver
    }

    /// The next batch number to deliver.
    pub fn next_batch(&self) -> usize {
        self.pass.next_batch()
    }

    /// Batches left in this pass (0 when the producer decides the end).
    pub fn remaining(&self) -> usize {
        self.pass.remaining()
    }

    /// Stops counting this stream's caller as the consumer: for a stage that forwards the
    /// batches (the GPU transfer) and measures the real consumer itself.
    pub fn forwarding(mut self) -> Self {
        self.pass.observe.consumer = false;
        self
    }

    /// The producer's hooks of this pass.
    pub fn hooks(&self) -> &D::Hooks {
        self.pass.hooks()
    }

    /// Stops the iteration now (every thread joined, every buffer back in the pool).
    pub fn close(&mut self) {
        self.pass.shutdown();
    }
}

impl<D: Deliver> Iterator for Stream<D> {
    type Item = Result<D::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).into_item()
    }
}
