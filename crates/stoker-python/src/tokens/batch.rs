//! The `TokenBatch` class and its `TokenTensor` views (`input_ids`, `labels`, `position_ids`,
//! `cu_seqlens`; int32), exported through DLPack; how a token batch is read, in host or device
//! memory.

use crate::shared::batch::batch_class;
use crate::shared::device::{Held, Location};
use crate::shared::dlpack::DLDataType;
use crate::shared::held::Rows;
use crate::shared::tensor::{tensor_class, TensorClass};
use pyo3::prelude::*;
use std::sync::Arc;
use stoker::tokens::pipeline::TokenMeta;
use stoker::tokens::TokenBatch;

/// A token batch in host or device memory.
pub(crate) type TokHeld = Held<TokenBatch>;

impl Rows for TokenBatch {
    /// Regions: `input_ids`, `labels`, `position_ids`, `cu_seqlens`, `sources`.
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

/// One batch of packed rows.
#[pyclass(frozen, name = "TokenBatch", module = "stoker._stoker")]
pub struct PyTokenBatch {
    pub(super) inner: TokHeld,
}

/// What a batch's views need besides its memory: rows, tokens per row, values of `cu_seqlens`,
/// the longest segment.
fn shape_of(b: &TokHeld) -> (usize, usize, usize, usize) {
    match b {
        Held::Host(h) => (h.rows(), h.seq_len(), h.cu_seqlens().len(), h.max_seqlen()),
        Held::Device(d) => {
            let m = d.meta();
            (m.rows, m.seq_len, m.cu_len, m.max_seqlen)
        }
    }
}

/// The arrays of a batch, by name.
const FIELDS: [&str; 5] = ["input_ids", "labels", "position_ids", "cu_seqlens", "sources"];

batch_class! { PyTokenBatch, shares [device], {
    /// The longest segment (FlashAttention's `max_seqlen`).
    #[getter]
    fn max_seqlen(&self) -> usize {
        shape_of(&self.inner).3
    }

    /// The array `name` (`input_ids`, `labels`, `position_ids`, `cu_seqlens`, `sources`: each
    /// row's source in a mixture) as a DLPack-exporting view.
    fn field(&self, name: &str) -> PyResult<PyTokenTensor> {
        let field = FIELDS
            .iter()
            .position(|f| *f == name)
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(format!("{name:?}: expected one of {FIELDS:?}")))?;
        Ok(PyTokenTensor { batch: self.inner.clone(), field })
    }
} }

/// One array of a token batch (int32, host or device memory), exported with `__dlpack__`.
#[pyclass(frozen, name = "TokenTensor", module = "stoker._stoker")]
pub struct PyTokenTensor {
    batch: TokHeld,
    field: usize,
}

impl TensorClass for PyTokenTensor {
    fn region(&self) -> (*const u8, Location, Arc<dyn Send + Sync>) {
        self.batch.region(self.field)
    }

    fn layout(&self) -> PyResult<(Vec<i64>, DLDataType)> {
        let (rows, seq_len, cu_len, _) = shape_of(&self.batch);
        let shape = match self.field {
            3 => vec![cu_len as i64],
            4 => vec![rows as i64],
            _ => vec![rows as i64, seq_len as i64],
        };
        Ok((shape, DLDataType::I32))
    }
}

tensor_class!(PyTokenTensor);
