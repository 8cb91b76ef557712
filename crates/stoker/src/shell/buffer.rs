//! The batch buffer pool: a fixed set of slots sized once from the plan's declared sample shape.
//!
//! A batch is scheduled only when a slot is free, which is the whole memory cap and backpressure
//! mechanism. Workers write disjoint sample regions of a slot through raw pointers (the one
//! `unsafe` surface, kept in this file); an atomic countdown marks the batch complete. A slot
//! returns to the pool when the [`crate::image::pipeline::Batch`] viewing it is dropped. In steady state nothing
//! here allocates.
//!
//! Where the memory comes from is the pool's [`HostAllocator`]: the global heap by default, or
//! page-locked (pinned) memory from the CUDA driver when batches go to a GPU (`stoker-cuda`
//! implements the allocator; this crate never talks to CUDA). The memory cap counts every byte
//! the allocator hands out, pinned or not.

use super::grow::{MakeSlot, SlotPool};
use crate::error::{Error, Result};
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every buffer: a cache line, and enough for any element type.
pub const ALIGN: usize = 64;

/// Memory handed out by a [`HostAllocator`]: owned by the value, freed when it is dropped.
///
/// # Safety
/// An implementor guarantees that [`HostMemory::ptr`] points to `len()` bytes that are
/// initialised (zeroed when handed out), aligned to at least [`ALIGN`], valid for reads and
/// writes from any thread, and stay at the same address until the value is dropped.
pub unsafe trait HostMemory: Send + Sync {
    /// First byte.
    fn ptr(&self) -> NonNull<u8>;
    /// Bytes available.
    fn len(&self) -> usize;
    /// Whether the allocation is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where batch buffers come from: the heap ([`HeapAllocator`]) or, with CUDA, page-locked
/// memory that the GPU's copy engine reads directly.
pub trait HostAllocator: Send + Sync + std::fmt::Debug {
    /// Allocates `len` zeroed bytes aligned to at least [`ALIGN`].
    fn allocate(&self, len: usize) -> Result<Box<dyn HostMemory>>;
    /// `"pageable"` or `"pinned"`, for reports.
    fn kind(&self) -> &'static str;
}

/// The global heap (pageable memory).
#[derive(Debug, Default, Clone, Copy)]
pub struct HeapAllocator;

impl HostAllocator for HeapAllocator {
    fn allocate(&self, len: usize) -> Result<Box<dyn HostMemory>> {
        Ok(Box::new(HeapMemory::new(len)?))
    }
    fn kind(&self) -> &'static str {
        "pageable"
    }
}

/// A zeroed, 64-byte-aligned heap allocation.
struct HeapMemory {
    ptr: NonNull<u8>,
    len: usize,
    /// Whether the memory is an anonymous mapping (large buffers) rather than the allocator's.
    mapped: bool,
}

/// From this size on, buffers are anonymous mappings: page-aligned and zeroed by the kernel,
/// instead of by a `memset` of the whole buffer (which the aligned allocator needs), and
/// populated when made (`MAP_POPULATE`: one call instead of a page fault per 4 KiB page on
/// first use, ~150 000 for a 600 MiB pool; measured ~5% less CPU for a 2000-image epoch).
/// Transparent huge pages were measured slower (see BENCHMARKS.md).
const MAP_FROM: usize = 1 << 20;

impl HeapMemory {
    fn new(len: usize) -> Result<Self> {
        if len >= MAP_FROM {
            // SAFETY: a fresh private anonymous mapping; the result is checked against
            // MAP_FAILED before use.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED {
                if let Some(ptr) = NonNull::new(ptr.cast::<u8>()) {
                    return Ok(HeapMemory { ptr, len, mapped: true });
                }
            }
            // Fall through to the allocator, which reports out-of-memory its own way.
        }
        let layout = Layout::from_size_align(len.max(1), ALIGN)
            .map_err(|_| Error::Memory(format!("cannot lay out a buffer of {len} bytes")))?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::Memory(format!("out of memory allocating {len} bytes")))?;
        Ok(HeapMemory { ptr, len, mapped: false })
    }
}

// SAFETY: zeroed by `alloc_zeroed` or by the kernel (anonymous mappings), at least 64-aligned
// (mappings are page-aligned), owned until drop, plain memory usable from any thread
// (Send/Sync below).
unsafe impl HostMemory for HeapMemory {
    fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: an owned allocation with no thread affinity.
unsafe impl Send for HeapMemory {}
// SAFETY: `&HeapMemory` only exposes the pointer; access is coordinated by the pool's users.
unsafe impl Sync for HeapMemory {}

impl Drop for HeapMemory {
    fn drop(&mut self) {
        if self.mapped {
            // SAFETY: `ptr`/`len` are exactly what mmap returned; unmapped once.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            return;
        }
        let layout = Layout::from_size_align(self.len.max(1), ALIGN).expect("layout was valid at allocation");
        // SAFETY: allocated in `new` with this exact layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// A zeroed, aligned allocation from a [`HostAllocator`], written through raw pointers.
pub(crate) struct RawBuf {
    ptr: NonNull<u8>,
    len: usize,
    _mem: Box<dyn HostMemory>,
}

// SAFETY: RawBuf is an owned allocation; concurrent access is coordinated by the pipeline
// (disjoint sample regions while filling, shared reads after completion).
unsafe impl Send for RawBuf {}
// SAFETY: see above; `&RawBuf` only hands out raw pointers and, through unsafe methods whose
// contracts require disjointness, slices.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    pub(crate) fn new_in(len: usize, alloc: &dyn HostAllocator) -> Result<Self> {
        let mem = alloc.allocate(len)?;
        if mem.len() < len || !(mem.ptr().as_ptr() as usize).is_multiple_of(ALIGN) {
            return Err(Error::Internal(format!("{} allocator returned a short or misaligned buffer", alloc.kind())));
        }
        Ok(RawBuf { ptr: mem.ptr(), len, _mem: mem })
    }

    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// # Safety
    /// No other live reference may overlap `off..off + len` while the slice lives, and the
    /// range must be in bounds.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut(&self, off: usize, len: usize) -> &mut [u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: in bounds and unaliased per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) }
    }

    /// # Safety
    /// No writer may be active on `0..len` while the slice lives.
    pub(crate) unsafe fn slice(&self, len: usize) -> &[u8] {
        debug_assert!(len <= self.len);
        // SAFETY: in bounds and not concurrently written per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) }
    }
}

/// Sample status within a slot.
pub(crate) const PENDING: u8 = 0;
pub(crate) const OK: u8 = 1;
pub(crate) const FAILED: u8 = 2;

/// One batch's worth of storage plus its bookkeeping.
pub struct Slot {
    pub(crate) data: RawBuf,
    labels: RawBuf,
    pub(crate) sample_bytes: usize,
    indices: Box<[AtomicU32]>,
    status: Box<[AtomicU8]>,
    /// Positions whose bytes are a GPU decode record ([`crate::image::gpu_job`]), not pixels.
    deferred: Box<[std::sync::atomic::AtomicBool]>,
    /// Samples scheduled in the current batch.
    pub(crate) count: AtomicUsize,
    /// Samples not yet finished.
    pub(crate) remaining: AtomicUsize,
    /// Batch number within the epoch.
    pub(crate) batch: AtomicUsize,
    /// Samples delivered after compaction.
    pub(crate) len: AtomicUsize,
    /// Failures of the current batch: (dataset index, error).
    pub(crate) errors: Mutex<Vec<(u32, Error)>>,
    /// Further per-sample regions (an image-text pair's caption ids and mask): each buffer and
    /// its bytes per sample, compacted with the samples.
    extras: Box<[(RawBuf, usize)]>,
}

impl Slot {
    fn new(capacity: usize, sample_bytes: usize, extras: &[usize], alloc: &dyn HostAllocator) -> Result<Self> {
        // The sizes are checked by `crate::args::batch_bytes` for configured loaders; checked
        // again here, and the bookkeeping allocated fallibly, so no size reaches an abort.
        let too_large = || {
            Error::Memory(format!(
                "a batch of {capacity} samples of {sample_bytes} bytes does not fit in memory; lower batch_size"
            ))
        };
        let data = capacity.checked_mul(sample_bytes).ok_or_else(too_large)?;
        let mut indices = Vec::new();
        let mut status = Vec::new();
        indices.try_reserve_exact(capacity).map_err(|_| too_large())?;
        status.try_reserve_exact(capacity).map_err(|_| too_large())?;
        let mut deferred = Vec::new();
        deferred.try_reserve_exact(capacity).map_err(|_| too_large())?;
        deferred.extend((0..capacity).map(|_| std::sync::atomic::AtomicBool::new(false)));
        indices.extend((0..capacity).map(|_| AtomicU32::new(0)));
        status.extend((0..capacity).map(|_| AtomicU8::new(PENDING)));
        let extras = extras
            .iter()
            .map(|&b| Ok((RawBuf::new_in(capacity.checked_mul(b).ok_or_else(too_large)?, alloc)?, b)))
            .collect::<Result<Vec<_>>>()?
            .into_boxed_slice();
        Ok(Slot {
            extras,
            data: RawBuf::new_in(data, alloc)?,
            labels: RawBuf::new_in(capacity.checked_mul(8).ok_or_else(too_large)?, alloc)?,
            sample_bytes,
            indices: indices.into_boxed_slice(),
            status: status.into_boxed_slice(),
            deferred: deferred.into_boxed_slice(),
            count: AtomicUsize::new(0),
            remaining: AtomicUsize::new(0),
            batch: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            errors: Mutex::new(Vec::new()),
        })
    }

    /// Prepares the slot for batch `batch` holding dataset indices `indices`.
    pub(crate) fn reset(&self, batch: usize, indices: &[u32]) {
        for (k, &i) in indices.iter().enumerate() {
            self.indices[k].store(i, Ordering::Relaxed);
            self.status[k].store(PENDING, Ordering::Relaxed);
            self.deferred[k].store(false, Ordering::Relaxed);
        }
        self.errors.lock().expect("slot errors lock").clear();
        self.batch.store(batch, Ordering::Relaxed);
        self.count.store(indices.len(), Ordering::Relaxed);
        self.len.store(0, Ordering::Relaxed);
        self.remaining.store(indices.len(), Ordering::Release);
    }

    pub(crate) fn index(&self, pos: usize) -> u32 {
        self.indices[pos].load(Ordering::Relaxed)
    }

    /// # Safety
    /// Only the one worker that owns position `pos` of the current batch may call this, and
    /// only before it marks the position finished.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn sample_mut(&self, pos: usize) -> &mut [u8] {
        // SAFETY: positions are disjoint regions, each owned by one worker (caller's contract).
        unsafe { self.data.slice_mut(pos * self.sample_bytes, self.sample_bytes) }
    }

    /// Extra region `k` of position `pos` (see [`BufferPool::with_extras`]).
    ///
    /// # Safety
    /// As for [`Slot::sample_mut`].
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn extra_mut(&self, k: usize, pos: usize) -> &mut [u8] {
        let (buf, b) = &self.extras[k];
        // SAFETY: positions are disjoint regions, each owned by one worker (caller's contract).
        unsafe { buf.slice_mut(pos * b, *b) }
    }

    /// The delivered rows of extra region `k` (valid once the batch is complete).
    pub(crate) fn extra(&self, k: usize) -> &[u8] {
        let (buf, b) = &self.extras[k];
        // SAFETY: called only on completed batches, which no worker writes any more.
        unsafe { buf.slice(self.len.load(Ordering::Acquire) * b) }
    }

    /// Marks position `pos` as holding a GPU decode record (before [`Slot::finish`]).
    pub(crate) fn defer(&self, pos: usize) {
        self.deferred[pos].store(true, Ordering::Relaxed);
    }

    /// The delivered positions that hold GPU decode records (valid once the batch is
    /// complete).
    pub(crate) fn deferred(&self) -> impl Iterator<Item = usize> + '_ {
        let n = self.len.load(Ordering::Acquire);
        (0..n).filter(|&p| self.deferred[p].load(Ordering::Relaxed))
    }

    /// Records the outcome of position `pos`; returns `true` if this finished the batch.
    pub(crate) fn finish(&self, pos: usize, label: Option<i64>) -> bool {
        match label {
            Some(l) => {
                // SAFETY: position `pos` is owned by the caller until `remaining` is decremented
                // below; each label is 8 bytes at an 8-aligned offset of a 64-aligned buffer.
                unsafe { self.labels.slice_mut(pos * 8, 8).copy_from_slice(&l.to_ne_bytes()) };
                self.status[pos].store(OK, Ordering::Relaxed);
            }
            None => self.status[pos].store(FAILED, Ordering::Relaxed),
        }
        self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// Called once, by the thread that finished the last position: moves the good samples to
    /// the front (keeping their order) and records the delivered length.
    pub(crate) fn compact(&self) {
        let count = self.count.load(Ordering::Relaxed);
        let mut out = 0;
        for pos in 0..count {
            if self.status[pos].load(Ordering::Relaxed) == OK {
                if out != pos {
                    let sb = self.sample_bytes;
                    // SAFETY: every worker is done with this slot (remaining reached 0 with
                    // AcqRel ordering), so this thread has exclusive access; ranges are in
                    // bounds and `ptr::copy` allows overlap.
                    unsafe {
                        std::ptr::copy(self.data.as_ptr().add(pos * sb), self.data.as_ptr().add(out * sb), sb);
                        std::ptr::copy(self.labels.as_ptr().add(pos * 8), self.labels.as_ptr().add(out * 8), 8);
                        for (buf, b) in self.extras.iter() {
                            std::ptr::copy(buf.as_ptr().add(pos * b), buf.as_ptr().add(out * b), *b);
                        }
                    }
                    self.indices[out].store(self.indices[pos].load(Ordering::Relaxed), Ordering::Relaxed);
                    self.deferred[out].store(self.deferred[pos].load(Ordering::Relaxed), Ordering::Relaxed);
                }
                out += 1;
            }
        }
        self.len.store(out, Ordering::Release);
    }

    /// The delivered bytes and the delivered rows of extra region `k`, writable: for an op on
    /// the whole batch, run by the thread that completed it.
    ///
    /// # Safety
    /// Only the thread whose [`Slot::finish`] returned `true` may call this, after
    /// [`Slot::compact`] and before it hands the slot on; the two slices must not outlive that.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn completed_mut(&self, k: usize) -> (&mut [u8], &mut [u8]) {
        let n = self.len.load(Ordering::Acquire);
        let (buf, b) = &self.extras[k];
        // SAFETY: no other thread touches a completed slot before it is handed on (caller's
        // contract); the data and extra buffers are distinct allocations.
        unsafe { (self.data.slice_mut(0, n * self.sample_bytes), buf.slice_mut(0, n * b)) }
    }

    /// The delivered bytes (valid once the batch is complete).
    pub(crate) fn data(&self) -> &[u8] {
        let n = self.len.load(Ordering::Acquire) * self.sample_bytes;
        // SAFETY: called only on completed batches, which no worker writes any more.
        unsafe { self.data.slice(n) }
    }

    pub(crate) fn labels(&self) -> &[i64] {
        let n = self.len.load(Ordering::Acquire);
        // SAFETY: completed batch (no writers); the labels buffer is 64-aligned and holds
        // `capacity` initialised (zeroed or written) i64 values, n <= capacity.
        unsafe { std::slice::from_raw_parts(self.labels.as_ptr().cast::<i64>(), n) }
    }

    pub(crate) fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        let n = self.len.load(Ordering::Acquire);
        self.indices[..n].iter().map(|a| a.load(Ordering::Relaxed))
    }
}

/// The image kind's pool of batch slots ([`SlotPool`]: its base set made up front, grown
/// while the consumer keeps every batch), and what the slots are made of.
pub struct BufferPool {
    /// The slots: the free queue, what the consumer holds, the growth.
    pub(crate) slots: SlotPool<Arc<Slot>>,
    batch_bytes: usize,
    addresses: Vec<usize>,
    memory: &'static str,
    capacity: usize,
    /// Bytes per sample of each extra region.
    extras: Vec<usize>,
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool").field("slots", &self.slots()).field("batch_bytes", &self.batch_bytes).finish()
    }
}

impl BufferPool {
    /// How many slots of `batch_bytes` fit: `wanted`, capped by `memory_limit`.
    pub fn plan(wanted: usize, batch_bytes: usize, memory_limit: Option<u64>) -> Result<usize> {
        match memory_limit {
            None => Ok(wanted),
            Some(limit) => {
                let fit = (limit / batch_bytes.max(1) as u64) as usize;
                if fit == 0 {
                    Err(Error::Memory(format!(
                        "memory_limit of {limit} bytes cannot hold one batch of {batch_bytes} bytes; raise memory_limit or lower batch_size"
                    )))
                } else {
                    Ok(wanted.min(fit))
                }
            }
        }
    }

    /// Allocates `slots` slots of `capacity` samples of `sample_bytes` each on the heap (grown
    /// within the default limit).
    pub fn new(slots: usize, capacity: usize, sample_bytes: usize) -> Result<Self> {
        Self::new_in(slots, capacity, sample_bytes, Arc::new(HeapAllocator), None)
    }

    /// Allocates `slots` slots of `capacity` samples of `sample_bytes` each from `alloc`; the
    /// pool grows within `memory_limit` ([`Growth`](super::grow::Growth)).
    pub fn new_in(
        slots: usize,
        capacity: usize,
        sample_bytes: usize,
        alloc: Arc<dyn HostAllocator>,
        memory_limit: Option<u64>,
    ) -> Result<Self> {
        Self::with_extras(slots, capacity, sample_bytes, &[], alloc, memory_limit)
    }

    /// [`BufferPool::new_in`] with further per-sample regions of `extras` bytes each (an
    /// image-text pair's caption ids and mask), beside the samples and labels of every slot.
    pub fn with_extras(
        slots: usize,
        capacity: usize,
        sample_bytes: usize,
        extras: &[usize],
        alloc: Arc<dyn HostAllocator>,
        memory_limit: Option<u64>,
    ) -> Result<Self> {
        let memory = alloc.kind();
        let each = extras.to_vec();
        // A grown slot is made like the others.
        let make: MakeSlot<Arc<Slot>> =
            Arc::new(move || Slot::new(capacity, sample_bytes, &each, alloc.as_ref()).map(Arc::new));
        let batch_bytes = capacity.saturating_mul(sample_bytes);
        let pool = SlotPool::new(slots, batch_bytes, memory_limit, "batch", make)?;
        // The base slots' addresses, read once while the pool is all free.
        let base: Vec<Arc<Slot>> = pool.free_rx.try_iter().collect();
        let addresses = base.iter().map(|s| s.data.as_ptr() as usize).collect();
        base.into_iter().for_each(|s| pool.give_back(s));
        Ok(BufferPool { slots: pool, batch_bytes, addresses, memory, capacity, extras: extras.to_vec() })
    }

    /// Number of slots made up front (more exist while the consumer holds them all: [`Growth`]).
    pub fn slots(&self) -> usize {
        self.slots.slots()
    }

    /// Bytes of one batch buffer.
    pub fn batch_bytes(&self) -> usize {
        self.batch_bytes
    }

    /// Extra regions per slot (see [`BufferPool::with_extras`]).
    pub fn extra_regions(&self) -> usize {
        self.extras.len()
    }

    /// Bytes of one batch's extra region `k` (see [`BufferPool::with_extras`]).
    pub fn extra_bytes(&self, k: usize) -> usize {
        self.capacity.saturating_mul(self.extras[k])
    }

    /// Bytes of all batch buffers together.
    pub fn total_bytes(&self) -> usize {
        self.slots().saturating_mul(self.batch_bytes)
    }

    /// Start addresses of the batch buffers (to check zero-copy hand-offs).
    pub fn addresses(&self) -> &[usize] {
        &self.addresses
    }

    /// `"pageable"` or `"pinned"`: the kind of host memory of the buffers.
    pub fn memory_kind(&self) -> &'static str {
        self.memory
    }

    /// Batches currently held by the consumer.
    pub fn held(&self) -> usize {
        self.slots.held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limit_caps_and_errors() {
        assert_eq!(BufferPool::plan(4, 100, None).unwrap(), 4);
        assert_eq!(BufferPool::plan(4, 100, Some(250)).unwrap(), 2);
        let e = BufferPool::plan(4, 100, Some(99)).unwrap_err();
        assert!(e.to_string().contains("cannot hold one batch"), "{e}");
    }

    /// An allocator that counts its bytes, standing in for the pinned one.
    #[derive(Debug, Default)]
    struct Counting(AtomicUsize);

    impl HostAllocator for Counting {
        fn allocate(&self, len: usize) -> Result<Box<dyn HostMemory>> {
            self.0.fetch_add(len, Ordering::Relaxed);
            HeapAllocator.allocate(len)
        }
        fn kind(&self) -> &'static str {
            "counting"
        }
    }

    #[test]
    fn pool_takes_every_buffer_from_its_allocator() {
        let a = Arc::new(Counting::default());
        let pool = BufferPool::new_in(3, 4, 100, a.clone(), None).unwrap();
        // Data and labels of each slot.
        assert_eq!(a.0.load(Ordering::Relaxed), 3 * (4 * 100 + 4 * 8));
        // A grown slot comes from the same allocator.
        let _grown = (pool.slots.view().make)().unwrap();
        assert_eq!(a.0.load(Ordering::Relaxed), 4 * (4 * 100 + 4 * 8));
        assert_eq!(pool.memory_kind(), "counting");
        assert!(pool.addresses().iter().all(|p| p % ALIGN == 0));
    }

    #[test]
    fn compaction_keeps_order() {
        let s = Slot::new(4, 2, &[3], &HeapAllocator).unwrap();
        s.reset(0, &[10, 11, 12, 13]);
        for pos in 0..4 {
            // SAFETY: (test) one thread owns every position.
            unsafe {
                s.sample_mut(pos).fill(pos as u8);
                s.extra_mut(0, pos).fill(10 + pos as u8);
            }
        }
        assert!(!s.finish(0, Some(0)));
        assert!(!s.finish(1, None));
        assert!(!s.finish(2, Some(2)));
        assert!(s.finish(3, Some(3)));
        s.compact();
        assert_eq!(s.data(), &[0, 0, 2, 2, 3, 3]);
        assert_eq!(s.labels(), &[0, 2, 3]);
        assert_eq!(s.extra(0), &[10, 10, 10, 12, 12, 12, 13, 13, 13]);
        assert_eq!(s.indices().collect::<Vec<_>>(), vec![10, 12, 13]);
    }
}
