//! What every tensor view class shares, written once: `__dlpack__` (zero-copy, with the
//! protocol's stream semantics), `__dlpack_device__` and `data_ptr` ([`tensor_class!`]).

use crate::shared::device::Location;
use crate::shared::dlpack::DLDataType;
use pyo3::PyResult;
use std::sync::Arc;

/// What a tensor view class adds to the shared methods: where its memory is and what it holds.
pub(crate) trait TensorClass {
    /// The address of the first element (host or device), where the memory is, and what keeps
    /// it alive (the batch, or a buffer of its own).
    fn region(&self) -> (*const u8, Location, Arc<dyn Send + Sync>);
    /// The shape and element type; one DLPack cannot describe is a `ConfigError`.
    fn layout(&self) -> PyResult<(Vec<i64>, DLDataType)>;
}

/// The one `#[pymethods]` block of a tensor view class: `__dlpack__`, `__dlpack_device__`
/// and `data_ptr`, then the class's own methods, if any, in braces:
/// `tensor_class!(PyArrayTensor);` or `tensor_class!(PyTensor { /* methods */ });`, for a
/// class that implements [`TensorClass`].
macro_rules! tensor_class {
    ($class:ident $({ $($own:tt)* })?) => {
        #[::pyo3::pymethods]
        impl $class {
            $($($own)*)?

            /// DLPack export (zero-copy). For a CUDA batch, `stream` follows the protocol: the
            /// consumer's stream waits (on the GPU) for the copy; for a CPU batch it must be
            /// None. `copy=True` and other devices are refused with `BufferError`, as the
            /// protocol specifies.
            #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
            fn __dlpack__<'py>(
                &self,
                py: ::pyo3::Python<'py>,
                stream: Option<::pyo3::Bound<'py, ::pyo3::PyAny>>,
                max_version: Option<(u32, u32)>,
                dl_device: Option<(i32, i32)>,
                copy: Option<bool>,
            ) -> ::pyo3::PyResult<::pyo3::Bound<'py, ::pyo3::types::PyCapsule>> {
                let _ = max_version; // we export the legacy capsule, which every consumer accepts
                let (shape, dtype) = $crate::shared::tensor::TensorClass::layout(self)?;
                let (data, loc, owner) = $crate::shared::tensor::TensorClass::region(self);
                let view = $crate::shared::dlpack::View { data, shape, dtype, owner };
                $crate::shared::device::export(py, &loc, view, stream, dl_device, copy)
            }

            /// `(device type, device id)` as DLPack numbers them.
            fn __dlpack_device__(&self) -> (i32, i32) {
                $crate::shared::tensor::TensorClass::region(self).1.dlpack_device()
            }

            /// Address of the first element (host or device).
            #[getter]
            fn data_ptr(&self) -> usize {
                $crate::shared::tensor::TensorClass::region(self).0 as usize
            }
        }
    };
}
pub(crate) use tensor_class;
