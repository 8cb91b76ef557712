//! `stoker`: bench a dataset, build and bench the embedded demo, export transformed samples.
//!
//! The command line lives in this library so that the Python package's `stoker` entry point
//! runs the very same code ([`run_from`]); `main.rs` is a two-line wrapper.
//!
//! Flags are parsed (clap) into plain structs, then validated into a [`stoker::LoaderConfig`];
//! errors name the flag and what is allowed. Long runs show a progress bar on a terminal and end
//! with a human summary; `--json` prints one machine-readable object instead.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use stoker::{DType, ErrorPolicy, ImageFolder, Layout, Loader, LoaderConfig, TransformSpec};

#[derive(Parser)]
#[command(name = "stoker", version, about = "Keeps GPUs fed: image files to batches on a thread pool, measured.")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load a dataset as fast as possible and report throughput, CPU, memory and the bottleneck.
    Bench {
        /// ImageFolder root (ROOT/CLASS/IMAGE), or indexed tar shards: a .tar file or a glob
        /// such as 'shards/train-*.tar' (quote it).
        root: PathBuf,
        #[command(flatten)]
        opts: BenchOpts,
    },
    /// Build a demo ImageFolder from the embedded photos and bench it.
    Demo {
        /// Where to write the dataset (default: a temporary folder, removed afterwards).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Number of JPEGs to derive.
        #[arg(long, default_value_t = 350)]
        images: usize,
        /// Only build the dataset (needs --out).
        #[arg(long)]
        no_bench: bool,
        #[command(flatten)]
        opts: BenchOpts,
    },
    /// Convert an ImageFolder into WebDataset tar shards with sidecar indexes.
    Pack {
        /// ImageFolder root.
        src: PathBuf,
        /// Output folder for the shards (SHARD.tar + SHARD.tar.idx + classes.json).
        dst: PathBuf,
        /// Target shard size, e.g. 256MiB.
        #[arg(long, default_value = "256MiB")]
        shard_size: String,
        /// Re-encode images whose longer side exceeds N pixels (as JPEG).
        #[arg(long)]
        max_side: Option<usize>,
        /// JPEG quality of re-encoded images.
        #[arg(long, default_value_t = 90)]
        quality: i32,
        /// Worker threads: a number, or auto.
        #[arg(long, default_value = "auto")]
        threads: String,
        /// Shard file name prefix.
        #[arg(long, default_value = "shard")]
        prefix: String,
        /// Print one JSON object instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Check this machine: CPU allowance, memory, /dev/shm, libjpeg-turbo, SIMD, GPUs (NVML),
    /// with recommendations. Works without a GPU.
    Doctor {
        /// Print one JSON object instead of the report.
        #[arg(long)]
        json: bool,
        /// Skip the host-to-device bandwidth measurement (256 MiB copies per GPU).
        #[arg(long)]
        no_bandwidth: bool,
    },
    /// Write the sidecar index of existing WebDataset tar shards.
    Index {
        /// Shard files.
        #[arg(required = true)]
        shards: Vec<PathBuf>,
    },
    /// Write transformed samples to .npy files (for comparisons against other loaders).
    Export {
        /// ImageFolder root.
        root: PathBuf,
        /// Output .npy for the images; labels go to the same name with `_labels.npy`.
        #[arg(long)]
        out: PathBuf,
        /// Transform preset: imagenet-train or imagenet-val.
        #[arg(long, default_value = "imagenet-val")]
        preset: String,
        /// Output dtype: uint8, float16 or float32.
        #[arg(long, default_value = "uint8")]
        dtype: String,
        /// Output layout: nhwc or nchw.
        #[arg(long, default_value = "nhwc")]
        layout: String,
        /// Export at most this many samples (dataset order).
        #[arg(long)]
        limit: Option<usize>,
        /// Ignore EXIF orientation (as torchvision's PIL loader does).
        #[arg(long)]
        no_exif: bool,
        /// Seed (for random presets).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Disable DCT-scaled JPEG decoding (exact full-resolution decode).
        #[arg(long)]
        no_dct_scaling: bool,
        /// Disable region-of-interest JPEG decoding.
        #[arg(long)]
        no_roi: bool,
    },
}

#[derive(Args, Clone)]
struct BenchOpts {
    /// Transform preset: imagenet-train or imagenet-val.
    #[arg(long, default_value = "imagenet-train")]
    preset: String,
    /// Samples per batch.
    #[arg(long, default_value_t = 256)]
    batch_size: usize,
    /// Decode threads: a number, or auto (the process's CPU allowance).
    #[arg(long, default_value = "auto")]
    threads: String,
    /// I/O threads (reads run apart from decode).
    #[arg(long)]
    io_threads: Option<usize>,
    /// Passes over the dataset.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Seed of the shuffle and augmentations.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Cap on batch-buffer memory, e.g. 2GiB, 512MB or 1000000.
    #[arg(long)]
    memory_limit: Option<String>,
    /// Finished batches queued ahead of the consumer.
    #[arg(long, default_value_t = 2)]
    prefetch: usize,
    /// Bad-sample policy: skip or raise.
    #[arg(long, default_value = "skip")]
    on_error: String,
    /// Deliver batches to: cpu, cuda, cuda:N or auto (GPU batches go through pinned buffers and
    /// stoker's copy stream; the digest then reads them back from the GPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Output dtype: float32, float16 or uint8 (uint8 drops Normalize).
    #[arg(long, default_value = "float32")]
    dtype: String,
    /// Output layout: nchw or nhwc.
    #[arg(long, default_value = "nchw")]
    layout: String,
    /// Keep dataset order instead of shuffling.
    #[arg(long)]
    no_shuffle: bool,
    /// Shard-aware shuffling over windows of N shards (shard sources only): permute the shards,
    /// shuffle samples within each window.
    #[arg(long)]
    shard_window: Option<usize>,
    /// Keep the last incomplete batch.
    #[arg(long)]
    keep_last: bool,
    /// Disable DCT-scaled JPEG decoding (to measure what it saves).
    #[arg(long)]
    no_dct_scaling: bool,
    /// Disable region-of-interest JPEG decoding (to measure what it saves).
    #[arg(long)]
    no_roi: bool,
    /// Ignore EXIF orientation.
    #[arg(long)]
    no_exif: bool,
    /// Instead of loading: decode every file once at full size on one thread (the pure
    /// libjpeg-turbo rate that stoker's per-thread rate is compared with).
    #[arg(long)]
    decode_only: bool,
    /// Skip hashing the batches (the digest costs the consumer ~0.1 CPU-s per 1000 float32
    /// images); `digest` is then null. For throughput comparisons with loaders that hash nothing.
    #[arg(long)]
    no_digest: bool,
    /// Print one JSON object instead of the human summary.
    #[arg(long)]
    json: bool,
}

/// Parses `2GiB`, `512MB`, `1.5G`, `1000000` into bytes.
fn parse_bytes(s: &str) -> Result<u64> {
    parse_bytes_for("--memory-limit", s)
}

fn threads_arg(t: &str) -> Result<Option<usize>> {
    match t {
        "auto" => Ok(None),
        t => match t.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => bail!("--threads: expected a positive number or auto, got {t:?}"),
        },
    }
}

/// An ImageFolder for a directory; indexed shards for a .tar file, a glob or a URL
/// (`s3://`, `gs://`, `az://`, `http(s)://`).
fn open_source(root: &Path) -> Result<(Arc<dyn stoker::Source>, usize)> {
    let text = root.to_string_lossy().into_owned();
    let name = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let shard_like = text.contains("://") || name.contains(['*', '?']) || name.ends_with(".tar");
    if root.is_dir() || !shard_like {
        let f = ImageFolder::new(root)?;
        let classes = f.classes().len();
        return Ok((Arc::new(f), classes));
    }
    let s = stoker::ShardSource::open_any(&[text])?;
    let classes = s.classes().len();
    Ok((Arc::new(s), classes))
}

fn parse_bytes_for(flag: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().with_context(|| format!("{flag}: cannot read a number in {s:?}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => {
            bail!("--memory-limit: unknown unit {u:?}; use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB")
        }
    };
    if n <= 0.0 {
        bail!("--memory-limit: must be positive, got {s:?}");
    }
    Ok((n * mult) as u64)
}

fn loader_config(o: &BenchOpts) -> Result<LoaderConfig> {
    let dtype = DType::parse(&o.dtype).map_err(|e| anyhow::anyhow!("--dtype: {e}"))?;
    let mut transform =
        TransformSpec::preset(&o.preset).map_err(|e| anyhow::anyhow!("--preset: {e}"))?.with_dtype(dtype);
    transform.layout = Layout::parse(&o.layout).map_err(|e| anyhow::anyhow!("--layout: {e}"))?;
    transform.apply_exif = !o.no_exif;
    let mut c = LoaderConfig::new(o.batch_size, transform);
    if o.batch_size == 0 {
        bail!("--batch-size: must be at least 1");
    }
    c.sampler.shuffle = !o.no_shuffle;
    if o.shard_window == Some(0) {
        bail!("--shard-window: must be at least 1");
    }
    c.sampler.shard_window = o.shard_window;
    c.sampler.seed = o.seed;
    c.sampler.drop_last = !o.keep_last;
    c.threads = threads_arg(&o.threads)?;
    if o.io_threads == Some(0) {
        bail!("--io-threads: must be at least 1");
    }
    c.io_threads = o.io_threads;
    if o.prefetch == 0 {
        bail!("--prefetch: must be at least 1");
    }
    c.prefetch = o.prefetch;
    c.memory_limit = o.memory_limit.as_deref().map(parse_bytes).transpose()?;
    c.on_error = ErrorPolicy::parse(&o.on_error).map_err(|e| anyhow::anyhow!("--on-error: {e}"))?;
    c.dct_scaling = !o.no_dct_scaling;
    c.roi = !o.no_roi;
    if o.epochs == 0 {
        bail!("--epochs: must be at least 1");
    }
    Ok(c)
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we pass; RUSAGE_SELF is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn peak_rss_bytes() -> u64 {
    // SAFETY: as in `cpu_seconds`.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    ru.ru_maxrss as u64 * 1024
}

/// One thread, every file read into memory then decoded whole at full size; only the decode
/// is timed.
fn decode_only(root: &Path, json: bool) -> Result<()> {
    use stoker::decode::{DecodeOptions, Decoder};
    use stoker::Source;
    let folder = ImageFolder::new(root)?;
    let mut dec = Decoder::new(DecodeOptions { apply_exif: false, dct_scaling: false, roi: false })?;
    let mut buf = Vec::new();
    let (mut n, mut failed, mut pixels) = (0usize, 0usize, 0u64);
    let mut busy = std::time::Duration::ZERO;
    let cpu0 = cpu_seconds();
    for i in 0..folder.len() {
        folder.read(i, &mut buf)?;
        let t = Instant::now();
        let ok = dec.info(&buf, Path::new("")).and_then(|info| {
            let bbox = [0.0, 0.0, info.width as f64, info.height as f64];
            dec.decode(&buf, Path::new(""), &info, bbox, (info.width, info.height)).map(|r| (r.width * r.height) as u64)
        });
        busy += t.elapsed();
        match ok {
            Ok(px) => {
                n += 1;
                pixels += px;
            }
            Err(_) => failed += 1,
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let secs = busy.as_secs_f64();
    let out = serde_json::json!({
        "images": n,
        "failed": failed,
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
    }
    Ok(())
}

fn bench(root: &Path, o: &BenchOpts) -> Result<()> {
    if o.decode_only {
        return decode_only(root, o.json);
    }
    let config = loader_config(o)?;
    let (source, classes) = open_source(root)?;
    let samples = source.len();
    let (placement, device_report) = stoker_cuda::place(&o.device, 0)?;
    let (prefetch, limit) = (config.prefetch, config.memory_limit);
    let loader = Loader::new_in(source, config, placement.allocator().as_ref())?;
    let stage = placement.stage(stoker_cuda::image_regions(&loader), prefetch, limit)?;
    loader.telemetry().set_device(device_report);
    let total_batches = loader.len() as u64 * o.epochs;
    let bar = if o.json { ProgressBar::hidden() } else { ProgressBar::new(total_batches) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} epoch {msg} [{bar:30}] {pos}/{len} batches {per_sec} ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut digest = stoker::Digest::new();
    let (mut images, mut batches) = (0usize, 0usize);
    for epoch in 0..o.epochs {
        loader.set_epoch(epoch);
        bar.set_message(format!("{}/{}", epoch + 1, o.epochs));
        match &stage {
            None => {
                for b in loader.iter()? {
                    let b = b?;
                    if !o.no_digest {
                        digest.update(&b);
                    }
                    images += b.len();
                    batches += 1;
                    bar.inc(1);
                }
            }
            Some(stage) => {
                let mut host = loader.iter()?.forwarding();
                let (mut data, mut labels) = (vec![], vec![]);
                for b in stage.run(move |t| host.next_timeout(t), Some(loader.telemetry().clone()))? {
                    let b = b?;
                    if !o.no_digest {
                        b.read_region(0, &mut data)?;
                        b.read_region(1, &mut labels)?;
                        digest.update_bytes(&data, &labels);
                    }
                    images += b.meta().shape[0];
                    batches += 1;
                    bar.inc(1);
                }
            }
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    bar.finish_and_clear();
    let report = loader.report();
    let ips = images as f64 / seconds;
    let per1000 = if images > 0 { cpu / images as f64 * 1000.0 } else { 0.0 };
    let rss = peak_rss_bytes();
    if o.json {
        let out = serde_json::json!({
            "root": root.display().to_string(),
            "preset": o.preset,
            "dataset_samples": samples,
            "classes": classes,
            "images": images,
            "batches": batches,
            "epochs": o.epochs,
            "batch_size": o.batch_size,
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
            "digest": if o.no_digest { serde_json::Value::Null } else { digest.hex().into() },
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "stoker bench {}: {} images ({} classes), preset {}, batch {}, {} decode + {} I/O threads",
            root.display(),
            samples,
            classes,
            o.preset,
            o.batch_size,
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
    }
    Ok(())
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> Result<()> {
    let shape_s = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape_s}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// What `stoker export` writes.
struct ExportOpts<'a> {
    preset: &'a str,
    dtype: &'a str,
    layout: &'a str,
    limit: Option<usize>,
    no_exif: bool,
    seed: u64,
    no_dct_scaling: bool,
    no_roi: bool,
}

fn export(root: &Path, out: &Path, o: ExportOpts<'_>) -> Result<()> {
    let dtype = DType::parse(o.dtype).map_err(|e| anyhow::anyhow!("--dtype: {e}"))?;
    let mut t = TransformSpec::preset(o.preset).map_err(|e| anyhow::anyhow!("--preset: {e}"))?.with_dtype(dtype);
    t.layout = Layout::parse(o.layout).map_err(|e| anyhow::anyhow!("--layout: {e}"))?;
    t.apply_exif = !o.no_exif;
    let limit = o.limit;
    let mut c = LoaderConfig::new(64, t);
    c.sampler.seed = o.seed;
    c.dct_scaling = !o.no_dct_scaling;
    c.roi = !o.no_roi;
    c.on_error = ErrorPolicy::Raise;
    let (source, _) = open_source(root)?;
    let loader = Loader::new(source, c)?;
    let limit = limit.unwrap_or(usize::MAX);
    let (mut data, mut labels, mut n) = (Vec::new(), Vec::new(), 0usize);
    let mut shape = [0usize; 3];
    for b in loader.iter()? {
        let b = b?;
        let take = b.len().min(limit - n);
        let per = b.data().len() / b.len();
        data.extend_from_slice(&b.data()[..take * per]);
        for l in &b.labels()[..take] {
            labels.extend_from_slice(&l.to_le_bytes());
        }
        let s = b.shape();
        shape = [s[1], s[2], s[3]];
        n += take;
        if n >= limit {
            break;
        }
    }
    let descr = match dtype {
        DType::Uint8 => "|u1",
        DType::Float16 => "<f2",
        DType::Float32 => "<f4",
    };
    write_npy(out, descr, &[n, shape[0], shape[1], shape[2]], &data)?;
    let lpath = out.with_file_name(format!(
        "{}_labels.npy",
        out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    write_npy(&lpath, "<i8", &[n], &labels)?;
    eprintln!("wrote {n} samples to {} and {}", out.display(), lpath.display());
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn pack_cmd(
    src: &Path,
    dst: &Path,
    shard_size: &str,
    max_side: Option<usize>,
    quality: i32,
    threads: &str,
    prefix: &str,
    json: bool,
) -> Result<()> {
    let folder = ImageFolder::new(src)?;
    let opts = stoker::pack::PackOptions {
        shard_size: parse_bytes_for("--shard-size", shard_size)?,
        max_side,
        quality,
        threads: threads_arg(threads)?.unwrap_or_else(stoker::cpu::default_threads),
        prefix: prefix.to_string(),
    };
    let n = stoker::Source::len(&folder);
    let bar = if json { ProgressBar::hidden() } else { ProgressBar::new(n as u64) };
    bar.set_style(
        ProgressStyle::with_template("{spinner} packing [{bar:30}] {pos}/{len} files ({eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let t0 = Instant::now();
    let s = stoker::pack::pack(&folder, dst, &opts, &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "packed {} samples into {} shard(s), {:.1} MiB, in {:.1} s ({} re-encoded); index beside each shard",
            s.samples,
            s.shards.len(),
            s.bytes as f64 / (1024.0 * 1024.0),
            t0.elapsed().as_secs_f64(),
            s.reencoded
        );
        for k in &s.skipped {
            println!("skipped {}: {}", k.path, k.reason);
        }
    }
    Ok(())
}

/// `(total, available)` bytes of RAM from /proc/meminfo.
fn meminfo() -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let get = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (get("MemTotal:"), get("MemAvailable:"))
}

/// `(size, free)` bytes of a filesystem.
fn fs_space(path: &str) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: statvfs fills the zeroed struct; `c` is a valid NUL-terminated path.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    Some((st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize))
}

fn doctor(json: bool, bandwidth: bool) -> Result<()> {
    let cpu = stoker::cpu::allowance();
    let threads = stoker::cpu::default_threads();
    let (mem_total, mem_available) = meminfo();
    let cgroup_mem = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok().map(|s| s.trim().to_string());
    let shm = fs_space("/dev/shm");
    #[cfg(target_arch = "x86_64")]
    let simd = serde_json::json!({
        "sse4.1": std::arch::is_x86_feature_detected!("sse4.1"),
        "avx2": std::arch::is_x86_feature_detected!("avx2"),
        "avx512f": std::arch::is_x86_feature_detected!("avx512f"),
    });
    #[cfg(not(target_arch = "x86_64"))]
    let simd = serde_json::json!({});
    let mut gpu = stoker_cuda::probe();
    let mut bandwidth_errors = vec![];
    if bandwidth {
        for d in &mut gpu.devices {
            let measured = stoker_cuda::Gpu::open(d.index)
                .map_err(stoker::Error::from)
                .and_then(|g| stoker_cuda::measure_h2d(&g, 256 << 20, 10));
            match measured {
                Ok(bw) => {
                    d.h2d_pinned_gbps = Some(bw.pinned_gbps);
                    d.h2d_pageable_gbps = Some(bw.pageable_gbps);
                }
                Err(e) => bandwidth_errors.push(format!("GPU {}: bandwidth not measured: {e}", d.index)),
            }
        }
    }
    let mut advice = vec![format!(
        "stoker will use {threads} decode threads (the CPU allowance{}); set STOKER_NUM_THREADS or threads= to change it",
        if std::env::var("STOKER_NUM_THREADS").is_ok() { ", overridden by STOKER_NUM_THREADS" } else { "" }
    )];
    if cpu.effective < cpu.online {
        advice.push(format!(
            "this process may use {} of the machine's {} CPUs (affinity/cgroup quota): size num_workers-style settings by the allowance, not the core count",
            cpu.effective, cpu.online
        ));
    }
    if let Some((size, _)) = shm {
        if size < 1 << 30 {
            advice.push(format!(
                "/dev/shm is only {:.0} MiB: stoker does not need it (threads, no shared memory), but a DataLoader with workers would fail or slow down",
                size as f64 / 1048576.0
            ));
        }
    }
    if let Some(avail) = mem_available {
        advice.push(format!(
            "{:.1} GiB of RAM available: a memory_limit of a quarter of that ({:.1} GiB) leaves room for the training process",
            avail as f64 / 1073741824.0,
            avail as f64 / 4.0 / 1073741824.0
        ));
    }
    if gpu.available() {
        for d in &gpu.devices {
            if let (Some(g), Some(mg)) = (d.pcie_generation, d.pcie_max_generation) {
                if g < mg {
                    advice.push(format!(
                        "GPU {}: PCIe link at gen {g} of {mg} (idle links downshift; check under load)",
                        d.index
                    ));
                }
            }
        }
        for d in &gpu.devices {
            if let (Some(w), Some(mw)) = (d.pcie_width, d.pcie_max_width) {
                if w < mw {
                    advice.push(format!(
                        "GPU {}: PCIe link runs x{w} of x{mw} lanes: host-to-device copies are capped",
                        d.index
                    ));
                }
            }
            if let (Some(p), Some(q)) = (d.h2d_pinned_gbps, d.h2d_pageable_gbps) {
                advice.push(format!(
                    "GPU {}: host-to-device {p:.1} GB/s from pinned memory, {q:.1} GB/s from pageable: \
                     device='cuda' copies from pinned buffers on its own stream; batches cross as uint8 \
                     (224x224x3 = 147 KiB per image, so {:.0}k images/s fit through this link)",
                    d.index,
                    p * 1e9 / 150_528.0 / 1e3
                ));
            }
        }
        advice.extend(bandwidth_errors);
    } else {
        advice.push(format!(
            "no GPU: {}; batches stay in host memory",
            gpu.unavailable_reason.clone().unwrap_or_default()
        ));
    }
    let out = serde_json::json!({
        "stoker": env!("CARGO_PKG_VERSION"),
        "libjpeg_turbo": stoker::decode::jpeg::LIBJPEG_TURBO_VERSION,
        "cpu": cpu,
        "decode_threads": threads,
        "simd": simd,
        "memory": {"total_bytes": mem_total, "available_bytes": mem_available, "cgroup_limit": cgroup_mem},
        "dev_shm": shm.map(|(s, f)| serde_json::json!({"size_bytes": s, "free_bytes": f})),
        "gpus": gpu.devices,
        "gpu": gpu,
        "recommendations": advice,
    });
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let gib = |b: Option<u64>| b.map(|b| format!("{:.1} GiB", b as f64 / 1073741824.0)).unwrap_or_else(|| "?".into());
    println!("stoker {} (libjpeg-turbo {})", env!("CARGO_PKG_VERSION"), stoker::decode::jpeg::LIBJPEG_TURBO_VERSION);
    println!(
        "CPU: {} online, {} in the affinity mask, cgroup quota {}, allowance {}; SIMD: {}",
        cpu.online,
        cpu.affinity,
        cpu.cgroup_quota.map(|q| format!("{q:.2} CPUs")).unwrap_or_else(|| "none".into()),
        cpu.effective,
        simd.as_object()
            .map(|m| m
                .iter()
                .filter(|(_, v)| v.as_bool() == Some(true))
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>()
                .join(" "))
            .unwrap_or_default()
    );
    println!(
        "memory: {} total, {} available, cgroup limit {}",
        gib(mem_total),
        gib(mem_available),
        cgroup_mem.unwrap_or_else(|| "none".into())
    );
    match shm {
        Some((s, f)) => println!("/dev/shm: {} ({} free)", gib(Some(s)), gib(Some(f))),
        None => println!("/dev/shm: not mounted"),
    }
    if gpu.available() {
        println!(
            "GPU driver {} (CUDA {})",
            gpu.nvidia_driver_version.clone().unwrap_or_default(),
            gpu.cuda_driver_version.map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10)).unwrap_or_default()
        );
        for d in &gpu.devices {
            println!(
                "GPU {}: {}, {} ({} free), PCIe gen {} x{} (max gen {} x{}){}",
                d.index,
                d.name,
                gib(Some(d.memory_bytes)),
                gib(Some(d.free_bytes)),
                d.pcie_generation.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                d.pcie_width.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                d.pcie_max_generation.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                d.pcie_max_width.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                match (d.h2d_pinned_gbps, d.h2d_pageable_gbps) {
                    (Some(p), Some(q)) => format!(", host-to-device {p:.1} GB/s pinned, {q:.1} GB/s pageable"),
                    _ => String::new(),
                }
            );
        }
    } else {
        println!("GPU: none ({})", gpu.unavailable_reason.clone().unwrap_or_default());
    }
    println!("recommendations:");
    for a in &advice {
        println!("  - {a}");
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Bench { root, opts } => bench(&root, &opts),
        Cmd::Demo { out, images, no_bench, opts } => {
            if images == 0 {
                bail!("--images: must be at least 1");
            }
            if no_bench && out.is_none() {
                bail!("--no-bench needs --out DIR (a temporary dataset would be deleted at once)");
            }
            let tmp;
            let root = match &out {
                Some(p) => p.clone(),
                None => {
                    tmp = tempdir()?;
                    tmp.0.clone()
                }
            };
            let t0 = Instant::now();
            let threads = stoker::cpu::allowance().effective;
            let s = stoker::demo::make_demo(&root, images, 0, threads)?;
            if !opts.json {
                println!(
                    "demo dataset: {} JPEGs in {} classes ({:.1} MiB) at {} in {:.1} s",
                    s.images,
                    s.classes,
                    s.bytes as f64 / (1024.0 * 1024.0),
                    root.display(),
                    t0.elapsed().as_secs_f64()
                );
            }
            if no_bench {
                return Ok(());
            }
            let mut o = opts.clone();
            // A small demo would otherwise be one or two batches: use at least eight.
            if o.batch_size * 8 > images {
                o.batch_size = (images / 8).max(1);
            }
            bench(&root, &o)
        }
        Cmd::Pack { src, dst, shard_size, max_side, quality, threads, prefix, json } => {
            pack_cmd(&src, &dst, &shard_size, max_side, quality, &threads, &prefix, json)
        }
        Cmd::Doctor { json, no_bandwidth } => doctor(json, !no_bandwidth),
        Cmd::Index { shards } => {
            for shard in shards {
                let n = stoker::source::shards::write_index(&shard)?;
                println!("{}: {n} samples indexed", shard.display());
            }
            Ok(())
        }
        Cmd::Export { root, out, preset, dtype, layout, limit, no_exif, seed, no_dct_scaling, no_roi } => export(
            &root,
            &out,
            ExportOpts {
                preset: &preset,
                dtype: &dtype,
                layout: &layout,
                limit,
                no_exif,
                seed,
                no_dct_scaling,
                no_roi,
            },
        ),
    }
}

/// A temporary directory removed on drop (std only).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Result<TempDir> {
    let base = std::env::temp_dir();
    for k in 0..1000u32 {
        let p = base.join(format!("stoker-demo-{}-{k}", std::process::id()));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(TempDir(p));
        }
    }
    bail!("cannot create a temporary folder in {}", base.display())
}

/// Parses `args` (the first is the program name) and runs the command; returns the process
/// exit code (0 on success, 1 on an error, which is printed as one line on stderr). `--help`
/// and argument errors print and exit the process, as clap does.
pub fn run_from<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 * 1024 * 1024 * 1024);
        assert_eq!(parse_bytes("512MB").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("1000").unwrap(), 1000);
        assert!(parse_bytes("12parsecs").unwrap_err().to_string().contains("unknown unit"));
        assert!(parse_bytes("-5").is_err());
    }
}
