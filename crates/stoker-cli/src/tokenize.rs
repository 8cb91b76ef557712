//! `stoker tokenize DATA... --tokenizer T OUT`: tokenize a corpus once, on all cores with
//! bounded memory, into a token cache folder that `TokenLoader` reads instead of the text.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

/// Flags of `stoker tokenize`.
#[derive(Args)]
pub struct TokenizeArgs {
    /// The text (JSON Lines, plain text; files, globs or folders), then the cache folder to
    /// write (absent or empty).
    #[arg(required = true, value_name = "DATA... OUT")]
    pub paths: Vec<String>,
    /// The tokenizer (a tokenizer.json).
    #[arg(long)]
    pub tokenizer: String,
    /// The JSON key of the text.
    #[arg(long)]
    pub text_key: Option<String>,
    /// Plain text: `file` (a document per file) or `line`.
    #[arg(long)]
    pub document: Option<String>,
    /// Tokenizer threads (default: the CPU allowance).
    #[arg(long)]
    pub threads: Option<String>,
    /// Longer documents are skipped (and counted).
    #[arg(long)]
    pub max_document_bytes: Option<String>,
    /// Tokenize on a Ray cluster instead (`auto`, `local`, HOST:PORT or ray://HOST:PORT): Ray
    /// Data with a `stoker.Tokenizer` per worker, the same cache (runs `python -m stoker.ray`;
    /// needs `stoker[ray]`).
    #[arg(long, value_name = "ADDRESS")]
    pub ray: Option<String>,
}

/// Runs `stoker tokenize`.
pub fn run(a: &TokenizeArgs) -> Result<()> {
    if a.paths.len() < 2 {
        anyhow::bail!("give the text (one or more files, globs or folders), then the cache folder to write");
    }
    let (data, out) = a.paths.split_at(a.paths.len() - 1);
    let out = PathBuf::from(&out[0]);
    let args = stoker::args::from_text([
        ("tokenizer", Some(a.tokenizer.clone())),
        ("text_key", a.text_key.clone()),
        ("document", a.document.clone()),
        ("threads", a.threads.clone()),
        ("max_document_bytes", a.max_document_bytes.clone()),
        ("add_eos", Some("false".into())),
        ("batch_size", Some("1".into())),
        ("seq_len", Some("1".into())),
        ("world_size", Some("1".into())),
        ("rank", Some("0".into())),
    ]);
    let (config, tok) = stoker::args::token_config(args)?;
    let tokenizer = stoker::tokens::TextTokenizer::from_file(&tok.expect("--tokenizer is required"))?;
    let paths = stoker::tokens::expand_paths(data)?;
    if let Some(address) = &a.ray {
        let tok = tokenizer.origin.clone();
        let values = serde_json::json!({
            "tokenizer": tok,
            "text_key": config.text_key,
            "lines": config.lines,
            "max_document_bytes": config.max_document_bytes,
        });
        let mut all = paths.clone();
        all.push(out);
        return crate::ray::run("tokenize", address, &all, values, false);
    }
    let loader = stoker::tokens::TokenLoader::new(&paths, Some(tokenizer), config)?;
    let t0 = Instant::now();
    let meta = stoker::tools::tokenize::write_cache(&loader, &paths, &out, |docs, tokens| {
        eprint!("\r{docs} documents, {tokens} tokens");
    })?;
    let s = t0.elapsed().as_secs_f64();
    eprintln!();
    println!(
        "{}: {} documents ({} failed, skipped), {} tokens of {} bytes, in {s:.1} s ({:.2} M tokens/s, {} threads)",
        out.display(),
        meta.documents,
        meta.failed,
        meta.tokens,
        meta.token_bytes,
        meta.tokens as f64 / s / 1e6,
        loader.threads()
    );
    for f in meta.failures.iter().take(5) {
        println!("  failed: {f}");
    }
    Ok(())
}
