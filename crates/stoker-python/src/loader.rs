//! The `Loader` class: an image dataset opened and configured, the start of every iteration.

use crate::args::{args_of, elastic_json, elastic_of, epoch_of, load_state_json, load_states_json};
use crate::errors::{self, IntoPy};
use crate::iter::{raise_pending_signal, Iter, PyIter};
use pyo3::prelude::*;
use std::path::PathBuf;
use stoker::{Loader, SamplerState};
use stoker_cuda::{DeviceStage, Target};

/// A loader over a dataset (an ImageFolder root, a pack folder, shards or URLs), configured by
/// the user's arguments as JSON, which the engine checks ([`stoker::args::loader_config`]).
#[pyclass(frozen, name = "Loader", module = "stoker._stoker")]
pub struct PyLoader {
    loader: Loader,
    /// Exact class names (bytes on Linux): Python gets them as `os.listdir` shows them.
    classes: Vec<std::ffi::OsString>,
    samples: usize,
    sampler: stoker::SamplerSpec,
    /// The transfer stage when batches go to a GPU.
    stage: Option<DeviceStage>,
    device: String,
    /// How the GPU side normalises batches that crossed the bus as uint8 (decided in
    /// `stoker::args::image_config`), when they go to a GPU.
    normalize: Option<stoker::ops::DeviceNormalize>,
}

impl PyLoader {
    fn open(py: Python<'_>, roots: Vec<String>, args_json: &str, device: &str, ordinal: u32) -> PyResult<Self> {
        // The device first: a GPU that is asked for and unusable is the error, before any other.
        let target = py.detach(|| Target::resolve(device, ordinal)).py_err()?;
        let (config, normalize) = stoker::args::image_config(args_of(args_json)?, target.on_gpu()).py_err()?;
        py.detach(move || {
            let dataset = stoker::source::open(&roots)?;
            let samples = dataset.source.len();
            let sampler = config.sampler.clone();
            let on = target.image_loader(&dataset, config)?;
            let device = on.device.used;
            let (loader, classes, stage) = (on.loader, dataset.classes, on.stage);
            Ok(PyLoader { loader, classes, samples, sampler, stage, device, normalize })
        })
        .py_err()
    }
}

#[pymethods]
impl PyLoader {
    /// Opens `roots` (what [`stoker::source::detect`] makes of them) with the GIL released and
    /// allocates the buffer pool: pinned, plus a device pool and the transfer stage, when
    /// `device` names a GPU (`cuda` means `cuda:{ordinal}`).
    #[new]
    #[pyo3(signature = (roots, args_json, device="cpu", ordinal=0))]
    fn new(py: Python<'_>, roots: Vec<String>, args_json: &str, device: &str, ordinal: u32) -> PyResult<Self> {
        errors::contain(|| Self::open(py, roots, args_json, device, ordinal))
    }

    /// Whether a loaded state waits for the next iteration.
    #[getter]
    fn resume_pending(&self) -> bool {
        self.loader.resume_pending()
    }

    /// What a saved state is valid for, as JSON (see `stoker::Fingerprint`).
    fn fingerprint_json(&self, py: Python<'_>) -> PyResult<String> {
        errors::contain(|| {
            let fp = py.detach(|| self.loader.fingerprint().clone());
            serde_json::to_string(&fp).map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
        })
    }

    /// Restores a state dict given as JSON (`load_state_dict`): checked field by field and
    /// against this loader's fingerprint, each error naming the field.
    fn load_state_json(&self, py: Python<'_>, state_json: &str) -> PyResult<()> {
        errors::contain(|| {
            let mine = py.detach(|| self.loader.fingerprint().clone());
            load_state_json(state_json, &mine, |st| {
                // An elastic epoch's order is computed on loading: without the GIL.
                py.detach(|| match st.elastic {
                    Some(e) => self.loader.load_elastic(st.state, e),
                    None => self.loader.load_state(st.state),
                })
            })
        })
    }

    /// Continues a run saved by several ranks: the JSON list of every rank's state dict (any
    /// number of ranks; the samples no saved rank delivered are dealt to this loader's ranks).
    fn load_states_json(&self, py: Python<'_>, states_json: &str) -> PyResult<()> {
        errors::contain(|| {
            let mine = py.detach(|| self.loader.fingerprint().clone());
            load_states_json(states_json, &mine, |st| {
                py.detach(|| self.loader.load_elastic(st.state, st.elastic.unwrap_or_default()))
            })
        })
    }

    /// Samples per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.sampler.batch_size
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.sampler.rank
    }

    /// Ranks sharing the dataset.
    #[getter]
    fn world_size(&self) -> usize {
        self.sampler.world_size
    }

    /// How batches delivered to a GPU as uint8 are normalised there, as JSON
    /// (`{mean, std, dtype, channels_last}`), or `null` when they are not.
    fn device_normalize_json(&self) -> String {
        serde_json::to_string(&self.normalize).unwrap_or_else(|_| "null".into())
    }

    /// Where batches are delivered: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    /// `"pageable"` or `"pinned"`: the host memory of the batch buffers.
    #[getter]
    fn host_memory(&self) -> &'static str {
        self.loader.pool().memory_kind()
    }

    /// Device batch buffers (0 for host batches).
    #[getter]
    fn device_slots(&self) -> usize {
        self.stage.as_ref().map_or(0, |s| s.slots())
    }

    fn __len__(&self) -> usize {
        self.loader.len()
    }

    /// Class names in label order, as `os.listdir` shows them (a name that is not UTF-8 has
    /// `surrogateescape` escapes).
    #[getter]
    fn classes(&self) -> Vec<std::ffi::OsString> {
        self.classes.clone()
    }

    /// Samples in the dataset (all ranks).
    #[getter]
    fn num_samples(&self) -> usize {
        self.samples
    }

    /// Decode threads.
    #[getter]
    fn threads(&self) -> usize {
        self.loader.threads()
    }

    /// I/O threads.
    #[getter]
    fn io_threads(&self) -> usize {
        self.loader.io_threads()
    }

    /// Batch buffers in the pool.
    #[getter]
    fn pool_slots(&self) -> usize {
        self.loader.pool().slots()
    }

    /// Bytes of one batch buffer.
    #[getter]
    fn batch_bytes(&self) -> usize {
        self.loader.pool().batch_bytes()
    }

    /// Start addresses of the pool's batch buffers (for zero-copy checks).
    fn buffer_addresses(&self) -> Vec<usize> {
        self.loader.pool().addresses().to_vec()
    }

    /// Batches currently held by Python (tensors/arrays alive).
    #[getter]
    fn held(&self) -> usize {
        self.loader.pool().held()
    }

    /// One sample's shape.
    #[getter]
    fn sample_shape(&self) -> Vec<usize> {
        self.loader.plan().sample_shape().to_vec()
    }

    /// Output dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.loader.plan().spec().dtype.name()
    }

    /// Selects the epoch; the engine checks the value (a non-negative integer).
    fn set_epoch(&self, epoch: &Bound<'_, PyAny>) -> PyResult<()> {
        self.loader.set_epoch(epoch_of(epoch)?);
        Ok(())
    }

    /// `(seed, epoch, next_batch)`.
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

    /// Telemetry as a JSON string.
    fn report_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.loader.report()).map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
    }

    /// The human summary.
    fn report_text(&self) -> String {
        self.loader.report().to_text()
    }

    fn reset_report(&self) {
        self.loader.reset_report();
    }

    /// The trace file (`trace=`), or None when tracing is off.
    #[getter]
    fn trace_path(&self) -> Option<String> {
        self.loader.trace_path().map(|p| p.display().to_string())
    }

    /// Writes the trace recorded so far to `path` (default: the `trace=` file) now, with the
    /// GIL released; returns the path written.
    #[pyo3(signature = (path=None))]
    fn save_trace(&self, py: Python<'_>, path: Option<PathBuf>) -> PyResult<String> {
        errors::contain(|| {
            let path = path.or_else(|| self.loader.trace_path().map(PathBuf::from)).ok_or_else(|| {
                errors::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
            })?;
            py.detach(|| self.loader.write_trace(&path)).py_err()?;
            Ok(path.display().to_string())
        })
    }

    /// Starts iterating from the current state; ends any previous iteration of this loader.
    fn iter(&self, py: Python<'_>) -> PyResult<PyIter> {
        errors::contain(|| self.start(py))
    }
}

impl PyLoader {
    fn start(&self, py: Python<'_>) -> PyResult<PyIter> {
        let it = py
            .detach(|| Iter::start(self.loader.iter()?, self.stage.as_ref(), Some(self.loader.telemetry().clone())))
            .py_err()?;
        let it = raise_pending_signal(py, it)?;
        Ok(PyIter::new(it))
    }
}
