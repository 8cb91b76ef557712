//! The sidecar index of a tar shard (`SHARD.tar.idx`): key, byte offset, length, label and
//! tar-header fingerprint of every image member, and its text members, plus the shard's size
//! and a checksum of the index itself; made by streaming the shard's headers
//! ([`index_reader`]), written under a temporary name and renamed into place
//! ([`write_atomic`]). Formats 1 to 4 are read; format 4 is written.
//!
//! Owns: the index's format and the indexing of a tar stream. May not touch: reading samples
//! (see [`super::shards`]).

use super::tar;
use super::{TextKind, IMG_EXTENSIONS};
use crate::error::{Error, Result};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The first index format (no header fingerprints).
pub(crate) const MAGIC_V1: &[u8; 8] = b"STKIDX1\0";
/// The second format (fingerprints; labels as integers, -1 for none).
pub(crate) const MAGIC_V2: &[u8; 8] = b"STKIDX2\0";
/// The third format (labels as [`Label`], no text members).
pub(crate) const MAGIC_V3: &[u8; 8] = b"STKIDX3\0";
/// The index format written now (text members beside each image).
pub(crate) const MAGIC: &[u8; 8] = b"STKIDX4\0";

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
pub(crate) fn split_key(name: &str) -> Option<(&str, &str)> {
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
