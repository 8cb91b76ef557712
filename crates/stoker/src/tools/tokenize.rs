//! `stoker tokenize`: a corpus tokenized once into a token cache folder (the format is
//! [`crate::tokens::cache`]'s), on a [`TokenLoader`]'s threads.

use crate::error::{Error, Result};
use crate::tokens::cache::{CacheMeta, META};
use crate::tokens::pipeline::TokenLoader;
use crate::tokens::TextTokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

/// How many failures a cache's description lists (the count is always exact).
const LISTED_FAILURES: usize = 100;

/// Tokenizes every document `loader` reads (in the files' order: made with `shuffle=False`,
/// one rank) into a new cache folder `out` (absent or empty), on the loader's threads;
/// `progress` sees the documents and tokens so far. Returns the description written.
pub fn write_cache(
    loader: &TokenLoader,
    sources: &[PathBuf],
    out: &Path,
    mut progress: impl FnMut(u64, u64),
) -> Result<CacheMeta> {
    let tok = loader
        .tokenizer()
        .ok_or_else(|| Error::config("tokenizer", "a token cache is made from text with a tokenizer"))?;
    let c = loader.config();
    if c.shuffle || c.world_size != 1 || c.add_bos || c.add_eos {
        return Err(Error::Internal("the cache writer's loader must read every document in order, as is".into()));
    }
    if out.exists() && std::fs::read_dir(out).map_err(|e| Error::io(out, &e))?.next().is_some() {
        return Err(Error::Dataset(format!(
            "{}: exists and is not empty: give a new folder for the cache",
            out.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, &e))?;
    let width = tok.id_width();
    let tmp = |n: &str| out.join(format!("{n}.tmp"));
    let create = |p: &Path| {
        std::fs::File::create(p).map(|f| std::io::BufWriter::with_capacity(1 << 20, f)).map_err(|e| Error::io(p, &e))
    };
    let (mut tokens, mut index) = (create(&tmp("tokens.bin"))?, create(&tmp("index.bin"))?);
    let (mut n_tokens, mut docs, mut failed, mut failures) = (0u64, 0u64, 0u64, Vec::new());
    index.write_all(&0u64.to_le_bytes()).map_err(|e| Error::io(tmp("index.bin"), &e))?;
    let mut buf: Vec<u8> = Vec::new();
    loader.for_each_document(|d, err| {
        if let Some(e) = err {
            failed += 1;
            if failures.len() < LISTED_FAILURES {
                failures.push(e.to_string());
            }
        }
        buf.clear();
        for &t in &d.tokens {
            if width == 2 {
                buf.extend_from_slice(&(t as u16).to_le_bytes());
            } else {
                buf.extend_from_slice(&t.to_le_bytes());
            }
        }
        tokens.write_all(&buf).map_err(|e| Error::io(tmp("tokens.bin"), &e))?;
        n_tokens += d.tokens.len() as u64;
        docs += 1;
        index.write_all(&n_tokens.to_le_bytes()).map_err(|e| Error::io(tmp("index.bin"), &e))?;
        if docs % 1024 == 0 {
            progress(docs, n_tokens);
        }
        Ok(())
    })?;
    for (f, name) in [(tokens, "tokens.bin"), (index, "index.bin")] {
        let file = f.into_inner().map_err(|e| Error::io(tmp(name), e.error()))?;
        file.sync_all().map_err(|e| Error::io(tmp(name), &e))?;
        std::fs::rename(tmp(name), out.join(name)).map_err(|e| Error::io(out.join(name), &e))?;
    }
    progress(docs, n_tokens);
    let counts = CacheCounts { documents: docs, tokens: n_tokens, failed, failures };
    write_meta(out, tok, sources, &c.text_key, counts)
}

/// What a cache holds: its counts and the first failures (at most [`LISTED_FAILURES`] kept).
#[derive(Debug, Clone, Default)]
pub struct CacheCounts {
    /// Documents (failed ones included, empty).
    pub documents: u64,
    /// Tokens.
    pub tokens: u64,
    /// Documents that failed.
    pub failed: u64,
    /// Their reasons, in order.
    pub failures: Vec<String>,
}

/// Writes the description of the cache folder `out` (the last file of a cache: a folder
/// without it is refused) whose `tokens.bin` and `index.bin` are written: made from `sources`
/// with `tok` and `text_key`. For [`write_cache`] and for caches written in pieces
/// (`stoker.ray.tokenize`).
pub fn write_meta(
    out: &Path,
    tok: &TextTokenizer,
    sources: &[PathBuf],
    text_key: &str,
    mut counts: CacheCounts,
) -> Result<CacheMeta> {
    counts.failures.truncate(LISTED_FAILURES);
    let meta = CacheMeta {
        version: 1,
        sources: sources.to_vec(),
        tokenizer_hash: format!("{:016x}", tok.hash),
        tokenizer: tok.origin.clone(),
        text_key: text_key.to_string(),
        documents: counts.documents,
        tokens: counts.tokens,
        token_bytes: tok.id_width(),
        bos_id: tok.bos(None)?,
        eos_id: tok.eos(None)?,
        failed: counts.failed,
        failures: counts.failures,
    };
    let text = serde_json::to_vec_pretty(&meta).map_err(|e| Error::Internal(e.to_string()))?;
    let p = out.join(META);
    std::fs::write(&p, text).map_err(|e| Error::io(&p, &e))?;
    Ok(meta)
}
