//! PyO3 bindings of the stoker engine: the classes behind the `stoker` Python package.
//!
//! No engine logic lives here: only conversions (JSON configs in, DLPack tensors out), the GIL
//! handling (released for every wait and every piece of work, with Ctrl-C checked between
//! waits) and the mapping of engine errors to the Python exception tree defined in
//! `stoker/errors.py`. The extension module itself is the thin `stoker-pyext` cdylib, which
//! calls [`register`].
//!
//! | file | role |
//! |---|---|
//! | `errors.rs` | engine errors to `stoker.errors` exceptions |
//! | `dlpack.rs` | zero-copy export of batch buffers through the DLPack protocol |
//! | `device.rs` | `device=` placement, pinned pool + transfer stage, CUDA DLPack export |
//! | `loader.rs` | `Loader`, `Iterator`, `Batch`, `Tensor` classes |
//! | `arrays.rs` | `ArrayLoader` and its iterator, batch and tensor classes |
//! | `buffer.rs` | array memory from Python through the buffer protocol |

mod arrays;
mod buffer;
mod device;
mod dlpack;
mod errors;
mod loader;

use pyo3::prelude::*;

/// Adds the classes and functions of `stoker._stoker` to module `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LIBJPEG_TURBO_VERSION", stoker::decode::jpeg::LIBJPEG_TURBO_VERSION)?;
    m.add_class::<loader::PyLoader>()?;
    m.add_class::<loader::PyIter>()?;
    m.add_class::<loader::PyBatch>()?;
    m.add_class::<loader::PyTensor>()?;
    m.add_class::<arrays::PyArrayLoader>()?;
    m.add_class::<arrays::PyArrayIter>()?;
    m.add_class::<arrays::PyArrayBatch>()?;
    m.add_class::<arrays::PyArrayTensor>()?;
    m.add_function(wrap_pyfunction!(loader::make_demo, m)?)?;
    m.add_function(wrap_pyfunction!(loader::cpu_allowance, m)?)?;
    m.add_function(wrap_pyfunction!(loader::parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(loader::dtype_name, m)?)?;
    m.add_function(wrap_pyfunction!(loader::local_rank, m)?)?;
    m.add_function(wrap_pyfunction!(loader::preset_json, m)?)?;
    m.add_function(wrap_pyfunction!(loader::normalize_table, m)?)?;
    m.add_function(wrap_pyfunction!(loader::cuda_probe_json, m)?)?;
    m.add_function(wrap_pyfunction!(loader::cuda_memory_in_use, m)?)?;
    m.add_function(wrap_pyfunction!(loader::cuda_bandwidth_json, m)?)?;
    Ok(())
}
