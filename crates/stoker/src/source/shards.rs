//! Tar shards in WebDataset layout (`KEY.jpg` + `KEY.cls`), read through a sidecar index
//! (`SHARD.tar.idx`, its format in [`super::shard_index`]: key, byte offset, length, label and
//! tar-header fingerprint of every sample) so that any sample is one positioned read (local
//! files) or a cut from a part fetched ahead (object storage: [`super::shard_storage`],
//! [`super::readahead`]).
//!
//! The index records the shard's size and a checksum of itself; every read also checks the tar
//! header in front of the sample (one `pread` covers header and data): it must be a regular-file
//! header whose [fingerprint](tar::Header::fingerprint) (name as stored there, size field) is
//! the one indexed. That holds whatever named the member (the ustar header, a pax `path` record
//! or a GNU long name), and an index that does not match its shard, a truncated shard or a
//! corrupt index is a clear error naming the file. Indexes of the first format (`STKIDX1`,
//! without fingerprints) are still read; their samples are checked by name and size.
//!
//! The index also records each image's text members (`KEY.txt`, `KEY.json`: an image-text
//! pair's caption and metadata, as img2dataset writes them; [`TextMember`]), which a pair loader
//! reads beside the image ([`ShardSource::read_text`], the same header check); a caption without
//! an image is listed as not a sample. Indexes before the fourth format (`STKIDX4`) have no text
//! members: a pair loader asks for the index to be made again.
//!
//! Indexing streams the shard (headers are read, image data is skipped), so `stoker index`
//! needs memory for the index, not for the shard; an index is written under a temporary name
//! and renamed into place. Tar member names are only compared as strings, never used as
//! filesystem paths.
//!
//! Shards say what they drop. One bad member is that sample's problem, never the shard's: the
//! index keeps every image member with what its `.cls` holds ([`Label`]: an integer, a class
//! name, nothing, or why it cannot be used), and opening the shards decides, listing every image
//! that is not a sample with the reason ([`ShardSource::not_samples`], shown in the loader's
//! report):
//! - an integer label is the label (out of range of a `classes.json` beside the shards: not a
//!   sample);
//! - a class name (WebDataset's ImageNet shards hold `n01440764`) is mapped through the
//!   `classes.json` beside the shards (the list `stoker pack` writes); without one, or when the
//!   name is not in it, the image is not a sample;
//! - an image without `.cls` is not a sample when other images of the shards have labels; when
//!   none has one, the dataset is unlabelled and every label is -1;
//! - a `.cls` that is not a label (empty, not UTF-8, larger than 4 KiB, a negative number)
//!   leaves its image out;
//! - a hard-linked member reads the data of the earlier member it links to; a link that cannot
//!   be resolved, a symbolic link, a device or a FIFO named like an image is not a sample.

use super::readahead::{Got, Need, Readahead, PART_BYTES};
use super::storage_stats::StorageReport;
use super::tar;
use super::{Source, TextKind};
use crate::error::{Error, Result};
use crate::shell::store::{DatasetKey, StoreSpec};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

pub(crate) use super::fetch::ReadFailure;
pub use super::glob::{expand_glob, glob_match};
pub use super::shard_index::{
    decode_index, encode_index, index_members, index_path, index_reader, write_index, IndexEntry, Label, TextMember,
};
pub(crate) use super::shard_index::{partial_path, split_key, write_atomic, MAGIC};
pub(crate) use super::shard_storage::{LocalFiles, ShardMeta, Storage};

/// The most bytes between a sample's image and its caption that one request reads through
/// rather than making two (see `Storage::coalesce`).
const COALESCE_GAP: u64 = 64 << 10;

/// Largest text member (`KEY.txt`, `KEY.json`) a pair loader reads: a caption and its
/// metadata are a few hundred bytes; the length in the index is untrusted.
pub const MAX_TEXT_BYTES: u64 = 1 << 20;

/// A dataset of indexed tar shards, local or in object storage.
pub struct ShardSource {
    storage: Box<dyn Storage>,
    shard_count: usize,
    /// Per sample: shard number, offset, length, label.
    samples: Vec<(u32, u64, u32, i64)>,
    /// Per sample: the fingerprint of its tar header (0: unknown, a first-format index).
    fingerprints: Vec<u64>,
    members: String,
    member_ends: Vec<u64>,
    classes: Vec<std::ffi::OsString>,
    /// Image members that are not samples, with the reason.
    not_samples: Vec<(PathBuf, String)>,
    /// The kind of text member kept (a pair loader's caption member), if any: an image loader
    /// keeps none, so image-text shards cost it no memory for their captions.
    text_kind: Option<TextKind>,
    /// Per sample, its `text_kind` member (empty when none is kept).
    texts: Vec<Option<TextRef>>,
    /// Indexes made before text members were indexed (`STKIDX4`), by name.
    old_indexes: Vec<String>,
    /// Per sample, its part: runs of consecutive samples of a shard of at most
    /// [`PART_BYTES`] (the groups of a shard-window order, and what object storage fetches).
    part_of: Vec<u32>,
    /// Samples per part.
    part_sizes: Vec<usize>,
    /// Per part, its shard and the bytes of its samples (tar headers, data, text members).
    part_ranges: Vec<(u32, std::ops::Range<u64>)>,
    /// The local shard cache, when the loader has one (object storage only).
    shard_cache: std::sync::OnceLock<Arc<super::shard_cache::ShardCache>>,
    /// The running pass's plan of parts (object storage only).
    readahead: RwLock<Option<Arc<Readahead>>>,
}

/// Where a sample's text member is (see [`TextMember`]).
#[derive(Debug, Clone)]
struct TextRef {
    offset: u64,
    length: u32,
    fingerprint: u64,
    member: Box<str>,
}

impl std::fmt::Debug for ShardSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSource").field("shards", &self.shard_count).field("samples", &self.samples.len()).finish()
    }
}

impl ShardSource {
    /// Opens local `shards` (in this order) with their sidecar indexes. Class names come from a
    /// `classes.json` beside the first shard, when present (written by `stoker pack`).
    pub fn open(shards: &[PathBuf]) -> Result<Self> {
        Self::open_keeping(shards, None)
    }

    /// [`ShardSource::open`], keeping where each sample's `text` member is (a pair loader's
    /// captions: see [`ShardSource::require_text`]).
    pub fn open_keeping(shards: &[PathBuf], text: Option<TextKind>) -> Result<Self> {
        if shards.is_empty() {
            return Err(Error::Dataset("no shards given".into()));
        }
        let mut metas = vec![];
        let mut files = vec![];
        for path in shards {
            let file = std::fs::File::open(path)
                .map_err(|e| Error::Dataset(format!("{}: cannot open shard: {e}", path.display())))?;
            let size = file.metadata().map_err(|e| Error::io(path, &e))?.len();
            let idx = index_path(path);
            let bytes = std::fs::read(&idx).map_err(|e| e.to_string());
            metas.push(ShardMeta { name: path.display().to_string(), size, index: (idx.display().to_string(), bytes) });
            files.push(file);
        }
        let classes = shards[0].parent().and_then(|d| std::fs::read_to_string(d.join("classes.json")).ok());
        let names = metas.iter().map(|m| m.name.clone()).collect();
        Self::assemble(metas, classes, Box::new(LocalFiles { names, files }), text)
    }

    /// The source of the shards `metas` on `storage`, keeping each sample's `text` member.
    pub(crate) fn assemble(
        metas: Vec<ShardMeta>,
        classes: Option<String>,
        storage: Box<dyn Storage>,
        text: Option<TextKind>,
    ) -> Result<Self> {
        let mut out = ShardSource {
            storage,
            shard_count: metas.len(),
            samples: vec![],
            fingerprints: vec![],
            members: String::new(),
            member_ends: vec![],
            classes: vec![],
            not_samples: vec![],
            text_kind: text,
            texts: vec![],
            old_indexes: vec![],
            part_of: vec![],
            part_sizes: vec![],
            part_ranges: vec![],
            shard_cache: std::sync::OnceLock::new(),
            readahead: RwLock::new(None),
        };
        if let Some(text) = classes {
            // Names exactly as `stoker pack` wrote them: a folder name that is not UTF-8 is kept
            // byte for byte (Python's escapes, see `classes_to_json`).
            out.classes = super::classes_from_json(&text)
                .map_err(|e| Error::Dataset(format!("invalid classes.json beside the shards: {e}")))?;
        }
        let mut shards = vec![];
        for m in metas {
            let (idx, bytes) = m.index;
            let bytes = bytes.map_err(|e| {
                Error::Dataset(format!(
                    "{idx}: cannot read the shard index ({e}); create it with `stoker index {}`",
                    m.name
                ))
            })?;
            let (entries, expected) = decode_index(&bytes, Path::new(&idx))?;
            if !bytes.starts_with(MAGIC) {
                out.old_indexes.push(idx.clone());
            }
            if expected != m.size {
                return Err(Error::Dataset(format!(
                    "{idx}: index does not match its shard: the index was made for {expected} bytes, the shard has {} (truncated or rewritten shard?)",
                    m.size
                )));
            }
            shards.push((m.name, entries));
        }
        let resolve = Labels::new(&out.classes, shards.iter().flat_map(|(_, e)| e));
        for (k, (name, entries)) in shards.into_iter().enumerate() {
            for e in entries {
                let label = match resolve.label(&e) {
                    Ok(l) => l,
                    Err(why) => {
                        out.not_samples.push((PathBuf::from(format!("{name}:{}", e.member)), why));
                        continue;
                    }
                };
                let len = u32::try_from(e.length)
                    .map_err(|_| Error::decode(&name, format!("member {} is larger than 4 GiB", e.member)))?;
                out.samples.push((k as u32, e.offset, len, label));
                if let Some(kind) = text {
                    // The first member of the kind counts (`KEY.txt` before `KEY.TXT`); one too
                    // large for a caption is kept, and refused when read, naming its size.
                    out.texts.push(e.texts.iter().find(|t| t.kind == kind).map(|t| TextRef {
                        offset: t.offset,
                        length: u32::try_from(t.length).unwrap_or(u32::MAX),
                        fingerprint: t.fingerprint,
                        member: t.member.as_str().into(),
                    }));
                }
                out.fingerprints.push(e.fingerprint);
                out.members.push_str(&e.member);
                out.member_ends.push(out.members.len() as u64);
            }
        }
        out.cut_parts();
        if out.samples.is_empty() {
            return Err(Error::Dataset(match out.not_samples.first() {
                None => "the shards hold no image samples".into(),
                Some((p, why)) => format!(
                    "none of the {} image members of the shards is a sample; the first: {}: {why}",
                    out.not_samples.len(),
                    p.display()
                ),
            }));
        }
        Ok(out)
    }

    /// The image members that are not samples, with the reason (a `.cls` that is not a label,
    /// a class name missing from `classes.json`, no `.cls` where others have one, a link that
    /// cannot be read): reported, never read.
    pub fn not_samples(&self) -> &[(PathBuf, String)] {
        &self.not_samples
    }

    /// Class names, when the shards came with a `classes.json`.
    pub fn classes(&self) -> &[std::ffi::OsString] {
        &self.classes
    }

    /// The member name of sample `i` (key + extension).
    pub fn member(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.member_ends[i - 1] as usize };
        &self.members[start..self.member_ends[i] as usize]
    }

    /// The WebDataset key of sample `i` (its member name up to the first '.' of the base name).
    pub fn key(&self, i: usize) -> &str {
        let m = self.member(i);
        split_key(m).map_or(m, |(k, _)| k)
    }

    fn text(&self, i: usize, kind: TextKind) -> Option<&TextRef> {
        (self.text_kind == Some(kind)).then(|| self.texts.get(i).and_then(Option::as_ref)).flatten()
    }

    /// Keeps only the samples that have a `kind` text member (a pair loader's captions; the
    /// shards opened keeping it); the others are listed as not samples, with the reason. An
    /// error when an index was made before text members were indexed, or when no sample is left.
    pub fn require_text(mut self, kind: TextKind) -> Result<Self> {
        if self.text_kind != Some(kind) {
            return Err(Error::Internal(format!("shards opened without their {} members", kind.extension())));
        }
        if let Some(idx) = self.old_indexes.first() {
            let shard = idx.strip_suffix(".idx").unwrap_or(idx);
            return Err(Error::Dataset(format!(
                "{idx}: the index was made by an older stoker and does not list the shard's text members (captions); re-create it with `stoker index {shard}`"
            )));
        }
        let samples = std::mem::take(&mut self.samples);
        let fingerprints = std::mem::take(&mut self.fingerprints);
        let texts = std::mem::take(&mut self.texts);
        let members = std::mem::take(&mut self.members);
        let member_ends = std::mem::take(&mut self.member_ends);
        for (i, &sample) in samples.iter().enumerate() {
            let start = if i == 0 { 0 } else { member_ends[i - 1] as usize };
            let member = &members[start..member_ends[i] as usize];
            match texts.get(i) {
                Some(Some(t)) => {
                    self.samples.push(sample);
                    self.fingerprints.push(fingerprints[i]);
                    self.texts.push(Some(t.clone()));
                    self.members.push_str(member);
                    self.member_ends.push(self.members.len() as u64);
                }
                _ => {
                    let key = split_key(member).map_or(member, |(k, _)| k);
                    let shard = self.storage.name(sample.0 as usize);
                    let why = format!("no {}: the shard has no {key}.{}", kind.what(), kind.extension());
                    self.not_samples.push((PathBuf::from(format!("{shard}:{member}")), why));
                }
            }
        }
        self.cut_parts();
        if self.samples.is_empty() {
            return Err(Error::Dataset(format!(
                "none of the image members of the shards has a {} ({}.{}); {} are not samples",
                kind.what(),
                "KEY",
                kind.extension(),
                self.not_samples.len()
            )));
        }
        Ok(self)
    }
}

/// The rules that turn what an index holds ([`Label`]) into a label, for one set of shards.
struct Labels<'a> {
    /// Class names in label order (`classes.json`), by name.
    classes: std::collections::HashMap<&'a str, usize>,
    class_count: usize,
    /// Whether any image of the shards has a label (else the dataset is unlabelled: -1).
    labelled: bool,
}

impl<'a> Labels<'a> {
    fn new<'e>(classes: &'a [std::ffi::OsString], entries: impl Iterator<Item = &'e IndexEntry>) -> Self {
        let mut by_name = std::collections::HashMap::new();
        // A `.cls` member names its class in UTF-8 text: a name that is not UTF-8 is reached
        // by its index only.
        for (i, c) in classes.iter().enumerate() {
            if let Some(c) = c.to_str() {
                by_name.entry(c).or_insert(i);
            }
        }
        let mut entries = entries;
        let labelled = entries.any(|e| matches!(e.label, Label::Index(_) | Label::Name(_)));
        Labels { classes: by_name, class_count: classes.len(), labelled }
    }

    /// The label of `e`, or why it is not a sample.
    fn label(&self, e: &IndexEntry) -> std::result::Result<i64, String> {
        match &e.label {
            Label::Index(v) if *v < 0 => Err(format!("its label is a negative number ({v})")),
            Label::Index(v) if self.class_count > 0 && *v as u64 >= self.class_count as u64 => Err(format!(
                "its label {v} is out of range: the classes.json beside the shards names {} classes",
                self.class_count
            )),
            Label::Index(v) => Ok(*v),
            Label::Name(n) => match self.classes.get(n.as_str()) {
                Some(&i) => Ok(i as i64),
                None if self.class_count == 0 => Err(format!(
                    "its label {n:?} is a class name, and there is no classes.json beside the shards to map it to a class index"
                )),
                None => Err(format!("its label {n:?} is not a class of the classes.json beside the shards")),
            },
            Label::Missing if !self.labelled => Ok(-1),
            Label::Missing => Err(format!("no label: the shard has no {}.cls (other images have labels)", e.key)),
            Label::Dropped(why) => Err(why.clone()),
        }
    }
}

impl ShardSource {
    /// Cuts each shard's samples into parts: runs of consecutive samples whose bytes (from the
    /// first one's tar header to the last one's end) span at most [`PART_BYTES`]; a larger
    /// sample is a part of its own. A function of the indexes alone, so local and remote
    /// copies of the same shards have the same parts (and the same shard-window order).
    fn cut_parts(&mut self) {
        self.part_of.clear();
        self.part_sizes.clear();
        self.part_ranges.clear();
        let mut current: Option<(u32, u64)> = None;
        for i in 0..self.samples.len() {
            let (k, offset, len, _) = self.samples[i];
            let (start, end) = (offset - tar::BLOCK as u64, offset + u64::from(len));
            let fits = matches!(current, Some((shard, from)) if shard == k && end.saturating_sub(from) <= PART_BYTES);
            let span = self.span(i);
            if !fits {
                self.part_sizes.push(0);
                self.part_ranges.push((k, span.clone()));
                current = Some((k, start));
            }
            *self.part_sizes.last_mut().expect("a part") += 1;
            let r = &mut self.part_ranges.last_mut().expect("a part").1;
            (r.start, r.end) = (r.start.min(span.start), r.end.max(span.end));
            self.part_of.push(self.part_sizes.len() as u32 - 1);
        }
    }

    /// The bytes of its shard that reading sample `i` takes: its tar header and data, and its
    /// text member's when one is kept.
    fn span(&self, i: usize) -> std::ops::Range<u64> {
        let (_, offset, len, _) = self.samples[i];
        let mut r = offset - tar::BLOCK as u64..offset + u64::from(len);
        if let Some(Some(t)) = self.texts.get(i) {
            r.start = r.start.min(t.offset - tar::BLOCK as u64);
            r.end = r.end.max(t.offset + u64::from(t.length));
        }
        r
    }

    /// The running pass's plan, if there is one.
    fn current_plan(&self) -> Option<Arc<Readahead>> {
        self.readahead.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Reads `buf.len()` bytes at `at` of sample `i`'s shard: from its part when the running
    /// pass streams it, else with a read of its own.
    fn read_span(&self, i: usize, at: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure> {
        let k = self.samples[i].0 as usize;
        if let Some(plan) = self.current_plan() {
            match plan.read(self.part_of[i], at, buf)? {
                Got::Hit => return Ok(()),
                Got::Stopped => return Err(ReadFailure::Failed("the pass stopped before its part arrived".into())),
                Got::Miss => {}
            }
        }
        self.storage.read_at(k, at, buf)
    }

    /// Checks that `block`, read in front of sample `i`'s data, is the tar header that was
    /// indexed for it: a regular file with the indexed fingerprint (for a first-format index:
    /// the indexed name and size).
    fn check_header(&self, i: usize, block: &[u8]) -> Result<()> {
        let (k, offset, len, _) = self.samples[i];
        let member = Member { name: self.member(i), offset, length: len, fingerprint: self.fingerprints[i] };
        self.check_member(k, &member, block).map_err(|why| Error::decode(self.describe(i), why))
    }

    /// Why `block` is not the header indexed for `m` in shard `k`, if it is not.
    fn check_member(&self, k: u32, m: &Member<'_>, block: &[u8]) -> std::result::Result<(), String> {
        let why = match tar::Header::parse(block) {
            Err(e) => e,
            Ok(h) => {
                let same = match m.fingerprint {
                    0 => h.size == u64::from(m.length) && h.name == m.name.as_bytes(),
                    f => h.fingerprint() == f,
                };
                if h.is_file() && same {
                    return Ok(());
                }
                format!(
                    "the header there is for {:?} ({} bytes, type {:?})",
                    String::from_utf8_lossy(&h.name),
                    h.size,
                    h.typeflag as char
                )
            }
        };
        Err(format!(
            "index does not match its shard: no tar header for {} at byte {} ({why}); re-create the index with `stoker index {}`",
            m.name,
            m.offset - tar::BLOCK as u64,
            self.storage.name(k as usize)
        ))
    }

    /// The failure of a read of `total` bytes at `at` for the member described by `what`.
    fn read_failed(&self, what: PathBuf, total: usize, at: u64, e: ReadFailure) -> Error {
        match e {
            ReadFailure::Unavailable(why) => Error::Unavailable(format!("{}: {why}", what.display())),
            ReadFailure::Failed(e) => Error::decode(what, format!("cannot read {total} bytes at offset {at}: {e}")),
        }
    }
}

/// An indexed member as a read checks it.
struct Member<'a> {
    name: &'a str,
    offset: u64,
    length: u32,
    fingerprint: u64,
}

impl Source for ShardSource {
    fn len(&self) -> usize {
        self.samples.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.samples[i].3
    }

    fn read(&self, i: usize, buf: &mut Vec<u8>, max_bytes: u64) -> Result<()> {
        let (k, offset, len, _) = self.samples[i];
        if u64::from(len) > max_bytes {
            return Err(Error::decode(
                self.describe(i),
                format!("member too large: {len} bytes > max_file_bytes ({max_bytes})"),
            ));
        }
        let total = tar::BLOCK + len as usize;
        let failed = |e: ReadFailure| self.read_failed(self.describe(i), total, offset - tar::BLOCK as u64, e);
        // The read overwrites every byte, so the buffer's old bytes are kept rather than
        // zeroed: only growth past its last length is filled. One positioned read for the
        // member's tar header and its data: split between two buffers where the storage can.
        let mut head = [0u8; tar::BLOCK];
        buf.resize(len as usize, 0);
        if let Some(read) = self.storage.read_split_at(k as usize, offset - tar::BLOCK as u64, &mut head, buf) {
            read.map_err(failed)?;
            return self.check_header(i, &head);
        }
        buf.resize(total, 0);
        self.read_span(i, offset - tar::BLOCK as u64, buf).map_err(failed)?;
        self.check_header(i, &buf[..tar::BLOCK])?;
        buf.copy_within(tar::BLOCK.., 0);
        buf.truncate(len as usize);
        Ok(())
    }

    fn read_text(&self, i: usize, kind: TextKind, buf: &mut Vec<u8>) -> Result<()> {
        let (k, ..) = self.samples[i];
        let shard = self.storage.name(k as usize);
        let Some(t) = self.text(i, kind) else {
            let why = format!("no {}: the shard has no {}.{}", kind.what(), self.key(i), kind.extension());
            return Err(Error::decode(self.describe(i), why));
        };
        let what = PathBuf::from(format!("{shard}:{}", t.member));
        if u64::from(t.length) > MAX_TEXT_BYTES {
            let why = format!("{} bytes: a text member has at most {MAX_TEXT_BYTES}", t.length);
            return Err(Error::decode(what, why));
        }
        let total = tar::BLOCK + t.length as usize;
        buf.clear();
        buf.resize(total, 0);
        let at = t.offset - tar::BLOCK as u64;
        self.read_span(i, at, buf).map_err(|e| self.read_failed(what.clone(), total, at, e))?;
        let m = Member { name: &t.member, offset: t.offset, length: t.length, fingerprint: t.fingerprint };
        self.check_member(k, &m, &buf[..tar::BLOCK]).map_err(|why| Error::decode(what, why))?;
        buf.drain(..tar::BLOCK);
        Ok(())
    }

    /// One request for the image and the caption where the storage counts requests and the
    /// two lie within [`COALESCE_GAP`] of each other (img2dataset writes a sample's members
    /// next to each other), else two reads.
    fn read_pair(&self, i: usize, kind: TextKind, buf: &mut Vec<u8>, text: &mut Vec<u8>, max_bytes: u64) -> Result<()> {
        let (k, offset, len, _) = self.samples[i];
        let near = self.text(i, kind).filter(|t| {
            let (a, b) = (offset - tar::BLOCK as u64, offset + u64::from(len));
            let (c, d) = (t.offset - tar::BLOCK as u64, t.offset + u64::from(t.length));
            self.storage.coalesce()
                && u64::from(len) <= max_bytes
                && u64::from(t.length) <= MAX_TEXT_BYTES
                && b.max(d) - a.min(c) <= u64::from(len) + u64::from(t.length) + 2 * tar::BLOCK as u64 + COALESCE_GAP
        });
        let Some(t) = near else {
            self.read(i, buf, max_bytes)?;
            return self.read_text(i, kind, text);
        };
        let lo = (offset - tar::BLOCK as u64).min(t.offset - tar::BLOCK as u64);
        let hi = (offset + u64::from(len)).max(t.offset + u64::from(t.length));
        let mut span = vec![0u8; (hi - lo) as usize];
        self.read_span(i, lo, &mut span).map_err(|e| self.read_failed(self.describe(i), span.len(), lo, e))?;
        let at = |o: u64| (o - lo) as usize;
        self.check_header(i, &span[at(offset - tar::BLOCK as u64)..at(offset)])?;
        let m = Member { name: &t.member, offset: t.offset, length: t.length, fingerprint: t.fingerprint };
        let shard = self.storage.name(k as usize);
        self.check_member(k, &m, &span[at(t.offset - tar::BLOCK as u64)..at(t.offset)])
            .map_err(|why| Error::decode(format!("{shard}:{}", t.member), why))?;
        buf.clear();
        buf.extend_from_slice(&span[at(offset)..at(offset) + len as usize]);
        text.clear();
        text.extend_from_slice(&span[at(t.offset)..at(t.offset) + t.length as usize]);
        Ok(())
    }

    fn key(&self, i: usize) -> String {
        ShardSource::key(self, i).to_string()
    }

    fn abandon_reads(&self) {
        if let Some(plan) = self.readahead.write().unwrap_or_else(|p| p.into_inner()).take() {
            plan.stop();
        }
        self.storage.abandon_reads();
    }

    /// The parts (see [`ShardSource::cut_parts`]): a shard, or a run of at most
    /// [`PART_BYTES`] of one.
    fn groups(&self) -> Option<Vec<usize>> {
        Some(self.part_sizes.clone())
    }

    /// With a shard cache, parts are fetched whole (the same entries whatever the rank and
    /// the epoch); without one, each part's bytes that this pass reads.
    fn plan_reads(&self, order: &[u32], budget: u64, lag: usize) {
        let Some((fetch, stats)) = self.storage.parts() else { return };
        let cache = self.shard_cache.get().cloned();
        let needs: Vec<Need> = order
            .iter()
            .map(|&i| {
                let (i, part) = (i as usize, self.part_of[i as usize]);
                let bytes = if cache.is_some() { self.part_ranges[part as usize].1.clone() } else { self.span(i) };
                Need { part, shard: self.samples[i].0, bytes }
            })
            .collect();
        let cache = cache.map(|c| c as Arc<dyn super::fetch::PartStore>);
        let plan = Readahead::new(&needs, budget, lag, fetch, stats, cache).map(Arc::new);
        let old = std::mem::replace(&mut *self.readahead.write().unwrap_or_else(|p| p.into_inner()), plan);
        if let Some(old) = old {
            old.stop();
        }
    }

    fn is_remote(&self) -> bool {
        self.storage.parts().is_some()
    }

    fn storage_report(&self) -> Option<StorageReport> {
        let cache = self.shard_cache.get().map(|c| c.report());
        self.storage.parts().map(|(_, stats)| StorageReport { cache, ..stats.report() })
    }

    /// The cache group's key: the shards' names and every sample's place and tar header.
    fn use_shard_cache(&self, spec: &StoreSpec) -> Result<()> {
        if !self.is_remote() {
            return Err(Error::config(
                "shard_cache",
                "keeps parts of shards in object storage; these shards are on a local file system already",
            ));
        }
        if self.shard_cache.get().is_none() {
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            for k in 0..self.shard_count {
                h.update(self.storage.name(k).as_bytes());
                h.update(&[0]);
            }
            for (i, &(k, offset, len, _)) in self.samples.iter().enumerate() {
                for v in [u64::from(k), offset, u64::from(len), self.fingerprints[i]] {
                    h.update(&v.to_le_bytes());
                }
            }
            let first = self.storage.name(0);
            let description = first.rsplit_once('/').map_or(first, |(d, _)| d).to_string();
            let dataset = DatasetKey { hash: h.digest(), samples: self.samples.len(), description };
            let _ = self.shard_cache.set(Arc::new(super::shard_cache::ShardCache::open(spec, &dataset)?));
        }
        Ok(())
    }

    fn describe(&self, i: usize) -> PathBuf {
        let (k, ..) = self.samples[i];
        PathBuf::from(format!("{}:{}", self.storage.name(k as usize), self.member(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::shard_index::{MAGIC_V1, MAGIC_V2, MAGIC_V3};
    use super::*;

    #[test]
    fn keys_follow_webdataset() {
        assert_eq!(split_key("dog/img_1.jpg"), Some(("dog/img_1", "jpg")));
        assert_eq!(split_key("a.b/c.seg.png"), Some(("a.b/c", "seg.png")));
        assert_eq!(split_key("noext"), None);
    }

    #[test]
    fn index_round_trip_and_corruption() {
        let one = IndexEntry {
            key: "a/x".into(),
            member: "a/x.jpg".into(),
            offset: 512,
            length: 10,
            label: Label::Index(3),
            fingerprint: 7,
            texts: vec![],
        };
        let caption =
            TextMember { kind: TextKind::Txt, member: "a/x.TXT".into(), offset: 1024, length: 5, fingerprint: 9 };
        let meta =
            TextMember { kind: TextKind::Json, member: "a/x.json".into(), offset: 1536, length: 7, fingerprint: 11 };
        let e = vec![
            one.clone(),
            IndexEntry { label: Label::Name("n01440764".into()), ..one.clone() },
            IndexEntry { label: Label::Missing, ..one.clone() },
            IndexEntry { label: Label::Dropped("its label a/x.cls is empty".into()), ..one.clone() },
            IndexEntry { label: Label::Index(-7), key: "é".into(), member: "é.png".into(), ..one.clone() },
            IndexEntry { texts: vec![caption.clone(), meta], ..one.clone() },
        ];
        let b = encode_index(&e, 2048);
        assert_eq!(decode_index(&b, Path::new("i")).unwrap(), (e.clone(), 2048));
        for cut in [0, 7, 20, b.len() - 1] {
            assert!(decode_index(&b[..cut], Path::new("i")).is_err());
        }
        let mut flip = b.clone();
        flip[30] ^= 1;
        assert!(decode_index(&flip, Path::new("i")).unwrap_err().to_string().contains("checksum"));
        let outside = encode_index(&[IndexEntry { offset: 4096, ..e[0].clone() }], 2048);
        assert!(decode_index(&outside, Path::new("i")).unwrap_err().to_string().contains("outside"));
        let text_outside = IndexEntry { texts: vec![TextMember { offset: 2046, ..caption }], ..e[0].clone() };
        let e = decode_index(&encode_index(&[text_outside], 2048), Path::new("i")).unwrap_err().to_string();
        assert!(e.contains("a/x.TXT lies outside"), "{e}");
    }

    proptest::proptest! {
        #[test]
        fn any_entries_round_trip(
            entries in proptest::collection::vec((".{0,40}", 0u8..4, proptest::prelude::any::<i64>(), ".{0,60}"), 0..6)
        ) {
            let entries: Vec<IndexEntry> = entries
                .into_iter()
                .enumerate()
                .map(|(k, (member, kind, v, text))| IndexEntry {
                    key: split_key(&member).map(|(k, _)| k.to_string()).unwrap_or_else(|| member.clone()),
                    member,
                    offset: 512 * (k as u64 + 1),
                    length: k as u64,
                    label: match kind {
                        0 => Label::Index(v),
                        1 => Label::Name(text),
                        2 => Label::Missing,
                        _ => Label::Dropped(text),
                    },
                    fingerprint: v as u64,
                    texts: (0..kind % 3)
                        .map(|t| TextMember {
                            kind: if t == 0 { TextKind::Txt } else { TextKind::Json },
                            member: format!("{t}.txt"),
                            offset: 512 * (k as u64 + 1),
                            length: t as u64,
                            fingerprint: v as u64 ^ 1,
                        })
                        .collect(),
                })
                .collect();
            let b = encode_index(&entries, 1 << 20);
            proptest::prop_assert_eq!(decode_index(&b, Path::new("i")).unwrap(), (entries, 1 << 20));
        }
    }

    #[test]
    fn pairs_need_a_fourth_format_index_and_keep_captioned_images() {
        let d = tempfile::tempdir().unwrap();
        let shard = d.path().join("p.tar");
        let mut data = vec![];
        for (name, bytes) in [
            ("a.jpg", &b"jpeg-a"[..]),
            ("a.txt", b"a cat"),
            ("b.JPG", b"jpeg-b"),
            ("b.TXT", b"a dog"),
            ("c.jpg", b"jpeg-c"),
            ("c.json", b"{}"),
            ("d.txt", b"no image"),
        ] {
            tar::append_member(&mut data, name, bytes);
        }
        tar::finish(&mut data);
        std::fs::write(&shard, &data).unwrap();
        assert_eq!(write_index(&shard).unwrap(), 3);
        let open = || ShardSource::open_keeping(std::slice::from_ref(&shard), Some(TextKind::Txt)).unwrap();
        // Images alone: every image, and the caption without one listed.
        let all = ShardSource::open(std::slice::from_ref(&shard)).unwrap();
        assert!(all.texts.is_empty() && all.text_kind.is_none());
        assert_eq!(all.len(), 3);
        assert!(all.not_samples()[0].1.contains("no image") && all.not_samples()[0].0.ends_with("p.tar:d.txt"));
        let pairs = open().require_text(TextKind::Txt).unwrap();
        assert_eq!((pairs.len(), pairs.key(0), pairs.key(1)), (2, "a", "b"));
        let mut buf = vec![];
        pairs.read_text(1, TextKind::Txt, &mut buf).unwrap();
        assert_eq!(buf, b"a dog");
        assert!(pairs.not_samples().iter().any(|(p, why)| p.ends_with("p.tar:c.jpg") && why.contains("no caption")));
        let e = pairs.read_text(0, TextKind::Json, &mut buf).unwrap_err().to_string();
        assert!(e.contains("no metadata") && e.contains("a.json"), "{e}");
        let json = ShardSource::open_keeping(std::slice::from_ref(&shard), Some(TextKind::Json)).unwrap();
        let json = json.require_text(TextKind::Json).unwrap();
        assert_eq!((json.len(), json.key(0)), (1, "c"));
        json.read_text(0, TextKind::Json, &mut buf).unwrap();
        assert_eq!(buf, b"{}");
        // Where requests count (an object store), the image and its caption are one read.
        struct Requests(LocalFiles, std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl Storage for Requests {
            fn read_at(&self, k: usize, at: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure> {
                self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.0.read_at(k, at, buf)
            }
            fn name(&self, k: usize) -> &str {
                self.0.name(k)
            }
            fn coalesce(&self) -> bool {
                true
            }
        }
        let idx = index_path(&shard);
        let meta = ShardMeta {
            name: shard.display().to_string(),
            size: data.len() as u64,
            index: (idx.display().to_string(), Ok(std::fs::read(&idx).unwrap())),
        };
        let files = LocalFiles { names: vec![meta.name.clone()], files: vec![std::fs::File::open(&shard).unwrap()] };
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Box::new(Requests(files, count.clone()));
        let remote = ShardSource::assemble(vec![meta], None, counted, Some(TextKind::Txt))
            .unwrap()
            .require_text(TextKind::Txt)
            .unwrap();
        let (mut image, mut caption) = (vec![], vec![]);
        for i in 0..2 {
            remote.read_pair(i, TextKind::Txt, &mut image, &mut caption, u64::MAX).unwrap();
            let (mut want_image, mut want_caption) = (vec![], vec![]);
            pairs.read(i, &mut want_image, u64::MAX).unwrap();
            pairs.read_text(i, TextKind::Txt, &mut want_caption).unwrap();
            assert_eq!((&image, &caption), (&want_image, &want_caption));
        }
        assert_eq!(count.load(std::sync::atomic::Ordering::Relaxed), 2);
        // An image over max_file_bytes is refused before anything is read.
        let e = remote.read_pair(0, TextKind::Txt, &mut image, &mut caption, 3).unwrap_err().to_string();
        assert!(e.contains("too large") && count.load(std::sync::atomic::Ordering::Relaxed) == 2, "{e}");

        // The same index in the third format (no text members): refused, naming the command.
        let (mut entries, size) = decode_index(&std::fs::read(index_path(&shard)).unwrap(), &shard).unwrap();
        entries.retain(|e| e.label == Label::Missing);
        let mut v3 = MAGIC_V3.to_vec();
        v3.extend_from_slice(&size.to_le_bytes());
        v3.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for e in &entries {
            for v in [e.offset, e.length, e.fingerprint] {
                v3.extend_from_slice(&v.to_le_bytes());
            }
            v3.extend_from_slice(&(e.member.len() as u32).to_le_bytes());
            v3.extend_from_slice(e.member.as_bytes());
            v3.push(2); // no label
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&v3);
        v3.extend_from_slice(&sum.to_le_bytes());
        std::fs::write(index_path(&shard), &v3).unwrap();
        assert_eq!(open().len(), 3);
        let e = open().require_text(TextKind::Txt).unwrap_err().to_string();
        assert!(e.contains("p.tar.idx") && e.contains("older stoker") && e.contains("stoker index"), "{e}");
    }

    #[test]
    fn second_format_indexes_are_still_read() {
        // STKIDX2: offset, length, label (-1: no .cls), fingerprint, name length, name.
        let mut b = MAGIC_V2.to_vec();
        for v in [2048u64, 2] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for (label, name) in [(5i64, "a/x.jpg"), (-1, "a/y.jpg")] {
            for v in [512u64, 10, label as u64, 9] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            b.extend_from_slice(&(name.len() as u32).to_le_bytes());
            b.extend_from_slice(name.as_bytes());
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        let (e, _) = decode_index(&b, Path::new("i")).unwrap();
        assert_eq!((&e[0].label, &e[1].label), (&Label::Index(5), &Label::Missing));
        assert_eq!((e[1].key.as_str(), e[1].fingerprint), ("a/y", 9));
    }

    #[test]
    fn first_format_indexes_are_still_read() {
        // STKIDX1: offset, length, label, name length, name; no fingerprint.
        let mut b = MAGIC_V1.to_vec();
        for v in [2048u64, 1, 512, 10, 3] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(b"a/x.jpg");
        let sum = xxhash_rust::xxh3::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        let (e, size) = decode_index(&b, Path::new("i")).unwrap();
        assert_eq!(size, 2048);
        assert_eq!(
            e[0],
            IndexEntry {
                key: "a/x".into(),
                member: "a/x.jpg".into(),
                offset: 512,
                length: 10,
                label: Label::Index(3),
                fingerprint: 0,
                texts: vec![]
            }
        );
    }
}
