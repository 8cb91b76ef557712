//! The packer thread: tokenized chunks back in order, packed into rows ([`crate::tokens::pack`]),
//! a batch per pooled slot.

use super::config::PackMode;
use super::shared::Tokens;
use super::slot::TokenSlot;
use super::tokenize::Tokenized;
use crate::error::Error;
use crate::shell::ordered::{send_or_cancel, take_free};
use crate::tokens::pack::{BestFit, Concat, Doc, Resume, RowInfo, RowOut};
use crossbeam_channel::{Receiver, Sender};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The packer thread: chunks back in order, packed into rows, a batch per pooled slot.
pub(super) fn pack_batches(
    sh: &Tokens,
    (from, first_batch, mut limit): (Resume, u64, Option<u64>),
    results: &Receiver<(u64, Tokenized)>,
    credits: &Sender<()>,
    done: &Sender<Arc<TokenSlot>>,
    cancel: &AtomicBool,
) {
    let cfg = &sh.config;
    let (bs, len) = (cfg.batch_size, cfg.seq_len);
    let mut early: BTreeMap<u64, Tokenized> = BTreeMap::new();
    let mut next_seq = 0u64;
    let mut ready: std::collections::VecDeque<(Doc, Option<Error>)> = Default::default();
    let failures: Mutex<Vec<Error>> = Mutex::new(Vec::new());
    // Nanoseconds the packer waited for tokenized documents (not counted as packing).
    let waited = AtomicU64::new(0);
    let mut pull = || -> Option<Doc> {
        loop {
            if let Some((d, e)) = ready.pop_front() {
                sh.stats.documents.fetch_add(1, Ordering::Relaxed);
                if let Some(e) = e {
                    sh.stats.failed.fetch_add(1, Ordering::Relaxed);
                    failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                }
                return Some(d);
            }
            if let Some(c) = early.remove(&next_seq) {
                next_seq += 1;
                let _ = credits.try_send(());
                ready.extend(c);
                continue;
            }
            let t = Instant::now();
            let got = take_free(results, cancel);
            waited.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let (seq, c) = got?;
            early.insert(seq, c);
        }
    };
    enum Packer {
        Concat(Concat),
        BestFit(BestFit),
    }
    let mut packer = match cfg.pack {
        PackMode::Concat => Packer::Concat(Concat::new(from)),
        PackMode::BestFit => Packer::BestFit(BestFit::new(cfg.pack_window, sh.pad, from)),
    };
    let mut segments: Vec<u32> = Vec::with_capacity(len + 1);
    let mut batch = first_batch as usize;
    loop {
        let t0 = Instant::now();
        let Some(slot) = take_free(&sh.pool.free_rx, cancel) else { return };
        sh.telemetry.buffers.record_wait(t0.elapsed());
        let t0 = Instant::now();
        let mut rows = 0;
        let mut cu_len = 1;
        let mut ended = false;
        // SAFETY: the packer is this slot's only user until it is sent.
        unsafe { TokenSlot::ints_mut(&slot.cu, 0, 1)[0] = 0 };
        let mut info_sum = RowInfo::default();
        while rows < bs {
            if limit == Some(0) {
                ended = true;
                break;
            }
            segments.clear();
            let off = rows * len;
            // SAFETY: rows `rows` of the slot's buffers belong to the packer alone.
            let out = unsafe {
                RowOut {
                    input: TokenSlot::ints_mut(&slot.input, off, len),
                    labels: TokenSlot::ints_mut(&slot.labels, off, len),
                    positions: TokenSlot::ints_mut(&slot.positions, off, len),
                    segments: &mut segments,
                }
            };
            let r = match &mut packer {
                Packer::Concat(p) => p.row(&mut pull, out),
                Packer::BestFit(p) => p.row(&mut pull, out),
            };
            match r {
                Ok(info) => {
                    // SAFETY: as above; the row's segments fit: at most seq_len + 1 per row.
                    let cu = unsafe { TokenSlot::ints_mut(&slot.cu, cu_len, segments.len()) };
                    let mut acc = (rows * len) as i32;
                    for (c, &s) in cu.iter_mut().zip(&segments) {
                        acc += s as i32;
                        *c = acc;
                    }
                    cu_len += segments.len();
                    info_sum.tokens += info.tokens;
                    info_sum.pad += info.pad;
                    info_sum.split += info.split;
                    rows += 1;
                    limit = limit.map(|l| l - 1);
                }
                Err(tail) => {
                    sh.stats.dropped.fetch_add(tail as u64, Ordering::Relaxed);
                    ended = true;
                    break;
                }
            }
        }
        if cancel.load(Ordering::Acquire) {
            sh.pool.give_back(slot);
            return;
        }
        let keep = rows > 0 && !(ended && rows < bs && cfg.drop_last);
        if !keep {
            if rows > 0 {
                sh.stats.dropped.fetch_add((info_sum.tokens) as u64, Ordering::Relaxed);
            }
            let left = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
            if left.is_empty() {
                sh.pool.give_back(slot);
                return;
            }
            // Failed documents after the last row still count against the failure budget (and
            // raise under on_bad_document='raise'): an empty slot carries them to the pass.
            slot.batch.store(batch, Ordering::Relaxed);
            slot.rows.store(0, Ordering::Release);
            slot.cu_len.store(1, Ordering::Release);
            slot.after.lock().unwrap_or_else(|p| p.into_inner()).1 = left;
            if !send_or_cancel(done, slot.clone(), cancel) {
                sh.pool.give_back(slot);
            }
            return;
        }
        sh.stats.tokens.fetch_add(info_sum.tokens as u64, Ordering::Relaxed);
        sh.stats.padding.fetch_add(info_sum.pad as u64, Ordering::Relaxed);
        sh.stats.split.fetch_add(info_sum.split as u64, Ordering::Relaxed);
        sh.stats.rows.fetch_add(rows as u64, Ordering::Relaxed);
        let resume = match &packer {
            Packer::Concat(p) => p.resume(),
            Packer::BestFit(p) => p.resume(),
        };
        slot.batch.store(batch, Ordering::Relaxed);
        slot.rows.store(rows, Ordering::Release);
        slot.cu_len.store(cu_len, Ordering::Release);
        {
            let mut a = slot.after.lock().unwrap_or_else(|p| p.into_inner());
            a.0 = resume;
            a.1 = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
        }
        let idle = waited.swap(0, Ordering::Relaxed);
        sh.stats.pack_ns.fetch_add((t0.elapsed().as_nanos() as u64).saturating_sub(idle), Ordering::Relaxed);
        sh.span("pack", t0, &[("batch", batch as f64), ("rows", rows as f64), ("waited_s", idle as f64 / 1e9)]);
        if !send_or_cancel(done, slot.clone(), cancel) {
            sh.pool.give_back(slot);
            return;
        }
        batch += 1;
        if ended {
            return;
        }
    }
}
