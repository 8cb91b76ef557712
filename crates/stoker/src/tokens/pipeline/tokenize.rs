//! The tokenizer threads: each parses a chunk of documents (JSON, UTF-8, stored ids) and
//! tokenizes it with its own clone of the tokenizer, without offsets.

use super::read::{read_docs, RawDoc};
use super::shared::Tokens;
use super::state::Elastic;
use crate::error::{Error, Result};
use crate::shell::ordered::{send_or_cancel, take_free, Run};
use crate::tokens::docs::{json_text, Format};
use crate::tokens::pack::{Doc, Resume};
use crate::tokens::tokenizer::TextTokenizer;
use crossbeam_channel::{bounded, Receiver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A chunk's documents, tokenized; failed ones are empty with their error.
pub(super) type Tokenized = Vec<(Doc, Option<Error>)>;

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
            let tok = sh.tokenizer.clone();
            // The thread's CPU time, lapped after each chunk (the report's `cpu.workers_*`).
            let mut cpu = crate::observe::cpu::ThreadCpu::start();
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
                let out: Tokenized = chunk.into_iter().map(|d| tokenize(&sh, tok.as_ref(), d)).collect();
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
pub(super) fn tokenize(sh: &Tokens, tok: Option<&TextTokenizer>, d: RawDoc) -> (Doc, Option<Error>) {
    let skip = d.skip.min(usize::MAX as u64) as usize;
    let (mut doc, err) = tokenize_whole(sh, tok, d);
    doc.tokens.drain(..skip.min(doc.tokens.len()));
    (doc, err)
}

pub(super) fn tokenize_whole(sh: &Tokens, tok: Option<&TextTokenizer>, d: RawDoc) -> (Doc, Option<Error>) {
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
            let text = match json {
                true => match json_text(&bytes, &sh.config.text_key) {
                    Ok(t) => t,
                    Err(why) => return (doc, fail(why)),
                },
                false => match std::str::from_utf8(&bytes) {
                    Ok(t) => std::borrow::Cow::Borrowed(t),
                    Err(e) => return (doc, fail(format!("not UTF-8 text: {e}"))),
                },
            };
            if sh.config.add_bos {
                doc.tokens.extend(sh.bos);
            }
            let first = doc.tokens.len();
            if let Err(e) = tok.encode_into(&text, &mut doc.tokens) {
                doc.tokens.clear();
                return (doc, fail(e.to_string()));
            }
            if let Some(c) = &sh.autocache {
                c.put(d.doc, &doc.tokens[first..]);
            }
            if sh.config.add_eos {
                doc.tokens.extend(sh.eos);
            }
            (doc, None)
        }
        (_, None) => (doc, fail("no tokenizer".into())),
    }
}
