//! What the text pipeline costs beyond its encoder, in CPU seconds (issue 49): the encoder
//! alone (`TextTokenizer::encode_into` on each document's text, held in memory) against the
//! whole `TokenLoader` with one tokenizer thread (index, reading, decompression, JSON, packing,
//! batches), on the same JSON Lines file, the two alternated.
//!
//! `cargo run --release -p stoker --example text_overhead -- DATA.jsonl[.zst] TOKENIZER.json
//! [ROUNDS] [encoder|pipeline|both|clone]`: `clone` only clones the tokenizer once a round, as
//! the pipeline mode does to hand the loader its own, so that under `valgrind --tool=callgrind`
//! the pipeline's instructions are `pipeline` minus `clone` (all threads counted), the
//! encoder's the inclusive count of `text_overhead::encoder`.

use std::io::Read;
use std::path::PathBuf;
use stoker::tokens::{TextTokenizer, TokenLoader};

/// The process's CPU time, all threads, in seconds.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec to fill; CLOCK_PROCESS_CPUTIME_ID always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Each document's text, decompressed and parsed outside any measurement.
fn texts(path: &str) -> Vec<String> {
    let mut raw = Vec::new();
    std::fs::File::open(path).expect("data").read_to_end(&mut raw).expect("read");
    if path.ends_with(".zst") {
        raw = zstd::decode_all(&raw[..]).expect("zstd");
    }
    raw.split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| stoker::tokens::docs::json_text(l, "text").expect("a JSON line").into_owned())
        .collect()
}

/// The encoder alone, on a thread of its own (fresh per-thread caches, as each pass of the
/// loader starts its threads): CPU seconds and tokens.
fn encoder(tok: &TextTokenizer, texts: &[String]) -> (f64, u64) {
    std::thread::scope(|s| s.spawn(|| encode_all(tok, texts)).join().expect("encoder thread"))
}

#[inline(never)]
fn encode_all(tok: &TextTokenizer, texts: &[String]) -> (f64, u64) {
    let mut out = Vec::new();
    let mut n = 0u64;
    let c0 = cpu_seconds();
    for t in texts {
        out.clear();
        tok.encode_into(t, &mut out).expect("encode");
        n += out.len() as u64;
    }
    (cpu_seconds() - c0, n)
}

/// The whole loader as `stoker bench --threads 1` runs it (index included): CPU seconds and
/// tokens delivered.
fn pipeline(tok: &TextTokenizer, path: &str) -> (f64, u64) {
    let args = stoker::args::from_text([
        ("seq_len", Some("2048".to_string())),
        ("batch_size", Some("256".to_string())),
        ("threads", Some("1".to_string())),
    ]);
    let (config, _) = stoker::args::token_config(args).expect("config");
    let c0 = cpu_seconds();
    let loader = TokenLoader::new(&[PathBuf::from(path)], Some(tok.clone()), config).expect("loader");
    let mut n = 0u64;
    for b in loader.iter().expect("iter") {
        let b = b.expect("batch");
        n += b.input_ids().len() as u64;
    }
    drop(loader);
    (cpu_seconds() - c0, n)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (data, tokp) = (&a[1], &a[2]);
    let rounds: usize = a.get(3).map_or(3, |r| r.parse().expect("rounds"));
    let mode = a.get(4).map_or("both", String::as_str);
    let tok = TextTokenizer::from_file(tokp.as_ref()).expect("tokenizer");
    let docs = if mode == "pipeline" || mode == "clone" { Vec::new() } else { texts(data) };
    let (mut enc, mut pipe) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        if mode == "clone" {
            drop(std::hint::black_box(tok.clone()));
            continue;
        }
        if mode != "pipeline" {
            let (s, n) = encoder(&tok, &docs);
            println!("encoder  {s:.3} CPU-s {n} tokens");
            enc.push(s);
        }
        if mode != "encoder" {
            let (s, n) = pipeline(&tok, data);
            println!("pipeline {s:.3} CPU-s {n} tokens");
            pipe.push(s);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (e, p) = (median(&mut enc), median(&mut pipe));
    println!("median: encoder {e:.3} CPU-s, pipeline {p:.3} CPU-s, overhead {:+.1}%", (p / e - 1.0) * 100.0);
}
