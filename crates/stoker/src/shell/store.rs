//! Cache groups on a host, shared by the loader kinds: the decoded-pixel cache
//! ([`crate::image::cache`]) and the token cache ([`crate::tokens::autocache`]) keep their entries in
//! **groups** under one **root**, with one lifecycle and one byte budget.
//!
//! A root (`/dev/shm/stoker-cache-UID` for `ram`, or the directory given) holds one group per
//! dataset and settings: `ROOT/KV-SETTINGS-DATASET/`, `K` the kind's letter (`v` pixels, `t`
//! tokens), `V` its entry format version, `SETTINGS` a hash of what decides the entries and
//! `DATASET` one of the dataset. A group holds `group.json` (what it is, for `stoker cache`),
//! `usage` (its bytes), `lock` (held shared by every process using the group, so that nobody
//! removes a group in use; its mtime is the group's last use) and the kind's entries. The byte
//! budget is shared by all groups of a root: when an entry does not fit, the least recently used
//! groups that no process holds are evicted, never a group in use. Idle groups older than the
//! time to live (`STOKER_CACHE_TTL`; default 1 hour for `ram`, none for a directory), and groups
//! of a kind's older format, are removed whenever a group under the same root is opened;
//! `stoker cache` lists, sizes and clears groups. Every lock on a shared file is taken with a
//! deadline ([`LOCK_DEADLINE`]): past it the entry is not stored (counted), the run goes on.
//!
//! Owns: roots, groups, their locks, usage and eviction. May not touch: what an entry holds
//! (each kind's own module).

use crate::error::{Error, Result};
use std::fs::File;
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

/// How long an idle cache group is kept (`STOKER_CACHE_TTL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Ttl {
    /// Kept until `stoker cache clear` (or a reboot, for `ram`).
    Never,
    /// Removed once idle for longer than this (zero: when the last process leaves it).
    After(Duration),
}

/// Where a cache group lives and what it may hold: what every cache of the store is given (the
/// decoded-pixel cache adds its `max_side`, see `image::cache::CacheSpec`; the token cache
/// takes it as it is).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreSpec {
    /// Where entries are stored.
    pub location: CacheLocation,
    /// The byte budget (`None`: a quarter of `MemAvailable` for `ram`, half the free space of
    /// the file system for a directory; both capped by the file system's free space).
    pub bytes: Option<u64>,
    /// How long an idle group is kept (`None`: the location's default, [`RAM_TTL`] for `ram`,
    /// forever for a directory); `stoker::args` reads it from `STOKER_CACHE_TTL`.
    #[serde(default)]
    pub ttl: Option<Ttl>,
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

/// How long a lock on a shared cache file is waited for before the operation is given up
/// (the entry is not stored; the run goes on).
pub const LOCK_DEADLINE: Duration = Duration::from_secs(2);
/// The time to live of idle `ram` groups when `STOKER_CACHE_TTL` is unset.
pub const RAM_TTL: Duration = Duration::from_secs(3600);

/// How long after a lock timeout the cache stores nothing instead of waiting again.
const BUSY_BACKOFF: Duration = Duration::from_secs(30);

/// Bytes the kernel says are available (`MemAvailable`), if known.
pub(crate) fn mem_available() -> Option<u64> {
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

/// Sum of the sizes of the files a group holds, in its directory and one level below (the
/// control files `group.json`, `usage` and `lock` and temporary `.`-names excluded), and their
/// count: what a group holds when its `usage` count was lost.
fn scan_bytes(dir: &Path) -> (u64, u64) {
    fn counted(e: &std::fs::DirEntry) -> bool {
        let n = e.file_name();
        let n = n.as_encoded_bytes();
        !n.starts_with(b".") && !matches!(n, b"group.json" | b"usage" | b"lock")
    }
    let (mut total, mut n) = (0u64, 0u64);
    let Ok(top) = std::fs::read_dir(dir) else { return (0, 0) };
    for e in top.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_file() && counted(&e) {
            total = total.saturating_add(e.metadata().map(|m| m.len()).unwrap_or(0));
            n += 1;
        } else if t.is_dir() {
            let Ok(files) = std::fs::read_dir(e.path()) else { continue };
            for f in files.flatten() {
                if counted(&f) && f.file_type().is_ok_and(|t| t.is_file()) {
                    total = total.saturating_add(f.metadata().map(|m| m.len()).unwrap_or(0));
                    n += 1;
                }
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
    /// What its entries are: `pixels` (decoded images), `tokens` (tokenized documents) or
    /// `shard parts` (parts of shards in object storage).
    pub kind: &'static str,
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

/// Whether `name` is a group's directory name: a kind's letter (`v` pixels, `t` tokens, `s`
/// parts of shards in object storage), its
/// format version, `-`, the rest.
fn is_group_name(name: &str) -> bool {
    group_kind(name).is_some()
}

/// The kind letter and format version of a group's directory name.
fn group_kind(name: &str) -> Option<(char, u32)> {
    let mut chars = name.chars();
    let letter = chars.next().filter(|c| matches!(c, 'v' | 't' | 's'))?;
    let (version, rest) = chars.as_str().split_once('-')?;
    (!rest.is_empty()).then_some(())?;
    Some((letter, version.parse().ok()?))
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
    let kind = match dir.file_name().and_then(|n| group_kind(&n.to_string_lossy())) {
        Some(('t', _)) => "tokens",
        Some(('s', _)) => "shard parts",
        _ => "pixels",
    };
    GroupInfo {
        dir: dir.to_path_buf(),
        kind,
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

/// Whether process `pid` (this one included) still exists: what tells a killed process's
/// leftovers (named with its pid) from a live one's.
pub(crate) fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    pid == std::process::id() as i32 || unsafe { libc::kill(pid, 0) } == 0
}

/// Deletes groups moved aside, and leftovers of removals that a killed process did not finish.
fn remove_trash(root: &Path, mut trash: Vec<PathBuf>) {
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if let Some(rest) = n.strip_prefix(".trash-") {
                let pid = rest.split('-').next().and_then(|p| p.parse::<i32>().ok());
                if !pid.is_some_and(process_alive) {
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

/// Writes `group.json` (what the group caches, for `stoker cache`) unless it exists.
fn write_group_json(dir: &Path, dataset: &DatasetKey, settings: &str, version: u32) {
    let path = dir.join("group.json");
    if path.exists() {
        return;
    }
    let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let text = serde_json::json!({
        "format": version,
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

/// A kind of group: its directory-name letter and entry format version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupKind {
    /// `v` for pixels, `t` for tokens, `s` for parts of shards.
    pub letter: char,
    /// The kind's entry format version (groups of another version are removed when idle).
    pub version: u32,
}

/// The counters a group keeps for the cache using it: what this process's use of the group
/// did, for every kind of entry.
#[derive(Debug, Default)]
pub struct GroupCounters {
    /// Entries (samples, documents) served from the cache.
    pub hits: AtomicU64,
    /// Entries not in the cache, or that failed their checks (made anew).
    pub misses: AtomicU64,
    /// Entries this process stored.
    pub stored: AtomicU64,
    /// Bytes this process stored.
    pub stored_bytes: AtomicU64,
    /// Entry bytes read from the cache.
    pub read_bytes: AtomicU64,
    /// Entries not stored because the budget was used.
    pub not_stored_budget: AtomicU64,
    /// Entries that failed their checksums when read (served as misses).
    pub verify_failures: AtomicU64,
    /// Writes that failed (disk full, ...): the run went on.
    pub write_errors: AtomicU64,
    /// Locks on shared files not obtained within [`LOCK_DEADLINE`].
    pub lock_timeouts: AtomicU64,
    /// Idle groups evicted or removed by this process.
    pub evicted_groups: AtomicU64,
    /// Bytes those groups held.
    pub evicted_bytes: AtomicU64,
    /// Bytes held by groups in use by other processes when an entry did not fit.
    pub held_by_others: AtomicU64,
}

impl GroupCounters {
    /// Zeroes the counters.
    pub fn reset(&self) {
        for a in [
            &self.hits,
            &self.misses,
            &self.stored,
            &self.stored_bytes,
            &self.read_bytes,
            &self.not_stored_budget,
            &self.verify_failures,
            &self.write_errors,
            &self.lock_timeouts,
            &self.evicted_groups,
            &self.evicted_bytes,
            &self.held_by_others,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }
}

/// What a cache group did in this process: the part of the `cache` field of a loader's report
/// that every kind of cache has (a kind's report adds its own fields beside it).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupReport {
    /// This dataset's group directory (`stoker cache clear` removes it when idle).
    pub dir: String,
    /// The cache root, shared by the groups of every dataset and kind.
    pub root: String,
    /// The byte budget (shared by every group under the root).
    pub budget_bytes: u64,
    /// Bytes stored in this group, by all processes.
    pub used_bytes: u64,
    /// Entries served from the cache (no decode, no read and tokenizing).
    pub hits: u64,
    /// Entries made anew (not in the cache, or an entry that failed its checks).
    pub misses: u64,
    /// Entries this process stored.
    pub stored: u64,
    /// Bytes this process stored (headers and records included).
    pub stored_bytes: u64,
    /// Entry bytes read from the cache.
    pub read_bytes: u64,
    /// Entries not stored because the budget was used (by this dataset or by groups in use).
    pub not_stored_budget: u64,
    /// Entries that failed their checksums when read (served as misses, rewritten).
    pub verify_failures: u64,
    /// Writes that failed (disk full, ...): the run went on.
    pub write_errors: u64,
    /// Locks on the cache's shared files not obtained within [`LOCK_DEADLINE`] (another
    /// process held them): the entry was not stored.
    pub lock_timeouts: u64,
    /// Idle groups of other datasets this process evicted to make room (least recently used
    /// first) or removed because their time to live had passed.
    pub evicted_groups: u64,
    /// Bytes those groups held.
    pub evicted_bytes: u64,
}

/// A group joined by this process: its directory, the root's budget, and the locks.
#[derive(Debug)]
pub struct Group {
    root: PathBuf,
    dir: PathBuf,
    budget: u64,
    ttl: Option<Duration>,
    kind: GroupKind,
    /// `ROOT/.lock`: taken exclusively to change any group's `usage` or to remove a group.
    root_lock: File,
    usage: File,
    /// `GROUP/lock`, held shared while this group is open: the group is in use.
    member: Option<File>,
    /// `flock` excludes other processes only (this process's threads share one open file
    /// description), so the threads of this process take this lock first.
    usage_lock: std::sync::Mutex<()>,
    /// Numbers temporary names.
    seq: AtomicU64,
    /// When the root lock last timed out: for [`BUSY_BACKOFF`] after it, entries are not
    /// stored and nobody waits for the lock again (one wait, not one per entry).
    busy_since: std::sync::Mutex<Option<std::time::Instant>>,
    /// What this process's use of the group did.
    pub counters: GroupCounters,
}

impl Group {
    /// Opens (creating it if needed) the group `kind`/`settings`/`dataset` under `location`,
    /// with a budget of `bytes` (`None`: a quarter of `MemAvailable` for `ram`, half the free
    /// space for a directory, both capped by the free space) and the time to live `ttl`
    /// (`None`: the location's default); idle groups past their time to live, and idle groups of
    /// the kind's older formats, are removed. Errors are [`Error::Config`] naming `cache`.
    pub fn open(
        location: &CacheLocation,
        bytes: Option<u64>,
        ttl: Option<Ttl>,
        kind: GroupKind,
        settings: &str,
        dataset: &DatasetKey,
    ) -> Result<Self> {
        let root = match location {
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
        let ttl = match ttl {
            Some(Ttl::After(t)) => Some(t),
            Some(Ttl::Never) => None,
            None => matches!(location, CacheLocation::Ram).then_some(RAM_TTL),
        };
        let name = format!(
            "{}{}-{:016x}-{:016x}",
            kind.letter,
            kind.version,
            xxhash_rust::xxh3::xxh3_64(settings.as_bytes()),
            dataset.hash
        );
        let dir = root.join(&name);
        let bad = |what: &str, e: std::io::Error| {
            Error::config("cache", format!("cannot use {} as a cache directory ({what}: {e})", root.display()))
        };
        std::fs::create_dir_all(&root).map_err(|e| bad("create", e))?;
        let root_lock = open_rw(&root.join(".lock")).map_err(|e| bad("write", e))?;
        let counters = GroupCounters::default();
        // Join the group: hold its lock shared, and check that the lock is still the group's
        // (an evictor may have moved the group aside between our open and our lock).
        let mut member = None;
        for _ in 0..4 {
            std::fs::create_dir_all(&dir).map_err(|e| bad("create", e))?;
            write_group_json(&dir, dataset, settings, kind.version);
            let f = match open_rw(&dir.join("lock")) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // moved aside meanwhile
                Err(e) => return Err(bad("write", e)),
            };
            if !flock_within(&f, false, LOCK_DEADLINE).map_err(|e| bad("lock", e))? {
                counters.lock_timeouts.fetch_add(1, Ordering::Relaxed);
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
        let budget = match bytes {
            Some(b) => b,
            None => {
                let base = match location {
                    CacheLocation::Ram => mem_available().map(|m| m / 4),
                    CacheLocation::Dir(_) => free.map(|f| f / 2),
                };
                base.unwrap_or(0).min(free.unwrap_or(u64::MAX))
            }
        };
        let group = Group {
            root,
            dir,
            budget,
            ttl,
            kind,
            root_lock,
            usage,
            member,
            usage_lock: std::sync::Mutex::new(()),
            seq: AtomicU64::new(0),
            busy_since: std::sync::Mutex::new(None),
            counters,
        };
        group.settle();
        Ok(group)
    }

    /// The root lock, waited for at most [`LOCK_DEADLINE`], and not at all for
    /// [`BUSY_BACKOFF`] after a wait timed out; `None` (counted in `lock_timeouts`) when not
    /// obtained.
    fn lock_root(&self) -> Option<Locked<'_>> {
        let mut busy = self.busy_since.lock().unwrap_or_else(|p| p.into_inner());
        if busy.is_some_and(|t| t.elapsed() < BUSY_BACKOFF) {
            self.counters.lock_timeouts.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match Locked::within(&self.root_lock, true, LOCK_DEADLINE) {
            Ok(Some(l)) => {
                *busy = None;
                Some(l)
            }
            _ => {
                *busy = Some(std::time::Instant::now());
                self.counters.lock_timeouts.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Under the root lock: counts a group found without its `usage` (a new group, or one
    /// whose count was lost), and removes idle groups past their time to live and idle groups
    /// of this kind's other formats.
    fn settle(&self) {
        let Some(_l) = self.lock_root() else { return };
        if self.usage.metadata().map(|m| m.len()).unwrap_or(0) < 8 {
            let _ = self.usage.write_all_at(&scan_bytes(&self.dir).0.to_le_bytes(), 0);
        }
        let mut trash = vec![];
        for g in list_groups(&self.root) {
            if g.dir == self.dir || g.in_use {
                continue;
            }
            // Groups of an older entry format can never be read by this version: they go
            // whatever their age (their bytes would otherwise count against the budget).
            let kind = g.dir.file_name().and_then(|n| group_kind(&n.to_string_lossy()));
            let old_format = kind.is_some_and(|(l, v)| l == self.kind.letter && v != self.kind.version);
            if old_format || self.ttl.is_some_and(|ttl| g.idle_seconds >= ttl.as_secs()) {
                if let Some(t) = take_idle(&self.root, &g.dir, &self.seq) {
                    self.counters.evicted_groups.fetch_add(1, Ordering::Relaxed);
                    self.counters.evicted_bytes.fetch_add(g.bytes, Ordering::Relaxed);
                    trash.push(t);
                }
            }
        }
        drop(_l);
        remove_trash(&self.root, trash);
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The root, shared by every group.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The byte budget (shared by every group under the root).
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes stored in this group by all processes.
    pub fn used(&self) -> u64 {
        read_u64(&self.usage)
    }

    /// What this process's use of the group did (see [`GroupReport`]).
    pub fn report(&self) -> GroupReport {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        GroupReport {
            dir: self.dir.display().to_string(),
            root: self.root.display().to_string(),
            budget_bytes: self.budget,
            used_bytes: self.used(),
            hits: get(&c.hits),
            misses: get(&c.misses),
            stored: get(&c.stored),
            stored_bytes: get(&c.stored_bytes),
            read_bytes: get(&c.read_bytes),
            not_stored_budget: get(&c.not_stored_budget),
            verify_failures: get(&c.verify_failures),
            write_errors: get(&c.write_errors),
            lock_timeouts: get(&c.lock_timeouts),
            evicted_groups: get(&c.evicted_groups),
            evicted_bytes: get(&c.evicted_bytes),
        }
    }

    /// Bytes held under the root by other groups.
    pub fn other_groups_bytes(&self) -> u64 {
        list_groups(&self.root).iter().filter(|g| g.dir != self.dir).map(|g| g.bytes).sum()
    }

    /// A number for a temporary name, unique in this process for this group.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Reserves `n` bytes of the budget shared by the root's groups, evicting idle groups of
    /// other datasets (least recently used first) when they do not fit; false when they still
    /// do not (the rest is held by this dataset or by groups in use), `None` when the root lock
    /// was not obtained in time.
    pub fn reserve(&self, n: u64) -> Option<bool> {
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
            if let Some(t) = take_idle(&self.root, &g.dir, &self.seq) {
                total = total.saturating_sub(g.bytes);
                self.counters.evicted_groups.fetch_add(1, Ordering::Relaxed);
                self.counters.evicted_bytes.fetch_add(g.bytes, Ordering::Relaxed);
                trash.push(t);
            }
        }
        let mut fits = total.saturating_add(n) <= self.budget;
        if fits {
            fits = self.usage.write_all_at(&own.saturating_add(n).to_le_bytes(), 0).is_ok();
        } else {
            let held = total.saturating_sub(own);
            self.counters.held_by_others.store(held, Ordering::Relaxed);
        }
        drop(l);
        remove_trash(&self.root, trash);
        Some(fits)
    }

    /// Gives back `n` reserved bytes (an entry that could not be written).
    pub fn unreserve(&self, n: u64) {
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(_l) = self.lock_root() {
            let used = read_u64(&self.usage).saturating_sub(n);
            let _ = self.usage.write_all_at(&used.to_le_bytes(), 0);
        }
    }

    /// Removes the file `path` of this group if it is still the file `ino` (a bad entry), and
    /// gives its `len` bytes back to the budget.
    pub fn remove_entry(&self, path: &Path, ino: u64, len: u64) {
        let _threads = self.usage_lock.lock().unwrap_or_else(|p| p.into_inner());
        let Some(_l) = self.lock_root() else { return };
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == ino) && std::fs::remove_file(path).is_ok() {
            let used = read_u64(&self.usage).saturating_sub(len);
            let _ = self.usage.write_all_at(&used.to_le_bytes(), 0);
        }
    }
}

impl Drop for Group {
    /// Leaves the group: its last use is now. With a time to live of zero, the last process
    /// to leave a group removes it.
    fn drop(&mut self) {
        let Some(member) = self.member.take() else { return };
        let _ = member.set_modified(SystemTime::now());
        drop(member);
        if self.ttl == Some(Duration::ZERO) {
            if let Ok(Some(l)) = Locked::within(&self.root_lock, true, LOCK_DEADLINE) {
                let t = take_idle(&self.root, &self.dir, &self.seq);
                drop(l);
                remove_trash(&self.root, t.into_iter().collect());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_carry_kind_and_version() {
        assert_eq!(group_kind("v3-0123-4567"), Some(('v', 3)));
        assert_eq!(group_kind("t1-ab-cd"), Some(('t', 1)));
        assert_eq!(group_kind("t1-"), None);
        assert_eq!(group_kind("x1-ab"), None);
        assert_eq!(group_kind(".lock"), None);
        assert_eq!(group_kind("vx-ab"), None);
    }

    #[test]
    fn scan_counts_entries_not_control_files() {
        let d = std::env::temp_dir().join(format!("stoker-store-scan-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("ab")).unwrap();
        for (p, n) in [("group.json", 10), ("usage", 8), ("lock", 0), (".tmp-x", 5), ("seg.tok", 7), ("ab/k.px", 11)] {
            std::fs::write(d.join(p), vec![0u8; n]).unwrap();
        }
        assert_eq!(scan_bytes(&d), (18, 2));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
