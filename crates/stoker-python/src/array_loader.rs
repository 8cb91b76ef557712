//! The `ArrayLoader` class: rows of NumPy arrays or memory-mapped `.npy` files, batched.

use crate::args::{args_of, elastic_json, elastic_of, epoch_of, load_state_json, load_states_json};
use crate::array_batch::ColumnSpec;
use crate::array_iter::{ArrIter, PyArrayIter};
use crate::errors::{self, IntoPy};
use crate::iter::raise_pending_signal;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;
use stoker::arrays::{ArrayLoader, Column};
use stoker::SamplerState;
use stoker_cuda::{DeviceStage, Target};

/// A loader over equally long arrays. Each column is a `.npy` path (memory-mapped) or an object
/// exporting a C-contiguous buffer (a NumPy array, `bytes`, `bytearray`, ...), read in place
/// through the buffer protocol while the loader holds the export.
#[pyclass(frozen, name = "ArrayLoader", module = "stoker._stoker")]
pub struct PyArrayLoader {
    loader: ArrayLoader,
    specs: Arc<Vec<ColumnSpec>>,
    stage: Option<DeviceStage>,
    device: String,
    device_report: stoker::telemetry::DeviceReport,
    sampler: stoker::SamplerSpec,
}

impl PyArrayLoader {
    fn open(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        config_json: &str,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        let config = stoker::args::array_config(args_of(config_json)?).py_err()?;
        let target = py.detach(|| Target::resolve(device, ordinal)).py_err()?;
        let mut cols = vec![];
        let mut specs = vec![];
        for (k, c) in columns.into_iter().enumerate() {
            if let Ok(path) = c.extract::<PathBuf>() {
                let (col, h) = py.detach(|| Column::from_npy(&path)).py_err()?;
                specs.push(ColumnSpec { descr: h.descr, row_shape: h.shape[1..].to_vec() });
                cols.push(col);
            } else {
                let (held, ptr, layout) = crate::buffer::hold(&c, k)?;
                let owner: Arc<dyn Send + Sync> = Arc::new(held);
                // SAFETY: `ptr` is the first byte of a held C-contiguous export of
                // `rows * row_bytes` bytes (checked by `hold`); `owner` holds the export, so
                // the memory stays valid and in place while the column lives.
                let col = unsafe { Column::from_raw(ptr, layout.rows, layout.row_bytes, owner) };
                specs.push(ColumnSpec { descr: layout.descr, row_shape: layout.row_shape });
                cols.push(col);
            }
        }
        let sampler = config.sampler.clone();
        let on = py.detach(|| target.array_loader(cols, config)).py_err()?;
        Ok(PyArrayLoader {
            loader: on.loader,
            specs: Arc::new(specs),
            stage: on.stage,
            device: on.device.used.clone(),
            device_report: on.device,
            sampler,
        })
    }
}

#[pymethods]
impl PyArrayLoader {
    #[new]
    #[pyo3(signature = (columns, config_json, device="cpu", ordinal=0))]
    fn new(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        config_json: &str,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        errors::contain(|| Self::open(py, columns, config_json, device, ordinal))
    }

    /// Where batches are delivered: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.sampler.batch_size
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.sampler.rank
    }

    /// Ranks sharing the rows.
    #[getter]
    fn world_size(&self) -> usize {
        self.sampler.world_size
    }

    /// `{requested, used, note}` of the `device=` argument, as JSON.
    fn device_report_json(&self) -> String {
        serde_json::to_string(&self.device_report).unwrap_or_default()
    }

    fn __len__(&self) -> usize {
        self.loader.len()
    }

    /// Copy threads.
    #[getter]
    fn threads(&self) -> usize {
        self.loader.threads()
    }

    /// Batches currently held by Python.
    #[getter]
    fn held(&self) -> usize {
        self.loader.held()
    }

    /// `(descr, row_shape)` per column.
    fn columns(&self) -> Vec<(String, Vec<usize>)> {
        self.specs.iter().map(|s| (s.descr.clone(), s.row_shape.clone())).collect()
    }

    /// Selects the epoch; the engine checks the value (a non-negative integer).
    fn set_epoch(&self, epoch: &Bound<'_, PyAny>) -> PyResult<()> {
        self.loader.set_epoch(epoch_of(epoch)?);
        Ok(())
    }

    fn state(&self) -> (u64, u64, usize) {
        let s = self.loader.state();
        (s.seed, s.epoch, s.next_batch)
    }

    /// The elastic base of the current epoch as JSON (`None`: a normal epoch).
    fn elastic_json(&self) -> PyResult<Option<String>> {
        errors::contain(|| elastic_json(self.loader.elastic()))
    }

    /// Restores a position (of the elastic epoch `elastic_json`, when given); `resume=False`
    /// keeps it only as the position (a fork child continuing its parent's loader), not as a
    /// point the next iteration resumes from.
    #[pyo3(signature = (seed, epoch, next_batch, resume=true, elastic_json=None))]
    fn load_state(
        &self,
        seed: u64,
        epoch: u64,
        next_batch: usize,
        resume: bool,
        elastic_json: Option<&str>,
    ) -> PyResult<()> {
        errors::contain(|| {
            let elastic = elastic_of(elastic_json)?;
            self.loader.adopt_state(SamplerState { seed, epoch, next_batch }, elastic, resume).py_err()
        })
    }

    /// Whether a loaded state waits for the next iteration.
    #[getter]
    fn resume_pending(&self) -> bool {
        self.loader.resume_pending()
    }

    /// What a saved state is valid for, as JSON.
    fn fingerprint_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.loader.fingerprint())
            .map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
    }

    /// Restores a state dict given as JSON (`load_state_dict`): checked field by field and
    /// against this loader's fingerprint, each error naming the field.
    fn load_state_json(&self, py: Python<'_>, state_json: &str) -> PyResult<()> {
        errors::contain(|| {
            load_state_json(state_json, &self.loader.fingerprint(), |st| {
                // An elastic epoch's order is computed on loading: without the GIL.
                py.detach(|| match st.elastic {
                    Some(e) => self.loader.load_elastic(st.state, e),
                    None => self.loader.load_state(st.state),
                })
            })
        })
    }

    /// Continues a run saved by several ranks: the JSON list of every rank's state dict (any
    /// number of ranks; the rows no saved rank delivered are dealt to this loader's ranks).
    fn load_states_json(&self, py: Python<'_>, states_json: &str) -> PyResult<()> {
        errors::contain(|| {
            load_states_json(states_json, &self.loader.fingerprint(), |st| {
                py.detach(|| self.loader.load_elastic(st.state, st.elastic.unwrap_or_default()))
            })
        })
    }

    fn iter(&self, py: Python<'_>) -> PyResult<PyArrayIter> {
        errors::contain(|| {
            let it = py.detach(|| ArrIter::start(self.loader.iter()?, self.stage.as_ref(), None)).py_err()?;
            let it = raise_pending_signal(py, it)?;
            Ok(PyArrayIter::new(it, self.specs.clone()))
        })
    }
}
