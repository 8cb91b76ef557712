//! The verdicts: rules that name a training job's pathology from the monitor's ticks, each with
//! its evidence (numbers and the share of time) and the change to make. Pure functions of the
//! readings, so every rule is unit-tested on made-up ticks; the thresholds are the constants
//! below, and the README's "Verdicts" table says where each comes from.

use super::sample::{ProcSummary, Tick};
use serde::Serialize;
use std::collections::HashMap;
use stoker_cuda::GpuStatic;

/// GPU utilisation under which a tick counts as the GPU waiting (NVML's "a kernel ran during
/// X% of the period"; a fed training step keeps it near 100%).
pub const GPU_IDLE_BELOW: f64 = 0.5;
/// Input-bound: the GPU waits in at least this share of the ticks...
pub const GPU_WAIT_SHARE: f64 = 0.3;
/// ...while the job uses at least this fraction of the cores it may use.
pub const CPU_SATURATED: f64 = 0.8;
/// ...or its loader workers are each at least this busy (cores).
pub const WORKER_SATURATED: f64 = 0.85;
/// Oversubscribed: runnable threads on the host above this many times the cores...
pub const RUN_QUEUE_PER_CORE: f64 = 1.25;
/// ...and the job's threads wait for a CPU at least this share of the time they want one.
pub const WAIT_SHARE: f64 = 0.2;
/// Python-bound: one thread of the main process at least this busy (cores)...
pub const MAIN_THREAD_BUSY: f64 = 0.9;
/// ...in at least this share of the ticks.
pub const MAIN_THREAD_SHARE: f64 = 0.6;
/// Memory growth: at least this slope (bytes/s), over the run and over its second half...
pub const GROWTH_SLOPE: f64 = 1024.0 * 1024.0;
/// ...adding at least this much (bytes)...
pub const GROWTH_MIN_BYTES: f64 = 64.0 * 1024.0 * 1024.0;
/// ...and a straight line explains the growth this well (r²).
pub const GROWTH_R2: f64 = 0.7;
/// `/dev/shm` fuller than this is a problem (DataLoader workers die with a bus error when full).
pub const SHM_FULL: f64 = 0.8;
/// GPU memory fuller than this at its peak.
pub const GPU_MEMORY_FULL: f64 = 0.95;
/// Host-to-device traffic under this fraction of the link's rate while the GPU waits.
pub const H2D_FRACTION: f64 = 0.25;

/// One finding.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Verdict {
    /// Stable name of the rule (`input-bound`, `host-oversubscribed`, ...).
    pub rule: String,
    /// `problem`, `warning` or `ok`.
    pub severity: String,
    /// One line.
    pub title: String,
    /// The numbers behind it.
    pub evidence: String,
    /// What to change.
    pub fix: String,
    /// Share of the watched time the condition held, when it is about time.
    pub share: Option<f64>,
}

/// What the rules look at besides the ticks.
pub struct Context<'a> {
    /// The ticks.
    pub ticks: &'a [Tick],
    /// Processes seen.
    pub procs: &'a HashMap<u32, ProcSummary>,
    /// GPUs watched.
    pub gpus: &'a [GpuStatic],
    /// Cores online on the host.
    pub cores: usize,
    /// The job's CPU allowance (cores it may use).
    pub allowance: f64,
    /// `/dev/shm` size.
    pub shm_size: Option<u64>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (mut s, mut n) = (0.0, 0usize);
    for x in v {
        s += x;
        n += 1;
    }
    (n > 0).then(|| s / n as f64)
}

/// Least-squares line through `(x, y)`: (slope, r²).
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let r2 = if syy > 0.0 { (sxy * sxy) / (sxx * syy) } else { 0.0 };
    Some((slope, r2))
}

fn mib(b: f64) -> String {
    format!("{:.0} MiB", b / (1024.0 * 1024.0))
}

fn pct(f: f64) -> String {
    format!("{:.0}%", f * 100.0)
}

/// The GPUs the job uses (those listing one of its processes), else every GPU watched.
fn job_gpus(cx: &Context) -> Vec<u32> {
    let mut used: Vec<u32> = cx.procs.values().flat_map(|p| p.gpus.iter().map(|g| g.0)).collect();
    if used.is_empty() {
        for t in cx.ticks {
            for g in &t.gpus {
                if g.processes.iter().any(|(pid, _)| cx.procs.contains_key(pid)) {
                    used.push(g.index);
                }
            }
        }
    }
    used.sort_unstable();
    used.dedup();
    if used.is_empty() {
        used = cx.gpus.iter().map(|g| g.index).collect();
    }
    used
}

/// Mean utilisation of the job's GPUs at a tick.
fn tick_util(t: &Tick, gpus: &[u32]) -> Option<f64> {
    mean(t.gpus.iter().filter(|g| gpus.contains(&g.index)).filter_map(|g| g.util))
}

/// Summary figures of the GPU side over the analysis window (from the first busy tick: a
/// job's start-up, imports and model build, is not its input pipeline's fault).
struct GpuView {
    window: usize,
    util_mean: f64,
    idle_share: f64,
    util_min: f64,
    util_max: f64,
    start: f64,
}

fn gpu_view(cx: &Context, gpus: &[u32]) -> Option<GpuView> {
    let first = cx.ticks.iter().position(|t| tick_util(t, gpus).is_some_and(|u| u > 0.0))?;
    let utils: Vec<f64> = cx.ticks[first..].iter().filter_map(|t| tick_util(t, gpus)).collect();
    if utils.len() < 5 {
        return None;
    }
    Some(GpuView {
        window: utils.len(),
        util_mean: utils.iter().sum::<f64>() / utils.len() as f64,
        idle_share: utils.iter().filter(|&&u| u < GPU_IDLE_BELOW).count() as f64 / utils.len() as f64,
        util_min: utils.iter().cloned().fold(f64::INFINITY, f64::min),
        util_max: utils.iter().cloned().fold(0.0, f64::max),
        start: cx.ticks[first].t,
    })
}

fn loader_procs<'a>(cx: &Context<'a>) -> Vec<&'a ProcSummary> {
    let mut v: Vec<&ProcSummary> =
        cx.procs.values().filter(|p| p.role == "dataloader-worker" || p.role == "stoker").collect();
    v.sort_by_key(|p| p.pid);
    v
}

/// Every rule, in order of importance; a single `healthy` verdict when none fires.
pub fn evaluate(cx: &Context) -> Vec<Verdict> {
    let mut out = vec![];
    if cx.ticks.len() < 5 {
        out.push(Verdict {
            rule: "too-short".into(),
            severity: "warning".into(),
            title: "Too few samples for a verdict".into(),
            evidence: format!("{} samples were taken", cx.ticks.len()),
            fix: "Watch the job for longer (--duration), past its start-up.".into(),
            share: None,
        });
        return out;
    }
    let cores = cx.cores.max(1) as f64;
    let usable = cx.allowance.min(cores).max(1.0);
    let gpus = job_gpus(cx);
    let gv = gpu_view(cx, &gpus);
    let window: Vec<&Tick> = match &gv {
        Some(g) => cx.ticks.iter().filter(|t| t.t >= g.start).collect(),
        None => cx.ticks.iter().collect(),
    };
    let tree_cpu = mean(window.iter().map(|t| t.tree_cpu)).unwrap_or(0.0);
    // Saturation counts what the job wanted: CPU it got plus time its threads queued for one,
    // so a job squeezed by a neighbour is still seen to be CPU-bound.
    let demand = mean(window.iter().map(|t| t.tree_demand)).unwrap_or(0.0);
    let saturated_share =
        window.iter().filter(|t| t.tree_demand >= CPU_SATURATED * usable).count() as f64 / window.len() as f64;
    let duration = cx.ticks.last().map(|t| t.t).unwrap_or(0.0) - cx.ticks[0].t;
    let loaders = loader_procs(cx);
    let worker_busy: Vec<(u32, f64)> = loaders
        .iter()
        .map(|p| {
            let live = (p.last_seen - p.first_seen).max(1e-3);
            let cpu = p.threads.iter().map(|t| t.cpu_seconds + t.wait_seconds).sum::<f64>();
            (p.pid, cpu / live)
        })
        .collect();
    let stoker_threads: Vec<f64> = cx
        .procs
        .values()
        .flat_map(|p| p.threads.iter())
        .filter(|t| t.name.starts_with("stoker-decode"))
        .map(|t| (t.cpu_seconds + t.wait_seconds) / duration.max(1e-3))
        .collect();
    let workers_saturated = (!worker_busy.is_empty()
        && worker_busy.iter().filter(|w| w.1 >= WORKER_SATURATED).count() * 2 > worker_busy.len())
        || (!stoker_threads.is_empty()
            && stoker_threads.iter().filter(|&&b| b >= WORKER_SATURATED).count() * 2 > stoker_threads.len());

    // Input-bound.
    if let Some(g) = &gv {
        if g.idle_share >= GPU_WAIT_SHARE {
            let swings = if g.util_max - g.util_min > 0.5 {
                format!(", swinging between {} and {}", pct(g.util_min), pct(g.util_max))
            } else {
                String::new()
            };
            let gpu_ev = format!(
                "GPU {} waited (utilisation under {}) in {} of {} samples (mean utilisation {}{swings})",
                gpus.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(","),
                pct(GPU_IDLE_BELOW),
                pct(g.idle_share),
                g.window,
                pct(g.util_mean)
            );
            let workers_ev = if worker_busy.is_empty() {
                String::new()
            } else {
                format!(
                    "; its {} loader worker(s) were busy (running or queued for a CPU) {}",
                    worker_busy.len(),
                    worker_busy.iter().map(|w| pct(w.1)).collect::<Vec<_>>().join(", ")
                )
            };
            if saturated_share >= 0.5 || demand >= CPU_SATURATED * usable {
                out.push(Verdict {
                    rule: "input-bound".into(),
                    severity: "problem".into(),
                    title: "Input-bound: the GPU waits for data while the job's CPUs are saturated".into(),
                    evidence: format!(
                        "{gpu_ev}; the job used {tree_cpu:.2} of the {usable:.0} cores it may use and wanted {demand:.2} \
                         (at least {} of them in {} of the samples){workers_ev}",
                        pct(CPU_SATURATED),
                        pct(saturated_share)
                    ),
                    fix: "The input pipeline needs more CPU per second than the job has, so more workers will not help: \
                          make each sample cheaper (decode at the target size: stoker's DCT-scaled and cropped JPEG decode; \
                          cache decoded images for later epochs with stoker's cache; move resize/normalise to the GPU), \
                          feed uint8 instead of float32, or give the job more cores."
                        .into(),
                    share: Some(g.idle_share),
                });
            } else if workers_saturated {
                out.push(Verdict {
                    rule: "input-bound".into(),
                    severity: "problem".into(),
                    title: "Input-bound: the GPU waits while every loader worker is busy and cores are left".into(),
                    evidence: format!("{gpu_ev}; the job used {tree_cpu:.2} of {usable:.0} cores{workers_ev}"),
                    fix: format!(
                        "Raise the number of loader workers (num_workers) towards {} (the cores left), or use stoker's \
                         threads=\"auto\", which does this without processes.",
                        (usable as usize).saturating_sub(1).max(1)
                    ),
                    share: Some(g.idle_share),
                });
            } else {
                out.push(Verdict {
                    rule: "gpu-waiting".into(),
                    severity: "warning".into(),
                    title: "The GPU waits, but not for the CPU".into(),
                    evidence: format!("{gpu_ev}; the job used only {tree_cpu:.2} of {usable:.0} cores{workers_ev}"),
                    fix: "Look for storage (threads in disk wait, low read rate), host-to-device copies from pageable \
                          memory (pin_memory=True, non_blocking=True), or synchronisation in the step (.item(), .cpu(), \
                          printing tensors)."
                        .into(),
                    share: Some(g.idle_share),
                });
            }
        }
    } else if saturated_share >= 0.5 && (workers_saturated || !loaders.is_empty()) {
        out.push(Verdict {
            rule: "loader-saturated".into(),
            severity: "warning".into(),
            title: "The job's data loading uses every core it may use (no GPU view to confirm it starves a GPU)".into(),
            evidence: format!(
                "the job used {tree_cpu:.2} of {usable:.0} cores and wanted {demand:.2}, at least {} of them in {} of the samples",
                pct(CPU_SATURATED),
                pct(saturated_share)
            ),
            fix: "If a GPU waits for this job, it is input-bound: make each sample cheaper or cache decoded images; \
                  run the monitor where NVML is visible to measure the GPU side."
                .into(),
            share: Some(saturated_share),
        });
    }

    // Host oversubscribed.
    let rq = mean(window.iter().map(|t| t.run_queue as f64)).unwrap_or(0.0);
    let rq_share =
        window.iter().filter(|t| t.run_queue as f64 > RUN_QUEUE_PER_CORE * cores).count() as f64 / window.len() as f64;
    let (run, wait) = window.iter().fold((0u64, 0u64), |a, t| (a.0 + t.tree_run_wait_ns.0, a.1 + t.tree_run_wait_ns.1));
    let wait_share = if run + wait > 0 { wait as f64 / (run + wait) as f64 } else { 0.0 };
    let involuntary: u64 = cx.procs.values().flat_map(|p| p.threads.iter()).map(|t| t.involuntary_switches).sum();
    if rq > RUN_QUEUE_PER_CORE * cores && wait_share >= WAIT_SHARE {
        out.push(Verdict {
            rule: "host-oversubscribed".into(),
            severity: "problem".into(),
            title: "Host oversubscribed: more runnable threads than cores, so the job's threads queue for a CPU".into(),
            evidence: format!(
                "{rq:.1} runnable threads on average on {cores:.0} cores (above {RUN_QUEUE_PER_CORE} per core in {} of the samples); \
                 this job's threads waited for a CPU {} of the time they were runnable; {:.0} involuntary context switches/s in the job",
                pct(rq_share),
                pct(wait_share),
                involuntary as f64 / duration.max(1e-3)
            ),
            fix: "The jobs on this host together ask for more cores than it has. Give each job a share: \
                  num_workers + 1 per job ≤ its cores (cores / jobs), torch.set_num_threads(1) in workers, \
                  OMP_NUM_THREADS per job; or use stoker in each job: its threads share the host through cpu_budget."
                .into(),
            share: Some(rq_share),
        });
    }

    // Python-bound main process.
    if gv.as_ref().is_none_or(|g| g.util_mean < 0.8) {
        for p in cx.procs.values().filter(|p| p.role == "main" || p.role == "child") {
            if !p.cmdline.contains("python") && !p.threads.iter().any(|t| t.name == "pt_main_thread") {
                continue;
            }
            let busy_ticks = window
                .iter()
                .filter(|t| t.procs.iter().any(|x| x.pid == p.pid && x.busiest_thread >= MAIN_THREAD_BUSY))
                .count();
            let share = busy_ticks as f64 / window.len() as f64;
            if share >= MAIN_THREAD_SHARE && demand < CPU_SATURATED * usable {
                let hot = p.threads.iter().max_by(|a, b| a.cpu_seconds.total_cmp(&b.cpu_seconds));
                out.push(Verdict {
                    rule: "python-bound".into(),
                    severity: "problem".into(),
                    title: format!("Python-bound: one thread of process {} runs flat out", p.pid),
                    evidence: format!(
                        "thread {} of pid {} ({}) used at least {} of a core in {} of the samples, while the job used {tree_cpu:.2} of {usable:.0} cores{}",
                        hot.map(|t| t.name.as_str()).unwrap_or("?"),
                        p.pid,
                        p.name,
                        pct(MAIN_THREAD_BUSY),
                        pct(share),
                        gv.as_ref().map(|g| format!(" and the GPU was busy {}", pct(g.util_mean))).unwrap_or_default()
                    ),
                    fix: "The training loop's own Python is the limit: move per-sample work into the loader (workers or \
                          stoker), avoid per-step synchronisation (.item(), .cpu(), printing), batch small operations, and \
                          consider torch.compile or CUDA graphs for the step."
                        .into(),
                    share: Some(share),
                });
            }
        }
    }

    // Memory growth: after a warm-up, a straight-line rise that is still rising at the end.
    // The last half second is left out too: a job that ends frees its memory while exiting.
    let warm = (0.25 * duration).max(2.0) + cx.ticks[0].t;
    let end = cx.ticks.last().map(|t| t.t).unwrap_or(0.0) - 0.5;
    let late: Vec<&Tick> = cx.ticks.iter().filter(|t| t.t >= warm && t.t <= end).collect();
    if late.len() >= 10 && late.last().map(|t| t.t).unwrap_or(0.0) - late[0].t >= 2.0 {
        let pts: Vec<(f64, f64)> = late.iter().map(|t| (t.t, t.tree_rss as f64)).collect();
        let half: Vec<(f64, f64)> = pts[pts.len() / 2..].to_vec();
        if let (Some((slope, r2)), Some((slope2, _))) = (fit(&pts), fit(&half)) {
            let span = pts.last().unwrap().0 - pts[0].0;
            let added = slope * span;
            if slope >= GROWTH_SLOPE && slope2 >= GROWTH_SLOPE && r2 >= GROWTH_R2 && added >= GROWTH_MIN_BYTES {
                let mut growers: Vec<(u32, String, f64)> = cx
                    .procs
                    .values()
                    .filter_map(|p| {
                        let pp: Vec<(f64, f64)> = late
                            .iter()
                            .filter_map(|t| t.procs.iter().find(|x| x.pid == p.pid).map(|x| (t.t, x.rss as f64)))
                            .collect();
                        let (s, _) = fit(&pp)?;
                        (s >= GROWTH_SLOPE / 2.0).then(|| (p.pid, p.cmdline.chars().take(60).collect(), s))
                    })
                    .collect();
                growers.sort_by(|a, b| b.2.total_cmp(&a.2));
                out.push(Verdict {
                    rule: "memory-growth".into(),
                    severity: "problem".into(),
                    title: "Memory grows steadily".into(),
                    evidence: format!(
                        "the job's resident memory rose {} per second over {span:.1} s after start-up (+{}, r² {r2:.2}), \
                         still {} per second in the second half; growing: {}",
                        mib(slope),
                        mib(added),
                        mib(slope2),
                        growers
                            .iter()
                            .map(|g| format!("pid {} `{}` {}/s", g.0, g.1, mib(g.2)))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                    fix: "In DataLoader workers this is usually copy-on-access: Python objects of the dataset (lists of \
                          paths, dicts) inherited from the parent get their pages copied as refcounts change; keep such \
                          indexes in numpy arrays or use stoker (threads, no copies). In the main process, look for \
                          tensors kept across steps (a loss history without .item(), growing caches)."
                        .into(),
                    share: None,
                });
            }
        }
    }

    // /dev/shm.
    if let (Some(size), Some(peak)) = (cx.shm_size, cx.ticks.iter().filter_map(|t| t.shm_used).max()) {
        if size > 0 && peak as f64 >= SHM_FULL * size as f64 {
            out.push(Verdict {
                rule: "shm-full".into(),
                severity: "problem".into(),
                title: "/dev/shm is nearly full".into(),
                evidence: format!("/dev/shm held {} of its {} at the peak", mib(peak as f64), mib(size as f64)),
                fix: "DataLoader workers hand batches over through /dev/shm and die with a bus error when it fills: \
                      enlarge it (docker run --shm-size=8g, or mount -o remount,size=8G /dev/shm), lower \
                      num_workers × prefetch_factor, or use stoker, which needs no shared memory."
                    .into(),
                share: None,
            });
        }
    }

    // GPU memory.
    for g in cx.gpus.iter().filter(|g| gpus.contains(&g.index) && g.memory_total_bytes > 0) {
        let peak = cx
            .ticks
            .iter()
            .flat_map(|t| t.gpus.iter().filter(|s| s.index == g.index).filter_map(|s| s.mem_used_bytes))
            .max()
            .unwrap_or(0);
        if peak as f64 >= GPU_MEMORY_FULL * g.memory_total_bytes as f64 {
            out.push(Verdict {
                rule: "gpu-memory-full".into(),
                severity: "warning".into(),
                title: format!("GPU {} memory is nearly full", g.index),
                evidence: format!(
                    "{} of {} in use at the peak ({})",
                    mib(peak as f64),
                    mib(g.memory_total_bytes as f64),
                    pct(peak as f64 / g.memory_total_bytes as f64)
                ),
                fix:
                    "PyTorch's caching allocator keeps freed blocks reserved, so an out-of-memory error can come with \
                      room left: compare torch.cuda.memory_reserved() with memory_allocated(); set \
                      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; lower the batch size or \
                      use activation checkpointing; send uint8 batches and normalise on the GPU."
                        .into(),
                share: None,
            });
        }
    }

    // Host-to-device traffic far below the link while the GPU waits and the CPU has room.
    if let Some(gvv) = &gv {
        for g in cx.gpus.iter().filter(|g| gpus.contains(&g.index)) {
            let Some(link) = g.pcie_link_bytes_per_s else { continue };
            let rx: Vec<f64> = window
                .iter()
                .flat_map(|t| t.gpus.iter().filter(|s| s.index == g.index).filter_map(|s| s.pcie_rx_bytes_per_s))
                .collect();
            let peak = rx.iter().cloned().fold(0.0, f64::max);
            if gvv.idle_share >= GPU_WAIT_SHARE && demand < 0.6 * usable && peak > 1e6 && peak < H2D_FRACTION * link {
                out.push(Verdict {
                    rule: "h2d-slow".into(),
                    severity: "warning".into(),
                    title: format!("Host-to-device traffic to GPU {} stays far below the bus", g.index),
                    evidence: format!(
                        "PCIe receive peaked at {:.2} GB/s, {} of the link's {:.1} GB/s, while the GPU waited in {} of the samples",
                        peak / 1e9,
                        pct(peak / link),
                        link / 1e9,
                        pct(gvv.idle_share)
                    ),
                    fix: "Copies from pageable memory go through a staging buffer and block: use pin_memory=True with \
                          .to(device, non_blocking=True), or stoker's device=\"cuda\" (pinned pool, its own copy stream); \
                          send uint8 rather than float32. `stoker doctor` measures what this bus really gives."
                        .into(),
                    share: Some(gvv.idle_share),
                });
            }
        }
    }

    if out.is_empty() {
        let gpu = gv.as_ref().map(|g| format!("GPU busy {} on average; ", pct(g.util_mean))).unwrap_or_default();
        out.push(Verdict {
            rule: "healthy".into(),
            severity: "ok".into(),
            title: "No problem found".into(),
            evidence: format!(
                "{gpu}the job used {tree_cpu:.2} of {usable:.0} cores; {rq:.1} runnable threads on {cores:.0} cores; \
                 its threads waited for a CPU {} of the time",
                pct(wait_share)
            ),
            fix: "Nothing to change.".into(),
            share: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::sample::ProcTick;
    use stoker_cuda::GpuSample;

    fn tick(t: f64, cpu: f64, rss: u64, util: Option<f64>, rq: u32, wait: (u64, u64)) -> Tick {
        Tick {
            t,
            host_busy: cpu,
            host_steal: 0.0,
            per_core: vec![],
            run_queue: rq,
            mem_available: 1 << 33,
            shm_used: Some(1 << 20),
            tree_cpu: cpu,
            tree_demand: cpu,
            tree_rss: rss,
            tree_pss: None,
            tree_threads: 4,
            tree_runnable: 1,
            tree_wait_share: None,
            tree_run_wait_ns: wait,
            tree_read_bytes_per_s: None,
            procs: vec![ProcTick { pid: 1, cpu, busiest_thread: cpu.min(1.0), rss }],
            gpus: util
                .map(|u| {
                    vec![GpuSample { index: 0, util: Some(u), mem_used_bytes: Some(1 << 30), ..GpuSample::default() }]
                })
                .unwrap_or_default(),
        }
    }

    fn rules(ticks: &[Tick], gpus: bool) -> Vec<String> {
        rules_with(ticks, gpus, HashMap::new())
    }

    fn rules_with(ticks: &[Tick], gpus: bool, procs: HashMap<u32, ProcSummary>) -> Vec<String> {
        let g = [GpuStatic {
            index: 0,
            name: "fake".into(),
            memory_total_bytes: 80 << 30,
            pcie_link_bytes_per_s: Some(31.5e9),
            pcie_link: None,
        }];
        let cx = Context {
            ticks,
            procs: &procs,
            gpus: if gpus { &g } else { &[] },
            cores: 2,
            allowance: 2.0,
            shm_size: Some(64 << 20),
        };
        evaluate(&cx).into_iter().map(|v| v.rule).collect()
    }

    #[test]
    fn a_waiting_gpu_with_saturated_cpus_is_input_bound_and_a_fed_one_is_healthy() {
        let starved: Vec<Tick> = (0..50)
            .map(|i| tick(i as f64 * 0.1, 1.9, 100 << 20, Some(if i % 3 == 0 { 0.9 } else { 0.05 }), 2, (9, 1)))
            .collect();
        assert_eq!(rules(&starved, true), ["input-bound"]);
        let fed: Vec<Tick> = (0..50).map(|i| tick(i as f64 * 0.1, 1.9, 100 << 20, Some(0.95), 2, (9, 1))).collect();
        assert_eq!(rules(&fed, true), ["healthy"]);
        // Just under the share: 14 of 50 waiting ticks (28%) is not input-bound.
        let edge: Vec<Tick> = (0..50)
            .map(|i| tick(i as f64 * 0.1, 1.9, 100 << 20, Some(if i < 14 { 0.1 } else { 0.9 }), 2, (9, 1)))
            .collect();
        assert_eq!(rules(&edge, true), ["healthy"]);
        // A waiting GPU with idle CPUs is a warning about something else.
        let idle: Vec<Tick> = (0..50).map(|i| tick(i as f64 * 0.1, 0.3, 100 << 20, Some(0.1), 1, (9, 1))).collect();
        assert_eq!(rules(&idle, true), ["gpu-waiting"]);
    }

    #[test]
    fn queueing_for_cpus_is_oversubscription_only_with_both_signs() {
        let over: Vec<Tick> = (0..50).map(|i| tick(i as f64 * 0.1, 1.0, 100 << 20, None, 4, (5, 5))).collect();
        assert_eq!(rules(&over, false), ["host-oversubscribed"]);
        // A long run queue whose threads do not wait (other jobs' threads) is not this job's problem.
        let others: Vec<Tick> = (0..50).map(|i| tick(i as f64 * 0.1, 1.0, 100 << 20, None, 4, (95, 5))).collect();
        assert_eq!(rules(&others, false), ["healthy"]);
    }

    #[test]
    fn steady_growth_after_start_up_is_flagged_and_a_start_up_step_is_not() {
        let grow: Vec<Tick> =
            (0..80).map(|i| tick(i as f64 * 0.1, 0.5, (100 << 20) + i as u64 * (4 << 20), None, 1, (9, 1))).collect();
        assert_eq!(rules(&grow, false), ["memory-growth"]);
        let step: Vec<Tick> = (0..80)
            .map(|i| tick(i as f64 * 0.1, 0.5, if i < 25 { 100 << 20 } else { 600 << 20 }, None, 1, (9, 1)))
            .collect();
        assert_eq!(rules(&step, false), ["healthy"]);
    }

    #[test]
    fn full_shm_and_full_gpu_memory_are_named() {
        let mut t: Vec<Tick> = (0..20).map(|i| tick(i as f64 * 0.1, 0.5, 100 << 20, Some(0.95), 1, (9, 1))).collect();
        t[10].shm_used = Some(60 << 20);
        t[11].gpus[0].mem_used_bytes = Some(79 << 30);
        assert_eq!(rules(&t, true), ["shm-full", "gpu-memory-full"]);
        assert_eq!(rules(&t[..3], true), ["too-short"]);
    }

    #[test]
    fn one_hot_python_thread_is_python_bound_but_a_busy_worker_is_not() {
        let ticks: Vec<Tick> = (0..50).map(|i| tick(i as f64 * 0.1, 1.0, 100 << 20, Some(0.4), 1, (9, 1))).collect();
        let main = ProcSummary::for_test(1, "main", "python train.py", &[("pt_main_thread", 4.9)]);
        assert_eq!(rules_with(&ticks, true, HashMap::from([(1, main)])), ["gpu-waiting", "python-bound"]);
        let worker = ProcSummary::for_test(1, "dataloader-worker", "python train.py", &[("python", 4.9)]);
        assert_eq!(rules_with(&ticks, true, HashMap::from([(1, worker)])), ["input-bound"]);
    }

    #[test]
    fn a_line_fit_recovers_slope_and_r2() {
        let pts: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 1.0)).collect();
        let (s, r2) = fit(&pts).unwrap();
        assert!((s - 3.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
        assert_eq!(fit(&pts[..2]), None);
    }
}
