//! `stoker bench` on language-model data: text (with `--tokenizer`), token files or a token
//! cache, tokenized and packed as `TokenLoader` does; tokens/s, CPU-seconds per million tokens,
//! padding, the seconds of each stage and which one limits the rate.

use crate::loader_opts::BenchOpts;
use crate::util::{cpu_seconds, peak_rss_bytes, progress};
use anyhow::Result;
use clap::Args;
use std::time::Instant;

/// Flags of `stoker bench` for text.
#[derive(Args, Clone, Default)]
pub struct TextOpts {
    /// A tokenizer.json: the data is text to tokenize (JSON Lines, plain text).
    #[arg(long)]
    pub tokenizer: Option<String>,
    /// Tokens per row (text, token files, token caches).
    #[arg(long, default_value = "2048")]
    pub seq_len: String,
    /// Packing: concat or best_fit.
    #[arg(long, default_value = "concat")]
    pub pack: String,
    /// The JSON key of the text.
    #[arg(long)]
    pub text_key: Option<String>,
    /// The end-of-sequence id of .bin/.npy token files.
    #[arg(long)]
    pub eos_id: Option<String>,
}

/// Whether `root` names language-model data (text, token files or a token cache) rather than
/// images.
pub fn is_text(root: &str, t: &TextOpts) -> bool {
    if t.tokenizer.is_some() {
        return true;
    }
    let p = std::path::Path::new(root);
    if p.is_dir() {
        if stoker::tokens::cache::is_cache(p) {
            return true;
        }
        // A folder of token files only: no class folders (an ImageFolder), no shards.
        let Ok(rd) = std::fs::read_dir(p) else { return false };
        let entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        if entries.iter().any(|e| e.is_dir() || e.extension().is_some_and(|x| x == "tar")) {
            return false;
        }
    }
    let cfg = stoker::tokens::TokenConfig::new(1, 1);
    !root.ends_with(".tar")
        && stoker::tokens::expand_paths(&[root.to_string()])
            .map(|ps| ps.iter().all(|p| stoker::tokens::format_of(p, &cfg).is_ok()))
            .unwrap_or(false)
}

/// Benches a token loader over `root`.
pub fn bench(root: &str, o: &BenchOpts, t: &TextOpts) -> Result<()> {
    let args = stoker::args::from_text([
        ("tokenizer", t.tokenizer.clone()),
        ("seq_len", Some(t.seq_len.clone())),
        ("batch_size", Some(o.batch_size.clone())),
        ("pack", Some(t.pack.clone())),
        ("text_key", t.text_key.clone()),
        ("eos_id", t.eos_id.clone()),
        ("threads", (o.threads != "auto").then(|| o.threads.clone())),
        ("seed", Some(o.seed.clone())),
        ("shuffle", Some((!o.no_shuffle).to_string())),
        ("memory_limit", o.memory_limit.clone()),
        ("max_failures", o.max_failures.clone()),
        ("on_bad_document", Some(o.on_error.clone())),
    ]);
    let (config, tok) = stoker::args::token_config(args)?;
    let epochs = o.epochs()?;
    let step = o.consumer_step()?;
    let tokenizer = tok.map(|p| stoker::tokens::TextTokenizer::from_file(&p)).transpose()?;
    let paths = stoker::tokens::expand_paths(&[root.to_string()])?;
    let loader = stoker::tokens::TokenLoader::new(&paths, tokenizer, config)?;
    let bar = progress(0, o.json, "{spinner} {pos} batches {per_sec}");
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let mut first = None;
    let mut digest = stoker::Digest::new();
    let (mut batches, mut rows) = (0u64, 0u64);
    for epoch in 0..epochs {
        loader.set_epoch(epoch);
        for b in loader.iter()? {
            let b = b?;
            first.get_or_insert_with(|| t0.elapsed().as_secs_f64());
            rows += b.rows() as u64;
            batches += 1;
            if !o.no_digest {
                digest.update_tokens(&b);
            }
            if !step.is_zero() {
                std::thread::sleep(step); // a simulated training step
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let (wall, cpu) = (t0.elapsed().as_secs_f64(), cpu_seconds() - cpu0);
    let stats = loader.stats().counts(loader.consumer_wait());
    let (tokens, pad, sec) = (stats.tokens, stats.padding_fraction, &stats.seconds);
    let neck = loader.stats().bottleneck(wall, loader.threads(), loader.tokenizer().is_some(), loader.consumer_wait());
    let summary = serde_json::json!({
        "data": root, "epochs": epochs, "batches": batches, "rows": rows, "tokens": tokens,
        "seconds": wall, "cpu_seconds": cpu, "tokens_per_s": tokens as f64 / wall,
        "cpu_s_per_million_tokens": cpu / (tokens.max(1) as f64) * 1e6, "first_batch_s": first,
        "padding_fraction": pad, "peak_rss_bytes": peak_rss_bytes(), "threads": loader.threads(),
        "documents": loader.documents(), "stats": stats,
        "tokenizer": loader.tokenizer().map(|t| serde_json::json!({"engine": t.engine().0, "why": t.engine().1})),
        "bottleneck": neck,
        "digest": if o.no_digest { serde_json::Value::Null } else { digest.hex().into() },
    });
    if o.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(());
    }
    println!(
        "{root}: {} documents, {epochs} epoch(s), {batches} batches of up to {} x {} tokens, {} threads",
        loader.documents(),
        loader.config().batch_size,
        loader.config().seq_len,
        loader.threads()
    );
    println!(
        "{tokens} tokens in {wall:.2} s: {:.3} M tokens/s, {:.3} CPU-s per million tokens, first batch {:.3} s, \
         padding {:.1}%, peak RSS {:.0} MiB",
        tokens as f64 / wall / 1e6,
        cpu / (tokens.max(1) as f64) * 1e6,
        first.unwrap_or(0.0),
        pad * 100.0,
        peak_rss_bytes() as f64 / (1 << 20) as f64
    );
    println!(
        "stages (seconds busy): read {:.2}, tokenize {:.2} (all threads), pack {:.2}, consumer waited {:.2}",
        sec.read, sec.tokenize, sec.pack, sec.consumer_wait
    );
    let failed = stats.failed_documents;
    if failed > 0 {
        println!("{failed} documents failed and were skipped");
    }
    if let Some(t) = loader.tokenizer() {
        let (engine, why) = t.engine();
        println!("tokenizer: {engine} ({why})");
    }
    println!("verdict: {} ({})\n  -> {}", neck.stage, neck.reason, neck.suggestion);
    if !o.no_digest {
        println!("digest {}", digest.hex());
    }
    Ok(())
}
