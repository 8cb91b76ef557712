//! `stoker pack`: an ImageFolder to WebDataset tar shards with sidecar indexes, or shards to
//! new shards (re-packing, e.g. with [`PackOptions::random_access`]; see [`PackInput`]).
//!
//! Deterministic: the same input gives the same bytes (dataset order, or a seeded random order
//! with [`PackOptions::shuffle`]; fixed tar metadata, re-encoding at a fixed quality). `max_side` re-encodes images whose longer side exceeds it
//! (after EXIF orientation) as JPEG, the trick that cuts decode cost for every later epoch.
//!
//! Safe to interrupt: a shard is streamed to a temporary file (`.NAME.stoker-partial`), synced,
//! and renamed into place after its index, so a folder never holds a shard without its index
//! or a half-written shard under a shard's name; on an error (a full disk, ...) the temporary
//! file is removed and the error names the shard. Member names of any length and any UTF-8 are
//! written (pax `path` records where ustar has no room). A destination that already holds the
//! output of a run (`*.tar`, `*.tar.idx`, `classes.json`) is refused unless
//! [`PackOptions::overwrite`], which removes those files, and only those, first.

use crate::error::{Error, Result};
use crate::image::decode::{sniff, DecodeOptions, Decoder, Format};
use crate::image::ops::Resampler;
use crate::observe::report::Skipped;
use crate::source::shards::{encode_index, index_path, partial_path, write_atomic, IndexEntry, Label};
use crate::source::{tar, ImageFolder, ShardSource, Source};
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
    /// Remove the `*.tar`, `*.tar.idx` and `classes.json` files already in the destination
    /// (the output of an earlier run) instead of refusing to pack there.
    pub overwrite: bool,
    /// Re-code baseline JPEGs losslessly with optimised Huffman tables and restart markers
    /// ([`crate::image::decode::restart`]): the same pixels, intervals a decoder can decode alone.
    pub random_access: bool,
    /// Write the samples in a random order drawn from this seed instead of the dataset's (an
    /// ImageFolder's order is sorted by class): every shard, and every part of one, is then a
    /// random sample of the dataset, which a shard-window shuffle (the default order over
    /// object storage) needs to mix classes in a batch.
    pub shuffle: Option<u64>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            shard_size: 256 << 20,
            max_side: None,
            quality: 90,
            threads: 1,
            prefix: "shard".into(),
            overwrite: false,
            random_access: false,
            shuffle: None,
        }
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
    /// Files of an earlier run removed first (with [`PackOptions::overwrite`]).
    pub removed: Vec<PathBuf>,
    /// With [`PackOptions::random_access`]: what the re-coding did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub random_access: Option<RandomAccessSummary>,
}

/// What `--random-access` did to the JPEGs.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RandomAccessSummary {
    /// JPEGs re-coded with restart markers.
    pub recoded: usize,
    /// Their bytes before.
    pub bytes_before: u64,
    /// Their bytes after (optimised tables and the markers).
    pub bytes_after: u64,
    /// JPEGs stored as they were (progressive, arithmetic-coded, ...).
    pub kept: usize,
    /// Why, for the first few.
    pub kept_reasons: Vec<String>,
    /// How many images got each restart interval (MCUs), for the record.
    pub intervals: std::collections::BTreeMap<u32, usize>,
}

struct Packed {
    ext: &'static str,
    data: Vec<u8>,
    reencoded: bool,
    /// `Some(Ok(interval, bytes before))` re-coded with restart markers, `Some(Err(why))` kept.
    restart: Option<std::result::Result<(u32, u64), String>>,
}

fn prepare(data: Vec<u8>, path: &Path, opts: &PackOptions, dec: &mut Decoder, rs: &mut Resampler) -> Result<Packed> {
    let mut p = shrink(data, path, opts, dec, rs)?;
    if opts.random_access && p.ext == "jpg" {
        let max = DecodeOptions::default().max_pixels;
        p.restart = Some(match crate::image::decode::restart::add_restart_markers(&p.data, max) {
            Ok(r) => {
                let before = p.data.len() as u64;
                p.data = r.data;
                Ok((r.interval_mcus, before))
            }
            Err(why) => Err(format!("{}: {why}", path.display())),
        });
    }
    Ok(p)
}

/// The image as stored: as it is, or re-encoded smaller with `max_side`.
fn shrink(data: Vec<u8>, path: &Path, opts: &PackOptions, dec: &mut Decoder, rs: &mut Resampler) -> Result<Packed> {
    let ext = match sniff(&data) {
        Format::Jpeg => "jpg",
        Format::Png => "png",
        Format::Unsupported(name) => return Err(Error::decode(path, format!("unsupported image format {name}"))),
        Format::Unknown if data.is_empty() => return Err(Error::decode(path, "empty file (0 bytes)")),
        Format::Unknown => return Err(Error::decode(path, "not an image")),
    };
    let Some(max) = opts.max_side else { return Ok(Packed { ext, data, reencoded: false, restart: None }) };
    let info = dec.info(&data, path)?;
    if info.width.max(info.height) <= max {
        return Ok(Packed { ext, data, reencoded: false, restart: None });
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
    let out = rs.resample(crate::image::ops::Filter::BILINEAR, &px, rw, rh, rbox, true, [0, 0, ow, oh], ow, oh)?;
    let jerr = |e: turbojpeg::Error| Error::Internal(format!("JPEG encode: {e}"));
    let mut c = turbojpeg::Compressor::new().map_err(jerr)?;
    c.set_quality(opts.quality).map_err(jerr)?;
    c.set_subsamp(turbojpeg::Subsamp::Sub2x2).map_err(jerr)?;
    let img =
        turbojpeg::Image { pixels: out, width: ow, pitch: ow * 3, height: oh, format: turbojpeg::PixelFormat::RGB };
    let data = c.compress_to_vec(img).map_err(jerr)?;
    Ok(Packed { ext: "jpg", data, reencoded: true, restart: None })
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

/// A temporary file, removed when dropped unless it was renamed into place.
struct Partial(Option<PathBuf>);

impl Drop for Partial {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The shard being written: its final name and the temporary file it is streamed to.
struct OpenShard {
    path: PathBuf,
    tmp: Partial,
    tar: tar::Writer<std::io::BufWriter<std::fs::File>>,
}

/// An error writing shard `path` (the partial file is removed when the writer is dropped).
fn write_error(path: &Path, e: &std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), reason: format!("cannot write the shard: {e} (nothing of it was kept)") }
}

struct ShardWriter<'a> {
    dst: &'a Path,
    prefix: &'a str,
    open: Option<OpenShard>,
    entries: Vec<IndexEntry>,
    summary: PackSummary,
}

impl ShardWriter<'_> {
    /// Bytes in the shard being written.
    fn position(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.tar.position())
    }

    /// Appends one sample (image + `.cls`), starting a shard if none is open.
    fn append(&mut self, key: String, member: String, cls_name: &str, data: &[u8], label: i64) -> Result<()> {
        if self.open.is_none() {
            let path = self.dst.join(format!("{}-{:06}.tar", self.prefix, self.summary.shards.len()));
            let tmp = partial_path(&path);
            let file = std::fs::File::create(&tmp).map_err(|e| write_error(&path, &e))?;
            let tar = tar::Writer::new(std::io::BufWriter::with_capacity(1 << 20, file));
            self.open = Some(OpenShard { path, tmp: Partial(Some(tmp)), tar });
        }
        let o = self.open.as_mut().expect("a shard is open");
        let m = o.tar.append(&member, data).map_err(|e| write_error(&o.path, &e))?;
        o.tar.append(cls_name, label.to_string().as_bytes()).map_err(|e| write_error(&o.path, &e))?;
        self.entries.push(IndexEntry {
            key,
            member,
            offset: m.offset,
            length: m.size,
            label: Label::Index(label),
            fingerprint: m.fingerprint,
            texts: vec![],
        });
        Ok(())
    }

    /// Finishes the open shard: end marker, sync, index (written and renamed first), then the
    /// shard renamed into place.
    fn flush(&mut self) -> Result<()> {
        let Some(mut o) = self.open.take() else { return Ok(()) };
        let path = o.path.clone();
        let err = |e: std::io::Error| write_error(&path, &e);
        let size = o.tar.position() + 2 * tar::BLOCK as u64;
        let file = o.tar.finish().map_err(err)?.into_inner().map_err(|e| err(e.into_error()))?;
        file.sync_all().map_err(err)?;
        drop(file);
        write_atomic(&index_path(&path), &encode_index(&self.entries, size))?;
        let tmp = o.tmp.0.take().expect("the partial file is ours");
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(index_path(&path));
            return Err(err(e));
        }
        self.summary.bytes += size;
        self.summary.shards.push(path);
        self.entries.clear();
        Ok(())
    }
}

/// The files of an earlier run in `dst` (`*.tar`, `*.tar.idx`, `classes.json`; not folders),
/// sorted; none when `dst` does not exist.
fn earlier_output(dst: &Path) -> Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dst) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io(dst, &e)),
    };
    let mut out = vec![];
    for entry in rd {
        let entry = entry.map_err(|e| Error::io(dst, &e))?;
        if entry.file_type().map_err(|e| Error::io(entry.path(), &e))?.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tar") || name.ends_with(".tar.idx") || name == "classes.json" {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// What [`pack`] reads: an ImageFolder, or shards to re-pack (their samples, keys and labels
/// are kept, in the same order).
pub trait PackInput: Source {
    /// The class names, in label order.
    fn class_names(&self) -> &[std::ffi::OsString];
    /// Sample `i`'s name in the dataset (a relative path, or a tar member name), from which
    /// its key in the shards is made (the name without its extension).
    fn name(&self, i: usize) -> &str;
}

impl PackInput for ImageFolder {
    fn class_names(&self) -> &[std::ffi::OsString] {
        ImageFolder::class_names(self)
    }

    fn name(&self, i: usize) -> &str {
        self.relative_path(i)
    }
}

impl PackInput for ShardSource {
    fn class_names(&self) -> &[std::ffi::OsString] {
        self.classes()
    }

    fn name(&self, i: usize) -> &str {
        self.member(i)
    }
}

/// Packs `src` into shards under `dst` (created if missing); `progress` is told how many
/// source files are done.
pub fn pack(
    src: &dyn PackInput,
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
    if opts.prefix.is_empty() || opts.prefix.contains('/') || opts.prefix.starts_with('.') {
        return Err(Error::config(
            "prefix",
            format!("must be a file name that does not start with '.', got {:?}", opts.prefix),
        ));
    }
    let earlier = earlier_output(dst)?;
    if !earlier.is_empty() && !opts.overwrite {
        let names: Vec<String> =
            earlier.iter().take(3).map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
        let more = if earlier.len() > 3 { format!(" and {} more", earlier.len() - 3) } else { String::new() };
        return Err(Error::config(
            "overwrite",
            format!(
                "not set, and {} already holds the output of another run ({}{more}); pass it to remove those files first (only *.tar, *.tar.idx and classes.json are removed), or choose another folder",
                dst.display(),
                names.join(", ")
            ),
        ));
    }
    for p in &earlier {
        std::fs::remove_file(p).map_err(|e| Error::io(p, &e))?;
    }
    std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, &e))?;
    // Exactly as named: a folder name that is not UTF-8 survives (Python's `\udcXX` escapes).
    let classes = crate::source::classes_to_json(PackInput::class_names(src));
    write_atomic(&dst.join("classes.json"), classes.as_bytes())?;
    let mut w = ShardWriter {
        dst,
        prefix: &opts.prefix,
        open: None,
        entries: vec![],
        summary: PackSummary {
            samples: 0,
            shards: vec![],
            bytes: 0,
            reencoded: 0,
            skipped: vec![],
            removed: earlier,
            random_access: opts.random_access.then(RandomAccessSummary::default),
        },
    };
    let mut used_keys = std::collections::HashSet::new();
    let n = src.len();
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(seed) = opts.shuffle {
        crate::shell::rng::shuffle(&mut order, &mut crate::shell::rng::Rng::new(seed, 0, 0));
    }
    let order = &order;
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
                        let i = order[start + t * per + k];
                        let path = src.describe(i);
                        let mut data = vec![];
                        *r = Some(
                            src.read(i, &mut data, crate::image::pipeline::DEFAULT_MAX_FILE_BYTES)
                                .and_then(|_| prepare(data, &path, opts, &mut dec, &mut rs)),
                        );
                    }
                });
            }
        });
        for (k, r) in results.into_iter().enumerate() {
            let i = order[start + k];
            match r.expect("every sample was prepared") {
                Err(e) => w.summary.skipped.push(Skipped {
                    index: i as u32,
                    path: src.describe(i).display().to_string(),
                    reason: e.reason(),
                }),
                Ok(p) => {
                    let mut key = key_of(src.name(i));
                    if !used_keys.insert(key.clone()) {
                        let mut n = 1;
                        while !used_keys.insert(format!("{key}_{n}")) {
                            n += 1;
                        }
                        key = format!("{key}_{n}");
                    }
                    let member = format!("{key}.{}", p.ext);
                    let cls_name = format!("{key}.cls");
                    let label = src.label(i);
                    let need = tar::member_len(&member, p.data.len() as u64)
                        + tar::member_len(&cls_name, label.to_string().len() as u64)
                        + 2 * tar::BLOCK as u64;
                    if !w.entries.is_empty() && w.position() + need > opts.shard_size {
                        w.flush()?;
                    }
                    w.append(key, member, &cls_name, &p.data, label)?;
                    w.summary.samples += 1;
                    w.summary.reencoded += p.reencoded as usize;
                    if let (Some(ra), Some(r)) = (w.summary.random_access.as_mut(), &p.restart) {
                        match r {
                            Ok((interval, before)) => {
                                ra.recoded += 1;
                                ra.bytes_before += before;
                                ra.bytes_after += p.data.len() as u64;
                                *ra.intervals.entry(*interval).or_default() += 1;
                            }
                            Err(why) => {
                                ra.kept += 1;
                                if ra.kept_reasons.len() < 20 {
                                    ra.kept_reasons.push(why.clone());
                                }
                            }
                        }
                    }
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
