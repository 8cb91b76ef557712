//! # stoker: the engine
//!
//! stoker turns files on disk into batches on a thread pool, using as little CPU and memory as
//! the work allows, and says which stage is the bottleneck. Data flows one way:
//!
//! ```text
//! Source ─► Sampler ─► Reader ─► Decode/Cache ─► Ops ─► BatchSlot ─► (Transfer) ─► Consumer
//!  (index)   (order)    (I/O      (pixels, or      (one     (pooled      (H2D on       (Rust
//!                        threads)  cached pixels)   write)   buffer)      stoker-cuda)  or Python)
//!    ▲ backpressure: a batch is scheduled only when a buffer is free; it returns when dropped ┘
//! ```
//!
//! The crate is grouped into rooms; each folder's `mod.rs` says what it owns and what it may not
//! touch, and the README's "How the engine is laid out" follows one sample through the files.
//!
//! - [`source`]: sources and formats: what samples exist ([`ImageFolder`], tar shards, object
//!   storage); only an index lives in memory.
//! - [`shell`]: what every loader kind shares: [`shell::kind`] (the one `Loader<K>` and its
//!   iterator over a kind: images, arrays, tokens), [`sampler`] (seeded order, rank sharding,
//!   resumable [`SamplerState`], the fingerprint), [`buffer`] (the fixed pool: memory cap and
//!   backpressure), [`shell::ordered`] (one iteration's threads, the reorder buffer, prompt
//!   shutdown), [`shell::pass`] (the consumer's side of every kind's pass: in-order delivery,
//!   the failure budget, stale iterators, consumer telemetry; [`Next`] is what a poll gives),
//!   [`shell::epochs`] (epoch, position, state dict, the running iteration), [`rng`],
//!   [`shell::store`] (cache groups shared by the pixel and token caches). A loader
//!   kind brings only its source, its per-sample work and its batch layout.
//! - [`image`]: [`decode`] (libjpeg-turbo with DCT scaling and region decoding; PNG),
//!   [`ops`] (torchvision's transforms fused into one resample and one write per sample),
//!   [`cache`] (the decoded-pixel cache: groups per dataset, a shared budget, checksums) and
//!   [`pipeline`] (the image loader: threads, per-sample work, ordered delivery).
//! - [`arrays`]: the `.npy` format and [`arrays::ArrayLoader`] (rows gathered by the sampler's
//!   indices into pooled buffers).
//! - [`tokens`]: language-model data: JSON Lines, text and token files tokenized with the
//!   HuggingFace `tokenizers` crate or stoker's exact byte-level BPE on stoker's threads,
//!   cached once tokenized, and packed into rows ([`tokens::TokenLoader`]).
//! - [`observe`]: [`telemetry`] (per-stage counters), [`report`] (one [`Report`] for every
//!   kind, its typed section flattened in, the bottleneck verdict's shape), [`trace`]
//!   (Chrome/Perfetto traces), [`tune`] and [`budget`] (`threads`/`prefetch="auto"`, the host-wide
//!   CPU share), [`cpu`] (the real CPU allowance).
//! - [`tools`]: [`pack`] (ImageFolder to shards) and [`demo`].
//! - [`args`]: every value a user, a file or the environment gives, validated once; [`error`].
//!
//! The transfer to a GPU (pinned buffers, copies on stoker's own CUDA stream, a device pool on
//! the same ordered run) lives in the `stoker-cuda` crate, the Python front in `stoker-python`.
//!
//! ```no_run
//! use std::sync::Arc;
//! use stoker::{ImageFolder, Loader, LoaderConfig, TransformSpec};
//!
//! let source = Arc::new(ImageFolder::new("data/train")?);
//! let mut config = LoaderConfig::new(256, TransformSpec::preset("imagenet-train")?);
//! config.sampler.shuffle = true;
//! let loader = Loader::new(source, config)?;
//! for epoch in 0..2 {
//!     loader.set_epoch(epoch);
//!     for batch in loader.iter()? {
//!         let batch = batch?;
//!         assert_eq!(batch.shape()[1..], [3, 224, 224]);
//!     }
//! }
//! println!("{}", loader.report().to_text());
//! # Ok::<(), stoker::Error>(())
//! ```
//!
//! Random choices for sample `i` of epoch `e` come from an RNG seeded by `(seed, e, i)`, so
//! batches are bit-identical whatever the thread count.

#![warn(missing_docs)]

pub mod args;
pub mod arrays;
pub mod error;
pub mod image;
pub mod observe;
pub mod shell;
pub mod source;
pub mod tokens;
pub mod tools;
pub mod values;

// The modules of each room, at the crate root as well: the paths other crates and older code use.
pub use image::{cache, decode, ops, pipeline};
pub use observe::{budget, cpu, report, telemetry, trace, tune};
pub use shell::{buffer, rng, sampler};
pub use tools::{demo, pack};

pub use error::{Error, Result};
pub use ops::{DType, Layout, OpSpec, ResizeSize, TransformPlan, TransformSpec};
pub use pipeline::{Batch, EpochIter, ErrorPolicy, Loader, LoaderConfig, MaxFailures};
pub use report::Report;
pub use sampler::{ElasticBase, ElasticStep, Fingerprint, Sampler, SamplerSpec, SamplerState};
pub use shell::pass::Next;
pub use source::{ImageFolder, ShardSource, Source};

/// A running 128-bit hash (XXH3) of batches in delivery order: data bytes, then labels.
/// Two runs that deliver the same batches have the same digest.
#[derive(Default)]
pub struct Digest(xxhash_rust::xxh3::Xxh3);

impl std::fmt::Debug for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Digest")
    }
}

impl Digest {
    /// An empty digest.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one batch.
    pub fn update(&mut self, batch: &Batch) {
        self.0.update(batch.data());
        for l in batch.labels() {
            self.0.update(&l.to_le_bytes());
        }
    }

    /// Adds one batch given as raw bytes: the data, then the labels as native-endian `i64`s
    /// (a batch read back from a GPU); equal to [`Digest::update`] on the same batch.
    pub fn update_bytes(&mut self, data: &[u8], labels: &[u8]) {
        self.0.update(data);
        for l in labels.chunks_exact(8) {
            let v = i64::from_ne_bytes(l.try_into().expect("8 bytes"));
            self.0.update(&v.to_le_bytes());
        }
    }

    /// Adds one token batch: `input_ids`, `labels`, `position_ids`, `cu_seqlens` and `sources`,
    /// each as little-endian `i32`s.
    pub fn update_tokens(&mut self, batch: &tokens::TokenBatch) {
        for a in [batch.input_ids(), batch.labels(), batch.position_ids(), batch.cu_seqlens(), batch.sources()] {
            let mut buf = [0u8; 4096];
            for c in a.chunks(1024) {
                for (b, v) in buf.chunks_exact_mut(4).zip(c) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
                self.0.update(&buf[..c.len() * 4]);
            }
        }
    }

    /// The digest as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0.digest128())
    }
}
