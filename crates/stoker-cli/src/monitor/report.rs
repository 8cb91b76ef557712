//! The monitor's HTML report (`stoker monitor --out report.html`), built from the same JSON
//! object `--json` prints, so the page and the JSON never disagree: CPU per process, the host's
//! CPU and run queue, memory, GPU utilisation, memory and PCIe traffic over time, the verdicts
//! and the tables of processes and threads.

use crate::html::{Chart, HtmlReport, HtmlVerdict, Series, Table};
use serde_json::Value;

const GIB: f64 = (1u64 << 30) as f64;

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect()).unwrap_or_default()
}

fn line(name: impl Into<String>, t: &[f64], v: &[f64], scale: f64) -> Series {
    Series::new(name, t.iter().zip(v).map(|(&t, &v)| (t, v * scale)).collect())
}

fn gib(b: &Value) -> String {
    b.as_f64().map(|b| format!("{:.2} GiB", b / GIB)).unwrap_or_else(|| "-".into())
}

/// The page for a monitor report (the object `build_json` makes).
pub(crate) fn build(r: &Value) -> HtmlReport {
    let t = nums(&r["series"]["t"]);
    let sm = &r["summary"];
    let cores = r["host"]["cores"].as_f64().unwrap_or(1.0);
    let target = match r["target"]["command"].as_array() {
        Some(c) => c.iter().filter_map(|x| x.as_str()).collect::<Vec<_>>().join(" "),
        None => format!("pid {}", r["target"]["pid"]),
    };
    let mut procs: Vec<&Value> = r["processes"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
    let cpu_of =
        |p: &Value| p["cpu_user_seconds"].as_f64().unwrap_or(0.0) + p["cpu_system_seconds"].as_f64().unwrap_or(0.0);
    procs.sort_by(|a, b| cpu_of(b).total_cmp(&cpu_of(a)));

    let mut cpu = Chart { title: "CPU of the job, per process".into(), unit: "cores".into(), ..Chart::default() };
    cpu.series.push(line("whole job", &t, &nums(&r["series"]["tree_cpu"]), 1.0).color(0));
    for (k, p) in procs.iter().take(6).enumerate() {
        let pid = p["pid"].to_string();
        let name = format!("{} {} ({})", pid, p["name"].as_str().unwrap_or(""), p["role"].as_str().unwrap_or(""));
        cpu.series.push(line(name, &t, &nums(&r["series"]["process_cpu"][&pid]), 1.0).color(k + 1));
    }
    let mut host = Chart { title: "Host CPU and run queue".into(), unit: "cores / threads".into(), ..Chart::default() };
    host.series.push(line("cores busy", &t, &nums(&r["series"]["host_busy"]), 1.0));
    host.series.push(line("runnable threads", &t, &nums(&r["series"]["run_queue"]), 1.0));
    host.series.push(Series::new("cores", t.iter().map(|&x| (x, cores)).collect()));
    let mut mem = Chart { title: "Memory".into(), unit: "GiB".into(), ..Chart::default() };
    mem.series.push(line("job RSS", &t, &nums(&r["series"]["tree_rss_bytes"]), 1.0 / GIB));
    mem.series.push(line("host available", &t, &nums(&r["series"]["mem_available_bytes"]), 1.0 / GIB));
    mem.series.push(line("/dev/shm used", &t, &nums(&r["series"]["shm_used_bytes"]), 1.0 / GIB));
    let mut charts = vec![cpu, host, mem];
    if let Some(gpus) = r["series"]["gpus"].as_array().filter(|g| !g.is_empty()) {
        let mut util =
            Chart { title: "GPU utilisation".into(), unit: "%".into(), y_max: Some(100.0), ..Chart::default() };
        let mut gmem = Chart { title: "GPU memory used".into(), unit: "GiB".into(), ..Chart::default() };
        let mut pcie = Chart { title: "PCIe traffic".into(), unit: "GB/s".into(), ..Chart::default() };
        for (k, g) in gpus.iter().enumerate() {
            let i = &g["index"];
            util.series.push(line(format!("GPU {i}"), &t, &nums(&g["util"]), 100.0).color(k));
            gmem.series.push(line(format!("GPU {i}"), &t, &nums(&g["mem_used_bytes"]), 1.0 / GIB).color(k));
            pcie.series
                .push(line(format!("GPU {i} host→device"), &t, &nums(&g["pcie_rx_bytes_per_s"]), 1e-9).color(2 * k));
            pcie.series.push(
                line(format!("GPU {i} device→host"), &t, &nums(&g["pcie_tx_bytes_per_s"]), 1e-9).color(2 * k + 1),
            );
        }
        charts.extend([util, gmem, pcie]);
    }

    let verdicts = r["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| HtmlVerdict {
            severity: v["severity"].as_str().unwrap_or("warning").into(),
            title: v["title"].as_str().unwrap_or("").into(),
            evidence: v["evidence"].as_str().unwrap_or("").into(),
            fix: v["fix"].as_str().unwrap_or("").into(),
        })
        .collect();

    let mut ptable = Table {
        title: "Processes (busiest first)".into(),
        header: ["pid", "role", "name", "user CPU s", "system CPU s", "RSS peak", "PSS", "read", "command"]
            .map(String::from)
            .to_vec(),
        rows: vec![],
    };
    let mut ttable = Table {
        title: "Busiest threads".into(),
        header: ["pid", "thread", "CPU s", "waited for a CPU s", "involuntary switches", "voluntary switches"]
            .map(String::from)
            .to_vec(),
        rows: vec![],
    };
    let mut threads = vec![];
    for p in procs.iter().take(40) {
        ptable.rows.push(vec![
            p["pid"].to_string(),
            p["role"].as_str().unwrap_or("").into(),
            p["name"].as_str().unwrap_or("").into(),
            format!("{:.2}", p["cpu_user_seconds"].as_f64().unwrap_or(0.0)),
            format!("{:.2}", p["cpu_system_seconds"].as_f64().unwrap_or(0.0)),
            gib(&p["rss_peak"]),
            gib(&p["pss_last"]),
            p["read_bytes"].as_f64().map(|b| format!("{:.1} MiB", b / 1048576.0)).unwrap_or_else(|| "-".into()),
            p["cmdline"].as_str().unwrap_or("").chars().take(120).collect(),
        ]);
        for th in p["threads"].as_array().into_iter().flatten() {
            threads.push((p["pid"].to_string(), th));
        }
    }
    threads.sort_by(|a, b| {
        b.1["cpu_seconds"].as_f64().unwrap_or(0.0).total_cmp(&a.1["cpu_seconds"].as_f64().unwrap_or(0.0))
    });
    for (pid, th) in threads.iter().take(25) {
        ttable.rows.push(vec![
            pid.clone(),
            th["name"].as_str().unwrap_or("").into(),
            format!("{:.2}", th["cpu_seconds"].as_f64().unwrap_or(0.0)),
            format!("{:.2}", th["wait_seconds"].as_f64().unwrap_or(0.0)),
            th["involuntary_switches"].to_string(),
            th["voluntary_switches"].to_string(),
        ]);
    }
    let f = |k: &str| sm[k].as_f64().unwrap_or(0.0);
    let mut meta = vec![
        ("watched".to_string(), format!("{:.1} s, {} samples", r["duration_s"].as_f64().unwrap_or(0.0), r["ticks"])),
        ("host".into(), format!("{} cores, {} in total", r["host"]["cores"], gib(&r["host"]["mem_total_bytes"]))),
        (
            "job CPU".into(),
            format!("{:.2} cores on average, {:.2} at the peak", f("tree_cpu_mean_cores"), f("tree_cpu_peak_cores")),
        ),
        (
            "job memory".into(),
            format!("RSS peak {}, PSS {}", gib(&sm["tree_rss_peak_bytes"]), gib(&sm["tree_pss_last_bytes"])),
        ),
        ("run queue".into(), format!("{:.1} runnable threads on average", f("run_queue_mean"))),
        ("waited for a CPU".into(), format!("{:.0}% of the job's runnable time", f("tree_cpu_wait_share") * 100.0)),
        (
            "monitor overhead".into(),
            format!("{:.2}% of one core", r["overhead"]["cpu_share_of_one_core"].as_f64().unwrap_or(0.0) * 100.0),
        ),
    ];
    if let Some(code) = r["target"]["exit_code"].as_i64() {
        meta.push(("exit status".into(), code.to_string()));
    }
    for g in r["gpus"].as_array().into_iter().flatten() {
        meta.push((
            format!("GPU {}", g["index"]),
            format!(
                "{}, {}, {:.0}% busy on average",
                g["name"].as_str().unwrap_or(""),
                gib(&g["memory_total_bytes"]),
                g["util_mean"].as_f64().unwrap_or(0.0) * 100.0
            ),
        ));
    }
    if let Some(n) = r["gpu_note"].as_str() {
        meta.push(("GPUs".into(), format!("no GPU view: {n}")));
    }
    HtmlReport {
        title: "stoker monitor".into(),
        subtitle: target,
        meta,
        verdicts,
        charts,
        tables: vec![ptable, ttable],
    }
}
