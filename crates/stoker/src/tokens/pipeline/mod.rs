//! [`TokenLoader`]: documents read, tokenized on stoker's threads and packed into batches of
//! `input_ids`, `labels`, `position_ids` and `cu_seqlens`, in pooled buffers.
//!
//! Threads of one iteration (all on the shell's [`crate::shell::ordered::Run`]):
//! - `stoker-text-read` (`read`): walks this rank's document order from the resume point,
//!   reads the documents (positional reads, or a decompressing stream) and sends them in chunks;
//! - `stoker-tokenize-K` (`tokenize`): each owns a clone of the tokenizer; parses a chunk
//!   (JSON, UTF-8) and tokenizes it, without offsets;
//! - `stoker-pack` (`batcher`): puts chunks back in order and packs the document stream into
//!   rows ([`crate::tokens::pack`]), a batch per pooled slot.
//!
//! A credit per chunk in flight bounds the memory between the reader and the packer, whatever
//! the thread count; the packer sees documents in order, so batches do not depend on it.
//!
//! Files, in the order data flows: `config` (what a user sets), `state` (saved states, elastic
//! bases, fingerprints), `order` (each epoch's document order per rank), `stats` (counters, the
//! report's token section and the verdict), `slot` (a pooled batch buffer), `shared` (what a loader and its threads share),
//! `read`, `tokenize`, `batcher` (the three threads), `batch` and `iter` (what the consumer
//! gets), `loader` (construction, epochs, the start of a pass) and `resume` (the saved state:
//! fingerprint, state dict, resuming another number of ranks); `mix`, `mix_state` and
//! `mix_resume` (a weighted mixture of token loaders, row by row, where it stands, and its
//! saved state). Imports run one way: `loader`/`resume` -> `iter` -> `batch` -> `batcher`
//! -> `tokenize` -> `read` -> `shared` -> `order` -> `state` -> `config`.
//! Owns: running the token work. May not touch: the formats on disk (`docs`), tokenizers'
//! internals, CUDA, Python.

mod batch;
mod batcher;
mod config;
mod iter;
mod loader;
mod mix;
mod mix_resume;
mod mix_state;
mod order;
mod read;
mod resume;
mod shared;
mod slot;
mod state;
mod stats;
mod tokenize;

pub use batch::{TokenBatch, TokenMeta};
pub use config::{expand_paths, format_of, PackMode, TokenConfig, TokenMixture};
pub use iter::{TokenIter, TokenLoader};
pub use mix::{MixSection, TokenMix, TokenMixIter, TokenMixLoader};
pub use mix_state::{MixFingerprint, MixPosition, MixState};
pub use shared::Tokens;
pub use slot::TokenSlot;
pub use state::{Elastic, TokenFingerprint, TokenPosition, TokenState};
pub use stats::{TokenCounts, TokenReport, TokenSeconds, TokenSection, TokenStats, TokenizerReport};
