//! `stoker bench`: load a dataset as fast as possible and report throughput, CPU, memory and
//! the bottleneck; `--decode-only` measures libjpeg-turbo alone on one thread.

use crate::loader_opts::BenchOpts;
use crate::series::{self, Recorder};
use crate::util::{cpu_seconds, peak_rss_bytes, progress};
use anyhow::Result;
use clap::Args;

use std::time::Instant;

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
    let mut config = o.loader_config()?;
    let epochs = o.epochs()?;
    let step = o.consumer_step()?;
    // `cuda` means this rank's GPU under torchrun, as in the Python package. Resolved before
    // the dataset is opened, so a bad device fails first.
    let target = stoker_cuda::Target::resolve(&o.device, stoker::args::local_rank()?)?;
    config.decode = stoker::args::decode_where(config.decode, target.on_gpu(), &config)?;
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
                let (mut data, mut labels) = (vec![], vec![]);
                let on_device = stage.forward(loader.iter()?)?;
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
    if loader.tracer().is_some() {
        loader.write_trace(None)?;
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
            "report_cpu": report.cpu,
            "bottleneck": report.bottleneck,
            "device": report.device,
            "transfer": report.transfer,
            "gpu_decode": stage.as_ref().and_then(|s| s.gpu_decode()).map(|g| g.stats()),
            "cache": report.kind.cache,
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
fn settings_table(f: &series::Facts, o: &BenchOpts, report: &stoker::pipeline::ImageReport) -> crate::html::Table {
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
