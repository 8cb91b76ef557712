//! The `Batch` class and its `Tensor` views (images, labels), exported through DLPack; how an
//! image batch is read, in host or device memory.

use crate::shared::batch::batch_class;
use crate::shared::device::{self, Location};
use crate::shared::dlpack::DLDataType;
use crate::shared::held::Rows;
use crate::shared::tensor::{tensor_class, TensorClass};
use pyo3::prelude::*;
use std::sync::Arc;
use stoker::image::pipeline::ImageMeta;
use stoker::DType;
use stoker_cuda::DeviceRegion;

/// An image batch in host or device memory.
pub(crate) type Held = device::Held<stoker::Batch>;

impl Rows for stoker::Batch {
    /// Region 0 is the images, region 1 the labels; an image-text pair batch's caption ids
    /// and attention mask are regions 2 and 3, a mixed batch's soft labels region 2.
    fn region_ptr(&self, k: usize) -> *const u8 {
        match k {
            0 => self.data_ptr(),
            1 => self.labels_ptr().cast::<u8>(),
            2 if self.num_classes() > 0 => self.targets().as_ptr().cast::<u8>(),
            2 => self.input_ids().as_ptr().cast::<u8>(),
            _ => self.attention_mask().as_ptr().cast::<u8>(),
        }
    }
    fn meta_rows(meta: &ImageMeta) -> usize {
        meta.shape[0]
    }
    fn meta_number(meta: &ImageMeta) -> usize {
        meta.index
    }
    fn meta_indices(meta: &ImageMeta) -> &[u32] {
        &meta.indices
    }
}

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

    /// The view of caption region `k` (2: ids, 3: mask), when the batch has captions.
    fn caption_rows(&self, k: usize) -> Option<PyTensor> {
        let n = match &self.inner {
            Held::Host(b) => b.context_length(),
            Held::Device(b) => b.meta().context_length,
        };
        (n > 0).then(|| PyTensor { src: Source::Rows(self.inner.clone(), k, n) })
    }
}

batch_class! { PyBatch, shares [indices device], {
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

    /// An image-text pair batch's caption ids (int32, `[N, context_length]`), as a
    /// DLPack-exporting view; `None` for images alone.
    #[getter]
    fn input_ids(&self) -> Option<PyTensor> {
        self.caption_rows(2)
    }

    /// An image-text pair batch's attention mask (int32, `[N, context_length]`: 1 for the
    /// caption's ids, 0 for padding); `None` for images alone.
    #[getter]
    fn attention_mask(&self) -> Option<PyTensor> {
        self.caption_rows(3)
    }

    /// A mixed batch's soft labels (float32, `[N, num_classes]`: MixUp/CutMix with
    /// `batch_transform`), as a DLPack-exporting view; `None` without batch mixing. On a GPU
    /// they are in the batch's device buffer (region 2), made on the host and copied with it.
    #[getter]
    fn targets(&self) -> Option<PyTensor> {
        let n = match &self.inner {
            Held::Host(b) => b.num_classes(),
            Held::Device(b) => b.meta().num_classes,
        };
        (n > 0).then(|| PyTensor { src: Source::Targets(self.inner.clone(), n) })
    }

    /// The epoch.
    #[getter]
    fn epoch(&self) -> u64 {
        match &self.inner {
            Held::Host(b) => b.epoch(),
            Held::Device(b) => b.meta().epoch,
        }
    }
} }

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
    /// A pair batch's int32 rows of region `k`, `n` values each (caption ids or mask).
    Rows(Held, usize, usize),
    /// A mixed batch's float32 soft labels (region 2), `n` classes per row.
    Targets(Held, usize),
}

fn dl_dtype(d: DType) -> DLDataType {
    match d {
        DType::Uint8 => DLDataType::U8,
        DType::Float16 => DLDataType::F16,
        DType::Float32 => DLDataType::F32,
    }
}

impl TensorClass for PyTensor {
    fn region(&self) -> (*const u8, Location, Arc<dyn Send + Sync>) {
        match &self.src {
            Source::Images(b) => b.region(0),
            Source::Labels(b) => b.region(1),
            Source::Rows(b, k, _) => b.region(*k),
            Source::Targets(b, _) => b.region(2),
            Source::DeviceLabels(r, _) => {
                (r.ptr() as *const u8, Location::Cuda { batch: r.clone(), ordinal: r.ordinal() }, r.clone())
            }
        }
    }

    fn layout(&self) -> PyResult<(Vec<i64>, DLDataType)> {
        Ok(match &self.src {
            Source::Images(b) => {
                let (shape, dtype) = match b {
                    Held::Host(h) => (h.shape(), h.dtype()),
                    Held::Device(d) => (d.meta().shape, d.meta().dtype),
                };
                (shape.iter().map(|&d| d as i64).collect(), dl_dtype(dtype))
            }
            Source::Labels(b) => (vec![b.len() as i64], DLDataType::I64),
            Source::DeviceLabels(_, n) => (vec![*n as i64], DLDataType::I64),
            Source::Rows(b, _, n) => (vec![b.len() as i64, *n as i64], DLDataType::I32),
            Source::Targets(b, n) => (vec![b.len() as i64, *n as i64], DLDataType::F32),
        })
    }
}

tensor_class!(PyTensor {
    /// Shape.
    #[getter]
    fn shape(&self) -> PyResult<Vec<i64>> {
        Ok(TensorClass::layout(self)?.0)
    }
});
