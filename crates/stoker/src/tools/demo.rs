//! The embedded demo dataset: public-domain photographs (see `assets/photos/LICENSE.md`) from
//! which an ImageFolder of ImageNet-like JPEGs is derived deterministically (random crops,
//! flips, brightness, sizes and JPEG qualities), one class per photo.

use crate::error::{Error, Result};
use crate::image::decode::{DecodeOptions, Decoder};
use crate::image::ops::Resampler;
use crate::shell::rng::Rng;
use std::path::{Path, PathBuf};

/// The embedded photos: `(class name, encoded bytes)`.
pub const PHOTOS: &[(&str, &[u8])] = &[
    ("astronaut", include_bytes!("../../assets/photos/astronaut.png")),
    ("camera", include_bytes!("../../assets/photos/camera.png")),
    ("chelsea", include_bytes!("../../assets/photos/chelsea.png")),
    ("coffee", include_bytes!("../../assets/photos/coffee.png")),
    ("hubble", include_bytes!("../../assets/photos/hubble_deep_field.jpg")),
    ("retina", include_bytes!("../../assets/photos/retina.jpg")),
    ("rocket", include_bytes!("../../assets/photos/rocket.jpg")),
];

/// The photos' license terms.
pub const PHOTOS_LICENSE: &str = include_str!("../../assets/photos/LICENSE.md");

/// ImageNet-like `(width, height)` sizes the demo images take.
const SIZES: &[(usize, usize)] = &[
    (500, 375),
    (375, 500),
    (500, 333),
    (333, 500),
    (500, 400),
    (640, 480),
    (480, 640),
    (500, 500),
    (800, 600),
    (400, 300),
];

/// What [`make_demo`] wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoSummary {
    /// The dataset root.
    pub root: PathBuf,
    /// Images written.
    pub images: usize,
    /// Classes (one per photo).
    pub classes: usize,
    /// Total bytes of the JPEGs.
    pub bytes: u64,
}

/// Writes `images` JPEGs under `root/CLASS/` (deterministic for a given `seed`), using `threads`
/// threads. The photo named `camera` (grayscale) yields grayscale JPEGs.
pub fn make_demo(root: &Path, images: usize, seed: u64, threads: usize) -> Result<DemoSummary> {
    let mut sources = vec![];
    let mut dec = Decoder::new(DecodeOptions::default())?;
    for (name, bytes) in PHOTOS {
        let (px, w, h) = dec.decode_full(bytes, Path::new(name))?;
        sources.push((name.to_string(), px, w, h));
        std::fs::create_dir_all(root.join(name)).map_err(|e| Error::io(root.join(name), &e))?;
    }
    std::fs::write(root.join("LICENSE.md"), PHOTOS_LICENSE).map_err(|e| Error::io(root.join("LICENSE.md"), &e))?;
    let threads = threads.clamp(1, 16);
    let total = std::sync::atomic::AtomicU64::new(0);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut rs = Resampler::new();
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= images {
                        break;
                    }
                    match make_one(root, &sources, k, seed, &mut rs) {
                        Ok(n) => {
                            total.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => errors.lock().expect("lock").push(e),
                    }
                }
            });
        }
    });
    if let Some(e) = errors.into_inner().expect("lock").into_iter().next() {
        return Err(e);
    }
    Ok(DemoSummary { root: root.to_path_buf(), images, classes: PHOTOS.len(), bytes: total.into_inner() })
}

fn make_one(
    root: &Path,
    sources: &[(String, Vec<u8>, usize, usize)],
    k: usize,
    seed: u64,
    rs: &mut Resampler,
) -> Result<u64> {
    let (name, px, w, h) = &sources[k % sources.len()];
    let mut rng = Rng::new(seed, 99, k as u64);
    let (ow, oh) = SIZES[rng.below(SIZES.len() as u64) as usize];
    // A random crop with the output's aspect ratio covering 35-100% of the photo's short side.
    let aspect = ow as f64 / oh as f64;
    let frac = rng.uniform(0.35, 1.0);
    let mut cw = (*w as f64 * frac).min(*h as f64 * frac * aspect);
    let mut ch = cw / aspect;
    if ch > *h as f64 {
        ch = *h as f64;
        cw = ch * aspect;
    }
    let x = rng.uniform(0.0, *w as f64 - cw);
    let y = rng.uniform(0.0, *h as f64 - ch);
    let img =
        rs.resample(crate::image::ops::Filter::BILINEAR, px, *w, *h, [x, y, cw, ch], true, [0, 0, ow, oh], ow, oh)?;
    let mut out = img.to_vec();
    let flip = rng.next_f64() < 0.5;
    let gain = rng.uniform(0.8, 1.2);
    for row in out.chunks_exact_mut(ow * 3) {
        if flip {
            for xx in 0..ow / 2 {
                for c in 0..3 {
                    row.swap(xx * 3 + c, (ow - 1 - xx) * 3 + c);
                }
            }
        }
        for v in row.iter_mut() {
            *v = (*v as f64 * gain).round().clamp(0.0, 255.0) as u8;
        }
    }
    let quality = 75 + rng.below(21) as i32;
    let gray = name == "camera";
    let jerr = |e: turbojpeg::Error| Error::Internal(format!("JPEG encode: {e}"));
    let mut c = turbojpeg::Compressor::new().map_err(jerr)?;
    c.set_quality(quality).map_err(jerr)?;
    let jpeg = if gray {
        let g: Vec<u8> = out.chunks_exact(3).map(|p| p[0]).collect();
        c.set_subsamp(turbojpeg::Subsamp::Gray).map_err(jerr)?;
        c.compress_to_vec(turbojpeg::Image {
            pixels: &g[..],
            width: ow,
            pitch: ow,
            height: oh,
            format: turbojpeg::PixelFormat::GRAY,
        })
    } else {
        c.set_subsamp(turbojpeg::Subsamp::Sub2x2).map_err(jerr)?;
        c.compress_to_vec(turbojpeg::Image {
            pixels: &out[..],
            width: ow,
            pitch: ow * 3,
            height: oh,
            format: turbojpeg::PixelFormat::RGB,
        })
    }
    .map_err(jerr)?;
    let path = root.join(name).join(format!("{name}_{k:06}.jpg"));
    std::fs::write(&path, &jpeg).map_err(|e| Error::io(&path, &e))?;
    Ok(jpeg.len() as u64)
}
