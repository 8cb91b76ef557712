//! The process's real CPU allowance: its affinity mask and its cgroup CPU quota, not the machine's
//! core count. Two trainers on one host that each get four cores should each run four threads.

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
    fn allowance_is_sane() {
        let a = allowance();
        assert!(a.effective >= 1 && a.effective <= a.online.max(a.affinity));
    }
}
