//! The arrays kind's classes: `ArrayLoader` (rows of NumPy arrays or memory-mapped `.npy`
//! files), `ArrayIterator`, and `ArrayBatch` with its `ArrayTensor` column views.
//!
//! Files: `loader` (the class and its columns), `buffer` (array memory from Python through the
//! buffer protocol), `iter` (the iterator class), `batch` (the batch class, its column views,
//! and how an array batch is read, host or device).

mod batch;
mod buffer;
mod iter;
mod loader;

pub(crate) use batch::{PyArrayBatch, PyArrayTensor};
pub(crate) use iter::PyArrayIter;
pub(crate) use loader::PyArrayLoader;
