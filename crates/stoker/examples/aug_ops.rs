//! The cost of each augmentation op on a 224x224 crop (issue 50): real photos of
//! `/work/shared/photos` (or `$STOKER_PHOTOS`) decoded by stoker's decoder, their centre square
//! downscaled to 224x224 by box averaging (a photo-like crop, as the resample leaves it), then
//! each op applied to a fresh copy of the crop many times, one thread. Prints, per op, the median
//! microseconds of one application (the copy of the crop excluded), and a digest of the output
//! bytes of every op over all photos and a sweep of magnitudes, so that a faster kernel can be
//! checked for identical bytes against the one it replaces (`digest` mode prints only that).
//!
//! `cargo run --release -p stoker --example aug_ops -- [time|digest|both] [ITERS]`
//! (defaults: both, 400); `STOKER_AUG_ONLY=Erase` times only the ops whose label has that
//! text. Under `valgrind --tool=callgrind`, `time` with a small `ITERS`
//! counts each op's instructions as the inclusive count of `aug_ops::run_op`.

use std::path::{Path, PathBuf};
use std::time::Instant;
use stoker::decode::{DecodeOptions, Decoder};
use stoker::ops::augment::{apply_op, AugOp};
use stoker::ops::erase::{Erase, EraseValue};
use stoker::ops::{color, DType, Layout};
use stoker::rng::Rng;

const SIDE: usize = 224;

/// The centre square of each photo, box-averaged to `SIDE` x `SIDE` RGB8.
fn crops(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut dec = Decoder::new(DecodeOptions::default()).expect("decoder");
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("photos")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("jpg" | "png")))
        .collect();
    names.sort();
    let mut out = vec![];
    for p in names {
        let data = std::fs::read(&p).expect("read");
        let Ok((px, w, h)) = dec.decode_full(&data, &p) else { continue };
        let s = w.min(h);
        let (x0, y0) = ((w - s) / 2, (h - s) / 2);
        let mut crop = vec![0u8; SIDE * SIDE * 3];
        for y in 0..SIDE {
            let (ya, yb) = (y0 + y * s / SIDE, (y0 + (y + 1) * s / SIDE).max(y0 + y * s / SIDE + 1));
            for x in 0..SIDE {
                let (xa, xb) = (x0 + x * s / SIDE, (x0 + (x + 1) * s / SIDE).max(x0 + x * s / SIDE + 1));
                for c in 0..3 {
                    let mut sum = 0u32;
                    for yy in ya..yb {
                        for xx in xa..xb {
                            sum += px[(yy * w + xx) * 3 + c] as u32;
                        }
                    }
                    let n = ((yb - ya) * (xb - xa)) as u32;
                    crop[(y * SIDE + x) * 3 + c] = ((sum + n / 2) / n) as u8;
                }
            }
        }
        out.push((p.file_name().unwrap().to_string_lossy().into_owned(), crop));
    }
    out
}

/// What the bench runs: an auto-augment op with its magnitude, the hue or grayscale kernels, or
/// a RandomErasing box of random values into a float sample.
#[derive(Clone, Copy, Debug)]
enum Work {
    Op(AugOp, f64),
    Hue(f64),
    Grayscale,
    EraseRandom(DType, Layout),
}

impl Work {
    fn label(&self) -> String {
        match self {
            Work::Op(op, m) => format!("{}({m})", op.name()),
            Work::Hue(f) => format!("Hue({f})"),
            Work::Grayscale => "Grayscale".into(),
            Work::EraseRandom(d, l) => format!("EraseRandom({d:?},{l:?})"),
        }
    }
}

/// The erase box of the timing: a third of the image (the mean of timm's 0.02..1/3 is ~0.18).
const BOX: [usize; 4] = [40, 30, 128, 130];

#[inline(never)]
fn run_op(work: Work, img: &mut [u8], sample: &mut [u8], scratch: &mut Vec<u8>, rng: &mut Rng) {
    match work {
        Work::Op(op, m) => apply_op(op, m, img, SIDE, SIDE, [124, 116, 104], scratch),
        Work::Hue(f) => color::hue(img, f),
        Work::Grayscale => color::grayscale(img),
        Work::EraseRandom(dtype, layout) => {
            let e =
                Erase { p: 1.0, scale: [0.02, 0.33], ratio: [0.3, 3.3], value: EraseValue::Random, normalize: None };
            e.apply(BOX, sample, SIDE, SIDE, dtype, layout, rng)
        }
    }
}

fn timing_set() -> Vec<Work> {
    use AugOp::*;
    vec![
        Work::Op(Sharpness, 0.6),
        Work::Op(Color, 0.6),
        Work::Op(Contrast, 0.6),
        Work::Op(Brightness, 0.6),
        Work::Op(Rotate, 30.0),
        Work::Op(ShearX, 0.3),
        Work::Op(ShearY, 0.3),
        Work::Op(TranslateX, 20.0),
        Work::Op(TranslateY, 20.0),
        Work::Op(AutoContrast, 0.0),
        Work::Op(Equalize, 0.0),
        Work::Op(Solarize, 0.5),
        Work::Op(SolarizeAdd, 60.0),
        Work::Op(Posterize, 4.0),
        Work::Op(Invert, 0.0),
        Work::Grayscale,
        Work::Hue(0.1),
        Work::EraseRandom(DType::Float32, Layout::NCHW),
        Work::EraseRandom(DType::Float16, Layout::NCHW),
        Work::EraseRandom(DType::Float32, Layout::NHWC),
    ]
}

/// Every op at a sweep of magnitudes (both signs, the extremes of each space), for the digest.
fn digest_set() -> Vec<Work> {
    use AugOp::*;
    let mut v = vec![];
    let factors = [-0.99, -0.9, -0.6, -0.31, -0.1, -0.033, 0.0, 0.033, 0.1, 0.25, 0.5, 0.66, 0.9, 0.99, 1.3, 2.7];
    for op in [Sharpness, Color, Contrast, Brightness] {
        v.extend(factors.iter().map(|&m| Work::Op(op, m)));
    }
    for m in [-135.0, -90.0, -45.5, -30.0, -4.5, -0.7, 0.0, 0.3, 1.0, 13.5, 30.0, 90.0, 117.0, 135.0, 180.0, 270.0] {
        v.push(Work::Op(Rotate, m));
    }
    for m in [-0.99, -0.5, -0.3, -0.1, -0.0330, 0.0, 0.01, 0.1, 0.3, 0.6601, 0.99] {
        v.push(Work::Op(ShearX, m));
        v.push(Work::Op(ShearY, m));
    }
    for m in [-101.8, -32.0, -15.999999, -3.0, -0.5, 0.0, 1.0, 7.2, 18.133333, 32.0, 101.8] {
        v.push(Work::Op(TranslateX, m));
        v.push(Work::Op(TranslateY, m));
    }
    for m in [0.0, 0.001, 0.03, 0.1, 0.3333, 0.5, 0.5019608, 0.75, 0.99, 1.0] {
        v.push(Work::Op(Solarize, m));
    }
    for m in 0..=8 {
        v.push(Work::Op(Posterize, m as f64));
    }
    for m in [0.0, 10.0, 60.0, 110.0] {
        v.push(Work::Op(SolarizeAdd, m));
    }
    v.extend([Work::Op(AutoContrast, 0.0), Work::Op(Equalize, 0.0), Work::Op(Invert, 0.0), Work::Grayscale]);
    for f in [-0.5, -0.1, 0.0, 0.05, 0.3, 0.5] {
        v.push(Work::Hue(f));
    }
    for d in [DType::Float32, DType::Float16] {
        for l in [Layout::NCHW, Layout::NHWC] {
            v.push(Work::EraseRandom(d, l));
        }
    }
    v
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("both");
    let iters: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(400);
    let dir = std::env::var("STOKER_PHOTOS").unwrap_or_else(|_| "/work/shared/photos".into());
    let crops = crops(Path::new(&dir));
    assert!(!crops.is_empty(), "no photos in {dir}");
    let mut scratch = vec![];
    let mut sample = vec![0u8; SIDE * SIDE * 3 * 4];
    let mut img = vec![0u8; SIDE * SIDE * 3];
    if mode != "digest" {
        println!("{} crops of {SIDE}x{SIDE} ({}), {iters} iterations each; median us per op", crops.len(), dir);
        let only = std::env::var("STOKER_AUG_ONLY").unwrap_or_default();
        for work in timing_set().into_iter().filter(|w| w.label().contains(&only)) {
            let mut per: Vec<f64> = vec![];
            for (_, crop) in &crops {
                for k in 0..iters {
                    img.copy_from_slice(crop);
                    let mut rng = Rng::new(7, 7, k as u64);
                    let t0 = Instant::now();
                    run_op(work, &mut img, &mut sample, &mut scratch, &mut rng);
                    per.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            }
            per.sort_by(f64::total_cmp);
            println!("{:<34} {:>8.1}", work.label(), per[per.len() / 2]);
        }
    }
    if mode != "time" {
        let mut all = xxhash_rust::xxh3::Xxh3::new();
        for work in digest_set() {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for (_, crop) in &crops {
                for k in 0..3u64 {
                    img.copy_from_slice(crop);
                    sample.fill(0);
                    let mut rng = Rng::new(11, 3, k);
                    run_op(work, &mut img, &mut sample, &mut scratch, &mut rng);
                    h.update(&img);
                    h.update(&sample);
                }
            }
            let d = h.digest();
            all.update(&d.to_le_bytes());
            println!("digest {:<34} {d:016x}", work.label());
        }
        println!("digest ALL {:016x}", all.digest());
    }
}
