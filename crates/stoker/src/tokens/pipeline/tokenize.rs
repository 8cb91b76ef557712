//! The tokenizer threads: each parses a chunk of documents (JSON, UTF-8, stored ids) and
//! tokenizes it without offsets, on the shared tokenizer or, for the `tokenizers` crate's
//! engine, a clone of its own.

use super::read::{read_docs, RawDoc};
use super::shared::Tokens;
use super::state::Elastic;
use crate::error::{Error, Result};
use crate::shell::ordered::{send_or_cancel, take_free, Run};
use crate::tokens::docs::Format;
use crate::tokens::jsonl::json_text_into;
use crate::tokens::pack::{Doc, Resume};
use crate::tokens::tokenizer::TextTokenizer;
use crossbeam_channel::{bounded, Receiver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A chunk's documents, tokenized; failed ones are empty with their error.
pub(super) type Tokenized = Vec<(Doc, Option<Error>)>;

/// Bytes of text, and ids, a [`Scratch`] keeps between documents; a longer document's are
/// given back after it.
const SCRATCH_KEEP: usize = 4 << 20;

/// A thread's buffers, reused from document to document: the text of a JSON record and the
/// ids of the encoder (a document's tokens are then allocated once, at their length).
#[derive(Default)]
pub(super) struct Scratch {
    text: String,
    ids: Vec<u32>,
}

impl Scratch {
    /// Gives back the memory of an unusually long document.
    fn trim(&mut self) {
        if self.text.capacity() > SCRATCH_KEEP {
            self.text = String::new();
        }
        if self.ids.capacity() > SCRATCH_KEEP / 4 {
            self.ids = Vec::new();
        }
    }
}

/// Starts the reader and the tokenizer threads of `run` over this rank's documents from
/// `from`: tokenized chunks arrive numbered in order on the returned receiver, and each chunk
/// the consumer has taken in order gives one credit back on the sender paired with `credits`.
pub(super) fn spawn_tokenizing<S: Send + 'static>(
    run: &Arc<Run<S>>,
    sh: &Arc<Tokens>,
    (from, elastic): (Resume, Option<Elastic>),
    credits: Receiver<()>,
) -> Result<Receiver<(u64, Tokenized)>> {
    let cancel = run.cancel_flag();
    let n = credits.capacity().unwrap_or(sh.threads * 4 + 4);
    let (job_tx, job_rx) = bounded::<(u64, Vec<RawDoc>)>(n);
    let (res_tx, res_rx) = bounded::<(u64, Tokenized)>(n);
    // Set when the reader has handed over its last chunk: a parked thread then leaves once no
    // chunk is left (it holds a sender of the results, whose end the packer waits for).
    let read_all = Arc::new(AtomicBool::new(false));
    {
        let (sh, cancel, read_all) = (sh.clone(), cancel.clone(), read_all.clone());
        run.spawn("stoker-text-read".into(), move || {
            // Object reads in flight are abandoned once the run is cancelled (a dropped loader
            // does not wait for a store that stopped answering).
            crate::source::with_stop(cancel.clone(), || read_docs(&sh, (from, elastic), &job_tx, &credits, &cancel));
            read_all.store(true, Ordering::Release);
        })?;
    }
    for k in 0..sh.threads {
        let (sh, rx, tx, cancel) = (sh.clone(), job_rx.clone(), res_tx.clone(), cancel.clone());
        let read_all = read_all.clone();
        run.spawn(format!("stoker-tokenize-{k}"), move || {
            // A clone of its own only where sharing one instance does not scale.
            let own = sh.tokenizer.as_ref().filter(|t| !t.shares_across_threads()).cloned();
            // The thread's CPU time, lapped after each chunk (the report's `cpu.workers_*`).
            let mut cpu = crate::observe::cpu::ThreadCpu::start();
            let mut scratch = Scratch::default();
            loop {
                sh.telemetry.add_workers_cpu(cpu.lap());
                // Autotuned out: parked until the tuner wants this thread again or the work ends.
                while k >= sh.tuner.threads_active() {
                    if cancel.load(Ordering::Acquire) || (read_all.load(Ordering::Acquire) && rx.is_empty()) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                let Some((seq, chunk)) = take_free(&rx, &cancel) else { return };
                let t0 = Instant::now();
                let docs = chunk.len();
                let tok = own.as_ref().or(sh.tokenizer.as_ref());
                let out: Tokenized = chunk.into_iter().map(|d| tokenize(&sh, tok, d, &mut scratch)).collect();
                sh.stats.tokenize_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if sh.tracer.is_some() {
                    let tokens: usize = out.iter().map(|(d, _)| d.tokens.len()).sum();
                    sh.span(
                        "tokenize",
                        t0,
                        &[("chunk", seq as f64), ("documents", docs as f64), ("tokens", tokens as f64)],
                    );
                }
                if !send_or_cancel(&tx, (seq, out), &cancel) {
                    return;
                }
            }
        })?;
    }
    Ok(res_rx)
}

/// Appends the little-endian ids of `width` bytes each (2 or 4) in `bytes` to `out`.
pub(super) fn extend_ids(out: &mut Vec<u32>, bytes: &[u8], width: usize) {
    if width == 2 {
        out.extend(bytes.chunks_exact(2).map(|t| u16::from_le_bytes([t[0], t[1]]) as u32));
    } else {
        out.extend(bytes.chunks_exact(4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]])));
    }
}

/// Parses and tokenizes one document; a failure is an empty document with its error.
pub(super) fn tokenize(
    sh: &Tokens,
    tok: Option<&TextTokenizer>,
    d: RawDoc,
    scratch: &mut Scratch,
) -> (Doc, Option<Error>) {
    let skip = d.skip.min(usize::MAX as u64) as usize;
    let (mut doc, err) = tokenize_whole(sh, tok, d, scratch);
    scratch.trim();
    doc.tokens.drain(..skip.min(doc.tokens.len()));
    (doc, err)
}

/// [`tokenize`] without the resume's skip.
pub(super) fn tokenize_whole(
    sh: &Tokens,
    tok: Option<&TextTokenizer>,
    d: RawDoc,
    scratch: &mut Scratch,
) -> (Doc, Option<Error>) {
    let mut doc = Doc { epoch: d.epoch, cursor: d.cursor, tokens: Vec::new() };
    let file = &sh.source.files[d.at.0];
    let entry = &file.docs[d.at.1];
    let bytes = match d.bytes {
        Ok(b) => b,
        Err(e) => return (doc, Some(e)),
    };
    let fail = |why: String| Some(Error::decode(&file.path, format!("{}: {why}", file.place(entry))));
    if d.cached {
        // Tokens from the token cache: ids of its width, BOS/EOS added as for text.
        let w = sh.autocache.as_ref().map_or(4, |c| c.width() as usize);
        doc.tokens.reserve(bytes.len() / w + 2);
        if sh.config.add_bos {
            doc.tokens.extend(sh.bos);
        }
        extend_ids(&mut doc.tokens, &bytes, w);
        if sh.config.add_eos {
            doc.tokens.extend(sh.eos);
        }
        return (doc, None);
    }
    match (sh.source.format, tok) {
        (Format::Tokens(_) | Format::Cache(_), _) => {
            let cached = matches!(sh.source.format, Format::Cache(_));
            let w = file.width as usize;
            doc.tokens.reserve(bytes.len() / w.max(1) + 2);
            if cached && sh.config.add_bos {
                doc.tokens.extend(sh.bos);
            }
            extend_ids(&mut doc.tokens, &bytes, w);
            if cached && sh.config.add_eos {
                doc.tokens.extend(sh.eos);
            }
            (doc, None)
        }
        (_, Some(tok)) => {
            let format = sh.source.formats[d.at.0];
            let json = format == Format::Jsonl || file.tar == Some(crate::tokens::docs::TarText::Json);
            let text: &str = match json {
                true => match json_text_into(&bytes, &sh.config.text_key, &mut scratch.text) {
                    Ok(()) => &scratch.text,
                    Err(why) => return (doc, fail(why)),
                },
                false => match std::str::from_utf8(&bytes) {
                    Ok(t) => t,
                    Err(e) => return (doc, fail(format!("not UTF-8 text: {e}"))),
                },
            };
            let ids = &mut scratch.ids;
            ids.clear();
            if let Err(e) = tok.encode_into(text, ids) {
                return (doc, fail(e.to_string()));
            }
            if let Some(c) = &sh.autocache {
                c.put(d.doc, ids);
            }
            let (bos, eos) = (sh.bos.filter(|_| sh.config.add_bos), sh.eos.filter(|_| sh.config.add_eos));
            doc.tokens.reserve_exact(bos.iter().len() + ids.len() + eos.iter().len());
            doc.tokens.extend(bos);
            doc.tokens.extend_from_slice(ids);
            doc.tokens.extend(eos);
            (doc, None)
        }
        (_, None) => (doc, fail("no tokenizer".into())),
    }
}
