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
//! file is removed and the error names the shard. The destination may be a prefix in object
//! storage instead ([`Destination`]: `s3://bucket/prefix`, ...): a shard is then streamed to a
//! local temporary folder and uploaded as a whole object after its index, the same bytes.
//! Member names of any length and any UTF-8 are written (pax `path` records where ustar has no
//! room). A destination that already holds the
//! output of a run (`*.tar`, `*.tar.idx`, `classes.json`) is refused unless
//! [`PackOptions::overwrite`], which removes those files, and only those, first.
//!
//! One rule places the samples: [`Planner`] (keys, and where a shard ends). [`pack`] runs it as
//! it goes; a pack made in pieces (`stoker.ray.pack`: [`prepare_group`] on many machines, the
//! planner on one, [`write_shard`] per shard) runs the same planner over the prepared sizes, so
//! both write the same bytes.

use crate::error::{Error, Result};
use crate::image::decode::{sniff, DecodeOptions, Decoder, Format};
use crate::image::ops::Resampler;
use crate::observe::report::Skipped;
use crate::source::shards::{decode_index, encode_index, partial_path, IndexEntry, Label};
use crate::source::{tar, ImageFolder, ShardSource, Source};
use std::path::{Path, PathBuf};

mod destination;

pub use destination::{is_url, Destination};

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
    /// Shard files written (paths, or URLs in object storage).
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

/// One sample as it goes into a shard: its extension and bytes, and what was done to them.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// `jpg` or `png`.
    pub ext: &'static str,
    /// The bytes stored.
    pub data: Vec<u8>,
    /// Re-encoded because of `max_side`.
    pub reencoded: bool,
    /// `Some(Ok(interval, bytes before))` re-coded with restart markers, `Some(Err(why))` kept.
    pub restart: Option<std::result::Result<(u32, u64), String>>,
}

impl RandomAccessSummary {
    /// Counts what `--random-access` did to one sample of `len` bytes as stored.
    pub fn record(&mut self, restart: &Option<std::result::Result<(u32, u64), String>>, len: u64) {
        match restart {
            None => {}
            Some(Ok((interval, before))) => {
                self.recoded += 1;
                self.bytes_before += before;
                self.bytes_after += len;
                *self.intervals.entry(*interval).or_default() += 1;
            }
            Some(Err(why)) => {
                self.kept += 1;
                if self.kept_reasons.len() < 20 {
                    self.kept_reasons.push(why.clone());
                }
            }
        }
    }
}

/// Reads sample `i` of `src` and prepares it as [`pack`] stores it (`max_side`,
/// `random_access`); an error is the reason the sample is skipped.
pub fn prepare_sample(
    src: &dyn PackInput,
    i: usize,
    opts: &PackOptions,
    dec: &mut Decoder,
    rs: &mut Resampler,
) -> Result<Prepared> {
    let path = src.describe(i);
    let mut data = vec![];
    src.read(i, &mut data, crate::image::pipeline::DEFAULT_MAX_FILE_BYTES)?;
    prepare(data, &path, opts, dec, rs)
}

fn prepare(data: Vec<u8>, path: &Path, opts: &PackOptions, dec: &mut Decoder, rs: &mut Resampler) -> Result<Prepared> {
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
fn shrink(data: Vec<u8>, path: &Path, opts: &PackOptions, dec: &mut Decoder, rs: &mut Resampler) -> Result<Prepared> {
    let ext = match sniff(&data) {
        Format::Jpeg => "jpg",
        Format::Png => "png",
        Format::Unsupported(name) => return Err(Error::decode(path, format!("unsupported image format {name}"))),
        Format::Unknown if data.is_empty() => return Err(Error::decode(path, "empty file (0 bytes)")),
        Format::Unknown => return Err(Error::decode(path, "not an image")),
    };
    let Some(max) = opts.max_side else { return Ok(Prepared { ext, data, reencoded: false, restart: None }) };
    let info = dec.info(&data, path)?;
    if info.width.max(info.height) <= max {
        return Ok(Prepared { ext, data, reencoded: false, restart: None });
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
    Ok(Prepared { ext: "jpg", data, reencoded: true, restart: None })
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

/// The shard being written: its number, name in the destination, where that is (for errors)
/// and the temporary file it is streamed to.
struct OpenShard {
    number: usize,
    name: String,
    path: PathBuf,
    tmp: Partial,
    tar: tar::Writer<std::io::BufWriter<std::fs::File>>,
}

/// An error writing shard `path` (the partial file is removed when the writer is dropped).
fn write_error(path: &Path, e: &std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), reason: format!("cannot write the shard: {e} (nothing of it was kept)") }
}

/// The path of shard `number` under `dst`: `PREFIX-000042.tar`.
pub fn shard_path(dst: &Path, prefix: &str, number: usize) -> PathBuf {
    dst.join(shard_name(prefix, number))
}

/// The name of shard `number`: `PREFIX-000042.tar`.
pub fn shard_name(prefix: &str, number: usize) -> String {
    format!("{prefix}-{number:06}.tar")
}

/// The tar member names of a sample: the image (`KEY.EXT`) and its label (`KEY.cls`).
fn member_names(key: &str, ext: &str) -> (String, String) {
    (format!("{key}.{ext}"), format!("{key}.cls"))
}

/// Where a sample goes: its shard and its key (the member names follow from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The shard's number (its name is [`shard_path`]).
    pub shard: usize,
    /// The sample's key in the shards, unique in the pack.
    pub key: String,
}

/// The one rule of a pack's keys and shard boundaries, for [`pack`] and for packs made in
/// pieces (`stoker.ray.pack`): samples are placed in the order written; a key already used
/// gets `_1`, `_2`, ...; a shard is closed before a sample that would take it past
/// [`PackOptions::shard_size`] (end marker included), unless the shard is empty.
#[derive(Debug)]
pub struct Planner {
    shard_size: u64,
    used_keys: std::collections::HashSet<String>,
    shard: usize,
    in_shard: usize,
    position: u64,
}

impl Planner {
    /// A planner for shards of `shard_size` bytes.
    pub fn new(shard_size: u64) -> Self {
        Planner { shard_size, used_keys: Default::default(), shard: 0, in_shard: 0, position: 0 }
    }

    /// Places the next sample: `name` in the dataset ([`PackInput::name`]), its extension as
    /// stored, its size and label.
    pub fn place(&mut self, name: &str, ext: &str, len: u64, label: i64) -> Placement {
        let mut key = key_of(name);
        if !self.used_keys.insert(key.clone()) {
            let mut n = 1;
            while !self.used_keys.insert(format!("{key}_{n}")) {
                n += 1;
            }
            key = format!("{key}_{n}");
        }
        let (member, cls_name) = member_names(&key, ext);
        let members = tar::member_len(&member, len) + tar::member_len(&cls_name, label.to_string().len() as u64);
        if self.in_shard > 0 && self.position + members + 2 * tar::BLOCK as u64 > self.shard_size {
            self.shard += 1;
            self.in_shard = 0;
            self.position = 0;
        }
        self.in_shard += 1;
        self.position += members;
        Placement { shard: self.shard, key }
    }

    /// Bytes of the current shard so far (without its end marker).
    pub fn position(&self) -> u64 {
        self.position
    }
}

struct ShardWriter<'a> {
    dst: &'a Destination,
    prefix: &'a str,
    /// Where shards bound for object storage are streamed to ([`Destination::scratch`]).
    scratch: Option<tempfile::TempDir>,
    open: Option<OpenShard>,
    entries: Vec<IndexEntry>,
    summary: PackSummary,
}

impl<'a> ShardWriter<'a> {
    /// A writer of shards `PREFIX-NNNNNN.tar` into `dst`, its summary empty but for `removed`
    /// (an earlier run's files) and, with `random_access`, its counts.
    fn new(dst: &'a Destination, prefix: &'a str, removed: Vec<PathBuf>, random_access: bool) -> Result<Self> {
        Ok(ShardWriter {
            dst,
            prefix,
            scratch: dst.scratch()?,
            open: None,
            entries: vec![],
            summary: PackSummary {
                samples: 0,
                shards: vec![],
                bytes: 0,
                reencoded: 0,
                skipped: vec![],
                removed,
                random_access: random_access.then(RandomAccessSummary::default),
            },
        })
    }

    /// Bytes in the shard being written.
    fn position(&self) -> u64 {
        self.open.as_ref().map_or(0, |o| o.tar.position())
    }

    /// Appends one sample (image + `.cls`) to shard `shard`, finishing the open shard first
    /// if it is another one.
    fn append(&mut self, shard: usize, key: String, ext: &str, data: &[u8], label: i64) -> Result<()> {
        if self.open.as_ref().is_some_and(|o| o.number != shard) {
            self.flush()?;
        }
        if self.open.is_none() {
            let name = shard_name(self.prefix, shard);
            let path = self.dst.locate(&name);
            let tmp = match &self.scratch {
                Some(dir) => partial_path(&dir.path().join(&name)),
                None => partial_path(&path),
            };
            let file = std::fs::File::create(&tmp).map_err(|e| write_error(&path, &e))?;
            let tar = tar::Writer::new(std::io::BufWriter::with_capacity(1 << 20, file));
            self.open = Some(OpenShard { number: shard, name, path, tmp: Partial(Some(tmp)), tar });
        }
        let (member, cls_name) = member_names(&key, ext);
        let o = self.open.as_mut().expect("a shard is open");
        let m = o.tar.append(&member, data).map_err(|e| write_error(&o.path, &e))?;
        o.tar.append(&cls_name, label.to_string().as_bytes()).map_err(|e| write_error(&o.path, &e))?;
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

    /// Finishes the open shard: end marker, sync, then its index and the shard put in place
    /// ([`Destination::place_shard`]: index first; renamed, or uploaded whole).
    fn flush(&mut self) -> Result<()> {
        let Some(mut o) = self.open.take() else { return Ok(()) };
        let path = o.path.clone();
        let err = |e: std::io::Error| write_error(&path, &e);
        let size = o.tar.position() + 2 * tar::BLOCK as u64;
        let file = o.tar.finish().map_err(err)?.into_inner().map_err(|e| err(e.into_error()))?;
        file.sync_all().map_err(err)?;
        drop(file);
        let tmp = o.tmp.0.as_deref().expect("the partial file is ours");
        self.dst.place_shard(&o.name, &encode_index(&self.entries, size), tmp)?;
        if !self.dst.is_remote() {
            o.tmp.0 = None; // renamed into place: nothing to remove
        }
        self.summary.bytes += size;
        self.summary.shards.push(path);
        self.entries.clear();
        Ok(())
    }
}

/// The files of an earlier run in `dst` (`*.tar`, `*.tar.idx`, `classes.json` directly in it;
/// not folders), sorted, as paths (or URLs); none when `dst` does not exist.
pub fn earlier_output(dst: &Destination) -> Result<Vec<PathBuf>> {
    Ok(earlier_names(dst)?.iter().map(|n| dst.locate(n)).collect())
}

/// The names of [`earlier_output`].
fn earlier_names(dst: &Destination) -> Result<Vec<String>> {
    Ok(dst
        .list()?
        .into_iter()
        .filter(|n| n.ends_with(".tar") || n.ends_with(".tar.idx") || n == "classes.json")
        .collect())
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

/// Checks the options [`pack`] is given (a config made by hand; [`crate::args::pack_options`]
/// makes checked ones).
pub fn check_options(opts: &PackOptions) -> Result<()> {
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
    Ok(())
}

/// Makes `dst` ready for a pack: refuses it when it holds an earlier run's output
/// ([`earlier_output`]) unless `overwrite`, which removes those files (returned); creates it.
pub fn clear_destination(dst: &Destination, overwrite: bool) -> Result<Vec<PathBuf>> {
    let earlier = earlier_names(dst)?;
    if !earlier.is_empty() && !overwrite {
        let more = if earlier.len() > 3 { format!(" and {} more", earlier.len() - 3) } else { String::new() };
        return Err(Error::config(
            "overwrite",
            format!(
                "not set, and {} already holds the output of another run ({}{more}); pass it to remove those files first (only *.tar, *.tar.idx and classes.json are removed), or choose another folder",
                dst.describe(),
                earlier[..earlier.len().min(3)].join(", ")
            ),
        ));
    }
    for name in &earlier {
        dst.remove(name)?;
    }
    dst.create()?;
    Ok(earlier.iter().map(|n| dst.locate(n)).collect())
}

/// Writes `classes.json` (the class names of `src`, in label order) into `dst`, whole or not
/// at all; one that holds these bytes already is left as it is.
pub fn write_classes(src: &dyn PackInput, dst: &Destination) -> Result<()> {
    // Exactly as named: a folder name that is not UTF-8 survives (Python's `\udcXX` escapes).
    let classes = crate::source::classes_to_json(PackInput::class_names(src));
    if dst.read("classes.json")?.is_some_and(|b| b == classes.as_bytes()) {
        return Ok(());
    }
    dst.write("classes.json", classes.as_bytes())
}

/// The order samples are written in: the dataset's, or a seeded random one
/// ([`PackOptions::shuffle`]).
pub fn sample_order(n: usize, opts: &PackOptions) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if let Some(seed) = opts.shuffle {
        crate::shell::rng::shuffle(&mut order, &mut crate::shell::rng::Rng::new(seed, 0, 0));
    }
    order
}

/// Prepares `indices` of `src` on `opts.threads` threads; results in the same order.
fn prepare_all(src: &dyn PackInput, indices: &[usize], opts: &PackOptions) -> Vec<Result<Prepared>> {
    let threads = opts.threads.max(1);
    let mut results: Vec<Option<Result<Prepared>>> = indices.iter().map(|_| None).collect();
    if indices.is_empty() {
        return vec![];
    }
    std::thread::scope(|s| {
        let per = indices.len().div_ceil(threads);
        for (part, ids) in results.chunks_mut(per).zip(indices.chunks(per)) {
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
                for (r, &i) in part.iter_mut().zip(ids) {
                    *r = Some(prepare_sample(src, i, opts, &mut dec, &mut rs));
                }
            });
        }
    });
    results.into_iter().map(|r| r.expect("every sample was prepared")).collect()
}

/// Packs `src` into shards under `dst` (a folder, created if missing, or a prefix in object
/// storage); `progress` is told how many source files are done.
pub fn pack(
    src: &dyn PackInput,
    dst: impl Into<Destination>,
    opts: &PackOptions,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<PackSummary> {
    check_options(opts)?;
    let dst = dst.into();
    let earlier = clear_destination(&dst, opts.overwrite)?;
    write_classes(src, &dst)?;
    let mut w = ShardWriter::new(&dst, &opts.prefix, earlier, opts.random_access)?;
    let mut planner = Planner::new(opts.shard_size);
    let n = src.len();
    let order = sample_order(n, opts);
    let chunk = opts.threads.max(1) * 8;
    for start in (0..n).step_by(chunk) {
        let end = (start + chunk).min(n);
        // Prepare a chunk in parallel, then append it in dataset order.
        for (&i, r) in order[start..end].iter().zip(prepare_all(src, &order[start..end], opts)) {
            match r {
                Err(e) => w.summary.skipped.push(Skipped {
                    index: i as u32,
                    path: src.describe(i).display().to_string(),
                    reason: e.reason(),
                }),
                Ok(p) => {
                    let label = src.label(i);
                    let at = planner.place(src.name(i), p.ext, p.data.len() as u64, label);
                    w.append(at.shard, at.key, p.ext, &p.data, label)?;
                    if w.position() != planner.position() {
                        return Err(Error::Internal(format!(
                            "pack: the planner counts {} bytes in the shard, the writer {}",
                            planner.position(),
                            w.position()
                        )));
                    }
                    w.summary.samples += 1;
                    w.summary.reencoded += p.reencoded as usize;
                    if let Some(ra) = w.summary.random_access.as_mut() {
                        ra.record(&p.restart, p.data.len() as u64);
                    }
                }
            }
        }
        progress(end);
    }
    w.flush()?;
    Ok(w.summary)
}

/// What [`prepare_group`] did with one sample.
#[derive(Debug, Clone)]
pub struct StagedSample {
    /// The dataset index.
    pub index: usize,
    /// Prepared: its extension, where its bytes are in the group's staging file and what was
    /// done to them; or the reason it is skipped (as [`pack`] lists it).
    pub outcome: std::result::Result<Staged, String>,
}

/// A prepared sample's place in a staging file.
#[derive(Debug, Clone)]
pub struct Staged {
    /// `jpg` or `png`.
    pub ext: &'static str,
    /// Offset of its bytes in the staging file.
    pub offset: u64,
    /// Their length.
    pub length: u64,
    /// Re-encoded because of `max_side`.
    pub reencoded: bool,
    /// As [`Prepared::restart`].
    pub restart: Option<std::result::Result<(u32, u64), String>>,
}

/// One piece of a pack made in pieces (`stoker.ray.pack`): prepares `indices` of `src` (a
/// consecutive run of the [`sample_order`]) as [`pack`] would, and writes their bytes back to
/// back into `staging`, a name in `dst` (whole or not at all: [`Destination::write`]).
pub fn prepare_group(
    src: &dyn PackInput,
    indices: &[usize],
    opts: &PackOptions,
    dst: &Destination,
    staging: &str,
) -> Result<Vec<StagedSample>> {
    check_options(opts)?;
    let mut bytes = Vec::new();
    let mut out = Vec::with_capacity(indices.len());
    for (&index, r) in indices.iter().zip(prepare_all(src, indices, opts)) {
        let outcome = match r {
            Err(e) => Err(e.reason()),
            Ok(p) => {
                let offset = bytes.len() as u64;
                bytes.extend_from_slice(&p.data);
                Ok(Staged {
                    ext: p.ext,
                    offset,
                    length: p.data.len() as u64,
                    reencoded: p.reencoded,
                    restart: p.restart,
                })
            }
        };
        out.push(StagedSample { index, outcome });
    }
    dst.write(staging, &bytes)?;
    Ok(out)
}

/// Whether shard `number` of a pack made in pieces is in `dst` whole, and its size if so: the
/// shard and its index there, the index readable, its size the shard's, its keys `keys`, in
/// order, and the tar headers of its first and last samples and its end marker where the
/// index says (a shard is put in place only once written whole, after its index). A shard cut
/// short, another file under its name, or an index of other samples is not whole; a change
/// inside the data of a sample between those is not looked for.
pub fn verify_shard(dst: &Destination, prefix: &str, number: usize, keys: &[String]) -> Option<u64> {
    let name = shard_name(prefix, number);
    let size = dst.size(&name).ok()??;
    let idx = dst.read(&format!("{name}.idx")).ok()??;
    let (entries, indexed) = decode_index(&idx, &dst.locate(&format!("{name}.idx"))).ok()?;
    if indexed != size || entries.len() != keys.len() || entries.iter().zip(keys).any(|(e, k)| &e.key != k) {
        return None;
    }
    let (first, last) = (entries.first()?, entries.last()?);
    let (block, end) = (tar::BLOCK as u64, 2 * tar::BLOCK as u64);
    if first.offset < block || last.offset < first.offset || last.offset.saturating_add(last.length + end) > size {
        return None;
    }
    let header_ok =
        |block: &[u8], e: &IndexEntry| tar::Header::parse(block).is_ok_and(|h| h.fingerprint() == e.fingerprint);
    let head = dst.read_range(&name, first.offset - block..first.offset).ok()?;
    // The last sample's header and data, its label, and the end marker: one read.
    let tail = dst.read_range(&name, last.offset - block..size).ok()?;
    let whole = header_ok(&head, first)
        && header_ok(&tail[..tar::BLOCK], last)
        && tail[tail.len() - end as usize..].iter().all(|&b| b == 0);
    whole.then_some(size)
}

/// One sample of a shard made in pieces: what [`Planner::place`] gave it, and where
/// [`prepare_group`] staged its bytes.
#[derive(Debug, Clone)]
pub struct ShardSample {
    /// The dataset index (its label comes from `src`).
    pub index: usize,
    /// Its key.
    pub key: String,
    /// `jpg` or `png`.
    pub ext: String,
    /// The staging file holding its bytes (its name in the destination).
    pub staging: String,
    /// Their offset there.
    pub offset: u64,
    /// Their length.
    pub length: u64,
}

/// Writes shard `number` of a pack made in pieces into `dst`: the same bytes, index and
/// placing as [`pack`]. The staged bytes are read as one range per staging file (a shard's
/// samples from one group are consecutive there). Returns its path (or URL) and size.
pub fn write_shard(
    src: &dyn PackInput,
    dst: &Destination,
    prefix: &str,
    number: usize,
    samples: &[ShardSample],
) -> Result<(PathBuf, u64)> {
    if samples.is_empty() {
        return Err(Error::Internal(format!("shard {number} of the plan has no sample")));
    }
    let ext_of = |e: &str| -> Result<&'static str> {
        match e {
            "jpg" => Ok("jpg"),
            "png" => Ok("png"),
            other => Err(Error::Internal(format!("a staged sample has extension {other:?}"))),
        }
    };
    let mut w = ShardWriter::new(dst, prefix, vec![], false)?;
    for run in samples.chunk_by(|a, b| a.staging == b.staging) {
        let from = run.iter().map(|s| s.offset).min().expect("a run is not empty");
        let to = run.iter().map(|s| s.offset + s.length).max().expect("a run is not empty");
        let bytes = dst.read_range(&run[0].staging, from..to)?;
        for s in run {
            let data = &bytes[(s.offset - from) as usize..(s.offset - from + s.length) as usize];
            w.append(number, s.key.clone(), ext_of(&s.ext)?, data, src.label(s.index))?;
        }
    }
    w.flush()?;
    let path = w.summary.shards.pop().expect("one shard was written");
    Ok((path, w.summary.bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of three made-up samples in `dst`, through the writer `pack` uses; its keys.
    fn small_shard(dst: &Destination) -> Vec<String> {
        let mut w = ShardWriter::new(dst, "t", vec![], false).unwrap();
        let keys: Vec<String> = (0..3).map(|i| format!("c/{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            w.append(0, k.clone(), "jpg", &vec![i as u8 + 1; 700 + i], i as i64).unwrap();
        }
        w.flush().unwrap();
        keys
    }

    #[test]
    fn a_shard_is_whole_only_as_written() {
        let d = tempfile::tempdir().unwrap();
        let dst = Destination::from(d.path());
        let keys = small_shard(&dst);
        let path = shard_path(d.path(), "t", 0);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(verify_shard(&dst, "t", 0, &keys), Some(bytes.len() as u64));
        assert!(std::fs::read_dir(d.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with('.')));
        // Other keys, a shard cut short, a header overwritten (the same size), the end marker
        // changed, no index: not whole.
        assert_eq!(verify_shard(&dst, "t", 0, &keys[..2]), None);
        std::fs::write(&path, &bytes[..bytes.len() - 512]).unwrap();
        assert_eq!(verify_shard(&dst, "t", 0, &keys), None);
        let mut bad = bytes.clone();
        bad[..512].fill(0);
        std::fs::write(&path, &bad).unwrap();
        assert_eq!(verify_shard(&dst, "t", 0, &keys), None);
        let mut bad = bytes.clone();
        let n = bad.len();
        bad[n - 1] = 1; // the end marker

        std::fs::write(&path, &bad).unwrap();
        assert_eq!(verify_shard(&dst, "t", 0, &keys), None);
        std::fs::write(&path, &bytes).unwrap();
        assert!(verify_shard(&dst, "t", 0, &keys).is_some());
        std::fs::remove_file(crate::source::shards::index_path(&path)).unwrap();
        assert_eq!(verify_shard(&dst, "t", 0, &keys), None);
    }

    #[test]
    fn urls_and_folders() {
        for url in ["s3://b/x", "gs://b", "az://c/p/q", "https://h/x"] {
            assert!(is_url(url), "{url}");
        }
        for path in ["out", "/data/s3:x", "./a://b", "://x"] {
            assert!(!is_url(path), "{path}");
        }
        let d = tempfile::tempdir().unwrap();
        let dst = Destination::from(d.path().join("new"));
        assert_eq!(dst.list().unwrap(), Vec::<String>::new());
        dst.write(".stoker-ray/plan.json", b"{}").unwrap();
        dst.write("a.tar", b"0123456789").unwrap();
        assert_eq!(dst.list().unwrap(), ["a.tar"]); // not what is in sub-folders
        assert_eq!(dst.read(".stoker-ray/plan.json").unwrap().as_deref(), Some(&b"{}"[..]));
        assert_eq!((dst.size("a.tar").unwrap(), dst.size("b.tar").unwrap()), (Some(10), None));
        assert_eq!(dst.read_range("a.tar", 2..5).unwrap(), b"234");
        assert!(dst.read_range("a.tar", 8..12).unwrap_err().to_string().contains("a.tar"));
        dst.remove("a.tar").unwrap();
        dst.remove("a.tar").unwrap();
        assert_eq!(dst.read("a.tar").unwrap(), None);
    }

    #[test]
    fn keys() {
        assert_eq!(key_of("dog/a.jpg"), "dog/a");
        assert_eq!(key_of("dog/a.b.jpg"), "dog/a_b");
        assert_eq!(key_of("d.o.g/a.JPEG"), "d.o.g/a");
    }
}
