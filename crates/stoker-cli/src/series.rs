//! What `stoker bench --report` records while it runs, and the page it becomes.
//!
//! A [`Recorder`] takes a sample when a batch is delivered (at most one per [`MIN_GAP`]):
//! images delivered so far, process CPU seconds (`getrusage`), resident memory
//! (`/proc/self/statm`) and the consumer's time spent waiting inside `next()` ([`timed`]
//! wraps the batch iterator to measure it). Rates are taken over a sliding [`WINDOW`], so a
//! chart shows what the run did at that moment rather than its average so far. [`page`] turns
//! the samples, the loader's [`Report`] and the run's facts into an [`HtmlReport`].

use crate::html::{Chart, HtmlReport, HtmlVerdict, Series, Table};
use crate::util::cpu_seconds;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stoker::pipeline::ImageReport as Report;

/// Shortest time between two samples (a run of tiny batches is not slowed by sampling).
pub(crate) const MIN_GAP: Duration = Duration::from_millis(10);
/// Rates (images/s, CPU cores, wait fraction) are averaged over this many seconds.
pub(crate) const WINDOW: f64 = 1.0;

/// Palette indices of the bench charts' lines: each a different colour, so that each line can be
/// told apart in a screenshot (the browser test counts their pixels).
pub(crate) const COLOR_THROUGHPUT: usize = 0;
/// CPU cores used.
pub(crate) const COLOR_CPU: usize = 1;
/// Resident memory.
pub(crate) const COLOR_RSS: usize = 2;
/// The batch-buffer pool's size.
pub(crate) const COLOR_POOL: usize = 4;
/// Consumer waiting.
pub(crate) const COLOR_WAIT: usize = 3;

/// One sample: totals since the recorder started.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    /// Seconds since the start.
    t: f64,
    /// Images delivered.
    images: u64,
    /// Process CPU seconds (user + system).
    cpu: f64,
    /// Resident set, bytes (`None` where /proc is not readable).
    rss: Option<u64>,
    /// Seconds the consumer waited inside `next()`.
    wait: f64,
}

/// Samples of a running bench.
#[derive(Debug)]
pub(crate) struct Recorder {
    t0: Instant,
    cpu0: f64,
    last: Instant,
    images: u64,
    wait: f64,
    samples: Vec<Sample>,
    markers: Vec<(f64, String)>,
}

/// This process's resident set in bytes, from `/proc/self/statm` (Linux).
pub(crate) fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = s.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions; _SC_PAGESIZE is always a valid name.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|p| *p > 0)?)
}

impl Recorder {
    /// Starts the clock with a first sample at time 0.
    pub fn start() -> Self {
        let now = Instant::now();
        let mut r = Recorder {
            t0: now,
            cpu0: cpu_seconds(),
            last: now,
            images: 0,
            wait: 0.0,
            samples: vec![],
            markers: vec![],
        };
        r.sample(now);
        r
    }

    fn sample(&mut self, now: Instant) {
        self.last = now;
        self.samples.push(Sample {
            t: (now - self.t0).as_secs_f64(),
            images: self.images,
            cpu: cpu_seconds() - self.cpu0,
            rss: rss_bytes(),
            wait: self.wait,
        });
    }

    /// Counts a delivered batch of `images` that the consumer waited `waited` for; samples
    /// when [`MIN_GAP`] has passed since the last sample.
    pub fn delivered(&mut self, images: usize, waited: Duration) {
        self.images += images as u64;
        self.wait += waited.as_secs_f64();
        let now = Instant::now();
        if now - self.last >= MIN_GAP {
            self.sample(now);
        }
    }

    /// Marks this moment in every chart (`label`: what starts, e.g. `epoch 2`).
    pub fn mark(&mut self, label: impl Into<String>) {
        self.markers.push(((Instant::now() - self.t0).as_secs_f64(), label.into()));
    }

    /// Takes the last sample (at the end of the run).
    pub fn finish(&mut self) {
        let now = Instant::now();
        if self.samples.last().is_none_or(|s| s.images != self.images || now - self.last >= MIN_GAP) {
            self.sample(now);
        }
    }

    /// `(t, per-second rate of f)` for every sample after the first, over the sliding
    /// [`WINDOW`] (or since the start, early on).
    fn rates(&self, f: impl Fn(&Sample) -> f64) -> Vec<(f64, f64)> {
        let s = &self.samples;
        let mut out = Vec::with_capacity(s.len());
        let mut j = 0;
        for i in 1..s.len() {
            while j + 1 < i && s[j + 1].t <= s[i].t - WINDOW {
                j += 1;
            }
            let dt = s[i].t - s[j].t;
            if dt > 0.0 {
                out.push((s[i].t, (f(&s[i]) - f(&s[j])) / dt));
            }
        }
        out
    }

    /// Images delivered per second.
    pub fn throughput(&self) -> Vec<(f64, f64)> {
        self.rates(|s| s.images as f64)
    }

    /// CPU cores in use (CPU seconds per second).
    pub fn cpu_cores(&self) -> Vec<(f64, f64)> {
        self.rates(|s| s.cpu)
    }

    /// Percentage of the time the consumer waited for a batch.
    pub fn wait_percent(&self) -> Vec<(f64, f64)> {
        self.rates(|s| s.wait).into_iter().map(|(t, w)| (t, (w * 100.0).clamp(0.0, 100.0))).collect()
    }

    /// Resident memory in MiB.
    pub fn rss_mib(&self) -> Vec<(f64, f64)> {
        self.samples.iter().filter_map(|s| Some((s.t, s.rss? as f64 / MIB))).collect()
    }

    /// Seconds from the first to the last sample.
    pub fn span(&self) -> f64 {
        self.samples.last().map_or(0.0, |s| s.t)
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// An iterator that tells a [`Recorder`] how long each `next()` took and how many images it
/// delivered.
pub(crate) struct Timed<'a, I, F> {
    inner: I,
    rec: Option<&'a mut Recorder>,
    count: F,
}

/// Wraps `inner` so that every delivered item is counted (`count` gives its images) in `rec`,
/// with the time `next()` waited for it; with `rec` `None` it only forwards the items.
pub(crate) fn timed<I, F>(rec: Option<&mut Recorder>, inner: I, count: F) -> Timed<'_, I, F>
where
    I: Iterator,
    F: Fn(&I::Item) -> usize,
{
    Timed { inner, rec, count }
}

impl<I: Iterator, F: Fn(&I::Item) -> usize> Iterator for Timed<'_, I, F> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let Some(rec) = self.rec.as_mut() else {
            return self.inner.next();
        };
        let t = Instant::now();
        let item = self.inner.next();
        if let Some(i) = &item {
            rec.delivered((self.count)(i), t.elapsed());
        }
        item
    }
}

/// The report's file, created before the run so that a bad path fails at once; removed again
/// when the run fails before [`ReportFile::write`] (no empty report is left behind).
pub(crate) struct ReportFile {
    path: PathBuf,
    flag: &'static str,
    file: Option<std::fs::File>,
}

impl ReportFile {
    /// Creates (or truncates) `path`, given by `flag` (`--report`, `--out`); errors name the
    /// flag and the path.
    pub fn create(path: &Path, flag: &'static str) -> Result<Self> {
        let file = std::fs::File::create(path).with_context(|| format!("{flag}: cannot create {}", path.display()))?;
        Ok(ReportFile { path: path.to_path_buf(), flag, file: Some(file) })
    }

    /// Writes the page and keeps the file.
    pub fn write(mut self, html: &str) -> Result<()> {
        let mut file = self.file.take().expect("written once");
        file.write_all(html.as_bytes())
            .and_then(|()| file.flush())
            .with_context(|| format!("{}: cannot write {}", self.flag, self.path.display()))
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The run's totals that the page shows besides the loader's report.
pub(crate) struct Facts<'a> {
    /// The dataset argument.
    pub root: &'a str,
    /// Samples in the dataset.
    pub samples: usize,
    /// Classes in the dataset.
    pub classes: usize,
    /// Images delivered.
    pub images: usize,
    /// Batches delivered.
    pub batches: usize,
    /// Passes.
    pub epochs: u64,
    /// Samples per batch.
    pub batch_size: usize,
    /// Wall seconds of the run.
    pub seconds: f64,
    /// CPU seconds of the run.
    pub cpu_seconds: f64,
    /// Peak resident set, bytes.
    pub peak_rss: u64,
    /// Decode threads.
    pub threads: usize,
    /// I/O threads.
    pub io_threads: usize,
    /// CPUs this process may use.
    pub allowance: usize,
    /// Bytes of the batch-buffer pool.
    pub pool_bytes: u64,
    /// Batch buffers in the pool.
    pub pool_slots: usize,
}

/// The page of a bench run: facts, verdicts, charts over time, the stage table, the settings.
/// `settings` is the table of what the run used and what was asked (the bench command builds
/// it: this file does not know the command's options).
pub(crate) fn page(f: &Facts, settings: Table, report: &Report, rec: &Recorder) -> HtmlReport {
    let ips = if f.seconds > 0.0 { f.images as f64 / f.seconds } else { 0.0 };
    let per1000 = if f.images > 0 { f.cpu_seconds / f.images as f64 * 1000.0 } else { 0.0 };
    let mut meta = vec![
        ("images/s".to_string(), format!("{ips:.1}")),
        ("images".into(), format!("{} in {} batches, {} epoch(s)", f.images, f.batches, f.epochs)),
        ("wall time".into(), format!("{:.2} s", f.seconds)),
        ("CPU".into(), format!("{:.2} CPU-s per 1000 images ({:.2} CPU-s)", per1000, f.cpu_seconds)),
        ("peak RSS".into(), format!("{:.1} MiB", f.peak_rss as f64 / MIB)),
        ("consumer starvation".into(), format!("{:.1}%", report.starvation * 100.0)),
        ("threads".into(), format!("{} decode + {} I/O (allowance {})", f.threads, f.io_threads, f.allowance)),
        ("device".into(), report.device.used.clone()),
    ];
    if let Some(t) = &report.transfer {
        meta.push((
            "host-to-device".into(),
            format!("{:.1} MiB in {} copies, {:.1} GB/s", t.bytes as f64 / MIB, t.batches, t.gbps),
        ));
    }
    if let Some(c) = &report.kind.cache {
        meta.push((
            "cache".into(),
            format!(
                "{} hits, {} misses, {:.2} s of decoding saved",
                c.group.hits, c.group.misses, c.decode_seconds_saved
            ),
        ));
    }
    let mut verdicts: Vec<HtmlVerdict> = report
        .bottleneck
        .iter()
        .map(|b| HtmlVerdict {
            severity: if b.stage == "consumer" {
                "ok"
            } else if report.starvation >= 0.5 {
                "problem"
            } else {
                "warning"
            }
            .into(),
            title: format!("bottleneck: {}", b.stage),
            evidence: format!("{}; the consumer waited {:.1}% of its time", b.reason, report.starvation * 100.0),
            fix: b.suggestion.clone(),
        })
        .collect();
    verdicts.push(if report.skipped_count == 0 {
        HtmlVerdict {
            severity: "ok".into(),
            title: "no samples skipped".into(),
            evidence: format!("all {} images decoded", f.images),
            fix: String::new(),
        }
    } else {
        let listed: Vec<String> = report.skipped.iter().take(5).map(|s| format!("{}: {}", s.path, s.reason)).collect();
        let more = report.skipped_count.saturating_sub(listed.len() as u64);
        HtmlVerdict {
            severity: if report.skipped_count as f64 > 0.01 * f.images.max(1) as f64 { "problem" } else { "warning" }
                .into(),
            title: format!("{} sample(s) skipped", report.skipped_count),
            evidence: format!(
                "{}{}",
                listed.join("; "),
                if more > 0 { format!("; and {more} more (listed by --json)") } else { String::new() }
            ),
            fix: "repair or remove these files, or run with --on-error raise to stop at the first".into(),
        }
    });
    if let Some(n) = &report.device.note {
        verdicts.push(HtmlVerdict {
            severity: "warning".into(),
            title: format!("device: {} (asked {})", report.device.used, report.device.requested),
            evidence: n.clone(),
            fix: String::new(),
        });
    }
    let span = rec.span();
    let pool = f.pool_bytes as f64 / MIB;
    let charts = vec![
        Chart {
            title: "Throughput".into(),
            unit: "images/s".into(),
            y_max: None,
            series: vec![
                Series::new(format!("delivered ({WINDOW:.0} s window)"), rec.throughput()).color(COLOR_THROUGHPUT)
            ],
            markers: rec.markers.clone(),
        },
        Chart {
            title: "CPU".into(),
            unit: "cores".into(),
            y_max: Some(f.allowance as f64),
            series: vec![Series::new("stoker process", rec.cpu_cores()).color(COLOR_CPU)],
            markers: rec.markers.clone(),
        },
        Chart {
            title: "Memory".into(),
            unit: "MiB".into(),
            y_max: None,
            series: vec![
                Series::new("resident (RSS)", rec.rss_mib()).color(COLOR_RSS),
                Series::new(format!("batch buffers ({} slots)", f.pool_slots), vec![(0.0, pool), (span, pool)])
                    .color(COLOR_POOL),
            ],
            markers: rec.markers.clone(),
        },
        Chart {
            title: "Consumer waiting for data".into(),
            unit: "%".into(),
            y_max: Some(100.0),
            series: vec![Series::new("time in next()", rec.wait_percent()).color(COLOR_WAIT)],
            markers: rec.markers.clone(),
        },
    ];
    let stages = Table {
        title: "Stages".into(),
        header: ["stage", "threads", "items", "busy s", "wait s", "utilisation"].map(String::from).to_vec(),
        rows: report
            .stages
            .iter()
            .map(|s| {
                vec![
                    s.name.clone(),
                    s.threads.to_string(),
                    s.items.to_string(),
                    format!("{:.2}", s.busy_seconds),
                    format!("{:.2}", s.wait_seconds),
                    format!("{:.0}%", s.utilization * 100.0),
                ]
            })
            .collect(),
    };
    HtmlReport {
        title: format!("stoker bench: {ips:.0} images/s"),
        subtitle: std::env::args().collect::<Vec<_>>().join(" "),
        meta,
        verdicts,
        charts,
        tables: vec![stages, settings],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(samples: Vec<Sample>) -> Recorder {
        let now = Instant::now();
        Recorder { t0: now, cpu0: 0.0, last: now, images: 0, wait: 0.0, samples, markers: vec![] }
    }

    fn s(t: f64, images: u64, cpu: f64, wait: f64) -> Sample {
        Sample { t, images, cpu, rss: Some(1 << 20), wait }
    }

    #[test]
    fn rates_are_taken_over_the_sliding_window() {
        // 100 images/s for 2 s, then 300 images/s; 2 cores; waiting a quarter of the time.
        let mut v = vec![];
        let mut images = 0;
        for k in 0..=40 {
            let t = k as f64 * 0.1;
            v.push(s(t, images, 2.0 * t, 0.25 * t));
            images += if t < 2.0 { 10 } else { 30 };
        }
        let r = rec(v);
        let tp = r.throughput();
        assert_eq!(tp.len(), 40);
        assert!((tp[5].1 - 100.0).abs() < 1e-6, "{:?}", tp[5]);
        assert!((tp[39].1 - 300.0).abs() < 1e-6, "{:?}", tp[39]);
        assert!(r.cpu_cores().iter().all(|(_, c)| (c - 2.0).abs() < 1e-9));
        assert!(r.wait_percent().iter().all(|(_, w)| (w - 25.0).abs() < 1e-9));
        assert_eq!(r.rss_mib()[0], (0.0, 1.0));
        assert!((r.span() - 4.0).abs() < 1e-9);
    }

    #[test]
    fn timed_counts_images_and_waits() {
        let mut r = Recorder::start();
        let items = timed(Some(&mut r), [3usize, 4, 5].into_iter(), |n| *n).collect::<Vec<_>>();
        assert_eq!(items, vec![3, 4, 5]);
        std::thread::sleep(MIN_GAP);
        r.finish();
        assert_eq!(r.samples.last().unwrap().images, 12);
        assert!(r.samples.len() >= 2);
        // Without a recorder it only forwards.
        assert_eq!(timed(None, [1usize].into_iter(), |_| 0).count(), 1);
    }

    #[test]
    fn a_report_file_is_removed_unless_written() {
        let d = tempfile::tempdir().unwrap();
        let (kept, dropped) = (d.path().join("kept.html"), d.path().join("dropped.html"));
        ReportFile::create(&kept, "--report").unwrap().write("<p>x</p>").unwrap();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "<p>x</p>");
        drop(ReportFile::create(&dropped, "--out").unwrap());
        assert!(!dropped.exists(), "a failed run left its empty report behind");
        let bad = d.path().join("missing").join("r.html");
        let e = format!("{:#}", ReportFile::create(&bad, "--report").err().unwrap());
        assert!(e.starts_with(&format!("--report: cannot create {}", bad.display())), "{e}");
    }

    #[test]
    fn rss_is_read_from_proc() {
        let rss = rss_bytes().expect("/proc/self/statm");
        assert!(rss > 1 << 20 && rss < 1 << 40, "{rss}");
    }
}
