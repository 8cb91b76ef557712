//! [`TokenLoader`]: construction (formats, tokenizer, special ids, pool, tuner), what a
//! loader answers (counts, config, report), epochs and state, and the start of a pass.

use super::config::{format_of, TokenConfig};
use super::order::RowsMemo;
use super::shared::Tokens;
use super::slot::token_pool;
use super::stats::TokenStats;
use super::tokenize::{spawn_tokenizing, Tokenized};
use crate::error::{Error, Result};
use crate::shell::buffer::HeapAllocator;
use crate::shell::kind::Loader;
use crate::shell::ordered::{take_free, Run};
use crate::tokens::corpus::DocSource;
use crate::tokens::docs::Format;
use crate::tokens::pack::{Doc, Resume};
use crate::tokens::tokenizer::TextTokenizer;
use crate::values::check_prefetch;
use crossbeam_channel::bounded;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Batches over which `threads="auto"` settles (a text epoch's batch count is known only once
/// it is tokenized); the setting then holds.
pub(super) const TUNE_BATCHES: usize = 512;

impl Loader<Tokens> {
    /// Opens the documents of `paths` (text needs `tokenizer`; token files need none) and
    /// allocates the pool.
    pub fn new(paths: &[std::path::PathBuf], tokenizer: Option<TextTokenizer>, config: TokenConfig) -> Result<Self> {
        Self::new_in(paths, tokenizer, config, Arc::new(HeapAllocator))
    }

    /// As [`Loader::new`](Self::new), its batch buffers from `alloc` (page-locked memory when batches
    /// go on to a GPU).
    pub fn new_in(
        paths: &[std::path::PathBuf],
        tokenizer: Option<TextTokenizer>,
        config: TokenConfig,
        alloc: Arc<dyn crate::shell::buffer::HostAllocator>,
    ) -> Result<Self> {
        let formats = paths.iter().map(|p| format_of(p, &config)).collect::<Result<Vec<_>>>()?;
        let format = *formats.first().ok_or_else(|| Error::config("data", "no files given"))?;
        // Text formats mix (JSON Lines beside text files and tar shards); token files and
        // caches are read as they are, one kind per loader.
        let tokens = |f: &Format| matches!(f, Format::Tokens(_) | Format::Cache(_));
        if let Some(k) = formats.iter().position(|f| {
            (tokens(f) || tokens(&format)) && std::mem::discriminant(f) != std::mem::discriminant(&format)
        }) {
            return Err(Error::config(
                "data",
                format!(
                    "mixes formats: {} is {:?}, {} is {:?}: token files and token caches are one kind per loader",
                    paths[0].display(),
                    format,
                    paths[k].display(),
                    formats[k]
                ),
            ));
        }
        let text = !matches!(format, Format::Tokens(_) | Format::Cache(_));
        let cache = match format {
            Format::Cache(_) => Some(crate::tokens::cache::read_meta(&paths[0])?),
            _ => None,
        };
        if let Some(m) = &cache {
            for p in &paths[1..] {
                let other = crate::tokens::cache::read_meta(p)?;
                if other.tokenizer_hash != m.tokenizer_hash {
                    return Err(Error::config(
                        "data",
                        format!("{}: a cache of another tokenizer than {}", p.display(), paths[0].display()),
                    ));
                }
            }
        }
        let tokenizer = match (text, tokenizer, &cache) {
            (true, None, _) => return Err(Error::config("tokenizer", "text needs a tokenizer (a tokenizer.json)")),
            (false, Some(t), Some(m)) => {
                let h = format!("{:016x}", t.hash);
                if h != m.tokenizer_hash {
                    return Err(Error::config(
                        "tokenizer",
                        format!(
                            "{}: the token cache {} was made with another tokenizer ({}, hash {}); this one's hash is {h}",
                            t.origin.display(),
                            paths[0].display(),
                            m.tokenizer.display(),
                            m.tokenizer_hash
                        ),
                    ));
                }
                Some(t)
            }
            (false, Some(_), None) => {
                return Err(Error::config("tokenizer", "token files are already tokenized: give no tokenizer"))
            }
            (_, t, _) => t,
        };
        let (bos, eos) = match (&tokenizer, &cache) {
            (Some(t), _) => (
                t.bos(config.bos_token.as_deref())?,
                match config.eos_id {
                    Some(id) => Some(id),
                    None => t.eos(config.eos_token.as_deref())?,
                },
            ),
            (None, Some(m)) => (m.bos_id, config.eos_id.or(m.eos_id)),
            (None, None) => (None, config.eos_id),
        };
        let text = text || cache.is_some(); // BOS/EOS are added as for text
        if config.add_eos && eos.is_none() && text {
            return Err(Error::config("eos_token", "the tokenizer has no known EOS token: name it, or add_eos=False"));
        }
        if config.add_bos && bos.is_none() {
            return Err(Error::config("bos_token", "the tokenizer has no known BOS token: name it, or add_bos=False"));
        }
        let source = DocSource::open(paths, &formats, if text { None } else { eos }, config.index_dir.as_deref())?;
        let autocache = match (&config.cache, &tokenizer) {
            (None, _) => None,
            (Some(spec), Some(t)) if text && cache.is_none() => {
                Some(crate::tokens::autocache::TokenCache::open(spec, &source, t.hash, &config.text_key, t.id_width())?)
            }
            (Some(_), _) => {
                return Err(Error::config(
                    "cache",
                    "token files and token cache folders are already tokens: a token cache is for text",
                ))
            }
        };
        let (threads, cpu_budget) = crate::observe::tune::workers(config.threads, config.cpu_budget)?;
        check_prefetch(config.prefetch)?;
        let tuner = crate::observe::tune::Tuner::new(
            crate::observe::tune::TuneSpec {
                auto_threads: config.threads.is_none(),
                threads_max: threads,
                auto_prefetch: false,
                prefetch_max: config.prefetch,
                prefetch: config.prefetch,
                cpu_budget,
                epoch_batches: TUNE_BATCHES,
            },
            config.cpu_registry.clone().map(crate::observe::budget::Registry::at),
        );
        let pool = token_pool(&config, alloc)?;
        let pad = config.pad_id.or(eos).unwrap_or(0);
        let tracer = config
            .trace
            .as_ref()
            .map(|t| t.check().map(|()| Arc::new(crate::observe::trace::Tracer::from_spec(t))))
            .transpose()?;
        Ok(Loader::of(Tokens {
            source,
            tokenizer,
            config,
            threads,
            bos,
            eos,
            pad,
            pool,
            stats: Arc::default(),
            telemetry: Arc::default(),
            rows: RowsMemo::default(),
            tracer,
            autocache,
            tuner,
        }))
    }

    /// Seconds the consumer has waited for batches (the shell's consumer counters).
    pub fn consumer_wait(&self) -> f64 {
        self.kind().telemetry.consumer.wait_ns() as f64 / 1e9
    }

    /// Documents in the source (all ranks).
    pub fn documents(&self) -> u64 {
        self.kind().source.len()
    }

    /// Batches per epoch on this rank (the current epoch), when known before tokenizing:
    /// token files, where every rank has the same count. `None` for text and `infinite`.
    pub fn batches_per_epoch(&self) -> Option<usize> {
        let (sh, p) = (&self.kind(), self.epochs().position());
        let rows = sh.rows.rows_per_rank(&sh.source, &sh.config, p.epoch(), p.elastic().as_ref())? as usize;
        let bs = self.kind().config.batch_size;
        Some(if self.kind().config.drop_last { rows / bs } else { rows.div_ceil(bs) })
    }

    /// Tokenizer threads.
    pub fn threads(&self) -> usize {
        self.kind().threads
    }

    /// The tokenizer (text and caches made with one given).
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.kind().tokenizer.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &TokenConfig {
        &self.kind().config
    }

    /// `(bos, eos, pad)` ids.
    pub fn special_ids(&self) -> (Option<u32>, Option<u32>, u32) {
        (self.kind().bos, self.kind().eos, self.kind().pad)
    }

    /// The counters (documents, tokens, padding, time per stage).
    pub fn stats(&self) -> &TokenStats {
        &self.kind().stats
    }

    /// Reads and tokenizes every document of this rank's order of the current epoch on the
    /// loader's threads and hands each to `sink` in order, with its error if it failed (then
    /// it is empty): what `stoker tokenize` writes. Memory stays bounded (a credit per chunk in
    /// flight); an error from `sink` stops every thread and is returned.
    pub fn for_each_document(&self, mut sink: impl FnMut(Doc, Option<Error>) -> Result<()>) -> Result<()> {
        self.epochs().retire("for_each_document was started");
        let sh = self.kind().clone();
        let epoch = self.epochs().position().epoch();
        let (free_tx, _free_rx) = bounded::<()>(1);
        let (run, _done) = Run::new(1, free_tx);
        let credits = sh.threads * 4 + 4;
        let (credit_tx, credit_rx) = bounded::<()>(credits);
        for _ in 0..credits {
            credit_tx.send(()).expect("room");
        }
        let results = spawn_tokenizing(&run, &sh, (Resume { epoch, cursor: 0, offset: 0 }, None), credit_rx)?;
        let mut early: BTreeMap<u64, Tokenized> = BTreeMap::new();
        let mut next = 0u64;
        let cancel = run.cancel_flag();
        let outcome = loop {
            if let Some(chunk) = early.remove(&next) {
                next += 1;
                let _ = credit_tx.try_send(());
                if let Some(e) = chunk.into_iter().try_for_each(|(d, e)| sink(d, e)).err() {
                    break Err(e);
                }
                continue;
            }
            match take_free(&results, &cancel) {
                Some((seq, c)) => {
                    early.insert(seq, c);
                }
                None => break run.death_error().map_or(Ok(()), Err),
            }
        };
        run.shutdown();
        outcome
    }
}
