//! The `Loader`, `Iterator`, `Batch` and `Tensor` classes.

use crate::device::{self, Location};
use crate::dlpack::{DLDataType, View};
use crate::errors::{self, IntoPy};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoker::{Batch, DType, EpochIter, Loader, SamplerState};
use stoker_cuda::{DeviceRegion, DeviceStage};

/// How long one wait lasts before Python gets a chance to handle signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

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
}

/// A Python scalar as the JSON value the engine's argument rules read: bool, int, float, str
/// and None; anything else is shown by its repr (and refused by the rule).
pub fn json_of(v: &Bound<'_, PyAny>) -> serde_json::Value {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
    if v.is_none() {
        serde_json::Value::Null
    } else if let Ok(b) = v.cast::<PyBool>() {
        serde_json::Value::Bool(b.is_true())
    } else if v.is_instance_of::<PyInt>() {
        match (v.extract::<u64>(), v.extract::<i64>()) {
            (Ok(n), _) => n.into(),
            (_, Ok(n)) => n.into(),
            _ => serde_json::Value::String(v.to_string()),
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        serde_json::Number::from_f64(f.value()).map_or(serde_json::Value::Null, serde_json::Value::Number)
    } else if let Ok(s) = v.cast::<PyString>() {
        serde_json::Value::String(s.to_string())
    } else {
        serde_json::Value::String(v.repr().map(|r| r.to_string()).unwrap_or_default())
    }
}

/// Loads a state dict (its JSON, from `load_state_dict`) into a loader whose fingerprint is
/// `mine`: the engine checks it field by field ([`stoker::args::saved_state`]), then `load`
/// restores the position.
pub fn load_state_json(
    json: &str,
    mine: &stoker::Fingerprint,
    load: impl FnOnce(SamplerState) -> stoker::Result<()>,
) -> PyResult<()> {
    let state: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| errors::config("state", format!("expected a dict from state_dict(), not JSON: {e}")))?;
    let st = stoker::args::saved_state(&state, mine).py_err()?;
    load(st).py_err()
}

/// An `epoch` argument, checked by the engine.
pub fn epoch_of(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    stoker::args::non_negative("epoch", &json_of(v)).py_err()
}

/// The arguments object of a JSON text.
pub fn args_of(json: &str) -> PyResult<stoker::args::Args> {
    serde_json::from_str(json).map_err(|e| errors::config("arguments", format!("not a JSON object: {e}")))
}

impl PyLoader {
    fn open(py: Python<'_>, roots: Vec<String>, args_json: &str, device: &str, ordinal: u32) -> PyResult<Self> {
        let config = stoker::args::loader_config(args_of(args_json)?).py_err()?;
        let (placement, report) = py.detach(|| stoker_cuda::place(device, ordinal)).py_err()?;
        py.detach(move || {
            let dataset = stoker::source::open(&roots)?;
            let samples = dataset.source.len();
            let sampler = config.sampler.clone();
            let (prefetch, limit) = (config.prefetch, config.memory_limit);
            let loader = Loader::new_in(dataset.source, config, placement.allocator().as_ref())?;
            loader.report_not_samples(&dataset.not_samples);
            // Labels get device buffers of their own, so keeping them never keeps the images'.
            let tracer = loader.tracer().cloned();
            let stage = placement
                .stage(stoker_cuda::image_regions(&loader), prefetch, limit)?
                .map(|s| s.with_detached(&[1]).with_tracer(tracer));
            let device = report.used.clone();
            loader.telemetry().set_device(report);
            Ok(PyLoader { loader, classes: dataset.classes, samples, sampler, stage, device })
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
            load_state_json(state_json, &mine, |st| self.loader.load_state(st))
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

    /// Restores a position; `resume=False` keeps it only as the position (a fork child
    /// continuing its parent's loader), not as a point the next iteration resumes from.
    #[pyo3(signature = (seed, epoch, next_batch, resume=true))]
    fn load_state(&self, seed: u64, epoch: u64, next_batch: usize, resume: bool) -> PyResult<()> {
        errors::contain(|| self.loader.adopt_state(SamplerState { seed, epoch, next_batch }, resume).py_err())
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
        Ok(PyIter { inner: Mutex::new(Some(it)), pid: std::process::id() })
    }
}

type Iter = device::Iter<EpochIter>;
type Held = device::Held<Batch>;

/// An iteration over (the rest of) an epoch. Waits release the GIL; Ctrl-C is honoured
/// between 50 ms waits and stops every worker thread.
#[pyclass(frozen, weakref, name = "Iterator", module = "stoker._stoker")]
pub struct PyIter {
    inner: Mutex<Option<Iter>>,
    pid: u32,
}

/// The next item of a native iteration, waiting with the GIL released in short steps so that
/// Ctrl-C (checked between steps) stops the iteration and joins its threads. The iteration is
/// dropped when it ends or fails; an iteration inherited through `fork()` is refused.
///
/// Signals are checked after every step, whatever it gave: a Ctrl-C that arrived while stoker
/// waited (for a batch, or for the threads of a finished epoch to be joined) is raised from this
/// call. Left pending, it would be raised at the interpreter's next check, which may be inside a
/// finalizer or a weakref callback that runs when the finished iterator is freed; Python reports
/// an exception there as "unraisable" and goes on, so the Ctrl-C would be lost. A batch in hand
/// when the signal is found is dropped (its buffer returns to the pool): it counts as delivered,
/// as it would if the interrupt had come one bytecode later.
pub(crate) fn next_polling<I: Send, B: Send>(
    py: Python<'_>,
    inner: &Mutex<Option<I>>,
    pid: u32,
    poll: impl Fn(&mut I) -> Option<Option<stoker::Result<B>>> + Sync,
) -> PyResult<Option<B>> {
    if std::process::id() != pid {
        return Err(errors::to_py(stoker::Error::Internal(
            "this iteration was started in another process (before a fork); start a new one".into(),
        )));
    }
    loop {
        let step = py.detach(|| {
            let mut guard = inner.lock().unwrap_or_else(|p| p.into_inner());
            let Some(it) = guard.as_mut() else { return Some(None) };
            let r = poll(it);
            if matches!(r, Some(None) | Some(Some(Err(_)))) {
                guard.take();
            }
            r
        });
        if let Err(interrupt) = py.check_signals() {
            let it = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
            py.detach(move || {
                drop(step);
                drop(it);
            });
            return Err(interrupt);
        }
        match step {
            Some(Some(Ok(b))) => return Ok(Some(b)),
            Some(Some(Err(e))) => return Err(errors::to_py(e)),
            Some(None) => return Ok(None),
            None => {}
        }
    }
}

#[pymethods]
impl PyIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyBatch>> {
        errors::contain(|| {
            Ok(next_polling(py, &self.inner, self.pid, |it| it.next_timeout(SIGNAL_POLL))?
                .map(|inner| PyBatch { inner }))
        })
    }

    /// Stops the iteration now (joins every worker thread, GIL released). In a fork child the
    /// inherited iteration is let go without touching its threads, which live in the parent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        release(py, &self.inner, self.pid);
        py.check_signals()
    }
}

impl Drop for PyIter {
    fn drop(&mut self) {
        forget_if_inherited(&mut self.inner, self.pid);
    }
}

/// Raises a Ctrl-C that arrived while stoker waited with the GIL released from the call that
/// waited (see [`next_polling`] for why it must not be left pending); `held` is let go first,
/// with the GIL released.
pub(crate) fn raise_pending_signal<T: Send>(py: Python<'_>, held: T) -> PyResult<T> {
    match py.check_signals() {
        Ok(()) => Ok(held),
        Err(interrupt) => {
            py.detach(move || drop(held));
            Err(interrupt)
        }
    }
}

/// Ends an iteration now: its threads are joined with the GIL released. An iteration
/// inherited through `fork()` is forgotten instead: its threads exist only in the parent, so
/// joining them (or freeing what they use) in the child would panic or hang.
pub(crate) fn release<I: Send>(py: Python<'_>, inner: &Mutex<Option<I>>, pid: u32) {
    let it = inner.lock().unwrap_or_else(|p| p.into_inner()).take();
    if std::process::id() != pid {
        std::mem::forget(it);
        return;
    }
    py.detach(move || drop(it));
}

/// For `Drop`: forgets an iteration inherited through `fork()` (see [`release`]).
pub(crate) fn forget_if_inherited<I>(inner: &mut Mutex<Option<I>>, pid: u32) {
    if std::process::id() != pid {
        let it = inner.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        std::mem::forget(it);
    }
}

/// One batch: views of a pool buffer. Its `images` and `labels` export through DLPack; the
/// buffer returns to the pool when the last view is gone.
#[pyclass(frozen, name = "Batch", module = "stoker._stoker")]
pub struct PyBatch {
    inner: Held,
}

#[pymethods]
impl PyBatch {
    fn __len__(&self) -> usize {
        match &self.inner {
            Held::Host(b) => b.len(),
            Held::Device(b) => b.meta().shape[0],
        }
    }

    /// The images as a DLPack-exporting tensor view.
    #[getter]
    fn images(&self) -> PyTensor {
        PyTensor { src: Source::Images(self.inner.clone()) }
    }

    /// The labels (int64) as a DLPack-exporting tensor view. On a GPU they live in a small
    /// device buffer of their own: keeping them does not keep the images' buffer.
    #[getter]
    fn labels(&self) -> PyTensor {
        match &self.inner {
            Held::Device(b) => match b.detached(1) {
                Some(r) => PyTensor { src: Source::DeviceLabels(r.clone(), b.meta().shape[0]) },
                None => PyTensor { src: Source::Labels(self.inner.clone()) },
            },
            Held::Host(_) => PyTensor { src: Source::Labels(self.inner.clone()) },
        }
    }

    /// Batch number within the epoch.
    #[getter]
    fn index(&self) -> usize {
        match &self.inner {
            Held::Host(b) => b.index(),
            Held::Device(b) => b.meta().index,
        }
    }

    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.inner {
            Held::Host(b) => b.epoch(),
            Held::Device(b) => b.meta().epoch,
        }
    }

    /// Dataset indices of the samples.
    #[getter]
    fn indices(&self) -> Vec<u32> {
        match &self.inner {
            Held::Host(b) => b.indices(),
            Held::Device(b) => b.meta().indices.clone(),
        }
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        match &self.inner {
            Held::Host(_) => "cpu".into(),
            Held::Device(b) => format!("cuda:{}", b.ordinal()),
        }
    }
}

/// A tensor view of a batch's images or labels (host or device memory), exported with
/// `__dlpack__`.
#[pyclass(frozen, name = "Tensor", module = "stoker._stoker")]
pub struct PyTensor {
    src: Source,
}

/// What a tensor view shows.
enum Source {
    /// A batch's images.
    Images(Held),
    /// A batch's labels, in its buffer.
    Labels(Held),
    /// A GPU batch's labels in their own buffer (`len` labels), without the batch.
    DeviceLabels(Arc<DeviceRegion>, usize),
}

fn dl_dtype(d: DType) -> DLDataType {
    match d {
        DType::Uint8 => DLDataType::U8,
        DType::Float16 => DLDataType::F16,
        DType::Float32 => DLDataType::F32,
    }
}

impl PyTensor {
    fn view(&self) -> (View, Location) {
        let (batch, labels) = match &self.src {
            Source::Images(b) => (b, false),
            Source::Labels(b) => (b, true),
            Source::DeviceLabels(r, n) => {
                let owner: Arc<dyn Send + Sync> = r.clone();
                let view = View { data: r.ptr() as *const u8, shape: vec![*n as i64], dtype: DLDataType::I64, owner };
                return (view, Location::Cuda { batch: r.clone(), ordinal: r.ordinal() });
            }
        };
        match batch {
            Held::Host(b) => {
                let owner: Arc<dyn Send + Sync> = b.clone();
                let view = if labels {
                    View {
                        data: b.labels_ptr().cast::<u8>(),
                        shape: vec![b.len() as i64],
                        dtype: DLDataType::I64,
                        owner,
                    }
                } else {
                    View {
                        data: b.data_ptr(),
                        shape: b.shape().iter().map(|&d| d as i64).collect(),
                        dtype: dl_dtype(b.dtype()),
                        owner,
                    }
                };
                (view, Location::Cpu)
            }
            Held::Device(b) => {
                let owner: Arc<dyn Send + Sync> = b.clone();
                let m = b.meta();
                let view = if labels {
                    View {
                        data: b.region_ptr(1) as *const u8,
                        shape: vec![m.shape[0] as i64],
                        dtype: DLDataType::I64,
                        owner,
                    }
                } else {
                    View {
                        data: b.region_ptr(0) as *const u8,
                        shape: m.shape.iter().map(|&d| d as i64).collect(),
                        dtype: dl_dtype(m.dtype),
                        owner,
                    }
                };
                (view, Location::Cuda { batch: b.clone(), ordinal: b.ordinal() })
            }
        }
    }
}

#[pymethods]
impl PyTensor {
    /// DLPack export (zero-copy). For a CUDA batch, `stream` follows the protocol: the
    /// consumer's stream waits (on the GPU) for the copy; for a CPU batch it must be None.
    /// `copy=True` and other devices are refused with `BufferError`, as the protocol specifies.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = max_version; // we export the legacy capsule, which every consumer accepts
        let (view, loc) = self.view();
        device::export(py, &loc, view, stream, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.view().1.dlpack_device()
    }

    /// Shape.
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.view().0.shape
    }

    /// Address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.view().0.data as usize
    }
}

/// Builds the demo ImageFolder (embedded public-domain photos) under `root`; returns the number
/// of JPEGs written.
#[pyfunction]
#[pyo3(signature = (root, images=350, seed=0))]
pub fn make_demo(py: Python<'_>, root: PathBuf, images: usize, seed: u64) -> PyResult<usize> {
    if images == 0 {
        return Err(errors::config("images", "must be at least 1"));
    }
    let threads = stoker::cpu::allowance().effective;
    py.detach(|| stoker::demo::make_demo(&root, images, seed, threads)).py_err().map(|s| s.images)
}

/// torchrun's `LOCAL_RANK` (0 when unset); a value that is not a number is a `ConfigError`.
#[pyfunction]
pub fn local_rank() -> PyResult<u32> {
    stoker::args::local_rank().py_err()
}

/// The canonical name of an output dtype (`uint8`, `float16`, `float32`; aliases such as
/// `half` and `float` accepted), or a `ConfigError` naming `dtype`.
#[pyfunction]
pub fn dtype_name(name: &str) -> PyResult<&'static str> {
    Ok(DType::parse(name).py_err()?.name())
}

/// Checks a `device=` argument: `("cpu" | "cuda" | "auto", ordinal or None)`.
#[pyfunction]
pub fn parse_device(device: &Bound<'_, PyAny>) -> PyResult<(&'static str, Option<u32>)> {
    let text = device.extract::<String>().map_err(|_| {
        errors::config(
            "device",
            format!(
                "expected 'cpu', 'cuda', 'cuda:N' or 'auto', got {}",
                device.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    })?;
    Ok(match stoker::args::DeviceSpec::parse(&text).py_err()? {
        stoker::args::DeviceSpec::Cpu => ("cpu", None),
        stoker::args::DeviceSpec::Cuda(n) => ("cuda", n),
        stoker::args::DeviceSpec::Auto => ("auto", None),
    })
}

/// The process's CPU allowance as JSON (online, affinity, cgroup quota, effective).
#[pyfunction]
pub fn cpu_allowance() -> String {
    serde_json::to_string(&stoker::cpu::allowance()).unwrap_or_default()
}

/// A preset's transform as JSON (`imagenet-train`, `imagenet-val`).
#[pyfunction]
pub fn preset_json(name: &str) -> PyResult<String> {
    let spec = stoker::TransformSpec::preset(name).py_err()?;
    serde_json::to_string(&spec).map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
}

/// The engine's normalisation table (`stoker::ops::normalize_table`): three rows of 256
/// float32 values as little-endian bytes, for the GPU normaliser's lookup.
#[pyfunction]
pub fn normalize_table<'py>(py: Python<'py>, mean: [f32; 3], std: [f32; 3]) -> Bound<'py, pyo3::types::PyBytes> {
    let bytes: Vec<u8> =
        stoker::ops::normalize_table(mean, std).iter().flatten().flat_map(|v| v.to_le_bytes()).collect();
    pyo3::types::PyBytes::new(py, &bytes)
}

/// What the CUDA probe found (driver, devices, or why there is none) as JSON.
#[pyfunction]
pub fn cuda_probe_json(py: Python<'_>) -> String {
    py.detach(|| serde_json::to_string(&stoker_cuda::probe()).unwrap_or_default())
}

/// `(device bytes, pinned host bytes)` allocated by stoker in this process right now.
#[pyfunction]
pub fn cuda_memory_in_use() -> (u64, u64) {
    stoker_cuda::memory_in_use()
}

/// Measured host-to-device bandwidth of `cuda:{ordinal}` (pinned and pageable) as JSON.
#[pyfunction]
#[pyo3(signature = (ordinal=0, bytes=268_435_456, repeats=10))]
pub fn cuda_bandwidth_json(py: Python<'_>, ordinal: u32, bytes: usize, repeats: usize) -> PyResult<String> {
    py.detach(|| -> stoker::Result<String> {
        let gpu = stoker_cuda::Gpu::open(ordinal)?;
        let bw = stoker_cuda::measure_h2d(&gpu, bytes, repeats)?;
        serde_json::to_string(&bw).map_err(|e| stoker::Error::Internal(e.to_string()))
    })
    .py_err()
}
