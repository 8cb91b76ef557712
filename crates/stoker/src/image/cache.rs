//! The decoded-pixel cache: decode each image once, within a byte budget that datasets share.
//!
//! Decoding is the floor of per-image CPU, and every epoch pays it again for the same pixels.
//! With a cache, the first time an image is decoded its full-resolution RGB8 pixels (after EXIF
//! orientation) are written to a file of their own; later epochs (and other processes on the
//! host) read the rows of that file a crop needs and skip decoding. The files live in the page
//! cache (on tmpfs for `ram`), so processes sharing a cache share one copy of its pixels; each
//! process copies only the rows of the sample in hand into a reused buffer. (Mapping each entry
//! instead was measured slower: a map and unmap per sample, with its page-table and TLB work in
//! a multi-threaded process.) With a `max_side`, images whose longer side exceeds it are stored
//! reduced to it instead (DCT-scaled decoding, then the antialiased resampler): smaller entries
//! and cheaper later epochs, at the price of pixels that differ from a full-resolution decode.
//!
//! Lifecycle: the cache is a group of [`crate::shell::store`] (kind `v`): one group per dataset
//! and pixel settings, `ROOT/v3-SETTINGS-DATASET/`, where `SETTINGS` hashes what decides the
//! pixels (entry format, EXIF orientation, `max_side`) and `DATASET` the dataset's sample list
//! (paths and labels); the byte budget shared with every other group under the root (token
//! groups included), eviction of idle groups, time to live, locks with deadlines and
//! `stoker cache` are the store's.
//!
//! Entries: `GROUP/KK/KEY.px`, `KEY` the 128-bit xxh3 hash of the encoded file's bytes
//! (content-addressed: a changed source file has another key, so stale pixels are never served).
//! An entry is an 80-byte header (magic, version, channels, the stored width and height, the
//! source image's width and height, payload length, the content hash, the decode time, the rows
//! per checksum chunk, then an xxh3 checksum of those 72 bytes), a table of xxh3 checksums, one
//! per chunk of rows (about 64 KiB each), and the pixels. A reader checks the whole header
//! (against the key, `max_pixels` and the file's length) before reading, and verifies every
//! chunk it reads: a crop reads the chunks that hold its rows, so flipped bytes anywhere in what
//! it uses are caught. Anything that does not match is a miss: the entry is discarded, decoded
//! again and rewritten (`replaced`, `verify_failures`). Entries are written to a temporary name
//! and renamed into place, so a crash leaves no partial entry under a real name; published
//! entries are never modified in place, so an open entry stays valid while it is used.

use crate::error::Result;
pub use crate::shell::store::{
    clear, list_groups, ram_root, CacheLocation, Cleared, DatasetKey, GroupInfo, Ttl, LOCK_DEADLINE, RAM_TTL,
};
use crate::shell::store::{Group, GroupKind, GroupReport, StoreSpec};
use crate::values::check_positive;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The cache arguments: where, and how many bytes at most (`None`: the default budget).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheSpec {
    /// Where entries are stored.
    pub location: CacheLocation,
    /// The byte budget (`None`: a quarter of `MemAvailable` for `ram`, half the free space of
    /// the file system for a directory; both capped by the file system's free space).
    pub bytes: Option<u64>,
    /// Store images whose longer side exceeds this reduced to it (`None`: full resolution,
    /// bit-identical batches).
    pub max_side: Option<usize>,
    /// How long an idle group is kept (`None`: the location's default, [`RAM_TTL`] for `ram`,
    /// forever for a directory); `stoker::args` reads it from `STOKER_CACHE_TTL`.
    #[serde(default)]
    pub ttl: Option<Ttl>,
}

impl CacheSpec {
    /// The store's part of the spec (where, how many bytes, how long).
    pub fn store(&self) -> StoreSpec {
        StoreSpec { location: self.location.clone(), bytes: self.bytes, ttl: self.ttl }
    }
}

const MAGIC: [u8; 8] = *b"STKPIX\0\x01";
const VERSION: u32 = 3;
/// Bytes before the checksum table.
pub const HEADER: usize = 80;
const CHANNELS: u32 = 3;
/// Bytes of pixels one checksum covers, about (whole rows, at least one).
const CHUNK_BYTES: usize = 64 << 10;

/// Counters of one cache in one process, besides its group's ([`crate::shell::store::GroupCounters`]).
#[derive(Debug, Default)]
struct Stats {
    replaced: AtomicU64,
    saved_ns: AtomicU64,
    lookup_ns: AtomicU64,
    fill_ns: AtomicU64,
}

/// What the cache did: the `cache` field of the loader's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheReport {
    /// What the group did (hits, misses, stores, bytes, evictions, lock time-outs).
    #[serde(flatten)]
    pub group: GroupReport,
    /// Bytes held under the root by the groups of other datasets or settings.
    pub other_groups_bytes: u64,
    /// Of those, bytes of groups in use by a live process (they cannot be evicted): when a
    /// miss could not be stored for want of room, what other datasets held at that moment.
    pub held_by_others_bytes: u64,
    /// The longer side entries are reduced to (`None`: full resolution).
    pub max_side: Option<usize>,
    /// Entries that failed their checks (truncated, corrupt, foreign) and were replaced.
    pub replaced: u64,
    /// Decode time the hits did not spend: the sum of the decode times recorded in their
    /// entries when they were filled (by whichever process filled them).
    pub decode_seconds_saved: f64,
    /// Time spent finding, checking and opening entries (hashing the file's bytes included).
    pub lookup_seconds: f64,
    /// Time spent writing entries.
    pub fill_seconds: f64,
}

/// An open cache group shared by the decode threads of a loader.
#[derive(Debug)]
pub struct Cache {
    group: Group,
    max_side: Option<usize>,
    stats: Stats,
}

/// What decides an entry's pixels; another value is another group.
fn settings_text(apply_exif: bool, max_side: Option<usize>) -> String {
    let size = match max_side {
        None => "full-resolution".to_string(),
        Some(m) => format!("max-side={m} dct-scaled+bilinear-antialiased"),
    };
    format!("stoker-pixels v{VERSION} rgb8 {size} exif={apply_exif}")
}

/// An open, checked entry: the pixels of one image, read and verified on demand.
#[derive(Debug)]
pub struct Entry {
    file: File,
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Width of the source image (after orientation) these pixels were made from; equal to
    /// `width` unless the entry was reduced to the cache's `max_side`.
    pub source_width: usize,
    /// Height of the source image (after orientation).
    pub source_height: usize,
    decode_ns: u64,
    rows_per_chunk: usize,
    sums: Vec<u64>,
    len: u64,
    ino: u64,
}

/// A parsed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    width: u32,
    height: u32,
    source_width: u32,
    source_height: u32,
    payload: u64,
    key: u128,
    decode_ns: u64,
    rows_per_chunk: u32,
}

/// Rows per checksum chunk for an image `width` pixels wide.
fn rows_per_chunk(width: usize) -> u32 {
    u32::try_from((CHUNK_BYTES / (width * CHANNELS as usize).max(1)).max(1)).unwrap_or(u32::MAX)
}

fn chunks(h: &Header) -> u64 {
    u64::from(h.height).div_ceil(u64::from(h.rows_per_chunk.max(1)))
}

fn encode_header(h: &Header) -> [u8; HEADER] {
    let mut b = [0u8; HEADER];
    b[0..8].copy_from_slice(&MAGIC);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&CHANNELS.to_le_bytes());
    b[16..20].copy_from_slice(&h.width.to_le_bytes());
    b[20..24].copy_from_slice(&h.height.to_le_bytes());
    b[24..28].copy_from_slice(&h.source_width.to_le_bytes());
    b[28..32].copy_from_slice(&h.source_height.to_le_bytes());
    b[32..40].copy_from_slice(&h.payload.to_le_bytes());
    b[40..56].copy_from_slice(&h.key.to_le_bytes());
    b[56..64].copy_from_slice(&h.decode_ns.to_le_bytes());
    b[64..68].copy_from_slice(&h.rows_per_chunk.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..72]);
    b[72..80].copy_from_slice(&sum.to_le_bytes());
    b
}

/// Checks a header read from an entry file of `file_len` bytes expected to hold `key`; every
/// size in it is untrusted.
fn check_header(b: &[u8; HEADER], key: u128, file_len: u64, max_pixels: u64) -> Option<Header> {
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    if b[0..8] != MAGIC || u32_at(8) != VERSION || u32_at(12) != CHANNELS {
        return None;
    }
    if u64_at(72) != xxhash_rust::xxh3::xxh3_64(&b[..72]) || b[68..72] != [0; 4] {
        return None;
    }
    let h = Header {
        width: u32_at(16),
        height: u32_at(20),
        source_width: u32_at(24),
        source_height: u32_at(28),
        payload: u64_at(32),
        key: u128::from_le_bytes(b[40..56].try_into().expect("16 bytes")),
        decode_ns: u64_at(56),
        rows_per_chunk: u32_at(64),
    };
    let pixels = u64::from(h.width) * u64::from(h.height);
    let source_pixels = u64::from(h.source_width) * u64::from(h.source_height);
    if h.width == 0 || h.height == 0 || h.width > h.source_width || h.height > h.source_height {
        return None;
    }
    if source_pixels > max_pixels || h.key != key || h.rows_per_chunk != rows_per_chunk(h.width as usize) {
        return None;
    }
    let payload = pixels.checked_mul(CHANNELS as u64)?;
    let table = chunks(&h).checked_mul(8)?;
    if payload != h.payload || payload.checked_add(HEADER as u64)?.checked_add(table)? != file_len {
        return None;
    }
    Some(h)
}

/// The checksums of `pixels` (rows of `row` bytes), one per chunk of `rows_per_chunk` rows.
fn chunk_sums(pixels: &[u8], row: usize, rows_per_chunk: usize) -> Vec<u64> {
    pixels.chunks((row * rows_per_chunk).max(1)).map(xxhash_rust::xxh3::xxh3_64).collect()
}

impl Cache {
    /// Opens (creating it if needed) the group of `dataset` in the cache `spec`, for images
    /// decoded with `apply_exif`; idle groups past their time to live are removed. Errors are
    /// [`crate::Error::Config`] naming `cache` (a directory that cannot be made or written),
    /// `cache_max_side` or `STOKER_CACHE_TTL`.
    pub fn open(spec: &CacheSpec, apply_exif: bool, dataset: &DatasetKey) -> Result<Self> {
        if let Some(m) = spec.max_side {
            check_positive("cache_max_side", m)?;
        }
        let settings = settings_text(apply_exif, spec.max_side);
        let kind = GroupKind { letter: 'v', version: VERSION };
        let group = Group::open(&spec.location, spec.bytes, spec.ttl, kind, &settings, dataset)?;
        Ok(Cache { group, max_side: spec.max_side, stats: Stats::default() })
    }

    /// The directory holding this dataset's entries (its group).
    pub fn dir(&self) -> &std::path::Path {
        self.group.dir()
    }

    /// The cache root, shared by every group.
    pub fn root(&self) -> &std::path::Path {
        self.group.root()
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.group.budget()
    }

    /// The longer side entries are reduced to (`None`: full resolution).
    pub fn max_side(&self) -> Option<usize> {
        self.max_side
    }

    /// The size an image of `width` x `height` is stored at: itself, or scaled so that its
    /// longer side is `max_side` (each side rounded, at least 1) when it is longer.
    pub fn stored_size(&self, width: usize, height: usize) -> (usize, usize) {
        match self.max_side {
            Some(m) if width.max(height) > m => {
                let s = m as f64 / width.max(height) as f64;
                let side = |v: usize| ((v as f64 * s).round() as usize).clamp(1, m);
                (side(width), side(height))
            }
            _ => (width, height),
        }
    }

    /// The key of an encoded file: the 128-bit xxh3 of its bytes.
    pub fn key(data: &[u8]) -> u128 {
        xxhash_rust::xxh3::xxh3_128(data)
    }

    fn path(&self, key: u128) -> PathBuf {
        let hex = format!("{key:032x}");
        self.group.dir().join(&hex[..2]).join(format!("{hex}.px"))
    }

    /// The entry file of `key` (for tests and tools).
    pub fn entry_path(&self, key: u128) -> PathBuf {
        self.path(key)
    }

    /// Looks `key` up. `None` is a miss: no entry, or one that fails its checks (a truncated,
    /// corrupt or foreign file, or one over `max_pixels`); never an error.
    pub fn get(&self, key: u128, max_pixels: u64, spent: Duration) -> Option<Entry> {
        let t0 = std::time::Instant::now();
        let e = self.open_entry(key, max_pixels);
        let ns = (t0.elapsed() + spent).as_nanos() as u64;
        self.stats.lookup_ns.fetch_add(ns, Ordering::Relaxed);
        match &e {
            Some(e) => {
                self.group.counters.hits.fetch_add(1, Ordering::Relaxed);
                self.stats.saved_ns.fetch_add(e.decode_ns, Ordering::Relaxed);
            }
            None => {
                self.group.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        e
    }

    fn open_entry(&self, key: u128, max_pixels: u64) -> Option<Entry> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(self.path(key))
            .ok()?;
        let meta = f.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        let mut b = [0u8; HEADER];
        f.read_exact_at(&mut b, 0).ok()?;
        let h = check_header(&b, key, meta.len(), max_pixels)?;
        // The table is at most a few KiB: `chunks` is bounded by the checked file length.
        let mut table = vec![0u8; usize::try_from(chunks(&h) * 8).ok()?];
        f.read_exact_at(&mut table, HEADER as u64).ok()?;
        let sums = table.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Some(Entry {
            file: f,
            width: h.width as usize,
            height: h.height as usize,
            source_width: h.source_width as usize,
            source_height: h.source_height as usize,
            decode_ns: h.decode_ns,
            rows_per_chunk: h.rows_per_chunk as usize,
            sums,
            len: meta.len(),
            ino: meta.ino(),
        })
    }

    /// Reads rows `rows.start..rows.end` (clamped to the image) of `entry` and returns them,
    /// `width * 3` bytes per row, verified: the whole checksum chunks holding them are read
    /// into `buf` (a buffer the caller reuses; no mapping, so no page-table and TLB work per
    /// sample) and checked. A short read (the file was truncated since it was checked) or a
    /// checksum that does not match is an error; the caller then [`Cache::discard`]s the entry.
    pub fn read_rows<'a>(
        &self,
        entry: &Entry,
        rows: std::ops::Range<usize>,
        buf: &'a mut Vec<u8>,
    ) -> std::io::Result<&'a [u8]> {
        let (y0, y1) = (rows.start.min(entry.height), rows.end.min(entry.height));
        let row = entry.width * 3;
        let per = entry.rows_per_chunk.max(1);
        let (c0, c1) = (y0 / per, y1.div_ceil(per));
        let (r0, r1) = (c0 * per, (c1 * per).min(entry.height));
        let n = r1.saturating_sub(r0) * row;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        let table = entry.sums.len() * 8;
        entry.file.read_exact_at(&mut buf[..n], (HEADER + table + r0 * row) as u64)?;
        for (k, chunk) in buf[..n].chunks(per * row).enumerate() {
            if entry.sums.get(c0 + k) != Some(&xxhash_rust::xxh3::xxh3_64(chunk)) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("rows {}.. of the cache entry fail their checksum", (c0 + k) * per),
                ));
            }
        }
        self.group.counters.read_bytes.fetch_add(((y1 - y0) * row) as u64, Ordering::Relaxed);
        Ok(&buf[(y0 - r0) * row..(y1 - r0) * row])
    }

    /// Drops an entry that failed when read (its pixels did not match their checksums, or it
    /// was truncated): the file is removed (if it is still the one that was opened) and its
    /// bytes are given back to the budget, so that the miss that follows rewrites it.
    pub fn discard(&self, entry: &Entry, key: u128) {
        // The lookup counted a hit; the sample is decoded after all.
        self.group.counters.hits.fetch_sub(1, Ordering::Relaxed);
        self.group.counters.misses.fetch_add(1, Ordering::Relaxed);
        self.stats.saved_ns.fetch_sub(entry.decode_ns, Ordering::Relaxed);
        self.group.counters.verify_failures.fetch_add(1, Ordering::Relaxed);
        self.group.remove_entry(&self.path(key), entry.ino, entry.len);
    }

    /// Whether an entry of `pixel_bytes` for `key` could still be stored: this dataset's bytes
    /// leave room for it within the budget (idle groups of other datasets can be evicted), or a
    /// (bad) entry under this key would be replaced. When it could not, the miss is counted in
    /// `not_stored_budget` and the caller need not decode the whole image. A `true` may still
    /// end in a refusal by [`Cache::put`] when groups in use, or other threads, hold the room.
    pub fn may_store(&self, key: u128, width: usize, height: usize) -> bool {
        let total = Self::entry_bytes(width, height);
        if self.used().saturating_add(total) <= self.group.budget() || self.path(key).symlink_metadata().is_ok() {
            return true;
        }
        self.group.counters.not_stored_budget.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// The size of the entry file of a `width` x `height` image: header, checksum table and
    /// pixels.
    pub fn entry_bytes(width: usize, height: usize) -> u64 {
        let table = 8 * height.div_ceil(rows_per_chunk(width) as usize) as u64;
        let pixels = (width as u64).saturating_mul(height as u64).saturating_mul(u64::from(CHANNELS));
        (HEADER as u64).saturating_add(table).saturating_add(pixels)
    }

    /// Bytes stored in this dataset's group by all processes.
    pub fn used(&self) -> u64 {
        self.group.used()
    }

    /// Stores the `width` x `height` RGB8 `pixels` of the file with `key`, made in `decode`
    /// from a source image of `source = (width, height)` (see [`Cache::stored_size`]), if the
    /// budget allows. A failure to write is counted, never an error.
    pub fn put(&self, key: u128, pixels: &[u8], width: usize, height: usize, source: (usize, usize), decode: Duration) {
        let t0 = std::time::Instant::now();
        let dims = [width, height, source.0, source.1].map(u32::try_from);
        let [Ok(width32), Ok(height32), Ok(source_width), Ok(source_height)] = dims else {
            self.group.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let per = rows_per_chunk(width);
        let sums = chunk_sums(pixels, width * 3, per as usize);
        let path = self.path(key);
        let total = (HEADER + sums.len() * 8 + pixels.len()) as u64;
        let existing = std::fs::symlink_metadata(&path).ok();
        let mut reserved = 0;
        if existing.is_some() {
            // An entry another process published since our lookup, or a bad one (the lookup
            // failed its checks): only a bad one is replaced, without charging the budget twice.
            if self.open_entry(key, u64::MAX).is_some() {
                return;
            }
            self.stats.replaced.fetch_add(1, Ordering::Relaxed);
        } else {
            match self.group.reserve(total) {
                Some(true) => reserved = total,
                Some(false) => {
                    self.group.counters.not_stored_budget.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                None => return, // counted in lock_timeouts
            }
        }
        let header = Header {
            width: width32,
            height: height32,
            source_width,
            source_height,
            payload: pixels.len() as u64,
            key,
            decode_ns: decode.as_nanos() as u64,
            rows_per_chunk: per,
        };
        let Some(parent) = path.parent() else { return };
        let tmp = parent.join(format!(".tmp-{key:032x}-{}-{}", std::process::id(), self.group.next_seq()));
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(parent)?;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
            f.write_all(&encode_header(&header))?;
            let table: Vec<u8> = sums.iter().flat_map(|s| s.to_le_bytes()).collect();
            f.write_all(&table)?;
            f.write_all(pixels)?;
            drop(f);
            std::fs::rename(&tmp, &path)
        })();
        match written {
            Ok(()) => {
                self.group.counters.stored.fetch_add(1, Ordering::Relaxed);
                self.group.counters.stored_bytes.fetch_add(total, Ordering::Relaxed);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&tmp);
                if reserved > 0 {
                    self.group.unreserve(reserved);
                }
                self.group.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats.fill_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The counters of this process.
    pub fn report(&self) -> CacheReport {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheReport {
            group: self.group.report(),
            other_groups_bytes: self.group.other_groups_bytes(),
            held_by_others_bytes: get(&self.group.counters.held_by_others),
            max_side: self.max_side,
            replaced: get(&s.replaced),
            decode_seconds_saved: get(&s.saved_ns) as f64 * 1e-9,
            lookup_seconds: get(&s.lookup_ns) as f64 * 1e-9,
            fill_seconds: get(&s.fill_ns) as f64 * 1e-9,
        }
    }

    /// Zeroes the counters (with the loader's report).
    pub fn reset(&self) {
        let s = &self.stats;
        for a in [&s.replaced, &s.saved_ns, &s.lookup_ns, &s.fill_ns] {
            a.store(0, Ordering::Relaxed);
        }
        self.group.counters.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked_against_key_length_and_limit() {
        let h = Header {
            width: 4,
            height: 2,
            source_width: 8,
            source_height: 3,
            payload: 24,
            key: 7,
            decode_ns: 5,
            rows_per_chunk: rows_per_chunk(4),
        };
        // Header, one checksum (two rows of 12 bytes fit one chunk), 24 bytes of pixels.
        let len = HEADER as u64 + 8 + 24;
        let b = encode_header(&h);
        assert_eq!(check_header(&b, 7, len, 100), Some(h));
        assert!(check_header(&b, 8, len, 100).is_none(), "another key");
        assert!(check_header(&b, 7, len - 1, 100).is_none(), "truncated");
        assert!(check_header(&b, 7, len - 8, 100).is_none(), "no checksum table");
        assert!(check_header(&b, 7, len, 23).is_none(), "source over max_pixels");
        let mut bad = b;
        bad[0] ^= 1;
        assert!(check_header(&bad, 7, len, 100).is_none(), "magic");
        let mut bad = b;
        bad[24] ^= 1;
        assert!(check_header(&bad, 7, len, 100).is_none(), "source width (checksum)");
        let mut bad = b;
        bad[64] ^= 1;
        assert!(check_header(&bad, 7, len, 100).is_none(), "rows per chunk (checksum)");
        let huge = Header {
            width: u32::MAX,
            height: 3,
            source_width: u32::MAX,
            source_height: 3,
            payload: 0,
            key: 7,
            decode_ns: 0,
            rows_per_chunk: 1,
        };
        assert!(check_header(&encode_header(&huge), 7, HEADER as u64, u64::MAX).is_none(), "payload mismatch");
        let bigger = Header { width: 9, height: 2, payload: 54, ..h };
        assert!(
            check_header(&encode_header(&bigger), 7, HEADER as u64 + 8 + 54, 100).is_none(),
            "stored larger than source"
        );
    }

    #[test]
    fn chunk_checksums_cover_whole_rows() {
        let (w, h) = (5usize, 7usize);
        let px: Vec<u8> = (0..w * h * 3).map(|i| i as u8).collect();
        let sums = chunk_sums(&px, w * 3, 3);
        assert_eq!(sums.len(), 3, "rows 0-2, 3-5, 6");
        assert_eq!(sums[2], xxhash_rust::xxh3::xxh3_64(&px[6 * w * 3..]));
        assert_eq!(rows_per_chunk(1 << 20), 1, "a row wider than a chunk is a chunk of its own");
    }
}
