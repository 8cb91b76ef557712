//! The `TokenLoader` class: packed token rows from text or token files. Its shared methods
//! come from [`loader_class!`]; here is what only tokens have, their state dicts included (a
//! token position is a document cursor, not a sampler state).

use super::iter::PyTokenIter;
use crate::errors::{self, IntoPy};
use crate::shared::args::args_of;
use crate::shared::iter::Polled;
use crate::shared::loader::{loader_class, LoaderClass};
use pyo3::prelude::*;
use stoker::tokens::{TextTokenizer, TokenIter, TokenLoader};
use stoker_cuda::{OnDevice, Target};

/// A loader of packed token rows (see the Python `stoker.TokenLoader`).
#[pyclass(frozen, name = "TokenLoader", module = "stoker._stoker")]
pub struct PyTokenLoader {
    /// The engine's loader, the transfer stage when batches go to a GPU, and the device used.
    on: OnDevice<TokenLoader>,
}

/// The tokenizer a loader was given: its JSON text (a `tokenizers` object from Python), else
/// the `tokenizer.json` path among the arguments, else none (token files).
pub(super) fn tokenizer_of(
    json: Option<String>,
    path: Option<std::path::PathBuf>,
) -> stoker::Result<Option<TextTokenizer>> {
    Ok(match (json, path) {
        (Some(json), _) => Some(TextTokenizer::from_json(json.as_bytes(), "<tokenizer object>".as_ref())?),
        (None, Some(p)) => Some(TextTokenizer::from_file(&p)?),
        (None, None) => None,
    })
}

/// The state dict of `loader` standing at `st` (a token mixture keeps one per source).
impl LoaderClass for PyTokenLoader {
    type Host = TokenIter;
    type Iterator = PyTokenIter;
    fn sharding(&self) -> (usize, usize, usize) {
        let c = self.on.loader.config();
        (c.batch_size, c.rank, c.world_size)
    }
    fn iterator(&self, polled: Polled<TokenIter>) -> PyTokenIter {
        PyTokenIter { polled }
    }
}

loader_class! { PyTokenLoader => PyTokenIter, shares [traced device_report], {
    /// `paths`: the data (files, globs, folders); `tokenizer_json`: a tokenizer's JSON text, when it was given
    /// as an object rather than a path (`tokenizer` in `config_json`).
    #[new]
    #[pyo3(signature = (paths, config_json, tokenizer_json=None, device="cpu", ordinal=0))]
    fn new(
        py: Python<'_>,
        paths: Vec<String>,
        config_json: &str,
        tokenizer_json: Option<String>,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        errors::contain(|| {
            let (config, tok_path) = stoker::args::token_config(args_of(config_json)?).py_err()?;
            let target = py.detach(|| Target::resolve(device, ordinal)).py_err()?;
            let on = py
                .detach(|| {
                    let tokenizer = tokenizer_of(tokenizer_json, tok_path)?;
                    target.token_loader(&stoker::tokens::expand_paths(&paths)?, tokenizer, config)
                })
                .py_err()?;
            Ok(PyTokenLoader { on })
        })
    }

    /// Documents in the data (all ranks).
    #[getter]
    fn documents(&self) -> u64 {
        self.on.loader.documents()
    }

    /// Batches per epoch on this rank, when known before tokenizing (token files).
    #[getter]
    fn batches_per_epoch(&self) -> Option<usize> {
        self.on.loader.batches_per_epoch()
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

    /// The counters (documents, tokens, padding, seconds per stage) as JSON.
    fn stats_json(&self) -> String {
        serde_json::to_string(&self.on.loader.stats().counts(self.on.loader.consumer_wait())).unwrap_or_default()
    }
} }
