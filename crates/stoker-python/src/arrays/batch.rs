//! The `ArrayBatch` class and its column views (`ArrayTensor`), exported through DLPack; how an
//! array batch is read, in host or device memory.

use crate::errors;
use crate::shared::batch::batch_class;
use crate::shared::device::{self, Location};
use crate::shared::dlpack::DLDataType;
use crate::shared::held::Rows;
use crate::shared::tensor::{tensor_class, TensorClass};
use pyo3::prelude::*;
use std::sync::Arc;
use stoker::arrays::ArrayMeta;
use stoker::arrays::{descr_itemsize, ArrayBatch};

/// An array batch in host or device memory.
pub(crate) type ArrHeld = device::Held<ArrayBatch>;

impl Rows for ArrayBatch {
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

/// dtype string and the shape of one row, per column.
#[derive(Clone)]
pub(crate) struct ColumnSpec {
    pub(crate) descr: String,
    pub(crate) row_shape: Vec<usize>,
}

fn dl_type(descr: &str) -> Option<DLDataType> {
    let bits = (descr_itemsize(descr)? * 8) as u8;
    let code = match descr.as_bytes().get(1)? {
        b'f' => 2,
        b'i' => 0,
        b'u' => 1,
        b'b' => 6,
        _ => return None,
    };
    Some(DLDataType::new(code, bits))
}

/// One batch of rows: one DLPack tensor per column.
#[pyclass(frozen, name = "ArrayBatch", module = "stoker._stoker")]
pub struct PyArrayBatch {
    inner: ArrHeld,
    specs: Arc<Vec<ColumnSpec>>,
}

impl PyArrayBatch {
    /// The Python batch of a delivered batch; `specs` describe its columns.
    pub(crate) fn new(inner: ArrHeld, specs: Arc<Vec<ColumnSpec>>) -> Self {
        PyArrayBatch { inner, specs }
    }
}

batch_class! { PyArrayBatch, shares [indices], {
    /// Column `c` as a DLPack-exporting tensor view.
    fn column(&self, c: usize) -> PyResult<PyArrayTensor> {
        if c >= self.specs.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("column {c} of {}", self.specs.len())));
        }
        Ok(PyArrayTensor { batch: self.inner.clone(), column: c, spec: self.specs[c].clone() })
    }
} }

/// A column of an array batch (host or device memory), exported with `__dlpack__`.
#[pyclass(frozen, name = "ArrayTensor", module = "stoker._stoker")]
pub struct PyArrayTensor {
    batch: ArrHeld,
    column: usize,
    spec: ColumnSpec,
}

impl TensorClass for PyArrayTensor {
    fn region(&self) -> (*const u8, Location, Arc<dyn Send + Sync>) {
        self.batch.region(self.column)
    }

    fn layout(&self) -> PyResult<(Vec<i64>, DLDataType)> {
        let dtype = dl_type(&self.spec.descr).ok_or_else(|| errors::config("arrays", "unsupported dtype"))?;
        let mut shape = vec![self.batch.len() as i64];
        shape.extend(self.spec.row_shape.iter().map(|&d| d as i64));
        Ok((shape, dtype))
    }
}

tensor_class!(PyArrayTensor);
