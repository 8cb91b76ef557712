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
//! Lifecycle. A cache root (`/dev/shm/stoker-cache-UID` for `ram`, or the directory given)
//! holds one **group** per dataset and pixel settings: `ROOT/v3-SETTINGS-DATASET/`, where
//! `SETTINGS` hashes what decides the pixels (entry format, EXIF orientation, `max_side`) and
//! `DATASET` the dataset's sample list (paths and labels). A group holds `group.json` (what it
//! is, for `stoker cache`), `usage` (its bytes), `lock` (held shared by every process using the
//! group, so that nobody removes a group in use; its mtime is the group's last use) and the
//! entries. The byte budget is shared by all groups of a root: when an entry does not fit, the
//! least recently used groups that no process holds are evicted, never a group in use, so a new
//! dataset always gets room that idle ones held. Idle groups older than the time to live
//! (`STOKER_CACHE_TTL`; default 1 hour for `ram`, none for a directory) are removed whenever a
//! cache under the same root is opened; `stoker cache` lists, sizes and clears groups. Every
//! lock on a shared file is taken with a deadline ([`LOCK_DEADLINE`]): past it the entry is not
//! stored (counted in `lock_timeouts`), the run goes on.
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

use crate::error::{Error, Result};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// Where the cache lives.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheLocation {
    /// Shared memory: `/dev/shm/stoker-cache-UID` (tmpfs; its pages are shared by processes).
    Ram,
    /// A directory on local disk.
    Dir(PathBuf),
}

impl CacheLocation {
    /// The cache root this location means.
    pub fn root(&self) -> PathBuf {
        match self {
            CacheLocation::Ram => ram_root(),
            CacheLocation::Dir(d) => d.clone(),
        }
    }
}

/// The root of `cache="ram"`: `/dev/shm/stoker-cache-UID`.
pub fn ram_root() -> PathBuf {
    Path::new("/dev/shm").join(format!("stoker-cache-{}", uid()))
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
    /// How long an idle group is kept (`None`: the location's default, [`RAM_TTL`] for `ram`,
    /// forever for a directory); `stoker::args` reads it from `STOKER_CACHE_TTL`.
    #[serde(default)]
    pub ttl: Option<Ttl>,
}

/// How long an idle cache group is kept (`STOKER_CACHE_TTL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Ttl {
    /// Kept until `stoker cache clear` (or a reboot, for `ram`).
    Never,
    /// Removed once idle for longer than this (zero: when the last process leaves it).
    After(Duration),
}

/// Which dataset a cache group belongs to: a hash of its sample list and a description for
/// people (`stoker cache` shows it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetKey {
    /// Hash of every sample's path and label, in order.
    pub hash: u64,
    /// Samples in the dataset.
    pub samples: usize,
    /// What the dataset is, for people: the folder or shards its samples come from.
    pub description: String,
}

const MAGIC: [u8; 8] = *b"STKPIX\0\x01";
const VERSION: u32 = 3;
/// Bytes before the checksum table.
pub const HEADER: usize = 80;
const CHANNELS: u32 = 3;
/// Bytes of pixels one checksum covers, about (whole rows, at least one).
const CHUNK_BYTES: usize = 64 << 10;
/// How long a lock on a shared cache file is waited for before the operation is given up
/// (the entry is not stored; the run goes on).
pub const LOCK_DEADLINE: Duration = Duration::from_secs(2);
/// The time to live of idle `ram` groups when `STOKER_CACHE_TTL` is unset.
pub const RAM_TTL: Duration = Duration::from_secs(3600);

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
    verify_failures: AtomicU64,
    write_errors: AtomicU64,
    lock_timeouts: AtomicU64,
    evicted_groups: AtomicU64,
    evicted_bytes: AtomicU64,
    held_by_others: AtomicU64,
    saved_ns: AtomicU64,
    lookup_ns: AtomicU64,
    fill_ns: AtomicU64,
}

/// What the cache did: the `cache` field of the loader's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CacheReport {
    /// This dataset's group directory (`stoker cache clear` removes it when idle).
    pub dir: String,
    /// The cache root, shared by the groups of every dataset.
    pub root: String,
    /// The byte budget of this process (shared by every group under the root).
    pub budget_bytes: u64,
    /// Bytes stored in this dataset's group, by all processes.
    pub used_bytes: u64,
    /// Bytes held under the root by the groups of other datasets or settings.
    pub other_groups_bytes: u64,
    /// Of those, bytes of groups in use by a live process (they cannot be evicted): when a
    /// miss could not be stored for want of room, what other datasets held at that moment.
    pub held_by_others_bytes: u64,
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
    /// Misses not stored because the budget was used (by this dataset or by groups in use).
    pub not_stored_budget: u64,
    /// Entries that failed their checks (truncated, corrupt, foreign) and were replaced.
    pub replaced: u64,
    /// Entries whose pixels failed their checksums when read (served as misses, rewritten).
    pub verify_failures: u64,
    /// Entries that could not be written (disk full, ...): the sample was still delivered.
    pub write_errors: u64,
    /// Locks on the cache's shared files not obtained within [`LOCK_DEADLINE`] (another
    /// process held them): the entry was not stored.
    pub lock_timeouts: u64,
    /// Idle groups of other datasets this process evicted to make room (least recently used
    /// first) or removed because their time to live had passed.
    pub evicted_groups: u64,
    /// Bytes those groups held.
    pub evicted_bytes: u64,
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
    root: PathBuf,
    dir: PathBuf,
    budget: u64,
    max_side: Option<usize>,
    ttl: Option<Duration>,
    /// `ROOT/.lock`: taken exclusively to change any group's `usage` or to remove a group.
    root_lock: File,
    usage: File,
    /// `GROUP/lock`, held shared while this cache is open: the group is in use.
    member: Option<File>,
    /// `flock` excludes other processes only (this process's threads share one open file
    /// description), so the threads of this process take this lock first.
    usage_lock: std::sync::Mutex<()>,
    stats: Stats,
    tmp_seq: AtomicU64,
    /// When the root lock last timed out: for [`BUSY_BACKOFF`] after it, entries are not
    /// stored and nobody waits for the lock again (one wait, not one per sample).
    busy_since: std::sync::Mutex<Option<std::time::Instant>>,
}

/// How long after a lock timeout the cache stores nothing instead of waiting again.
const BUSY_BACKOFF: Duration = Duration::from_secs(30);

/// What decides an entry's pixels; another value is another group.
fn settings_text(apply_exif: bool, max_side: Option<usize>) -> String {
    let size = match max_side {
        None => "full-resolution".to_string(),
        Some(m) => format!("max-side={m} dct-scaled+bilinear-antialiased"),
    };
    format!("stoker-pixels v{VERSION} rgb8 {size} exif={apply_exif}")
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

/// A `flock` on a file, released on drop.
struct Locked<'a>(&'a File);

impl<'a> Locked<'a> {
    /// Takes the lock (`exclusive`, else shared), waiting at most `deadline`; `Ok(None)` when
    /// another process held it all that time.
    fn within(f: &'a File, exclusive: bool, deadline: Duration) -> std::io::Result<Option<Self>> {
        Ok(if flock_within(f, exclusive, deadline)? { Some(Locked(f)) } else { None })
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        unlock(self.0);
    }
}

/// `flock` with a deadline: polls a non-blocking attempt with short sleeps (a blocking
/// `flock` cannot be bounded). `Ok(false)` when the deadline passed.
fn flock_within(f: &File, exclusive: bool, deadline: Duration) -> std::io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = if exclusive { libc::LOCK_EX } else { libc::LOCK_SH };
    let t0 = std::time::Instant::now();
    let mut nap = Duration::from_millis(1);
    loop {
        // SAFETY: the descriptor is open for the life of `f`; flock has no memory effects.
        if unsafe { libc::flock(f.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => {}
            _ => return Err(e),
        }
        if t0.elapsed() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(50));
    }
}

fn unlock(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the life of the borrowed file.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
}

fn open_rw(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Sum of the sizes of the entry files under `dir` (what a group already holds).
fn scan_bytes(dir: &Path) -> (u64, u64) {
    let (mut total, mut n) = (0u64, 0u64);
    let Ok(subs) = std::fs::read_dir(dir) else { return (0, 0) };
    for sub in subs.flatten() {
        if !sub.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Ok(files) = std::fs::read_dir(sub.path()) else { continue };
        for f in files.flatten() {
            if f.file_name().as_encoded_bytes().ends_with(b".px") {
                total = total.saturating_add(f.metadata().map(|m| m.len()).unwrap_or(0));
                n += 1;
            }
        }
    }
    (total, n)
}

fn read_u64(f: &File) -> u64 {
    let mut b = [0u8; 8];
    match f.read_exact_at(&mut b, 0) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => 0,
    }
}

/// One group of a cache root, as found on disk.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupInfo {
    /// The group's directory.
    pub dir: PathBuf,
    /// The dataset it caches (from `group.json`; `?` for a group of an older stoker).
    pub dataset: String,
    /// Samples of that dataset.
    pub samples: u64,
    /// What decides its pixels (resolution, EXIF orientation).
    pub settings: String,
    /// Bytes it holds (its `usage` count; for an older group, the entry files' sizes).
    pub bytes: u64,
    /// Seconds since it was last opened or closed by a loader.
    pub idle_seconds: u64,
    /// Whether a live process is using it now (it is never removed then).
    pub in_use: bool,
}

fn is_group_name(name: &str) -> bool {
    name.len() > 3 && name.starts_with('v') && name[1..].split('-').next().is_some_and(|v| v.parse::<u32>().is_ok())
}

/// Groups under `root` (oldest use first); a root that does not exist has none.
pub fn list_groups(root: &Path) -> Vec<GroupInfo> {
    let Ok(rd) = std::fs::read_dir(root) else { return vec![] };
    let mut out = vec![];
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_group_name(&name) || !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        out.push(group_info(&e.path()));
    }
    out.sort_by(|a, b| b.idle_seconds.cmp(&a.idle_seconds).then(a.dir.cmp(&b.dir)));
    out
}

fn group_info(dir: &Path) -> GroupInfo {
    let meta: serde_json::Value = std::fs::read(dir.join("group.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(serde_json::Value::Null);
    let text = |k: &str| meta.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_string();
    let lock = dir.join("lock");
    let last = std::fs::metadata(&lock)
        .or_else(|_| std::fs::metadata(dir.join("usage")))
        .or_else(|_| std::fs::metadata(dir))
        .and_then(|m| m.modified())
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let idle_seconds = SystemTime::now().duration_since(last).map(|d| d.as_secs()).unwrap_or(0);
    let bytes = match std::fs::File::open(dir.join("usage")) {
        Ok(f) if lock.exists() => read_u64(&f),
        _ => scan_bytes(dir).0,
    };
    let in_use = match std::fs::File::open(&lock) {
        Ok(f) => match flock_within(&f, true, Duration::ZERO) {
            Ok(true) => {
                unlock(&f);
                false
            }
            _ => true,
        },
        Err(_) => false,
    };
    GroupInfo {
        dir: dir.to_path_buf(),
        dataset: text("dataset"),
        samples: meta.get("samples").and_then(|v| v.as_u64()).unwrap_or(0),
        settings: text("settings"),
        bytes,
        idle_seconds,
        in_use,
    }
}

/// Moves an idle group out of the way (renamed under the root, to be deleted outside any
/// lock); `None` when a process holds it. The caller holds the root lock.
fn take_idle(root: &Path, dir: &Path, seq: &AtomicU64) -> Option<PathBuf> {
    let lock = dir.join("lock");
    let held = match std::fs::File::open(&lock) {
        Ok(f) => match flock_within(&f, true, Duration::ZERO) {
            Ok(true) => Some(f),
            _ => return None,
        },
        Err(_) => None, // a group of an older stoker, or half removed: nobody can hold it
    };
    let trash = root.join(format!(".trash-{}-{}", std::process::id(), seq.fetch_add(1, Ordering::Relaxed)));
    let moved = std::fs::rename(dir, &trash).is_ok();
    drop(held);
    moved.then_some(trash)
}

/// What [`clear`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Cleared {
    /// Groups removed.
    pub removed: Vec<GroupInfo>,
    /// Groups left because a live process uses them.
    pub in_use: Vec<GroupInfo>,
    /// Groups left because they were used more recently than `older_than`.
    pub kept: Vec<GroupInfo>,
}

/// Removes the idle groups under `root` that were last used more than `older_than` ago (all
/// idle groups with `None`); groups in use are left and listed. Leftovers of interrupted
/// removals (`.trash-*`) and temporary files are removed too.
pub fn clear(root: &Path, older_than: Option<Duration>) -> Result<Cleared> {
    let mut out = Cleared::default();
    if !root.is_dir() {
        return Ok(out);
    }
    let lock = open_rw(&root.join(".lock"))
        .map_err(|e| Error::config("cache", format!("cannot open {}: {e}", root.join(".lock").display())))?;
    let Some(_l) = Locked::within(&lock, true, LOCK_DEADLINE * 5)
        .map_err(|e| Error::config("cache", format!("cannot lock {}: {e}", root.display())))?
    else {
        return Err(Error::config("cache", format!("{} is locked by another process; try again", root.display())));
    };
    let seq = AtomicU64::new(0);
    let mut trash = vec![];
    for g in list_groups(root) {
        if g.in_use {
            out.in_use.push(g);
        } else if older_than.is_some_and(|t| g.idle_seconds < t.as_secs()) {
            out.kept.push(g);
        } else if let Some(t) = take_idle(root, &g.dir, &seq) {
            trash.push(t);
            out.removed.push(g);
        } else {
            let mut g = g;
            g.in_use = true;
            out.in_use.push(g);
        }
    }
    drop(_l);
    remove_trash(root, trash);
    Ok(out)
}

/// Deletes groups moved aside, and leftovers of removals that a killed process did not finish.
fn remove_trash(root: &Path, mut trash: Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if let Some(rest) = n.strip_prefix(".trash-") {
                let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
                // SAFETY: kill with signal 0 only checks whether the process exists.
                let alive = pid.is_some_and(|p| p == std::process::id() as i32 || unsafe { libc::kill(p, 0) } == 0);
                if !alive {
                    trash.push(e.path());
                }
            }
        }
    }
    trash.sort();
    trash.dedup();
    for t in trash {
        let _ = std::fs::remove_dir_all(&t);
    }
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
    /// [`Error::Config`] naming `cache` (a directory that cannot be made or written),
    /// `cache_max_side` or `STOKER_CACHE_TTL`.
    pub fn open(spec: &CacheSpec, apply_exif: bool, dataset: &DatasetKey) -> Result<Self> {
        let root = match &spec.location {
            CacheLocation::Ram => {
                if !Path::new("/dev/shm").is_dir() {
                    return Err(Error::config(
                        "cache",
                        "'ram' needs /dev/shm, which this system lacks; give a directory",
                    ));
                }
                ram_root()
            }
            CacheLocation::Dir(d) => d.clone(),
        };
        if spec.max_side == Some(0) {
            return Err(Error::config("cache_max_side", "must be at least 1"));
        }
        let ttl = match spec.ttl {
            Some(Ttl::After(t)) => Some(t),
            Some(Ttl::Never) => None,
            None => matches!(spec.location, CacheLocation::Ram).then_some(RAM_TTL),
        };
        let settings = settings_text(apply_exif, spec.max_side);
        let name = format!("v{VERSION}-{:016x}-{:016x}", xxhash_rust::xxh3::xxh3_64(settings.as_bytes()), dataset.hash);
        let dir = root.join(&name);
        let bad = |what: &str, e: std::io::Error| {
            Error::config("cache", format!("cannot use {} as a cache directory ({what}: {e})", root.display()))
        };
        std::fs::create_dir_all(&root).map_err(|e| bad("create", e))?;
        let root_lock = open_rw(&root.join(".lock")).map_err(|e| bad("write", e))?;
        let stats = Stats::default();
        // Join the group: hold its lock shared, and check that the lock is still the group's
        // (an evictor may have moved the group aside between our open and our lock).
        let mut member = None;
        for _ in 0..4 {
            std::fs::create_dir_all(&dir).map_err(|e| bad("create", e))?;
            write_group_json(&dir, dataset, &settings);
            let f = match open_rw(&dir.join("lock")) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // moved aside meanwhile
                Err(e) => return Err(bad("write", e)),
            };
            if !flock_within(&f, false, LOCK_DEADLINE).map_err(|e| bad("lock", e))? {
                stats.lock_timeouts.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let same = match (f.metadata(), std::fs::metadata(dir.join("lock"))) {
                (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
                _ => false,
            };
            if same {
                let _ = f.set_modified(SystemTime::now());
                member = Some(f);
                break;
            }
        }
        let usage = open_rw(&dir.join("usage")).map_err(|e| bad("write", e))?;
        let free = free_space(&root);
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
        let cache = Cache {
            root,
            dir,
            budget,
            max_side: spec.max_side,
            ttl,
            root_lock,
            usage,
            member,
            usage_lock: std::sync::Mutex::new(()),
            stats,
            tmp_seq: AtomicU64::new(0),
            busy_since: std::sync::Mutex::new(None),
        };
        cache.settle();
        Ok(cache)
    }

    /// The root lock, waited for at most [`LOCK_DEADLINE`], and not at all for
    /// [`BUSY_BACKOFF`] after a wait timed out; `None` (counted in `lock_timeouts`) when not
    /// obtained.
    fn lock_root(&self) -> Option<Locked<'_>> {
        let mut busy = self.busy_since.lock().unwrap_or_else(|p| p.into_inner());
        if busy.is_some_and(|t| t.elapsed() < BUSY_BACKOFF) {
            self.stats.lock_timeouts.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match Locked::within(&self.root_lock, true, LOCK_DEADLINE) {
            Ok(Some(l)) => {
                *busy = None;
                Some(l)
            }
            _ => {
                *busy = Some(std::time::Instant::now());
                self.stats.lock_timeouts.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Under the root lock: counts a group found without its `usage` (a new group, or one
    /// whose count was lost), and removes idle groups past their time to live.
    fn settle(&self) {
        let Some(_l) = self.lock_root() else { return };
        if self.usage.metadata().map(|m| m.len()).unwrap_or(0) < 8 {
            let _ = self.usage.write_all_at(&scan_bytes(&self.dir).0.to_le_bytes(), 0);
        }
        let mut trash = vec![];
        let current = format!("v{VERSION}-");
        for g in list_groups(&self.root) {
            if g.dir == self.dir || g.in_use {
                continue;
            }
            // Groups of an older entry format can never be read by this version: they go
            // whatever their age (their bytes would otherwise count against the budget).
            let old_format = !g.dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&current));
            if old_format || self.ttl.is_some_and(|ttl| g.idle_seconds >= ttl.as_secs()) {
                if let Some(t) = take_idle(&self.root, &g.dir, &self.tmp_seq) {
                    self.stats.evicted_groups.fetch_add(1, Ordering::Relaxed);
                    self.stats.evicted_bytes.fetch_add(g.bytes, Ordering::Relaxed);
                    trash.push(t);
                }
            }
        }
        drop(_l);
        remove_trash(&self.root, trash);
    }

    /// The directory holding this dataset's entries (its group).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache root, shared by every group.
    pub fn root(&self) -> &Path {
        &self.root
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
        self.stats.read_bytes.fetch_add(((y1 - y0) * row) as u64, Ordering::Relaxed);
        Ok(&buf[(y0 - r0) * row..(y1 - r0) * row])
    }

    /// Drops an entry that failed when read (its pixels did not match their checksums, or it
    /// was truncated): the file is removed (if it is still the one that was opened) and its
    /// bytes are given back to the budget, so that the miss that follows rewrites it.
    pub fn discard(&self, entry: &Entry, key: u128) {
        // The lookup counted a hit; the sample is decoded after all.
        self.stats.hits.fetch_sub(1, Ordering::Relaxed);
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        self.stats.saved_ns.fetch_sub(entry.decode_ns, Ordering::Relaxed);
        self.stats.verify_failures.fetch_add(1, Ordering::Relaxed);
        let path = self.path(key);
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(_l) = self.lock_root() else { return };
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.ino() == entry.ino) && std::fs::remove_file(&path).is_ok() {
            let used = read_u64(&self.usage).saturating_sub(entry.len);
            let _ = self.usage.write_all_at(&used.to_le_bytes(), 0);
        }
    }

    /// Reserves `n` bytes of the budget shared by the root's groups, evicting idle groups of
    /// other datasets (least recently used first) when they do not fit; false when they still
    /// do not (the rest is held by this dataset or by groups in use), `None` when the root lock
    /// was not obtained in time.
    fn reserve(&self, n: u64) -> Option<bool> {
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        let l = self.lock_root()?;
        let own = read_u64(&self.usage);
        let others: Vec<GroupInfo> = list_groups(&self.root).into_iter().filter(|g| g.dir != self.dir).collect();
        let mut total = own.saturating_add(others.iter().map(|g| g.bytes).sum());
        let mut trash = vec![];
        // Oldest use first (list_groups' order); groups in use are never taken.
        for g in &others {
            if total.saturating_add(n) <= self.budget {
                break;
            }
            if g.in_use {
                continue;
            }
            if let Some(t) = take_idle(&self.root, &g.dir, &self.tmp_seq) {
                total = total.saturating_sub(g.bytes);
                self.stats.evicted_groups.fetch_add(1, Ordering::Relaxed);
                self.stats.evicted_bytes.fetch_add(g.bytes, Ordering::Relaxed);
                trash.push(t);
            }
        }
        let mut fits = total.saturating_add(n) <= self.budget;
        if fits {
            fits = self.usage.write_all_at(&own.saturating_add(n).to_le_bytes(), 0).is_ok();
        } else {
            let held = total.saturating_sub(own);
            self.stats.held_by_others.store(held, Ordering::Relaxed);
        }
        drop(l);
        remove_trash(&self.root, trash);
        Some(fits)
    }

    /// Gives back `n` reserved bytes (an entry that could not be written).
    fn unreserve(&self, n: u64) {
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(_l) = self.lock_root() {
            let used = read_u64(&self.usage).saturating_sub(n);
            let _ = self.usage.write_all_at(&used.to_le_bytes(), 0);
        }
    }

    /// Whether an entry of `pixel_bytes` for `key` could still be stored: this dataset's bytes
    /// leave room for it within the budget (idle groups of other datasets can be evicted), or a
    /// (bad) entry under this key would be replaced. When it could not, the miss is counted in
    /// `not_stored_budget` and the caller need not decode the whole image. A `true` may still
    /// end in a refusal by [`Cache::put`] when groups in use, or other threads, hold the room.
    pub fn may_store(&self, key: u128, width: usize, height: usize) -> bool {
        let total = Self::entry_bytes(width, height);
        if self.used().saturating_add(total) <= self.budget || self.path(key).symlink_metadata().is_ok() {
            return true;
        }
        self.stats.not_stored_budget.fetch_add(1, Ordering::Relaxed);
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
        read_u64(&self.usage)
    }

    /// Stores the `width` x `height` RGB8 `pixels` of the file with `key`, made in `decode`
    /// from a source image of `source = (width, height)` (see [`Cache::stored_size`]), if the
    /// budget allows. A failure to write is counted, never an error.
    pub fn put(&self, key: u128, pixels: &[u8], width: usize, height: usize, source: (usize, usize), decode: Duration) {
        let t0 = std::time::Instant::now();
        let dims = [width, height, source.0, source.1].map(u32::try_from);
        let [Ok(width32), Ok(height32), Ok(source_width), Ok(source_height)] = dims else {
            self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
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
            match self.reserve(total) {
                Some(true) => reserved = total,
                Some(false) => {
                    self.stats.not_stored_budget.fetch_add(1, Ordering::Relaxed);
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
        let tmp = parent.join(format!(
            ".tmp-{key:032x}-{}-{}",
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
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
                self.stats.stored.fetch_add(1, Ordering::Relaxed);
                self.stats.stored_bytes.fetch_add(total, Ordering::Relaxed);
            }
            Err(_) => {
                let _ = std::fs::remove_file(&tmp);
                if reserved > 0 {
                    self.unreserve(reserved);
                }
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.stats.fill_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// The counters of this process.
    pub fn report(&self) -> CacheReport {
        let s = &self.stats;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let other_groups_bytes =
            list_groups(&self.root).iter().filter(|g| g.dir != self.dir).map(|g| g.bytes).sum::<u64>();
        CacheReport {
            dir: self.dir.display().to_string(),
            root: self.root.display().to_string(),
            budget_bytes: self.budget,
            used_bytes: self.used(),
            other_groups_bytes,
            held_by_others_bytes: get(&s.held_by_others),
            max_side: self.max_side,
            hits: get(&s.hits),
            misses: get(&s.misses),
            stored: get(&s.stored),
            stored_bytes: get(&s.stored_bytes),
            read_bytes: get(&s.read_bytes),
            not_stored_budget: get(&s.not_stored_budget),
            replaced: get(&s.replaced),
            verify_failures: get(&s.verify_failures),
            write_errors: get(&s.write_errors),
            lock_timeouts: get(&s.lock_timeouts),
            evicted_groups: get(&s.evicted_groups),
            evicted_bytes: get(&s.evicted_bytes),
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
            &s.verify_failures,
            &s.write_errors,
            &s.lock_timeouts,
            &s.evicted_groups,
            &s.evicted_bytes,
            &s.held_by_others,
            &s.saved_ns,
            &s.lookup_ns,
            &s.fill_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

impl Drop for Cache {
    /// Leaves the group: its last use is now. With a time to live of zero, the last process
    /// to leave a group removes it.
    fn drop(&mut self) {
        let Some(member) = self.member.take() else { return };
        let _ = member.set_modified(SystemTime::now());
        drop(member);
        if self.ttl == Some(Duration::ZERO) {
            if let Ok(Some(l)) = Locked::within(&self.root_lock, true, LOCK_DEADLINE) {
                let t = take_idle(&self.root, &self.dir, &self.tmp_seq);
                drop(l);
                remove_trash(&self.root, t.into_iter().collect());
            }
        }
    }
}

/// Writes `group.json` (what the group caches, for `stoker cache`) unless it exists.
fn write_group_json(dir: &Path, dataset: &DatasetKey, settings: &str) {
    let path = dir.join("group.json");
    if path.exists() {
        return;
    }
    let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let text = serde_json::json!({
        "format": VERSION,
        "dataset": dataset.description,
        "samples": dataset.samples,
        "dataset_hash": format!("{:016x}", dataset.hash),
        "settings": settings,
        "created": created,
    });
    let tmp = dir.join(format!(".group-{}.json", std::process::id()));
    if std::fs::write(&tmp, text.to_string()).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
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
