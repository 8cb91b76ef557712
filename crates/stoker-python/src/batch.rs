//! The `Batch` class and its `Tensor` views (images, labels), exported through DLPack.

use crate::device::{self, Location};
use crate::dlpack::{DLDataType, View};
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Arc;
use stoker::DType;
use stoker_cuda::DeviceRegion;

/// An image batch in host or device memory.
pub(crate) type Held = device::Held<stoker::Batch>;

/// One batch: views of a pool buffer. Its `images` and `labels` export through DLPack; the
/// buffer returns to the pool when the last view is gone.
#[pyclass(frozen, name = "Batch", module = "stoker._stoker")]
pub struct PyBatch {
    inner: Held,
}

impl PyBatch {
    /// The Python batch of a delivered batch.
    pub(crate) fn new(inner: Held) -> Self {
        PyBatch { inner }
    }
}

#[pymethods]
impl PyBatch {
    fn __len__(&self) -> usize {
        self.inner.len()
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
        self.inner.index()
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
        self.inner.indices()
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.inner.device()
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
        match &self.src {
            Source::Images(b) => {
                let (shape, dtype) = match b {
                    Held::Host(h) => (h.shape(), h.dtype()),
                    Held::Device(d) => (d.meta().shape, d.meta().dtype),
                };
                let (data, loc, owner) = b.region(0);
                let shape = shape.iter().map(|&d| d as i64).collect();
                (View { data, shape, dtype: dl_dtype(dtype), owner }, loc)
            }
            Source::Labels(b) => {
                let (data, loc, owner) = b.region(1);
                (View { data, shape: vec![b.len() as i64], dtype: DLDataType::I64, owner }, loc)
            }
            Source::DeviceLabels(r, n) => {
                let owner: Arc<dyn Send + Sync> = r.clone();
                let view = View { data: r.ptr() as *const u8, shape: vec![*n as i64], dtype: DLDataType::I64, owner };
                (view, Location::Cuda { batch: r.clone(), ordinal: r.ordinal() })
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
