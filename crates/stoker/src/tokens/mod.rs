//! Language-model data: documents (JSON Lines, plain text, pre-tokenized token files) read,
//! tokenized with the HuggingFace `tokenizers` crate on stoker's threads, and packed into
//! rows of `seq_len` tokens with labels, position ids and `cu_seqlens`.
//!
//! - [`docs`]: the formats on disk and the document index (offsets, lengths, lines).
//! - [`corpus`]: the documents of a loader's files, numbered in file order.
//! - [`index`]: document indexes stored between runs, checked against their files.
//! - [`jsonl`]: a JSON Lines record's text in one pass into a reused buffer (serde_json for
//!   what it does not take).
//! - [`tokenizer`]: a `tokenizer.json`, one instance per thread, no offsets.
//! - [`encode`]: a batch of texts to ids on threads made for the call, in input order
//!   (`stoker.Tokenizer`).
//! - [`bpe`]: stoker's exact fast path for byte-level BPE files (GPT-2, GPT-NeoX, Llama 3, Qwen2,
//!   GPT-4o kinds), chosen by [`tokenizer`] when a file is one it reproduces; `pretok` holds its
//!   hand-written pre-tokenizer patterns (GPT-2, cl100k, Qwen2, o200k), `pretok_block` GPT-2's
//!   pieces 64 bytes at a time by bit masks where the text is ASCII, `pretok_clip` CLIP's.
//! - [`tokenizer_v1`]: `tokenizers` 1.0 for the files the fast path does not take, admitted per
//!   file by a probe against 0.22's ids (Llama 2's SentencePiece BPE, WordPiece, Unigram).
//! - [`caption`]: captions of image-text pairs as fixed rows of ids and a mask (CLIP's start and
//!   end of text, truncation, padding), with open_clip's cleaning or HuggingFace's; [`html`] is
//!   Python's `html.unescape` for it (`html_tables` holds its generated tables).
//! - [`pack`]: the concat and best-fit packers and their resume points (pure functions of the
//!   document stream).
//! - [`cache`]: the token cache folder (`stoker tokenize`): tokens, index, description.
//! - [`autocache`]: the automatic token cache (`cache="ram"` or a directory): each document
//!   tokenized once, its tokens shared by later epochs and other processes within a byte budget.
//! - [`pipeline`]: [`TokenLoader`]: order, rank sharding, threads, pooled batches, state (one
//!   file per job, as the image pipeline).
//!
//! Owns: text formats, tokenization, packing. May not touch: the shell's iteration rules
//! (delivery, failure budget, stale iterators), which it uses through [`crate::shell::pass`].

pub mod autocache;
pub mod bpe;
pub mod cache;
pub mod caption;
pub mod corpus;
pub mod docs;
pub mod encode;
pub mod html;
mod html_tables;
pub mod index;
pub mod jsonl;
pub mod pack;
mod pair_table;
mod piece_cache;
pub mod pipeline;
mod pretok;
mod pretok_block;
mod pretok_class;
mod pretok_clip;
mod pretok_tables;
pub mod tokenizer;
pub mod tokenizer_v1;

pub use caption::{CaptionEncoder, CaptionField, CaptionOptions, CaptionSpec, Clean};
pub use encode::{EncodeOptions, EncodedBatch, TextEncoder};
pub use pipeline::{
    expand_paths, format_of, Elastic, PackMode, TokenBatch, TokenConfig, TokenCounts, TokenFingerprint, TokenIter,
    TokenLoader, TokenReport, TokenSection, TokenState, TokenStats,
};
pub use tokenizer::TextTokenizer;
