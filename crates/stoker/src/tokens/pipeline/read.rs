//! The reader thread: this rank's documents of an epoch from the resume point, read (positional
//! reads, decompressing streams, Parquet row groups, or the token cache) and sent in chunks,
//! a chunk for each credit.

use super::order::epoch_order;
use super::shared::Tokens;
use super::state::Elastic;
use crate::error::{Error, Result};
use crate::shell::ordered::{send_or_cancel, take_free};
use crate::tokens::docs::{too_long, ParquetCursor, StreamCursor};
use crate::tokens::pack::Resume;
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// One chunk of documents on its way to a tokenizer.
pub(super) struct RawDoc {
    pub(super) epoch: u64,
    pub(super) cursor: u64,
    /// `(file, ordinal)`, for messages.
    pub(super) at: (usize, usize),
    pub(super) bytes: Result<Vec<u8>>,
    /// Tokens of it already delivered (an elastic resume).
    pub(super) skip: u64,
    /// Its global number (the token cache's key).
    pub(super) doc: u64,
    /// `bytes` are its tokens from the token cache, not its text.
    pub(super) cached: bool,
}

/// Documents or bytes per chunk sent to a tokenizer thread.
pub(super) const CHUNK_DOCS: usize = 64;
pub(super) const CHUNK_BYTES: usize = 256 << 10;

/// The reader thread: this rank's documents from `from`, in chunks, for each credit.
pub(super) fn read_docs(
    sh: &Tokens,
    (from, elastic): (Resume, Option<Elastic>),
    job_tx: &Sender<(u64, Vec<RawDoc>)>,
    credits: &Receiver<()>,
    cancel: &AtomicBool,
) {
    let cfg = &sh.config;
    let src = &sh.source;
    let mut files: Vec<Option<Box<dyn crate::source::PositionedRead>>> = (0..src.files.len()).map(|_| None).collect();
    let mut seq = 0u64;
    let mut chunk: Vec<RawDoc> = Vec::new();
    let mut chunk_bytes = 0usize;
    let mut flush = |chunk: &mut Vec<RawDoc>, bytes: &mut usize| -> bool {
        if chunk.is_empty() {
            return true;
        }
        if take_free(credits, cancel).is_none() {
            return false;
        }
        let ok = send_or_cancel(job_tx, (seq, std::mem::take(chunk)), cancel);
        seq += 1;
        *bytes = 0;
        ok
    };
    let mut epoch = from.epoch;
    let mut start = from.cursor;
    loop {
        if let Some(c) = &sh.autocache {
            c.refresh(); // what this and other processes stored since: hits from now on
        }
        let order = epoch_order(src, cfg, epoch, elastic.as_ref().filter(|_| epoch == from.epoch));
        // A document whose tokens the token cache holds is not read.
        let from_cache = |doc: u64| -> Option<Vec<u8>> {
            let c = sh.autocache.as_ref()?;
            let mut buf = Vec::new();
            c.get(doc, &mut buf).then_some(buf)
        };
        let mut emit = |d: RawDoc, chunk: &mut Vec<RawDoc>, bytes: &mut usize| -> bool {
            *bytes += d.bytes.as_ref().map_or(0, |b| b.len());
            chunk.push(d);
            if chunk.len() >= CHUNK_DOCS || *bytes >= CHUNK_BYTES {
                return flush(chunk, bytes);
            }
            true
        };
        if src.random_access() {
            for c in start..order.docs.len() as u64 {
                let doc = order.docs[c as usize];
                let (f, k) = src.locate(doc);
                let file = &src.files[f];
                let entry = &file.docs[k];
                let t0 = Instant::now();
                let skip = order.skips.get(&c).copied().unwrap_or(0);
                if let Some(tokens) = from_cache(doc) {
                    sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    let d = RawDoc { epoch, cursor: c, at: (f, k), bytes: Ok(tokens), skip, doc, cached: true };
                    if !emit(d, &mut chunk, &mut chunk_bytes) {
                        return;
                    }
                    continue;
                }
                let bytes = if entry.len > cfg.max_document_bytes {
                    Err(too_long(file, entry, cfg.max_document_bytes))
                } else {
                    let handle = match &files[f] {
                        Some(h) => Ok(h),
                        None => crate::source::open_positioned(&file.path).map(|h| &*files[f].insert(h)),
                    };
                    handle.and_then(|h| {
                        let mut buf = Vec::new();
                        file.read_at(h.as_ref(), entry, &mut buf).map(|()| buf)
                    })
                };
                sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                sh.stats.bytes.fetch_add(entry.len.min(cfg.max_document_bytes), Ordering::Relaxed);
                sh.span("read", t0, &[("document", c as f64), ("bytes", entry.len as f64)]);
                let down = store_down(&bytes);
                if !emit(
                    RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false },
                    &mut chunk,
                    &mut chunk_bytes,
                ) {
                    return;
                }
                if down {
                    flush(&mut chunk, &mut chunk_bytes);
                    return;
                }
            }
        } else {
            // Read each group (a window of one file) from its stream in file order, then hand
            // its documents over in the epoch's order.
            let mut cursors: Vec<Option<StreamCursor>> = (0..src.files.len()).map(|_| None).collect();
            let mut tables: Vec<Option<ParquetCursor>> = (0..src.files.len()).map(|_| None).collect();
            for g in order.groups.windows(2) {
                let (gs, ge) = (g[0] as u64, g[1] as u64);
                if ge <= start {
                    continue;
                }
                let lo = gs.max(start);
                let mut got: BTreeMap<u64, RawDoc> = BTreeMap::new();
                let mut want: Vec<(usize, usize, u64)> = Vec::with_capacity((ge - lo) as usize);
                for c in lo..ge {
                    let doc = order.docs[c as usize];
                    let (f, k) = src.locate(doc);
                    let t0 = Instant::now();
                    match from_cache(doc) {
                        Some(tokens) => {
                            sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                            let skip = order.skips.get(&c).copied().unwrap_or(0);
                            got.insert(
                                c,
                                RawDoc { epoch, cursor: c, at: (f, k), bytes: Ok(tokens), skip, doc, cached: true },
                            );
                        }
                        None => want.push((f, k, c)),
                    }
                }
                want.sort_unstable();
                for (f, k, c) in want {
                    let doc = order.docs[c as usize];
                    let file = &src.files[f];
                    let entry = &file.docs[k];
                    if cursors[f].as_ref().is_some_and(|s| s.position() > entry.offset) {
                        cursors[f] = None;
                    }
                    let t0 = Instant::now();
                    if file.compression == crate::tokens::docs::Compression::Parquet {
                        let table = match &mut tables[f] {
                            Some(t) => Ok(t),
                            None => ParquetCursor::new(file, &cfg.text_key).map(|t| tables[f].insert(t)),
                        };
                        let bytes = table.and_then(|t| {
                            let mut buf = Vec::new();
                            t.read(file, entry, cfg.max_document_bytes, &mut buf).map(|()| buf)
                        });
                        sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        sh.stats.bytes.fetch_add(bytes.as_ref().map_or(0, |b| b.len() as u64), Ordering::Relaxed);
                        sh.span("read", t0, &[("document", c as f64)]);
                        let skip = order.skips.get(&c).copied().unwrap_or(0);
                        got.insert(c, RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false });
                        continue;
                    }
                    let cur = match &mut cursors[f] {
                        Some(s) => Ok(s),
                        None => StreamCursor::new(file).map(|s| cursors[f].insert(s)),
                    };
                    let bytes = cur.and_then(|s| {
                        let mut buf = Vec::new();
                        s.read(file, entry, cfg.max_document_bytes, &mut buf).map(|()| buf)
                    });
                    if bytes.is_err() {
                        cursors[f] = None; // a broken stream is reopened for the next document
                    }
                    sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    sh.stats.bytes.fetch_add(entry.len.min(cfg.max_document_bytes), Ordering::Relaxed);
                    sh.span("read", t0, &[("document", c as f64), ("bytes", entry.len as f64)]);
                    let skip = order.skips.get(&c).copied().unwrap_or(0);
                    let down = store_down(&bytes);
                    got.insert(c, RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false });
                    if cancel.load(Ordering::Acquire) {
                        return;
                    }
                    if down {
                        // No later read can succeed: hand over what was read, up to the error.
                        for (_, d) in got {
                            if !emit(d, &mut chunk, &mut chunk_bytes) {
                                return;
                            }
                        }
                        flush(&mut chunk, &mut chunk_bytes);
                        return;
                    }
                }
                for (_, d) in got {
                    if !emit(d, &mut chunk, &mut chunk_bytes) {
                        return;
                    }
                }
            }
        }
        if !cfg.infinite {
            break;
        }
        if order.docs.is_empty() {
            return; // a rank without documents would loop for ever
        }
        epoch += 1;
        start = 0;
    }
    flush(&mut chunk, &mut chunk_bytes);
}

/// Whether a document's read failed because its store is not answering: the reader stops
/// there (the error ends the pass; every later read would wait for its bound too).
pub(super) fn store_down(bytes: &Result<Vec<u8>>) -> bool {
    matches!(bytes, Err(Error::Unavailable(_)))
}
