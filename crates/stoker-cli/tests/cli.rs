//! The `stoker` command as users run it: `pack` then `bench` on the folder it wrote, and
//! argument errors that name their flag once.

use std::path::Path;
use std::process::Command;

fn stoker() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoker"))
}

fn bench_json(root: &Path, extra: &[&str]) -> serde_json::Value {
    let out = stoker()
        .arg("bench")
        .arg(root)
        .args(["--json", "--batch-size", "16", "--no-shuffle", "--threads", "2"])
        .args(if extra.contains(&"--preset") { &[][..] } else { &["--preset", "imagenet-val"][..] })
        .args(extra)
        .output()
        .expect("run stoker");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("bench --json prints JSON")
}

#[test]
fn a_pack_folder_is_a_dataset() {
    let d = tempfile::tempdir().unwrap();
    let (data, shards) = (d.path().join("data"), d.path().join("shards"));
    let st = stoker().args(["demo", "--images", "80", "--no-bench", "--out"]).arg(&data).status().unwrap();
    assert!(st.success());
    std::fs::remove_file(data.join("LICENSE.md")).unwrap();
    let out = stoker().arg("pack").arg(&data).arg(&shards).args(["--shard-size", "1MiB", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let packed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(packed["shards"].as_array().unwrap().len() >= 2, "{packed}");
    let folder = bench_json(&data, &[]);
    let pack = bench_json(&shards, &[]);
    assert_eq!(pack["images"], 80);
    assert_eq!(pack["classes"], folder["classes"]);
    // The same samples in the same order through the same ops: the same bytes.
    assert_eq!(pack["digest"], folder["digest"], "pack folder and ImageFolder differ");
    // `export` takes the pack folder too.
    let npy = d.path().join("x.npy");
    let st = stoker().arg("export").arg(&shards).arg("--out").arg(&npy).args(["--limit", "5"]).status().unwrap();
    assert!(st.success() && npy.exists());

    // Re-packing the shards with restart markers: the same keys and labels, the same train
    // batches (whose crops are now decoded from their restart intervals), never into itself.
    let ra = d.path().join("ra");
    let out = stoker().arg("pack").arg(&shards).arg(&ra).args(["--random-access", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let repacked: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(repacked["samples"], 80);
    assert_eq!(repacked["random_access"]["recoded"], 80, "{repacked}");
    let train = ["--preset", "imagenet-train", "--seed", "5"];
    assert_eq!(bench_json(&ra, &train)["digest"], bench_json(&shards, &train)["digest"]);
    assert_eq!(bench_json(&ra, &[])["digest"], folder["digest"]);
    let out = stoker().arg("pack").arg(&shards).arg(&shards).args(["--random-access", "--overwrite"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("pack into another one"));
    assert_eq!(bench_json(&shards, &[])["digest"], folder["digest"], "the shards are untouched");
}

#[test]
fn argument_errors_name_the_flag_once() {
    let d = tempfile::tempdir().unwrap();
    for (args, want) in [
        (vec!["--batch-size", "0"], "error: --batch-size: must be at least 1, got 0"),
        (vec!["--memory-limit", "12parsecs"], "error: --memory-limit: unknown unit"),
        (vec!["--threads", "x"], "error: --threads: expected a positive integer or 'auto'"),
        (vec!["--device", "gpu"], "error: --device: expected 'cpu', 'cuda', 'cuda:N' or 'auto'"),
        (vec!["--epochs", "0"], "error: --epochs: must be at least 1"),
    ] {
        let out = stoker().arg("bench").arg(d.path()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(err.starts_with(want), "{args:?}: {err}");
        let flag = args[0];
        assert_eq!(err.matches(flag).count(), 1, "{err}");
    }
    let out = stoker().arg("bench").arg(d.path().join("missing")).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such file or folder"));
}

#[test]
fn bench_trace_writes_a_perfetto_trace() {
    let d = tempfile::tempdir().unwrap();
    let data = d.path().join("data");
    let st = stoker().args(["demo", "--images", "40", "--no-bench", "--out"]).arg(&data).status().unwrap();
    assert!(st.success());
    std::fs::remove_file(data.join("LICENSE.md")).unwrap();
    let trace = d.path().join("out.json");
    let run = bench_json(&data, &["--epochs", "2", "--trace", trace.to_str().unwrap()]);
    assert_eq!(run["trace"], trace.to_str().unwrap());
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let named = |n: &'static str| events.iter().filter(move |e| e["name"] == n);
    // 40 images, batches of 16 without the last partial one: 32 samples and 2 batches an epoch.
    assert_eq!(named("read").count(), 64);
    assert_eq!(named("decode").count(), 64);
    assert_eq!(named("ops").count(), 64);
    let delivered: Vec<(u64, u64)> = named("deliver")
        .map(|e| (e["args"]["epoch"].as_u64().unwrap(), e["args"]["batch"].as_u64().unwrap()))
        .collect();
    assert_eq!(delivered, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    assert_eq!(named("wait").count(), 4);
    let threads: Vec<&str> = named("thread_name").map(|e| e["args"]["name"].as_str().unwrap()).collect();
    for t in ["stoker-dispatch", "stoker-io-0", "stoker-decode-0", "consumer (main)"] {
        assert!(threads.contains(&t), "{t} in {threads:?}");
    }
    assert_eq!(doc["otherData"]["max_events"], 200_000);
    assert!(named("read").all(|e| e["args"]["path"].as_str().unwrap().starts_with(data.to_str().unwrap())));
    // A bad ring size names its flag.
    let out = stoker().arg("bench").arg(&data).args(["--trace", "t.json", "--trace-events", "0"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.starts_with("error: --trace-events: must be at least 1"), "{err}");
}

/// `stoker tokenize` then `stoker bench` on the cache it wrote, against `bench` on the text.
#[test]
fn tokenize_then_bench_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let text_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text");
    let (sample, gpt2) = (text_dir.join("wiki-sample.jsonl.zst"), text_dir.join("tokenizer-gpt2.json"));
    let cache = d.path().join("cache");
    let out = stoker().arg("tokenize").arg(&sample).arg("--tokenizer").arg(&gpt2).arg(&cache).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("60 documents (0 failed"), "{out:?}");
    let bench = |args: &[&std::ffi::OsStr]| -> serde_json::Value {
        let out = stoker()
            .arg("bench")
            .args(args)
            .args(["--json", "--batch-size", "4", "--seq-len", "512", "--threads", "2"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let text = bench(&[sample.as_os_str(), "--tokenizer".as_ref(), gpt2.as_os_str()]);
    let cached = bench(&[cache.as_os_str()]);
    assert_eq!(text["documents"], 60);
    assert_eq!(text["tokens"], cached["tokens"]);
    assert!(text["tokens"].as_u64().unwrap() > 300_000);
    assert!(text["bottleneck"]["suggestion"].as_str().unwrap().len() > 10);
    assert!(text["bottleneck"]["reason"].as_str().unwrap().contains("the consumer waited"));
    assert_eq!(text["tokenizer"]["engine"], "stoker byte-level BPE", "{}", text["tokenizer"]);
    assert!(cached["tokenizer"].is_null(), "a token cache is read without a tokenizer");
    // The digest of the text's batches: 32 hex digits, the same on a second run.
    let digest = text["digest"].as_str().unwrap();
    assert!(digest.len() == 32 && digest.bytes().all(|b| b.is_ascii_hexdigit()), "{digest}");
    assert_eq!(bench(&[sample.as_os_str(), "--tokenizer".as_ref(), gpt2.as_os_str()])["digest"], digest);
    // A folder that is not empty is refused, and the message says so.
    let out = stoker().arg("tokenize").arg(&sample).arg("--tokenizer").arg(&gpt2).arg(&cache).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("not empty"), "{err}");
}
