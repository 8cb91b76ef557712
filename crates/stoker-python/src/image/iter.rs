//! The `Iterator` class: an iteration over image batches, waiting as [`crate::shared::iter`]
//! describes (GIL released, Ctrl-C honoured, fork-safe).

use super::batch::PyBatch;
use crate::shared::iter::{iterator_class, Polled};
use pyo3::prelude::*;
use stoker::EpochIter;

/// An iteration over (the rest of) an epoch. Waits release the GIL; Ctrl-C is honoured
/// between 50 ms waits and stops every worker thread.
#[pyclass(frozen, weakref, name = "Iterator", module = "stoker._stoker")]
pub struct PyIter {
    pub(super) polled: Polled<EpochIter>,
}

iterator_class!(PyIter: EpochIter => PyBatch, |_, held| PyBatch::new(held));
