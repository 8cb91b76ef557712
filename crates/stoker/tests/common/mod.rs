//! Test data made by the tests themselves: JPEGs/PNGs derived from the embedded photos.
#![allow(dead_code)]

pub mod http;

use std::path::Path;
use stoker::decode::{DecodeOptions, Decoder};

/// RGB8 pixels of an embedded photo, `(pixels, width, height)`.
pub fn photo(name: &str) -> (Vec<u8>, usize, usize) {
    let (_, bytes) = stoker::demo::PHOTOS.iter().find(|(n, _)| *n == name).expect("photo exists");
    Decoder::new(DecodeOptions::default()).unwrap().decode_full(bytes, Path::new(name)).unwrap()
}

/// Upscales/crops `photo` to `w` x `h` with the engine's resampler (a smooth, photo-like image).
pub fn photo_sized(name: &str, w: usize, h: usize) -> Vec<u8> {
    let (px, pw, ph) = photo(name);
    let mut rs = stoker::ops::Resampler::new();
    rs.resample(stoker::ops::Filter::BILINEAR, &px, pw, ph, [0.0, 0.0, pw as f64, ph as f64], true, [0, 0, w, h], w, h)
        .unwrap()
        .to_vec()
}

/// Encodes RGB8 as a baseline 4:2:0 JPEG.
pub fn jpeg(px: &[u8], w: usize, h: usize, quality: i32) -> Vec<u8> {
    encode_jpeg(px, w, h, quality, false)
}

/// A small progressive (SOF2) 4:2:0 JPEG at quality 90.
pub fn progressive_jpeg(px: &[u8], w: usize, h: usize) -> Vec<u8> {
    encode_jpeg(px, w, h, 90, true)
}

fn encode_jpeg(px: &[u8], w: usize, h: usize, quality: i32, progressive: bool) -> Vec<u8> {
    let mut c = turbojpeg::Compressor::new().unwrap();
    c.set_quality(quality).unwrap();
    c.set_subsamp(turbojpeg::Subsamp::Sub2x2).unwrap();
    if progressive {
        c.set_progressive(true).unwrap();
    }
    c.compress_to_vec(turbojpeg::Image {
        pixels: px,
        width: w,
        pitch: w * 3,
        height: h,
        format: turbojpeg::PixelFormat::RGB,
    })
    .unwrap()
}

/// Inserts an EXIF APP1 segment with `orientation` right after the SOI marker.
pub fn with_exif(jpeg: &[u8], orientation: u16) -> Vec<u8> {
    let mut tiff = b"II".to_vec();
    tiff.extend_from_slice(&42u16.to_le_bytes());
    tiff.extend_from_slice(&8u32.to_le_bytes());
    tiff.extend_from_slice(&1u16.to_le_bytes());
    tiff.extend_from_slice(&0x0112u16.to_le_bytes());
    tiff.extend_from_slice(&3u16.to_le_bytes());
    tiff.extend_from_slice(&1u32.to_le_bytes());
    tiff.extend_from_slice(&orientation.to_le_bytes());
    tiff.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    let mut seg = b"Exif\0\0".to_vec();
    seg.extend_from_slice(&tiff);
    let mut out = jpeg[..2].to_vec();
    out.extend_from_slice(&[0xFF, 0xE1]);
    out.extend_from_slice(&((seg.len() + 2) as u16).to_be_bytes());
    out.extend_from_slice(&seg);
    out.extend_from_slice(&jpeg[2..]);
    out
}

/// libjpeg-turbo's own full decode (through the `turbojpeg` crate's safe API).
pub fn reference_decode(data: &[u8]) -> (Vec<u8>, usize, usize) {
    let img = turbojpeg::decompress(data, turbojpeg::PixelFormat::RGB).unwrap();
    (img.pixels, img.width, img.height)
}

/// Writes a small ImageFolder of JPEGs (the demo generator) and returns its root.
pub fn demo_folder(dir: &Path, images: usize) -> std::path::PathBuf {
    let root = dir.join("data");
    stoker::demo::make_demo(&root, images, 7, 2).unwrap();
    std::fs::remove_file(root.join("LICENSE.md")).unwrap();
    root
}

/// A shuffled loader config: batches of `bs`, the transform `preset`, `threads` threads.
pub fn shuffled(bs: usize, preset: &str, threads: usize) -> stoker::LoaderConfig {
    let mut c = stoker::LoaderConfig::new(bs, stoker::TransformSpec::preset(preset).unwrap());
    c.sampler.shuffle = true;
    c.threads = Some(threads);
    c
}

/// An image loader over the ImageFolder `root`.
pub fn folder_loader(root: &Path, c: stoker::LoaderConfig) -> stoker::Loader {
    stoker::Loader::new(std::sync::Arc::new(stoker::ImageFolder::new(root).unwrap()), c).unwrap()
}

/// Mean absolute difference of two equal-length byte buffers.
pub fn mean_abs(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (*x as i32 - *y as i32).unsigned_abs() as f64).sum::<f64>() / a.len() as f64
}

/// stoker's own threads in this process (named `stoker-*`; Linux). Counting only those keeps
/// the shutdown tests independent of the test harness's threads and of when other threads
/// (the demo generator's) finish exiting.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|n| n.starts_with("stoker-")))
        .count()
}

/// [`thread_count`] once it has dropped to `want` or `within` has passed. A joined thread can
/// stay listed in `/proc/self/task` for a moment after `pthread_join` returns (the kernel
/// clears the joined-on thread id before it reaps the task), so a count right after a join
/// can be one too high on a loaded machine.
pub fn thread_count_settled(want: usize, within: std::time::Duration) -> usize {
    let end = std::time::Instant::now() + within;
    loop {
        let n = thread_count();
        if n <= want || std::time::Instant::now() >= end {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A tuner's spec with `threads_max` auto-tuned threads on as many cores and a fixed prefetch
/// of 2, over epochs of `epoch_batches` batches.
pub fn auto_threads(threads_max: usize, epoch_batches: usize) -> stoker::tune::TuneSpec {
    stoker::tune::TuneSpec {
        auto_threads: true,
        threads_max,
        auto_prefetch: false,
        prefetch_max: 2,
        prefetch: 2,
        cpu_budget: threads_max as f64,
        epoch_batches,
    }
}
