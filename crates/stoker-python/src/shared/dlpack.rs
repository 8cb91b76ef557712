//! Zero-copy export of a batch's images or labels, in host or device memory, through the
//! DLPack protocol (the legacy `dltensor` capsule, which `torch.from_dlpack` and
//! `numpy.from_dlpack` accept).
//!
//! The capsule owns an `Arc` of the engine's batch: the pool buffer returns to the pool only
//! when every tensor or array made from it (and every unconsumed capsule) is gone.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;
use std::sync::Arc;

/// `DLDevice` (dlpack.h).
#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

/// `DLDataType` (dlpack.h).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

impl DLDataType {
    /// A type from its DLPack code (0 int, 1 uint, 2 float, 6 bool) and bit width.
    pub const fn new(code: u8, bits: u8) -> Self {
        DLDataType { code, bits, lanes: 1 }
    }

    /// Unsigned 8-bit integer.
    pub const U8: Self = DLDataType { code: 1, bits: 8, lanes: 1 };
    /// Signed 32-bit integer.
    pub const I32: Self = DLDataType { code: 0, bits: 32, lanes: 1 };
    /// Signed 64-bit integer.
    pub const I64: Self = DLDataType { code: 0, bits: 64, lanes: 1 };
    /// IEEE half.
    pub const F16: Self = DLDataType { code: 2, bits: 16, lanes: 1 };
    /// IEEE single.
    pub const F32: Self = DLDataType { code: 2, bits: 32, lanes: 1 };
}

/// `DLTensor` (dlpack.h).
#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// `DLManagedTensor` (dlpack.h, pre-1.0 ABI).
#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The managed tensor plus what keeps its memory alive. `managed` is the first field of a
/// `repr(C)` struct, so a pointer to it is a pointer to the holder.
#[repr(C)]
struct Holder {
    managed: DLManagedTensor,
    shape: [i64; 8],
    strides: [i64; 8],
    _owner: Arc<dyn Send + Sync>,
}

unsafe extern "C" fn deleter(t: *mut DLManagedTensor) {
    if !t.is_null() {
        // SAFETY: `t` came from `Box::into_raw(Box<Holder>)` in `export` (first field of a
        // repr(C) struct), and DLPack consumers call the deleter exactly once.
        drop(unsafe { Box::from_raw(t.cast::<Holder>()) });
    }
}

const NAME: &CStr = c"dltensor";

unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // A consumer renames the capsule to "used_dltensor" and owns the tensor from then on; a
    // capsule still named "dltensor" was never consumed, so its tensor is ours to free.
    // `PyCapsule_IsValid` never sets an error, so nothing is cleared here: a destructor may run
    // while another exception is set (a KeyboardInterrupt among them), and clearing the error
    // indicator would erase it.
    // SAFETY: `capsule` is a live capsule object passed by the interpreter.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr());
            deleter(p.cast::<DLManagedTensor>());
        }
    }
}

/// A C-contiguous tensor view (host or device memory) at `data`, kept alive by `owner`.
pub struct View {
    /// First element.
    pub data: *const u8,
    /// Shape (up to 4 dimensions).
    pub shape: Vec<i64>,
    /// Element type.
    pub dtype: DLDataType,
    /// What keeps the memory alive.
    pub owner: Arc<dyn Send + Sync>,
}

/// Builds a `dltensor` capsule for `view` on DLPack device `(device_type, device_id)`.
pub fn export<'py>(py: Python<'py>, view: View, device: (i32, i32)) -> PyResult<Bound<'py, PyCapsule>> {
    let ndim = view.shape.len();
    assert!(ndim <= 8, "at most 8 dimensions");
    let mut shape = [0i64; 8];
    shape[..ndim].copy_from_slice(&view.shape);
    let mut strides = [0i64; 8];
    let mut acc = 1i64;
    for d in (0..ndim).rev() {
        strides[d] = acc;
        acc *= shape[d].max(1);
    }
    let holder = Box::new(Holder {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: view.data as *mut c_void,
                device: DLDevice { device_type: device.0, device_id: device.1 },
                ndim: ndim as i32,
                dtype: view.dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        },
        shape,
        strides,
        _owner: view.owner,
    });
    let raw = Box::into_raw(holder);
    // SAFETY: `raw` is a valid, uniquely owned Holder; the shape/strides arrays live inside it,
    // so the pointers stay valid until the deleter frees the whole holder.
    unsafe {
        (*raw).managed.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).managed.dl_tensor.strides = (*raw).strides.as_mut_ptr();
        (*raw).managed.manager_ctx = raw.cast::<c_void>();
    }
    let ptr = NonNull::new(raw.cast::<c_void>()).expect("Box pointer is non-null");
    // SAFETY: the pointer is a live DLManagedTensor; the destructor frees it unless a consumer
    // took ownership (renamed the capsule), as the DLPack protocol specifies.
    let cap = unsafe { PyCapsule::new_with_pointer_and_destructor(py, ptr, NAME, Some(capsule_destructor)) };
    if cap.is_err() {
        // SAFETY: the capsule was not created, so nobody else owns `raw`.
        unsafe { deleter(raw.cast::<DLManagedTensor>()) };
    }
    cap
}
