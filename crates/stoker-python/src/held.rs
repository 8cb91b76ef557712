//! What the batch classes read from a batch, written once for both places it can be: a pool
//! buffer in host memory ([`Held::Host`]) or the transfer stage's device buffers
//! ([`Held::Device`]), and for both kinds of batch (images, array rows).

use crate::device::{Held, Location};
use std::sync::Arc;
use stoker_cuda::{ArrayMeta, HostBatch, ImageMeta, TokenMeta};

/// A host batch and the description its device copy carries, read the same way.
pub(crate) trait Rows: HostBatch {
    /// Samples (rows) in the host batch.
    fn rows(&self) -> usize;
    /// Batch number within the epoch.
    fn number(&self) -> usize;
    /// Dataset indices of the samples.
    fn sample_indices(&self) -> Vec<u32>;
    /// Host address of region `k` (the regions the transfer stage copies, in its order).
    fn region_ptr(&self, k: usize) -> *const u8;
    /// Samples (rows) of a device copy.
    fn meta_rows(meta: &Self::Meta) -> usize;
    /// Batch number of a device copy.
    fn meta_number(meta: &Self::Meta) -> usize;
    /// Dataset indices of a device copy's samples.
    fn meta_indices(meta: &Self::Meta) -> &[u32];
}

impl Rows for stoker::Batch {
    fn rows(&self) -> usize {
        self.len()
    }
    fn number(&self) -> usize {
        self.index()
    }
    fn sample_indices(&self) -> Vec<u32> {
        self.indices()
    }
    /// Region 0 is the images, region 1 the labels.
    fn region_ptr(&self, k: usize) -> *const u8 {
        if k == 0 {
            self.data_ptr()
        } else {
            self.labels_ptr().cast::<u8>()
        }
    }
    fn meta_rows(meta: &ImageMeta) -> usize {
        meta.shape[0]
    }
    fn meta_number(meta: &ImageMeta) -> usize {
        meta.index
    }
    fn meta_indices(meta: &ImageMeta) -> &[u32] {
        &meta.indices
    }
}

impl Rows for stoker::arrays::ArrayBatch {
    fn rows(&self) -> usize {
        self.len()
    }
    fn number(&self) -> usize {
        self.index()
    }
    fn sample_indices(&self) -> Vec<u32> {
        self.indices()
    }
    /// Region `k` is column `k`.
    fn region_ptr(&self, k: usize) -> *const u8 {
        self.column_ptr(k)
    }
    fn meta_rows(meta: &ArrayMeta) -> usize {
        meta.len
    }
    fn meta_number(meta: &ArrayMeta) -> usize {
        meta.index
    }
    fn meta_indices(meta: &ArrayMeta) -> &[u32] {
        &meta.indices
    }
}

impl Rows for stoker::tokens::TokenBatch {
    fn rows(&self) -> usize {
        stoker::tokens::TokenBatch::rows(self)
    }
    fn number(&self) -> usize {
        self.index()
    }
    /// Token rows are not dataset samples: no indices.
    fn sample_indices(&self) -> Vec<u32> {
        vec![]
    }
    /// Regions: `input_ids`, `labels`, `position_ids`, `cu_seqlens`.
    fn region_ptr(&self, k: usize) -> *const u8 {
        self.regions()[k].0
    }
    fn meta_rows(meta: &TokenMeta) -> usize {
        meta.rows
    }
    fn meta_number(meta: &TokenMeta) -> usize {
        meta.index
    }
    fn meta_indices(_: &TokenMeta) -> &[u32] {
        &[]
    }
}

/// The getters of a held batch, host or device.
impl<B: Rows + Sync> Held<B> {
    /// Samples (rows) in the batch.
    pub(crate) fn len(&self) -> usize {
        match self {
            Held::Host(b) => b.rows(),
            Held::Device(b) => B::meta_rows(b.meta()),
        }
    }

    /// Batch number within the epoch.
    pub(crate) fn index(&self) -> usize {
        match self {
            Held::Host(b) => b.number(),
            Held::Device(b) => B::meta_number(b.meta()),
        }
    }

    /// Dataset indices of the samples.
    pub(crate) fn indices(&self) -> Vec<u32> {
        match self {
            Held::Host(b) => b.sample_indices(),
            Held::Device(b) => B::meta_indices(b.meta()).to_vec(),
        }
    }

    /// `cpu` or `cuda:N`.
    pub(crate) fn device(&self) -> String {
        match self {
            Held::Host(_) => "cpu".into(),
            Held::Device(b) => format!("cuda:{}", b.ordinal()),
        }
    }

    /// Region `k` of the batch: its address (host or device), where it is, and what keeps it
    /// alive (the whole batch).
    pub(crate) fn region(&self, k: usize) -> (*const u8, Location, Arc<dyn Send + Sync>) {
        match self {
            Held::Host(b) => (b.region_ptr(k), Location::Cpu, b.clone()),
            Held::Device(b) => {
                (b.region_ptr(k) as *const u8, Location::Cuda { batch: b.clone(), ordinal: b.ordinal() }, b.clone())
            }
        }
    }
}
