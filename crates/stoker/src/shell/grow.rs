//! How a pool of batch slots grows while the consumer keeps its batches, within the loader's
//! memory limit: the one rule for every pool (host batch buffers of every loader kind, and the
//! device buffers of the CUDA stage).
//!
//! A pool starts with its base slots (prefetch + 2): the fixed set that the producers cycle
//! through, zero-copy, with no allocation per batch. A consumer that keeps batches (an eval
//! loop that keeps its outputs' inputs, `list(loader)`) could hold every slot, and then no
//! batch can be made. Then, and only then, the pool makes one more slot, as long as all its
//! slots together stay within the limit (`memory_limit`, else a quarter of the memory
//! available when the loader was made); past it the wait is a [`Error::Memory`] that says how
//! many batches and bytes the consumer holds. A slot the consumer gives back while the pool is
//! larger than its base is freed instead of kept, so the pool shrinks back to its base and
//! never has more than its base slots in the producers' hands (the reorder buffer and the
//! queues are sized for that).

use crate::error::{Error, Result};
use crossbeam_channel::Sender;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The growth limit when no `memory_limit` is given and the available memory is unknown.
const FALLBACK_LIMIT: u64 = 4 << 30;

/// The slot count and byte limit of one pool.
#[derive(Debug)]
pub struct Growth {
    /// Slots made with the pool (never freed while the pool lives).
    base: usize,
    /// Slots that exist now: `base` and the grown ones not given back yet.
    total: AtomicUsize,
    /// Bytes of one slot.
    bytes_each: u64,
    /// The most bytes all slots may take together.
    limit: u64,
    /// Whether `limit` is the user's `memory_limit` (for the message).
    given: bool,
    /// What a slot holds, for messages: "batch", "device batch".
    what: &'static str,
}

impl Growth {
    /// The growth of a pool of `base` slots of `bytes_each` bytes under `memory_limit` (`None`:
    /// a quarter of `MemAvailable` now).
    pub fn new(base: usize, bytes_each: usize, memory_limit: Option<u64>, what: &'static str) -> Self {
        let limit = memory_limit
            .unwrap_or_else(|| crate::shell::store::mem_available().map_or(FALLBACK_LIMIT, |m| m / 4))
            .max(base as u64 * bytes_each as u64);
        Growth {
            base,
            total: AtomicUsize::new(base),
            bytes_each: bytes_each as u64,
            limit,
            given: memory_limit.is_some(),
            what,
        }
    }

    /// Slots made with the pool.
    pub fn base(&self) -> usize {
        self.base
    }

    /// Slots that exist now.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Acquire)
    }

    /// Called while the consumer waits and holds `held` batches: `Ok(false)` when it does not
    /// hold every slot (nothing to do), `Ok(true)` when one more slot was reserved (the caller
    /// makes it, or calls [`Growth::unreserve`] if that fails), or the error that says how
    /// much the consumer holds when one more slot would pass the limit.
    pub fn reserve(&self, held: usize) -> Result<bool> {
        let total = self.total();
        if held < total {
            return Ok(false);
        }
        let after = (total as u64 + 1).saturating_mul(self.bytes_each);
        if after > self.limit {
            let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
            let limit =
                if self.given { "memory_limit" } else { "the default limit (a quarter of the available memory)" };
            return Err(Error::Memory(format!(
                "the consumer holds all {held} {what} buffers ({:.1} MiB, {} bytes each); one more would pass {limit} \
                 of {:.1} MiB. Release batches (drop tensors) sooner, or raise memory_limit",
                mib(held as u64 * self.bytes_each),
                self.bytes_each,
                mib(self.limit),
                what = self.what,
            )));
        }
        self.total.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }

    /// Gives back a reservation whose slot could not be made.
    pub fn unreserve(&self) {
        self.total.fetch_sub(1, Ordering::AcqRel);
    }

    /// A slot the consumer held comes back (`held` counts the consumer's batches): to the
    /// pool's `free` queue, or freed when the pool has grown past its base.
    pub fn release<S>(&self, held: &AtomicUsize, slot: S, free: &Sender<S>) {
        held.fetch_sub(1, Ordering::AcqRel);
        let shrink =
            self.total.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| (t > self.base).then(|| t - 1)).is_ok();
        if !shrink {
            let _ = free.send(slot);
        }
    }
}

/// A pool of batch slots of one kind (arrays, tokens, device batches): its free queue, what
/// the consumer holds, its growth and how a slot is made. What a loader kind keeps instead of
/// the same six fields each.
pub struct SlotPool<S> {
    /// Free slots go back here...
    pub free_tx: Sender<S>,
    /// ... and producers take them from here.
    pub free_rx: crossbeam_channel::Receiver<S>,
    /// Batches the consumer holds now.
    pub held: std::sync::Arc<AtomicUsize>,
    growth: std::sync::Arc<Growth>,
    make: MakeSlot<S>,
}

impl<S> SlotPool<S> {
    /// A pool of `slots` slots made by `make` (`bytes_each` bytes each), grown within
    /// `memory_limit` while the consumer holds every one ([`Growth`]).
    pub fn new(
        slots: usize,
        bytes_each: usize,
        memory_limit: Option<u64>,
        what: &'static str,
        make: MakeSlot<S>,
    ) -> Result<Self> {
        let (free_tx, free_rx) = crossbeam_channel::bounded(slots);
        for _ in 0..slots {
            free_tx.send(make()?).map_err(|_| Error::Internal("the pool's free queue is full".into()))?;
        }
        let growth = std::sync::Arc::new(Growth::new(slots, bytes_each, memory_limit, what));
        Ok(SlotPool { free_tx, free_rx, held: std::sync::Arc::default(), growth, make })
    }

    /// Slots made up front.
    pub fn slots(&self) -> usize {
        self.growth.base()
    }

    /// Batches the consumer holds now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// A slot the consumer held comes back ([`Growth::release`]).
    pub fn release(&self, slot: S) {
        self.growth.release(&self.held, slot, &self.free_tx);
    }

    /// A slot that was not delivered goes back to the free queue.
    pub fn give_back(&self, slot: S) {
        let _ = self.free_tx.send(slot);
    }

    /// The pass's view of the pool.
    pub fn view(&self) -> PoolView<S> {
        PoolView {
            free: self.free_tx.clone(),
            held: self.held.clone(),
            growth: self.growth.clone(),
            make: self.make.clone(),
        }
    }
}

/// A slot lent to the consumer (a delivered batch's buffer): counted as held while it lives,
/// and back to its pool when dropped ([`Growth::release`]: freed instead while the pool is
/// larger than its base). Every kind's batch holds its slot as a lease, so none returns a
/// buffer by hand.
pub struct Lease<S> {
    slot: Option<S>,
    pool: Arc<PoolView<S>>,
}

impl<S> Lease<S> {
    /// Lends `slot` of `pool` to the consumer, counted as held.
    pub fn new(slot: S, pool: Arc<PoolView<S>>) -> Self {
        pool.held.fetch_add(1, Ordering::AcqRel);
        Lease { slot: Some(slot), pool }
    }
}

impl<S: std::fmt::Debug> std::fmt::Debug for Lease<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Lease").field(&self.slot).finish()
    }
}

impl<S> std::ops::Deref for Lease<S> {
    type Target = S;

    fn deref(&self) -> &S {
        self.slot.as_ref().expect("a lease holds its slot until dropped")
    }
}

impl<S> std::ops::DerefMut for Lease<S> {
    fn deref_mut(&mut self) -> &mut S {
        self.slot.as_mut().expect("a lease holds its slot until dropped")
    }
}

impl<S> Drop for Lease<S> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool.growth.release(&self.pool.held, slot, &self.pool.free);
        }
    }
}

/// Makes one more slot of a pool (when it grows: [`Growth`]).
pub type MakeSlot<S> = Arc<dyn Fn() -> Result<S> + Send + Sync>;

/// Where slots go back to, how many the consumer holds and how the pool grows: a pass's view
/// of its pool.
pub struct PoolView<S> {
    /// Returns a slot to the pool.
    pub free: Sender<S>,
    /// Batches the consumer holds now (a delivered batch decrements it when dropped).
    pub held: Arc<AtomicUsize>,
    /// The pool's slot count and byte limit.
    pub growth: Arc<Growth>,
    /// Makes a slot when the consumer holds every one and the limit has room.
    pub make: MakeSlot<S>,
}

impl<S> PoolView<S> {
    pub(super) fn give_back(&self, slot: S) {
        let _ = self.free.send(slot);
    }

    /// While the wait goes on: when the consumer holds every slot, one more is made (within
    /// the limit) or the wait ends with the error that says how much is held.
    pub(super) fn all_held(&self) -> Option<Error> {
        match self.growth.reserve(self.held.load(Ordering::Acquire)) {
            Ok(false) => None,
            Ok(true) => match (self.make)() {
                Ok(slot) => {
                    self.give_back(slot);
                    None
                }
                Err(e) => {
                    self.growth.unreserve();
                    Some(e)
                }
            },
            Err(e) => Some(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_only_when_every_slot_is_held_and_within_the_limit() {
        let g = Growth::new(2, 100, Some(450), "batch");
        assert!(!g.reserve(1).unwrap(), "a free slot is coming: no growth");
        assert!(g.reserve(2).unwrap());
        assert!(g.reserve(3).unwrap());
        assert_eq!(g.total(), 4);
        let e = g.reserve(4).unwrap_err().to_string();
        assert!(e.starts_with("memory limit: the consumer holds all 4 batch buffers (0.0 MiB, 100 bytes each)"), "{e}");
        assert!(e.contains("memory_limit of 0.0 MiB"), "{e}");
        g.unreserve();
        assert_eq!(g.total(), 3);
    }

    #[test]
    fn given_back_slots_shrink_the_pool_to_its_base() {
        let g = Growth::new(2, 100, Some(1000), "batch");
        let (tx, rx) = crossbeam_channel::unbounded();
        let held = AtomicUsize::new(4);
        assert!(g.reserve(2).unwrap() && g.reserve(3).unwrap());
        for k in 0..4 {
            g.release(&held, k, &tx);
        }
        assert_eq!(held.load(Ordering::Relaxed), 0);
        assert_eq!(g.total(), 2);
        // The first two were freed (the pool was past its base), the last two kept.
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn the_limit_is_at_least_the_base_pool() {
        let g = Growth::new(3, 1000, Some(10), "batch");
        assert_eq!(g.limit, 3000);
        assert!(g.reserve(3).is_err());
    }
}
