//! Engine errors become exceptions of the tree in `stoker/errors.py` (`StokerError` and one
//! subclass per category), so users can `except stoker.DecodeError`.

use pyo3::prelude::*;
use stoker::Error;

/// The exception class name (in `stoker.errors`) for an engine error.
fn class_name(e: &Error) -> &'static str {
    match e {
        Error::Io { .. } => "ReadError",
        Error::Decode { .. } => "DecodeError",
        Error::Dataset(_) => "DatasetError",
        Error::Config { .. } => "ConfigError",
        Error::Memory(_) => "MemoryLimitError",
        Error::Device(_) => "DeviceError",
        Error::Cancelled => "StokerError",
        Error::Stale(_) => "StokerError",
        Error::Internal(_) => "StokerError",
    }
}

/// Converts an engine error into the matching Python exception.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| {
        let msg = e.to_string();
        let cls = py.import("stoker.errors").and_then(|m| m.getattr(class_name(&e)));
        match cls {
            Ok(cls) => match cls.call1((msg.clone(),)) {
                Ok(inst) => PyErr::from_value(inst),
                Err(err) => err,
            },
            Err(_) => pyo3::exceptions::PyRuntimeError::new_err(msg),
        }
    })
}

/// Runs a native entry point so that a panic inside it becomes a `StokerError` ("internal
/// error: ... please report this"), never a `PanicException`, which `except Exception` does
/// not catch.
pub fn contain<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let why = stoker::pipeline::panic_message(p.as_ref());
        Err(to_py(Error::Internal(format!("panic in stoker: {why} (please report this)"))))
    })
}

/// A `stoker.errors.ConfigError` with `msg`.
pub fn config(arg: &str, msg: impl Into<String>) -> PyErr {
    to_py(Error::config(arg, msg))
}

/// Extension: `?` on engine results inside binding code.
pub trait IntoPy<T> {
    /// Maps the error to a Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for stoker::Result<T> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
