//! The running pipeline: a dispatcher, a small I/O pool and a decode pool joined by bounded
//! queues, delivering batches in order.
//!
//! ```text
//! dispatcher ──tasks──► I/O threads ──bytes──► decode threads ──done──► consumer (reorders)
//!     ▲ waits for a free slot                        │ write samples straight into the slot
//!     └──────────────── slot returns when the Batch is dropped ◄──────────────────┘
//! ```
//!
//! Reads are kept apart from decode so slow storage does not idle the decoders. Shutdown: the
//! consumer sets a cancel flag and drops its end; every blocking wait either observes the flag
//! (with a short timeout) or sees its channel disconnect, and `Drop` joins every thread.
//! A bad sample is skipped (policy `skip`): its batch is delivered *shorter* (the good samples
//! compacted in order), never with a garbage slot; a batch whose samples all failed is not
//! delivered. Under policy `raise` the batch holding the first bad sample yields the error and
//! the iteration ends.
//!
//! Files, in the order data flows: `config` (what a user sets), `shared` (what a loader and
//! its threads share, built from the config), `loader` (construction; epochs, resume, report),
//! `stages` (the dispatcher, I/O and decode threads of a pass), `work` (one sample: decode or
//! cache, ops, the write into its slot), `iter` (a pass: its threads, and the image kind's
//! hooks on the shell's `Pass`: delivery, failure budget, stale iterators, its report),
//! `batch` (the delivered view of a buffer), `report` (the image stages' counters, the
//! report's image section and the image verdict). Imports run one way: `loader` -> `iter` ->
//! `stages` -> `work` -> `shared` -> `report` and `config`, and `iter` -> `batch`; no two files
//! import each other.
//! Owns: running the image work. May not touch: sources' formats, CUDA, Python.

mod batch;
mod config;
mod iter;
mod loader;
mod report;
mod shared;
mod stages;
mod work;

pub use batch::{Batch, ImageMeta};
pub use config::*;
pub use iter::EpochIter;
pub use loader::Loader;
pub use report::{AugmentOpReport, ImageCounters, ImageReport, ImageSection};
pub use shared::dataset_key;

use crate::error::{Error, Result};
use crate::image::decode::{DecodeOptions, Decoder};
use crate::image::ops::{DType, Layout, Resampler, TransformPlan, TransformSpec};
use crate::observe::report::Skipped;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::{Args as TraceArgs, TraceSpec, Tracer};
use crate::shell::buffer::{BufferPool, HeapAllocator, HostAllocator, Slot};
pub use crate::shell::pass::Next;
use crate::shell::rng::{self, Rng};
use crate::shell::sampler::{Fingerprint, Position, Sampler, SamplerSpec, Start};
use crate::source::Source;
use crossbeam_channel::{bounded, Receiver, Sender};
use report::verdict;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
