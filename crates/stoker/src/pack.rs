//! `stoker pack`: an ImageFolder to WebDataset tar shards with sidecar indexes.
//!
//! Deterministic: the same input gives the same bytes (dataset order, fixed tar metadata,
//! re-encoding at a fixed quality). `max_side` re-encodes images whose longer side exceeds it
//! (after EXIF orientation) as JPEG, the trick that cuts decode cost for every later epoch.

use crate::decode::{sniff, DecodeOptions, Decoder, Format};
use crate::error::{Error, Result};
use crate::ops::Resampler;
use crate::source::shards::{encode_index, index_path, IndexEntry};
use crate::source::{tar, ImageFolder, Source};
use crate::telemetry::Skipped;
use std::path::{Path, PathBuf};

/// How to pack.
#[derive(Debug, Clone)]
pub struct PackOptions {
    /// Target shard size in bytes (a shard holds at least one sample).
    pub shard_size: u64,
    /// Re-encode images whose longer side is larger than this.
    pub max_side: Option<usize>,
    /// JPEG quality of re-encoded images.
    pub quality: i32,
    /// Worker threads.
    pub threads: usize,
    /// Shard file name prefix (`PREFIX-000000.tar`).
    pub prefix: String,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions { shard_size: 256 << 20, max_side: None, quality: 90, threads: 1, prefix: "shard".into() }
    }
}

/// What was written.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PackSummary {
    /// Samples written.
    pub samples: usize,
    /// Shard files written.
    pub shards: Vec<PathBuf>,
    /// Bytes of all shards.
    pub bytes: u64,
    /// Images re-encoded because of `max_side`.
    pub reencoded: usize,
    /// Files left out, with the reason.
    pub skipped: Vec<Skipped>,
}

struct Packed {
    ext: &'static str,
    data: Vec<u8>,
    reencoded: bool,
}

fn prepare(data: Vec<u8>, path: &Path, opts: &PackOptions, dec: &mut Decoder, rs: &mut Resampler) -> Result<Packed> {
    let ext = match sniff(&data) {
        Format::Jpeg => "jpg",
        Format::Png => "png",
        Format::Unsupported(name) => return Err(Error::decode(path, format!("unsupported image format {name}"))),
        Format::Unknown if data.is_empty() => return Err(Error::decode(path, "empty file (0 bytes)")),
        Format::Unknown => return Err(Error::decode(path, "not an image")),
    };
    let Some(max) = opts.max_side else { return Ok(Packed { ext, data, reencoded: false }) };
    let info = dec.info(&data, path)?;
    if info.width.max(info.height) <= max {
        return Ok(Packed { ext, data, reencoded: false });
    }
    let (w, h) = (info.width, info.height);
    let (ow, oh) = if w >= h {
        (max, ((h as f64 * max as f64 / w as f64).round() as usize).max(1))
    } else {
        (((w as f64 * max as f64 / h as f64).round() as usize).max(1), max)
    };
    let full = [0.0, 0.0, w as f64, h as f64];
    let region = dec.decode(&data, path, &info, full, (ow, oh))?;
    let (rw, rh, rbox) = (region.width, region.height, region.bbox);
    let px = region.pixels.to_vec();
    let out = rs.resample(&px, rw, rh, rbox, true, [0, 0, ow, oh], ow, oh)?;
    let jerr = |e: turbojpeg::Error| Error::Internal(format!("JPEG encode: {e}"));
    let mut c = turbojpeg::Compressor::new().map_err(jerr)?;
    c.set_quality(opts.quality).map_err(jerr)?;
    c.set_subsamp(turbojpeg::Subsamp::Sub2x2).map_err(jerr)?;
    let img =
        turbojpeg::Image { pixels: out, width: ow, pitch: ow * 3, height: oh, format: turbojpeg::PixelFormat::RGB };
    let data = c.compress_to_vec(img).map_err(jerr)?;
    Ok(Packed { ext: "jpg", data, reencoded: true })
}

/// The WebDataset key of a relative path: the path without its extension, with dots in the
/// file name replaced (a key ends at the first dot of the base name).
fn key_of(rel: &str) -> String {
    let stem = match rel.rfind('.') {
        Some(d) if d > rel.rfind('/').map(|s| s + 1).unwrap_or(0) => &rel[..d],
        _ => rel,
    };
    let (dir, base) = match stem.rfind('/') {
        Some(s) => (&stem[..=s], &stem[s + 1..]),
        None => ("", stem),
    };
    format!("{dir}{}", base.replace('.', "_"))
}

struct ShardWriter<'a> {
    dst: &'a Path,
    prefix: &'a str,
    tar: Vec<u8>,
    entries: Vec<IndexEntry>,
    summary: PackSummary,
}

impl ShardWriter<'_> {
    fn flush(&mut self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        tar::finish(&mut self.tar);
        let path = self.dst.join(format!("{}-{:06}.tar", self.prefix, self.summary.shards.len()));
        std::fs::write(&path, &self.tar).map_err(|e| Error::io(&path, &e))?;
        let idx = index_path(&path);
        std::fs::write(&idx, encode_index(&self.entries, self.tar.len() as u64)).map_err(|e| Error::io(&idx, &e))?;
        self.summary.bytes += self.tar.len() as u64;
        self.summary.shards.push(path);
        self.tar.clear();
        self.entries.clear();
        Ok(())
    }
}

/// Packs `src` into shards under `dst` (created if missing); `progress` is told how many
/// source files are done.
pub fn pack(
    src: &ImageFolder,
    dst: &Path,
    opts: &PackOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<PackSummary> {
    if opts.shard_size < 4096 {
        return Err(Error::config("shard_size", "must be at least 4096 bytes"));
    }
    if !(1..=100).contains(&opts.quality) {
        return Err(Error::config("quality", format!("must be in 1..=100, got {}", opts.quality)));
    }
    if opts.max_side == Some(0) {
        return Err(Error::config("max_side", "must be positive"));
    }
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, &e))?;
    let classes = serde_json::to_string(src.classes()).map_err(|e| Error::Internal(e.to_string()))?;
    std::fs::write(dst.join("classes.json"), classes).map_err(|e| Error::io(dst.join("classes.json"), &e))?;
    let mut w = ShardWriter {
        dst,
        prefix: &opts.prefix,
        tar: vec![],
        entries: vec![],
        summary: PackSummary { samples: 0, shards: vec![], bytes: 0, reencoded: 0, skipped: vec![] },
    };
    let mut used_keys = std::collections::HashSet::new();
    let n = src.len();
    let threads = opts.threads.max(1);
    let chunk = threads * 8;
    for start in (0..n).step_by(chunk) {
        let end = (start + chunk).min(n);
        // Prepare a chunk in parallel, then append it in dataset order.
        let mut results: Vec<Option<Result<Packed>>> = (start..end).map(|_| None).collect();
        std::thread::scope(|s| {
            let per = (end - start).div_ceil(threads);
            for (t, part) in results.chunks_mut(per).enumerate() {
                s.spawn(move || {
                    let mut dec = match Decoder::new(DecodeOptions::default()) {
                        Ok(d) => d,
                        Err(e) => {
                            let msg = e.to_string();
                            for r in part.iter_mut() {
                                *r = Some(Err(Error::Internal(msg.clone())));
                            }
                            return;
                        }
                    };
                    let mut rs = Resampler::new();
                    for (k, r) in part.iter_mut().enumerate() {
                        let i = start + t * per + k;
                        let path = src.describe(i);
                        let mut data = vec![];
                        *r = Some(
                            src.read(i, &mut data, crate::pipeline::DEFAULT_MAX_FILE_BYTES)
                                .and_then(|_| prepare(data, &path, opts, &mut dec, &mut rs)),
                        );
                    }
                });
            }
        });
        for (k, r) in results.into_iter().enumerate() {
            let i = start + k;
            match r.expect("every sample was prepared") {
                Err(e) => w.summary.skipped.push(Skipped {
                    index: i as u32,
                    path: src.describe(i).display().to_string(),
                    reason: e.reason(),
                }),
                Ok(p) => {
                    let mut key = key_of(src.relative_path(i));
                    if !used_keys.insert(key.clone()) {
                        let mut n = 1;
                        while !used_keys.insert(format!("{key}_{n}")) {
                            n += 1;
                        }
                        key = format!("{key}_{n}");
                    }
                    let member = format!("{key}.{}", p.ext);
                    let label = src.label(i);
                    let cls = label.to_string();
                    let need = (p.data.len() + cls.len()) as u64 + 4 * tar::BLOCK as u64;
                    if !w.entries.is_empty() && w.tar.len() as u64 + need > opts.shard_size {
                        w.flush()?;
                    }
                    let offset = w.tar.len() as u64 + tar::BLOCK as u64;
                    tar::append_member(&mut w.tar, &member, &p.data).map_err(|e| Error::decode(src.describe(i), e))?;
                    tar::append_member(&mut w.tar, &format!("{key}.cls"), cls.as_bytes())
                        .map_err(|e| Error::decode(src.describe(i), e))?;
                    w.entries.push(IndexEntry { key, member, offset, length: p.data.len() as u64, label });
                    w.summary.samples += 1;
                    w.summary.reencoded += p.reencoded as usize;
                }
            }
        }
        progress(end);
    }
    w.flush()?;
    Ok(w.summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(key_of("dog/a.jpg"), "dog/a");
        assert_eq!(key_of("dog/a.b.jpg"), "dog/a_b");
        assert_eq!(key_of("d.o.g/a.JPEG"), "d.o.g/a");
    }
}
