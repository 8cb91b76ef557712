//! The automatic token cache (`TokenLoader(cache="ram" | DIR)`): each document is tokenized
//! once; later epochs, and other processes on the host reading the same files with the same
//! tokenizer, read its tokens instead of reading, parsing and tokenizing its text.
//!
//! Lifecycle: the cache is a group of [`crate::shell::store`] (kind `t`), one per dataset and
//! tokenizer: `ROOT/t1-SETTINGS-DATASET/`, `SETTINGS` a hash of the tokenizer's JSON, the text
//! key and the token width, `DATASET` one of every file's identity (path, length, mtime, inode,
//! a hash of its first and last 64 KiB) and its document index. It shares the root, the byte
//! budget, the eviction of idle groups, the time to live and `stoker cache` with the
//! decoded-pixel cache.
//!
//! Entries: each process appends to segments of its own, `seg-PID-NANOS.tok` (token ids,
//! little-endian `u16` or `u32`, a document's back to back) and `seg-PID-NANOS.idx` (40-byte
//! records: document, byte offset in the `.tok`, token count, the xxh3 of those token bytes,
//! then an xxh3 of the first 32 bytes). Tokens are written before the records that point at
//! them, in batches of about 1 MiB reserved from the budget first; a record is trusted only
//! when its checksum holds and it points inside its `.tok`, and the tokens are checked against
//! their hash when read, so a torn write or flipped bytes are a miss (counted), never wrong
//! ids. Segments are read again at each epoch's start: what other processes stored meanwhile
//! becomes hits. Tokens are stored without the BOS/EOS a loader adds; documents that failed or
//! were too long are never stored.

use super::corpus::DocSource;
use super::docs::Format;
use crate::error::{Error, Result};
use crate::shell::store::{DatasetKey, StoreSpec};
use crate::shell::store::{Group, GroupKind, GroupReport};
use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, RwLock};

/// The entry format version (the group kind's version).
const VERSION: u32 = 1;
/// Bytes of one index record.
const RECORD: usize = 40;
/// Bytes of tokens gathered before they are written (one budget reservation each).
const FLUSH_BYTES: usize = 1 << 20;
/// Tokens of the longest document stored (its count must fit a record's `u32`).
const MAX_TOKENS: usize = u32::MAX as usize;

/// Where one document's tokens are.
#[derive(Debug, Clone, Copy)]
struct Loc {
    /// Segment number, `u32::MAX` when the document is not cached.
    seg: u32,
    tokens: u32,
    offset: u64,
    sum: u64,
}

const NONE: Loc = Loc { seg: u32::MAX, tokens: 0, offset: 0, sum: 0 };

/// A segment as read so far.
#[derive(Debug)]
struct Segment {
    name: String,
    tok: File,
    /// Bytes of its `.idx` consumed (whole, valid records).
    read: u64,
    /// A record failed its checks: nothing after it is trusted.
    dead: bool,
}

#[derive(Debug, Default)]
struct Index {
    locs: Vec<Loc>,
    segs: Vec<Segment>,
    cached: u64,
}

/// This process's own segment, and what waits to be written to it.
#[derive(Debug, Default)]
struct Writer {
    seg: Option<(File, File, u64, u32)>,
    tok: Vec<u8>,
    idx: Vec<(u64, u64, u32, u64)>,
    pending: HashSet<u64>,
}

/// What the token cache did: the `cache` field of the token loader's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TokenCacheReport {
    /// What the group did (hits and misses are documents; stores, bytes, evictions, lock
    /// time-outs).
    #[serde(flatten)]
    pub group: GroupReport,
    /// Documents of this dataset with tokens in the cache (as last read).
    pub documents_cached: u64,
    /// Documents of the dataset.
    pub documents: u64,
}

/// The token cache of one loader: its group, the index of what is stored, the writer.
#[derive(Debug)]
pub struct TokenCache {
    group: Group,
    width: u8,
    index: RwLock<Index>,
    writer: Mutex<Writer>,
}

/// What decides the stored tokens: another value is another group.
fn settings_text(tokenizer_hash: u64, text_key: &str, width: u8) -> String {
    format!("stoker-tokens v{VERSION} tokenizer={tokenizer_hash:016x} text_key={text_key:?} uint{}", width * 8)
}

/// The identity of `source`'s files and documents: a changed file is another dataset.
fn dataset_key(source: &DocSource) -> Result<DatasetKey> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for (f, format) in source.files.iter().zip(&source.formats) {
        h.update(f.path.as_os_str().as_encoded_bytes());
        h.update(&[0]);
        h.update(format!("{format:?}").as_bytes());
        h.update(&f.bytes.to_le_bytes());
        if !crate::source::is_url(&f.path) {
            h.update(&super::index::identity(&f.path)?.to_le_bytes());
        }
        h.update(&(f.docs.len() as u64).to_le_bytes());
        for d in &f.docs {
            h.update(&d.offset.to_le_bytes());
            h.update(&d.len.to_le_bytes());
        }
    }
    let first = source.files.first().map(|f| f.path.display().to_string()).unwrap_or_default();
    let description = match source.files.len() {
        1 => first,
        n => format!("{first} and {} more files", n - 1),
    };
    Ok(DatasetKey { hash: h.digest(), samples: source.len() as usize, description })
}

fn encode_record(doc: u64, offset: u64, tokens: u32, sum: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[0..8].copy_from_slice(&doc.to_le_bytes());
    r[8..16].copy_from_slice(&offset.to_le_bytes());
    r[16..20].copy_from_slice(&tokens.to_le_bytes());
    r[24..32].copy_from_slice(&sum.to_le_bytes());
    let check = xxhash_rust::xxh3::xxh3_64(&r[..32]);
    r[32..40].copy_from_slice(&check.to_le_bytes());
    r
}

/// A record's fields, if its checksum holds.
fn decode_record(r: &[u8]) -> Option<(u64, u64, u32, u64)> {
    let u64_at = |o: usize| u64::from_le_bytes(r[o..o + 8].try_into().expect("8 bytes"));
    if r.len() != RECORD || u64_at(32) != xxhash_rust::xxh3::xxh3_64(&r[..32]) || r[20..24] != [0; 4] {
        return None;
    }
    Some((u64_at(0), u64_at(8), u32::from_le_bytes(r[16..20].try_into().expect("4 bytes")), u64_at(24)))
}

impl TokenCache {
    /// Opens (creating it) the group of `source` tokenized by the tokenizer of `tokenizer_hash`
    /// into ids of `width` bytes, under `spec`, and reads what it holds.
    pub fn open(spec: &StoreSpec, source: &DocSource, tokenizer_hash: u64, text_key: &str, width: u8) -> Result<Self> {
        if matches!(source.format, Format::Tokens(_) | Format::Cache(_)) {
            return Err(Error::config("cache", "token files are already tokens: a token cache is for text"));
        }
        let kind = GroupKind { letter: 't', version: VERSION };
        let settings = settings_text(tokenizer_hash, text_key, width);
        let group = Group::open(&spec.location, spec.bytes, spec.ttl, kind, &settings, &dataset_key(source)?)?;
        let n = usize::try_from(source.len()).map_err(|_| Error::config("data", "too many documents"))?;
        let cache = TokenCache {
            group,
            width,
            index: RwLock::new(Index { locs: vec![NONE; n], segs: Vec::new(), cached: 0 }),
            writer: Mutex::default(),
        };
        cache.refresh();
        Ok(cache)
    }

    /// Bytes per stored token.
    pub fn width(&self) -> u8 {
        self.width
    }

    /// Writes what waits, then reads the records every segment gained since the last call
    /// (this process's and others'): documents stored meanwhile become hits.
    pub fn refresh(&self) {
        self.flush();
        let mut ix = self.index.write().unwrap_or_else(|p| p.into_inner());
        let Ok(rd) = std::fs::read_dir(self.group.dir()) else { return };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_suffix(".idx")).map(str::to_string))
            .filter(|n| n.starts_with("seg-"))
            .collect();
        names.sort();
        for name in names {
            if ix.segs.iter().any(|s| s.name == name) {
                continue;
            }
            let Ok(tok) = open_read(&self.group.dir().join(format!("{name}.tok"))) else { continue };
            ix.segs.push(Segment { name, tok, read: 0, dead: false });
        }
        let width = u64::from(self.width);
        for k in 0..ix.segs.len() {
            if ix.segs[k].dead {
                continue;
            }
            let idx_path = self.group.dir().join(format!("{}.idx", ix.segs[k].name));
            let Ok(idx) = open_read(&idx_path) else { continue };
            let (Ok(ilen), Ok(tlen)) = (idx.metadata().map(|m| m.len()), ix.segs[k].tok.metadata().map(|m| m.len()))
            else {
                continue;
            };
            let from = ix.segs[k].read;
            let whole = (ilen.saturating_sub(from) / RECORD as u64) * RECORD as u64;
            if whole == 0 {
                continue;
            }
            let mut buf = vec![0u8; whole as usize];
            if idx.read_exact_at(&mut buf, from).is_err() {
                continue;
            }
            let mut used = 0u64;
            for r in buf.chunks_exact(RECORD) {
                let Some((doc, offset, tokens, sum)) = decode_record(r) else {
                    ix.segs[k].dead = true;
                    break;
                };
                let end = u64::from(tokens).checked_mul(width).and_then(|b| b.checked_add(offset));
                if end.is_none_or(|e| e > tlen) || offset % width != 0 {
                    ix.segs[k].dead = true;
                    break;
                }
                used += RECORD as u64;
                let Ok(d) = usize::try_from(doc) else { continue };
                if let Some(l) = ix.locs.get(d).copied() {
                    if l.seg == u32::MAX {
                        ix.locs[d] = Loc { seg: k as u32, tokens, offset, sum };
                        ix.cached += 1;
                    }
                }
            }
            ix.segs[k].read += used;
        }
    }

    /// Reads document `doc`'s tokens into `buf` (their bytes, `width` each) if it is cached and
    /// they pass their hash; counts a hit, or a miss (the caller reads and tokenizes the text).
    pub fn get(&self, doc: u64, buf: &mut Vec<u8>) -> bool {
        let ix = self.index.read().unwrap_or_else(|p| p.into_inner());
        let loc = usize::try_from(doc).ok().and_then(|d| ix.locs.get(d)).copied().unwrap_or(NONE);
        if loc.seg == u32::MAX {
            drop(ix);
            self.group.counters.misses.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let n = loc.tokens as usize * self.width as usize;
        buf.clear();
        buf.resize(n, 0);
        let ok = ix.segs[loc.seg as usize].tok.read_exact_at(buf, loc.offset).is_ok()
            && xxhash_rust::xxh3::xxh3_64(buf) == loc.sum;
        drop(ix);
        if ok {
            self.group.counters.hits.fetch_add(1, Ordering::Relaxed);
            self.group.counters.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
            return true;
        }
        self.group.counters.verify_failures.fetch_add(1, Ordering::Relaxed);
        self.group.counters.misses.fetch_add(1, Ordering::Relaxed);
        let mut ix = self.index.write().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = ix.locs.get_mut(doc as usize) {
            *l = NONE;
            ix.cached -= 1;
        }
        buf.clear();
        false
    }

    /// Stores document `doc`'s `tokens` (without BOS/EOS), unless it is cached or waiting
    /// already; written with others once about 1 MiB waits.
    pub fn put(&self, doc: u64, tokens: &[u32]) {
        if tokens.len() > MAX_TOKENS {
            return;
        }
        {
            let ix = self.index.read().unwrap_or_else(|p| p.into_inner());
            if usize::try_from(doc).ok().and_then(|d| ix.locs.get(d)).is_none_or(|l| l.seg != u32::MAX) {
                return;
            }
        }
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if !w.pending.insert(doc) {
            return;
        }
        let start = w.tok.len() as u64;
        if self.width == 2 {
            // Ids fit: the width is 2 only for vocabularies of at most 2^16 tokens.
            w.tok.extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes()));
        } else {
            w.tok.extend(tokens.iter().flat_map(|&t| t.to_le_bytes()));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&w.tok[start as usize..]);
        w.idx.push((doc, start, tokens.len() as u32, sum));
        if w.tok.len() >= FLUSH_BYTES {
            self.write_out(&mut w);
        }
    }

    /// Writes what waits.
    pub fn flush(&self) {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        self.write_out(&mut w);
    }

    fn write_out(&self, w: &mut Writer) {
        if w.idx.is_empty() {
            return;
        }
        let docs = w.idx.len() as u64;
        let bytes = (w.tok.len() + w.idx.len() * RECORD) as u64;
        let (tok, idx) = (std::mem::take(&mut w.tok), std::mem::take(&mut w.idx));
        w.pending.clear();
        match self.group.reserve(bytes) {
            Some(true) => {}
            Some(false) => {
                self.group.counters.not_stored_budget.fetch_add(docs, Ordering::Relaxed);
                return;
            }
            None => return, // counted in lock_timeouts
        }
        let written = (|| -> std::io::Result<Vec<(u64, u64, u32, u64)>> {
            if w.seg.is_none() {
                let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                let name = format!("seg-{}-{}-{}", std::process::id(), t.as_nanos(), self.group.next_seq());
                let tok = create(&self.group.dir().join(format!("{name}.tok")))?;
                let idx = create(&self.group.dir().join(format!("{name}.idx")))?;
                w.seg = Some((tok, idx, 0, 0));
            }
            let (tf, xf, base, _) = w.seg.as_mut().expect("opened above");
            tf.write_all(&tok)?;
            let mut recs = Vec::with_capacity(idx.len() * RECORD);
            let placed: Vec<_> = idx.iter().map(|&(d, o, n, s)| (d, *base + o, n, s)).collect();
            for &(d, o, n, s) in &placed {
                recs.extend_from_slice(&encode_record(d, o, n, s));
            }
            xf.write_all(&recs)?;
            *base += tok.len() as u64;
            Ok(placed)
        })();
        match written {
            Ok(_) => {
                self.group.counters.stored.fetch_add(docs, Ordering::Relaxed);
                self.group.counters.stored_bytes.fetch_add(bytes, Ordering::Relaxed);
            }
            Err(_) => {
                // A segment that failed part-way is abandoned: its records stay consistent with
                // what reached its `.tok` (readers check every record against it).
                w.seg = None;
                self.group.unreserve(bytes);
                self.group.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The counters of this process.
    pub fn report(&self) -> TokenCacheReport {
        let ix = self.index.read().unwrap_or_else(|p| p.into_inner());
        TokenCacheReport { group: self.group.report(), documents_cached: ix.cached, documents: ix.locs.len() as u64 }
    }

    /// The group's directory.
    pub fn dir(&self) -> PathBuf {
        self.group.dir().to_path_buf()
    }
}

impl Drop for TokenCache {
    fn drop(&mut self) {
        self.flush();
    }
}

fn open_read(p: &std::path::Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(p)
}

fn create(p: &std::path::Path) -> std::io::Result<File> {
    let f =
        std::fs::OpenOptions::new().append(true).create_new(true).mode(0o644).custom_flags(libc::O_NOFOLLOW).open(p)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_flipped_bits() {
        let r = encode_record(7, 4096, 300, 0xdead_beef);
        assert_eq!(decode_record(&r), Some((7, 4096, 300, 0xdead_beef)));
        for bit in [0, 70, 130, 200, 300] {
            let mut bad = r;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_record(&bad), None, "bit {bit}");
        }
        assert_eq!(decode_record(&r[..39]), None);
    }
}
