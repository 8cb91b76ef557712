//! Tools built on the engine, for the CLI and the Python package: not on the path of a batch.
//!
//! - [`pack`]: an ImageFolder to WebDataset tar shards with sidecar indexes (`stoker pack`).
//! - [`demo`]: the embedded demo dataset (`stoker demo`, `stoker.make_demo`).
//! - [`tokenize`]: a corpus tokenized once into a token cache folder (`stoker tokenize`).
//!
//! Owns: writing datasets. May not touch: the loader's internals (they use the public API).

pub mod demo;
pub mod pack;
pub mod tokenize;
