//! The host-wide CPU budget: several stoker processes on one host (one per GPU under torchrun,
//! or two unrelated trainers) share the host's cores instead of each starting a thread per core.
//!
//! A small text file (default `/dev/shm/stoker-cpu-budget`; `STOKER_BUDGET_FILE` names another,
//! `STOKER_SHARED_BUDGET=0` turns sharing off) lists every live loader that takes part, one line
//! each: `pid start-time id kind demand`. Every access holds an exclusive `flock` on it. The
//! process start time (field 22 of `/proc/PID/stat`) defeats pid reuse: an entry whose process
//! is gone, or whose pid now belongs to a newer process, is pruned by whoever reads the file
//! next. A line that does not parse (a corrupt or foreign file) is dropped: the registry resets
//! those lines rather than failing.
//!
//! The split ([`allocate`]): loaders with a fixed thread count (`kind f`) keep what they asked
//! for (they cannot adapt), so the autotuned ones (`kind a`) leave them room; the cores left are
//! dealt out one at a time, round-robin in registration order, to the autotuned loaders whose
//! demand is not met. Every autotuned loader gets at least one core, so more loaders than cores
//! oversubscribe by that one thread each rather than stall.
//!
//! The lock is never waited for without end: a process that holds it (stopped, traced, hung)
//! must not stop every loader on the host. It is taken with `LOCK_NB`, retried with short sleeps
//! until a deadline: [`LOCK_WAIT`] to register or deregister (a loader that cannot register runs
//! without sharing, on its own `cpu_budget`, and its report says so), [`REFRESH_LOCK_WAIT`] to
//! re-read the share on the consumer's thread (a busy registry keeps the last share until the
//! next refresh).

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a registration re-reads the file.
pub const REFRESH: Duration = Duration::from_millis(500);

/// The longest wait for the registry's lock when a loader registers, deregisters or lists it.
pub const LOCK_WAIT: Duration = Duration::from_millis(1500);

/// The longest wait for the registry's lock when a registration re-reads its share or changes
/// its demand (on the consumer's thread, every [`REFRESH`]).
pub const REFRESH_LOCK_WAIT: Duration = Duration::from_millis(20);

/// The registry file's default path.
pub const DEFAULT_FILE: &str = "/dev/shm/stoker-cpu-budget";

/// The registry file the loaders of a host share when nothing else is configured:
/// [`DEFAULT_FILE`], or `stoker-cpu-budget` in the temp dir on a host without `/dev/shm`.
pub fn default_path() -> std::path::PathBuf {
    if std::path::Path::new("/dev/shm").is_dir() {
        DEFAULT_FILE.into()
    } else {
        std::env::temp_dir().join("stoker-cpu-budget")
    }
}

/// What a config's `cpu_registry` holds when it says nothing: the default registry.
pub fn default_registry_path() -> Option<std::path::PathBuf> {
    Some(default_path())
}

/// Whether a loader's thread count adapts to its share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Autotuned (`threads="auto"`): uses at most its share.
    Auto,
    /// A fixed `threads=N`: uses N whatever the share; registered so others leave it room.
    Fixed,
}

/// One line of the registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Process id.
    pub pid: u32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat` field 22).
    pub start: u64,
    /// The loader within its process.
    pub id: u64,
    /// Fixed or autotuned.
    pub kind: Kind,
    /// Cores (threads) it wants.
    pub demand: usize,
}

impl Entry {
    fn line(&self) -> String {
        let k = match self.kind {
            Kind::Auto => 'a',
            Kind::Fixed => 'f',
        };
        format!("{} {} {} {} {}\n", self.pid, self.start, self.id, k, self.demand)
    }

    fn parse(line: &str) -> Option<Entry> {
        let mut it = line.split_ascii_whitespace();
        let pid = it.next()?.parse().ok()?;
        let start = it.next()?.parse().ok()?;
        let id = it.next()?.parse().ok()?;
        let kind = match it.next()? {
            "a" => Kind::Auto,
            "f" => Kind::Fixed,
            _ => return None,
        };
        let demand: usize = it.next()?.parse().ok()?;
        (it.next().is_none() && demand > 0 && pid > 0).then_some(Entry { pid, start, id, kind, demand })
    }

    fn key(&self) -> (u32, u64, u64) {
        (self.pid, self.start, self.id)
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`), `None` if it is gone.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// The host's online cores (not this process's allowance: the registry splits the host).
pub fn host_cores() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as usize
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
}

/// The cores each entry gets, in `entries` order (see the module docs).
pub fn allocate(entries: &[Entry], cores: usize) -> Vec<usize> {
    let mut rem = cores;
    let mut out: Vec<usize> = entries
        .iter()
        .map(|e| match e.kind {
            Kind::Fixed => {
                let a = e.demand.min(rem);
                rem -= a;
                e.demand
            }
            Kind::Auto => 0,
        })
        .collect();
    loop {
        let mut progress = false;
        for (e, a) in entries.iter().zip(out.iter_mut()) {
            if e.kind == Kind::Auto && *a < e.demand && rem > 0 {
                *a += 1;
                rem -= 1;
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    for (e, a) in entries.iter().zip(out.iter_mut()) {
        if e.kind == Kind::Auto {
            *a = (*a).max(1);
        }
    }
    out
}

/// What a registration's last read of the file said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    /// The host's cores.
    pub cores: usize,
    /// Cores this loader may use.
    pub cores_for_me: usize,
    /// Distinct processes in the registry (this one included).
    pub processes: usize,
    /// Loaders in the registry (this one included).
    pub loaders: usize,
}

/// A registry file.
#[derive(Debug, Clone)]
pub struct Registry {
    path: PathBuf,
}

/// Why the registry could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Another process held the lock past the deadline (a stopped, traced or hung process).
    #[error("{}: {}", .path.display(), busy_reason(*.waited))]
    Busy {
        /// The registry file.
        path: PathBuf,
        /// How long the lock was waited for.
        waited: Duration,
    },
    /// The file could not be opened, read or written.
    #[error(transparent)]
    Other(#[from] Error),
}

fn busy_reason(waited: Duration) -> String {
    format!("the registry is busy: locked by another process for more than {:.1} s", waited.as_secs_f64())
}

impl RegistryError {
    /// Whether the lock was held by another process past the deadline.
    pub fn is_busy(&self) -> bool {
        matches!(self, RegistryError::Busy { .. })
    }
}

impl From<RegistryError> for Error {
    fn from(e: RegistryError) -> Self {
        match e {
            RegistryError::Busy { path, waited } => Error::Io { path, reason: busy_reason(waited) },
            RegistryError::Other(e) => e,
        }
    }
}

/// Takes an exclusive `flock` on `file` within `wait`: `LOCK_NB` attempts with sleeps that
/// grow from 1 ms to 50 ms. `Ok(false)`: still held by someone else at the deadline.
fn lock_within(file: &File, wait: Duration) -> std::io::Result<bool> {
    let deadline = Instant::now() + wait;
    let mut pause = Duration::from_millis(1);
    loop {
        // SAFETY: flock on a file descriptor we own; with LOCK_NB it never blocks. The lock is
        // released when the descriptor closes (when `Locked` drops).
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => {}
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Holds the registry's lock while alive.
struct Locked {
    file: File,
}

impl Locked {
    /// Opens the registry and takes its lock, waiting at most `wait`.
    fn open(path: &Path, wait: Duration) -> std::result::Result<Locked, RegistryError> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .map_err(|e| Error::io(path, &e))?;
        match lock_within(&file, wait) {
            Ok(true) => Ok(Locked { file }),
            Ok(false) => Err(RegistryError::Busy { path: path.to_path_buf(), waited: wait }),
            Err(e) => Err(Error::io(path, &e).into()),
        }
    }

    /// The live entries, and whether anything was dropped (dead or unparsable).
    fn read(&mut self) -> (Vec<Entry>, bool) {
        let mut bytes = vec![];
        if self.file.seek(SeekFrom::Start(0)).and_then(|_| self.file.read_to_end(&mut bytes)).is_err() {
            return (vec![], true);
        }
        let text = String::from_utf8_lossy(&bytes);
        let mut changed = false;
        let mut out: Vec<Entry> = vec![];
        for line in text.lines() {
            match Entry::parse(line) {
                Some(e) if start_time(e.pid) == Some(e.start) && !out.iter().any(|o| o.key() == e.key()) => out.push(e),
                _ => changed = true,
            }
        }
        (out, changed)
    }

    fn write(&mut self, entries: &[Entry], path: &Path) -> Result<()> {
        let text: String = entries.iter().map(Entry::line).collect();
        let io = |e: std::io::Error| Error::io(path, &e);
        self.file.set_len(0).map_err(io)?;
        self.file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.write_all(text.as_bytes()).map_err(io)
    }
}

impl Registry {
    /// The registry at `path`.
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Registry { path: path.into() }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The live entries (pruning dead and unparsable ones from the file).
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let mut l = Locked::open(&self.path, LOCK_WAIT)?;
        let (entries, changed) = l.read();
        if changed {
            l.write(&entries, &self.path)?;
        }
        Ok(entries)
    }

    /// Registers this process's loader, wanting `demand` cores. Gives up with
    /// [`RegistryError::Busy`] when another process holds the lock for [`LOCK_WAIT`].
    pub fn register(&self, kind: Kind, demand: usize) -> std::result::Result<Registration, RegistryError> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let pid = std::process::id();
        let start = start_time(pid)
            .ok_or_else(|| Error::Internal("cannot read this process's start time from /proc".into()))?;
        let entry = Entry { pid, start, id: NEXT.fetch_add(1, Ordering::Relaxed), kind, demand: demand.max(1) };
        let reg = Registration {
            registry: self.clone(),
            entry: Mutex::new(entry),
            cached: Mutex::new(None),
            cores: host_cores(),
            busy_refreshes: AtomicU64::new(0),
        };
        reg.update(|_| (), LOCK_WAIT)?;
        Ok(reg)
    }
}

/// One loader's entry in the registry; removed when dropped (by the registering process only:
/// a fork child that inherits it leaves the parent's entry alone).
#[derive(Debug)]
pub struct Registration {
    registry: Registry,
    entry: Mutex<Entry>,
    cached: Mutex<Option<(Instant, Share)>>,
    cores: usize,
    /// Refreshes that found the lock held past [`REFRESH_LOCK_WAIT`].
    busy_refreshes: AtomicU64,
}

impl Registration {
    /// Reads (and rewrites) the file under its lock (waiting at most `wait` for it) with this
    /// entry present, after `change`. The change stays in memory when the file cannot be
    /// written, so the next successful update records it.
    fn update(&self, change: impl FnOnce(&mut Entry), wait: Duration) -> std::result::Result<Share, RegistryError> {
        let mut me = self.entry.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut me);
        let mut l = Locked::open(&self.registry.path, wait)?;
        let (mut entries, _) = l.read();
        match entries.iter_mut().find(|e| e.key() == me.key()) {
            Some(e) => *e = me.clone(),
            None => entries.push(me.clone()),
        }
        l.write(&entries, &self.registry.path)?;
        let alloc = allocate(&entries, self.cores);
        let mine = entries.iter().position(|e| e.key() == me.key()).map_or(1, |i| alloc[i]);
        let mut pids: Vec<u32> = entries.iter().map(|e| e.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let share = Share { cores: self.cores, cores_for_me: mine, processes: pids.len(), loaders: entries.len() };
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), share.clone()));
        Ok(share)
    }

    /// This loader's share, re-read from the file when the last read is older than
    /// [`REFRESH`] (or `force`), waiting at most [`REFRESH_LOCK_WAIT`] for the lock. A file
    /// that cannot be read, or a lock held by another process, keeps the last share until the
    /// next refresh.
    pub fn share(&self, force: bool) -> Option<Share> {
        let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match cached {
            Some((t, s)) if !force && t.elapsed() < REFRESH => Some(s),
            old => match self.update(|_| (), REFRESH_LOCK_WAIT) {
                Ok(s) => Some(s),
                Err(e) => self.keep(old, &e),
            },
        }
    }

    /// After a failed refresh: the last share, tried again after [`REFRESH`] rather than at
    /// the next call.
    fn keep(&self, old: Option<(Instant, Share)>, e: &RegistryError) -> Option<Share> {
        if e.is_busy() {
            self.busy_refreshes.fetch_add(1, Ordering::Relaxed);
        }
        let (_, s) = old?;
        *self.cached.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), s.clone()));
        Some(s)
    }

    /// Changes the demand (an autotuned loader that settled below its budget gives the rest
    /// back). `None` when the file could not be updated now (the lock was busy, ...): the new
    /// demand is written by the next refresh that gets the lock.
    pub fn set_demand(&self, demand: usize) -> Option<Share> {
        match self.update(|e| e.demand = demand.max(1), REFRESH_LOCK_WAIT) {
            Ok(s) => Some(s),
            Err(e) => {
                let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner()).clone();
                self.keep(cached, &e);
                None
            }
        }
    }

    /// Refreshes (and demand changes) that found the registry's lock held by another process
    /// past [`REFRESH_LOCK_WAIT`] and kept the last share.
    pub fn busy_refreshes(&self) -> u64 {
        self.busy_refreshes.load(Ordering::Relaxed)
    }

    /// The registry file.
    pub fn path(&self) -> &Path {
        self.registry.path()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let me = self.entry.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if me.pid != std::process::id() {
            return;
        }
        // Waits at most LOCK_WAIT: an entry left behind by a busy registry is pruned once
        // this process has exited.
        if let Ok(mut l) = Locked::open(&self.registry.path, LOCK_WAIT) {
            let (mut entries, _) = l.read();
            entries.retain(|e| e.key() != me.key());
            let _ = l.write(&entries, &self.registry.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(kind: Kind, demand: usize) -> Entry {
        Entry { pid: 1, start: 1, id: 0, kind, demand }
    }

    #[test]
    fn allocation_splits_the_host() {
        assert_eq!(allocate(&[e(Kind::Auto, 2), e(Kind::Auto, 2)], 2), vec![1, 1]);
        assert_eq!(allocate(&[e(Kind::Auto, 8), e(Kind::Auto, 1)], 4), vec![3, 1]);
        assert_eq!(allocate(&[e(Kind::Fixed, 3), e(Kind::Auto, 8)], 4), vec![3, 1]);
        // More loaders than cores: one each (documented oversubscription).
        assert_eq!(allocate(&[e(Kind::Auto, 2), e(Kind::Auto, 2), e(Kind::Auto, 2)], 2), vec![1, 1, 1]);
        assert_eq!(allocate(&[e(Kind::Auto, 2)], 16), vec![2]);
    }

    #[test]
    fn lines_round_trip_and_garbage_is_rejected() {
        let x = Entry { pid: 42, start: 7, id: 3, kind: Kind::Fixed, demand: 4 };
        assert_eq!(Entry::parse(x.line().trim()), Some(x));
        for bad in ["", "1 2 3 a", "1 2 3 z 4", "x 2 3 a 4", "1 2 3 a 0", "1 2 3 a 4 5"] {
            assert_eq!(Entry::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn own_start_time_is_readable() {
        assert!(start_time(std::process::id()).is_some());
        assert_eq!(start_time(u32::MAX), None);
    }

    #[test]
    fn a_held_lock_is_waited_for_until_the_deadline_only() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("budget");
        let reg = Registry::at(&path);
        let held = Locked::open(&path, LOCK_WAIT).unwrap();
        let t = Instant::now();
        let err = reg.register(Kind::Auto, 2).unwrap_err();
        assert!(err.is_busy(), "{err}");
        assert!(t.elapsed() >= LOCK_WAIT && t.elapsed() < LOCK_WAIT * 10, "{:?}", t.elapsed());
        assert!(err.to_string().contains(&path.display().to_string()) && err.to_string().contains("busy"), "{err}");
        assert!(reg.entries().is_err());
        drop(held);
        // Once it is free, registration works; a refresh under a held lock keeps the last
        // share, counts it, and does not try again before REFRESH.
        let a = reg.register(Kind::Auto, 2).unwrap();
        let before = a.share(true).unwrap();
        let held = Locked::open(&path, LOCK_WAIT).unwrap();
        let t = Instant::now();
        assert_eq!(a.share(true), Some(before.clone()));
        assert!(t.elapsed() < LOCK_WAIT, "{:?}", t.elapsed());
        assert_eq!(a.busy_refreshes(), 1);
        assert_eq!(a.share(false), Some(before));
        assert_eq!(a.busy_refreshes(), 1, "a busy registry is retried after REFRESH, not at every batch");
        assert_eq!(a.set_demand(1), None);
        drop(held);
        assert_eq!(a.share(true).unwrap().loaders, 1);
        assert_eq!(reg.entries().unwrap()[0].demand, 1, "the deferred demand was written");
    }
}
