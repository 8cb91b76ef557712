//! The token cache: a corpus tokenized once (`stoker tokenize DATA --tokenizer T OUT`), read
//! by later runs instead of the text. A folder of three files:
//!
//! - `tokens.bin`: every document's token ids (the tokenizer's own output, without the BOS/EOS
//!   a loader adds), little-endian `uint16` when the vocabulary fits, else `uint32`, back to
//!   back in the documents' order;
//! - `index.bin`: `documents + 1` little-endian `u64` token offsets (document `d` is tokens
//!   `index[d]..index[d + 1]`; a document that failed is empty);
//! - `stoker-tokens.json` ([`CacheMeta`]): what it was made from (files, tokenizer hash, the
//!   special ids), its counts, and the failures. Written last: a folder without it is
//!   incomplete and refused.
//!
//! The loader checks the index against `tokens.bin` when it opens the folder, and a tokenizer
//! given with it against the hash, so a cache never silently serves another tokenizer's ids.

use super::docs::{DocEntry, DocFile};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The name of the description file of a cache folder.
pub const META: &str = "stoker-tokens.json";

/// What a token cache holds and was made from.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CacheMeta {
    /// Format version (1).
    pub version: u32,
    /// The files tokenized, in order.
    pub sources: Vec<PathBuf>,
    /// A hash of the tokenizer's JSON.
    pub tokenizer_hash: String,
    /// Where the tokenizer came from.
    pub tokenizer: PathBuf,
    /// The JSON key of the text (JSON Lines).
    pub text_key: String,
    /// Documents (failed ones included, empty).
    pub documents: u64,
    /// Tokens.
    pub tokens: u64,
    /// Bytes per token in `tokens.bin` (2 or 4).
    pub token_bytes: u8,
    /// The tokenizer's BOS and EOS ids (the usual names), for loaders given no tokenizer.
    pub bos_id: Option<u32>,
    /// See `bos_id`.
    pub eos_id: Option<u32>,
    /// Documents that failed (skipped, empty in the cache).
    pub failed: u64,
    /// The first failures' reasons.
    pub failures: Vec<String>,
}

/// Whether `dir` is a token cache folder.
pub fn is_cache(dir: &Path) -> bool {
    dir.join(META).is_file()
}

/// Reads and checks a cache folder's description.
pub fn read_meta(dir: &Path) -> Result<CacheMeta> {
    let p = dir.join(META);
    let text = std::fs::read(&p).map_err(|e| Error::io(&p, &e))?;
    let m: CacheMeta = serde_json::from_slice(&text)
        .map_err(|e| Error::decode(&p, format!("not a stoker token cache description: {e}")))?;
    if m.version != 1 || !matches!(m.token_bytes, 2 | 4) {
        return Err(Error::decode(
            &p,
            format!("version {} with {}-byte tokens: not one this stoker reads", m.version, m.token_bytes),
        ));
    }
    Ok(m)
}

/// Opens a cache folder as one file of documents: `tokens.bin`, cut by `index.bin`, both
/// checked against the description (sizes, monotonic offsets).
pub fn open(dir: &Path) -> Result<(DocFile, CacheMeta)> {
    let m = read_meta(dir)?;
    let (tokens, index) = (dir.join("tokens.bin"), dir.join("index.bin"));
    let w = m.token_bytes as u64;
    let tlen = std::fs::metadata(&tokens).map_err(|e| Error::io(&tokens, &e))?.len();
    if tlen != m.tokens * w {
        return Err(Error::decode(
            &tokens,
            format!("{tlen} bytes where the description says {} tokens of {w} bytes", m.tokens),
        ));
    }
    let ilen = std::fs::metadata(&index).map_err(|e| Error::io(&index, &e))?.len();
    if ilen != (m.documents + 1) * 8 {
        return Err(Error::decode(
            &index,
            format!("{ilen} bytes where {} documents need {}", m.documents, (m.documents + 1) * 8),
        ));
    }
    let raw = std::fs::read(&index).map_err(|e| Error::io(&index, &e))?;
    let offsets: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
    if offsets[0] != 0 || offsets.windows(2).any(|p| p[0] > p[1]) || offsets[offsets.len() - 1] != m.tokens {
        return Err(Error::decode(&index, "offsets that do not run from 0 up to the token count: a damaged cache"));
    }
    let docs = offsets
        .windows(2)
        .enumerate()
        .map(|(d, p)| DocEntry { offset: p[0] * w, len: (p[1] - p[0]) * w, line: d as u64 + 1 })
        .collect();
    Ok((DocFile::cache(tokens, docs, tlen, m.token_bytes), m))
}
