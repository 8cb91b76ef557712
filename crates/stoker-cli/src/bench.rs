//! `stoker bench`: load a dataset as fast as possible and report throughput, CPU, memory and
//! the bottleneck; `--decode-only` measures libjpeg-turbo alone on one thread.

use crate::series::{self, Recorder};
use crate::util::{cpu_seconds, peak_rss_bytes, progress};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use stoker::LoaderConfig;

/// Flags of `stoker bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// The dataset: an ImageFolder root (ROOT/CLASS/IMAGE), a folder written by `stoker pack`,
    /// indexed tar shards (a .tar file or a glob such as 'shards/train-*.tar', quoted), or a URL
    /// (s3://bucket/train/ or s3://bucket/train/shard-*.tar).
    pub root: String,
    #[command(flatten)]
    pub opts: BenchOpts,
    /// Language-model data (text with --tokenizer, token files, a token cache folder).
    #[command(flatten)]
    pub text: crate::bench_text::TextOpts,
}

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

/// Runs `stoker bench`.
pub fn run(a: &BenchArgs) -> Result<()> {
    if crate::bench_text::is_text(&a.root, &a.text) {
        return crate::bench_text::bench(&a.root, &a.opts, &a.text);
    }
    bench(&a.root, &a.opts)
}

/// One thread, every file read into memory then decoded whole at full size; only the decode
/// is timed. `--max-pixels` and `--max-file-bytes` apply as in a load: a file over either is
/// refused (from its metadata or header) and listed in `skipped` with its reason.
fn decode_only(root: &str, o: &BenchOpts) -> Result<()> {
    use stoker::decode::{DecodeOptions, Decoder};
    /// Skipped files listed in the summary (all are counted).
    const LISTED: usize = 1000;
    let config = o.loader_config()?;
    let json = o.json;
    let source = stoker::source::open(&[root.to_string()])?.source;
    let mut dec = Decoder::new(DecodeOptions {
        apply_exif: false,
        dct_scaling: false,
        roi: false,
        restart: false,
        max_pixels: config.max_pixels,
    })?;
    let mut buf = Vec::new();
    let (mut n, mut failed, mut pixels) = (0usize, 0usize, 0u64);
    let mut skipped = vec![];
    let mut skip = |path: std::path::PathBuf, e: stoker::Error| {
        if skipped.len() < LISTED {
            skipped.push(serde_json::json!({"path": path.to_string_lossy(), "reason": e.reason()}));
        }
    };
    let mut busy = std::time::Duration::ZERO;
    let cpu0 = cpu_seconds();
    for i in 0..source.len() {
        let path = source.describe(i);
        if let Err(e) = source.read(i, &mut buf, config.max_file_bytes) {
            failed += 1;
            skip(path, e);
            continue;
        }
        let t = Instant::now();
        let ok = dec.info(&buf, &path).and_then(|info| {
            let bbox = [0.0, 0.0, info.width as f64, info.height as f64];
            dec.decode(&buf, &path, &info, bbox, (info.width, info.height)).map(|r| (r.width * r.height) as u64)
        });
        busy += t.elapsed();
        match ok {
            Ok(px) => {
                n += 1;
                pixels += px;
            }
            Err(e) => {
                failed += 1;
                skip(path, e);
            }
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let secs = busy.as_secs_f64();
    let out = serde_json::json!({
        "images": n,
        "failed": failed,
        "skipped": skipped,
        "decode_seconds": secs,
        "images_per_sec": n as f64 / secs,
        "megapixels_per_sec": pixels as f64 / secs / 1e6,
        "cpu_seconds_including_reads": cpu,
        "libjpeg_turbo": stoker::decode::jpeg::LIBJPEG_TURBO_VERSION,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "pure full-size decode, 1 thread: {n} images in {secs:.2} s of decoding: {:.1} images/s, {:.1} MP/s ({failed} failed)",
            n as f64 / secs,
            pixels as f64 / secs / 1e6
        );
        for s in skipped.iter().take(10) {
            println!("  skipped {}: {}", s["path"].as_str().unwrap_or(""), s["reason"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

/// Loads `root` with the loader `o` describes for `--epochs` passes and prints the summary.
pub fn bench(root: &str, o: &BenchOpts) -> Result<()> {
    if o.decode_only {
        if o.report.is_some() {
            anyhow::bail!(
                "--report: not available with --decode-only (a single-thread decode loop has no pipeline to chart)"
            );
        }
        return decode_only(root, o);
    }
    let config = o.loader_config()?;
    let epochs = o.epochs()?;
    let step = o.consumer_step()?;
    // `cuda` means this rank's GPU under torchrun, as in the Python package. Resolved before
    // the dataset is opened, so a bad device fails first.
    let target = stoker_cuda::Target::resolve(&o.device, stoker::args::local_rank()?)?;
    let dataset = stoker::source::open(&[root.to_string()])?;
    let (samples, classes) = (dataset.source.len(), dataset.classes.len());
    let batch_size = config.sampler.batch_size;
    let stoker_cuda::OnDevice { loader, stage, .. } = target.image_loader(&dataset, config)?;
    // The report's file is created now, so that a bad path fails before the run, not after.
    let report_file = o.report.as_deref().map(|p| series::ReportFile::create(p, "--report")).transpose()?;
    let mut recorder = report_file.as_ref().map(|_| Recorder::start());
    let total_batches = loader.len() as u64 * epochs;
    let bar = progress(total_batches, o.json, "{spinner} epoch {msg} [{bar:30}] {pos}/{len} batches {per_sec} ({eta})");
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut digest = stoker::Digest::new();
    let (mut images, mut batches) = (0usize, 0usize);
    let mut per_epoch = vec![];
    for epoch in 0..epochs {
        let (e_cpu, e_t, e_images) = (cpu_seconds(), Instant::now(), images);
        loader.set_epoch(epoch);
        if let (Some(r), true) = (recorder.as_mut(), epochs > 1) {
            r.mark(format!("epoch {}", epoch + 1));
        }
        bar.set_message(format!("{}/{}", epoch + 1, epochs));
        match &stage {
            None => {
                for b in series::timed(recorder.as_mut(), loader.iter()?, |b| b.as_ref().map_or(0, |b| b.len())) {
                    let b = b?;
                    if !o.no_digest {
                        digest.update(&b);
                    }
                    images += b.len();
                    batches += 1;
                    bar.inc(1);
                    drop(b);
                    if !step.is_zero() {
                        std::thread::sleep(step);
                    }
                }
            }
            Some(stage) => {
                let mut host = loader.iter()?.forwarding();
                let (mut data, mut labels) = (vec![], vec![]);
                let on_device = stage.run(move |t| host.next_timeout(t), Some(loader.telemetry().clone()))?;
                for b in series::timed(recorder.as_mut(), on_device, |b| b.as_ref().map_or(0, |b| b.meta().shape[0])) {
                    let b = b?;
                    if !o.no_digest {
                        b.read_region(0, &mut data)?;
                        b.read_region(1, &mut labels)?;
                        digest.update_bytes(&data, &labels);
                    }
                    images += b.meta().shape[0];
                    batches += 1;
                    bar.inc(1);
                    drop(b);
                    if !step.is_zero() {
                        std::thread::sleep(step);
                    }
                }
            }
        }
        let (n, cpu) = (images - e_images, cpu_seconds() - e_cpu);
        per_epoch.push(serde_json::json!({
            "epoch": epoch,
            "images": n,
            "seconds": e_t.elapsed().as_secs_f64(),
            "cpu_seconds": cpu,
            "cpu_seconds_per_1000": if n > 0 { cpu / n as f64 * 1000.0 } else { 0.0 },
        }));
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    bar.finish_and_clear();
    // The run's last events (a GPU run's last copies) after the last pass's write.
    if let Some(path) = loader.trace_path() {
        loader.write_trace(path)?;
    }
    let report = loader.report();
    let ips = images as f64 / seconds;
    let per1000 = if images > 0 { cpu / images as f64 * 1000.0 } else { 0.0 };
    let rss = peak_rss_bytes();
    if let (Some(file), Some(mut rec)) = (report_file, recorder) {
        rec.finish();
        let facts = series::Facts {
            root,
            samples,
            classes,
            images,
            batches,
            epochs,
            batch_size,
            seconds,
            cpu_seconds: cpu,
            peak_rss: rss,
            threads: loader.threads(),
            io_threads: loader.io_threads(),
            allowance: stoker::cpu::allowance().effective,
            pool_bytes: loader.pool().total_bytes() as u64,
            pool_slots: loader.pool().slots(),
        };
        file.write(&crate::html::render(&series::page(&facts, settings_table(&facts, o, &report), &report, &rec)))?;
    }
    if o.json {
        let out = serde_json::json!({
            "root": root,
            "preset": o.preset,
            "dataset_samples": samples,
            "classes": classes,
            "images": images,
            "batches": batches,
            "epochs": epochs,
            "batch_size": batch_size,
            "seconds": seconds,
            "images_per_sec": ips,
            "cpu_seconds": cpu,
            "cpu_seconds_per_1000": per1000,
            "peak_rss_bytes": rss,
            "threads": loader.threads(),
            "io_threads": loader.io_threads(),
            "cpu_allowance": stoker::cpu::allowance(),
            "pool_bytes": loader.pool().total_bytes(),
            "pool_slots": loader.pool().slots(),
            "skipped": report.skipped.iter().map(|s| serde_json::json!({"path": s.path, "reason": s.reason})).collect::<Vec<_>>(),
            "skipped_count": report.skipped_count,
            "stages": report.stages,
            "starvation": report.starvation,
            "bottleneck": report.bottleneck,
            "device": report.device,
            "transfer": report.transfer,
            "cache": report.cache,
            "consumer_ms": step.as_secs_f64() * 1e3,
            "threads_active": report.tuning.as_ref().map(|t| t.threads_active),
            "tuning": report.tuning,
            "per_epoch": per_epoch,
            "digest": if o.no_digest { serde_json::Value::Null } else { digest.hex().into() },
            "report": o.report.as_ref().map(|p| p.to_string_lossy()),
            "trace": loader.trace_path(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "stoker bench {root}: {samples} images ({classes} classes), preset {}, batch {}, {} decode + {} I/O threads",
            o.preset,
            batch_size,
            loader.threads(),
            loader.io_threads()
        );
        println!(
            "{images} images in {batches} batches, {seconds:.2} s: {ips:.1} images/s, {per1000:.2} CPU-s per 1000 images, peak RSS {:.1} MiB",
            rss as f64 / (1024.0 * 1024.0)
        );
        print!("{}", report.to_text());
        if !o.no_digest {
            println!("digest {}", digest.hex());
        }
        if let Some(p) = &o.report {
            println!("report written to {}", p.display());
        }
    }
    Ok(())
}

/// The report page's settings table: what the run used, beside what was asked.
fn settings_table(f: &series::Facts, o: &BenchOpts, report: &stoker::Report) -> crate::html::Table {
    const MIB: f64 = (1u64 << 20) as f64;
    let pool = f.pool_bytes as f64 / MIB;
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "default".into());
    crate::html::Table {
        title: "Settings".into(),
        header: vec!["setting".into(), "value".into()],
        rows: [
            ("dataset", format!("{} ({} samples, {} classes)", f.root, f.samples, f.classes)),
            ("preset", o.preset.clone()),
            ("batch size", f.batch_size.to_string()),
            ("epochs", f.epochs.to_string()),
            ("threads", format!("{} (asked {})", f.threads, o.threads)),
            ("io threads", f.io_threads.to_string()),
            ("prefetch", o.prefetch.clone()),
            ("memory limit", opt(&o.memory_limit)),
            ("batch buffers", format!("{} x {:.1} MiB", f.pool_slots, pool / f.pool_slots.max(1) as f64)),
            ("device", format!("{} (asked {})", report.device.used, report.device.requested)),
            ("dtype / layout", format!("{} / {}", o.dtype, o.layout)),
            ("shuffle", if o.no_shuffle { "no".into() } else { format!("yes (seed {})", o.seed) }),
            ("cache", opt(&o.cache)),
            ("on error", o.on_error.clone()),
            ("DCT scaling / ROI decode", format!("{} / {}", !o.no_dct_scaling, !o.no_roi)),
        ]
        .into_iter()
        .map(|(k, v)| vec![k.to_string(), v])
        .collect(),
    }
}
