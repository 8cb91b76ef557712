//! # stoker: the engine
//!
//! stoker turns image files into batches on a thread pool, using as little CPU and memory as the
//! work allows, and says which stage is the bottleneck. Data flows one way:
//!
//! ```text
//! Source ─► Sampler ─► Reader ─► Decode ─► Ops ─► BatchSlot ─► Consumer
//! ```
//!
//! - [`source`]: what samples exist ([`ImageFolder`]); only an index lives in memory.
//! - [`sampler`]: seeded per-epoch order, rank sharding, resumable [`SamplerState`].
//! - [`decode`]: libjpeg-turbo with DCT scaling and region decoding; PNG.
//! - [`ops`]: torchvision's transforms, fused into one resample + one write per sample.
//! - [`buffer`]: the fixed pool of batch buffers (memory cap and backpressure).
//! - [`pipeline`]: threads, queues, ordered delivery, prompt shutdown.
//! - [`telemetry`]: per-stage counters and the bottleneck verdict.
//! - [`trace`]: Chrome/Perfetto traces of every sample's stages on every thread.
//! - [`tune`], [`budget`]: `threads`/`prefetch="auto"` and the host-wide CPU share.
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
pub mod budget;
pub mod buffer;
pub mod cache;
pub mod cpu;
pub mod decode;
pub mod demo;
pub mod error;
pub mod ops;
pub mod pack;
pub mod pipeline;
pub mod rng;
pub mod sampler;
pub mod source;
pub mod telemetry;
pub mod trace;
pub mod tune;

pub use error::{Error, Result};
pub use ops::{DType, Layout, OpSpec, ResizeSize, TransformPlan, TransformSpec};
pub use pipeline::{Batch, EpochIter, ErrorPolicy, Loader, LoaderConfig, MaxFailures};
pub use sampler::{Fingerprint, Sampler, SamplerSpec, SamplerState};
pub use source::{ImageFolder, ShardSource, Source};
pub use telemetry::Report;

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

    /// The digest as 32 hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0.digest128())
    }
}
