//! [`TokenSlot`]: one pooled batch buffer of the token kind (`input_ids`, `labels`,
//! `position_ids`, `cu_seqlens`, each row's source), and what a pass reads from it.

use crate::error::Error;
use crate::shell::buffer::RawBuf;
use crate::shell::pass::PassSlot;
use crate::tokens::pack::Resume;
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

impl PassSlot for Arc<TokenSlot> {
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
