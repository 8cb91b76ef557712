//! stoker's encoder alone on the shared Wikipedia shards, one thread: for A/B runs of two
//! builds (`cp target/release/examples/stoker_alone /tmp/a`, change, build, compare) and for
//! callgrind (`--toggle-collect='*TextTokenizer*encode_into*'`: instructions of the encoder
//! only). Prints tokens per CPU-second of each round and a hash of the ids (equal hashes,
//! equal ids).
//!
//! `cargo build --release --example stoker_alone`, then run it with, all optional:
//! `SHARDS=AA,AB` (default AA), `ROUNDS=N` (default 3; the first is not in the median),
//! `LIMIT=N` (the first N documents), `TOK=tokenizer-gpt2.json` (a file of
//! `/work/shared/text`), `QUIET=1` (no line per round).
use std::time::Instant;
use stoker::tokens::TextTokenizer;
fn cpu() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to write; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}
fn main() {
    main2();
}
fn main2() {
    let dir = std::path::PathBuf::from("/work/shared/text");
    let shards: Vec<String> = std::env::var("SHARDS").unwrap_or("AA".into()).split(',').map(String::from).collect();
    let rounds: usize = std::env::var("ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3);
    let mut texts = vec![];
    for s in &shards {
        let raw =
            zstd::decode_all(std::fs::File::open(dir.join(format!("wiki-en-2015-{s}.jsonl.zst"))).unwrap()).unwrap();
        for line in raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            texts.push(v["text"].as_str().unwrap().to_string());
        }
    }
    if let Some(l) = std::env::var("LIMIT").ok().and_then(|l| l.parse().ok()) {
        texts.truncate(l);
    }
    let tok = std::env::var("TOK").unwrap_or("tokenizer-gpt2.json".into());
    let json = std::fs::read(dir.join(&tok)).unwrap();
    let c0 = cpu();
    let fast = TextTokenizer::from_json(&json, &dir.join(&tok)).unwrap();
    eprintln!("load {:.3} CPU-s", cpu() - c0);
    eprintln!("engine {:?}", fast.engine());
    let mut a = Vec::new();
    let mut rates = vec![];
    for r in 0..rounds {
        let (c0, w0) = (cpu(), Instant::now());
        let mut n = 0;
        let mut h = 0u64;
        for t in &texts {
            a.clear();
            fast.encode_into(t, &mut a).unwrap();
            n += a.len();
            for &x in &a {
                h = h.wrapping_mul(31).wrapping_add(x as u64);
            }
        }
        let c = cpu() - c0;
        rates.push(n as f64 / c / 1e6);
        if std::env::var("QUIET").is_err() {
            println!(
                "round {r}: {n} tokens {:.3} M tok/CPU-s wall {:.2}s hash {h:x}",
                n as f64 / c / 1e6,
                w0.elapsed().as_secs_f64()
            );
        }
    }
    let mut r = if rates.len() > 1 { rates[1..].to_vec() } else { rates.clone() };
    r.sort_by(f64::total_cmp);
    println!("median {:.2} best {:.2} M tok/CPU-s over {} rounds", r[r.len() / 2], r[r.len() - 1], r.len());
}
