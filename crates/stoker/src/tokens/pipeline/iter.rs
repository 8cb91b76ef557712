//! The token kind on the shell's [`Loader`]: how a pass starts (the reader, tokenizer and
//! packer threads over a [`Run`]) and what a delivered slot becomes. [`TokenIter`] is the
//! shell's [`Iter`] of this kind.

use super::batch::TokenBatch;
use super::batcher::pack_batches;
use super::shared::Tokens;
use super::slot::{region_capacities, TokenSlot};
use super::state::TokenPosition;
use super::stats::{TokenReport, TokenSection, TokenizerReport};
use super::tokenize::spawn_tokenizing;
use crate::error::Result;
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::Tracer;
use crate::shell::grow::{Lease, SlotPool};
use crate::shell::kind::{Delivery, Iter, Kind, Loader, PassPlan};
use crate::shell::ordered::Run;
use crate::shell::pass::FailureBudget;
use crossbeam_channel::{bounded, Sender};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Batches of packed token rows from text or token files.
pub type TokenLoader = Loader<Tokens>;

/// One pass over (the rest of) an epoch, or for ever with `infinite`.
pub type TokenIter = Iter<Tokens>;

impl Kind for Tokens {
    type Position = TokenPosition;
    type Slot = Arc<TokenSlot>;
    /// The producer decides the end; nothing else.
    type Hooks = ();
    type Batch = TokenBatch;
    type Section = TokenSection;

    /// Starts the reader, tokenizer and packer threads from the position: the current epoch
    /// from its first batch, or a restored position.
    fn pool(&self) -> &SlotPool<Arc<TokenSlot>> {
        &self.pool
    }

    fn start(
        self: &Arc<Self>,
        position: &Arc<TokenPosition>,
        run: &Arc<Run<Arc<TokenSlot>>>,
        done_tx: Sender<Arc<TokenSlot>>,
    ) -> Result<PassPlan<Self>> {
        let (from, first_batch, elastic) = position.start();
        self.stats.started.get_or_init(Instant::now);
        let sh = self.clone();
        let cancel = run.cancel_flag();
        let credits = sh.threads * 4 + 4;
        let (credit_tx, credit_rx) = bounded::<()>(credits);
        for _ in 0..credits {
            credit_tx.send(()).expect("room");
        }
        let res_rx = spawn_tokenizing(run, &sh, (from, elastic.clone()), credit_rx)?;
        {
            let (sh, cancel, run2) = (sh.clone(), cancel.clone(), Arc::downgrade(run));
            // Token files: every rank stops at the same row count (the rows before a resume
            // point are whole batches).
            let limit = sh
                .rows
                .rows_per_rank(&sh.source, &sh.config, from.epoch, elastic.as_ref())
                .map(|rows| rows.saturating_sub(first_batch * sh.config.batch_size as u64));
            run.spawn("stoker-pack".into(), move || {
                pack_batches(&sh, (from, first_batch, limit), &res_rx, &credit_tx, &done_tx, &cancel);
                if let Some(r) = run2.upgrade() {
                    r.finish();
                }
            })?;
        }
        let budget = FailureBudget::new(sh.config.max_failures, sh.config.raise);
        // The consumer's waits and steps, and their trace, are the shell's (as for every kind).
        Ok(PassPlan { epoch: from.epoch, batches: (first_batch as usize, None), budget, hooks: (), retire: None })
    }

    /// Tells the tuner the consumer's load and advances the position to the slot's resume
    /// point.
    fn batch(self: &Arc<Self>, slot: Lease<Arc<TokenSlot>>, position: &TokenPosition, _: Delivery) -> TokenBatch {
        let s = &self.stats;
        let wait = self.telemetry.consumer.wait_ns();
        let since = s.started.get().map_or(0, |t| t.elapsed().as_nanos() as u64);
        self.tuner.on_batch_load(crate::observe::tune::Load {
            consumer_wait_ns: wait,
            consumer_busy_ns: since.saturating_sub(wait),
            worker_busy_ns: s.tokenize_ns.load(Ordering::Relaxed),
        });
        let at = slot.after.lock().unwrap_or_else(|p| p.into_inner()).0;
        position.advance(at);
        TokenBatch { slot, seq_len: self.config.seq_len }
    }

    /// `input_ids`, `labels`, `position_ids` (`batch_size x seq_len` int32 each),
    /// `cu_seqlens`, `sources`.
    fn regions(&self) -> Vec<usize> {
        region_capacities(self.config.batch_size, self.config.seq_len).to_vec()
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// The token stages (read, tokenize on the threads now active, pack), the counters with
    /// the `tokenizer` (its file, the `engine` that runs it: stoker's byte-level BPE or
    /// `tokenizers`, and why) and the token cache, the tuning, and the token verdict over the
    /// passes' wall time (`None` before the first iteration).
    fn report(&self) -> TokenReport {
        let threads = self.tuner.threads_active();
        let consumer_wait = self.telemetry.consumer.wait_ns() as f64 / 1e9;
        let tokenizer = self.tokenizer.as_ref().map(|t| {
            let (engine, why) = t.engine();
            TokenizerReport { path: t.origin.clone(), engine, why: why.to_string() }
        });
        let section = TokenSection {
            counts: self.stats.counts(consumer_wait),
            tokenizer,
            cache: self.autocache.as_ref().map(|c| c.report()),
        };
        let mut r = self.telemetry.report(|wall| self.stats.stages(wall, threads), threads, section);
        if self.stats.started.get().is_some() {
            let tokenizes = self.tokenizer.is_some();
            r.bottleneck = Some(self.stats.bottleneck(r.wall_seconds, threads, tokenizes, consumer_wait));
        }
        r.tuning = Some(self.tuner.report());
        r
    }

    fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.tracer.as_ref()
    }

    fn describe(&self, index: u32) -> String {
        format!("document {index}")
    }
}
