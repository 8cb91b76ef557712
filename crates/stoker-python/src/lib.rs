//! PyO3 bindings of the stoker engine: the classes behind the `stoker` Python package.
//!
//! No engine logic lives here: only conversions (JSON configs in, DLPack tensors out), the GIL
//! handling (released for every wait and every piece of work, with Ctrl-C checked between
//! waits) and the mapping of engine errors to the Python exception tree (native classes that
//! `stoker/errors.py` re-exports). The extension module itself is the thin `stoker-pyext` cdylib, which
//! calls [`register`].
//!
//! One folder per kind, as the engine's rooms, each with a loader, an iterator, a batch and a
//! tensor view class; what they share is written once in `shared/`:
//!
//! | file | role |
//! |---|---|
//! | `errors.rs` | the `stoker.errors` exception classes; engine errors to them, in one `match` |
//! | `functions.rs` | the module-level functions |
//! | `pack.rs` | `PackJob` and the token cache's description: packs and caches made in pieces (`stoker.ray`) |
//! | `shared/` | what every kind's classes share, written once (its `mod.rs` has the file map) |
//! | `image/` | `Loader`, `Iterator`, `Batch` and its `Tensor` views |
//! | `arrays/` | `ArrayLoader`, `ArrayIterator`, `ArrayBatch` and its `ArrayTensor` views; the buffer protocol |
//! | `tokens/` | `TokenLoader`, `TokenIterator`, `TokenBatch` and its `TokenTensor` views; `Tokenizer` |
//!
//! Each kind's folder has `loader.rs`, `iter.rs` and `batch.rs` (the batch and its views).

mod arrays;
mod errors;
mod functions;
mod image;
mod pack;
mod shared;
mod tokens;

use pyo3::prelude::*;
use pyo3::PyClass;

/// Adds the classes and functions of `stoker._stoker` to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LIBJPEG_TURBO_VERSION", stoker::decode::jpeg::LIBJPEG_TURBO_VERSION)?;
    errors::register(m)?;
    add_kind::<image::PyLoader, image::PyIter, image::PyBatch, image::PyTensor>(m)?;
    add_kind::<arrays::PyArrayLoader, arrays::PyArrayIter, arrays::PyArrayBatch, arrays::PyArrayTensor>(m)?;
    add_kind::<tokens::PyTokenLoader, tokens::PyTokenIter, tokens::PyTokenBatch, tokens::PyTokenTensor>(m)?;
    m.add_class::<tokens::PyTokenMixLoader>()?;
    m.add_class::<tokens::PyTokenMixIter>()?;
    m.add_class::<tokens::PyTokenizer>()?;
    m.add_class::<pack::PyPackJob>()?;
    m.add_function(wrap_pyfunction!(pack::tokenize_job, m)?)?;
    m.add_function(wrap_pyfunction!(pack::write_token_cache_meta, m)?)?;
    m.add_function(wrap_pyfunction!(pack::token_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(pack::ray_address, m)?)?;
    functions::register(m)?;
    Ok(())
}

/// Adds a kind's classes to module `m`: its loader, iterator, batch and tensor view.
fn add_kind<L: PyClass, I: PyClass, B: PyClass, T: PyClass>(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<L>()?;
    m.add_class::<I>()?;
    m.add_class::<B>()?;
    m.add_class::<T>()
}
