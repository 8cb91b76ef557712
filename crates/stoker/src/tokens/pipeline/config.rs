//! What a user sets: [`TokenConfig`] (checked by [`crate::args::token_config`]), the packing
//! mode, and the files a list of paths, globs and folders names ([`expand_paths`]) with the
//! format of each ([`format_of`]).

use crate::error::{Error, Result};
use crate::tokens::docs::Format;

/// How documents are packed into rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PackMode {
    /// Joined and cut ([`crate::tokens::pack::Concat`]).
    Concat,
    /// Best-fit decreasing over blocks of documents ([`crate::tokens::pack::BestFit`]).
    BestFit,
}

/// Configuration of a [`super::TokenLoader`] (checked by [`crate::args::token_config`]).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TokenConfig {
    /// Rows per batch.
    pub batch_size: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// The packer.
    pub pack: PackMode,
    /// Documents per best-fit block.
    pub pack_window: u64,
    /// A seeded document order per epoch.
    pub shuffle: bool,
    /// The seed.
    pub seed: u64,
    /// This process's rank.
    pub rank: usize,
    /// Ranks sharing the documents.
    pub world_size: usize,
    /// Drop the epoch's last batch when it has fewer than `batch_size` rows.
    pub drop_last: bool,
    /// Go on into the next epoch's order instead of ending (step-based training).
    pub infinite: bool,
    /// For compressed files (read as streams): documents shuffled together within a file.
    pub shuffle_window: u64,
    /// Tokenizer threads (`None`: autotuned within `cpu_budget`).
    pub threads: Option<usize>,
    /// Cores autotuned threads may use (`None`: the CPU allowance).
    #[serde(default)]
    pub cpu_budget: Option<f64>,
    /// Finished batches that may wait ahead of the consumer.
    pub prefetch: usize,
    /// Cap on the bytes of all batch buffers together.
    pub memory_limit: Option<u64>,
    /// A longer document is skipped (and counted) unread.
    pub max_document_bytes: u64,
    /// The JSON key holding the text.
    pub text_key: String,
    /// Plain text files: a document per line (else per file).
    pub lines: bool,
    /// Bytes per token of `.bin` token files.
    pub token_bytes: u8,
    /// Put the BOS token before each document.
    pub add_bos: bool,
    /// Put the EOS token after each document.
    pub add_eos: bool,
    /// The BOS token's text (`None`: the usual names).
    pub bos_token: Option<String>,
    /// The EOS token's text (`None`: the usual names).
    pub eos_token: Option<String>,
    /// The EOS id of token files (their documents end at it), or an id to use as EOS.
    pub eos_id: Option<u32>,
    /// The id of padding (`None`: EOS, else 0).
    pub pad_id: Option<u32>,
    /// Failed documents allowed per pass before it ends with an error.
    pub max_failures: u64,
    /// Raise the first failed document instead of skipping it.
    pub raise: bool,
    /// Where document indexes are stored between runs (`None`: built at every open); see
    /// [`crate::tokens::index`].
    pub index_dir: Option<std::path::PathBuf>,
    /// The trace file and ring size (`None`: no trace): spans of reading, tokenizing, packing
    /// and the consumer's waits, written when a pass completes and when the loader is dropped.
    pub trace: Option<crate::observe::trace::TraceSpec>,
    /// The automatic token cache (`None`: every epoch tokenizes); see [`crate::tokens::autocache`].
    #[serde(default)]
    pub cache: Option<crate::shell::store::StoreSpec>,
    /// The host-wide CPU registry file autotuned loaders share cores through (`None`: no
    /// sharing); `args` sets it from the environment (see
    /// [`crate::args::budget_registry_path`]).
    #[serde(default = "crate::observe::budget::default_registry_path")]
    pub cpu_registry: Option<std::path::PathBuf>,
    /// A weighted mixture of sources, row by row (`None`: one source, the paths given).
    #[serde(default)]
    pub mixture: Option<TokenMixture>,
}

/// A token mixture's sources: how they mix ([`MixSpec`](crate::shell::mix::MixSpec)) and where each one's documents are.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TokenMixture {
    /// Names, weights, exhaustion, rows per epoch (`epoch_items`, over all ranks).
    pub spec: crate::shell::mix::MixSpec,
    /// Each source's data (files, globs, folders, URLs) and its JSON text key (`None`: the
    /// loader's).
    pub sources: Vec<(Vec<String>, Option<String>)>,
}

impl TokenConfig {
    /// Defaults for `batch_size` rows of `seq_len` tokens.
    pub fn new(batch_size: usize, seq_len: usize) -> Self {
        TokenConfig {
            batch_size,
            seq_len,
            pack: PackMode::Concat,
            pack_window: 1024,
            shuffle: false,
            seed: 0,
            rank: 0,
            world_size: 1,
            drop_last: false,
            infinite: false,
            shuffle_window: 4096,
            threads: None,
            cpu_budget: None,
            prefetch: 2,
            memory_limit: None,
            max_document_bytes: 64 << 20,
            text_key: "text".into(),
            lines: false,
            token_bytes: 2,
            add_bos: false,
            add_eos: true,
            bos_token: None,
            eos_token: None,
            eos_id: None,
            pad_id: None,
            max_failures: u64::MAX,
            raise: false,
            index_dir: None,
            trace: None,
            cache: None,
            cpu_registry: crate::observe::budget::default_registry_path(),
            mixture: None,
        }
    }
}

/// The format of a file, from its name: `.jsonl`/`.json`, `.txt`, `.tar` (WebDataset shards;
/// each optionally `.gz`/`.zst`), `.parquet`, `.bin`/`.npy` token files (a `.bin` beside an
/// `.idx` is Megatron's indexed dataset).
pub fn format_of(path: &std::path::Path, cfg: &TokenConfig) -> Result<Format> {
    if path.is_dir() && crate::tokens::cache::is_cache(path) {
        return Ok(Format::Cache(crate::tokens::cache::read_meta(path)?.token_bytes));
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let base = name.strip_suffix(".gz").or_else(|| name.strip_suffix(".zst")).unwrap_or(&name);
    if name.ends_with(".parquet") {
        Ok(Format::Parquet)
    } else if base.ends_with(".tar") || name.ends_with(".tgz") {
        Ok(Format::Tar)
    } else if base.ends_with(".jsonl") || base.ends_with(".json") || base.ends_with(".ndjson") {
        Ok(Format::Jsonl)
    } else if base.ends_with(".txt") || base.ends_with(".text") {
        Ok(if cfg.lines { Format::Lines } else { Format::File })
    } else if name.ends_with(".bin") || name.ends_with(".npy") {
        Ok(Format::Tokens(cfg.token_bytes))
    } else {
        Err(Error::config(
            "data",
            format!(
                "{}: unknown format: expected .jsonl, .txt, .tar (optionally .gz or .zst), .parquet, .bin or .npy",
                path.display()
            ),
        ))
    }
}

/// The data files of `specs`: each a file, a glob (`*`, `?` in the file name), a token cache
/// folder, or a folder (its files of a known format but `.json`, in name order).
pub fn expand_paths(specs: &[String]) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for s in specs {
        let p = std::path::Path::new(s);
        if crate::source::is_url(p) {
            out.extend(crate::source::expand_urls(s)?.into_iter().map(std::path::PathBuf::from));
        } else if p.is_dir() && crate::tokens::cache::is_cache(p) {
            out.push(p.to_path_buf());
        } else if p.is_dir() {
            let rd = std::fs::read_dir(p).map_err(|e| Error::io(p, &e))?;
            let mut files: Vec<_> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|f| {
                    // `.json` only when named: in a folder it is more often metadata than JSON Lines.
                    let meta = f.extension().is_some_and(|x| x == "json");
                    f.is_file() && !meta && format_of(f, &TokenConfig::new(1, 1)).is_ok()
                })
                .collect();
            if files.is_empty() {
                return Err(Error::Dataset(format!(
                    "{s}: no .jsonl, .txt, .tar, .parquet, .bin or .npy files in this folder"
                )));
            }
            files.sort();
            out.extend(files);
        } else {
            out.extend(crate::source::shards::expand_glob(p)?);
        }
    }
    if out.is_empty() {
        return Err(Error::config("data", "no files given"));
    }
    Ok(out)
}
