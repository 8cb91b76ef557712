//! Steady state does no heap allocation per batch: measured with a counting global allocator
//! (its own test binary, because a global allocator covers every test in a binary).
//!
//! What may still allocate after warm-up is per *thread*, not per batch: an epoch starts its
//! threads, and a thread's first blocking wait on a channel registers itself once (crossbeam's
//! per-thread context, ~48 bytes). When that first wait happens depends on scheduling (a busy
//! machine makes more threads wait), so the bound is per thread, not a guess at timing: a few
//! tiny allocations per pipeline thread, over a stretch of many more batches than that. One
//! allocation per batch would exceed it whatever the timing; none may be buffer-sized.
//!
//! The host-wide CPU registry is off here (`cpu_registry: None`): a shared loader re-reads
//! the registry file every `budget::REFRESH` (500 ms), which allocates (the file, one
//! `/proc/PID/stat` per process in it), so with it on the count depended on how long the
//! stretch took and on how many other stoker processes the host's registry listed (this test
//! failed beside a running test suite: 130 allocations in 64 batches, all in the refresh).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use stoker::*;

struct Counting;
static COUNT: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);
static LARGEST: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        COUNT.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(l.size() as u64, Ordering::Relaxed);
        LARGEST.fetch_max(l.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        COUNT.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(n as u64, Ordering::Relaxed);
        LARGEST.fetch_max(n as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Batches in the measured stretch.
const MEASURED: u64 = 64;
/// One-time allocations a pipeline thread may make in it (first blocking waits).
const PER_THREAD: u64 = 3;

#[test]
fn steady_state_allocates_nothing_per_batch() {
    let d = tempfile::tempdir().unwrap();
    let root = common::demo_folder(d.path(), 160);
    for preset in ["imagenet-train", "imagenet-val"] {
        // Batches of 2: 80 per epoch, so the measured stretch is long against the per-thread bound.
        let mut c = LoaderConfig::new(2, TransformSpec::preset(preset).unwrap());
        c.sampler.shuffle = true;
        c.threads = Some(2);
        // Time-based registry refreshes are not per-batch work (see the module doc).
        c.cpu_registry = None;
        let loader = Loader::new(Arc::new(ImageFolder::new(&root).unwrap()), c).unwrap();
        let batch_bytes = loader.pool().batch_bytes() as u64;
        // Warm-up: two epochs, so each worker has sized its scratch buffers (they grow in
        // powers of two up to the largest image it meets, then stay).
        for epoch in 0..3 {
            loader.set_epoch(epoch);
            for b in loader.iter().unwrap() {
                drop(b.unwrap());
            }
        }
        loader.set_epoch(3);
        let mut it = loader.iter().unwrap();
        // Starting an epoch spawns its threads (their stacks and first reads allocate).
        drop(it.next().unwrap().unwrap());
        drop(it.next().unwrap().unwrap());
        let (c0, b0) = (COUNT.load(Ordering::Relaxed), BYTES.load(Ordering::Relaxed));
        LARGEST.store(0, Ordering::Relaxed);
        let mut n = 0u64;
        for b in it.by_ref().take(MEASURED as usize) {
            drop(b.unwrap());
            n += 1;
        }
        let (calls, bytes) = (COUNT.load(Ordering::Relaxed) - c0, BYTES.load(Ordering::Relaxed) - b0);
        let largest = LARGEST.load(Ordering::Relaxed);
        eprintln!("{preset}: {n} batches: {calls} allocations, {bytes} bytes, largest {largest}");
        assert_eq!(n, MEASURED);
        // Every thread of the pipeline (decode, I/O, the consumer) may register once or twice.
        let threads = (loader.threads() + loader.io_threads() + 2) as u64;
        let bound = PER_THREAD * threads;
        assert!(bound < MEASURED, "the bound must be below one allocation per batch");
        let what = format!(
            "{preset}: {calls} allocations ({bytes} bytes, largest {largest}) in {n} batches of {batch_bytes} bytes; \
             at most {bound} allowed ({PER_THREAD} for each of {threads} threads)"
        );
        assert!(calls <= bound, "{what}");
        assert!(largest <= 4096, "{what}");
    }
}
