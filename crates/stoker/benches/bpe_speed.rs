//! The byte-level BPE fast path against the `tokenizers` crate's `encode_fast`, one thread, on
//! the shared Wikipedia corpus: first every document's ids compared (all must be identical), then
//! both timed over the whole corpus in interleaved rounds (A B A B ...), reporting M tokens per
//! CPU-second and the ratio. The corpus is not in the repository; without it the bench says so
//! and exits 0.
//!
//! Then the worst cases, fast path only: a 4 MB document that is one word (one piece, merged on
//! the heap) and a 256 MB document on one line (the corpus joined by spaces), timed, with the
//! process's peak resident memory before and after.
//!
//! `STOKER_BPE_PATTERN=cl100k` (or `o200k`) runs the same with GPT-2's vocabulary under that
//! pattern (Split + ByteLevel, as Llama 3's and GPT-4o's files write it); `deepseek` under
//! DeepSeek-V3's three Splits in sequence (matched by Oniguruma, not a hand scanner) and its
//! empty normalizer sequence.
//!
//! `STOKER_BPE_TOKENIZER=tokenizer-llama2.json` runs another file of `TEXT_DIR` (whichever
//! engine stoker picks for it, as long as it is not the 0.22 crate itself: `tokenizers` 1.0
//! for Llama 2's).
//!
//! `cargo bench -p stoker --bench bpe_speed -- [TEXT_DIR] [ROUNDS]` (defaults:
//! `/work/shared/text`, or `$STOKER_TEXT_DIR`, and 3 rounds). `TEXT_DIR` holds the
//! `wiki-en-2015-*.jsonl.zst` shards and `tokenizer-gpt2.json`.

use std::path::PathBuf;
use std::time::Instant;
use stoker::tokens::TextTokenizer;

use stoker::tokens::bpe::DEEPSEEK_V3_SPLITS as DEEPSEEK_V3;
/// cl100k's pattern (Llama 3's `tokenizer.json`).
const CL100K: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's pattern (GPT-4o's `tokenizer.json`).
const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// This process's user + system CPU seconds (`/proc/self/stat`; 10 ms ticks).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's peak resident memory in MiB (`VmHWM` in `/proc/self/status`).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let dir = args
        .first()
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("STOKER_TEXT_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/work/shared/text"));
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(3).max(1);
    let mut shards: Vec<PathBuf> =
        std::fs::read_dir(&dir).map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect()).unwrap_or_default();
    shards.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("wiki-en-2015-") && n.ends_with(".jsonl.zst"))
    });
    shards.sort();
    let tok_name = std::env::var("STOKER_BPE_TOKENIZER").unwrap_or_else(|_| "tokenizer-gpt2.json".into());
    let tok_path = dir.join(&tok_name);
    if shards.is_empty() || !tok_path.exists() {
        println!("skipped: no *.jsonl.zst shards or {tok_name} in {}", dir.display());
        return;
    }

    let mut texts: Vec<String> = vec![];
    for s in &shards {
        let raw = zstd::decode_all(std::fs::File::open(s).expect("open shard")).expect("decompress shard");
        for line in raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).expect("a JSON line");
            texts.push(v["text"].as_str().expect("a text field").to_string());
        }
    }
    let bytes: usize = texts.iter().map(String::len).sum();
    // `STOKER_BPE_PATTERN=cl100k` (or `o200k`): GPT-2's vocabulary under that Split pattern.
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&tok_path).expect("read tokenizer")).expect("tokenizer JSON");
    if let Ok(name) = std::env::var("STOKER_BPE_PATTERN") {
        let patterns: &[&str] = match name.as_str() {
            "cl100k" => &[CL100K],
            "o200k" => &[O200K],
            "deepseek" => {
                json["normalizer"] = serde_json::json!({"type": "Sequence", "normalizers": []});
                &DEEPSEEK_V3
            }
            other => panic!("STOKER_BPE_PATTERN={other}: cl100k, o200k or deepseek"),
        };
        let mut list: Vec<serde_json::Value> = patterns
            .iter()
            .map(|p| serde_json::json!({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false}))
            .collect();
        list.push(serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
        json["pre_tokenizer"] = serde_json::json!({"type": "Sequence", "pretokenizers": list});
    }
    let json = serde_json::to_vec(&json).expect("JSON");
    let fast = TextTokenizer::from_json(&json, &tok_path).expect("load tokenizer");
    let engine = fast.engine().0;
    assert_ne!(engine, "tokenizers", "{:?}", fast.engine());
    let slow = tokenizers::Tokenizer::from_bytes(&json).expect("load tokenizer");
    println!(
        "{} shards, {} documents, {:.1} MB of text; fast path: {:?}",
        shards.len(),
        texts.len(),
        bytes as f64 / 1e6,
        fast.engine()
    );

    // Identical ids, document by document (untimed).
    let (mut a, mut tokens) = (Vec::new(), 0usize);
    for (i, t) in texts.iter().enumerate() {
        a.clear();
        fast.encode_into(t, &mut a).expect("encode");
        let b = slow.encode_fast(t.as_str(), true).expect("encode");
        assert!(a == b.get_ids(), "document {i}: ids differ");
        tokens += a.len();
    }
    println!("ids identical: {} documents, {} tokens compared", texts.len(), tokens);

    let mut runs: [Vec<(f64, f64)>; 2] = [vec![], vec![]];
    for round in 0..rounds {
        for (k, name) in ["tokenizers encode_fast", engine].into_iter().enumerate() {
            let (c0, w0) = (cpu_seconds(), Instant::now());
            let mut n = 0usize;
            for t in &texts {
                if k == 0 {
                    n += slow.encode_fast(t.as_str(), true).expect("encode").get_ids().len();
                } else {
                    a.clear();
                    fast.encode_into(t, &mut a).expect("encode");
                    n += a.len();
                }
            }
            let (cpu, wall) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
            assert_eq!(n, tokens);
            println!(
                "round {round} {name:>24}: {wall:6.2} s wall, {cpu:6.2} CPU-s, {:5.2} M tokens/CPU-s, {:6.2} MB/CPU-s",
                n as f64 / cpu / 1e6,
                bytes as f64 / cpu / 1e6
            );
            runs[k].push((cpu, wall));
        }
    }
    let med = |k: usize| median(runs[k].iter().map(|r| r.0).collect());
    let ratios = median(runs[0].iter().zip(&runs[1]).map(|(s, f)| s.0 / f.0).collect());
    println!(
        "median: tokenizers {:.3} M tokens/CPU-s, {engine} {:.3} M tokens/CPU-s; paired ratio {:.2}x",
        tokens as f64 / med(0) / 1e6,
        tokens as f64 / med(1) / 1e6,
        ratios
    );

    // Worst cases, fast path only.
    let mut x: u32 = 7;
    let word: String = (0..4 << 20)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (b'a' + ((x >> 16) % 26) as u8) as char
        })
        .collect();
    let (c0, w0) = (cpu_seconds(), Instant::now());
    a.clear();
    fast.encode_into(&word, &mut a).expect("encode");
    println!(
        "4 MB one-word document: {} tokens in {:.2} s wall, {:.2} CPU-s",
        a.len(),
        w0.elapsed().as_secs_f64(),
        cpu_seconds() - c0
    );
    drop(word);
    let mut line = String::with_capacity(256 << 20);
    'fill: loop {
        for t in &texts {
            if line.len() >= 256 << 20 {
                break 'fill;
            }
            line.extend(t.chars().map(|c| if c == '\n' { ' ' } else { c }));
            line.push(' ');
        }
    }
    let before = peak_rss_mib();
    let (c0, w0) = (cpu_seconds(), Instant::now());
    let mut ids = Vec::new();
    fast.encode_into(&line, &mut ids).expect("encode");
    println!(
        "{:.0} MB one-line document: {} tokens in {:.2} s wall, {:.2} CPU-s; peak RSS {:.0} MiB before, {:.0} MiB after \
         (ids: {:.0} MiB)",
        line.len() as f64 / 1e6,
        ids.len(),
        w0.elapsed().as_secs_f64(),
        cpu_seconds() - c0,
        before,
        peak_rss_mib(),
        (ids.capacity() * 4) as f64 / (1 << 20) as f64
    );
}
