//! A batch of texts to ids, on worker threads made for the call and joined before it returns:
//! what `stoker.Tokenizer.encode_batch` runs ([`TextEncoder::encode_batch`]).
//!
//! The batch is cut into contiguous chunks of about the same bytes (several per thread, so that
//! uneven texts still spread); the workers take the chunks in turn and the chunks' ids are kept
//! in input order, so the ids are the same whatever the thread count. No thread outlives a
//! call, so nothing is left running for a `fork()` between calls.

use super::TextTokenizer;
use crate::error::{Error, Result};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::time::Duration;

/// Bytes of text a chunk holds at least: below this, a chunk costs more to hand out than to
/// encode.
const MIN_CHUNK_BYTES: usize = 64 << 10;
/// Chunks per worker thread, so that a chunk of long texts does not leave the others idle.
const CHUNKS_PER_THREAD: usize = 8;
/// Bytes a text counts for besides its own when chunks are cut (a batch of empty texts is still
/// cut).
const TEXT_OVERHEAD: usize = 16;
/// How often the calling thread asks whether to go on while the workers encode.
pub const POLL_EVERY: Duration = Duration::from_millis(50);

/// What a call to [`TextEncoder::encode_batch`] asks for (checked by
/// [`crate::args::encode_options`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    /// Put the BOS id before each text's ids.
    pub add_bos: bool,
    /// Put the EOS id after each text's ids.
    pub add_eos: bool,
    /// Keep the ids the file's post-processor puts around a text (`tokenizers`'
    /// `add_special_tokens=True`); without it the ids are those of `add_special_tokens=False`.
    pub add_special_tokens: bool,
    /// Worker threads; `None`: the process's CPU allowance. Never more than the batch's chunks.
    pub threads: Option<usize>,
}

/// A tokenizer with the BOS and EOS ids it adds on request.
#[derive(Debug, Clone)]
pub struct TextEncoder {
    /// The tokenizer.
    pub tokenizer: TextTokenizer,
    /// The BOS id (`None`: the file has none of the usual names and none was named).
    pub bos: Option<u32>,
    /// The EOS id, like [`TextEncoder::bos`].
    pub eos: Option<u32>,
}

/// A batch's ids: every text's ids end to end, in input order, and where each text's start.
#[derive(Debug, Default)]
pub struct EncodedBatch {
    /// The ids of each chunk, in order.
    chunks: Vec<Vec<u32>>,
    /// Text `i`'s ids are `offsets[i]..offsets[i + 1]` of the whole.
    offsets: Vec<u64>,
}

impl EncodedBatch {
    /// Where each text's ids start, and the total last: one more than there are texts.
    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    /// The number of ids.
    pub fn len(&self) -> usize {
        self.chunks.iter().map(Vec::len).sum()
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The ids, in pieces whose concatenation is the whole.
    pub fn pieces(&self) -> impl Iterator<Item = &[u32]> {
        self.chunks.iter().map(Vec::as_slice)
    }

    /// The ids in one vector.
    pub fn to_vec(&self) -> Vec<u32> {
        self.chunks.concat()
    }
}

/// One chunk's ids and the number of ids of each of its texts.
type Chunk = (Vec<u32>, Vec<u64>);

impl TextEncoder {
    /// `tokenizer` with its BOS and EOS ids: those named (an error when the vocabulary lacks
    /// one), else the first of the usual names it has ([`TextTokenizer::bos`]).
    pub fn new(tokenizer: TextTokenizer, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let bos = tokenizer.bos(bos_token)?;
        let eos = tokenizer.eos(eos_token)?;
        Ok(TextEncoder { tokenizer, bos, eos })
    }

    /// The ids of each of `texts`, in order. `poll` is asked every [`POLL_EVERY`] while worker
    /// threads encode (and between chunks when the calling thread encodes alone) whether to go
    /// on; when it says no, the workers stop after their current text and the call returns
    /// [`Error::Cancelled`]. A text the tokenizer cannot encode is an [`Error::Decode`] naming
    /// the file and the text's index (the first such text met).
    pub fn encode_batch<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        opts: &EncodeOptions,
        poll: &mut dyn FnMut() -> bool,
    ) -> Result<EncodedBatch> {
        if opts.add_bos && self.bos.is_none() {
            return Err(Error::config("bos_token", "the tokenizer has no known BOS token: name it, or add_bos=False"));
        }
        if opts.add_eos && self.eos.is_none() {
            return Err(Error::config("eos_token", "the tokenizer has no known EOS token: name it, or add_eos=False"));
        }
        let threads = opts.threads.unwrap_or_else(crate::observe::cpu::default_threads).max(1);
        let plan = chunks(texts, threads);
        let workers = threads.min(plan.len());
        let done = if workers <= 1 {
            self.alone(texts, &plan, opts, poll)?
        } else {
            self.spread(texts, &plan, opts, workers, poll)?
        };
        let mut offsets = Vec::with_capacity(texts.len() + 1);
        offsets.push(0u64);
        let mut at = 0u64;
        let mut chunks = Vec::with_capacity(done.len());
        for (ids, lens) in done {
            for n in lens {
                at += n;
                offsets.push(at);
            }
            chunks.push(ids);
        }
        Ok(EncodedBatch { chunks, offsets })
    }

    /// Every chunk on the calling thread, asking `poll` between chunks.
    fn alone<S: AsRef<str>>(
        &self,
        texts: &[S],
        plan: &[Range<usize>],
        opts: &EncodeOptions,
        poll: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Chunk>> {
        let mut out = Vec::with_capacity(plan.len());
        for (k, r) in plan.iter().enumerate() {
            if k > 0 && !poll() {
                return Err(Error::Cancelled);
            }
            out.push(self.chunk(&self.tokenizer, texts, r.clone(), opts)?);
        }
        Ok(out)
    }

    /// The chunks on `workers` scoped threads, taken in turn; the calling thread asks `poll`
    /// meanwhile.
    fn spread<S: AsRef<str> + Sync>(
        &self,
        texts: &[S],
        plan: &[Range<usize>],
        opts: &EncodeOptions,
        workers: usize,
        poll: &mut dyn FnMut() -> bool,
    ) -> Result<Vec<Chunk>> {
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let work = || -> Vec<(usize, Result<Chunk>)> {
            // The 0.22 crate scales badly on one shared instance: each worker takes its own clone.
            let own = (!self.tokenizer.shares_across_threads()).then(|| self.tokenizer.clone());
            let tok = own.as_ref().unwrap_or(&self.tokenizer);
            let mut done = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(r) = plan.get(k) else { break };
                let one = self.chunk(tok, texts, r.clone(), opts);
                if one.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                done.push((k, one));
            }
            done
        };
        let (joined, spawn_error, cancelled) = std::thread::scope(|s| {
            // Each worker holds a sender and drops it when it ends (returning or unwinding); the
            // channel disconnects when the last one has.
            let (tx, rx) = channel::<()>();
            let mut handles = Vec::with_capacity(workers);
            let mut spawn_error = None;
            for w in 0..workers {
                let tx = tx.clone();
                let work = &work;
                match std::thread::Builder::new().name(format!("stoker-encode-{w}")).spawn_scoped(s, move || {
                    let _held = tx;
                    work()
                }) {
                    Ok(h) => handles.push(h),
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        spawn_error = Some(Error::Internal(format!("cannot start a tokenizer thread: {e}")));
                        break;
                    }
                }
            }
            drop(tx);
            let mut cancelled = false;
            while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(POLL_EVERY) {
                if !cancelled && !poll() {
                    cancelled = true;
                    stop.store(true, Ordering::Relaxed);
                }
            }
            let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            (joined, spawn_error, cancelled)
        });
        let mut slots: Vec<Option<Result<Chunk>>> = (0..plan.len()).map(|_| None).collect();
        for j in joined {
            match j {
                Ok(done) => done.into_iter().for_each(|(k, one)| slots[k] = Some(one)),
                Err(p) => {
                    let why = crate::shell::ordered::panic_message(p.as_ref());
                    return Err(Error::Internal(format!("panic in a tokenizer thread: {why} (please report this)")));
                }
            }
        }
        if let Some(e) = spawn_error {
            return Err(e);
        }
        // The first failure in input order among the chunks encoded.
        let mut out = Vec::with_capacity(plan.len());
        let mut missing = false;
        for slot in slots {
            match slot {
                Some(one) => out.push(one?),
                None => missing = true,
            }
        }
        if cancelled || missing {
            return Err(Error::Cancelled);
        }
        Ok(out)
    }

    /// The ids of `texts[range]` by `tok`, framed as `opts` asks.
    fn chunk<S: AsRef<str>>(
        &self,
        tok: &TextTokenizer,
        texts: &[S],
        range: Range<usize>,
        opts: &EncodeOptions,
    ) -> Result<Chunk> {
        let bytes: usize = texts[range.clone()].iter().map(|t| t.as_ref().len()).sum();
        // About 4 bytes of English per id: a guess that saves most regrowth.
        let mut ids = Vec::with_capacity(bytes / 4 + 2 * range.len());
        let mut lens = Vec::with_capacity(range.len());
        let (bos, eos) = (self.bos.filter(|_| opts.add_bos), self.eos.filter(|_| opts.add_eos));
        for i in range {
            let start = ids.len();
            ids.extend(bos);
            tok.encode_raw(texts[i].as_ref(), opts.add_special_tokens, &mut ids)
                .map_err(|why| Error::decode(&tok.origin, format!("cannot encode text {i} of the batch: {why}")))?;
            ids.extend(eos);
            lens.push((ids.len() - start) as u64);
        }
        Ok((ids, lens))
    }
}

/// `texts` cut into contiguous ranges of at least [`MIN_CHUNK_BYTES`] (the last aside), about
/// [`CHUNKS_PER_THREAD`] per thread of `threads`.
fn chunks<S: AsRef<str>>(texts: &[S], threads: usize) -> Vec<Range<usize>> {
    let total: usize = texts.iter().map(|t| t.as_ref().len() + TEXT_OVERHEAD).sum();
    let target = (total / threads.saturating_mul(CHUNKS_PER_THREAD)).max(MIN_CHUNK_BYTES);
    let (mut out, mut start, mut bytes) = (Vec::new(), 0, 0);
    for (i, t) in texts.iter().enumerate() {
        bytes += t.as_ref().len() + TEXT_OVERHEAD;
        if bytes >= target {
            out.push(start..i + 1);
            (start, bytes) = (i + 1, 0);
        }
    }
    if start < texts.len() {
        out.push(start..texts.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokenizer::tests::gpt2;

    fn encoder() -> TextEncoder {
        TextEncoder::new(TextTokenizer::from_file(&gpt2()).unwrap(), None, None).unwrap()
    }

    #[test]
    fn chunks_cover_the_batch_in_order() {
        let texts: Vec<String> = (0..5000).map(|i| "x".repeat(i % 97)).collect();
        for threads in [1, 2, 7, 64] {
            let plan = chunks(&texts, threads);
            assert_eq!(plan.first().map(|r| r.start), Some(0));
            assert_eq!(plan.last().map(|r| r.end), Some(texts.len()));
            assert!(plan.windows(2).all(|w| w[0].end == w[1].start && w[0].start < w[0].end));
        }
        assert!(chunks::<&str>(&[], 4).is_empty());
    }

    #[test]
    fn ids_do_not_depend_on_the_thread_count() {
        let e = encoder();
        let texts: Vec<String> =
            (0..3000).map(|i| format!("Hello world {i}, this is text number {i}. ").repeat(1 + i % 40)).collect();
        let opts = |threads| EncodeOptions { add_eos: true, threads: Some(threads), ..Default::default() };
        let one = e.encode_batch(&texts, &opts(1), &mut || true).unwrap();
        assert_eq!(one.offsets().len(), texts.len() + 1);
        let mut want = vec![];
        for t in &texts {
            e.tokenizer.encode_into(t, &mut want).unwrap();
            want.push(50256);
        }
        assert_eq!(one.to_vec(), want);
        for threads in [2, 4, 13] {
            let many = e.encode_batch(&texts, &opts(threads), &mut || true).unwrap();
            assert_eq!(many.offsets(), one.offsets());
            assert_eq!(many.to_vec(), want, "{threads} threads");
        }
    }

    #[test]
    fn a_poll_that_says_stop_cancels() {
        let e = encoder();
        let texts: Vec<String> = (0..2000).map(|_| "many words of text ".repeat(500)).collect();
        let opts = EncodeOptions { threads: Some(4), ..Default::default() };
        let mut asked = 0;
        let r = e.encode_batch(&texts, &opts, &mut || {
            asked += 1;
            false
        });
        // The workers may all be done before the first question.
        assert!(if asked > 0 { matches!(r, Err(Error::Cancelled)) } else { r.is_ok() }, "{asked} {:?}", r.err());
        // Alone, the calling thread asks between chunks.
        let opts = EncodeOptions { threads: Some(1), ..Default::default() };
        assert!(matches!(e.encode_batch(&texts, &opts, &mut || false), Err(Error::Cancelled)));
    }

    #[test]
    fn bos_without_a_bos_token_is_a_config_error() {
        let mut e = encoder();
        e.bos = None;
        let opts = EncodeOptions { add_bos: true, ..Default::default() };
        let err = e.encode_batch(&["a"], &opts, &mut || true).unwrap_err().to_string();
        assert!(err.contains("`bos_token`"), "{err}");
    }
}
