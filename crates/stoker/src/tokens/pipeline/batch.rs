//! [`TokenBatch`]: the delivered view of a pooled slot, returned to the pool on drop.

use super::slot::TokenSlot;
use crate::shell::grow::Lease;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One batch: `rows` rows of `seq_len` tokens in a pooled slot, returned to the pool on drop.
pub struct TokenBatch {
    pub(super) slot: Lease<Arc<TokenSlot>>,
    pub(super) seq_len: usize,
}

impl TokenBatch {
    pub(super) fn slot(&self) -> &TokenSlot {
        &self.slot
    }

    /// Rows in this batch.
    pub fn rows(&self) -> usize {
        self.slot().rows.load(Ordering::Acquire)
    }

    /// Tokens per row.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Batch number (since the epoch's start).
    pub fn index(&self) -> usize {
        self.slot().batch.load(Ordering::Relaxed)
    }

    pub(super) fn values(&self) -> usize {
        self.rows() * self.seq_len()
    }

    /// `input_ids`, `rows x seq_len`.
    pub fn input_ids(&self) -> &[i32] {
        // SAFETY: a delivered batch is complete: nobody writes it until it returns to the pool.
        unsafe { TokenSlot::ints(&self.slot().input, self.values()) }
    }

    /// `labels`: the next token in the document, `-100` where there is none.
    pub fn labels(&self) -> &[i32] {
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().labels, self.values()) }
    }

    /// `position_ids`, restarting at each segment.
    pub fn position_ids(&self) -> &[i32] {
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().positions, self.values()) }
    }

    /// `cu_seqlens` over the flattened batch: 0, then the end of each segment.
    pub fn cu_seqlens(&self) -> &[i32] {
        let n = self.slot().cu_len.load(Ordering::Acquire);
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().cu, n) }
    }

    /// Each row's source in a mixture (its index among the mixture's sources; 0 for one
    /// source).
    pub fn sources(&self) -> &[i32] {
        // SAFETY: as above.
        unsafe { TokenSlot::ints(&self.slot().sources, self.rows()) }
    }

    /// The longest segment (FlashAttention's `max_seqlen`).
    pub fn max_seqlen(&self) -> usize {
        self.cu_seqlens().windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0)
    }

    /// The five arrays as `(address, bytes)`: `input_ids`, `labels`, `position_ids`,
    /// `cu_seqlens`, `sources` (what a transfer to a GPU copies).
    pub fn regions(&self) -> [(*const u8, usize); 5] {
        let r = |s: &[i32]| (s.as_ptr().cast::<u8>(), std::mem::size_of_val(s));
        [r(self.input_ids()), r(self.labels()), r(self.position_ids()), r(self.cu_seqlens()), r(self.sources())]
    }
}

/// What a GPU token batch carries besides its bytes.
#[derive(Debug, Clone)]
pub struct TokenMeta {
    /// Batch number within the epoch.
    pub index: usize,
    /// Rows in the batch.
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Values of `cu_seqlens`.
    pub cu_len: usize,
    /// The longest segment.
    pub max_seqlen: usize,
}

impl crate::shell::kind::HostBatch for TokenBatch {
    type Meta = TokenMeta;

    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        out.extend(TokenBatch::regions(self));
    }

    fn meta(&self) -> TokenMeta {
        TokenMeta {
            index: self.index(),
            rows: self.rows(),
            seq_len: self.seq_len(),
            cu_len: self.cu_seqlens().len(),
            max_seqlen: self.max_seqlen(),
        }
    }
}
