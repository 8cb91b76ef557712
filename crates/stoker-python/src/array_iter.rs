//! The `ArrayIterator` class: an iteration over array batches, waiting as [`crate::iter`]
//! describes (GIL released, Ctrl-C honoured, fork-safe).

use crate::array_batch::{ColumnSpec, PyArrayBatch};
use crate::device;
use crate::errors;
use crate::iter::{forget_if_inherited, next_polling, release, SIGNAL_POLL};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use stoker::arrays::ArrayIter;

/// An array iteration: from the host pool, or through the transfer stage.
pub(crate) type ArrIter = device::Iter<ArrayIter>;

/// An iteration over array batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, name = "ArrayIterator", module = "stoker._stoker")]
pub struct PyArrayIter {
    inner: Mutex<Option<ArrIter>>,
    specs: Arc<Vec<ColumnSpec>>,
    pid: u32,
}

impl PyArrayIter {
    /// The Python iterator of a started iteration, bound to this process.
    pub(crate) fn new(it: ArrIter, specs: Arc<Vec<ColumnSpec>>) -> Self {
        PyArrayIter { inner: Mutex::new(Some(it)), specs, pid: std::process::id() }
    }
}

#[pymethods]
impl PyArrayIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyArrayBatch>> {
        errors::contain(|| {
            Ok(next_polling(py, &self.inner, self.pid, |it| it.next_timeout(SIGNAL_POLL))?
                .map(|inner| PyArrayBatch::new(inner, self.specs.clone())))
        })
    }

    /// Stops the iteration now (joins every thread, GIL released); in a fork child the
    /// inherited iteration is let go untouched.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        release(py, &self.inner, self.pid);
        py.check_signals()
    }
}

impl Drop for PyArrayIter {
    fn drop(&mut self) {
        forget_if_inherited(&mut self.inner, self.pid);
    }
}
