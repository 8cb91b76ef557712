//! Reading a process tree and the host from `/proc`, cheaply enough to do ten times a second:
//! the files read at every tick stay open and are re-read with `pread` (no path walk, no
//! open/close per read); the tree and thread lists, context switches, I/O bytes and `/dev/shm` are
//! read once a second, and PSS (`smaps_rollup`, whose making walks every page table) every 30.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Fields of `/proc/PID/stat` (or `task/TID/stat`) that the monitor uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stat {
    /// The command name (a thread's name for a task).
    pub comm: String,
    /// R, S, D, Z, T, ...
    pub state: char,
    /// Parent process id.
    pub ppid: u32,
    /// Minor and major page faults.
    pub minflt: u64,
    /// Major page faults (read from disk).
    pub majflt: u64,
    /// User and system CPU, clock ticks.
    pub utime: u64,
    /// System CPU, clock ticks.
    pub stime: u64,
    /// Threads in the process.
    pub num_threads: u64,
    /// Start time, clock ticks after boot (with the pid, identifies a process).
    pub starttime: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Parses a stat line. The command name sits in parentheses and may itself contain spaces and
/// parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(s: &str) -> Option<Stat> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let comm = s.get(open + 1..close)?.to_string();
    let f: Vec<&str> = s.get(close + 1..)?.split_ascii_whitespace().collect();
    // f[0] is field 3 (state) of proc(5).
    let num = |field: usize| -> Option<u64> { f.get(field - 3)?.parse().ok() };
    Some(Stat {
        comm,
        state: f.first()?.chars().next()?,
        ppid: num(4)? as u32,
        minflt: num(10)?,
        majflt: num(12)?,
        utime: num(14)?,
        stime: num(15)?,
        num_threads: num(20)?,
        starttime: num(22)?,
        rss_pages: num(24)?,
    })
}

/// `schedstat`: nanoseconds on a CPU, nanoseconds runnable but waiting for one, timeslices.
pub fn parse_schedstat(s: &str) -> Option<(u64, u64)> {
    let mut it = s.split_ascii_whitespace().map(|x| x.parse::<u64>().ok());
    Some((it.next()??, it.next()??))
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a `status` file.
pub fn parse_switches(s: &str) -> Option<(u64, u64)> {
    let get =
        |key: &str| -> Option<u64> { s.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok()) };
    Some((get("voluntary_ctxt_switches:")?, get("nonvoluntary_ctxt_switches:")?))
}

/// The `Pss:` line of `smaps_rollup`, in bytes.
pub fn parse_pss(s: &str) -> Option<u64> {
    let v = s.lines().find_map(|l| l.strip_prefix("Pss:"))?;
    Some(v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
}

/// `read_bytes` (from storage) and `rchar` (all reads, page cache included) of an `io` file.
pub fn parse_io(s: &str) -> Option<(u64, u64)> {
    let get =
        |key: &str| -> Option<u64> { s.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse().ok()) };
    Some((get("read_bytes:")?, get("rchar:")?))
}

/// One `cpu` line of `/proc/stat`: (busy, steal, total) in clock ticks. Busy counts user, nice,
/// system, irq and softirq; idle and iowait are idle; guest time is already inside user.
pub fn parse_cpu_line(l: &str) -> Option<(u64, u64, u64)> {
    let v: Vec<u64> = l.split_ascii_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    if v.len() < 4 {
        return None;
    }
    let g = |i: usize| v.get(i).copied().unwrap_or(0);
    let (user, nice, system, idle, iowait, irq, softirq, steal) = (g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
    let busy = user + nice + system + irq + softirq;
    Some((busy, steal, busy + idle + iowait + steal))
}

/// A file kept open and re-read from offset 0.
struct Held(File, Vec<u8>);

impl Held {
    fn open(p: &Path) -> Option<Held> {
        File::open(p).ok().map(|f| Held(f, Vec::with_capacity(512)))
    }

    fn read(&mut self) -> Option<&str> {
        self.1.clear();
        let mut chunk = [0u8; 4096];
        loop {
            let n = self.0.read_at(&mut chunk, self.1.len() as u64).ok()?;
            if n == 0 {
                break;
            }
            self.1.extend_from_slice(&chunk[..n]);
            if self.1.len() > 1 << 20 {
                break;
            }
        }
        if self.1.is_empty() {
            return None;
        }
        std::str::from_utf8(&self.1).ok()
    }
}

/// A thread's reading at one tick.
#[derive(Debug, Clone, Default)]
pub struct ThreadRead {
    /// Thread id.
    pub tid: u32,
    /// Its name and counters.
    pub stat: Stat,
    /// Nanoseconds on a CPU and waiting for one (`schedstat`), if the kernel keeps them.
    pub sched: Option<(u64, u64)>,
    /// Voluntary and involuntary context switches (slow ticks only).
    pub switches: Option<(u64, u64)>,
}

/// A process's reading at one tick.
#[derive(Debug, Clone, Default)]
pub struct ProcRead {
    /// Process id.
    pub pid: u32,
    /// Its counters.
    pub stat: Stat,
    /// Its threads.
    pub threads: Vec<ThreadRead>,
    /// Proportional set size, bytes (slow ticks only).
    pub pss: Option<u64>,
    /// `read_bytes` and `rchar` (slow ticks only, when readable).
    pub io: Option<(u64, u64)>,
}

/// The host at one tick.
#[derive(Debug, Clone, Default)]
pub struct HostRead {
    /// Per core: (busy, steal, total) clock ticks since boot.
    pub cores: Vec<(u64, u64, u64)>,
    /// Runnable threads on the host (`procs_running` of `/proc/loadavg`), this one excluded.
    pub run_queue: u32,
    /// `MemAvailable`, bytes.
    pub mem_available: u64,
    /// `MemTotal`, bytes.
    pub mem_total: u64,
    /// `/dev/shm`: (used, size) bytes (slow ticks only).
    pub shm: Option<(u64, u64)>,
}

struct TaskFiles {
    stat: Option<Held>,
    sched: Option<Held>,
    last: Option<Stat>,
}

struct ProcFiles {
    stat: Option<Held>,
    tids: Vec<u32>,
}

/// How much to read at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every tick: each process's `stat` (CPU of all its threads, dead ones included; resident
    /// pages) and each thread's `schedstat` (CPU time and run-queue wait), all through held
    /// files; a thread's `stat` only where the kernel keeps no `schedstat`.
    Fast,
    /// Once a second: also the thread lists, thread `stat` and `status`, and `io`.
    Slow,
    /// Every few seconds: also `smaps_rollup` (PSS), by far the dearest file: the kernel walks
    /// every page table of the process to make it.
    Full,
}

/// Reads a process tree and the host; keeps the files of each thread open between ticks.
pub struct Reader {
    proc_root: std::path::PathBuf,
    tasks: HashMap<(u32, u32), TaskFiles>,
    procs: HashMap<u32, ProcFiles>,
    host_stat: Option<Held>,
    loadavg: Option<Held>,
    meminfo: Option<Held>,
    children_file: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Self::new()
    }
}

impl Reader {
    /// A reader of `/proc`.
    pub fn new() -> Self {
        let root = std::path::PathBuf::from("/proc");
        let children_file = root.join("self/task").join(std::process::id().to_string()).join("children").exists();
        Reader {
            host_stat: Held::open(&root.join("stat")),
            loadavg: Held::open(&root.join("loadavg")),
            meminfo: Held::open(&root.join("meminfo")),
            proc_root: root,
            tasks: HashMap::new(),
            procs: HashMap::new(),
            children_file,
        }
    }

    /// `root` and its descendants, walked through `task/*/children` (or, on kernels without
    /// it, a scan of every process's parent).
    pub fn tree(&self, root: u32) -> Vec<u32> {
        let mut out = vec![];
        let mut seen = HashSet::new();
        if self.children_file {
            let mut stack = vec![root];
            while let Some(p) = stack.pop() {
                if !seen.insert(p) || !self.proc_root.join(p.to_string()).exists() {
                    continue;
                }
                out.push(p);
                if let Ok(rd) = std::fs::read_dir(self.proc_root.join(format!("{p}/task"))) {
                    for t in rd.flatten() {
                        if let Ok(s) = std::fs::read_to_string(t.path().join("children")) {
                            stack.extend(s.split_ascii_whitespace().filter_map(|c| c.parse::<u32>().ok()));
                        }
                    }
                }
            }
            return out;
        }
        let mut parent = HashMap::new();
        if let Ok(rd) = std::fs::read_dir(&self.proc_root) {
            for e in rd.flatten() {
                if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) {
                    if let Some(st) =
                        std::fs::read_to_string(e.path().join("stat")).ok().as_deref().and_then(parse_stat)
                    {
                        parent.insert(pid, st.ppid);
                    }
                }
            }
        }
        let mut stack = vec![root];
        while let Some(p) = stack.pop() {
            if !seen.insert(p) || (p != root && !parent.contains_key(&p)) {
                continue;
            }
            out.push(p);
            stack.extend(parent.iter().filter(|(_, &pp)| pp == p).map(|(&c, _)| c));
        }
        out
    }

    /// Reads processes `pids` (and their threads) to `depth`.
    pub fn read_procs(&mut self, pids: &[u32], depth: Depth) -> Vec<ProcRead> {
        let slow = depth != Depth::Fast;
        let mut out = Vec::with_capacity(pids.len());
        let mut live = HashSet::new();
        for &pid in pids {
            let dir = self.proc_root.join(pid.to_string());
            let entry = self
                .procs
                .entry(pid)
                .or_insert_with(|| ProcFiles { stat: Held::open(&dir.join("stat")), tids: vec![] });
            // The process's own stat every tick: its CPU counters include threads that came and
            // went between two thread listings.
            let Some(stat) = entry.stat.as_mut().and_then(|h| h.read()).and_then(parse_stat) else { continue };
            if slow || entry.tids.is_empty() {
                entry.tids = std::fs::read_dir(dir.join("task"))
                    .map(|rd| rd.flatten().filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok()).collect())
                    .unwrap_or_default();
            }
            let mut p = ProcRead { pid, stat, ..ProcRead::default() };
            for &tid in &entry.tids {
                live.insert((pid, tid));
                let files = self.tasks.entry((pid, tid)).or_insert_with(|| {
                    let tdir = dir.join(format!("task/{tid}"));
                    TaskFiles {
                        stat: Held::open(&tdir.join("stat")),
                        sched: Held::open(&tdir.join("schedstat")),
                        last: None,
                    }
                });
                let sched = files.sched.as_mut().and_then(|h| h.read()).and_then(parse_schedstat);
                if slow || sched.is_none() || files.last.is_none() {
                    if let Some(st) = files.stat.as_mut().and_then(|h| h.read()).and_then(parse_stat) {
                        files.last = Some(st);
                    } else if sched.is_none() {
                        // Gone since the list was read.
                        continue;
                    }
                }
                let Some(stat) = files.last.clone() else { continue };
                let switches = if slow {
                    std::fs::read_to_string(dir.join(format!("task/{tid}/status")))
                        .ok()
                        .as_deref()
                        .and_then(parse_switches)
                } else {
                    None
                };
                p.threads.push(ThreadRead { tid, stat, sched, switches });
            }
            if depth == Depth::Full {
                p.pss = std::fs::read_to_string(dir.join("smaps_rollup")).ok().as_deref().and_then(parse_pss);
            }
            if slow {
                p.io = std::fs::read_to_string(dir.join("io")).ok().as_deref().and_then(parse_io);
            }
            out.push(p);
        }
        self.tasks.retain(|k, _| live.contains(k));
        self.procs.retain(|k, _| pids.contains(k));
        out
    }

    /// Reads the host; `slow` adds `/dev/shm`.
    pub fn read_host(&mut self, slow: bool) -> HostRead {
        let mut h = HostRead::default();
        if let Some(s) = self.host_stat.as_mut().and_then(|f| f.read()) {
            h.cores = s
                .lines()
                .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(|b| b.is_ascii_digit()))
                .filter_map(parse_cpu_line)
                .collect();
        }
        if let Some(s) = self.loadavg.as_mut().and_then(|f| f.read()) {
            // "0.52 0.58 0.59 3/245 12345": runnable/all; the reader itself is one of them.
            let running = s.split_ascii_whitespace().nth(3).and_then(|x| x.split('/').next()?.parse::<u32>().ok());
            h.run_queue = running.unwrap_or(1).saturating_sub(1);
        }
        if let Some(s) = self.meminfo.as_mut().and_then(|f| f.read()) {
            let kb = |key: &str| -> u64 {
                s.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024
            };
            h.mem_available = kb("MemAvailable:");
            h.mem_total = kb("MemTotal:");
        }
        if slow {
            h.shm = statvfs_used("/dev/shm");
        }
        h
    }
}

/// (used, size) bytes of the filesystem at `path`.
pub fn statvfs_used(path: &str) -> Option<(u64, u64)> {
    let c = std::ffi::CString::new(path).ok()?;
    // SAFETY: `statvfs` is a plain struct for which zeroes are valid; the call writes it and
    // reads the NUL-terminated path, which outlives the call.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st
    };
    let size = st.f_blocks as u64 * st.f_frsize as u64;
    let free = st.f_bfree as u64 * st.f_frsize as u64;
    Some((size.saturating_sub(free), size))
}

/// The process's command line, arguments joined by spaces (empty for kernel threads).
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            let s: Vec<String> = b
                .split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            s.join(" ").chars().map(|c| if c.is_control() { ' ' } else { c }).collect()
        })
        .unwrap_or_default()
}

/// A positive `sysconf` value, else `default`.
fn sysconf(name: libc::c_int, default: u64) -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v as u64
    } else {
        default
    }
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn clock_ticks() -> f64 {
    sysconf(libc::_SC_CLK_TCK, 100) as f64
}

/// The size of a page, bytes.
pub fn page_size() -> u64 {
    sysconf(libc::_SC_PAGESIZE, 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_with_spaces_and_parentheses_is_read_whole() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194304 900 0 7 0 350 25 0 0 20 0 5 0 123456 10000000 2500 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.comm, "my (odd) name");
        assert_eq!((st.state, st.ppid, st.minflt, st.majflt), ('S', 1, 900, 7));
        assert_eq!((st.utime, st.stime, st.num_threads, st.starttime, st.rss_pages), (350, 25, 5, 123456, 2500));
        assert_eq!(parse_stat("4242 (truncated"), None);
    }

    #[test]
    fn this_process_reads_back_its_own_threads_and_memory() {
        let mut r = Reader::new();
        let me = std::process::id();
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let b = barrier.clone();
        let t = std::thread::Builder::new()
            .name("monitor-test-th".into())
            .spawn(move || {
                b.wait();
                b.wait();
            })
            .unwrap();
        barrier.wait();
        let procs = r.read_procs(&[me], Depth::Full);
        barrier.wait();
        t.join().unwrap();
        assert_eq!(procs.len(), 1);
        let p = &procs[0];
        assert!(p.threads.iter().any(|t| t.stat.comm == "monitor-test-th"), "{:?}", p.threads);
        assert!(p.stat.rss_pages > 0);
        assert!(p.pss.unwrap_or(1) > 0);
        assert!(r.tree(me).contains(&me));
        let h = r.read_host(true);
        assert!(!h.cores.is_empty() && h.mem_total > 0 && h.mem_available > 0);
    }

    #[test]
    fn status_io_and_cpu_lines_parse() {
        let st = "Name:\tx\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_switches(st), Some((12, 3)));
        assert_eq!(parse_pss("Rss: 10 kB\nPss:  2048 kB\n"), Some(2048 * 1024));
        assert_eq!(parse_io("rchar: 500\nwchar: 1\nread_bytes: 4096\n"), Some((4096, 500)));
        assert_eq!(parse_cpu_line("cpu0 10 0 5 80 5 0 0 2 0 0"), Some((15, 2, 102)));
        assert_eq!(parse_schedstat("1000 250 7\n"), Some((1000, 250)));
    }
}
