//! The `Loader` class: an image dataset opened and configured, the start of every iteration.
//! Its shared methods come from [`loader_class!`]; here is what only images have.

use super::iter::PyIter;
use crate::errors::{self, IntoPy};
use crate::shared::args::args_of;
use crate::shared::iter::Polled;
use crate::shared::loader::{loader_class, LoaderClass};
use pyo3::prelude::*;
use stoker::{EpochIter, Loader};
use stoker_cuda::{OnDevice, Target};

/// A loader over a dataset (an ImageFolder root, a pack folder, shards or URLs), configured by
/// the user's arguments as JSON, which the engine checks ([`stoker::args::loader_config`]).
#[pyclass(frozen, name = "Loader", module = "stoker._stoker")]
pub struct PyLoader {
    /// The engine's loader, the transfer stage when batches go to a GPU, and the device used.
    on: OnDevice<Loader>,
    /// Exact class names (bytes on Linux): Python gets them as `os.listdir` shows them.
    classes: Vec<std::ffi::OsString>,
    samples: usize,
    sampler: stoker::SamplerSpec,
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
            let dataset = if let Some(c) = &config.captions {
                stoker::source::open_pairs(&roots, c.field.member())?
            } else if config.parts.is_empty() {
                stoker::source::open(&roots)?
            } else {
                stoker::source::mix::open_mixture(&config.parts)?
            };
            let samples = dataset.source.len();
            let sampler = config.sampler.clone();
            let on = target.image_loader(&dataset, config)?;
            Ok(PyLoader { on, classes: dataset.classes, samples, sampler, normalize })
        })
        .py_err()
    }
}

impl LoaderClass for PyLoader {
    type Host = EpochIter;
    type Iterator = PyIter;
    fn sharding(&self) -> (usize, usize, usize) {
        (self.sampler.batch_size, self.sampler.rank, self.sampler.world_size)
    }
    fn iterator(&self, polled: Polled<EpochIter>) -> PyIter {
        PyIter { polled }
    }
}

loader_class! { PyLoader => PyIter, shares [positioned traced], {
    /// Opens `roots` (what [`stoker::source::detect`] makes of them) with the GIL released and
    /// allocates the buffer pool: pinned, plus a device pool and the transfer stage, when
    /// `device` names a GPU (`cuda` means `cuda:{ordinal}`).
    #[new]
    #[pyo3(signature = (roots, args_json, device="cpu", ordinal=0))]
    fn new(py: Python<'_>, roots: Vec<String>, args_json: &str, device: &str, ordinal: u32) -> PyResult<Self> {
        errors::contain(|| Self::open(py, roots, args_json, device, ordinal))
    }

    /// How batches delivered to a GPU as uint8 are normalised there, as JSON
    /// (`{mean, std, dtype, channels_last}`), or `null` when they are not.
    fn device_normalize_json(&self) -> String {
        serde_json::to_string(&self.normalize).unwrap_or_else(|_| "null".into())
    }

    /// The batch mixing the GPU side applies to the images after their normalisation, as JSON
    /// (the `batch_transform` spec, `{style, num_classes, ...}`, and the images' `channels_last`),
    /// or `null` when batches are not mixed or are mixed on the host (decided in
    /// `stoker::args::image_config`).
    fn device_mix_json(&self) -> String {
        let loader = &self.on.loader;
        let Some(mix) = loader.mix().filter(|m| m.images == stoker::image::ops::mix::MixImages::Device) else {
            return "null".into();
        };
        let mut v = serde_json::to_value(mix).unwrap_or_default();
        v["channels_last"] = (loader.plan().spec().layout == stoker::Layout::NHWC).into();
        v.to_string()
    }

    /// What GPU decode has done (`{backend, images, cpu_fallback, share}`) as JSON, or `null`
    /// when every sample is decoded on the CPU.
    fn gpu_decode_json(&self) -> String {
        let stats = self.on.stage.as_ref().and_then(|s| s.gpu_decode()).map(|g| g.stats());
        serde_json::to_string(&stats).unwrap_or_else(|_| "null".into())
    }

    /// The MixUp/CutMix draw of batch `batch` of `epoch` as JSON (`{cutmix, lam, area}`;
    /// `area` is `[y0, y1, x0, x1]` for CutMix), or `null` when batches are not mixed.
    fn mix_params_json(&self, epoch: u64, batch: usize) -> String {
        serde_json::to_string(&self.on.loader.mix_params(epoch, batch)).unwrap_or_else(|_| "null".into())
    }

    /// `"pageable"` or `"pinned"`: the host memory of the batch buffers.
    #[getter]
    fn host_memory(&self) -> &'static str {
        self.on.loader.pool().memory_kind()
    }

    /// Device batch buffers (0 for host batches).
    #[getter]
    fn device_slots(&self) -> usize {
        self.on.stage.as_ref().map_or(0, |s| s.slots())
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

    /// I/O threads.
    #[getter]
    fn io_threads(&self) -> usize {
        self.on.loader.io_threads()
    }

    /// Batch buffers in the pool.
    #[getter]
    fn pool_slots(&self) -> usize {
        self.on.loader.pool().slots()
    }

    /// Bytes of one batch buffer.
    #[getter]
    fn batch_bytes(&self) -> usize {
        self.on.loader.pool().batch_bytes()
    }

    /// Start addresses of the pool's batch buffers (for zero-copy checks).
    fn buffer_addresses(&self) -> Vec<usize> {
        self.on.loader.pool().addresses().to_vec()
    }

    /// One sample's shape.
    #[getter]
    fn sample_shape(&self) -> Vec<usize> {
        self.on.loader.plan().sample_shape().to_vec()
    }

    /// Output dtype name.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.on.loader.plan().spec().dtype.name()
    }

    /// Ids per caption row of an image-text pair loader (`None`: images alone).
    #[getter]
    fn context_length(&self) -> Option<usize> {
        self.on.loader.context_length()
    }

    /// The keys of the samples `indices` (WebDataset's, for shards).
    fn keys(&self, indices: Vec<u32>) -> PyResult<Vec<String>> {
        self.on.loader.keys(&indices).py_err()
    }

    /// Zeroes the counters of the report.
    fn reset_report(&self) {
        self.on.loader.reset_report();
    }
} }
