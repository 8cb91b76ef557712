//! `stoker pack`: convert an ImageFolder into WebDataset tar shards with sidecar indexes and a
//! `classes.json` (a folder that every loader accepts as a dataset), or re-pack shards (for
//! example with `--random-access`). The destination is a folder or a prefix in object storage
//! (`s3://BUCKET/PREFIX`, `gs://...`, `az://...`). One that already holds shards is refused
//! unless `--overwrite`, which removes them (and nothing else) first; the folder (or prefix)
//! being re-packed is never a destination.

use crate::util::progress;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;
use stoker::ImageFolder;

/// Flags of `stoker pack`.
#[derive(Args)]
pub struct PackArgs {
    /// ImageFolder root, or shards to re-pack (a pack folder, shard paths or a glob).
    pub src: PathBuf,
    /// Output folder for the shards (SHARD.tar + SHARD.tar.idx + classes.json), or a prefix in
    /// object storage (s3://BUCKET/PREFIX, gs://..., az://...; credentials and endpoint from
    /// the usual environment variables), where each file is uploaded whole.
    pub dst: PathBuf,
    /// Target shard size, e.g. 256MiB.
    #[arg(long, default_value = "256MiB")]
    pub shard_size: String,
    /// Re-encode images whose longer side exceeds N pixels (as JPEG).
    #[arg(long)]
    pub max_side: Option<String>,
    /// JPEG quality of re-encoded images.
    #[arg(long, default_value = "90")]
    pub quality: String,
    /// Worker threads: a number, or auto.
    #[arg(long, default_value = "auto")]
    pub threads: String,
    /// Shard file name prefix.
    #[arg(long, default_value = "shard")]
    pub prefix: String,
    /// Remove the *.tar, *.tar.idx and classes.json already in DST (an earlier run) first,
    /// instead of refusing; nothing else in DST is touched.
    #[arg(long)]
    pub overwrite: bool,
    /// Re-code baseline JPEGs losslessly (the same pixels) with optimised Huffman tables and
    /// restart markers (about one per MCU), so that the intervals a crop touches can be
    /// decoded alone; progressive and other JPEGs are stored as they are.
    #[arg(long)]
    pub random_access: bool,
    /// Write the samples in a random order (seeded by --seed) instead of the dataset's (an
    /// ImageFolder is sorted by class): each shard then holds a random sample of the dataset,
    /// as a shard-window shuffle (the default order over object storage) needs.
    #[arg(long)]
    pub shuffle: bool,
    /// The seed of --shuffle.
    #[arg(long, default_value = "0")]
    pub seed: String,
    /// Print one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Pack on a Ray cluster instead (`auto`, `local`, HOST:PORT or ray://HOST:PORT): one task
    /// per group of files, the same bytes (runs `python -m stoker.ray`; needs `stoker[ray]`).
    #[arg(long, value_name = "ADDRESS")]
    pub ray: Option<String>,
    /// With --ray: input files per task.
    #[arg(long, default_value = "256", requires = "ray")]
    pub files_per_task: String,
}

/// Runs `stoker pack`.
pub fn run(a: &PackArgs) -> Result<()> {
    // The environment, checked, and its settings applied (the object-store request bound for
    // shards in a bucket): no loader config is built here to do it.
    stoker::args::apply_env()?;
    let args = stoker::args::from_text([
        ("shard_size", Some(a.shard_size.clone())),
        ("max_side", a.max_side.clone()),
        ("quality", Some(a.quality.clone())),
        ("threads", Some(a.threads.clone())),
        ("prefix", Some(a.prefix.clone())),
        ("overwrite", Some(a.overwrite.to_string())),
        ("random_access", Some(a.random_access.to_string())),
        ("shuffle", Some(a.shuffle.to_string())),
        ("seed", Some(a.seed.clone())),
    ]);
    let opts = stoker::args::pack_options(args)?;
    // A path that is not UTF-8 is a folder (a URL is text).
    let dst = match a.dst.to_str() {
        Some(text) => stoker::args::pack_destination("dst", &serde_json::Value::String(text.to_string()))?,
        None => stoker::pack::Destination::Folder(a.dst.clone()),
    };
    if let Some(address) = &a.ray {
        // The checked values, typed (one core per Ray task: no thread count).
        let values = serde_json::json!({
            "shard_size": opts.shard_size,
            "max_side": opts.max_side,
            "quality": opts.quality,
            "prefix": opts.prefix,
            "overwrite": opts.overwrite,
            "random_access": opts.random_access,
            "shuffle": opts.shuffle.is_some(),
            "seed": opts.shuffle.unwrap_or(0),
            "files_per_task": stoker::args::positive("files_per_task", &stoker::args::text_value(&a.files_per_task))?,
        });
        return crate::ray::run("pack", address, &[a.src.clone(), a.dst.clone()], values, a.json);
    }
    let roots = [a.src.to_string_lossy().into_owned()];
    let input: Box<dyn stoker::pack::PackInput> = match stoker::source::detect(&roots)? {
        stoker::source::DatasetKind::Folder(root) => Box::new(ImageFolder::new(root)?),
        stoker::source::DatasetKind::Shards(specs) => {
            refuse_own_folder(&specs, &dst)?;
            Box::new(stoker::source::open_shards(&specs)?)
        }
        stoker::source::DatasetKind::Mixture(_) => {
            return Err(stoker::Error::config("src", "a mixture is packed one source at a time").into())
        }
    };
    let n = input.len();
    let bar = progress(n as u64, a.json, "{spinner} packing [{bar:30}] {pos}/{len} files ({eta})");
    let t0 = Instant::now();
    let where_to = dst.describe();
    let s = stoker::pack::pack(input.as_ref(), dst, &opts, &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        if !s.removed.is_empty() {
            println!("removed {} file(s) of an earlier run from {where_to}", s.removed.len());
        }
        println!(
            "packed {} samples into {} shard(s), {:.1} MiB, in {:.1} s ({} re-encoded); index beside each shard",
            s.samples,
            s.shards.len(),
            s.bytes as f64 / (1024.0 * 1024.0),
            t0.elapsed().as_secs_f64(),
            s.reencoded
        );
        if let Some(ra) = &s.random_access {
            println!(
                "random access: {} JPEG(s) re-coded with restart markers, {:.1} MiB -> {:.1} MiB ({:+.1}%); {} kept as they were",
                ra.recoded,
                ra.bytes_before as f64 / (1024.0 * 1024.0),
                ra.bytes_after as f64 / (1024.0 * 1024.0),
                (ra.bytes_after as f64 / ra.bytes_before.max(1) as f64 - 1.0) * 100.0,
                ra.kept
            );
            for why in &ra.kept_reasons {
                println!("  kept: {why}");
            }
        }
        for k in &s.skipped {
            println!("skipped {}: {}", k.path, k.reason);
        }
    }
    Ok(())
}

/// Refuses a destination that is the folder (or object-store prefix) of a shard being
/// re-packed (`--overwrite` would remove the input before reading it).
fn refuse_own_folder(specs: &[String], dst: &stoker::pack::Destination) -> Result<()> {
    let dst = match dst {
        stoker::pack::Destination::Folder(p) => p,
        remote => {
            let prefix = remote.describe();
            for spec in specs.iter().filter(|s| stoker::pack::is_url(s)) {
                let spec = spec.trim_end_matches('/');
                if spec == prefix || spec.rsplit_once('/').is_some_and(|(dir, _)| dir.trim_end_matches('/') == prefix) {
                    anyhow::bail!("{prefix}: the shards being re-packed are under this prefix; pack into another one");
                }
            }
            return Ok(());
        }
    };
    let Ok(dst) = std::fs::canonicalize(dst) else { return Ok(()) }; // not there yet: not a source
    for spec in specs {
        let dir = std::path::Path::new(spec).parent().filter(|p| !p.as_os_str().is_empty());
        let dir = std::fs::canonicalize(dir.unwrap_or(std::path::Path::new(".")));
        if dir.is_ok_and(|d| d == dst) {
            anyhow::bail!("{}: the shards being re-packed are in this folder; pack into another one", dst.display());
        }
    }
    Ok(())
}
