//! Array memory from Python through the buffer protocol (PEP 3118), never as a raw address.
//!
//! `ArrayLoader` reads the rows of NumPy arrays (or any object that exports a C-contiguous
//! buffer: `bytes`, `bytearray`, `array.array`, `memoryview`, `mmap`). The exporter itself says
//! where the memory is, how long it is and what it holds; stoker holds the export (so the
//! exporter may not resize or free the memory) until the last column using it is dropped.
//!
//! The buffer functions are in CPython's stable ABI since 3.11 and have had this exact layout
//! and these exact flags since 3.3; PyO3 exposes them only for `abi3-py311` builds, and
//! stoker's wheel supports 3.9 and later, so they are declared here.

use crate::errors;
use pyo3::prelude::*;
use std::ffi::{c_char, c_int, c_void, CStr};

/// `Py_buffer` (CPython's `Include/pybuffer.h`).
#[repr(C)]
struct RawView {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: pyo3::ffi::Py_ssize_t,
    itemsize: pyo3::ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut pyo3::ffi::Py_ssize_t,
    strides: *mut pyo3::ffi::Py_ssize_t,
    suboffsets: *mut pyo3::ffi::Py_ssize_t,
    internal: *mut c_void,
}

const PYBUF_FORMAT: c_int = 0x0004;
const PYBUF_ND: c_int = 0x0008;
const PYBUF_STRIDES: c_int = 0x0010 | PYBUF_ND;
const PYBUF_C_CONTIGUOUS: c_int = 0x0020 | PYBUF_STRIDES;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut pyo3::ffi::PyObject, view: *mut RawView, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawView);
    /// Exported by every CPython since 3.4 (outside the limited API's headers).
    fn PyGILState_Check() -> c_int;
}

/// A held, read-only, C-contiguous buffer export: the memory stays valid and in place until
/// this is dropped.
pub struct HeldBuffer {
    view: Box<RawView>,
}

/// An export whose holder was dropped on a thread without the GIL (a loader thread that held
/// the last reference): released by the next [`release_deferred`] call.
struct Deferred(Box<RawView>);

// SAFETY: a filled view is plain data until it is released, which happens with the GIL held.
unsafe impl Send for Deferred {}

static DEFERRED: std::sync::Mutex<Vec<Deferred>> = std::sync::Mutex::new(Vec::new());

/// Releases the exports dropped without the GIL since the last call; `_py` proves the GIL.
pub fn release_deferred(_py: Python<'_>) {
    let pending = std::mem::take(&mut *DEFERRED.lock().unwrap_or_else(|p| p.into_inner()));
    for mut d in pending {
        // SAFETY: filled by a successful `PyObject_GetBuffer`, released once, with the GIL.
        unsafe { PyBuffer_Release(&mut *d.0) };
    }
}

// SAFETY: the view is only read after construction; it is released once, with the GIL held
// (see `drop`). The memory it describes is read by the loader's threads, which is what holding
// an export allows (the exporter may not move or free it while exported).
unsafe impl Send for HeldBuffer {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for HeldBuffer {}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        let view = std::mem::replace(&mut self.view, Box::new(RawView::empty()));
        // SAFETY: only reads the calling thread's state; valid at any time in the process.
        if unsafe { PyGILState_Check() } == 1 {
            // Usually a Python object's deallocation (the loader, or a batch's DLPack capsule,
            // possibly during interpreter shutdown): release now.
            let mut view = view;
            // SAFETY: filled by a successful `PyObject_GetBuffer`, released once, GIL held.
            unsafe { PyBuffer_Release(&mut *view) };
        } else {
            // A loader thread cannot take the GIL safely (the interpreter may be finalizing):
            // the next stoker call with the GIL releases it; at exit it goes with the process.
            DEFERRED.lock().unwrap_or_else(|p| p.into_inner()).push(Deferred(view));
        }
    }
}

impl RawView {
    fn empty() -> Self {
        RawView {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        }
    }
}

/// What a buffer holds, read from its export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// NumPy type string (`<f4`, `|u1` is written `<u1`, `<b1` for bool).
    pub descr: String,
    /// Rows (first dimension).
    pub rows: usize,
    /// Shape of one row.
    pub row_shape: Vec<usize>,
    /// Bytes per row.
    pub row_bytes: usize,
}

/// NumPy's type string for a buffer format (the `struct` module's codes) of `itemsize` bytes;
/// `None` for big-endian data and for anything but one bool/int/uint/float element.
fn descr_of(format: &str, itemsize: usize) -> Option<String> {
    let code = match format.as_bytes() {
        [b'@' | b'=' | b'<', c] | [c] => *c,
        _ => return None,
    };
    if cfg!(target_endian = "big") && !format.starts_with('<') {
        return None;
    }
    let native = !matches!(format.as_bytes().first(), Some(b'=' | b'<'));
    let long = if native { std::mem::size_of::<std::ffi::c_long>() } else { 4 };
    let (kind, size) = match code {
        b'?' => ('b', 1),
        b'b' => ('i', 1),
        b'B' => ('u', 1),
        b'h' => ('i', 2),
        b'H' => ('u', 2),
        b'i' => ('i', 4),
        b'I' => ('u', 4),
        b'l' => ('i', long),
        b'L' => ('u', long),
        b'q' => ('i', 8),
        b'Q' => ('u', 8),
        b'n' if native => ('i', std::mem::size_of::<isize>()),
        b'N' if native => ('u', std::mem::size_of::<usize>()),
        b'e' => ('f', 2),
        b'f' => ('f', 4),
        b'd' => ('f', 8),
        _ => return None,
    };
    if size != itemsize {
        return None;
    }
    let descr = format!("<{kind}{itemsize}");
    stoker::arrays::descr_itemsize(&descr).map(|_| descr)
}

/// Takes a read-only C-contiguous export of `obj` (argument `arrays[index]`), checks what it
/// holds, and returns the held export, the address of its first byte and its layout.
pub fn hold(obj: &Bound<'_, PyAny>, index: usize) -> PyResult<(HeldBuffer, *const u8, Layout)> {
    let arg = format!("arrays[{index}]");
    release_deferred(obj.py());
    let mut view = Box::new(RawView::empty());
    // SAFETY: `obj` is a live object (we hold the GIL through `obj`'s `Python` token) and
    // `view` points to writable memory of `Py_buffer`'s layout.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_C_CONTIGUOUS | PYBUF_FORMAT) };
    if rc != 0 {
        let why = PyErr::take(obj.py()).map(|e| e.to_string()).unwrap_or_else(|| "no reason given".into());
        let hint = if why.contains("contiguous") { " (use np.ascontiguousarray)" } else { "" };
        return Err(errors::config(
            &arg,
            format!("cannot read {} as a C-contiguous array: {why}{hint}", obj.get_type().name()?),
        ));
    }
    let held = HeldBuffer { view };
    let v = &*held.view;
    let format = if v.format.is_null() {
        "B".to_string()
    } else {
        // SAFETY: a non-null `format` of a filled view is a NUL-terminated string owned by the
        // export, valid while it is held.
        unsafe { CStr::from_ptr(v.format) }.to_string_lossy().into_owned()
    };
    let itemsize = usize::try_from(v.itemsize).unwrap_or(0);
    let descr = descr_of(&format, itemsize).ok_or_else(|| {
        errors::config(
            &arg,
            format!(
                "unsupported dtype (buffer format {format:?}, {itemsize} bytes); \
                 stoker reads little-endian bool, int, uint and float arrays"
            ),
        )
    })?;
    let ndim = usize::try_from(v.ndim).unwrap_or(0);
    let shape: Vec<usize> = if ndim == 0 {
        vec![]
    } else if v.shape.is_null() {
        vec![usize::try_from(v.len).unwrap_or(0) / itemsize.max(1)]
    } else {
        // SAFETY: with PYBUF_ND requested, `shape` holds `ndim` entries, valid while held.
        unsafe { std::slice::from_raw_parts(v.shape, ndim) }.iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect()
    };
    let Some((&rows, row_shape)) = shape.split_first() else {
        return Err(errors::config(&arg, "a 0-d array has no rows"));
    };
    let row_bytes = stoker::arrays::row_bytes_of(itemsize, row_shape)
        .ok_or_else(|| errors::config(&arg, format!("shape {shape:?} is too large")))?;
    if rows.checked_mul(row_bytes) != usize::try_from(v.len).ok() {
        return Err(errors::config(&arg, format!("the buffer's length {} does not match its shape {shape:?}", v.len)));
    }
    let ptr = v.buf as *const u8;
    let layout = Layout { descr, rows, row_shape: row_shape.to_vec(), row_bytes };
    Ok((held, ptr, layout))
}

#[cfg(test)]
mod tests {
    use super::descr_of;

    #[test]
    fn buffer_formats_map_to_numpy_type_strings() {
        assert_eq!(descr_of("f", 4).as_deref(), Some("<f4"));
        assert_eq!(descr_of("<d", 8).as_deref(), Some("<f8"));
        assert_eq!(descr_of("e", 2).as_deref(), Some("<f2"));
        assert_eq!(descr_of("l", 8).as_deref(), Some("<i8"));
        assert_eq!(descr_of("<l", 4).as_deref(), Some("<i4"), "standard size of long");
        assert_eq!(descr_of("q", 8).as_deref(), Some("<i8"));
        assert_eq!(descr_of("B", 1).as_deref(), Some("<u1"));
        assert_eq!(descr_of("?", 1).as_deref(), Some("<b1"));
        assert_eq!(descr_of("=H", 2).as_deref(), Some("<u2"));
        assert_eq!(descr_of(">f", 4), None, "big-endian");
        assert_eq!(descr_of("Zd", 16), None, "complex");
        assert_eq!(descr_of("T{<f:x:}", 4), None, "structured");
        assert_eq!(descr_of("f", 8), None, "itemsize disagrees with the code");
    }
}
