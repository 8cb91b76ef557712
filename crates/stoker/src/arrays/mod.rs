//! Array work: batches of rows gathered from in-memory arrays and `.npy` files by the
//! sampler's indices, for `stoker.ArrayLoader`.
//!
//! - the `.npy` format (header and row layout, every size checked) is
//!   [`crate::source::npy`]'s, re-exported here.
//! - [`column`](mod@column): [`Column`], rows in memory or read with `pread` from a `.npy` file.
//! - [`loader`]: the array kind ([`Arrays`]) on the shell's [`crate::shell::kind::Loader`]
//!   ([`ArrayLoader`]), over the shared [`crate::shell::sampler`].
//! - [`report`]: the array kind's part of its report (copy counters, [`ArraySection`], the
//!   verdict).
//!
//! Owns: copying rows into slots. May not touch: images (decode, ops,
//! the decoded-pixel cache) or Python; it never maps a file (a file that shrinks must be an
//! error, not a `SIGBUS`).

pub mod column;
pub mod loader;
pub mod report;

pub use crate::source::npy::*;
pub use column::*;
pub use loader::*;
pub use report::{ArrayCounters, ArrayReport, ArraySection};
