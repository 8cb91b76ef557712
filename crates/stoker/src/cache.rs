//! The decoded-pixel cache: decode each image once per run.
//!
//! Decoding is the floor of per-image CPU, and every epoch pays it again for the same pixels.
//! With a cache, the first time an image is decoded its full-resolution RGB8 pixels (after EXIF
//! orientation) are written to a file of their own; later epochs (and other processes on the
//! host) read the rows of that file a crop needs and skip decoding. The files live in the page
//! cache (on tmpfs for `ram`), so processes sharing a cache share one copy of its pixels; each
//! process copies only the rows of the sample in hand into a reused buffer. (Mapping each entry
//! instead was measured slower: a map and unmap per sample, with its page-table and TLB work in
//! a multi-threaded process.) With a `max_side`, images whose longer side
//! exceeds it are stored reduced to it instead (DCT-scaled decoding, then the antialiased
//! resampler): smaller entries and cheaper later epochs, at the price of pixels that differ
//! from a full-resolution decode. Policy: fill until the byte budget is used,
//! never evict (each epoch visits the samples in a new random order, so eviction would only
//! replace one cached image with another).
//!
//! Layout: `ROOT/v2-SETTINGS/KK/KEY.px`, where `ROOT` is `/dev/shm/stoker-cache-UID`
//! (`cache="ram"`) or the directory given, `SETTINGS` a hash of what decides the pixels (the
//! entry format, whether EXIF orientation is applied and the `max_side`: other settings use
//! another directory), and `KEY` the 128-bit xxh3 hash of the encoded file's bytes (content-addressed:
//! a changed source file has another key, so stale pixels are never served; identical files
//! share one entry). An entry is an 80-byte header (magic, version, channels, the stored width
//! and height, the source image's width and height, payload length, the content hash, the
//! decode time, then an xxh3 checksum of those 64 bytes) followed by the pixels. It is written to
//! a temporary name in the same folder and renamed into place, so a crash leaves no partial
//! entry under a real name; a reader checks the whole header (against the key, `max_pixels` and
//! the file's length) before reading, and anything that does not match is a miss whose entry is
//! replaced. Published entries are never modified in place (a replacement is a new file renamed
//! over the old name), so an open entry stays valid while it is used.
//!
//! Budget: `ROOT/v1-SETTINGS/usage` holds the bytes stored by all processes, updated under an
//! exclusive `flock`, so processes sharing a cache share its budget; it is initialised from the
//! sizes of the entries found when it is first created.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where the cache lives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheLocation {
    /// Shared memory: `/dev/shm/stoker-cache-UID` (tmpfs; its pages are shared by processes).
    Ram,
    /// A directory on local disk.
    Dir(PathBuf),
}

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
}

const MAGIC: [u8; 8] = *b"STKPIX\0\x01";
const VERSION: u32 = 2;
/// Bytes before the pixels.
pub const HEADER: usize = 80;
const CHANNELS: u32 = 3;

/// Counters of one cache in one process.
#[derive(Debug, Default)]
struct Stats {
    hits: AtomicU64,
    misses: AtomicU64,
    stored: AtomicU64,
    stored_bytes: AtomicU64,
    read_bytes: AtomicU64,
    not_stored_budget: AtomicU64,
    replaced: AtomicU64,
    write_errors: AtomicU64,
    saved_ns: AtomicU64,
    lookup_ns: AtomicU64,
    fill_ns: AtomicU64,
}

/// What the cache did, in [`crate::telemetry::Report::cache`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheReport {
    /// The cache's directory (delete it to empty the cache).
    pub dir: String,
    /// The byte budget of this process.
    pub budget_bytes: u64,
    /// Bytes stored in this cache directory by all processes (the shared `usage` count).
    pub used_bytes: u64,
    /// The longer side entries are reduced to (`None`: full resolution).
    pub max_side: Option<usize>,
    /// Samples whose pixels came from the cache (no decode).
    pub hits: u64,
    /// Samples decoded (not in the cache, or an entry that failed its checks).
    pub misses: u64,
    /// Entries this process stored.
    pub stored: u64,
    /// Bytes this process stored (headers included).
    pub stored_bytes: u64,
    /// Pixel bytes read from the cache.
    pub read_bytes: u64,
    /// Misses not stored because the budget was used.
    pub not_stored_budget: u64,
    /// Entries that failed their checks (truncated, corrupt, foreign) and were replaced.
    pub replaced: u64,
    /// Entries that could not be written (disk full, ...): the sample was still delivered.
    pub write_errors: u64,
    /// Decode time the hits did not spend: the sum of the decode times recorded in their
    /// entries when they were filled (by whichever process filled them).
    pub decode_seconds_saved: f64,
    /// Time spent finding, checking and opening entries (hashing the file's bytes included).
    pub lookup_seconds: f64,
    /// Time spent writing entries.
    pub fill_seconds: f64,
}

/// An open cache directory shared by the decode threads of a loader.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    budget: u64,
    max_side: Option<usize>,
    usage: File,
    /// `flock` excludes other processes only (this process's threads share one open file
    /// description), so the threads of this process take this lock first.
    usage_lock: std::sync::Mutex<()>,
    stats: Stats,
    tmp_seq: AtomicU64,
}

/// What decides an entry's pixels; another value is another directory.
fn settings_hash(apply_exif: bool, max_side: Option<usize>) -> u64 {
    let size = match max_side {
        None => "full-resolution".to_string(),
        Some(m) => format!("max-side={m} dct-scaled+bilinear-antialiased"),
    };
    let s = format!("stoker-pixels v{VERSION} rgb8 {size} exif={apply_exif}");
    xxhash_rust::xxh3::xxh3_64(s.as_bytes())
}

/// Bytes the kernel says are available (`MemAvailable`), if known.
fn mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Free bytes of the file system holding `dir` (for an unprivileged user), if known.
fn free_space(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: `c` is a valid NUL-terminated path; `st` is a plain C struct that statvfs fills.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        (st.f_bavail as u64).checked_mul(st.f_frsize as u64)
    }
}

fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// An exclusive `flock` on a file, released on drop.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    fn new(f: &'a File) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: the descriptor is open for the life of `f`.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Locked(f));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is open for the life of the borrowed file.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Sum of the sizes of the entry files under `dir` (what an old cache already holds).
fn scan_bytes(dir: &Path) -> u64 {
    let mut total = 0u64;
    let Ok(subs) = std::fs::read_dir(dir) else { return 0 };
    for sub in subs.flatten() {
        if !sub.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(sub.path()) else { continue };
        for f in files.flatten() {
            if f.file_name().to_string_lossy().ends_with(".px") {
                total = total.saturating_add(f.metadata().map(|m| m.len()).unwrap_or(0));
            }
        }
    }
    total
}

/// An open, checked entry: the pixels of one image, read on demand.
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
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..64]);
    b[64..72].copy_from_slice(&sum.to_le_bytes());
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
    if u64_at(64) != xxhash_rust::xxh3::xxh3_64(&b[..64]) || b[72..80] != [0; 8] {
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
    };
    let pixels = u64::from(h.width) * u64::from(h.height);
    let source_pixels = u64::from(h.source_width) * u64::from(h.source_height);
    if h.width == 0 || h.height == 0 || h.width > h.source_width || h.height > h.source_height {
        return None;
    }
    if source_pixels > max_pixels || h.key != key {
        return None;
    }
    let payload = pixels.checked_mul(CHANNELS as u64)?;
    if payload != h.payload || payload.checked_add(HEADER as u64)? != file_len {
        return None;
    }
    Some(h)
}

impl Cache {
    /// Opens (creating it if needed) the cache `spec` for images decoded with `apply_exif`.
    /// Errors are [`Error::Config`] naming `cache` (a directory that cannot be made or written)
    /// or `cache_bytes`.
    pub fn open(spec: &CacheSpec, apply_exif: bool) -> Result<Self> {
        let root = match &spec.location {
            CacheLocation::Ram => {
                let shm = Path::new("/dev/shm");
                if !shm.is_dir() {
                    return Err(Error::config(
                        "cache",
                        "'ram' needs /dev/shm, which this system lacks; give a directory",
                    ));
                }
                shm.join(format!("stoker-cache-{}", uid()))
            }
            CacheLocation::Dir(d) => d.clone(),
        };
        if spec.max_side == Some(0) {
            return Err(Error::config("cache_max_side", "must be at least 1"));
        }
        let dir = root.join(format!("v{VERSION}-{:016x}", settings_hash(apply_exif, spec.max_side)));
        let bad = |what: &str, e: std::io::Error| {
            Error::config("cache", format!("cannot use {} as a cache directory ({what}: {e})", root.display()))
        };
        std::fs::create_dir_all(&dir).map_err(|e| bad("create", e))?;
        let usage_path = dir.join("usage");
        let usage = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&usage_path)
            .map_err(|e| bad("write", e))?;
        {
            let _l = Locked::new(&usage).map_err(|e| bad("lock", e))?;
            if usage.metadata().map_err(|e| bad("stat", e))?.len() < 8 {
                let found = scan_bytes(&dir);
                usage.write_all_at(&found.to_le_bytes(), 0).map_err(|e| bad("write", e))?;
            }
        }
        let free = free_space(&dir);
        let budget = match spec.bytes {
            Some(b) => b,
            None => {
                let base = match spec.location {
                    CacheLocation::Ram => mem_available().map(|m| m / 4),
                    CacheLocation::Dir(_) => free.map(|f| f / 2),
                };
                base.unwrap_or(0).min(free.unwrap_or(u64::MAX))
            }
        };
        Ok(Cache {
            dir,
            budget,
            max_side: spec.max_side,
            usage,
            usage_lock: std::sync::Mutex::new(()),
            stats: Stats::default(),
            tmp_seq: AtomicU64::new(0),
        })
    }

    /// The directory holding this cache's entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The byte budget.
    pub fn budget(&self) -> u64 {
        self.budget
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
        self.dir.join(&hex[..2]).join(format!("{hex}.px"))
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
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                self.stats.saved_ns.fetch_add(e.decode_ns, Ordering::Relaxed);
            }
            None => {
                self.stats.misses.fetch_add(1, Ordering::Relaxed);
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
        Some(Entry {
            file: f,
            width: h.width as usize,
            height: h.height as usize,
            source_width: h.source_width as usize,
            source_height: h.source_height as usize,
            decode_ns: h.decode_ns,
        })
    }

    /// Reads rows `rows.start..rows.end` (clamped to the image) of `entry` into `buf` and
    /// returns them, `width * 3` bytes per row: only the rows a crop needs are copied, into a
    /// buffer the caller reuses (no mapping, so no page-table and TLB work per sample). A read
    /// that comes up short (the file was truncated since it was checked) is an error.
    pub fn read_rows<'a>(
        &self,
        entry: &Entry,
        rows: std::ops::Range<usize>,
        buf: &'a mut Vec<u8>,
    ) -> std::io::Result<&'a [u8]> {
        let (y0, y1) = (rows.start.min(entry.height), rows.end.min(entry.height));
        let row = entry.width * 3;
        let n = y1.saturating_sub(y0) * row;
        if buf.len() < n {
            buf.resize(n, 0);
        }
        entry.file.read_exact_at(&mut buf[..n], (HEADER + y0 * row) as u64)?;
        self.stats.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
        Ok(&buf[..n])
    }

    /// Reserves `n` bytes of the shared budget; false when they do not fit.
    fn reserve(&self, n: u64) -> bool {
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(_l) = Locked::new(&self.usage) else { return false };
        let mut b = [0u8; 8];
        if self.usage.read_exact_at(&mut b, 0).is_err() {
            return false;
        }
        let used = u64::from_le_bytes(b);
        match used.checked_add(n) {
            Some(total) if total <= self.budget => self.usage.write_all_at(&total.to_le_bytes(), 0).is_ok(),
            _ => false,
        }
    }

    /// Whether an entry of `pixel_bytes` for `key` could still be stored: the budget has room
    /// for it, or a (bad) entry under this key would be replaced. When it could not, the miss
    /// is counted in `not_stored_budget` and the caller need not decode the whole image. The
    /// budget only fills (nothing is evicted), so a `false` stays `false`; a `true` may still
    /// end in a refusal by [`Cache::put`] when other threads filled the budget meanwhile.
    pub fn may_store(&self, key: u128, pixel_bytes: usize) -> bool {
        let total = (HEADER as u64).saturating_add(pixel_bytes as u64);
        if self.used().saturating_add(total) <= self.budget || self.path(key).symlink_metadata().is_ok() {
            return true;
        }
        self.stats.not_stored_budget.fetch_add(1, Ordering::Relaxed);
        false
    }

    /// Bytes stored in this cache by all processes.
    pub fn used(&self) -> u64 {
        let mut b = [0u8; 8];
        match self.usage.read_exact_at(&mut b, 0) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => 0,
        }
    }

    /// Stores the `width` x `height` RGB8 `pixels` of the file with `key`, made in `decode`
    /// from a source image of `source = (width, height)` (see [`Cache::stored_size`]), if the
    /// budget allows. A failure to write is counted, never an error.
    pub fn put(&self, key: u128, pixels: &[u8], width: usize, height: usize, source: (usize, usize), decode: Duration) {
        let t0 = std::time::Instant::now();
        let dims = [width, height, source.0, source.1].map(u32::try_from);
        let [Ok(width), Ok(height), Ok(source_width), Ok(source_height)] = dims else {
            self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let path = self.path(key);
        let total = (HEADER + pixels.len()) as u64;
        let existing = std::fs::symlink_metadata(&path).ok();
        if existing.is_some() {
            // An entry another process published since our lookup, or a bad one (the lookup
            // failed its checks): only a bad one is replaced, without charging the budget twice.
            if self.open_entry(key, u64::MAX).is_some() {
                return;
            }
            self.stats.replaced.fetch_add(1, Ordering::Relaxed);
        } else if !self.reserve(total) {
            self.stats.not_stored_budget.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let header = Header {
            width,
            height,
            source_width,
            source_height,
            payload: pixels.len() as u64,
            key,
            decode_ns: decode.as_nanos() as u64,
        };
        let Some(parent) = path.parent() else { return };
        let tmp = parent.join(format!(
            ".tmp-{key:032x}-{}-{}",
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(parent)?;
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(&tmp)?;
            f.write_all(&encode_header(&header))?;
            f.write_all(pixels)?;
            drop(f);
            std::fs::rename(&tmp, &path)
        })();
        match written {
            Ok(()) => {
                self.stats.stored.fetch_add(1, Ordering::Relaxed);
                self.stats.stored_bytes.fetch_add(total, Ordering::Relaxed);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&tmp);
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats.fill_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The counters of this process.
    pub fn report(&self) -> CacheReport {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheReport {
            dir: self.dir.display().to_string(),
            budget_bytes: self.budget,
            used_bytes: self.used(),
            max_side: self.max_side,
            hits: get(&s.hits),
            misses: get(&s.misses),
            stored: get(&s.stored),
            stored_bytes: get(&s.stored_bytes),
            read_bytes: get(&s.read_bytes),
            not_stored_budget: get(&s.not_stored_budget),
            replaced: get(&s.replaced),
            write_errors: get(&s.write_errors),
            decode_seconds_saved: get(&s.saved_ns) as f64 * 1e-9,
            lookup_seconds: get(&s.lookup_ns) as f64 * 1e-9,
            fill_seconds: get(&s.fill_ns) as f64 * 1e-9,
        }
    }

    /// Zeroes the counters (with the loader's report).
    pub fn reset(&self) {
        let s = &self.stats;
        for a in [
            &s.hits,
            &s.misses,
            &s.stored,
            &s.stored_bytes,
            &s.read_bytes,
            &s.not_stored_budget,
            &s.replaced,
            &s.write_errors,
            &s.saved_ns,
            &s.lookup_ns,
            &s.fill_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_checked_against_key_length_and_limit() {
        let h = Header { width: 4, height: 2, source_width: 8, source_height: 3, payload: 24, key: 7, decode_ns: 5 };
        let b = encode_header(&h);
        assert_eq!(check_header(&b, 7, HEADER as u64 + 24, 100), Some(h));
        assert!(check_header(&b, 8, HEADER as u64 + 24, 100).is_none(), "another key");
        assert!(check_header(&b, 7, HEADER as u64 + 23, 100).is_none(), "truncated");
        assert!(check_header(&b, 7, HEADER as u64 + 24, 23).is_none(), "source over max_pixels");
        let mut bad = b;
        bad[0] ^= 1;
        assert!(check_header(&bad, 7, HEADER as u64 + 24, 100).is_none(), "magic");
        let mut bad = b;
        bad[24] ^= 1;
        assert!(check_header(&bad, 7, HEADER as u64 + 24, 100).is_none(), "source width (checksum)");
        let huge = Header {
            width: u32::MAX,
            height: 3,
            source_width: u32::MAX,
            source_height: 3,
            payload: 0,
            key: 7,
            decode_ns: 0,
        };
        assert!(check_header(&encode_header(&huge), 7, HEADER as u64, u64::MAX).is_none(), "payload mismatch");
        let bigger = Header { width: 9, height: 2, payload: 54, ..h };
        assert!(
            check_header(&encode_header(&bigger), 7, HEADER as u64 + 54, 100).is_none(),
            "stored larger than source"
        );
    }
}
