//! The `TokenIterator` class: an iteration over token batches, waiting as
//! [`crate::shared::iter`] describes (GIL released, Ctrl-C honoured, fork-safe).

use super::batch::PyTokenBatch;
use crate::shared::iter::{iterator_class, Polled};
use pyo3::prelude::*;
use stoker::tokens::TokenIter;

/// An iteration over token batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, weakref, name = "TokenIterator", module = "stoker._stoker")]
pub struct PyTokenIter {
    pub(super) polled: Polled<TokenIter>,
}

iterator_class!(PyTokenIter: TokenIter => PyTokenBatch, |_, held| PyTokenBatch { inner: held });
