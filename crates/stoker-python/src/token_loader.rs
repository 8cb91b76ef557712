//! The `TokenLoader`, `TokenIterator`, `TokenBatch` and `TokenTensor` classes: packed token
//! rows from text or token files, exported through DLPack (host memory, or a GPU's through
//! stoker's transfer stage with `device='cuda'`).

use crate::args::{args_of, epoch_of};
use crate::dlpack::{DLDataType, View};
use crate::errors::{self, IntoPy};
use crate::iter::{forget_if_inherited, next_polling, raise_pending_signal, release, SIGNAL_POLL};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Mutex;
use stoker::tokens::{TextTokenizer, TokenBatch, TokenIter, TokenLoader};
use stoker_cuda::{DeviceStage, Target};

/// A token iteration: from the host pool, or through the transfer stage.
type TokIter = crate::device::Iter<TokenIter>;
/// A token batch in host or device memory.
type TokHeld = crate::device::Held<TokenBatch>;

/// A loader of packed token rows (see the Python `stoker.TokenLoader`).
#[pyclass(frozen, name = "TokenLoader", module = "stoker._stoker")]
pub struct PyTokenLoader {
    loader: TokenLoader,
    stage: Option<DeviceStage>,
    device_report: stoker::telemetry::DeviceReport,
}

#[pymethods]
impl PyTokenLoader {
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
                    let tokenizer = match (tokenizer_json, tok_path) {
                        (Some(json), _) => {
                            Some(TextTokenizer::from_json(json.as_bytes(), "<tokenizer object>".as_ref())?)
                        }
                        (None, Some(p)) => Some(TextTokenizer::from_file(&p)?),
                        (None, None) => None,
                    };
                    target.token_loader(&stoker::tokens::expand_paths(&paths)?, tokenizer, config)
                })
                .py_err()?;
            Ok(PyTokenLoader { loader: on.loader, stage: on.stage, device_report: on.device })
        })
    }

    /// Where batches are delivered: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.device_report.used.clone()
    }

    /// `{requested, used, note}` of the `device=` argument, as JSON.
    fn device_report_json(&self) -> String {
        serde_json::to_string(&self.device_report).unwrap_or_default()
    }

    /// Documents in the data (all ranks).
    #[getter]
    fn documents(&self) -> u64 {
        self.loader.documents()
    }

    /// Batches per epoch on this rank, when known before tokenizing (token files).
    #[getter]
    fn batches_per_epoch(&self) -> Option<usize> {
        self.loader.batches_per_epoch()
    }

    /// Tokenizer threads.
    #[getter]
    fn threads(&self) -> usize {
        self.loader.threads()
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.loader.config().batch_size
    }

    /// Tokens per row.
    #[getter]
    fn seq_len(&self) -> usize {
        self.loader.config().seq_len
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.loader.config().rank
    }

    /// Ranks sharing the documents.
    #[getter]
    fn world_size(&self) -> usize {
        self.loader.config().world_size
    }

    /// `(bos, eos, pad)` token ids (`None` where there is none).
    fn special_ids(&self) -> (Option<u32>, Option<u32>, u32) {
        self.loader.special_ids()
    }

    /// Batches currently held by Python.
    #[getter]
    fn held(&self) -> usize {
        self.loader.held()
    }

    /// Selects the epoch; the engine checks the value.
    fn set_epoch(&self, epoch: &Bound<'_, PyAny>) -> PyResult<()> {
        self.loader.set_epoch(epoch_of(epoch)?);
        Ok(())
    }

    /// The counters (documents, tokens, padding, seconds per stage) as JSON.
    fn stats_json(&self) -> String {
        self.loader.stats().to_json().to_string()
    }

    /// The `trace=` file, when tracing is on.
    #[getter]
    fn trace_path(&self) -> Option<String> {
        self.loader.trace_path().map(|p| p.display().to_string())
    }

    /// Writes the trace recorded so far to `path` (default: the `trace=` file) now, with the
    /// GIL released; returns the path written.
    #[pyo3(signature = (path=None))]
    fn save_trace(&self, py: Python<'_>, path: Option<std::path::PathBuf>) -> PyResult<String> {
        errors::contain(|| {
            let path = path.or_else(|| self.loader.trace_path().map(std::path::PathBuf::from)).ok_or_else(|| {
                errors::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
            })?;
            py.detach(|| self.loader.write_trace(&path)).py_err()?;
            Ok(path.display().to_string())
        })
    }

    /// The counters with the wall time since the first iteration and the bottleneck verdict,
    /// as JSON.
    fn report_json(&self) -> String {
        self.loader.report().to_string()
    }

    /// The state dict as JSON.
    fn state_json(&self) -> PyResult<String> {
        let st = self.loader.state();
        let v = serde_json::json!({
            "version": 1, "kind": "tokens", "seed": st.seed, "epoch": st.epoch, "next_batch": st.next_batch,
            "cursor_epoch": st.at.epoch, "cursor": st.at.cursor, "offset": st.at.offset,
            "elastic": st.elastic, "fingerprint": self.loader.fingerprint(),
        });
        Ok(v.to_string())
    }

    /// Restores a state dict given as JSON, checked field by field and against this loader.
    fn load_state_json(&self, state_json: &str) -> PyResult<()> {
        errors::contain(|| {
            let v: serde_json::Value = serde_json::from_str(state_json)
                .map_err(|e| errors::config("state", format!("expected a dict from state_dict(), not JSON: {e}")))?;
            let st = stoker::args::token_state(&v, &self.loader.fingerprint(), false).py_err()?;
            self.loader.load_state(st).py_err()
        })
    }

    /// Continues a run saved by several ranks: the JSON list of every rank's state dict
    /// (any number of ranks; the documents no saved rank finished are dealt anew).
    fn load_states_json(&self, states_json: &str) -> PyResult<()> {
        errors::contain(|| {
            let v: serde_json::Value = serde_json::from_str(states_json)
                .map_err(|e| errors::config("state", format!("expected a list of state_dict()s, not JSON: {e}")))?;
            let list = v.as_array().ok_or_else(|| errors::config("state", "expected a list of state_dict()s"))?;
            let mine = self.loader.fingerprint();
            let mut states = Vec::with_capacity(list.len());
            for (k, one) in list.iter().enumerate() {
                let st = stoker::args::token_state(one, &mine, true)
                    .map_err(|e| errors::config("state", format!("state {k} of the list: {e}")))?;
                let fp = &one["fingerprint"];
                let (rank, world) =
                    (fp["rank"].as_u64().unwrap_or(0) as usize, fp["world_size"].as_u64().unwrap_or(0) as usize);
                states.push((st, rank, world));
            }
            self.loader.load_states(&states).py_err()
        })
    }

    /// Whether a loaded state waits for the next iteration.
    #[getter]
    fn resume_pending(&self) -> bool {
        self.loader.resume_pending()
    }

    fn iter(&self, py: Python<'_>) -> PyResult<PyTokenIter> {
        errors::contain(|| {
            let it = py.detach(|| TokIter::start(self.loader.iter()?, self.stage.as_ref(), None)).py_err()?;
            let it = raise_pending_signal(py, it)?;
            Ok(PyTokenIter { inner: Mutex::new(Some(it)), pid: std::process::id() })
        })
    }
}

/// An iteration over token batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, weakref, name = "TokenIterator", module = "stoker._stoker")]
pub struct PyTokenIter {
    inner: Mutex<Option<TokIter>>,
    pid: u32,
}

#[pymethods]
impl PyTokenIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyTokenBatch>> {
        errors::contain(|| {
            Ok(next_polling(py, &self.inner, self.pid, |it| it.next_timeout(SIGNAL_POLL))?
                .map(|inner| PyTokenBatch { inner }))
        })
    }

    /// Stops the iteration now (joins every thread, GIL released).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        release(py, &self.inner, self.pid);
        py.check_signals()
    }
}

impl Drop for PyTokenIter {
    fn drop(&mut self) {
        forget_if_inherited(&mut self.inner, self.pid);
    }
}

/// One batch of packed rows.
#[pyclass(frozen, name = "TokenBatch", module = "stoker._stoker")]
pub struct PyTokenBatch {
    inner: TokHeld,
}

/// What a batch's views need besides its memory: rows, tokens per row, values of `cu_seqlens`,
/// the longest segment.
fn shape_of(b: &TokHeld) -> (usize, usize, usize, usize) {
    match b {
        crate::device::Held::Host(h) => (h.rows(), h.seq_len(), h.cu_seqlens().len(), h.max_seqlen()),
        crate::device::Held::Device(d) => {
            let m = d.meta();
            (m.rows, m.seq_len, m.cu_len, m.max_seqlen)
        }
    }
}

/// The arrays of a batch, by name.
const FIELDS: [&str; 4] = ["input_ids", "labels", "position_ids", "cu_seqlens"];

#[pymethods]
impl PyTokenBatch {
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.inner.device()
    }

    /// Batch number since the epoch's start.
    #[getter]
    fn index(&self) -> usize {
        self.inner.index()
    }

    /// The longest segment (FlashAttention's `max_seqlen`).
    #[getter]
    fn max_seqlen(&self) -> usize {
        shape_of(&self.inner).3
    }

    /// The array `name` (`input_ids`, `labels`, `position_ids`, `cu_seqlens`) as a
    /// DLPack-exporting view.
    fn field(&self, name: &str) -> PyResult<PyTokenTensor> {
        let field = FIELDS
            .iter()
            .position(|f| *f == name)
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(format!("{name:?}: expected one of {FIELDS:?}")))?;
        Ok(PyTokenTensor { batch: self.inner.clone(), field })
    }
}

/// One array of a token batch (int32, host or device memory), exported with `__dlpack__`.
#[pyclass(frozen, name = "TokenTensor", module = "stoker._stoker")]
pub struct PyTokenTensor {
    batch: TokHeld,
    field: usize,
}

#[pymethods]
impl PyTokenTensor {
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
        let (rows, seq_len, cu_len, _) = shape_of(&self.batch);
        let shape = match self.field {
            3 => vec![cu_len as i64],
            _ => vec![rows as i64, seq_len as i64],
        };
        let (data, loc, owner) = self.batch.region(self.field);
        let view = View { data, shape, dtype: DLDataType::new(0, 32), owner };
        crate::device::export(py, &loc, view, stream, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.batch.region(self.field).1.dlpack_device()
    }

    /// Address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.batch.region(self.field).0 as usize
    }
}
