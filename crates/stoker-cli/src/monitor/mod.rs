//! `stoker monitor`: watch any training job (stoker or not) and say why its GPU waits.
//!
//! It samples the job's whole process tree and the host ten times a second (`procfs`), the
//! GPUs through NVML (`stoker_cuda::GpuSampler`, loaded at run time), shows a live line, and at
//! the end prints a summary per process and the verdicts (`rules`): input-bound, host
//! oversubscribed, Python-bound, memory growth, `/dev/shm` full, GPU memory full, slow
//! host-to-device traffic, each with its evidence and the change to make.

mod procfs;
mod report;
mod rules;
mod sample;

use anyhow::{bail, Context as _, Result};
use clap::Args;
use sample::Sampler;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use rules::Verdict;

/// Flags of `stoker monitor`.
#[derive(Args)]
pub struct MonitorArgs {
    /// Watch this running process and its descendants.
    #[arg(long, conflicts_with = "command")]
    pub pid: Option<u32>,
    /// Sampling interval: 100ms (default), 0.5s, 1s.
    #[arg(long, default_value = "100ms")]
    pub interval: String,
    /// Stop watching after this many seconds (the command, if any, keeps running; the monitor
    /// exits with its status once it ends).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Print one JSON object (summary, time series, verdicts) on stdout instead of the human
    /// summary.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report (plots, tables, verdicts) to this file.
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
    /// No live line on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Do not load NVML (no GPU view).
    #[arg(long)]
    pub no_gpu: bool,
    /// The command to run and watch, after `--`: `stoker monitor -- python train.py`.
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// Parses an interval: `100ms`, `0.5s`, `2s`, or a bare number of milliseconds.
pub fn parse_interval(s: &str) -> Result<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(v) = s.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1.0)
    } else {
        (s, 1e-3)
    };
    let v: f64 =
        num.trim().parse().map_err(|_| anyhow::anyhow!("--interval: expected e.g. 100ms or 0.5s, got {s:?}"))?;
    let secs = v * scale;
    if !(0.01..=60.0).contains(&secs) {
        bail!("--interval: must be between 10ms and 60s, got {s:?}");
    }
    Ok(Duration::from_secs_f64(secs))
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// What was watched and how it ended.
struct Target {
    pid: u32,
    command: Option<Vec<String>>,
    exit_code: Option<i32>,
}

/// Runs `stoker monitor`.
pub fn run(a: &MonitorArgs) -> Result<()> {
    let interval = parse_interval(&a.interval)?;
    if let Some(d) = a.duration {
        if !(d > 0.0 && d.is_finite()) {
            bail!("--duration: must be a positive number of seconds, got {d}");
        }
    }
    // Made before the job starts, so a bad path fails at once (and is removed if the watch fails).
    let out_file = a.out.as_deref().map(|p| crate::series::ReportFile::create(p, "--out")).transpose()?;
    let mut child = None;
    let pid = match (a.pid, a.command.is_empty()) {
        (Some(p), true) => {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                bail!("--pid: no process {p} on this machine");
            }
            p
        }
        (None, false) => {
            let c = std::process::Command::new(&a.command[0])
                .args(&a.command[1..])
                .spawn()
                .with_context(|| format!("cannot start {:?}", a.command[0]))?;
            let p = c.id();
            child = Some(c);
            p
        }
        (None, true) => {
            bail!("say what to watch: --pid PID, or a command after `--` (stoker monitor -- python train.py)")
        }
        (Some(_), false) => bail!("--pid and a command cannot both be given"),
    };
    // Ctrl-C stops the watch and still prints the report (a command run here gets it too).
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let cpu0 = crate::util::cpu_seconds();
    let mut sampler = Sampler::new(pid, !a.no_gpu);
    let live = !a.quiet;
    let tty = std::io::stderr().is_terminal();
    if live {
        let gpus = sampler.gpus();
        let g = if gpus.is_empty() {
            sampler.gpu_note.clone().unwrap_or_default()
        } else {
            gpus.iter().map(|g| format!("GPU {} {}", g.index, g.name)).collect::<Vec<_>>().join(", ")
        };
        eprintln!("stoker monitor: watching pid {pid} every {:?}; {g}", interval);
    }
    let start = Instant::now();
    let mut next = start;
    let mut last_line = start;
    let mut target = Target { pid, command: (!a.command.is_empty()).then(|| a.command.clone()), exit_code: None };
    sampler.sample();
    loop {
        next += interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now;
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            break;
        }
        if let Some(c) = child.as_mut() {
            if let Some(st) = c.try_wait()? {
                target.exit_code = Some(exit_code(st));
                break;
            }
        } else if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        sampler.sample();
        if live && last_line.elapsed() >= Duration::from_millis(if tty { 500 } else { 5000 }) {
            last_line = Instant::now();
            if let Some(t) = sampler.ticks.last() {
                let line = live_line(&sampler, t);
                if tty {
                    eprint!("\r\x1b[2K{line}");
                } else {
                    eprintln!("{line}");
                }
            }
        }
        if a.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) {
            break;
        }
    }
    if live && tty {
        eprintln!();
    }
    let watched = start.elapsed().as_secs_f64();
    let own_cpu = crate::util::cpu_seconds() - cpu0;
    sampler.assign_roles();
    let allowance = stoker::cpu::allowance();
    let cores = sampler.ticks.first().map(|t| t.per_core.len()).filter(|&n| n > 0).unwrap_or(allowance.online);
    let cx = rules::Context {
        ticks: &sampler.ticks,
        procs: &sampler.procs,
        gpus: sampler.gpus(),
        cores,
        allowance: allowance.effective as f64,
        shm_size: sampler.shm_size,
    };
    let verdicts = rules::evaluate(&cx);
    let report = build_json(&sampler, &target, &verdicts, interval, watched, own_cpu, cores, allowance.effective);
    if let Some(f) = out_file {
        f.write(&report_html(&report))?;
    }
    if a.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
    } else {
        print_human(&sampler, &verdicts, &report);
        if let Some(path) = &a.out {
            println!("report: {}", path.display());
        }
    }
    if let Some(mut c) = child {
        let code = match target.exit_code {
            Some(c) => c,
            None => exit_code(c.wait()?),
        };
        if code != 0 {
            std::io::stdout().flush()?;
            std::process::exit(code);
        }
    }
    Ok(())
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

fn gib(b: f64) -> String {
    format!("{:.2} GiB", b / (1u64 << 30) as f64)
}

fn live_line(s: &Sampler, t: &sample::Tick) -> String {
    let mut line = format!(
        "[{:6.1}s] job {:.2} cores, {} procs {} threads, RSS {} | host {:.2} busy, run queue {}, {} available",
        t.t,
        t.tree_cpu,
        t.procs.len(),
        t.tree_threads,
        gib(t.tree_rss as f64),
        t.host_busy,
        t.run_queue,
        gib(t.mem_available as f64)
    );
    for g in &t.gpus {
        let total = s.gpus().iter().find(|x| x.index == g.index).map(|x| x.memory_total_bytes).unwrap_or(0);
        line += &format!(
            " | GPU{} {:.0}% {}/{} rx {:.2} GB/s",
            g.index,
            g.util.unwrap_or(0.0) * 100.0,
            gib(g.mem_used_bytes.unwrap_or(0) as f64),
            gib(total as f64),
            g.pcie_rx_bytes_per_s.unwrap_or(0.0) / 1e9
        );
    }
    line
}

/// Evenly thins `v` to at most `max` points by averaging runs of neighbours.
fn thin(v: &[f64], max: usize) -> Vec<f64> {
    if v.len() <= max || max == 0 {
        return v.to_vec();
    }
    let step = v.len().div_ceil(max);
    v.chunks(step).map(|c| c.iter().sum::<f64>() / c.len() as f64).collect()
}

const SERIES_POINTS: usize = 1000;

#[allow(clippy::too_many_arguments)]
fn build_json(
    s: &Sampler,
    target: &Target,
    verdicts: &[Verdict],
    interval: Duration,
    watched: f64,
    own_cpu: f64,
    cores: usize,
    allowance: usize,
) -> serde_json::Value {
    use serde_json::json;
    let ticks = &s.ticks;
    let col = |f: &dyn Fn(&sample::Tick) -> f64| thin(&ticks.iter().map(f).collect::<Vec<_>>(), SERIES_POINTS);
    let mut procs: Vec<&sample::ProcSummary> = s.procs.values().collect();
    procs.sort_by_key(|p| p.pid);
    let mut proc_cpu = serde_json::Map::new();
    let mut proc_rss = serde_json::Map::new();
    for p in &procs {
        let cpu: Vec<f64> =
            ticks.iter().map(|t| t.procs.iter().find(|x| x.pid == p.pid).map(|x| x.cpu).unwrap_or(0.0)).collect();
        let rss: Vec<f64> = ticks
            .iter()
            .map(|t| t.procs.iter().find(|x| x.pid == p.pid).map(|x| x.rss as f64).unwrap_or(0.0))
            .collect();
        proc_cpu.insert(p.pid.to_string(), json!(thin(&cpu, SERIES_POINTS)));
        proc_rss.insert(p.pid.to_string(), json!(thin(&rss, SERIES_POINTS)));
    }
    let mut gpu_series = vec![];
    let mut gpus = vec![];
    for g in s.gpus() {
        let pick = |f: &dyn Fn(&stoker_cuda::GpuSample) -> Option<f64>| -> Vec<f64> {
            ticks.iter().map(|t| t.gpus.iter().find(|x| x.index == g.index).and_then(f).unwrap_or(0.0)).collect()
        };
        let util = pick(&|x| x.util);
        let mem = pick(&|x| x.mem_used_bytes.map(|b| b as f64));
        let rx = pick(&|x| x.pcie_rx_bytes_per_s);
        let tx = pick(&|x| x.pcie_tx_bytes_per_s);
        let n = util.len().max(1) as f64;
        let tree_pids: Vec<u32> =
            procs.iter().filter(|p| p.gpus.iter().any(|x| x.0 == g.index)).map(|p| p.pid).collect();
        gpus.push(json!({
            "index": g.index, "name": g.name, "memory_total_bytes": g.memory_total_bytes,
            "pcie_link": g.pcie_link, "pcie_link_bytes_per_s": g.pcie_link_bytes_per_s,
            "util_mean": util.iter().sum::<f64>() / n,
            "mem_used_peak_bytes": mem.iter().cloned().fold(0.0, f64::max),
            "pcie_rx_mean_bytes_per_s": rx.iter().sum::<f64>() / n,
            "pcie_rx_peak_bytes_per_s": rx.iter().cloned().fold(0.0, f64::max),
            "job_pids": tree_pids,
        }));
        gpu_series.push(json!({
            "index": g.index,
            "util": thin(&util, SERIES_POINTS), "mem_used_bytes": thin(&mem, SERIES_POINTS),
            "pcie_rx_bytes_per_s": thin(&rx, SERIES_POINTS), "pcie_tx_bytes_per_s": thin(&tx, SERIES_POINTS),
        }));
    }
    let n = ticks.len().max(1) as f64;
    let (run, wait) = ticks.iter().fold((0u64, 0u64), |a, t| (a.0 + t.tree_run_wait_ns.0, a.1 + t.tree_run_wait_ns.1));
    let involuntary: u64 = procs.iter().flat_map(|p| p.threads.iter()).map(|t| t.involuntary_switches).sum();
    let voluntary: u64 = procs.iter().flat_map(|p| p.threads.iter()).map(|t| t.voluntary_switches).sum();
    let sampled = ticks.last().map(|t| t.t).unwrap_or(0.0);
    json!({
        "version": 1,
        "target": { "pid": target.pid, "command": target.command, "exit_code": target.exit_code },
        "interval_s": interval.as_secs_f64(),
        "duration_s": watched,
        "ticks": ticks.len(),
        "host": {
            "cores": cores, "cpu_allowance": allowance, "mem_total_bytes": s.mem_total, "shm_size_bytes": s.shm_size,
        },
        "gpus": gpus,
        "gpu_note": s.gpu_note,
        "summary": {
            "tree_cpu_mean_cores": ticks.iter().map(|t| t.tree_cpu).sum::<f64>() / n,
            "tree_cpu_peak_cores": ticks.iter().map(|t| t.tree_cpu).fold(0.0, f64::max),
            "tree_rss_first_bytes": ticks.first().map(|t| t.tree_rss),
            "tree_rss_last_bytes": ticks.last().map(|t| t.tree_rss),
            "tree_rss_peak_bytes": ticks.iter().map(|t| t.tree_rss).max(),
            "tree_rss_slope_bytes_per_s": rules::fit(&ticks.iter().map(|t| (t.t, t.tree_rss as f64)).collect::<Vec<_>>()).map(|f| f.0),
            "tree_pss_last_bytes": ticks.iter().rev().find_map(|t| t.tree_pss),
            "processes_seen": procs.len(),
            "host_busy_mean_cores": ticks.iter().map(|t| t.host_busy).sum::<f64>() / n,
            "host_steal_mean_cores": ticks.iter().map(|t| t.host_steal).sum::<f64>() / n,
            "run_queue_mean": ticks.iter().map(|t| t.run_queue as f64).sum::<f64>() / n,
            "tree_cpu_wait_share": if run + wait > 0 { Some(wait as f64 / (run + wait) as f64) } else { None },
            "involuntary_switches_per_s": involuntary as f64 / sampled.max(1e-3),
            "voluntary_switches_per_s": voluntary as f64 / sampled.max(1e-3),
            "mem_available_min_bytes": ticks.iter().map(|t| t.mem_available).min(),
            "shm_used_peak_bytes": ticks.iter().filter_map(|t| t.shm_used).max(),
        },
        "processes": procs,
        "verdicts": verdicts,
        "overhead": {
            "monitor_cpu_seconds": own_cpu,
            "watched_seconds": watched,
            "cpu_share_of_one_core": own_cpu / watched.max(1e-3),
        },
        "series": {
            "points": ticks.len().min(SERIES_POINTS),
            "t": col(&|t| t.t),
            "tree_cpu": col(&|t| t.tree_cpu),
            "host_busy": col(&|t| t.host_busy),
            "host_steal": col(&|t| t.host_steal),
            "run_queue": col(&|t| t.run_queue as f64),
            "tree_rss_bytes": col(&|t| t.tree_rss as f64),
            "mem_available_bytes": col(&|t| t.mem_available as f64),
            "shm_used_bytes": col(&|t| t.shm_used.unwrap_or(0) as f64),
            "tree_read_bytes_per_s": col(&|t| t.tree_read_bytes_per_s.unwrap_or(0.0)),
            "process_cpu": proc_cpu,
            "process_rss_bytes": proc_rss,
            "gpus": gpu_series,
        },
    })
}

fn print_human(s: &Sampler, verdicts: &[Verdict], report: &serde_json::Value) {
    let sm = &report["summary"];
    let f = |k: &str| sm[k].as_f64().unwrap_or(0.0);
    println!(
        "watched {:.1} s, {} samples: the job used {:.2} cores on average (peak {:.2}) of {} on the host; \
         RSS {} -> {} (peak {}); run queue {:.1}; its threads waited for a CPU {:.0}% of the time",
        report["duration_s"].as_f64().unwrap_or(0.0),
        report["ticks"],
        f("tree_cpu_mean_cores"),
        f("tree_cpu_peak_cores"),
        report["host"]["cores"],
        gib(f("tree_rss_first_bytes")),
        gib(f("tree_rss_last_bytes")),
        gib(f("tree_rss_peak_bytes")),
        f("run_queue_mean"),
        f("tree_cpu_wait_share") * 100.0
    );
    let mut procs: Vec<&sample::ProcSummary> = s.procs.values().collect();
    procs.sort_by(|a, b| {
        (b.cpu_user_seconds + b.cpu_system_seconds).total_cmp(&(a.cpu_user_seconds + a.cpu_system_seconds))
    });
    if procs.len() > 30 {
        println!("the 30 busiest of {} processes:", procs.len());
    }
    println!("{:>8} {:<18} {:>8} {:>8} {:>10} {:>10}  command", "pid", "role", "user s", "sys s", "RSS peak", "PSS");
    for p in procs.iter().take(30) {
        println!(
            "{:>8} {:<18} {:>8.2} {:>8.2} {:>10} {:>10}  {}",
            p.pid,
            p.role,
            p.cpu_user_seconds,
            p.cpu_system_seconds,
            gib(p.rss_peak as f64),
            p.pss_last.map(|x| gib(x as f64)).unwrap_or_else(|| "-".into()),
            p.cmdline.chars().take(60).collect::<String>()
        );
        let mut th: Vec<&sample::ThreadSummary> = p.threads.iter().filter(|t| t.cpu_seconds > 0.05).collect();
        th.sort_by(|a, b| b.cpu_seconds.total_cmp(&a.cpu_seconds));
        for t in th.iter().take(4) {
            println!(
                "{:>8}   thread {:<16} {:>6.2} CPU-s, waited {:.2} s for a CPU, {} involuntary switches",
                "", t.name, t.cpu_seconds, t.wait_seconds, t.involuntary_switches
            );
        }
    }
    for g in report["gpus"].as_array().into_iter().flatten() {
        println!(
            "GPU {} {}: utilisation {:.0}% on average, memory peak {} of {}, PCIe rx {:.2} GB/s mean",
            g["index"],
            g["name"].as_str().unwrap_or(""),
            g["util_mean"].as_f64().unwrap_or(0.0) * 100.0,
            gib(g["mem_used_peak_bytes"].as_f64().unwrap_or(0.0)),
            gib(g["memory_total_bytes"].as_f64().unwrap_or(0.0)),
            g["pcie_rx_mean_bytes_per_s"].as_f64().unwrap_or(0.0) / 1e9
        );
    }
    if let Some(n) = &s.gpu_note {
        println!("no GPU view: {n}");
    }
    println!();
    for v in verdicts {
        println!("[{}] {}", v.severity, v.title);
        println!("    evidence: {}", v.evidence);
        println!("    fix: {}", v.fix);
    }
    println!(
        "monitor overhead: {:.2}% of one core",
        report["overhead"]["cpu_share_of_one_core"].as_f64().unwrap_or(0.0) * 100.0
    );
}

/// The HTML report of a monitor run: the JSON object drawn as a page.
fn report_html(report: &serde_json::Value) -> String {
    crate::html::render(&report::build(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_interval("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_interval("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_interval("250").unwrap(), Duration::from_millis(250));
        assert!(parse_interval("1ms").unwrap_err().to_string().contains("--interval"));
        assert!(parse_interval("fast").unwrap_err().to_string().contains("--interval"));
    }

    #[test]
    fn thinning_keeps_the_mean_and_bounds_the_length() {
        let v: Vec<f64> = (0..2500).map(|i| (i % 2) as f64).collect();
        let t = thin(&v, 1000);
        assert!(t.len() <= 1000);
        assert!((t.iter().sum::<f64>() / t.len() as f64 - 0.5).abs() < 0.01);
    }
}
