//! [`TokenSlot`]: one pooled batch buffer of the token kinds (`input_ids`, `labels`,
//! `position_ids`, `cu_seqlens`, each row's source), what a pass reads from it, and the pool
//! of a token loader's or a token mixture's batches ([`token_pool`]).

use super::config::TokenConfig;
use crate::error::{Error, Result};
use crate::shell::buffer::{BufferPool, HostAllocator, RawBuf};
use crate::shell::grow::{MakeSlot, SlotPool};
use crate::shell::pass::PassSlot;
use crate::tokens::pack::Resume;
use crate::values::token_values;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One pooled batch buffer of the token kind.
pub struct TokenSlot {
    pub(super) batch: AtomicUsize,
    pub(super) rows: AtomicUsize,
    pub(super) input: RawBuf,
    pub(super) labels: RawBuf,
    pub(super) positions: RawBuf,
    pub(super) cu: RawBuf,
    pub(super) cu_len: AtomicUsize,
    /// Each row's source in a mixture (`batch_size` int32; zeros for one source).
    pub(super) sources: RawBuf,
    /// The resume point after this batch, its failures.
    pub(super) after: Mutex<(Resume, Vec<Error>)>,
}

impl TokenSlot {
    /// The `i32` view of `buf`'s first `n` values.
    ///
    /// # Safety
    /// No one may write the range while the slice lives.
    pub(super) unsafe fn ints(buf: &RawBuf, n: usize) -> &[i32] {
        // SAFETY: the buffer is 64-byte aligned and holds at least `n` i32s (allocated with
        // them); no writer is active per the caller's contract.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<i32>(), n) }
    }

    /// The mutable `i32` view of values `from..from + n` of `buf`.
    ///
    /// # Safety
    /// The caller must be the slot's only user (the packer, before the slot is sent).
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn ints_mut(buf: &RawBuf, from: usize, n: usize) -> &mut [i32] {
        // SAFETY: aligned, in bounds (allocated for the whole batch) and unaliased per the
        // caller's contract.
        unsafe { std::slice::from_raw_parts_mut(buf.as_ptr().cast::<i32>().add(from), n) }
    }
}

/// The pool of a token kind's batches (`config.batch_size` rows of `config.seq_len` tokens),
/// `prefetch + 2` slots within `memory_limit`, from `alloc` (page-locked memory when batches go
/// on to a GPU).
pub(super) fn token_pool(config: &TokenConfig, alloc: Arc<dyn HostAllocator>) -> Result<SlotPool<Arc<TokenSlot>>> {
    let (bs, len) = (config.batch_size, config.seq_len);
    // The limits on `bs x len` (checked before the sizes below are computed).
    token_values(bs, len)?;
    let caps = region_capacities(bs, len);
    let batch_bytes = caps.iter().sum();
    let slots = BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?;
    let make: MakeSlot<Arc<TokenSlot>> = Arc::new(move || {
        let a = alloc.as_ref();
        Ok(Arc::new(TokenSlot {
            batch: AtomicUsize::new(0),
            rows: AtomicUsize::new(0),
            input: RawBuf::new_in(caps[0], a)?,
            labels: RawBuf::new_in(caps[1], a)?,
            positions: RawBuf::new_in(caps[2], a)?,
            cu: RawBuf::new_in(caps[3], a)?,
            cu_len: AtomicUsize::new(0),
            sources: RawBuf::new_in(caps[4], a)?,
            after: Mutex::new((Resume::default(), Vec::new())),
        }))
    });
    SlotPool::new(slots, batch_bytes, config.memory_limit, "batch", make)
}

/// Bytes of each array of a batch of `bs` rows of `len` tokens at most, in the order of
/// [`super::TokenBatch::regions`]: `input_ids`, `labels`, `position_ids` (`bs x len` int32
/// each), `cu_seqlens` (at most a segment per token, and the leading 0), `sources`.
pub(super) fn region_capacities(bs: usize, len: usize) -> [usize; 5] {
    let values = bs * len;
    [values * 4, values * 4, values * 4, (values + bs + 1) * 4, bs * 4]
}

impl PassSlot for TokenSlot {
    fn batch(&self) -> usize {
        self.batch.load(Ordering::Relaxed)
    }

    fn samples(&self) -> Option<usize> {
        Some(self.rows.load(Ordering::Acquire))
    }

    fn take_failures(&self) -> Vec<Error> {
        std::mem::take(&mut self.after.lock().unwrap_or_else(|p| p.into_inner()).1)
    }
}
