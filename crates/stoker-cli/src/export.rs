//! `stoker export`: write transformed samples to `.npy` files, in dataset order (for
//! comparisons against other loaders).

use anyhow::{Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use stoker::{DType, Loader};

/// Flags of `stoker export`.
#[derive(Args)]
pub struct ExportArgs {
    /// The dataset (as for `bench`: an ImageFolder root, a pack folder, shards or a URL).
    pub root: String,
    /// Output .npy for the images; labels go to the same name with `_labels.npy`.
    #[arg(long)]
    pub out: PathBuf,
    /// Transform preset: imagenet-train or imagenet-val.
    #[arg(long, default_value = "imagenet-val")]
    pub preset: String,
    /// Output dtype: uint8, float16 or float32.
    #[arg(long, default_value = "uint8")]
    pub dtype: String,
    /// Output layout: nhwc or nchw.
    #[arg(long, default_value = "nhwc")]
    pub layout: String,
    /// Export at most this many samples (dataset order).
    #[arg(long)]
    pub limit: Option<String>,
    /// Ignore EXIF orientation (as torchvision's PIL loader does).
    #[arg(long)]
    pub no_exif: bool,
    /// Seed (for random presets).
    #[arg(long, default_value = "0")]
    pub seed: String,
    /// Disable DCT-scaled JPEG decoding (exact full-resolution decode).
    #[arg(long)]
    pub no_dct_scaling: bool,
    /// Disable region-of-interest JPEG decoding.
    #[arg(long)]
    pub no_roi: bool,
}

fn write_npy(path: &Path, descr: &str, shape: &[usize], data: &[u8]) -> Result<()> {
    let mut out = stoker::source::npy::npy_header(descr, shape);
    out.extend_from_slice(data);
    std::fs::write(path, out).with_context(|| format!("cannot write {}", path.display()))
}

/// Runs `stoker export`.
pub fn run(a: &ExportArgs) -> Result<()> {
    let flag = |b: bool| Some(b.to_string());
    let c = stoker::args::loader_config(stoker::args::from_text([
        ("preset", Some(a.preset.clone())),
        ("dtype", Some(a.dtype.clone())),
        ("layout", Some(a.layout.clone())),
        ("apply_exif", flag(!a.no_exif)),
        ("batch_size", Some("64".to_string())),
        ("seed", Some(a.seed.clone())),
        ("rank", Some("0".to_string())),
        ("world_size", Some("1".to_string())),
        ("on_error", Some("raise".to_string())),
        ("dct_scaling", flag(!a.no_dct_scaling)),
        ("roi", flag(!a.no_roi)),
    ]))?;
    let limit = match &a.limit {
        Some(l) => stoker::args::positive("limit", &stoker::args::text_value(l))?,
        None => usize::MAX,
    };
    let dtype = c.transform.dtype;
    let source = stoker::source::open(std::slice::from_ref(&a.root))?.source;
    let loader = Loader::new(source, c)?;
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
    write_npy(&a.out, descr, &[n, shape[0], shape[1], shape[2]], &data)?;
    let lpath = a.out.with_file_name(format!(
        "{}_labels.npy",
        a.out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    write_npy(&lpath, "<i8", &[n], &labels)?;
    eprintln!("wrote {n} samples to {} and {}", a.out.display(), lpath.display());
    Ok(())
}
