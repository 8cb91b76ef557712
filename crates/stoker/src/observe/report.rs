//! [`Report`]: what a loader of any kind tells its user. The fields every kind has (wall time,
//! samples delivered, the stage table, the consumer's starvation, the [`Bottleneck`] verdict,
//! skipped samples, device, transfer, tuning) are here once; a kind adds its typed
//! [`Section`] (image decode warnings and pixel cache, token counters and tokenizer, array
//! batches), flattened into the same JSON object, and names its stages and its verdict.
//!
//! Owns: the report's shape and its human summary. May not touch: counters (see
//! [`crate::observe::telemetry`]) or any kind's types (a kind brings its section).

/// A kind's part of a [`Report`]: serialised into the report's JSON object (flattened), and
/// its lines of the human summary.
pub trait Section: serde::Serialize {
    /// What one delivered item is called in the summary (`samples`, `rows`).
    fn items(&self) -> &'static str {
        "samples"
    }

    /// The lines this section adds to [`Report::to_text`] after the stage table (each ending
    /// in a newline; empty when there is nothing to say).
    fn text(&self) -> String {
        String::new()
    }
}

/// A report of a loader whose kind adds the section `S`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report<S> {
    /// Seconds the loader's passes ran (from the start of each pass to its end).
    pub wall_seconds: f64,
    /// Samples (rows) delivered.
    pub samples: u64,
    /// Per-stage counters: the kind's stages, then the shell's (`buffer wait`, `consumer`,
    /// and `transfer` when batches go to a GPU).
    pub stages: Vec<StageReport>,
    /// Fraction of the consumer's time spent waiting for data.
    pub starvation: f64,
    /// The same, leaving out each pass's first batch (the pipeline's fill): what the verdict
    /// weighs.
    pub starvation_steady: f64,
    /// The CPU clocks over the passes: the process's and its workers'.
    pub cpu: CpuReport,
    /// Which stage limits throughput, and what to do (`None`: the kind has no verdict yet,
    /// such as a token loader before its first iteration).
    pub bottleneck: Option<Bottleneck>,
    /// Number of skipped samples.
    pub skipped_count: u64,
    /// The skipped samples (at most [`crate::observe::telemetry::MAX_SKIPPED_LISTED`]).
    pub skipped: Vec<Skipped>,
    /// Where batches go.
    pub device: DeviceReport,
    /// Host-to-device copies, when batches go to a GPU.
    pub transfer: Option<TransferReport>,
    /// Threads, prefetch and the host-wide CPU share: as set or as tuned (kinds with a tuner).
    pub tuning: Option<TuningReport>,
    /// The kind's section.
    #[serde(flatten)]
    pub kind: S,
}

/// One stage in a report.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StageReport {
    /// Stage name.
    pub name: String,
    /// Threads working in it.
    pub threads: usize,
    /// Items processed.
    pub items: u64,
    /// Total busy seconds (summed over threads).
    pub busy_seconds: f64,
    /// Total waiting seconds (summed over threads).
    pub wait_seconds: f64,
    /// busy / (wall * threads).
    pub utilization: f64,
}

/// What the CPU clocks say over a loader's passes: the process's CPU time (all its threads,
/// the trainer's included) and the CPU time of the threads doing the kind's per-sample work
/// (decode threads, tokenizer threads). A stage's `utilization` is wall time inside its work,
/// which counts a thread that waits for a core as busy; these count what ran.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CpuReport {
    /// CPU seconds of the whole process while the passes ran.
    pub process_seconds: f64,
    /// `process_seconds / wall_seconds`: cores the process kept busy on average.
    pub process_cores: f64,
    /// CPU seconds of the worker threads.
    pub workers_seconds: f64,
    /// The workers' CPU seconds over what they could have used: `wall_seconds` times
    /// `min(threads, allowance)` (16 threads on 2 cores can use 2 cores, not 16).
    pub workers_busy: f64,
    /// Worker threads at work now.
    pub threads: usize,
    /// CPUs this process may use (affinity mask and cgroup quota).
    pub allowance: usize,
    /// The share of the host's CPU time (all its CPUs, every process) that was busy while the
    /// passes ran, from `/proc/stat` (`None` where it cannot be read): near 1 while this process
    /// uses fewer cores than it may, other processes hold them.
    pub host_busy: Option<f64>,
}

impl CpuReport {
    /// Cores the workers could use: `min(threads, allowance)`, at least 1.
    pub fn usable_cores(&self) -> usize {
        self.threads.min(self.allowance).max(1)
    }

    /// Cores the workers kept busy on average: `workers_busy` of the usable cores.
    pub fn workers_cores(&self) -> f64 {
        self.workers_busy * self.usable_cores() as f64
    }
}

/// The bottleneck verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Bottleneck {
    /// The limiting stage, as the kind names it (`consumer` when the training step is the
    /// limit: the loader keeps up).
    pub stage: String,
    /// What the numbers say.
    pub reason: String,
    /// What to change.
    pub suggestion: String,
}

/// Where batches are delivered, as asked and as done.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceReport {
    /// The device asked for (`cpu`, `cuda`, `cuda:N`, `auto`).
    pub requested: String,
    /// The device batches are delivered on (`cpu` or `cuda:N`).
    pub used: String,
    /// Why `used` differs from what a reader would expect (e.g. `auto` found no GPU).
    pub note: Option<String>,
}

impl Default for DeviceReport {
    fn default() -> Self {
        DeviceReport { requested: "cpu".into(), used: "cpu".into(), note: None }
    }
}

/// Host-to-device copy totals (GPU batches only).
#[derive(Debug, Clone, serde::Serialize)]
pub struct TransferReport {
    /// Batches copied.
    pub batches: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// GPU time of the copies (CUDA events), seconds.
    pub copy_seconds: f64,
    /// `bytes / copy_seconds`, GB/s (10^9 bytes).
    pub gbps: f64,
}

/// A sample that was skipped, with its path and reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Skipped {
    /// Dataset index.
    pub index: u32,
    /// The file.
    pub path: String,
    /// Why it was skipped.
    pub reason: String,
}

impl<S> Report<S> {
    /// The stage named `name`, when the report has one.
    pub fn stage(&self, name: &str) -> Option<&StageReport> {
        self.stages.iter().find(|s| s.name == name)
    }
}

impl<S: Section> Report<S> {
    /// A short human summary with the stage table and the verdict.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let items = self.kind.items();
        s.push_str(&format!(
            "{} {items} in {:.2} s ({:.1} {items}/s); consumer starvation {:.1}% ({:.1}% after each pass's first \
             batch)\n",
            self.samples,
            self.wall_seconds,
            if self.wall_seconds > 0.0 { self.samples as f64 / self.wall_seconds } else { 0.0 },
            self.starvation * 100.0,
            self.starvation_steady * 100.0
        ));
        s.push_str(&format!(
            "{:<12} {:>7} {:>10} {:>10} {:>10} {:>6}\n",
            "stage", "threads", "items", "busy s", "wait s", "util"
        ));
        for st in &self.stages {
            s.push_str(&format!(
                "{:<12} {:>7} {:>10} {:>10.2} {:>10.2} {:>5.0}%\n",
                st.name,
                st.threads,
                st.items,
                st.busy_seconds,
                st.wait_seconds,
                st.utilization * 100.0
            ));
        }
        let c = &self.cpu;
        s.push_str(&format!(
            "cpu: process {:.1} of {} cores; workers {:.1} cores ({} busy of min({} threads, {} cores))\n",
            c.process_cores,
            c.allowance,
            c.workers_cores(),
            percent(c.workers_busy),
            c.threads,
            c.allowance
        ));
        if let Some(h) = c.host_busy {
            s.truncate(s.len() - 1);
            s.push_str(&format!("; host {} busy\n", percent(h)));
        }
        if let Some(t) = &self.transfer {
            s.push_str(&format!(
                "transfer to {}: {} batches, {:.1} MiB, {:.3} s of copies ({:.1} GB/s)\n",
                self.device.used,
                t.batches,
                t.bytes as f64 / (1 << 20) as f64,
                t.copy_seconds,
                t.gbps
            ));
        }
        s.push_str(&self.kind.text());
        if let Some(t) = &self.tuning {
            s.push_str(&tuning_text(t));
        }
        if let Some(n) = &self.device.note {
            s.push_str(&format!("device: {} (asked {}): {n}\n", self.device.used, self.device.requested));
        }
        if let Some(b) = &self.bottleneck {
            s.push_str(&format!("bottleneck: {} ({})\n  -> {}\n", b.stage, b.reason, b.suggestion));
        }
        if self.skipped_count > 0 {
            s.push_str(&format!("skipped {} bad sample(s):\n", self.skipped_count));
            for k in self.skipped.iter().take(20) {
                s.push_str(&format!("  {}: {}\n", k.path, k.reason));
            }
            if self.skipped_count > 20 {
                s.push_str(&format!("  ... and {} more\n", self.skipped_count - 20));
            }
        }
        s
    }
}

/// The verdict every kind whose consumer is measured shares first: a consumer that waited for
/// under 5% of its time is the limit (the loader keeps up), whatever its stages did.
pub fn keeps_up(starvation: f64) -> Option<Bottleneck> {
    (starvation < 0.05).then(|| Bottleneck {
        stage: "consumer".into(),
        reason: format!("the consumer waited {} of its time for data", percent(starvation)),
        suggestion: "none: stoker keeps up, the training step (GPU) is the limit".into(),
    })
}

/// `x` (a fraction) as a whole percentage, for verdicts.
pub fn percent(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

/// One change the tuner made.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Decision {
    /// Batches delivered when it was made.
    pub batch: u64,
    /// `threads`, `prefetch` or `share`.
    pub knob: String,
    /// The value before.
    pub from: usize,
    /// The value after.
    pub to: usize,
    /// Why.
    pub reason: String,
}

/// The tuning state in a report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TuningReport {
    /// Whether threads are autotuned.
    pub threads_auto: bool,
    /// Decode workers allowed to take work now.
    pub threads_active: usize,
    /// Decode workers started.
    pub threads_max: usize,
    /// Whether prefetch is autotuned.
    pub prefetch_auto: bool,
    /// Batches allowed ahead of the consumer now.
    pub prefetch_active: usize,
    /// The most batches the pool allows ahead.
    pub prefetch_max: usize,
    /// The CPU budget, cores.
    pub cpu_budget: f64,
    /// Whether this loader takes part in the host-wide registry.
    pub shared: bool,
    /// The registry file.
    pub registry: Option<String>,
    /// Cores of the host this loader may use (its share), when shared.
    pub share: Option<usize>,
    /// The host's cores, when shared.
    pub host_cores: Option<usize>,
    /// Processes in the registry (this one included), when shared.
    pub processes_sharing: Option<usize>,
    /// The smallest share this loader has had, when shared.
    pub share_min: Option<usize>,
    /// The most processes that shared the host with it at once, when shared.
    pub processes_sharing_max: Option<usize>,
    /// Whether the first epoch's tuning is over (the setting holds).
    pub converged: bool,
    /// Why sharing is off, if it is.
    pub note: Option<String>,
    /// Sharing was skipped because another process held the registry's lock past
    /// [`crate::observe::budget::LOCK_WAIT`] when this loader started (`note` says more).
    pub registry_busy: bool,
    /// Re-reads of the share that found the registry's lock held by another process and kept
    /// the last share.
    pub registry_busy_refreshes: u64,
    /// The tuner's changes, oldest first (at most 64).
    pub decisions: Vec<Decision>,
}

/// The tuning lines of [`Report::to_text`].
fn tuning_text(t: &TuningReport) -> String {
    let mode = |auto: bool| if auto { "auto" } else { "fixed" };
    let mut s = format!(
        "threads {} ({}, {} started, cpu_budget {}); prefetch {} ({}, up to {})",
        t.threads_active,
        mode(t.threads_auto),
        t.threads_max,
        t.cpu_budget,
        t.prefetch_active,
        mode(t.prefetch_auto),
        t.prefetch_max
    );
    if t.threads_auto || t.prefetch_auto {
        s.push_str(if t.converged { ", tuned" } else { ", tuning" });
    }
    s.push('\n');
    match (t.share, t.host_cores, t.processes_sharing) {
        (Some(share), Some(cores), Some(p)) => s.push_str(&format!(
            "cpu share: {share} of {cores} host cores, {p} process(es) sharing (at least {} core(s), at most {} \
             process(es) so far; {})\n",
            t.share_min.unwrap_or(share),
            t.processes_sharing_max.unwrap_or(p),
            t.registry.as_deref().unwrap_or("")
        )),
        _ => {
            if let Some(n) = &t.note {
                s.push_str(&format!("cpu share: not shared: {n}\n"));
            }
        }
    }
    for d in &t.decisions {
        s.push_str(&format!("  tune @batch {}: {} {} -> {} ({})\n", d.batch, d.knob, d.from, d.to, d.reason));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::telemetry::Telemetry;

    /// A kind's section as a test brings it.
    #[derive(serde::Serialize)]
    struct Mine {
        widgets: u64,
    }

    impl Section for Mine {
        fn items(&self) -> &'static str {
            "widgets"
        }

        fn text(&self) -> String {
            format!("{} widgets made\n", self.widgets)
        }
    }

    #[test]
    fn the_kind_s_section_is_flattened_beside_the_common_keys() {
        let tel = Telemetry::default();
        tel.add_samples(7);
        let stage = |_| vec![StageReport { name: "make".into(), threads: 2, items: 3, ..StageReport::default() }];
        let mut r = tel.report(stage, 2, Mine { widgets: 3 });
        r.bottleneck = keeps_up(r.starvation_steady);
        let v = serde_json::to_value(&r).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "bottleneck",
                "cpu",
                "device",
                "samples",
                "skipped",
                "skipped_count",
                "stages",
                "starvation",
                "starvation_steady",
                "transfer",
                "tuning",
                "wall_seconds",
                "widgets"
            ]
        );
        let names: Vec<&str> = v["stages"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["make", "buffer wait", "consumer"], "the kind's stages, then the shell's");
        assert_eq!((v["samples"].as_u64(), v["widgets"].as_u64()), (Some(7), Some(3)));
        assert_eq!(v["bottleneck"]["stage"], "consumer");
        assert_eq!(v["device"]["used"], "cpu");
        assert!(v["transfer"].is_null(), "no transfer stage off the GPU");
        let text = r.to_text();
        assert!(text.starts_with("7 widgets in "), "{text}");
        assert!(text.contains("3 widgets made\n") && text.contains("bottleneck: consumer"), "{text}");
    }

    #[test]
    fn a_gpu_device_adds_the_transfer_stage_and_its_totals() {
        let tel = Telemetry::default();
        tel.set_device(DeviceReport { requested: "cuda".into(), used: "cuda:0".into(), note: None });
        tel.add_transfer(2_000_000_000, std::time::Duration::from_secs(1));
        let r = tel.report(|_| vec![], 1, Mine { widgets: 0 });
        assert_eq!(r.stages.last().map(|s| s.name.as_str()), Some("transfer"));
        let t = r.transfer.expect("a transfer report on a GPU");
        assert_eq!((t.batches, t.bytes, t.gbps), (1, 2_000_000_000, 2.0));
    }
}
