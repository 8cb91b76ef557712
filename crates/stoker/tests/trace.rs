//! Traces of a real loader (`trace` in [`LoaderConfig`]): the file written at the end of a
//! pass parses as the Chrome trace-event format and holds what the docs promise: read, decode
//! and ops spans with the sample's path for every delivered sample, named thread tracks, the
//! consumer's waits, batch deliveries and failures; a small ring keeps exactly the latest
//! events; the file is also written on drop and on request.

mod common;

use common::*;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use stoker::trace::TraceSpec;
use stoker::*;

fn config(trace: &Path, max_events: usize) -> LoaderConfig {
    let mut c = LoaderConfig::new(5, TransformSpec::preset("imagenet-train").unwrap());
    c.sampler.shuffle = true;
    c.sampler.seed = 11;
    c.threads = Some(2);
    c.io_threads = Some(2);
    c.trace = Some(TraceSpec { path: trace.to_path_buf(), max_events });
    c
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Thread names by tid, and the non-metadata events.
fn split(doc: &Value) -> (BTreeMap<u64, String>, Vec<Value>) {
    let all = doc["traceEvents"].as_array().expect("traceEvents is a list");
    let names = all
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    (names, all.iter().filter(|e| e["ph"] != "M").cloned().collect())
}

/// One epoch: (dataset index, batch) of every delivered sample, and the batches delivered.
fn run_epoch(l: &Loader) -> (Vec<(u32, usize)>, usize) {
    let (mut samples, mut batches) = (vec![], 0);
    for b in l.iter().unwrap() {
        let b = b.unwrap();
        samples.extend(b.indices().into_iter().map(|i| (i, b.index())));
        batches += 1;
    }
    (samples, batches)
}

fn f(e: &Value, k: &str) -> f64 {
    e[k].as_f64().unwrap_or_else(|| panic!("{k} in {e}"))
}

#[test]
fn every_delivered_sample_has_its_spans_on_named_threads() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 59);
    let class = std::fs::read_dir(&root).unwrap().flatten().next().unwrap().path();
    let bad = class.join("broken \"quoted\".jpg");
    std::fs::write(&bad, b"\xff\xd8 not a jpeg").unwrap();
    let out = d.path().join("trace.json");
    let source = Arc::new(ImageFolder::new(&root).unwrap());
    let l = Loader::new(source.clone(), config(&out, 100_000)).unwrap();
    assert_eq!(l.trace_path(), Some(out.as_path()));
    let (samples, batches) = run_epoch(&l);
    assert_eq!(samples.len(), 59, "one of 60 files is broken");
    // Written at the end of the pass, before the loader is dropped.
    let doc = read_json(&out);
    assert_eq!(doc["displayTimeUnit"], "ms");
    assert_eq!(doc["otherData"]["dropped_events"], 0);
    assert_eq!(doc["otherData"]["max_events"], 100_000);
    assert_eq!(doc["otherData"]["stoker"], env!("CARGO_PKG_VERSION"));
    let (names, events) = split(&doc);
    let thread = |e: &Value| names.get(&e["tid"].as_u64().unwrap()).cloned().unwrap_or_default();

    // Well-formed: X spans have ts, dur >= 0; instants have a scope.
    for e in &events {
        assert_eq!(e["pid"].as_u64(), Some(u64::from(std::process::id())));
        assert!(f(e, "ts") >= 0.0, "{e}");
        match e["ph"].as_str().unwrap() {
            "X" => assert!(f(e, "dur") >= 0.0, "{e}"),
            "i" => assert_eq!(e["s"], "t"),
            ph => panic!("unexpected phase {ph}"),
        }
        assert!(names.contains_key(&e["tid"].as_u64().unwrap()), "every tid is named: {e}");
    }

    // Every delivered sample: read on an I/O thread, decode then ops on one decode thread,
    // each with the sample's path and batch.
    let spans = |name: &str| -> BTreeMap<u64, &Value> {
        events.iter().filter(|e| e["name"] == name).map(|e| (e["args"]["index"].as_u64().unwrap(), e)).collect()
    };
    let (read, decode, ops) = (spans("read"), spans("decode"), spans("ops"));
    let mut decode_threads = BTreeSet::new();
    for &(i, b) in &samples {
        let path = source.describe(i as usize).display().to_string();
        for (stage, m, prefix) in
            [("read", &read, "stoker-io-"), ("decode", &decode, "stoker-decode-"), ("ops", &ops, "stoker-decode-")]
        {
            let e = m.get(&u64::from(i)).unwrap_or_else(|| panic!("no {stage} span for sample {i}"));
            assert_eq!(e["args"]["path"], path.as_str(), "{stage} of {i}");
            assert_eq!(e["args"]["batch"].as_u64(), Some(b as u64), "{stage} of {i}");
            assert!(thread(e).starts_with(prefix), "{stage} of {i} on {}", thread(e));
        }
        let (de, op) = (decode[&u64::from(i)], ops[&u64::from(i)]);
        assert_eq!(de["tid"], op["tid"]);
        assert!(f(de, "ts") + f(de, "dur") <= f(op, "ts") + 0.002, "ops follows decode: {de} {op}");
        assert!(f(read[&u64::from(i)], "ts") <= f(de, "ts"), "read before decode");
        decode_threads.insert(thread(de));
    }
    assert_eq!(read.len(), 60, "the broken file was read too");
    assert!(decode_threads.len() >= 2, "decode spans on {decode_threads:?}");

    // The failure, with its path (quotes and all) and reason.
    let failed: Vec<&Value> = events.iter().filter(|e| e["name"] == "failed").collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["args"]["path"], bad.display().to_string().as_str());
    assert!(!failed[0]["args"]["reason"].as_str().unwrap().is_empty());

    // Deliveries and the consumer's waits, one per batch, on the consumer's track.
    let delivered: Vec<&Value> = events.iter().filter(|e| e["name"] == "deliver").collect();
    assert_eq!(delivered.len(), batches);
    let order: Vec<u64> = delivered.iter().map(|e| e["args"]["batch"].as_u64().unwrap()).collect();
    assert_eq!(order, (0..batches as u64).collect::<Vec<_>>());
    assert!(delivered.iter().all(|e| e["args"]["epoch"] == 0 && thread(e).starts_with("consumer")));
    let waits: Vec<&Value> = events.iter().filter(|e| e["name"] == "wait").collect();
    assert_eq!(waits.len(), batches);
    assert!(waits.iter().all(|e| thread(e).starts_with("consumer")));
    assert_eq!(events.iter().filter(|e| e["name"] == "step").count(), batches - 1);
    let backpressure = events.iter().filter(|e| e["name"] == "wait_buffer").count();
    assert_eq!(backpressure, batches, "one buffer wait per dispatched batch");
    assert!(events.iter().filter(|e| e["name"] == "wait_buffer").all(|e| thread(e) == "stoker-dispatch"));

    // Per thread, the spans of one kind of work do not overlap (a thread does one thing at a
    // time); the file is sorted by start time.
    let mut by_thread: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        by_thread.entry(thread(e)).or_default().push((f(e, "ts"), f(e, "dur")));
    }
    for (t, spans) in &by_thread {
        for w in spans.windows(2) {
            assert!(w[0].0 <= w[1].0, "{t}: sorted by start");
            assert!(w[0].0 + w[0].1 <= w[1].0 + 0.002, "{t}: {:?} overlaps {:?}", w[0], w[1]);
        }
    }
    assert!(by_thread.keys().any(|t| t.starts_with("stoker-io-")));
}

#[test]
fn a_small_ring_keeps_exactly_the_latest_events() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 40);
    let out = d.path().join("small.json");
    let l = folder_loader(&root, config(&out, 50));
    let (samples, batches) = run_epoch(&l);
    assert_eq!((samples.len(), batches), (40, 8));
    let doc = read_json(&out);
    let (_, events) = split(&doc);
    assert_eq!(events.len(), 50);
    // Recorded: read, decode, ops per sample; a buffer wait, a consumer wait and a delivery
    // per batch, and a step between deliveries.
    let total = 40 * 3 + 8 * 3 + 7;
    assert_eq!(doc["otherData"]["dropped_events"].as_u64(), Some(total - 50));
    assert_eq!(doc["otherData"]["max_events"], 50);
    let delivered: Vec<u64> =
        events.iter().filter(|e| e["name"] == "deliver").map(|e| e["args"]["batch"].as_u64().unwrap()).collect();
    assert!(delivered.contains(&7), "the last batch's delivery is kept: {delivered:?}");
    assert!(!delivered.contains(&0), "the first batch's delivery was dropped: {delivered:?}");
    let last_wait = events.iter().find(|e| e["name"] == "wait" && e["args"]["batch"] == 7);
    assert!(last_wait.is_some(), "the last batch's wait is kept");
    // The last event recorded (the last delivery) is the latest in the file.
    let latest = events.iter().map(|e| f(e, "ts")).fold(0.0, f64::max);
    let last_deliver = events.iter().find(|e| e["name"] == "deliver" && e["args"]["batch"] == 7).unwrap();
    assert_eq!(f(last_deliver, "ts"), latest);
}

#[test]
fn the_trace_is_written_on_drop_and_on_request() {
    let d = tempfile::tempdir().unwrap();
    let root = demo_folder(d.path(), 20);
    let out = d.path().join("drop.json");
    let l = folder_loader(&root, config(&out, 1000));
    let mut it = l.iter().unwrap();
    let b = it.next().unwrap().unwrap();
    drop(b);
    drop(it);
    assert!(!out.exists(), "a pass that did not complete writes nothing yet");
    let asked = d.path().join("asked.json");
    l.write_trace(Some(&asked)).unwrap();
    let (_, events) = split(&read_json(&asked));
    assert!(events.iter().any(|e| e["name"] == "deliver" && e["args"]["batch"] == 0));
    drop(l);
    let (names, events) = split(&read_json(&out));
    assert!(events.iter().any(|e| e["name"] == "read"));
    assert!(names.values().any(|n| n == "stoker-dispatch"));
    assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 3, "data, drop.json, asked.json; no temporary file");

    // Errors name the argument.
    let e = Loader::new(Arc::new(ImageFolder::new(&root).unwrap()), config(&d.path().join("no/such/t.json"), 10))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`trace`") && e.contains("does not exist"), "{e}");
    let mut plain = config(&out, 10);
    plain.trace = None;
    let l = folder_loader(&root, plain);
    assert!(l.tracer().is_none());
    let e = l.write_trace(Some(&asked)).unwrap_err().to_string();
    assert!(e.contains("`trace`") && e.contains("tracing is off"), "{e}");
}

/// The price of one event, alone and with 4 threads recording at once (what the overhead
/// notes quote; run with `--ignored --nocapture`). The bound is loose: it catches a lock or an
/// allocation gone wrong, not a slow machine.
#[test]
#[ignore = "a measurement; run with --ignored --nocapture"]
fn cost_of_an_event() {
    use std::time::Instant;
    use stoker::trace::{Args, Tracer};
    let per_event = |threads: usize| {
        let t = Arc::new(Tracer::new(200_000, None));
        let n = 500_000u32;
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for k in 0..threads {
                let t = t.clone();
                std::thread::Builder::new()
                    .name(format!("stoker-decode-{k}"))
                    .spawn_scoped(s, move || {
                        for i in 0..n {
                            let now = Instant::now();
                            t.span("decode", "sample", now, now, Args::Sample { index: i, batch: i / 256 });
                        }
                    })
                    .unwrap();
            }
        });
        t0.elapsed().as_nanos() as f64 / f64::from(n) / threads as f64
    };
    let (one, four) = (per_event(1), per_event(4));
    let t = Tracer::new(200_000, None);
    let now = Instant::now();
    for i in 0..200_000 {
        t.span("decode", "sample", now, now, Args::Sample { index: i, batch: 0 });
    }
    let w0 = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    t.write(&dir.path().join("t.json"), &|i| format!("/data/train/n01440764/{i:08}.JPEG")).unwrap();
    let write = w0.elapsed();
    let bytes = std::fs::metadata(dir.path().join("t.json")).unwrap().len();
    println!(
        "ns per event (incl. Instant::now): 1 thread {one:.0}, 4 threads {four:.0} (wall / events); \
         writing a full ring of 200000: {write:?}, {bytes} bytes"
    );
    assert!(one < 5_000.0 && four < 50_000.0, "{one} {four}");
}
