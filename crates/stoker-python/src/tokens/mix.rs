//! The `TokenMixLoader` class: a weighted mixture of token sources, row by row, and its
//! `TokenMixIterator` (its batches are `TokenBatch`es, with `sources`). Its state dicts are of
//! the mixture's shape: each source's place is that source's token state dict.

use super::batch::PyTokenBatch;
use super::loader::tokenizer_of;
use crate::errors::{self, IntoPy};
use crate::shared::args::args_of;
use crate::shared::iter::{iterator_class, Polled};
use crate::shared::loader::{loader_class, LoaderClass};
use pyo3::prelude::*;
use stoker::tokens::pipeline::{TokenMixIter, TokenMixLoader};
use stoker_cuda::{OnDevice, Target};

/// A weighted mixture of token sources (see the Python `stoker.TokenLoader` given a dict).
#[pyclass(frozen, name = "TokenMixLoader", module = "stoker._stoker")]
pub struct PyTokenMixLoader {
    on: OnDevice<TokenMixLoader>,
}

/// An iteration over a token mixture's batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, weakref, name = "TokenMixIterator", module = "stoker._stoker")]
pub struct PyTokenMixIter {
    polled: Polled<TokenMixIter>,
}

iterator_class!(PyTokenMixIter: TokenMixIter => PyTokenBatch, |_, held| PyTokenBatch { inner: held });

impl LoaderClass for PyTokenMixLoader {
    type Host = TokenMixIter;
    type Iterator = PyTokenMixIter;
    fn sharding(&self) -> (usize, usize, usize) {
        let c = self.on.loader.config();
        (c.batch_size, c.rank, c.world_size)
    }
    fn iterator(&self, polled: Polled<TokenMixIter>) -> PyTokenMixIter {
        PyTokenMixIter { polled }
    }
}

loader_class! { PyTokenMixLoader => PyTokenMixIter, shares [], {
    /// `config_json`: the loader's arguments with `mixture` (the sources, their data and
    /// weights); `tokenizer_json`: a tokenizer's JSON text, when it was given as an object.
    #[new]
    #[pyo3(signature = (config_json, tokenizer_json=None, device="cpu", ordinal=0))]
    fn new(py: Python<'_>, config_json: &str, tokenizer_json: Option<String>, device: &str, ordinal: u32) -> PyResult<Self> {
        errors::contain(|| {
            let (config, tok_path) = stoker::args::token_config(args_of(config_json)?).py_err()?;
            if config.mixture.is_none() {
                return Err(errors::config("mixture", "a TokenMixLoader needs a mixture"));
            }
            let target = py.detach(|| Target::resolve(device, ordinal)).py_err()?;
            let on = py
                .detach(|| target.token_mixture(tokenizer_of(tokenizer_json, tok_path)?, config))
                .py_err()?;
            Ok(PyTokenMixLoader { on })
        })
    }

    /// Batches per epoch on this rank; a `TypeError` when a source that stops the mixture
    /// ends the epoch (known only once its pass is tokenized).
    fn __len__(&self) -> PyResult<usize> {
        self.on.loader.len().ok_or_else(|| {
            pyo3::exceptions::PyTypeError::new_err(
                "a token mixture with a source that stops it (exhausted='stop') has no length before it is tokenized",
            )
        })
    }

    /// Whether a source stops the mixture's epoch when its pass runs out.
    #[getter]
    fn stops(&self) -> bool {
        self.on.loader.stops()
    }

    /// Documents in all the sources (all ranks).
    #[getter]
    fn documents(&self) -> u64 {
        self.on.loader.sources().iter().map(|s| s.documents()).sum()
    }

    /// Tokens per row.
    #[getter]
    fn seq_len(&self) -> usize {
        self.on.loader.config().seq_len
    }

    /// `(bos, eos, pad)` token ids (`None` where there is none).
    fn special_ids(&self) -> (Option<u32>, Option<u32>, u32) {
        self.on.loader.special_ids()
    }

    /// The sources as JSON: `[{name, weight, share}]`, in the order of their ids.
    fn sources_json(&self) -> String {
        let (spec, w) = (self.on.loader.spec(), self.on.loader.weights());
        let list: Vec<serde_json::Value> = spec
            .parts
            .iter()
            .enumerate()
            .map(|(d, p)| serde_json::json!({"name": p.name, "weight": p.weight, "share": w.share(d)}))
            .collect();
        serde_json::Value::Array(list).to_string()
    }


} }
