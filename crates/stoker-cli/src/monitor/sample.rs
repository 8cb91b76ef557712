//! Turns successive `/proc` and NVML readings into ticks (rates over each interval) and a
//! summary per process and thread over the whole run.

use super::procfs::{self, Depth, ProcRead, Reader};
use serde::Serialize;
use std::collections::HashMap;
use std::time::Instant;
use stoker_cuda::{GpuSample, GpuSampler, GpuStatic};

/// One process at one tick.
#[derive(Debug, Clone, Serialize)]
pub struct ProcTick {
    /// Process id.
    pub pid: u32,
    /// CPU used over the interval, in cores.
    pub cpu: f64,
    /// Its busiest thread's CPU, in cores.
    pub busiest_thread: f64,
    /// Resident set, bytes.
    pub rss: u64,
}

/// Everything read at one tick; rates are over the interval since the previous tick.
#[derive(Debug, Clone, Serialize)]
pub struct Tick {
    /// Seconds since the monitor started.
    pub t: f64,
    /// Cores busy on the host (every process, this monitor included).
    pub host_busy: f64,
    /// Cores' time stolen by the hypervisor, in cores.
    pub host_steal: f64,
    /// Busy fraction of each core.
    pub per_core: Vec<f32>,
    /// Runnable threads on the host.
    pub run_queue: u32,
    /// `MemAvailable`, bytes.
    pub mem_available: u64,
    /// `/dev/shm` in use, bytes (last once-a-second reading).
    pub shm_used: Option<u64>,
    /// CPU of the monitored tree, cores.
    pub tree_cpu: f64,
    /// CPU the tree wanted: running plus runnable-but-waiting for a CPU (`schedstat`), cores;
    /// equal to `tree_cpu` when the kernel does not keep the waits.
    pub tree_demand: f64,
    /// Resident memory of the tree (sum of RSS; shared pages counted in each process), bytes.
    pub tree_rss: u64,
    /// Proportional set size of the tree (shared pages split; last once-a-second reading).
    pub tree_pss: Option<u64>,
    /// Threads in the tree.
    pub tree_threads: u32,
    /// Threads of the tree in state R at their last once-a-second reading.
    pub tree_runnable: u32,
    /// Of the time the tree's threads wanted a CPU, the fraction they waited for one
    /// (`schedstat`); `None` when the kernel does not keep it or nothing ran.
    pub tree_wait_share: Option<f64>,
    /// Nanoseconds the tree's threads ran and waited for a CPU over the interval.
    #[serde(skip)]
    pub tree_run_wait_ns: (u64, u64),
    /// Bytes the tree read from storage per second (once-a-second readings).
    pub tree_read_bytes_per_s: Option<f64>,
    /// Processes of the tree.
    pub procs: Vec<ProcTick>,
    /// GPUs.
    pub gpus: Vec<GpuSample>,
}

/// One thread over the run.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadSummary {
    /// Thread id.
    pub tid: u32,
    /// Its name (`comm`).
    pub name: String,
    /// CPU seconds while watched.
    pub cpu_seconds: f64,
    /// Seconds it was runnable but waited for a CPU.
    pub wait_seconds: f64,
    /// Voluntary context switches while watched.
    pub voluntary_switches: u64,
    /// Involuntary context switches (preempted) while watched.
    pub involuntary_switches: u64,
    /// State at the last reading.
    pub state: String,
    #[serde(skip)]
    first: Option<(u64, (u64, u64))>,
    #[serde(skip)]
    first_switches: Option<(u64, u64)>,
}

/// One process over the run.
#[derive(Debug, Clone, Serialize)]
pub struct ProcSummary {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: u32,
    /// Command name.
    pub name: String,
    /// Command line.
    pub cmdline: String,
    /// What it is: main, dataloader-worker, stoker, child.
    pub role: String,
    /// Seconds since start when first and last seen.
    pub first_seen: f64,
    /// Seconds since start when last seen.
    pub last_seen: f64,
    /// User CPU seconds while watched.
    pub cpu_user_seconds: f64,
    /// System CPU seconds while watched.
    pub cpu_system_seconds: f64,
    /// RSS at the first and last reading, and the peak, bytes.
    pub rss_first: u64,
    /// RSS at the last reading.
    pub rss_last: u64,
    /// Highest RSS seen.
    pub rss_peak: u64,
    /// PSS at the last once-a-second reading.
    pub pss_last: Option<u64>,
    /// Page faults while watched (minor, major).
    pub page_faults: (u64, u64),
    /// Bytes read from storage while watched (needs permission to read `/proc/PID/io`).
    pub read_bytes: Option<u64>,
    /// Its GPUs: (NVML index, device memory bytes) at the last reading.
    pub gpus: Vec<(u32, u64)>,
    /// Threads.
    pub threads: Vec<ThreadSummary>,
    #[serde(skip)]
    first_stat: procfs::Stat,
    #[serde(skip)]
    first_io: Option<u64>,
}

impl ProcSummary {
    /// A process for the rules' unit tests: `threads` are (name, CPU seconds).
    #[cfg(test)]
    pub fn for_test(pid: u32, role: &str, cmdline: &str, threads: &[(&str, f64)]) -> Self {
        ProcSummary {
            pid,
            ppid: 1,
            name: "python".into(),
            cmdline: cmdline.into(),
            role: role.into(),
            first_seen: 0.0,
            last_seen: 5.0,
            cpu_user_seconds: threads.iter().map(|t| t.1).sum(),
            cpu_system_seconds: 0.0,
            rss_first: 0,
            rss_last: 0,
            rss_peak: 0,
            pss_last: None,
            page_faults: (0, 0),
            read_bytes: None,
            gpus: vec![],
            threads: threads
                .iter()
                .enumerate()
                .map(|(i, t)| ThreadSummary {
                    tid: pid + i as u32,
                    name: t.0.into(),
                    cpu_seconds: t.1,
                    wait_seconds: 0.0,
                    voluntary_switches: 0,
                    involuntary_switches: 0,
                    state: "R".into(),
                    first: None,
                    first_switches: None,
                })
                .collect(),
            first_stat: procfs::Stat::default(),
            first_io: None,
        }
    }
}

/// PSS is read at every this many once-a-second ticks...
const PSS_EVERY: u64 = 30;
/// ...from this one on (the third second: past a job's first allocations).
const PSS_FIRST: u64 = 3;

/// One core's (busy, steal, total) clock ticks since boot.
type CoreTicks = (u64, u64, u64);

/// Reads a tree and the GPUs at each tick and keeps what the verdicts and reports need.
pub struct Sampler {
    reader: Reader,
    gpu: Option<GpuSampler>,
    /// Why there is no GPU view, when there is none.
    pub gpu_note: Option<String>,
    root: u32,
    start: Instant,
    clk: f64,
    page: u64,
    last: Option<(Instant, Vec<CoreTicks>)>,
    prev_threads: HashMap<(u32, u32), (u64, (u64, u64))>,
    prev_procs: HashMap<u32, u64>,
    prev_io: Option<(f64, u64)>,
    shm_used: Option<u64>,
    tree_pss: Option<u64>,
    last_slow: Option<Instant>,
    slow_ticks: u64,
    pids: Vec<u32>,
    /// Ticks so far.
    pub ticks: Vec<Tick>,
    /// Every process seen.
    pub procs: HashMap<u32, ProcSummary>,
    /// The machine's `/dev/shm` size, bytes.
    pub shm_size: Option<u64>,
    /// `MemTotal`, bytes.
    pub mem_total: u64,
}

impl Sampler {
    /// A sampler of the tree under `root`; opens NVML unless `gpus` is false.
    pub fn new(root: u32, gpus: bool) -> Self {
        let (gpu, gpu_note) = if gpus {
            match GpuSampler::open() {
                Ok(g) => (Some(g), None),
                Err(e) => (None, Some(e)),
            }
        } else {
            (None, Some("GPU sampling is off (--no-gpu)".into()))
        };
        Sampler {
            reader: Reader::new(),
            gpu,
            gpu_note,
            root,
            start: Instant::now(),
            clk: procfs::clock_ticks(),
            page: procfs::page_size(),
            last: None,
            prev_threads: HashMap::new(),
            prev_procs: HashMap::new(),
            prev_io: None,
            shm_used: None,
            tree_pss: None,
            last_slow: None,
            slow_ticks: 0,
            pids: vec![],
            ticks: vec![],
            procs: HashMap::new(),
            shm_size: None,
            mem_total: 0,
        }
    }

    /// The GPUs watched.
    pub fn gpus(&self) -> &[GpuStatic] {
        self.gpu.as_ref().map(|g| g.gpus()).unwrap_or(&[])
    }

    /// Takes one reading. The first one only sets the baselines (no tick).
    pub fn sample(&mut self) {
        let now = Instant::now();
        let slow = self.last_slow.is_none_or(|t| now.duration_since(t).as_secs_f64() >= 0.95);
        if slow {
            self.last_slow = Some(now);
        }
        let t = now.duration_since(self.start).as_secs_f64();
        let depth = if !slow {
            Depth::Fast
        } else {
            self.slow_ticks += 1;
            if self.slow_ticks % PSS_EVERY == PSS_FIRST {
                Depth::Full
            } else {
                Depth::Slow
            }
        };
        if slow || self.pids.is_empty() {
            self.pids = self.reader.tree(self.root);
        }
        let reads = self.reader.read_procs(&self.pids, depth);
        let host = self.reader.read_host(slow);
        let gpus = self.gpu.as_ref().map(|g| g.sample()).unwrap_or_default();
        self.mem_total = host.mem_total;
        if let Some((used, size)) = host.shm {
            self.shm_used = Some(used);
            self.shm_size = Some(size);
        }
        self.update_summaries(t, &reads, &gpus);
        let Some((t0, cores0)) = self.last.replace((now, host.cores.clone())) else {
            self.seed_threads(&reads);
            return;
        };
        let dt = now.duration_since(t0).as_secs_f64().max(1e-6);
        let mut per_core = vec![];
        let (mut busy, mut steal) = (0.0, 0.0);
        for (a, b) in cores0.iter().zip(&host.cores) {
            let total = b.2.saturating_sub(a.2) as f64;
            if total > 0.0 {
                let f = b.0.saturating_sub(a.0) as f64 / total;
                per_core.push(f as f32);
                busy += f;
                steal += b.1.saturating_sub(a.1) as f64 / total;
            } else {
                per_core.push(0.0);
            }
        }
        let mut tick = Tick {
            t,
            host_busy: busy,
            host_steal: steal,
            per_core,
            run_queue: host.run_queue,
            mem_available: host.mem_available,
            shm_used: self.shm_used,
            tree_cpu: 0.0,
            tree_demand: 0.0,
            tree_rss: 0,
            tree_pss: None,
            tree_threads: 0,
            tree_runnable: 0,
            tree_wait_share: None,
            tree_run_wait_ns: (0, 0),
            tree_read_bytes_per_s: None,
            procs: vec![],
            gpus,
        };
        let mut next = HashMap::new();
        let mut next_procs = HashMap::new();
        let (mut run_ns, mut wait_ns) = (0u64, 0u64);
        let mut pss_sum: Option<u64> = None;
        let mut read_sum: Option<u64> = None;
        for p in &reads {
            let mut cpu = 0.0;
            let mut busiest: f64 = 0.0;
            for th in &p.threads {
                let ticks = th.stat.utime + th.stat.stime;
                let sched = th.sched.unwrap_or_default();
                next.insert((p.pid, th.tid), (ticks, sched));
                tick.tree_threads += 1;
                if th.stat.state == 'R' {
                    tick.tree_runnable += 1;
                }
                let Some(&(pt, ps)) = self.prev_threads.get(&(p.pid, th.tid)) else { continue };
                let c = if th.sched.is_some() {
                    run_ns += sched.0.saturating_sub(ps.0);
                    wait_ns += sched.1.saturating_sub(ps.1);
                    sched.0.saturating_sub(ps.0) as f64 * 1e-9 / dt
                } else {
                    ticks.saturating_sub(pt) as f64 / self.clk / dt
                };
                cpu += c;
                busiest = busiest.max(c);
            }
            // The process's CPU from its own counters (threads that lived between two thread
            // listings count too): the kernel sums its threads' nanosecond run times and reports
            // them in clock ticks, so one tick's figure is within 1/CLK_TCK/dt cores.
            let total = p.stat.utime + p.stat.stime;
            next_procs.insert(p.pid, total);
            if let Some(&prev) = self.prev_procs.get(&p.pid) {
                cpu = total.saturating_sub(prev) as f64 / self.clk / dt;
            }
            let rss = p.stat.rss_pages * self.page;
            tick.tree_cpu += cpu;
            tick.tree_rss += rss;
            if let Some(x) = p.pss {
                *pss_sum.get_or_insert(0) += x;
            }
            if let Some((rb, _)) = p.io {
                *read_sum.get_or_insert(0) += rb;
            }
            tick.procs.push(ProcTick { pid: p.pid, cpu, busiest_thread: busiest, rss });
        }
        self.prev_threads = next;
        self.prev_procs = next_procs;
        if pss_sum.is_some() {
            self.tree_pss = pss_sum;
        }
        tick.tree_pss = self.tree_pss;
        if run_ns + wait_ns > 0 {
            tick.tree_wait_share = Some(wait_ns as f64 / (run_ns + wait_ns) as f64);
        }
        tick.tree_run_wait_ns = (run_ns, wait_ns);
        tick.tree_demand = tick.tree_cpu + wait_ns as f64 * 1e-9 / dt;
        if let Some(r) = read_sum {
            if let Some((pt, pr)) = self.prev_io {
                if t > pt {
                    tick.tree_read_bytes_per_s = Some(r.saturating_sub(pr) as f64 / (t - pt));
                }
            }
            self.prev_io = Some((t, r));
        }
        self.ticks.push(tick);
    }

    fn seed_threads(&mut self, reads: &[ProcRead]) {
        for p in reads {
            self.prev_procs.insert(p.pid, p.stat.utime + p.stat.stime);
            for th in &p.threads {
                self.prev_threads
                    .insert((p.pid, th.tid), (th.stat.utime + th.stat.stime, th.sched.unwrap_or_default()));
            }
        }
    }

    fn update_summaries(&mut self, t: f64, reads: &[ProcRead], gpus: &[GpuSample]) {
        let page = self.page;
        let clk = self.clk;
        for p in reads {
            let rss = p.stat.rss_pages * page;
            let s = self.procs.entry(p.pid).or_insert_with(|| ProcSummary {
                pid: p.pid,
                ppid: p.stat.ppid,
                name: p.stat.comm.clone(),
                cmdline: procfs::cmdline(p.pid),
                role: String::new(),
                first_seen: t,
                last_seen: t,
                cpu_user_seconds: 0.0,
                cpu_system_seconds: 0.0,
                rss_first: rss,
                rss_last: rss,
                rss_peak: rss,
                pss_last: None,
                page_faults: (0, 0),
                read_bytes: None,
                gpus: vec![],
                threads: vec![],
                first_stat: p.stat.clone(),
                first_io: p.io.map(|x| x.0),
            });
            // A process that exec'd since it was first seen has a new name and command line.
            if s.name != p.stat.comm {
                s.name = p.stat.comm.clone();
                s.cmdline = procfs::cmdline(p.pid);
            }
            s.last_seen = t;
            s.rss_last = rss;
            s.rss_peak = s.rss_peak.max(rss);
            s.cpu_user_seconds = p.stat.utime.saturating_sub(s.first_stat.utime) as f64 / clk;
            s.cpu_system_seconds = p.stat.stime.saturating_sub(s.first_stat.stime) as f64 / clk;
            s.page_faults =
                (p.stat.minflt.saturating_sub(s.first_stat.minflt), p.stat.majflt.saturating_sub(s.first_stat.majflt));
            if p.pss.is_some() {
                s.pss_last = p.pss;
            }
            if let Some((rb, _)) = p.io {
                let first = *s.first_io.get_or_insert(rb);
                s.read_bytes = Some(rb.saturating_sub(first));
            }
            s.gpus = gpus
                .iter()
                .flat_map(|g| g.processes.iter().filter(|(pid, _)| *pid == p.pid).map(move |&(_, m)| (g.index, m)))
                .collect();
            for th in &p.threads {
                let ticks = th.stat.utime + th.stat.stime;
                let sched = th.sched;
                let ts = match s.threads.iter_mut().position(|x| x.tid == th.tid) {
                    Some(i) => &mut s.threads[i],
                    None => {
                        s.threads.push(ThreadSummary {
                            tid: th.tid,
                            name: th.stat.comm.clone(),
                            cpu_seconds: 0.0,
                            wait_seconds: 0.0,
                            voluntary_switches: 0,
                            involuntary_switches: 0,
                            state: String::new(),
                            first: Some((ticks, sched.unwrap_or_default())),
                            first_switches: None,
                        });
                        s.threads.last_mut().expect("just pushed")
                    }
                };
                ts.name = th.stat.comm.clone();
                ts.state = th.stat.state.to_string();
                if let Some((t0, s0)) = ts.first {
                    ts.cpu_seconds = match sched {
                        Some(x) => x.0.saturating_sub(s0.0) as f64 * 1e-9,
                        None => ticks.saturating_sub(t0) as f64 / clk,
                    };
                    ts.wait_seconds = sched.map(|x| x.1.saturating_sub(s0.1) as f64 * 1e-9).unwrap_or(0.0);
                }
                if let Some(sw) = th.switches {
                    let f = *ts.first_switches.get_or_insert(sw);
                    ts.voluntary_switches = sw.0.saturating_sub(f.0);
                    ts.involuntary_switches = sw.1.saturating_sub(f.1);
                }
            }
        }
    }

    /// Names each process's role from its threads and its place in the tree.
    pub fn assign_roles(&mut self) {
        let snapshot: HashMap<u32, (u32, String)> =
            self.procs.values().map(|p| (p.pid, (p.ppid, p.cmdline.clone()))).collect();
        let root = self.root;
        for p in self.procs.values_mut() {
            p.role = role(p, root, &snapshot).to_string();
        }
    }
}

/// What a process is, for people reading the report.
fn role(p: &ProcSummary, root: u32, all: &HashMap<u32, (u32, String)>) -> &'static str {
    if p.threads.iter().any(|t| t.name.starts_with("stoker-")) {
        return "stoker";
    }
    let parent_cmd = all.get(&p.ppid).map(|x| x.1.as_str());
    let c = p.cmdline.as_str();
    let spawned_worker = c.contains("multiprocessing.spawn") || c.contains("multiprocessing.forkserver");
    let forked_worker = p.pid != root && parent_cmd == Some(c) && c.contains("python");
    if spawned_worker || forked_worker {
        return "dataloader-worker";
    }
    if p.pid == root {
        return "main";
    }
    "child"
}
