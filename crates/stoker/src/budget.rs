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

/// The registry file's default path.
pub const DEFAULT_FILE: &str = "/dev/shm/stoker-cpu-budget";

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

/// Holds the registry's lock while alive.
struct Locked {
    file: File,
}

impl Locked {
    fn open(path: &Path) -> Result<Locked> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .open(path)
            .map_err(|e| Error::io(path, &e))?;
        // SAFETY: flock on a file descriptor we own; it blocks until the lock is ours and is
        // released when the descriptor closes (when `Locked` drops).
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(Error::io(path, &std::io::Error::last_os_error()));
        }
        Ok(Locked { file })
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

    /// The registry the environment names: `STOKER_BUDGET_FILE`, else [`DEFAULT_FILE`] (or the
    /// temp dir without `/dev/shm`); `None` when `STOKER_SHARED_BUDGET=0` turns sharing off.
    pub fn from_env() -> Option<Self> {
        if std::env::var("STOKER_SHARED_BUDGET").is_ok_and(|v| matches!(v.trim(), "0" | "false" | "off" | "no")) {
            return None;
        }
        if let Some(p) = std::env::var_os("STOKER_BUDGET_FILE").filter(|p| !p.is_empty()) {
            return Some(Registry::at(p));
        }
        if Path::new("/dev/shm").is_dir() {
            Some(Registry::at(DEFAULT_FILE))
        } else {
            Some(Registry::at(std::env::temp_dir().join("stoker-cpu-budget")))
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The live entries (pruning dead and unparsable ones from the file).
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let mut l = Locked::open(&self.path)?;
        let (entries, changed) = l.read();
        if changed {
            l.write(&entries, &self.path)?;
        }
        Ok(entries)
    }

    /// Registers this process's loader, wanting `demand` cores.
    pub fn register(&self, kind: Kind, demand: usize) -> Result<Registration> {
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
        };
        reg.update(|_| ())?;
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
}

impl Registration {
    /// Reads (and rewrites) the file under its lock with this entry present, after `change`.
    fn update(&self, change: impl FnOnce(&mut Entry)) -> Result<Share> {
        let mut me = self.entry.lock().unwrap_or_else(|p| p.into_inner());
        change(&mut me);
        let mut l = Locked::open(&self.registry.path)?;
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
    /// [`REFRESH`] (or `force`). A file that cannot be read keeps the last share.
    pub fn share(&self, force: bool) -> Option<Share> {
        let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match cached {
            Some((t, s)) if !force && t.elapsed() < REFRESH => Some(s),
            old => self.update(|_| ()).ok().or(old.map(|(_, s)| s)),
        }
    }

    /// Changes the demand (an autotuned loader that settled below its budget gives the rest
    /// back).
    pub fn set_demand(&self, demand: usize) -> Option<Share> {
        self.update(|e| e.demand = demand.max(1)).ok()
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
        if let Ok(mut l) = Locked::open(&self.registry.path) {
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
}
