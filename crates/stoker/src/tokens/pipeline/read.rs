//! The reader thread: this rank's documents of an epoch from the resume point, read (positional
//! reads, decompressing streams, Parquet row groups, or the token cache) and sent in chunks,
//! a chunk for each credit.

use super::order::epoch_order;
use super::shared::Tokens;
use super::state::Elastic;
use crate::error::{Error, Result};
use crate::shell::ordered::{send_or_cancel, take_free};
use crate::source::PositionedRead;
use crate::tokens::corpus::DocSource;
use crate::tokens::docs::{too_long, Compression, ParquetCursor, StreamCursor};
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
    let mut readers = Readers::new(src);
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
                let bytes = readers.read(src, (f, k), cfg.max_document_bytes, &cfg.text_key);
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
            readers.new_epoch();
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
                    let t0 = Instant::now();
                    let bytes = readers.read(src, (f, k), cfg.max_document_bytes, &cfg.text_key);
                    if file.compression == Compression::Parquet {
                        sh.stats.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                        sh.stats.bytes.fetch_add(bytes.as_ref().map_or(0, |b| b.len() as u64), Ordering::Relaxed);
                        sh.span("read", t0, &[("document", c as f64)]);
                        let skip = order.skips.get(&c).copied().unwrap_or(0);
                        got.insert(c, RawDoc { epoch, cursor: c, at: (f, k), bytes, skip, doc, cached: false });
                        continue;
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

/// The open readers of a source's files, kept between documents: a positional handle (random
/// access, and uncompressed objects in a store), a decompressing stream or a Parquet cursor per
/// file, as its format needs. The one way a document's bytes are read: by the reader thread,
/// and by an elastic resume that tokenizes a saved rank's block again.
///
/// An uncompressed object (token files, JSON Lines, text, tar) is read at positions through
/// cached 8 MiB blocks with a read-ahead (`source::open_positioned`), in the window order of
/// [`epoch_order`] (its files, then windows of a file, each read in file order): about one
/// ranged request per block a pass goes through, and a resumed pass starts at its block
/// instead of reading the file from its start. One such object is open at a time (each holds
/// its cache of blocks); the order is done with a file before it reads the next.
pub(super) struct Readers {
    /// Every file can be read at any position ([`DocSource::random_access`], asked once).
    random_access: bool,
    positioned: Vec<Option<Box<dyn PositionedRead>>>,
    /// The object read at positions in a source that is not random access, if one is open.
    object: Option<usize>,
    streams: Vec<Option<StreamCursor>>,
    tables: Vec<Option<ParquetCursor>>,
}

impl Readers {
    /// No reader open yet, for the files of `src`.
    pub(super) fn new(src: &DocSource) -> Self {
        let files = src.files.len();
        Readers {
            random_access: src.random_access(),
            positioned: (0..files).map(|_| None).collect(),
            object: None,
            streams: (0..files).map(|_| None).collect(),
            tables: (0..files).map(|_| None).collect(),
        }
    }

    /// Closes the streams and Parquet cursors: a new epoch reads its windows from their files'
    /// starts (positional handles stay open).
    pub(super) fn new_epoch(&mut self) {
        self.streams.iter_mut().for_each(|s| *s = None);
        self.tables.iter_mut().for_each(|t| *t = None);
    }

    /// Document `k` of file `f` of `src`: at most `max` bytes (a longer one is an error naming
    /// it); `text_key` is the text column of a Parquet file. A stream that fails is reopened
    /// for the next document; one past the document is reopened from its start.
    pub(super) fn read(
        &mut self,
        src: &DocSource,
        (f, k): (usize, usize),
        max: u64,
        text_key: &str,
    ) -> Result<Vec<u8>> {
        let file = &src.files[f];
        let entry = &file.docs[k];
        let mut buf = Vec::new();
        let object = !self.random_access && file.compression == Compression::None && crate::source::is_url(&file.path);
        if self.random_access || object {
            if entry.len > max {
                return Err(too_long(file, entry, max));
            }
            if self.positioned[f].is_none() {
                if object {
                    if let Some(g) = self.object.take() {
                        self.positioned[g] = None;
                    }
                }
                self.positioned[f] = Some(crate::source::open_positioned(&file.path)?);
                if object {
                    self.object = Some(f);
                }
            }
            let h = self.positioned[f].as_ref().expect("opened above");
            file.read_at(h.as_ref(), entry, &mut buf)?;
        } else if file.compression == Compression::Parquet {
            if self.tables[f].is_none() {
                self.tables[f] = Some(ParquetCursor::new(file, text_key)?);
            }
            self.tables[f].as_mut().expect("opened above").read(file, entry, max, &mut buf)?;
        } else {
            if self.streams[f].as_ref().is_some_and(|s| s.position() > entry.offset) {
                self.streams[f] = None;
            }
            if self.streams[f].is_none() {
                self.streams[f] = Some(StreamCursor::new(file)?);
            }
            if let Err(e) = self.streams[f].as_mut().expect("opened above").read(file, entry, max, &mut buf) {
                self.streams[f] = None;
                return Err(e);
            }
        }
        Ok(buf)
    }
}
