//! [`TokenMix`]: a weighted mixture of token sources, row by row. Each row of a batch comes from
//! one source, chosen by the mixture's [`Schedule`] (exact shares at every prefix: the token
//! shares are those of rows, within one row of the weights); every source is a token loader of
//! its own (its files, its text key) with its own threads, read from the start of a new pass at
//! each mixture epoch (pass `epoch << 32`, then the next ones: `repeat`). The mixer thread takes
//! each source's batches of rows in order and copies the rows the schedule asks for into the
//! mixture's batch, with the row's source in `sources`.
//!
//! A source that stops the mixture (`exhausted: stop`) is read one pass per epoch: the epoch
//! ends on this rank when that pass has no row left (the rows of a text are known only once
//! tokenized, so the ranks end apart unless they agree: Python's `TokenLoader` does, at each
//! step, as it does over raw text), or at `epoch_items` rows when given first.
//!
//! Each source's loader hands over one row at a time (batches of one row), so its state after
//! each row is exact. The mixture's state is its epoch and batch and each source's loader state
//! after the last row taken ([`MixState`]): a resume loads each source there and continues
//! exactly; the states of every rank of a run continue it on another number of ranks, each
//! source through its own loader's elastic resume ([`super::mix_state`]).

use super::batch::TokenBatch;
use super::config::TokenConfig;
use super::iter::{TokenIter, TokenLoader};
use super::mix_state::MixPosition;
use super::slot::{region_capacities, token_pool, TokenSlot};
use super::state::TokenState;
use crate::error::{Error, Result};
use crate::observe::report::{keeps_up, Report, Section, StageReport};
use crate::observe::telemetry::Telemetry;
use crate::shell::buffer::HostAllocator;
use crate::shell::grow::{Lease, SlotPool};
use crate::shell::kind::{Delivery, Iter, Kind, Loader, PassPlan};
use crate::shell::mix::{MixReport, MixSpec, Schedule, Tally, Weights};
use crate::shell::ordered::{send_or_cancel, take_free, Run};
use crate::shell::pass::{FailureBudget, Next, ProducerError};
use crate::tokens::tokenizer::TextTokenizer;
use crate::values::check_prefetch;
use crossbeam_channel::Sender;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A weighted mixture of token sources, row by row.
pub struct TokenMix {
    /// The mixture's configuration (the batch shape, seed, ranks).
    pub(super) config: TokenConfig,
    /// The mixture's batches.
    pool: SlotPool<Arc<TokenSlot>>,
    /// The consumer's counters (waits and steps), which the shell's pass records.
    telemetry: Arc<Telemetry>,
    /// One loader per source.
    pub(super) subs: Vec<TokenLoader>,
    pub(super) spec: MixSpec,
    schedule: Schedule,
    /// Rows per rank in an epoch (`u64::MAX`: until a `stop` source runs out).
    rows: u64,
    /// The sources' states after each batch in flight, by batch number.
    after: Mutex<BTreeMap<usize, Vec<Option<TokenState>>>>,
    /// Rows delivered per source, and each source's work.
    tally: Tally,
}

/// A loader of a token mixture.
pub type TokenMixLoader = Loader<TokenMix>;

/// One pass over (the rest of) a mixture's epoch.
pub type TokenMixIter = Iter<TokenMix>;

impl Loader<TokenMix> {
    /// A mixture of the sources of `config.mixture` (each opened as a token loader with this
    /// config and its own text key), its batches from `alloc`.
    pub fn new_in(
        tokenizer: Option<TextTokenizer>,
        config: TokenConfig,
        alloc: Arc<dyn HostAllocator>,
    ) -> Result<Self> {
        let mix = config.mixture.clone().ok_or_else(|| Error::Internal("a token mixture without a mixture".into()))?;
        let rows = match mix.spec.epoch_items {
            None => u64::MAX,
            Some(items) => rows_per_rank(&config, items, config.world_size),
        };
        if rows == 0 {
            return Err(Error::config(
                "epoch_items",
                format!("{} rows over {} ranks leave no batch", mix.spec.epoch_items.unwrap_or(0), config.world_size),
            ));
        }
        let weights = Weights::new(&mix.spec.parts.iter().map(|p| p.weight).collect::<Vec<_>>())?;
        let mut subs = Vec::with_capacity(mix.sources.len());
        for (d, (part, (data, key))) in mix.spec.parts.iter().zip(&mix.sources).enumerate() {
            let paths = super::config::expand_paths(data)
                .map_err(|e| Error::config("mixture", format!("mixture source '{}': {e}", part.name)))?;
            let mut c = config.clone();
            c.mixture = None;
            // A source that stops the epoch is read one pass per epoch; the others repeat.
            c.infinite = part.exhausted == crate::shell::mix::Exhausted::Repeat;
            c.batch_size = 1;
            c.prefetch = config.batch_size.clamp(2, 256);
            c.drop_last = false;
            c.trace = None;
            // The sources share the threads (or the CPU budget) by their weights: a source's
            // tokenizing takes its share of the rows' work.
            let share = weights.share(d);
            c.threads = config.threads.map(|t| ((t as f64 * share).round() as usize).max(1));
            c.cpu_budget = config.cpu_budget.map(|b| (b * share).max(1.0));
            if let Some(k) = key {
                c.text_key = k.clone();
            }
            let sub = TokenLoader::new(&paths, tokenizer.clone(), c)
                .map_err(|e| Error::config("mixture", format!("mixture source '{}': {e}", part.name)))?;
            subs.push(sub);
        }
        check_prefetch(config.prefetch)?;
        let pool = token_pool(&config, alloc)?;
        let tally = Tally::new(subs.len());
        Ok(Loader::of(TokenMix {
            config,
            pool,
            telemetry: Arc::default(),
            subs,
            spec: mix.spec,
            schedule: Schedule::new(weights),
            rows,
            after: Mutex::default(),
            tally,
        }))
    }

    /// The mixture's configuration.
    pub fn config(&self) -> &TokenConfig {
        &self.kind().config
    }

    /// `(bos, eos, pad)` ids: the sources' (one tokenizer and one config for all).
    pub fn special_ids(&self) -> (Option<u32>, Option<u32>, u32) {
        self.kind().subs[0].special_ids()
    }

    /// Each source's loader.
    pub fn sources(&self) -> &[TokenLoader] {
        &self.kind().subs
    }

    /// The mixture's configuration.
    pub fn spec(&self) -> &MixSpec {
        &self.kind().spec
    }

    /// The weights as the schedule has them (each source's exact share).
    pub fn weights(&self) -> &Weights {
        self.kind().schedule.weights()
    }

    /// Tokenizer threads of all sources.
    pub fn threads(&self) -> usize {
        self.kind().subs.iter().map(|s| s.threads()).sum()
    }

    /// Batches per epoch on this rank (of the current epoch: one continued from another
    /// number of ranks has its own count); `None` when a `stop` source ends the epoch first
    /// (known only once its pass is tokenized).
    pub fn len(&self) -> Option<usize> {
        if self.kind().stops() {
            return None;
        }
        let bs = self.kind().config.batch_size as u64;
        Some(self.epochs().position().end().unwrap_or(self.kind().rows).div_ceil(bs) as usize)
    }

    /// Whether an epoch has no batch (never, for a built mixture).
    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// Whether a source stops the epoch when its pass runs out (`exhausted: stop`).
    pub fn stops(&self) -> bool {
        self.kind().stops()
    }
}

/// Each of `world` ranks' share of `rows` rows over all ranks, cut to whole batches with
/// `drop_last`.
pub(super) fn rows_per_rank(c: &TokenConfig, rows: u64, world: usize) -> u64 {
    let per_rank = rows / world as u64;
    if c.drop_last {
        per_rank / c.batch_size as u64 * c.batch_size as u64
    } else {
        per_rank
    }
}

impl Kind for TokenMix {
    type Position = MixPosition;
    type Slot = Arc<TokenSlot>;
    /// An error that ended the mixer thread (a source failed), returned once the batches
    /// before it are delivered.
    type Hooks = ProducerError;
    type Batch = TokenBatch;
    type Section = MixSection;

    fn pool(&self) -> &SlotPool<Arc<TokenSlot>> {
        &self.pool
    }

    fn start(
        self: &Arc<Self>,
        position: &Arc<MixPosition>,
        run: &Arc<Run<Arc<TokenSlot>>>,
        done_tx: Sender<Arc<TokenSlot>>,
    ) -> Result<PassPlan<Self>> {
        let seed = self.config.seed;
        let st = position.start(seed, self.subs.len());
        let (epoch, first_batch, end) = (st.epoch, st.next_batch, st.end.unwrap_or(self.rows));
        let offset = st.offset;
        let cancel = run.cancel_flag();
        let failed = ProducerError::default();
        self.after.lock().unwrap_or_else(|p| p.into_inner()).clear();
        {
            let (mx, cancel, failed, run2) = (self.clone(), cancel.clone(), failed.clone(), Arc::downgrade(run));
            run.spawn("stoker-mix".into(), move || {
                if let Err(e) = mix_rows(&mx, (epoch, first_batch, offset, end, st.sources), &done_tx, &cancel) {
                    failed.set(e);
                }
                if let Some(r) = run2.upgrade() {
                    r.finish();
                }
            })?;
        }
        let budget = FailureBudget::new(u64::MAX, false);
        let batches = (!self.stops()).then(|| end.div_ceil(self.config.batch_size as u64) as usize);
        Ok(PassPlan { epoch, batches: (first_batch as usize, batches), budget, hooks: failed, retire: None })
    }

    fn batch(self: &Arc<Self>, slot: Lease<Arc<TokenSlot>>, position: &MixPosition, _: Delivery) -> TokenBatch {
        let b = slot.batch.load(Ordering::Relaxed);
        let after = self.after.lock().unwrap_or_else(|p| p.into_inner()).remove(&b).unwrap_or_default();
        // SAFETY: a delivered slot is complete: nobody writes it until it returns to the pool.
        let sources = unsafe { TokenSlot::ints(&slot.sources, slot.rows.load(Ordering::Acquire)) };
        for &d in sources {
            self.tally.delivered(d as usize, 1);
        }
        position.advance(after, self.config.seed);
        TokenBatch { slot, seq_len: self.config.seq_len }
    }

    fn regions(&self) -> Vec<usize> {
        region_capacities(self.config.batch_size, self.config.seq_len).to_vec()
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// A stage per source (its loader's reading, tokenizing and packing, over its rows), each
    /// source's rows against its share with its loader's counters, and the verdict: the consumer
    /// when it hardly waited, else the source whose rows take the most of the sources' time
    /// (what starves the mixture).
    fn report(&self) -> Report<MixSection> {
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (d, sub) in self.subs.iter().enumerate() {
            let st = sub.stats();
            let busy = secs(&st.read_ns) + secs(&st.pack_ns) + secs(&st.tokenize_ns) / sub.threads().max(1) as u64;
            self.tally.set_work(d, busy, secs(&st.rows));
        }
        let mixture = self.tally.report(&self.spec, self.schedule.weights());
        let counts = self.subs.iter().map(|s| s.stats().counts(0.0)).collect();
        let stages = |wall: f64| {
            mixture
                .sources
                .iter()
                .zip(&self.subs)
                .map(|(s, sub)| StageReport {
                    name: format!("source {}", s.name),
                    threads: sub.threads(),
                    items: s.items,
                    busy_seconds: s.busy_seconds,
                    wait_seconds: 0.0,
                    utilization: if wall > 0.0 { s.busy_seconds / wall } else { 0.0 },
                })
                .collect()
        };
        let verdict = mixture.starved_by();
        let mut r = self.telemetry().report(
            stages,
            self.subs.iter().map(|s| s.threads()).sum(),
            MixSection { mixture: mixture.clone(), counts },
        );
        if r.samples > 0 {
            r.bottleneck = keeps_up(r.starvation_steady).or(verdict);
        }
        r
    }
}

impl TokenMix {
    /// Whether a source stops the epoch when its pass runs out.
    fn stops(&self) -> bool {
        self.spec.parts.iter().any(|p| p.exhausted == crate::shell::mix::Exhausted::Stop)
    }
}

/// What a token mixture adds to its report: each source's rows against its share, and its
/// loader's counters.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MixSection {
    /// The sources' rows, shares and time per row, in the order of their ids.
    pub mixture: MixReport,
    /// Each source's loader's counters (documents, tokens, padding, seconds per stage).
    pub counts: Vec<super::stats::TokenCounts>,
}

impl Section for MixSection {
    fn items(&self) -> &'static str {
        "rows"
    }

    fn text(&self) -> String {
        self.mixture.text("rows")
    }
}

/// A source being read: its iteration, the row being taken (a batch of one row), and its
/// loader's state after it.
struct Reading {
    iter: Option<TokenIter>,
    row: Option<TokenBatch>,
    at: Option<TokenState>,
}

/// The mixer thread: rows of the sources, as the schedule says, into the mixture's batches from
/// `first_batch` of `epoch` on, up to `end` rows of this rank; the epoch's first row is the
/// schedule's position `offset`.
fn mix_rows(
    mx: &Arc<TokenMix>,
    (epoch, first_batch, offset, end, at): (u64, u64, u64, u64, Vec<Option<TokenState>>),
    done: &Sender<Arc<TokenSlot>>,
    cancel: &AtomicBool,
) -> Result<()> {
    let (bs, len) = (mx.config.batch_size, mx.config.seq_len);
    let mut reading = Vec::with_capacity(mx.subs.len());
    for (sub, at) in mx.subs.iter().zip(at) {
        match &at {
            Some(st) => sub.load_state(st.clone())?,
            None => sub.set_epoch(epoch << 32),
        }
        reading.push(Reading { iter: None, row: None, at });
    }
    let mut m = first_batch * bs as u64;
    let mut batch = first_batch as usize;
    let mut ended = false;
    while m < end && !ended {
        let Some(slot) = take_free(&mx.pool.free_rx, cancel) else { return Ok(()) };
        let mut rows = 0;
        let mut cu_len = 1;
        // SAFETY: the mixer is this slot's only user until it is sent.
        unsafe { TokenSlot::ints_mut(&slot.cu, 0, 1)[0] = 0 };
        while rows < bs && m < end {
            let d = mx.schedule.source(offset + m);
            let b = match next_row(mx, &mut reading[d], d, cancel)? {
                Row::Got(b) => b,
                Row::Cancelled => {
                    mx.pool.give_back(slot);
                    return Ok(());
                }
                Row::Ended => {
                    ended = true;
                    break;
                }
            };
            let off = rows * len;
            // SAFETY: row `rows` of the slot belongs to the mixer alone.
            unsafe {
                TokenSlot::ints_mut(&slot.input, off, len).copy_from_slice(b.input_ids());
                TokenSlot::ints_mut(&slot.labels, off, len).copy_from_slice(b.labels());
                TokenSlot::ints_mut(&slot.positions, off, len).copy_from_slice(b.position_ids());
                TokenSlot::ints_mut(&slot.sources, rows, 1)[0] = d as i32;
            }
            // The row's segment ends, moved to row `rows` of this batch.
            let cu = &b.cu_seqlens()[1..];
            // SAFETY: as above; a row has at most seq_len segments.
            let out = unsafe { TokenSlot::ints_mut(&slot.cu, cu_len, cu.len()) };
            for (o, &c) in out.iter_mut().zip(cu) {
                *o = c + off as i32;
            }
            cu_len += cu.len();
            rows += 1;
            m += 1;
        }
        // A `stop` source ran out: the rows before it are the epoch's last batch (unless
        // `drop_last` drops a short one).
        if rows == 0 || (ended && rows < bs && mx.config.drop_last) {
            mx.pool.give_back(slot);
            return Ok(());
        }
        slot.batch.store(batch, Ordering::Relaxed);
        slot.rows.store(rows, Ordering::Release);
        slot.cu_len.store(cu_len, Ordering::Release);
        let after = reading.iter().map(|r| r.at.clone()).collect();
        mx.after.lock().unwrap_or_else(|p| p.into_inner()).insert(batch, after);
        if !send_or_cancel(done, slot.clone(), cancel) {
            mx.pool.give_back(slot);
            return Ok(());
        }
        batch += 1;
    }
    Ok(())
}

/// What a source gave the mixer.
enum Row<'a> {
    /// Its next row.
    Got(&'a TokenBatch),
    /// Nothing: the pass is cancelled.
    Cancelled,
    /// Nothing: its pass ran out, and it stops the epoch.
    Ended,
}

/// The next row of source `d` (a batch of one row from its loader), and its loader's state
/// after it.
fn next_row<'a>(mx: &TokenMix, r: &'a mut Reading, d: usize, cancel: &AtomicBool) -> Result<Row<'a>> {
    r.row = None; // the previous row goes back to its loader's pool
    let sub = &mx.subs[d];
    if r.iter.is_none() {
        r.iter = Some(sub.iter()?);
    }
    let it = r.iter.as_mut().expect("just set");
    let got = loop {
        match it.next_timeout(Duration::from_millis(50)) {
            Next::Item(b) => break b,
            Next::NotYet if cancel.load(Ordering::Acquire) => return Ok(Row::Cancelled),
            Next::NotYet => {}
            Next::End if mx.spec.parts[d].exhausted == crate::shell::mix::Exhausted::Stop => return Ok(Row::Ended),
            Next::End => {
                return Err(Error::Dataset(format!(
                    "mixture source '{}' has no rows for rank {}",
                    mx.spec.parts[d].name, mx.config.rank
                )))
            }
        }
    };
    let b = got.map_err(|e| Error::Dataset(format!("mixture source '{}': {e}", mx.spec.parts[d].name)))?;
    r.at = Some(sub.state());
    Ok(Row::Got(r.row.insert(b)))
}
