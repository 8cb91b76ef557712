//! `stoker demo`: build ImageNet-like JPEGs from the embedded photos and bench them.

use crate::bench::bench;
use crate::loader_opts::BenchOpts;
use crate::util::tempdir;
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `stoker demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Where to write the dataset (default: a temporary folder, removed afterwards).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Number of JPEGs to derive.
    #[arg(long, default_value = "350")]
    pub images: String,
    /// Only build the dataset (needs --out).
    #[arg(long)]
    pub no_bench: bool,
    #[command(flatten)]
    pub opts: BenchOpts,
}

/// Runs `stoker demo`.
pub fn run(a: &DemoArgs) -> Result<()> {
    let images = stoker::args::positive("images", &stoker::args::text_value(&a.images))?;
    if a.no_bench && a.out.is_none() {
        bail!("--no-bench needs --out DIR (a temporary dataset would be deleted at once)");
    }
    let tmp;
    let root = match &a.out {
        Some(p) => p.clone(),
        None => {
            tmp = tempdir()?;
            tmp.0.clone()
        }
    };
    let t0 = Instant::now();
    let threads = stoker::cpu::allowance().effective;
    let s = stoker::demo::make_demo(&root, images, 0, threads)?;
    if !a.opts.json {
        println!(
            "demo dataset: {} JPEGs in {} classes ({:.1} MiB) at {} in {:.1} s",
            s.images,
            s.classes,
            s.bytes as f64 / (1024.0 * 1024.0),
            root.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    if a.no_bench {
        return Ok(());
    }
    let mut o = a.opts.clone();
    // A small demo would otherwise be one or two batches: use at least eight.
    let batch_size = stoker::args::positive("batch_size", &stoker::args::text_value(&o.batch_size))?;
    if batch_size * 8 > images {
        o.batch_size = (images / 8).max(1).to_string();
    }
    bench(&root.to_string_lossy(), &o)
}
