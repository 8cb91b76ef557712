//! PyO3 bindings of the stoker engine: the classes behind the `stoker` Python package.
//!
//! No engine logic lives here: only conversions (JSON configs in, DLPack tensors out), the GIL
//! handling (released for every wait and every piece of work, with Ctrl-C checked between
//! waits) and the mapping of engine errors to the Python exception tree (native classes that
//! `stoker/errors.py` re-exports). The extension module itself is the thin `stoker-pyext` cdylib, which
//! calls [`register`].
//!
//! | file | role |
//! |---|---|
//! | `errors.rs` | the `stoker.errors` exception classes; engine errors to them, in one `match` |
//! | `args.rs` | Python arguments and state dicts to the engine's argument rules |
//! | `functions.rs` | the module-level functions |
//! | `loader.rs` | the `Loader` class |
//! | `iter.rs` | the `Iterator` class; waiting with Ctrl-C honoured, shared by every iteration |
//! | `batch.rs` | the `Batch` class and its `Tensor` views |
//! | `array_loader.rs` | the `ArrayLoader` class |
//! | `array_iter.rs` | the `ArrayIterator` class |
//! | `array_batch.rs` | the `ArrayBatch` class and its `ArrayTensor` views |
//! | `token_loader.rs` | the `TokenLoader`, `TokenIterator`, `TokenBatch` and `TokenTensor` classes |
//! | `held.rs` | what the batch classes read from a host or device batch, written once |
//! | `device.rs` | `device=` placement, pinned pool + transfer stage, CUDA DLPack export |
//! | `dlpack.rs` | zero-copy export of batch buffers through the DLPack protocol |
//! | `buffer.rs` | array memory from Python through the buffer protocol |

mod args;
mod array_batch;
mod array_iter;
mod array_loader;
mod batch;
mod buffer;
mod device;
mod dlpack;
mod errors;
mod functions;
mod held;
mod iter;
mod loader;
mod token_loader;

use pyo3::prelude::*;

/// Adds the classes and functions of `stoker._stoker` to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LIBJPEG_TURBO_VERSION", stoker::decode::jpeg::LIBJPEG_TURBO_VERSION)?;
    errors::register(m)?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<iter::PyIter>()?;
    m.add_class::<batch::PyBatch>()?;
    m.add_class::<batch::PyTensor>()?;
    m.add_class::<array_loader::PyArrayLoader>()?;
    m.add_class::<array_iter::PyArrayIter>()?;
    m.add_class::<array_batch::PyArrayBatch>()?;
    m.add_class::<array_batch::PyArrayTensor>()?;
    m.add_class::<token_loader::PyTokenLoader>()?;
    m.add_class::<token_loader::PyTokenIter>()?;
    m.add_class::<token_loader::PyTokenBatch>()?;
    m.add_class::<token_loader::PyTokenTensor>()?;
    functions::register(m)?;
    Ok(())
}
