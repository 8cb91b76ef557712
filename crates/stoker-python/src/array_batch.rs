//! The `ArrayBatch` class and its column views (`ArrayTensor`), exported through DLPack.

use crate::device;
use crate::dlpack::{DLDataType, View};
use crate::errors;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Arc;
use stoker::arrays::{descr_itemsize, ArrayBatch};

/// An array batch in host or device memory.
pub(crate) type ArrHeld = device::Held<ArrayBatch>;

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

#[pymethods]
impl PyArrayBatch {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// Batch number within the epoch.
    #[getter]
    fn index(&self) -> usize {
        self.inner.index()
    }

    /// Dataset indices of the rows.
    #[getter]
    fn indices(&self) -> Vec<u32> {
        self.inner.indices()
    }

    /// Column `c` as a DLPack-exporting tensor view.
    fn column(&self, c: usize) -> PyResult<PyArrayTensor> {
        if c >= self.specs.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("column {c} of {}", self.specs.len())));
        }
        Ok(PyArrayTensor { batch: self.inner.clone(), column: c, spec: self.specs[c].clone() })
    }
}

/// A column of an array batch (host or device memory), exported with `__dlpack__`.
#[pyclass(frozen, name = "ArrayTensor", module = "stoker._stoker")]
pub struct PyArrayTensor {
    batch: ArrHeld,
    column: usize,
    spec: ColumnSpec,
}

#[pymethods]
impl PyArrayTensor {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = max_version;
        let dtype = dl_type(&self.spec.descr).ok_or_else(|| errors::config("arrays", "unsupported dtype"))?;
        let (data, loc, owner) = self.batch.region(self.column);
        let mut shape = vec![self.batch.len() as i64];
        shape.extend(self.spec.row_shape.iter().map(|&d| d as i64));
        device::export(py, &loc, View { data, shape, dtype, owner }, stream, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.batch.region(self.column).1.dlpack_device()
    }

    /// Address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.batch.region(self.column).0 as usize
    }
}
