//! Engine errors become exceptions of the `stoker.errors` tree (`StokerError` and one subclass
//! per category), so users can `except stoker.DecodeError`.
//!
//! The classes are native: made once per interpreter when the module is initialised, added to
//! `stoker._stoker` and re-exported by `stoker/errors.py`. Each names `stoker.errors` as its
//! module (where pickle finds it) and keeps a standard base where one fits (`ConfigError` is a
//! `ValueError`, `ReadError` an `OSError`, ...), so existing `except ValueError` code catches it.
//! `create_exception!` takes a single base, hence the classes are made by calling `type`.

use pyo3::exceptions::{PyException, PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use stoker::Error;

/// The module the classes say they belong to: the public one, which re-exports them.
const MODULE: &str = "stoker.errors";

/// The exception classes, made once per interpreter.
struct Classes {
    stoker: Py<PyType>,
    config: Py<PyType>,
    dataset: Py<PyType>,
    decode: Py<PyType>,
    read: Py<PyType>,
    memory: Py<PyType>,
    device: Py<PyType>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

/// A class `name(*bases)` of module [`MODULE`] with docstring `doc`.
fn class(py: Python<'_>, name: &str, bases: &[Bound<'_, PyType>], doc: &str) -> PyResult<Py<PyType>> {
    let namespace = PyDict::new(py);
    namespace.set_item("__module__", MODULE)?;
    namespace.set_item("__doc__", doc)?;
    let cls = py.get_type::<PyType>().call1((name, PyTuple::new(py, bases)?, namespace))?;
    Ok(cls.cast_into::<PyType>()?.unbind())
}

impl Classes {
    fn new(py: Python<'_>) -> PyResult<Self> {
        let stoker =
            class(py, "StokerError", &[py.get_type::<PyException>()], "Base class of every error stoker raises.")?;
        let base = || stoker.bind(py).clone();
        Ok(Classes {
            config: class(
                py,
                "ConfigError",
                &[base(), py.get_type::<PyValueError>()],
                "A bad argument: the message names the argument and the allowed values.",
            )?,
            dataset: class(
                py,
                "DatasetError",
                &[base()],
                "The dataset is unusable: missing root, no class folders, no images.",
            )?,
            decode: class(
                py,
                "DecodeError",
                &[base()],
                "A file is not a valid image (corrupt, truncated, empty, unsupported); names the file.",
            )?,
            read: class(
                py,
                "ReadError",
                &[base(), py.get_type::<PyOSError>()],
                "A file could not be read (missing, unreadable); names the file.",
            )?,
            memory: class(
                py,
                "MemoryLimitError",
                &[base(), py.get_type::<PyMemoryError>()],
                "The memory limit cannot hold a batch, or every batch buffer is held by the consumer.",
            )?,
            device: class(
                py,
                "DeviceError",
                &[base(), py.get_type::<PyRuntimeError>()],
                "The GPU asked for cannot be used (no driver, no such device) or a CUDA call failed.",
            )?,
            stoker,
        })
    }

    /// The classes by their Python names, base first.
    fn named(&self) -> [(&'static str, &Py<PyType>); 7] {
        [
            ("StokerError", &self.stoker),
            ("ConfigError", &self.config),
            ("DatasetError", &self.dataset),
            ("DecodeError", &self.decode),
            ("ReadError", &self.read),
            ("MemoryLimitError", &self.memory),
            ("DeviceError", &self.device),
        ]
    }

    /// The class of an engine error.
    fn of(&self, e: &Error) -> &Py<PyType> {
        match e {
            Error::Io { .. } => &self.read,
            Error::Decode { .. } => &self.decode,
            Error::Dataset(_) | Error::Unavailable(_) => &self.dataset,
            Error::Config { .. } => &self.config,
            Error::Memory(_) => &self.memory,
            Error::Device(_) => &self.device,
            Error::Cancelled | Error::Stale(_) | Error::Internal(_) => &self.stoker,
        }
    }
}

fn classes(py: Python<'_>) -> PyResult<&'static Classes> {
    CLASSES.get_or_try_init(py, || Classes::new(py))
}

/// Makes the exception classes (once per interpreter) and adds them to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, cls) in classes(m.py())?.named() {
        m.add(name, cls.clone_ref(m.py()))?;
    }
    Ok(())
}

/// Converts an engine error into the matching Python exception.
pub fn to_py(e: Error) -> PyErr {
    Python::attach(|py| match classes(py) {
        Ok(classes) => PyErr::from_type(classes.of(&e).bind(py).clone(), e.to_string()),
        Err(err) => err,
    })
}

/// Runs a native entry point so that a panic inside it becomes a `StokerError` ("internal
/// error: ... please report this"), never a `PanicException`, which `except Exception` does
/// not catch.
pub fn contain<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let why = stoker::shell::ordered::panic_message(p.as_ref());
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
