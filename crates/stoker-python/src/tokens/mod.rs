//! The tokens kind's classes: `TokenLoader` (packed token rows from text or token files),
//! `TokenIterator`, and `TokenBatch` with its `TokenTensor` views (host memory, or a GPU's
//! through stoker's transfer stage with `device='cuda'`); `Tokenizer` (batches of texts to ids).
//!
//! Files: `loader` (the class and its state dicts, of the token loader's own shape), `mix` (the
//! `TokenMixLoader` class of a weighted mixture and its iterator), `iter` (the iterator class), `batch` (the batch class, its views, and how a token batch is read, host or
//! device), `tokenizer` (the `Tokenizer` class).

mod batch;
mod iter;
mod loader;
mod mix;
mod tokenizer;

pub(crate) use batch::{PyTokenBatch, PyTokenTensor};
pub(crate) use iter::PyTokenIter;
pub(crate) use loader::PyTokenLoader;
pub(crate) use mix::{PyTokenMixIter, PyTokenMixLoader};
pub(crate) use tokenizer::PyTokenizer;
