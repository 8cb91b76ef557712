//! The `TokenIterator` class: an iteration over token batches, waiting as
//! [`crate::shared::iter`] describes (GIL released, Ctrl-C honoured, fork-safe).

use super::batch::{PyTokenBatch, TokHeld};
use crate::shared::iter::{iterator_class, IteratorClass, Polled};
use pyo3::prelude::*;
use stoker::tokens::TokenIter;

/// An iteration over token batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, weakref, name = "TokenIterator", module = "stoker._stoker")]
pub struct PyTokenIter {
    pub(super) polled: Polled<TokenIter>,
}

impl IteratorClass for PyTokenIter {
    type Host = TokenIter;
    type Batch = PyTokenBatch;
    fn batch(&self, held: TokHeld) -> PyTokenBatch {
        PyTokenBatch { inner: held }
    }
}

iterator_class!(PyTokenIter => PyTokenBatch);
