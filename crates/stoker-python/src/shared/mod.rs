//! What the classes of every kind share, written once: the methods of the loader, iterator,
//! batch and tensor view classes (as macros that emit a class's one `#[pymethods]` block, each
//! with a trait for what the kind adds), the waiting with Ctrl-C honoured, arguments and state
//! dicts, host-or-device batches and their DLPack export.
//!
//! | file | role |
//! |---|---|
//! | `loader.rs` | [`loader::LoaderClass`] and `loader_class!`: the methods every loader class shares |
//! | `iter.rs` | [`iter::Polled`] and `iterator_class!`: waiting for batches (GIL released, Ctrl-C, fork) |
//! | `batch.rs` | `batch_class!`: the methods every batch class shares |
//! | `tensor.rs` | [`tensor::TensorClass`] and `tensor_class!`: `__dlpack__` and what goes with it |
//! | `args.rs` | Python arguments and state dicts to the engine's argument rules |
//! | `held.rs` | what the batch classes read from a host or device batch |
//! | `device.rs` | host-or-device iterations and batches; CUDA DLPack export with stream semantics |
//! | `dlpack.rs` | zero-copy export of batch buffers through the DLPack protocol |
//!
//! Imports run one way: `loader` -> `iter` -> `device` -> `dlpack`; `tensor` -> `device`;
//! `held` -> `device`; the kinds (`crate::image`, `crate::arrays`, `crate::tokens`) import from
//! here, never the reverse.

pub(crate) mod args;
pub(crate) mod batch;
pub(crate) mod device;
pub(crate) mod dlpack;
pub(crate) mod held;
pub(crate) mod iter;
pub(crate) mod loader;
pub(crate) mod tensor;
