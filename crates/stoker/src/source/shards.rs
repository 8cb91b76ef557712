//! Tar shards in WebDataset layout (`KEY.jpg` + `KEY.cls`), read through a sidecar index
//! (`SHARD.tar.idx`: key, byte offset, length, label and tar-header fingerprint of every
//! sample) so that any sample is one positioned read.
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

use super::readahead::{Got, Need, PartFetch, Readahead, PART_BYTES};
use super::storage_stats::{StorageReport, StorageStats};
use super::tar;
use super::{Source, TextKind, IMG_EXTENSIONS};
use crate::error::{Error, Result};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The first index format (no header fingerprints).
const MAGIC_V1: &[u8; 8] = b"STKIDX1\0";
/// The second format (fingerprints; labels as integers, -1 for none).
const MAGIC_V2: &[u8; 8] = b"STKIDX2\0";
/// The third format (labels as [`Label`], no text members).
const MAGIC_V3: &[u8; 8] = b"STKIDX3\0";
/// The index format written now (text members beside each image).
const MAGIC: &[u8; 8] = b"STKIDX4\0";

/// The most bytes between a sample's image and its caption that one request reads through
/// rather than making two (see `Storage::coalesce`).
const COALESCE_GAP: u64 = 64 << 10;

/// Largest text member (`KEY.txt`, `KEY.json`) a pair loader reads: a caption and its
/// metadata are a few hundred bytes; the length in the index is untrusted.
pub const MAX_TEXT_BYTES: u64 = 1 << 20;

/// Largest `.cls` member accepted (a label is a short decimal integer).
const MAX_LABEL_BYTES: u64 = 4096;

/// What an image member's `KEY.cls` holds, as indexed; [`ShardSource`] decides from it (and the
/// `classes.json` beside the shards) whether the image is a sample and with which label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Label {
    /// An integer label.
    Index(i64),
    /// A class name, mapped through `classes.json` when the shards are opened.
    Name(String),
    /// No `KEY.cls` for this image.
    Missing,
    /// Not a sample, and why (a `.cls` that is not a label, a link that cannot be read).
    Dropped(String),
}

/// A text member of a sample (`KEY.txt` or `KEY.json`, extensions in any case), as indexed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextMember {
    /// Which member it is.
    pub kind: TextKind,
    /// Its name in the shard.
    pub member: String,
    /// Offset of its data in the shard.
    pub offset: u64,
    /// Data length.
    pub length: u64,
    /// [`tar::Header::fingerprint`] of its header.
    pub fingerprint: u64,
}

/// One indexed image member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    /// WebDataset key.
    pub key: String,
    /// Image member name (key + extension).
    pub member: String,
    /// Offset of the image data in the shard.
    pub offset: u64,
    /// Image data length.
    pub length: u64,
    /// What `KEY.cls` holds.
    pub label: Label,
    /// [`tar::Header::fingerprint`] of the member's header (0: unknown, a first-format index).
    pub fingerprint: u64,
    /// The sample's text members (none before the fourth format).
    pub texts: Vec<TextMember>,
}

/// The sidecar index path of `shard`.
pub fn index_path(shard: &Path) -> PathBuf {
    let mut p = shard.as_os_str().to_owned();
    p.push(".idx");
    PathBuf::from(p)
}

/// The temporary name `path` is written under before it is renamed into place: hidden, and
/// ending neither in `.tar` nor in `.idx`, so nothing takes it for a shard or an index.
pub(crate) fn partial_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.stoker-partial"))
}

/// Writes `bytes` to `path` all or nothing: a temporary file, synced, then renamed. On an error
/// (a full disk, ...) the temporary file is removed and the error names `path`.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = partial_path(path);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, &e)
    })
}

/// Splits a member name into (key, extension): the key is everything up to the first '.' of
/// the base name, as WebDataset does.
fn split_key(name: &str) -> Option<(&str, &str)> {
    let base_start = name.rfind('/').map(|i| i + 1).unwrap_or(0);
    let dot = name[base_start..].find('.')? + base_start;
    Some((&name[..dot], &name[dot + 1..]))
}

/// Groups the members of a tar archive held in memory into samples (see [`index_reader`]).
pub fn index_members(data: &[u8], shard: &Path) -> Result<Vec<IndexEntry>> {
    index_reader(std::io::Cursor::new(data), data.len() as u64, shard)
}

/// What the `.cls` member `name` holding `raw` says.
fn parse_label(name: &str, raw: &[u8]) -> Label {
    let Ok(text) = std::str::from_utf8(raw) else {
        return Label::Dropped(format!("its label {name} is not UTF-8 text"));
    };
    let text = text.trim();
    if text.is_empty() {
        return Label::Dropped(format!("its label {name} is empty"));
    }
    match text.parse::<i64>() {
        Ok(v) if v >= 0 => Label::Index(v),
        Ok(v) => Label::Dropped(format!("its label {name} holds a negative number ({v})")),
        Err(_) => Label::Name(text.to_string()),
    }
}

/// Groups the members of the tar archive in `reader` (`total` bytes) into image entries with
/// what their `.cls` holds, streaming: image data is skipped, only headers and labels are read.
/// A member that is not a label or cannot be read is its image's problem ([`Label::Dropped`]),
/// not the shard's; a shard whose tar structure is broken is an error.
pub fn index_reader<R: Read + Seek>(reader: R, total: u64, shard: &Path) -> Result<Vec<IndexEntry>> {
    let invalid = |e: String| Error::decode(shard, format!("invalid shard: {e}"));
    let mut r = tar::Reader::new(reader, total);
    let mut out: Vec<IndexEntry> = vec![];
    let mut labels: std::collections::HashMap<String, Label> = std::collections::HashMap::new();
    let mut texts: std::collections::HashMap<String, Vec<TextMember>> = std::collections::HashMap::new();
    // Members without data: an image is listed as not a sample, a label drops its image.
    let note_unread =
        |unread: Vec<tar::Unread>, out: &mut Vec<IndexEntry>, labels: &mut std::collections::HashMap<String, Label>| {
            for u in unread {
                let Some((key, ext)) = split_key(&u.name) else { continue };
                let ext = ext.to_ascii_lowercase();
                if ext == "cls" {
                    labels.insert(key.to_string(), Label::Dropped(format!("its label {} is {}", u.name, u.reason)));
                } else if IMG_EXTENSIONS.contains(&ext.as_str()) {
                    out.push(IndexEntry {
                        key: key.to_string(),
                        member: u.name.clone(),
                        offset: u.offset,
                        length: 0,
                        label: Label::Dropped(format!("the member is {}", u.reason)),
                        fingerprint: 0,
                        texts: vec![],
                    });
                }
            }
        };
    while let Some(m) = r.next_member().map_err(invalid)? {
        note_unread(r.take_unread(), &mut out, &mut labels);
        let Some((key, ext)) = split_key(&m.name) else { continue };
        let ext_l = ext.to_ascii_lowercase();
        if ext_l == "cls" {
            let label = if m.size > MAX_LABEL_BYTES {
                Label::Dropped(format!(
                    "its label {} has {} bytes (a label has at most {MAX_LABEL_BYTES})",
                    m.name, m.size
                ))
            } else {
                let raw = r.read_data(MAX_LABEL_BYTES).map_err(|e| invalid(format!("member {}: {e}", m.name)))?;
                parse_label(&m.name, &raw)
            };
            labels.insert(key.to_string(), label);
        } else if let Some(kind) = TextKind::of_extension(&ext_l) {
            let text = TextMember {
                kind,
                member: m.name.clone(),
                offset: m.offset,
                length: m.size,
                fingerprint: m.fingerprint,
            };
            texts.entry(key.to_string()).or_default().push(text);
        } else if IMG_EXTENSIONS.contains(&ext_l.as_str()) {
            out.push(IndexEntry {
                key: key.to_string(),
                member: m.name.clone(),
                offset: m.offset,
                length: m.size,
                label: Label::Missing,
                fingerprint: m.fingerprint,
                texts: vec![],
            });
        }
    }
    note_unread(r.take_unread(), &mut out, &mut labels);
    let mut imaged = std::collections::HashSet::new();
    for e in &mut out {
        if e.label == Label::Missing {
            if let Some(l) = labels.get(&e.key) {
                e.label = l.clone();
            }
        }
        if let Some(t) = texts.get(&e.key) {
            e.texts = t.clone();
        }
        imaged.insert(e.key.clone());
    }
    // A caption or metadata without an image: listed, so that a pair loader's report counts it.
    let mut orphans: Vec<TextMember> =
        texts.into_iter().filter(|(k, _)| !imaged.contains(k)).filter_map(|(_, t)| t.into_iter().next()).collect();
    orphans.sort_by_key(|t| t.offset);
    for t in orphans {
        let key = split_key(&t.member).map(|(k, _)| k.to_string()).unwrap_or_default();
        out.push(IndexEntry {
            label: Label::Dropped(format!(
                "no image: the shard has {} but no image member {key}.jpg/.png/...",
                t.member
            )),
            key,
            member: t.member,
            offset: t.offset,
            length: t.length,
            fingerprint: t.fingerprint,
            texts: vec![],
        });
    }
    Ok(out)
}

/// Serialises an index for a shard of `shard_size` bytes.
///
/// Format 4 (`STKIDX4`), little-endian: magic, shard size (u64), entry count (u64), then per
/// entry: data offset, length and header fingerprint (u64 each), the member name (u32 length,
/// UTF-8), the label kind (u8: 0 integer, 1 class name, 2 missing, 3 dropped) and its value (an
/// i64 for an integer, a u32 length and UTF-8 text for a name or a reason, nothing for
/// missing), then the text members (u8 count; each: u8 kind, 0 `txt` or 1 `json`, data offset,
/// length and fingerprint, u64 each, and the member name); last, an xxh3 checksum of everything
/// before it (u64). Format 3 is format 4 without the text members.
pub fn encode_index(entries: &[IndexEntry], shard_size: u64) -> Vec<u8> {
    let mut b = MAGIC.to_vec();
    b.extend_from_slice(&shard_size.to_le_bytes());
    b.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    let text = |b: &mut Vec<u8>, t: &str| {
        b.extend_from_slice(&(t.len() as u32).to_le_bytes());
        b.extend_from_slice(t.as_bytes());
    };
    for e in entries {
        b.extend_from_slice(&e.offset.to_le_bytes());
        b.extend_from_slice(&e.length.to_le_bytes());
        b.extend_from_slice(&e.fingerprint.to_le_bytes());
        text(&mut b, &e.member);
        match &e.label {
            Label::Index(v) => {
                b.push(0);
                b.extend_from_slice(&v.to_le_bytes());
            }
            Label::Name(n) => {
                b.push(1);
                text(&mut b, n);
            }
            Label::Missing => b.push(2),
            Label::Dropped(why) => {
                b.push(3);
                text(&mut b, why);
            }
        }
        // At most a few per sample (`txt`, `json`, in any case): a shard with more is cut here.
        let texts = &e.texts[..e.texts.len().min(u8::MAX as usize)];
        b.push(texts.len() as u8);
        for t in texts {
            b.push(t.kind as u8);
            for v in [t.offset, t.length, t.fingerprint] {
                b.extend_from_slice(&v.to_le_bytes());
            }
            text(&mut b, &t.member);
        }
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// Parses an index (any format); returns the entries and the shard size it was made for. In
/// the first two formats a label of -1 meant "no `.cls`".
pub fn decode_index(b: &[u8], path: &Path) -> Result<(Vec<IndexEntry>, u64)> {
    let bad = |why: &str| Error::decode(path, format!("invalid shard index: {why}"));
    let version = match b.get(..8) {
        Some(m) if b.len() >= 32 && m == MAGIC_V1 => 1,
        Some(m) if b.len() >= 32 && m == MAGIC_V2 => 2,
        Some(m) if b.len() >= 32 && m == MAGIC_V3 => 3,
        Some(m) if b.len() >= 32 && m == MAGIC => 4,
        _ => return Err(bad("not a stoker index (bad magic)")),
    };
    let (body, sum) = b.split_at(b.len() - 8);
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(bad("checksum mismatch (corrupt or truncated index)"));
    }
    let mut pos: usize = 8;
    let mut take = |n: usize| -> Result<&[u8]> {
        let s = body.get(pos..pos.checked_add(n).ok_or_else(|| bad("truncated"))?).ok_or_else(|| bad("truncated"))?;
        pos += n;
        Ok(s)
    };
    let u64_of = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
    let u32_of = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes")) as usize;
    let utf8 = |s: &[u8], what: &str| String::from_utf8(s.to_vec()).map_err(|_| bad(&format!("{what} is not UTF-8")));
    let shard_size = u64_of(take(8)?);
    let count = u64_of(take(8)?) as usize;
    let mut out = Vec::with_capacity(count.min(body.len() / 29));
    for _ in 0..count {
        let offset = u64_of(take(8)?);
        let length = u64_of(take(8)?);
        let (member, label, fingerprint);
        if version < 3 {
            let l = u64_of(take(8)?) as i64;
            label = if l == -1 { Label::Missing } else { Label::Index(l) };
            fingerprint = if version == 1 { 0 } else { u64_of(take(8)?) };
            let n = u32_of(take(4)?);
            member = utf8(take(n)?, "member name")?;
        } else {
            fingerprint = u64_of(take(8)?);
            let n = u32_of(take(4)?);
            member = utf8(take(n)?, "member name")?;
            label = match take(1)?[0] {
                0 => Label::Index(u64_of(take(8)?) as i64),
                1 => {
                    let n = u32_of(take(4)?);
                    Label::Name(utf8(take(n)?, "a class name")?)
                }
                2 => Label::Missing,
                3 => {
                    let n = u32_of(take(4)?);
                    Label::Dropped(utf8(take(n)?, "a reason")?)
                }
                k => return Err(bad(&format!("unknown label kind {k}"))),
            };
        }
        let mut texts = vec![];
        if version >= 4 {
            for _ in 0..take(1)?[0] {
                let kind = match take(1)?[0] {
                    0 => TextKind::Txt,
                    1 => TextKind::Json,
                    k => return Err(bad(&format!("unknown text member kind {k}"))),
                };
                let (offset, length, fingerprint) = (u64_of(take(8)?), u64_of(take(8)?), u64_of(take(8)?));
                let n = u32_of(take(4)?);
                texts.push(TextMember { kind, member: utf8(take(n)?, "member name")?, offset, length, fingerprint });
            }
        }
        let key = split_key(&member).map(|(k, _)| k.to_string()).unwrap_or_else(|| member.clone());
        let inside = |offset: u64, length: u64| {
            offset >= tar::BLOCK as u64 && offset.checked_add(length).is_some_and(|end| end <= shard_size)
        };
        if !inside(offset, length) {
            return Err(bad(&format!("entry {member} lies outside the shard")));
        }
        if let Some(t) = texts.iter().find(|t| !inside(t.offset, t.length)) {
            return Err(bad(&format!("entry {} lies outside the shard", t.member)));
        }
        out.push(IndexEntry { key, member, offset, length, label, fingerprint, texts });
    }
    if pos != body.len() {
        return Err(bad("trailing bytes"));
    }
    Ok((out, shard_size))
}

/// Builds and writes the sidecar index of an existing shard, streaming it (memory for the
/// index, not for the shard); returns how many image members it indexed that are not dropped
/// already (whether one without a usable label is a sample is decided when the shards are
/// opened).
pub fn write_index(shard: &Path) -> Result<usize> {
    let file = std::fs::File::open(shard).map_err(|e| Error::io(shard, &e))?;
    let size = file.metadata().map_err(|e| Error::io(shard, &e))?.len();
    let entries = index_reader(file, size, shard)?;
    write_atomic(&index_path(shard), &encode_index(&entries, size))?;
    Ok(entries.iter().filter(|e| !matches!(e.label, Label::Dropped(_))).count())
}

/// Why a read of shard bytes failed.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    /// This read failed (the text says why).
    Failed(String),
    /// The storage is not answering (an object store whose circuit is open): every read
    /// would fail the same way, so the pass ends ([`Error::Unavailable`]).
    #[cfg_attr(not(feature = "remote"), allow(dead_code))]
    Unavailable(String),
}

impl From<String> for ReadFailure {
    fn from(why: String) -> Self {
        ReadFailure::Failed(why)
    }
}

/// Where shard bytes come from: local files, or objects in a store.
pub(crate) trait Storage: Send + Sync {
    /// Reads exactly `buf.len()` bytes of shard `shard` at `offset`.
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure>;
    /// Reads exactly `head.len() + data.len()` bytes of shard `shard` at `offset`, the first
    /// into `head` and the rest into `data`, in one request; `None` where the storage has no
    /// such read (the caller then reads into one buffer and moves the data).
    fn read_split_at(
        &self,
        shard: usize,
        offset: u64,
        head: &mut [u8],
        data: &mut [u8],
    ) -> Option<std::result::Result<(), ReadFailure>> {
        let _ = (shard, offset, head, data);
        None
    }
    /// The shard's name for messages (a path or a URL).
    fn name(&self, shard: usize) -> &str;
    /// Whether each read is a request worth saving (an object store): a sample's image and
    /// caption, close together in the shard, are then read in one request.
    fn coalesce(&self) -> bool {
        false
    }
    /// Gives up the reads in flight (see [`Source::abandon_reads`]).
    fn abandon_reads(&self) {}
    /// Where parts of shards are fetched from, and the counters of the requests, when reads
    /// are worth planning (an object store: [`super::readahead`]); local files need none.
    fn parts(&self) -> Option<(Arc<dyn PartFetch>, Arc<StorageStats>)> {
        None
    }
}

/// The message for a read that ended before the bytes the index promised.
fn short_read(e: &std::io::Error) -> String {
    format!("{e}: the shard is shorter than its index says (truncated?)")
}

struct LocalFiles {
    names: Vec<String>,
    files: Vec<std::fs::File>,
}

impl Storage for LocalFiles {
    fn read_at(&self, shard: usize, offset: u64, buf: &mut [u8]) -> std::result::Result<(), ReadFailure> {
        self.files[shard].read_exact_at(buf, offset).map_err(|e| {
            ReadFailure::Failed(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => short_read(&e),
                _ => e.to_string(),
            })
        })
    }

    /// One `preadv` into both buffers (repeated for what a short read left), so that a
    /// member's data lands where it is used without being moved past its tar header.
    #[cfg(target_os = "linux")]
    fn read_split_at(
        &self,
        shard: usize,
        offset: u64,
        head: &mut [u8],
        data: &mut [u8],
    ) -> Option<std::result::Result<(), ReadFailure>> {
        use std::os::fd::AsRawFd;
        let fd = self.files[shard].as_raw_fd();
        let total = head.len() + data.len();
        let mut done = 0;
        while done < total {
            let iov = |b: &mut [u8]| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() };
            let (vecs, count) = if done < head.len() {
                ([iov(&mut head[done..]), iov(&mut *data)], 2)
            } else {
                ([iov(&mut data[done - head.len()..]), iov(&mut [])], 1)
            };
            let Ok(at) = libc::off_t::try_from(offset + done as u64) else {
                return Some(Err(format!("offset {} is past what this system can read", offset + done as u64).into()));
            };
            // SAFETY: the first `count` iovecs point into `head` and `data`, which are
            // exclusively borrowed here and outlive the call; `fd` is an open file of `self`.
            let n = unsafe { libc::preadv(fd, vecs.as_ptr(), count, at) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Some(Err(e.to_string().into()));
            }
            if n == 0 {
                let e = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "failed to fill whole buffer");
                return Some(Err(short_read(&e).into()));
            }
            done += n as usize;
        }
        Some(Ok(()))
    }

    fn name(&self, shard: usize) -> &str {
        &self.names[shard]
    }
}

/// One shard's metadata for [`ShardSource::assemble`].
pub(crate) struct ShardMeta {
    /// Shard name (path or URL).
    pub name: String,
    /// Shard size in bytes.
    pub size: u64,
    /// Index name (path or URL) and its bytes, or why it could not be read.
    pub index: (String, std::result::Result<Vec<u8>, String>),
}

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
        let mut current: Option<(u32, u64)> = None;
        for &(k, offset, len, _) in &self.samples {
            let (start, end) = (offset - tar::BLOCK as u64, offset + u64::from(len));
            let fits = matches!(current, Some((shard, from)) if shard == k && end.saturating_sub(from) <= PART_BYTES);
            if !fits {
                self.part_sizes.push(0);
                current = Some((k, start));
            }
            *self.part_sizes.last_mut().expect("a part") += 1;
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

    fn plan_reads(&self, order: &[u32], budget: u64, lag: usize) {
        let Some((fetch, stats)) = self.storage.parts() else { return };
        let needs: Vec<Need> = order
            .iter()
            .map(|&i| {
                let i = i as usize;
                Need { part: self.part_of[i], shard: self.samples[i].0, bytes: self.span(i) }
            })
            .collect();
        let plan = Readahead::new(&needs, budget, lag, fetch, stats).map(Arc::new);
        let old = std::mem::replace(&mut *self.readahead.write().unwrap_or_else(|p| p.into_inner()), plan);
        if let Some(old) = old {
            old.stop();
        }
    }

    fn storage_report(&self) -> Option<StorageReport> {
        self.storage.parts().map(|(_, stats)| stats.report())
    }

    fn describe(&self, i: usize) -> PathBuf {
        let (k, ..) = self.samples[i];
        PathBuf::from(format!("{}:{}", self.storage.name(k as usize), self.member(i)))
    }
}

/// Expands `*` and `?` in the last component of `pattern` (sorted); a plain path is returned
/// as is.
pub fn expand_glob(pattern: &Path) -> Result<Vec<PathBuf>> {
    let name = pattern.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !name.contains(['*', '?']) {
        return Ok(vec![pattern.to_path_buf()]);
    }
    let dir = pattern.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut out = vec![];
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Dataset(format!("{}: cannot list: {e}", dir.display())))?;
    for e in rd.flatten() {
        if glob_match(&name, &e.file_name().to_string_lossy()) {
            out.push(e.path());
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::Dataset(format!("no file matches {}", pattern.display())));
    }
    Ok(out)
}

/// `*` and `?` matching of one name.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn m(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], s) || (!s.is_empty() && m(p, &s[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &s[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), name.as_bytes())
}

#[cfg(test)]
mod tests {
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
