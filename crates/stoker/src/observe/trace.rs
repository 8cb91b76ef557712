//! Traces of stoker's own threads in the Chrome / Perfetto trace-event format, for the question
//! the telemetry's totals cannot answer: *when* did each sample wait, on which thread, and which
//! file was slow. Open the file in <https://ui.perfetto.dev> or `chrome://tracing`.
//!
//! A [`Tracer`] keeps the last `max_events` events in a ring (older ones are dropped and
//! counted), so a trace of a week-long job stays bounded. Recording an event takes the ring's
//! mutex for a push (no allocation for sample spans: a sample's path is looked up only when the
//! file is written); a loader without a trace holds `None` and pays one branch per event site.
//!
//! Events:
//! - complete spans (`"ph":"X"`): `read` (I/O thread), `decode` or `cache` and `ops` (decode
//!   threads), with `{"index", "path", "batch"}`; `wait_buffer` (dispatcher, backpressure);
//!   `wait` and `step` (the consumer blocked in `next()`, and busy between batches); `copy` and
//!   `wait_device_buffer` (the CUDA transfer thread);
//! - instant events (`"ph":"i"`): `deliver` (a batch handed to the consumer), `failed` (a
//!   skipped sample, with its reason);
//! - metadata (`"ph":"M"`): the process name and each thread's name (`stoker-io-0`,
//!   `stoker-decode-1`, `stoker-dispatch`, `stoker-transfer`, `consumer`). Threads of the same
//!   name (a new iteration's `stoker-decode-0`) share one track.
//!
//! Timestamps are microseconds since the tracer was made (a monotonic clock).

use serde_json::Value;
use std::cell::Cell;
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// The ring size when none is given: 200 000 events (under 20 MiB in memory, ~32 MB of JSON),
/// a few minutes of a busy loader.
pub const DEFAULT_MAX_EVENTS: usize = 200_000;

/// Where a loader writes its trace and how many events it keeps.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TraceSpec {
    /// The trace file, written at the end of every completed pass and when the loader is
    /// dropped (see [`crate::image::pipeline::Loader::write_trace`]).
    pub path: PathBuf,
    /// The ring's size: the file holds the last this many events.
    pub max_events: usize,
}

impl TraceSpec {
    /// Refuses a trace file in a folder that does not exist, or a folder given as the file,
    /// when a loader is made rather than when its first pass ends.
    pub fn check(&self) -> crate::error::Result<()> {
        use crate::error::Error;
        let dir = self.path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !dir.is_dir() {
            return Err(Error::config("trace", format!("the folder of {} does not exist", self.path.display())));
        }
        if self.path.is_dir() {
            return Err(Error::config(
                "trace",
                format!("{} is a folder; give a file such as trace.json", self.path.display()),
            ));
        }
        Ok(())
    }
}

/// The arguments of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Args {
    /// None.
    None,
    /// A sample: its dataset index and batch; its path is looked up when the file is written.
    Sample {
        /// Dataset index.
        index: u32,
        /// Batch within the epoch.
        batch: u32,
    },
    /// A sample that failed, and why.
    Failure {
        /// Dataset index.
        index: u32,
        /// Batch within the epoch.
        batch: u32,
        /// The reason.
        reason: Box<str>,
    },
    /// Any other arguments, as a JSON object.
    Fields(Box<Value>),
}

impl Args {
    /// Arguments from a JSON value (an object).
    pub fn fields(v: Value) -> Self {
        Args::Fields(Box::new(v))
    }

    /// Numeric arguments by name (for crates without `serde_json`); whole numbers are written
    /// as integers, NaN as null.
    pub fn numbers(pairs: &[(&str, f64)]) -> Self {
        let obj = pairs
            .iter()
            .map(|&(k, v)| {
                let v = if v.fract() == 0.0 && v.abs() < 9.0e15 { Value::from(v as i64) } else { Value::from(v) };
                (k.to_string(), v)
            })
            .collect();
        Args::Fields(Box::new(Value::Object(obj)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Complete,
    Instant,
}

/// One recorded event.
#[derive(Debug, Clone)]
struct Event {
    phase: Phase,
    name: &'static str,
    cat: &'static str,
    /// Nanoseconds since the tracer's start.
    ts: u64,
    /// Nanoseconds (0 for instant events).
    dur: u64,
    tid: u32,
    args: Args,
}

struct Ring {
    events: VecDeque<Event>,
    max: usize,
    dropped: u64,
    /// Events ever recorded.
    total: u64,
    /// The file last written and `total` at that time (a second write of the same events to
    /// the same file is skipped).
    written: Option<(PathBuf, u64)>,
}

/// How many events a tracer holds and has dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceStats {
    /// Events in the ring.
    pub events: usize,
    /// Events dropped from the ring's front to make room.
    pub dropped: u64,
    /// The ring's size.
    pub max_events: usize,
}

/// A bounded recorder of trace events shared by a loader's threads.
pub struct Tracer {
    id: u64,
    /// The process that made it (a fork child does not write its copy over the parent's file).
    pid: u32,
    start: Instant,
    path: Option<PathBuf>,
    ring: Mutex<Ring>,
    /// Thread tracks: (key, display name); a thread's `tid` is its position + 1.
    threads: Mutex<Vec<(String, String)>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("path", &self.path).field("stats", &self.stats()).finish()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The tracer this thread last recorded into and its `tid` there.
    static TID: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

impl Tracer {
    /// A tracer keeping the last `max_events` events (at least 1), written to `path` by the
    /// loader's rule (`None`: only when asked).
    pub fn new(max_events: usize, path: Option<PathBuf>) -> Self {
        let max = max_events.max(1);
        Tracer {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            pid: std::process::id(),
            start: Instant::now(),
            path,
            ring: Mutex::new(Ring {
                events: VecDeque::with_capacity(max.min(4096)),
                max,
                dropped: 0,
                total: 0,
                written: None,
            }),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// A tracer for `spec`.
    pub fn from_spec(spec: &TraceSpec) -> Self {
        Self::new(spec.max_events, Some(spec.path.clone()))
    }

    /// The file the loader writes the trace to.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The file to write automatically (end of a pass, drop): [`Tracer::path`], except in a
    /// child process forked after the tracer was made, whose copy of the events would
    /// overwrite the parent's file.
    pub fn auto_path(&self) -> Option<&Path> {
        self.path.as_deref().filter(|_| std::process::id() == self.pid)
    }

    /// Events held and dropped.
    pub fn stats(&self) -> TraceStats {
        let r = lock(&self.ring);
        TraceStats { events: r.events.len(), dropped: r.dropped, max_events: r.max }
    }

    fn ns(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.start).as_nanos() as u64
    }

    /// The calling thread's track, registered on its first event.
    fn tid(&self) -> u32 {
        TID.with(|c| {
            let (id, tid) = c.get();
            if id == self.id {
                return tid;
            }
            let tid = self.register();
            c.set((self.id, tid));
            tid
        })
    }

    fn register(&self) -> u32 {
        let me = std::thread::current();
        // stoker's threads share a track by name across iterations; any other thread is a
        // consumer with a track of its own.
        let (key, name) = match me.name() {
            Some(n) if n.starts_with("stoker-") => (n.to_string(), n.to_string()),
            Some(n) => (format!("{:?}", me.id()), format!("consumer ({n})")),
            None => (format!("{:?}", me.id()), "consumer".to_string()),
        };
        let mut threads = lock(&self.threads);
        if let Some(i) = threads.iter().position(|(k, _)| *k == key) {
            return i as u32 + 1;
        }
        threads.push((key, name));
        threads.len() as u32
    }

    fn push(&self, ev: Event) {
        let mut r = lock(&self.ring);
        if r.events.len() >= r.max {
            r.events.pop_front();
            r.dropped += 1;
        }
        r.events.push_back(ev);
        r.total += 1;
    }

    /// Records a span from `start` to `end` on the calling thread.
    pub fn span(&self, name: &'static str, cat: &'static str, start: Instant, end: Instant, args: Args) {
        let ts = self.ns(start);
        let dur = self.ns(end).saturating_sub(ts);
        let tid = self.tid();
        self.push(Event { phase: Phase::Complete, name, cat, ts, dur, tid, args });
    }

    /// Records an instant event at `at` on the calling thread.
    pub fn instant(&self, name: &'static str, cat: &'static str, at: Instant, args: Args) {
        let ts = self.ns(at);
        let tid = self.tid();
        self.push(Event { phase: Phase::Instant, name, cat, ts, dur: 0, tid, args });
    }

    /// The trace as one JSON document (`describe` gives a sample's path from its dataset index).
    /// Events are sorted by start time; metadata (process and thread names) comes first.
    pub fn to_json(&self, describe: &dyn Fn(u32) -> String) -> Value {
        let mut out = Vec::new();
        let (events, dropped, max, _) = self.snapshot();
        self.write_json(&mut out, events, dropped, max, describe).expect("writing to memory");
        serde_json::from_slice(&out).expect("the writer writes JSON")
    }

    /// The ring's events, dropped count, size and total recorded.
    fn snapshot(&self) -> (Vec<Event>, u64, usize, u64) {
        let r = lock(&self.ring);
        (r.events.iter().cloned().collect(), r.dropped, r.max, r.total)
    }

    /// Streams the document: written by hand (a `serde_json::Value` per event took seconds for
    /// a full ring), with strings escaped by `serde_json`.
    fn write_json(
        &self,
        w: &mut dyn Write,
        mut events: Vec<Event>,
        dropped: u64,
        max: usize,
        describe: &dyn Fn(u32) -> String,
    ) -> std::io::Result<()> {
        fn text(w: &mut dyn Write, s: &str) -> std::io::Result<()> {
            serde_json::to_writer(w, s).map_err(std::io::Error::from)
        }
        let pid = std::process::id();
        write!(
            w,
            r#"{{"traceEvents":[{{"name":"process_name","ph":"M","pid":{pid},"tid":0,"args":{{"name":"stoker"}}}}"#
        )?;
        for (i, (_, name)) in lock(&self.threads).iter().enumerate() {
            let tid = i + 1;
            write!(w, ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"name\":")?;
            text(w, name)?;
            write!(w, "}}}},\n{{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"args\":{{\"sort_index\":{tid}}}}}")?;
        }
        events.sort_by_key(|e| e.ts);
        for e in events {
            w.write_all(b",\n{\"name\":")?;
            text(w, e.name)?;
            w.write_all(b",\"cat\":")?;
            text(w, e.cat)?;
            write!(w, ",\"ts\":{:.3},\"pid\":{pid},\"tid\":{}", us(e.ts), e.tid)?;
            match e.phase {
                Phase::Complete => write!(w, ",\"ph\":\"X\",\"dur\":{:.3}", us(e.dur))?,
                Phase::Instant => w.write_all(b",\"ph\":\"i\",\"s\":\"t\"")?,
            }
            w.write_all(b",\"args\":")?;
            match e.args {
                Args::None => w.write_all(b"{}")?,
                Args::Sample { index, batch } => {
                    write!(w, "{{\"index\":{index},\"batch\":{batch},\"path\":")?;
                    text(w, &describe(index))?;
                    w.write_all(b"}")?;
                }
                Args::Failure { index, batch, reason } => {
                    write!(w, "{{\"index\":{index},\"batch\":{batch},\"path\":")?;
                    text(w, &describe(index))?;
                    w.write_all(b",\"reason\":")?;
                    text(w, &reason)?;
                    w.write_all(b"}")?;
                }
                Args::Fields(v) => serde_json::to_writer(&mut *w, &v).map_err(std::io::Error::from)?,
            }
            w.write_all(b"}")?;
        }
        write!(w, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{{\"stoker\":")?;
        text(w, env!("CARGO_PKG_VERSION"))?;
        writeln!(w, ",\"dropped_events\":{dropped},\"max_events\":{max}}}}}")
    }

    /// Writes the trace to `path` atomically (a temporary file in the same folder, then a
    /// rename). Returns `false` without writing when this file already holds every event
    /// recorded so far (the end of a pass followed by the loader's drop).
    pub fn write(&self, path: &Path, describe: &dyn Fn(u32) -> String) -> std::io::Result<bool> {
        {
            let r = lock(&self.ring);
            if r.written.as_ref().is_some_and(|(p, n)| p == path && *n == r.total) {
                return Ok(false);
            }
        }
        let (events, dropped, max, total) = self.snapshot();
        let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "trace.json".into());
        name.push(format!(".tmp{}", std::process::id()));
        let tmp = path.with_file_name(name);
        let written = (|| {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
            self.write_json(&mut w, events, dropped, max, describe)?;
            // No fsync: the rename keeps readers from ever seeing half a file, and a trace is
            // not worth making the consumer wait for the disk at the end of every pass.
            w.into_inner().map_err(|e| e.into_error())?;
            std::fs::rename(&tmp, path)
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        lock(&self.ring).written = Some((path.to_path_buf(), total));
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn events(doc: &Value) -> Vec<&Value> {
        doc["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] != "M").collect()
    }

    #[test]
    fn the_ring_keeps_the_last_events() {
        let t = Tracer::new(5, None);
        let t0 = Instant::now();
        for i in 0..12u32 {
            let at = t0 + Duration::from_micros(u64::from(i) * 10);
            t.span("read", "io", at, at + Duration::from_micros(3), Args::Sample { index: i, batch: 0 });
        }
        let doc = t.to_json(&|i| format!("img{i}.jpg"));
        let ev = events(&doc);
        let kept: Vec<u64> = ev.iter().map(|e| e["args"]["index"].as_u64().unwrap()).collect();
        assert_eq!(kept, [7, 8, 9, 10, 11]);
        assert_eq!(doc["otherData"]["dropped_events"], 7);
        assert_eq!(doc["otherData"]["max_events"], 5);
        assert_eq!(ev[0]["path"], Value::Null);
        assert_eq!(ev[0]["args"]["path"], "img7.jpg");
        assert_eq!(ev[0]["ph"], "X");
        assert!((ev[0]["dur"].as_f64().unwrap() - 3.0).abs() < 1e-6);
        assert_eq!(t.stats(), TraceStats { events: 5, dropped: 7, max_events: 5 });
    }

    #[test]
    fn paths_are_escaped_and_the_file_is_written_once_per_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let t = Tracer::new(10, None);
        let now = Instant::now();
        let weird = "a \"quoted\"\\ \n\t name \u{1} é 猫.jpg";
        t.instant("failed", "sample", now, Args::Failure { index: 3, batch: 1, reason: "bad \"x\"".into() });
        assert!(t.write(&path, &|_| weird.to_string()).unwrap());
        assert!(!t.write(&path, &|_| weird.to_string()).unwrap(), "nothing new: not written again");
        let doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let ev = events(&doc);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["args"]["path"], weird);
        assert_eq!(ev[0]["args"]["reason"], "bad \"x\"");
        assert_eq!((ev[0]["ph"].as_str(), ev[0]["s"].as_str()), (Some("i"), Some("t")));
        let names: Vec<&str> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| e["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        assert!(std::fs::read_dir(dir.path()).unwrap().count() == 1, "no temporary file left");
        t.instant("deliver", "batch", now, Args::None);
        assert!(t.write(&path, &|_| String::new()).unwrap());
    }

    #[test]
    fn numeric_arguments() {
        let a = Args::numbers(&[("seq", 3.0), ("gpu_ms", 0.25), ("nan", f64::NAN)]);
        let Args::Fields(v) = a else { panic!("fields") };
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"gpu_ms":0.25,"nan":null,"seq":3}"#);
    }

    #[test]
    fn threads_get_named_tracks() {
        let t = std::sync::Arc::new(Tracer::new(100, None));
        for k in 0..2 {
            for _ in 0..2 {
                // Two iterations' threads of one name share a track.
                let t = t.clone();
                std::thread::Builder::new()
                    .name(format!("stoker-decode-{k}"))
                    .spawn(move || t.instant("x", "y", Instant::now(), Args::None))
                    .unwrap()
                    .join()
                    .unwrap();
            }
        }
        let doc = t.to_json(&|_| String::new());
        let names: Vec<(u64, &str)> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap()))
            .collect();
        assert_eq!(names, [(1, "stoker-decode-0"), (2, "stoker-decode-1")]);
        let tids: Vec<u64> = events(&doc).iter().map(|e| e["tid"].as_u64().unwrap()).collect();
        assert_eq!(tids, [1, 1, 2, 2]);
    }
}
