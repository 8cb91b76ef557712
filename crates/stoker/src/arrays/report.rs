//! The array kind's part of its report: the counters its threads record ([`ArrayCounters`]:
//! the row copies, batches and bytes), the report's [`ArraySection`] and the array verdict.

use crate::observe::report::{keeps_up, percent, Bottleneck, Report, Section, StageReport};
use crate::observe::telemetry::StageCounters;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The report of an array loader.
pub type ArrayReport = Report<ArraySection>;

/// The counters of the array stages, recorded by the loader's threads.
#[derive(Debug, Default)]
pub struct ArrayCounters {
    /// Copying rows into batch buffers: items = tasks (a run of a batch's rows), busy = their
    /// copy time.
    pub copy: StageCounters,
    batches: AtomicU64,
    bytes: AtomicU64,
}

impl ArrayCounters {
    /// Counts one copy task of `bytes` that took `busy`.
    pub fn copied(&self, bytes: usize, busy: Duration) {
        self.copy.record(busy);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a batch handed to the consumer.
    pub fn delivered(&self) {
        self.batches.fetch_add(1, Ordering::Relaxed);
    }

    /// The array stage over `wall` seconds: `copy` on `threads`.
    pub fn stages(&self, wall: f64, threads: usize) -> Vec<StageReport> {
        vec![self.copy.snapshot("copy", threads, wall)]
    }

    /// The section, for a loader of `columns` arrays.
    pub fn section(&self, columns: usize, mixture: Option<crate::shell::mix::MixReport>) -> ArraySection {
        ArraySection {
            batches: self.batches.load(Ordering::Relaxed),
            columns,
            bytes_copied: self.bytes.load(Ordering::Relaxed),
            mixture,
        }
    }
}

/// The array kind's section of its report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ArraySection {
    /// Batches delivered.
    pub batches: u64,
    /// Arrays (columns) per batch.
    pub columns: usize,
    /// Bytes of rows copied into batch buffers (every column).
    pub bytes_copied: u64,
    /// Each source's rows against its share, when the rows are a mixture's.
    pub mixture: Option<crate::shell::mix::MixReport>,
}

impl Section for ArraySection {
    fn items(&self) -> &'static str {
        "rows"
    }

    fn text(&self) -> String {
        let mut s = format!(
            "{} batches of {} array(s), {:.1} MiB of rows copied\n",
            self.batches,
            self.columns,
            self.bytes_copied as f64 / (1 << 20) as f64
        );
        if let Some(m) = &self.mixture {
            s.push_str(&m.text("rows"));
        }
        s
    }
}

/// The array verdict over a report: the consumer (the loader keeps up), the bus, the buffers
/// or the row copies.
pub fn verdict(r: &ArrayReport) -> Bottleneck {
    if let Some(b) = keeps_up(r.starvation_steady) {
        return b;
    }
    let copy = r.stage("copy").cloned().unwrap_or_default();
    if let Some(t) = r.stage("transfer").filter(|t| t.utilization > 0.7) {
        return Bottleneck {
            stage: "transfer".into(),
            reason: format!(
                "bus-bound: host-to-device copies keep the bus {} busy while copy threads are {} busy",
                percent(t.utilization),
                percent(copy.utilization)
            ),
            suggestion: "send smaller dtypes over the bus, or check the PCIe link with `stoker doctor`".into(),
        };
    }
    let buffers = r.stage("buffer wait").cloned().unwrap_or_default();
    if copy.utilization < 0.5 && buffers.wait_seconds > 0.25 * copy.busy_seconds.max(1e-9) {
        return Bottleneck {
            stage: "buffers".into(),
            reason: "the gatherer often waits for a free batch buffer while copy threads idle".into(),
            suggestion: "raise prefetch or memory_limit, or release batches sooner".into(),
        };
    }
    Bottleneck {
        stage: "copy".into(),
        reason: format!(
            "copy-bound: {} copy threads are {} busy gathering rows",
            copy.threads,
            percent(copy.utilization)
        ),
        suggestion: "raise threads, or keep the arrays in memory rather than in .npy files read per batch".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::telemetry::Telemetry;

    #[test]
    fn the_section_counts_batches_and_the_verdict_reads_the_stages() {
        let c = ArrayCounters::default();
        c.copied(4096, Duration::from_millis(10));
        c.copied(1024, Duration::from_millis(10));
        c.delivered();
        let tel = Telemetry::default();
        let r = tel.report(|wall| c.stages(wall, 2), 2, c.section(3, None));
        assert_eq!(r.kind, ArraySection { batches: 1, columns: 3, bytes_copied: 5120, mixture: None });
        assert_eq!(r.stages[0].items, 2);
        // Nothing consumed: the consumer did not wait, the loader keeps up.
        assert_eq!(verdict(&r).stage, "consumer");
        let mut slow = r.clone();
        (slow.starvation, slow.starvation_steady) = (0.9, 0.9);
        slow.stages[0].utilization = 0.95;
        assert_eq!(verdict(&slow).stage, "copy");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["batches"], 1, "the section is flattened into the report: {v}");
        assert_eq!(v["bytes_copied"], 5120);
        assert!(v["stages"].is_array() && v["bottleneck"].is_null());
    }
}
