//! The process's CPU: its real allowance (its affinity mask and its cgroup CPU quota, not the
//! machine's core count: two trainers on one host that each get four cores should each run four
//! threads), and the CPU clocks of the process and of a thread, by which reports say how busy the
//! threads were ([`process_cpu`], [`ThreadCpu`]).

use std::path::Path;

/// How many CPUs this process may use, and where that number came from.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CpuAllowance {
    /// CPUs online on the machine.
    pub online: usize,
    /// CPUs in this process's affinity mask.
    pub affinity: usize,
    /// The cgroup CPU quota in CPUs (quota / period), if one is set.
    pub cgroup_quota: Option<f64>,
    /// The usable whole number of CPUs: min(affinity, ceil(quota)), at least 1.
    pub effective: usize,
}

/// Reads the affinity mask and the cgroup quota (v2 `cpu.max`, or v1 `cpu.cfs_quota_us`).
pub fn allowance() -> CpuAllowance {
    let online = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let affinity = affinity_count().unwrap_or(online);
    let cgroup_quota = cgroup_quota();
    let mut effective = affinity;
    if let Some(q) = cgroup_quota {
        effective = effective.min(q.ceil().max(1.0) as usize);
    }
    CpuAllowance { online, affinity, cgroup_quota, effective: effective.max(1) }
}

fn affinity_count() -> Option<usize> {
    // SAFETY: `cpu_set_t` is a plain bit array for which all-zeroes is a valid value, and
    // `sched_getaffinity` writes at most `size_of::<cpu_set_t>()` bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return None;
        }
        let n = libc::CPU_COUNT(&set);
        (n > 0).then_some(n as usize)
    }
}

fn cgroup_quota() -> Option<f64> {
    // cgroup v2: "max 100000" or "200000 100000", in the process's own cgroup.
    let own = std::fs::read_to_string("/proc/self/cgroup").ok();
    let mut candidates = vec![];
    if let Some(own) = &own {
        for line in own.lines() {
            if let Some(rel) = line.strip_prefix("0::") {
                candidates.push(Path::new("/sys/fs/cgroup").join(rel.trim_start_matches('/')));
            }
        }
    }
    candidates.push("/sys/fs/cgroup".into());
    for dir in candidates {
        if let Ok(s) = std::fs::read_to_string(dir.join("cpu.max")) {
            if let Some(q) = parse_cpu_max(&s) {
                return Some(q);
            }
        }
    }
    // cgroup v1
    let quota = std::fs::read_to_string("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").ok()?;
    let period = std::fs::read_to_string("/sys/fs/cgroup/cpu/cpu.cfs_period_us").ok()?;
    let (q, p): (i64, i64) = (quota.trim().parse().ok()?, period.trim().parse().ok()?);
    (q > 0 && p > 0).then(|| q as f64 / p as f64)
}

/// Parses cgroup v2's `cpu.max` ("max 100000" → no quota, "150000 100000" → 1.5 CPUs).
pub fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let q: f64 = quota.parse().ok()?;
    (q > 0.0).then_some(q / period)
}

/// The default number of decode threads when a config fixes none: the allowance. A thread
/// count from `STOKER_NUM_THREADS` is not this module's business: `stoker::args` reads it and
/// puts it in the loader's config as if given (`threads=`), so nothing here reads the
/// environment.
pub fn default_threads() -> usize {
    allowance().effective
}

/// The default CPU budget of an autotuned loader, in cores: the allowance, with a fractional
/// cgroup quota kept as it is (1.5 cores is a budget of 1.5, so one thread).
pub fn default_budget() -> f64 {
    let a = allowance();
    match a.cgroup_quota {
        Some(q) => q.min(a.affinity as f64).max(1.0),
        None => a.effective as f64,
    }
}

/// CPU time of the process so far (all its threads, user and system), from the kernel's clock.
pub fn process_cpu() -> std::time::Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time of the calling thread so far.
pub fn thread_cpu() -> std::time::Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> std::time::Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` writes one `timespec` into `t`, which lives for the call.
    if unsafe { libc::clock_gettime(id, &mut t) } != 0 {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// The host's CPU time so far, all CPUs together, from `/proc/stat`'s first line, in clock
/// ticks: `(busy, total)` (busy: user, nice, system, irq, softirq, steal; total adds idle and
/// iowait). `None` where it cannot be read. The share of the host busy between two readings
/// tells a process that gets fewer cores than it may use whether other processes hold them.
pub fn host_cpu() -> Option<(u64, u64)> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// [`host_cpu`] of the text of `/proc/stat`.
pub fn parse_proc_stat(s: &str) -> Option<(u64, u64)> {
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let [user, nice, system, idle, iowait, irq, softirq, steal] = v[..] else { return None };
    let busy = user + nice + system + irq + softirq + steal;
    Some((busy, busy + idle + iowait))
}

/// A worker thread's CPU clock, read in laps: each [`ThreadCpu::lap`] gives the CPU time the
/// thread used since the previous one (one `clock_gettime` call, about a quarter of a
/// microsecond: once per sample is free beside a decode).
#[derive(Debug)]
pub struct ThreadCpu {
    last: std::time::Duration,
}

impl ThreadCpu {
    /// Starts the clock of the calling thread (laps must be read on the same thread).
    pub fn start() -> Self {
        ThreadCpu { last: thread_cpu() }
    }

    /// CPU time used by this thread since the previous lap (or the start).
    pub fn lap(&mut self) -> std::time::Duration {
        let now = thread_cpu();
        let d = now.saturating_sub(self.last);
        self.last = now;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_parsing() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("150000 100000\n"), Some(1.5));
        assert_eq!(parse_cpu_max("garbage"), None);
    }

    #[test]
    fn proc_stat_parsing() {
        let s = "cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 50 2 25 500 10 1 1 5 0 0\n";
        assert_eq!(parse_proc_stat(s), Some((170, 1190)));
        assert_eq!(parse_proc_stat("cpu0 1 2 3\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 x 4 5 6 7 8\n"), None);
        let (busy, total) = host_cpu().expect("/proc/stat on Linux");
        assert!(busy <= total && total > 0);
    }

    #[test]
    fn the_clocks_count_cpu_not_sleep() {
        let (p0, mut t) = (process_cpu(), ThreadCpu::start());
        std::thread::sleep(std::time::Duration::from_millis(30));
        let slept = t.lap();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < std::time::Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let spun = t.lap();
        // A sleep costs next to no CPU; a spin of 30 ms of wall time costs CPU (at most its wall
        // time: less only when the machine is busy elsewhere).
        assert!(slept < std::time::Duration::from_millis(5), "{slept:?}");
        assert!(spun > slept && spun <= std::time::Duration::from_millis(31), "{spun:?}");
        assert!(process_cpu() - p0 >= spun, "the process clock holds the thread's");
    }

    #[test]
    fn allowance_is_sane() {
        let a = allowance();
        assert!(a.effective >= 1 && a.effective <= a.online.max(a.affinity));
    }
}
