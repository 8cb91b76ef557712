//! [`BenchOpts`]: the loader's flags that `stoker bench` and `stoker demo` share, and the
//! loader configuration they describe; apart from both commands so that the image and text
//! benchmarks import it, not each other.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use stoker::LoaderConfig;

/// The loader's flags, shared by `bench` and `demo`. Values go to the engine as text
/// ([`stoker::args`] checks them).
#[derive(Args, Clone)]
pub struct BenchOpts {
    /// Transform preset: imagenet-train or imagenet-val.
    #[arg(long, default_value = "imagenet-train")]
    pub preset: String,
    /// Samples per batch.
    #[arg(long, default_value = "256")]
    pub batch_size: String,
    /// Decode threads: a number (fixed), or auto (tuned during the first epoch within
    /// --cpu-budget and the host-wide share; STOKER_SHARED_BUDGET=0 turns sharing off).
    #[arg(long, default_value = "auto")]
    pub threads: String,
    /// Cores autotuned threads may use, e.g. 2 or 1.5 (default: the CPU allowance).
    #[arg(long)]
    pub cpu_budget: Option<String>,
    /// Simulate a training step: the consumer sleeps this many milliseconds per batch, so autotuning has something to tune against.
    #[arg(long)]
    pub consumer_ms: Option<String>,
    /// I/O threads (reads run apart from decode).
    #[arg(long)]
    pub io_threads: Option<String>,
    /// Passes over the dataset.
    #[arg(long, default_value = "1")]
    pub epochs: String,
    /// Seed of the shuffle and augmentations.
    #[arg(long, default_value = "0")]
    pub seed: String,
    /// Cap on batch-buffer memory, e.g. 2GiB, 512MB or 1000000.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// Finished batches queued ahead of the consumer: a number, or auto (tuned, up to 8 within
    /// --memory-limit).
    #[arg(long, default_value = "2")]
    pub prefetch: String,
    /// Bad-sample policy: skip or raise.
    #[arg(long, default_value = "skip")]
    pub on_error: String,
    /// Deliver batches to: cpu, cuda, cuda:N or auto (GPU batches go through pinned buffers and
    /// stoker's copy stream; the digest then reads them back from the GPU).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Where JPEGs are decoded: cpu (libjpeg-turbo, exact), gpu (a share of each batch with
    /// nvJPEG, --device cuda) or auto (a share only while it gives the consumer batches sooner).
    #[arg(long, default_value = "cpu")]
    pub decode: String,
    /// The share of each batch decoded on the GPU with --decode gpu (0 < share <= 1; default 0.5).
    #[arg(long)]
    pub gpu_share: Option<String>,
    /// The preset's resampling filter: bilinear (torchvision's default), bicubic (timm's and
    /// open_clip's ViT recipes) or nearest, antialiased as torchvision's PIL path.
    #[arg(long, default_value = "bilinear")]
    pub interpolation: String,
    /// Output dtype: float32, float16 or uint8 (uint8 drops Normalize).
    #[arg(long, default_value = "float32")]
    pub dtype: String,
    /// Output layout: nchw or nhwc.
    #[arg(long, default_value = "nchw")]
    pub layout: String,
    /// Keep dataset order instead of shuffling.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Shard-aware shuffling over windows of N shards (shard sources only): permute the shards,
    /// shuffle samples within each window.
    #[arg(long)]
    pub shard_window: Option<String>,
    /// Keep the last incomplete batch.
    #[arg(long)]
    pub keep_last: bool,
    /// Disable DCT-scaled JPEG decoding (to measure what it saves).
    #[arg(long)]
    pub no_dct_scaling: bool,
    /// Disable region-of-interest JPEG decoding (to measure what it saves).
    #[arg(long)]
    pub no_roi: bool,
    /// Ignore EXIF orientation.
    #[arg(long)]
    pub no_exif: bool,
    /// Refuse images larger than this many pixels (from the header; default 178956970, Pillow's
    /// decompression-bomb limit): such a file is skipped with its reason.
    #[arg(long)]
    pub max_pixels: Option<String>,
    /// Refuse files larger than this (e.g. 64MiB; default 256MiB), from metadata before reading.
    #[arg(long)]
    pub max_file_bytes: Option<String>,
    /// Failure budget of a pass: a count (100) or a fraction (0.05, 5%); past it the run stops
    /// with the last reasons (default: 10% of the epoch, at least 100).
    #[arg(long)]
    pub max_failures: Option<String>,
    /// Decoded-pixel cache: `ram` (/dev/shm) or a directory on local disk. The first epoch
    /// decodes every image at full resolution and stores it; later epochs (and other processes
    /// with the same cache) read the pixels instead of decoding.
    #[arg(long)]
    pub cache: Option<String>,
    /// The cache's byte budget (e.g. 8GiB; default a quarter of MemAvailable for `ram`, half the
    /// free space for a directory). Filled until used, never evicted.
    #[arg(long)]
    pub cache_bytes: Option<String>,
    /// Store images whose longer side exceeds this many pixels reduced to it (DCT-scaled
    /// decoding, then antialiased resampling): smaller entries and cheaper cached epochs, with
    /// pixels that differ from a full-resolution decode. Default: full resolution.
    #[arg(long)]
    pub cache_max_side: Option<String>,
    /// Instead of loading: decode every file once at full size on one thread (the pure
    /// libjpeg-turbo rate that stoker's per-thread rate is compared with).
    #[arg(long)]
    pub decode_only: bool,
    /// Skip hashing the batches (the digest costs the consumer ~0.1 CPU-s per 1000 float32
    /// images); `digest` is then null. For throughput comparisons with loaders that hash nothing.
    #[arg(long)]
    pub no_digest: bool,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report to this file (opens offline in any browser):
    /// throughput, CPU, memory and consumer waiting over time, the stage table, the verdicts.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Write a Chrome/Perfetto trace (ui.perfetto.dev, chrome://tracing) of every sample's
    /// read, decode and ops on each thread, the batch deliveries and the consumer's waits to
    /// this file: at the end of each epoch and of the run.
    #[arg(long)]
    pub trace: Option<String>,
    /// The trace keeps the last N events (default 200000).
    #[arg(long)]
    pub trace_events: Option<String>,
}

impl BenchOpts {
    /// The loader configuration these flags describe (checked by the engine). Rank and world
    /// size come from torchrun's environment, as in Python.
    pub fn loader_config(&self) -> Result<LoaderConfig> {
        let flag = |b: bool| Some(b.to_string());
        let shuffle = match (&self.shard_window, self.no_shuffle) {
            (_, true) => "false",
            (Some(_), false) => "shards",
            (None, false) => "true",
        };
        Ok(stoker::args::loader_config(stoker::args::from_text([
            ("preset", Some(self.preset.clone())),
            ("interpolation", Some(self.interpolation.clone())),
            ("dtype", Some(self.dtype.clone())),
            ("layout", Some(self.layout.clone())),
            ("apply_exif", flag(!self.no_exif)),
            ("batch_size", Some(self.batch_size.clone())),
            ("shuffle", Some(shuffle.to_string())),
            ("shard_window", self.shard_window.clone()),
            ("seed", Some(self.seed.clone())),
            ("drop_last", flag(!self.keep_last)),
            ("threads", Some(self.threads.clone())),
            ("cpu_budget", self.cpu_budget.clone()),
            ("io_threads", self.io_threads.clone()),
            ("prefetch", Some(self.prefetch.clone())),
            ("memory_limit", self.memory_limit.clone()),
            ("on_error", Some(self.on_error.clone())),
            ("dct_scaling", flag(!self.no_dct_scaling)),
            ("roi", flag(!self.no_roi)),
            ("max_pixels", self.max_pixels.clone()),
            ("max_file_bytes", self.max_file_bytes.clone()),
            ("max_failures", self.max_failures.clone()),
            ("cache", self.cache.clone()),
            ("cache_bytes", self.cache_bytes.clone()),
            ("cache_max_side", self.cache_max_side.clone()),
            ("trace", self.trace.clone()),
            ("trace_events", self.trace_events.clone()),
            ("decode", Some(self.decode.clone())),
            ("gpu_share", self.gpu_share.clone()),
        ]))?)
    }

    /// `--consumer-ms`, checked: the simulated step per batch.
    pub fn consumer_step(&self) -> Result<std::time::Duration> {
        let Some(ms) = &self.consumer_ms else { return Ok(std::time::Duration::ZERO) };
        match ms.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && (0.0..=600_000.0).contains(&v) => Ok(std::time::Duration::from_secs_f64(v / 1e3)),
            _ => anyhow::bail!("invalid argument `--consumer-ms`: expected milliseconds in [0, 600000], got {ms:?}"),
        }
    }

    /// `--epochs`, checked.
    pub fn epochs(&self) -> Result<u64> {
        Ok(stoker::args::positive("epochs", &stoker::args::text_value(&self.epochs))? as u64)
    }
}
