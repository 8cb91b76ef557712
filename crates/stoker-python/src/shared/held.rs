//! What the batch classes read from a batch, written once for both places it can be: a pool
//! buffer in host memory ([`Held::Host`]) or the transfer stage's device buffers
//! ([`Held::Device`]), and for every kind of batch (each kind's `batch.rs` implements [`Rows`]).

use crate::shared::device::{Held, Location};
use std::sync::Arc;
use stoker::shell::kind::HostBatch;

/// A host batch and the description its device copy carries, read the same way.
pub(crate) trait Rows: HostBatch {
    /// Host address of region `k` (the regions the transfer stage copies, in its order).
    fn region_ptr(&self, k: usize) -> *const u8;
    /// Samples (rows) of a device copy.
    fn meta_rows(meta: &Self::Meta) -> usize;
    /// Batch number of a device copy.
    fn meta_number(meta: &Self::Meta) -> usize;
    /// Dataset indices of a device copy's samples.
    fn meta_indices(meta: &Self::Meta) -> &[u32];
}

/// The getters of a held batch, host or device.
impl<B: Rows + Sync> Held<B> {
    /// `f` of the batch's description (a host batch's, or its device copy's).
    fn with_meta<R>(&self, f: impl FnOnce(&B::Meta) -> R) -> R {
        match self {
            Held::Host(b) => f(&b.meta()),
            Held::Device(b) => f(b.meta()),
        }
    }

    /// Samples (rows) in the batch.
    pub(crate) fn len(&self) -> usize {
        self.with_meta(B::meta_rows)
    }

    /// Batch number within the epoch.
    pub(crate) fn index(&self) -> usize {
        self.with_meta(B::meta_number)
    }

    /// Dataset indices of the samples.
    pub(crate) fn indices(&self) -> Vec<u32> {
        self.with_meta(|m| B::meta_indices(m).to_vec())
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
