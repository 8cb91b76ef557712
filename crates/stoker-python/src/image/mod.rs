//! The image kind's classes: `Loader` (an ImageFolder, pack folder, shards or URLs, decoded and
//! transformed on stoker's threads), `Iterator`, and `Batch` with its `Tensor` views.
//!
//! Files: `loader` (the class and what only images have: classes, pool, transform, report
//! text), `iter` (the iterator class), `batch` (the batch class, its views, and how a batch is
//! read, host or device).

mod batch;
mod iter;
mod loader;

pub(crate) use batch::{PyBatch, PyTensor};
pub(crate) use iter::PyIter;
pub(crate) use loader::PyLoader;
