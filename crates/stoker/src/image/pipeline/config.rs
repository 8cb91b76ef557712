//! The loader's configuration: what a user may set, validated by `stoker::args`, with the
//! defaults (error policy, failure budget, limits, cache, trace).

use super::*;

/// What to do with a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    /// Skip it, count it, list it in the report (the default).
    Skip,
    /// Stop the iteration with its error.
    Raise,
}

impl ErrorPolicy {
    /// Parses `skip` / `raise`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "skip" => Ok(ErrorPolicy::Skip),
            "raise" => Ok(ErrorPolicy::Raise),
            _ => Err(Error::config("on_error", format!("unknown policy {s:?}; allowed: skip, raise"))),
        }
    }
}

/// Everything a loader needs besides its source: a plain, serialisable description.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LoaderConfig {
    /// Order, sharding and batch size.
    pub sampler: SamplerSpec,
    /// The transform.
    pub transform: TransformSpec,
    /// Decode threads (`None`: autotuned within `cpu_budget`, see [`crate::observe::tune`]; a set
    /// `STOKER_NUM_THREADS` is a fixed count).
    pub threads: Option<usize>,
    /// I/O threads (`None`: 2, or fewer with a single decode thread).
    pub io_threads: Option<usize>,
    /// Finished batches that may wait ahead of the consumer (with `prefetch_auto`, the start).
    pub prefetch: usize,
    /// `prefetch="auto"`: tuned up to [`crate::observe::tune::AUTO_PREFETCH_MAX`] within the memory cap.
    #[serde(default)]
    pub prefetch_auto: bool,
    /// Cores autotuned threads may use (`None`: the CPU allowance).
    #[serde(default)]
    pub cpu_budget: Option<f64>,
    /// Cap on the bytes of all batch buffers together.
    pub memory_limit: Option<u64>,
    /// The local shard cache of shards in object storage (`shard_cache`, `shard_cache_bytes`):
    /// see [`crate::source::shard_cache`].
    #[serde(default)]
    pub shard_cache: Option<crate::shell::store::StoreSpec>,
    /// `shuffle="global"` was asked for: one global permutation even over object storage
    /// (where `shuffle=True` means a shard-window order, see [`remote_window`]).
    #[serde(default)]
    pub shuffle_global: bool,
    /// Bad-sample policy.
    pub on_error: ErrorPolicy,
    /// Allow DCT-scaled JPEG decoding (on by default; off only to measure it).
    pub dct_scaling: bool,
    /// Allow region-of-interest JPEG decoding (on by default; off only to measure it).
    pub roi: bool,
    /// Images larger than this many pixels (from the header) are that sample's error.
    #[serde(default = "default_max_pixels")]
    pub max_pixels: u64,
    /// Files (or shard members) larger than this many bytes are that sample's error.
    #[serde(default = "default_max_file_bytes")]
    pub max_file_bytes: u64,
    /// The failure budget of a pass: past it the iteration raises instead of delivering
    /// near-empty batches (a storage outage, a broken dataset).
    #[serde(default)]
    pub max_failures: MaxFailures,
    /// The decoded-pixel cache (`None`: decode every epoch). With a cache, every image is
    /// decoded whole (`roi` is not used), at full resolution (`dct_scaling` is not used either)
    /// unless the cache has a `max_side`, so batches are the same whether a sample's pixels came
    /// from the cache or from a decode.
    #[serde(default)]
    pub cache: Option<crate::image::cache::CacheSpec>,
    /// Record a trace of every sample's stages (see [`crate::observe::trace`]); `None`: no tracing, at
    /// no cost.
    #[serde(default)]
    pub trace: Option<TraceSpec>,
    /// The host-wide CPU registry file autotuned loaders share cores through (`None`: no
    /// sharing); `args` sets it from the environment (see
    /// [`crate::args::budget_registry_path`]).
    #[serde(default = "crate::observe::budget::default_registry_path")]
    pub cpu_registry: Option<std::path::PathBuf>,
    /// The sources of a mixture (`sampler.mixture` says how they mix), opened with
    /// [`crate::source::mix::open_mixture`]; empty for one dataset.
    #[serde(default)]
    pub parts: Vec<crate::source::mix::PartSpec>,
    /// Image-text pairs: each sample's caption, encoded beside its image (`None`: images alone).
    #[serde(default)]
    pub captions: Option<crate::tokens::CaptionSpec>,
    /// Where JPEGs are decoded: the CPU (exact, the default), or a share of each batch on the
    /// GPU ([`crate::image::gpu_job`]; needs a GPU device, uint8 batches and no cache).
    #[serde(default)]
    pub decode: crate::image::gpu_job::DecodeOn,
    /// MixUp/CutMix on each finished host batch, with soft labels (`None`: hard labels).
    #[serde(default)]
    pub mix: Option<crate::image::ops::mix::MixSpec>,
}

/// How many samples of one pass over an epoch may fail (be skipped) before the iteration
/// raises. The default, 10% of the epoch's samples but at least 100, never trips on the few
/// corrupt files real datasets hold (well under 1%), and stops a job whose storage went away
/// after a tenth of an epoch instead of letting it train on empty batches.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaxFailures {
    /// 10% of the pass's samples, at least 100.
    #[default]
    Default,
    /// At most this many.
    Count(u64),
    /// At most this fraction (0 < f <= 1) of the pass's samples.
    Fraction(f64),
}

impl MaxFailures {
    /// The number of failures allowed in a pass over `samples` samples.
    pub fn limit(&self, samples: usize) -> u64 {
        match *self {
            MaxFailures::Default => ((samples as f64 * 0.1).ceil() as u64).max(100),
            MaxFailures::Count(n) => n,
            MaxFailures::Fraction(f) => (samples as f64 * f).floor() as u64,
        }
    }
}

pub(super) fn default_max_pixels() -> u64 {
    crate::image::decode::DEFAULT_MAX_PIXELS
}

pub(super) fn default_max_file_bytes() -> u64 {
    DEFAULT_MAX_FILE_BYTES
}

/// The default file-size limit: 256 MiB, far above any real training image (ImageNet's largest
/// JPEG is ~15 MiB) and small enough that every I/O thread may hold one in memory.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 256 << 20;

/// Parts in a shard-window of data in object storage when `shuffle=True` (and `shard_window`
/// is not given): 4 parts of at most [`crate::source::readahead::PART_BYTES`] (256 MiB).
pub const REMOTE_WINDOW: usize = 4;

/// The shard window of a shuffled pass over object storage: [`REMOTE_WINDOW`] parts, fewer when
/// a quarter of a `memory_limit` given holds fewer. A function of the arguments alone (never
/// of the machine), so that a state saved on one machine resumes on another.
pub fn remote_window(memory_limit: Option<u64>) -> usize {
    let part = crate::source::readahead::PART_BYTES;
    memory_limit.map_or(REMOTE_WINDOW, |m| ((m / 4 / part) as usize).clamp(1, REMOTE_WINDOW))
}

/// The bytes of parts a pass over object storage holds (fetched and in flight): the window
/// being read, the next one and room for reads out of order (at least 4 parts); at most a
/// quarter of a `memory_limit` given (the rest is the batch buffers').
pub fn readahead_bytes(window: Option<usize>, memory_limit: Option<u64>) -> u64 {
    let part = crate::source::readahead::PART_BYTES;
    let w = window.unwrap_or_else(|| remote_window(memory_limit)) as u64;
    let full = (2 * w + 2).max(4) * part;
    memory_limit.map_or(full, |m| full.min(m / 4))
}

impl LoaderConfig {
    /// A configuration with defaults for everything but the batch size and transform.
    pub fn new(batch_size: usize, transform: TransformSpec) -> Self {
        LoaderConfig {
            sampler: SamplerSpec { batch_size, ..SamplerSpec::default() },
            transform,
            cpu_registry: crate::observe::budget::default_registry_path(),
            threads: None,
            io_threads: None,
            prefetch: 2,
            prefetch_auto: false,
            cpu_budget: None,
            memory_limit: None,
            shuffle_global: false,
            shard_cache: None,
            on_error: ErrorPolicy::Skip,
            dct_scaling: true,
            roi: true,
            max_pixels: default_max_pixels(),
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_failures: MaxFailures::Default,
            cache: None,
            trace: None,
            parts: vec![],
            captions: None,
            decode: crate::image::gpu_job::DecodeOn::Cpu,
            mix: None,
        }
    }
}
