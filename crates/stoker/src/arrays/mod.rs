//! Array work: batches of rows gathered from in-memory arrays and `.npy` files by the
//! sampler's indices, for `stoker.ArrayLoader`.
//!
//! - [`npy`]: the `.npy` format (header and row layout), every size checked.
//! - [`column`](mod@column): [`Column`], rows in memory or read with `pread` from a `.npy` file.
//! - [`loader`]: the array kind ([`Arrays`]) on the shell's [`crate::shell::kind::Loader`]
//!   ([`ArrayLoader`]), over the shared [`crate::shell::sampler`].
//! - [`report`]: the array kind's part of its report (copy counters, [`ArraySection`], the
//!   verdict).
//!
//! Owns: the `.npy` format and copying rows into slots. May not touch: images (decode, ops,
//! the decoded-pixel cache) or Python; it never maps a file (a file that shrinks must be an
//! error, not a `SIGBUS`).

pub mod column;
pub mod loader;
pub mod npy;
pub mod report;

pub use column::*;
pub use loader::*;
pub use npy::*;
pub use report::{ArrayCounters, ArrayReport, ArraySection};
