//! The `ArrayIterator` class: an iteration over array batches, waiting as
//! [`crate::shared::iter`] describes (GIL released, Ctrl-C honoured, fork-safe).

use super::batch::{ColumnSpec, PyArrayBatch};
use crate::shared::iter::{iterator_class, Polled};
use pyo3::prelude::*;
use std::sync::Arc;
use stoker::arrays::ArrayIter;

/// An iteration over array batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, name = "ArrayIterator", module = "stoker._stoker")]
pub struct PyArrayIter {
    pub(super) polled: Polled<ArrayIter>,
    /// The columns' dtypes and row shapes, for the batches' views.
    pub(super) specs: Arc<Vec<ColumnSpec>>,
}

iterator_class!(PyArrayIter: ArrayIter => PyArrayBatch, |it, held| PyArrayBatch::new(held, it.specs.clone()));
