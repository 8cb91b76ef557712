//! The array kind: batches of rows gathered from [`Column`]s by the sampler's indices, with
//! parallel row copies straight into pooled buffers, on the shell's [`Loader`].
//!
//! This is the cure for `TensorDataset` + `DataLoader`: no per-item Python indexing, no
//! collation, no whole dataset copied into RAM (only the rows a batch needs are read from a
//! `.npy` file). Same sampler, resume state and sharding as the image loaders.

use super::column::Column;
use super::report::{verdict, ArrayCounters, ArrayReport, ArraySection};
use crate::error::{Error, Result};
use crate::observe::telemetry::Telemetry;
use crate::shell::buffer::{BufferPool, HeapAllocator, HostAllocator, RawBuf};
use crate::shell::grow::MakeSlot;
use crate::shell::grow::{Lease, SlotPool};
use crate::shell::kind::{Delivery, Iter, Kind, Loader, PassPlan};
use crate::shell::ordered::{take_free, Run};
use crate::shell::pass::{FailureBudget, PassHooks, PassSlot};
use crate::shell::sampled::SamplerKind;
use crate::shell::sampler::{Fingerprint, Position, Sampler, SamplerSpec, Start};
use crate::values::{batch_bytes, check_prefetch, check_threads};
use crossbeam_channel::{bounded, Sender};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Configuration of an [`ArrayLoader`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct ArrayConfig {
    /// Order, sharding and batch size.
    pub sampler: SamplerSpec,
    /// Copy threads (`None`: the CPU allowance).
    pub threads: Option<usize>,
    /// Finished batches that may wait ahead of the consumer.
    pub prefetch: usize,
    /// Cap on the bytes of all batch buffers together.
    pub memory_limit: Option<u64>,
}

/// One pooled batch buffer of the array kind: a buffer per column.
pub struct ArraySlot {
    bufs: Vec<RawBuf>,
    indices: std::sync::RwLock<Vec<u32>>,
    batch: AtomicUsize,
    len: AtomicUsize,
    remaining: AtomicUsize,
    /// The first failed read of this batch (the task with the lowest first row wins).
    error: Mutex<Option<(usize, Error)>>,
}

/// The array kind: the columns, the sampler, the copy threads and the pool, shared by a
/// loader and the threads of its passes.
pub struct Arrays {
    columns: Vec<Column>,
    sampler: Sampler,
    threads: usize,
    pool: SlotPool<Arc<ArraySlot>>,
    /// The shell's counters (buffer wait, consumer, samples, device, transfer).
    telemetry: Arc<Telemetry>,
    /// The copy threads' counters.
    counters: ArrayCounters,
    /// A mixture's rows delivered per source, when the rows are a mixture's.
    tally: Option<crate::shell::mix::Tally>,
}

impl PassSlot for ArraySlot {
    fn batch(&self) -> usize {
        self.batch.load(Ordering::Relaxed)
    }

    fn samples(&self) -> Option<usize> {
        Some(self.len.load(Ordering::Acquire))
    }

    fn take_failures(&self) -> Vec<Error> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).take().map(|(_, e)| e).into_iter().collect()
    }
}

/// The array kind's part of a pass: the position advances.
pub struct ArrayHooks {
    position: Arc<Position>,
}

impl PassHooks for ArrayHooks {
    fn advanced(&self, next: usize) {
        self.position.advance(next);
    }
}

/// Batches of rows from one or more equally long arrays.
pub type ArrayLoader = Loader<Arrays>;

/// One pass over (the rest of) an epoch.
pub type ArrayIter = Iter<Arrays>;

impl std::fmt::Debug for Arrays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrays").field("columns", &self.columns).finish()
    }
}

/// One batch: a view per column of a pool buffer, returned to the pool on drop.
pub struct ArrayBatch {
    slot: Lease<Arc<ArraySlot>>,
    shared: Arc<Arrays>,
}

impl ArrayBatch {
    /// Rows in this batch.
    pub fn len(&self) -> usize {
        self.slot.len.load(Ordering::Acquire)
    }

    /// Whether the batch is empty (never, for delivered batches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch number within the epoch.
    pub fn index(&self) -> usize {
        self.slot.batch.load(Ordering::Relaxed)
    }

    /// Number of columns.
    pub fn num_columns(&self) -> usize {
        self.shared.columns.len()
    }

    /// Column `c`'s rows, back to back.
    pub fn column(&self, c: usize) -> &[u8] {
        let slot = &self.slot;
        let n = self.len() * self.shared.columns[c].row_bytes();
        // SAFETY: the batch is complete, so no worker writes its buffers any more.
        unsafe { slot.bufs[c].slice(n) }
    }

    /// Address of column `c`'s first row.
    pub fn column_ptr(&self, c: usize) -> *const u8 {
        self.slot.bufs[c].as_ptr()
    }

    /// Dataset indices of the rows.
    pub fn indices(&self) -> Vec<u32> {
        self.slot.indices.read().expect("indices lock").clone()
    }
}

impl Loader<Arrays> {
    /// Validates the columns (equal row counts) and allocates the pool on the heap.
    pub fn new(columns: Vec<Column>, config: ArrayConfig) -> Result<Self> {
        Self::new_in(columns, config, Arc::new(HeapAllocator))
    }

    /// Like [`ArrayLoader::new`], with the batch buffers taken from `alloc` (e.g. pinned memory).
    pub fn new_in(columns: Vec<Column>, config: ArrayConfig, alloc: Arc<dyn HostAllocator>) -> Result<Self> {
        Self::build(columns, None, config, alloc)
    }

    /// A loader over a weighted mixture (`config.sampler.mixture`) of `sources`, each the same
    /// columns (count and row size; an error names the source and column that differ), batched
    /// in the mixture's order.
    pub fn mixture_in(sources: Vec<Vec<Column>>, config: ArrayConfig, alloc: Arc<dyn HostAllocator>) -> Result<Self> {
        let n = sources.first().map_or(0, Vec::len);
        if let Some((d, s)) = sources.iter().enumerate().find(|(_, s)| s.len() != n) {
            return Err(Error::config("mixture", format!("source {d} has {} arrays, source 0 has {n}", s.len())));
        }
        let lens: Vec<usize> = sources.iter().map(|s| s.first().map_or(0, Column::rows)).collect();
        let mut by_column: Vec<Vec<Column>> = (0..n).map(|_| Vec::with_capacity(sources.len())).collect();
        for (d, source) in sources.into_iter().enumerate() {
            for (k, c) in source.into_iter().enumerate() {
                if c.rows() != lens[d] {
                    return Err(Error::config(
                        "mixture",
                        format!("source {d}: array {k} has {} rows, its array 0 has {}", c.rows(), lens[d]),
                    ));
                }
                by_column[k].push(c);
            }
        }
        let columns =
            by_column.into_iter().enumerate().map(|(k, parts)| Column::concat(parts, k)).collect::<Result<_>>()?;
        Self::build(columns, Some(lens), config, alloc)
    }

    fn build(
        columns: Vec<Column>,
        parts: Option<Vec<usize>>,
        config: ArrayConfig,
        alloc: Arc<dyn HostAllocator>,
    ) -> Result<Self> {
        let rows =
            columns.first().map(|c| c.rows()).ok_or_else(|| Error::config("arrays", "give at least one array"))?;
        if let Some((k, c)) = columns.iter().enumerate().find(|(_, c)| c.rows() != rows) {
            return Err(Error::config(
                "arrays",
                format!("array {k} has {} rows, array 0 has {rows}: all arrays need the same length", c.rows()),
            ));
        }
        if rows == 0 {
            return Err(Error::Dataset("the arrays have no rows".into()));
        }
        let sampler = Sampler::new(rows, config.sampler.clone())?.with_parts(parts)?;
        if sampler.num_batches() == 0 {
            return Err(Error::config("batch_size", "with drop_last leaves no batch on this rank"));
        }
        check_prefetch(config.prefetch)?;
        let threads = match config.threads {
            Some(n) => check_threads(n)?,
            None => crate::observe::cpu::default_threads(),
        };
        let bs = config.sampler.batch_size;
        batch_bytes(bs, columns.iter().map(|c| c.row_bytes() as u64).sum())?;
        let batch_bytes: usize = columns.iter().map(|c| c.row_bytes() * bs).sum();
        let slots = BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?;
        let row_bytes: Vec<usize> = columns.iter().map(|c| c.row_bytes()).collect();
        let make: MakeSlot<Arc<ArraySlot>> = Arc::new(move || {
            let bufs = row_bytes.iter().map(|r| RawBuf::new_in(r * bs, alloc.as_ref())).collect::<Result<Vec<_>>>()?;
            Ok(Arc::new(ArraySlot {
                bufs,
                indices: std::sync::RwLock::new(Vec::with_capacity(bs)),
                batch: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                remaining: AtomicUsize::new(0),
                error: Mutex::new(None),
            }))
        });
        let pool = SlotPool::new(slots, batch_bytes, config.memory_limit, "batch", make)?;
        Ok(Loader::of(Arrays {
            columns,
            sampler,
            threads,
            pool,
            telemetry: Arc::default(),
            counters: ArrayCounters::default(),
            tally: config.sampler.mixture.as_ref().map(|m| crate::shell::mix::Tally::new(m.parts.len())),
        }))
    }

    /// Copy threads.
    pub fn threads(&self) -> usize {
        self.kind().threads
    }
}

impl Kind for Arrays {
    type Position = Position;
    type Slot = Arc<ArraySlot>;
    type Hooks = ArrayHooks;
    type Batch = ArrayBatch;
    type Section = ArraySection;

    fn pool(&self) -> &SlotPool<Arc<ArraySlot>> {
        &self.pool
    }

    fn start(
        self: &Arc<Self>,
        position: &Arc<Position>,
        run: &Arc<Run<Arc<ArraySlot>>>,
        done_tx: Sender<Arc<ArraySlot>>,
    ) -> Result<PassPlan<Self>> {
        let sh = self.clone();
        let Start { epoch, first: start, order, batches: end, .. } = position.start(&sh.sampler);
        let (task_tx, task_rx) = bounded::<(Arc<ArraySlot>, usize, usize)>(sh.threads * 4);
        let cancel = run.cancel_flag();
        {
            let (sh, cancel, order) = (sh.clone(), cancel.clone(), order.clone());
            run.spawn("stoker-gather".into(), move || {
                for b in start..end {
                    let t0 = Instant::now();
                    let Some(slot) = take_free(&sh.pool.free_rx, &cancel) else { return };
                    sh.telemetry.buffers.record_wait(t0.elapsed());
                    let idx = sh.sampler.batch(&order, b);
                    {
                        let mut v = slot.indices.write().unwrap_or_else(|p| p.into_inner());
                        v.clear();
                        v.extend_from_slice(idx);
                    }
                    *slot.error.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    slot.batch.store(b, Ordering::Relaxed);
                    slot.len.store(idx.len(), Ordering::Relaxed);
                    // Split the rows among the threads (at least 64 rows a task).
                    let per = idx.len().div_ceil(sh.threads).max(64);
                    let tasks = idx.len().div_ceil(per);
                    slot.remaining.store(tasks, Ordering::Release);
                    for t in 0..tasks {
                        let (lo, hi) = (t * per, ((t + 1) * per).min(idx.len()));
                        if task_tx.send((slot.clone(), lo, hi)).is_err() {
                            return;
                        }
                    }
                }
            })?;
        }
        for k in 0..sh.threads {
            let (sh, rx, done, cancel) = (sh.clone(), task_rx.clone(), done_tx.clone(), cancel.clone());
            run.spawn(format!("stoker-copy-{k}"), move || {
                while let Ok((slot, lo, hi)) = rx.recv() {
                    if !cancel.load(Ordering::Acquire) {
                        let t0 = Instant::now();
                        let guard = slot.indices.read().unwrap_or_else(|p| p.into_inner());
                        let idx = &guard[lo..hi];
                        for (c, col) in sh.columns.iter().enumerate() {
                            let rb = col.row_bytes();
                            // SAFETY: rows lo..hi of this slot belong to this task alone.
                            let dst = unsafe { slot.bufs[c].slice_mut(lo * rb, (hi - lo) * rb) };
                            if let Err(e) = col.copy_rows(idx, dst) {
                                let mut first = slot.error.lock().unwrap_or_else(|p| p.into_inner());
                                if first.as_ref().is_none_or(|(at, _)| lo < *at) {
                                    *first = Some((lo, e));
                                }
                                break;
                            }
                        }
                        let bytes = sh.columns.iter().map(|c| c.row_bytes() * (hi - lo)).sum();
                        sh.counters.copied(bytes, t0.elapsed());
                    }
                    if slot.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        if let Err(e) = done.send(slot) {
                            sh.pool.give_back(e.into_inner());
                        }
                    }
                }
            })?;
        }
        let hooks = ArrayHooks { position: position.clone() };
        // A failed read ends the pass with its error (arrays have no skip policy).
        let budget = FailureBudget::new(0, true);
        Ok(PassPlan { epoch, batches: (start, Some(end)), budget, hooks, retire: None })
    }

    fn batch(self: &Arc<Self>, slot: Lease<Arc<ArraySlot>>, _: &Position, _: Delivery) -> ArrayBatch {
        self.counters.delivered();
        if let (Some(t), Some(m)) = (&self.tally, self.sampler.mixture()) {
            for &i in slot.indices.read().unwrap_or_else(|p| p.into_inner()).iter() {
                t.delivered(m.source_of(i), 1);
            }
        }
        ArrayBatch { slot, shared: self.clone() }
    }

    /// A region per column (a mixture's sources have the same columns).
    fn regions(&self) -> Vec<usize> {
        let bs = self.sampler.spec().batch_size;
        self.columns.iter().map(|c| c.row_bytes() * bs).collect()
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// The copy stage, the batches, and the array verdict.
    fn report(&self) -> ArrayReport {
        let counters = &self.counters;
        let mixture = self.tally.as_ref().and_then(|t| self.sampler.mixture_report(t));
        let section = counters.section(self.columns.len(), mixture);
        let mut r = self.telemetry.report(|wall| counters.stages(wall, self.threads), self.threads, section);
        r.bottleneck = Some(verdict(&r));
        r
    }
}

impl SamplerKind for Arrays {
    fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// What a saved state is valid for: rows, column layouts, batching and sharding.
    fn fingerprint(&self) -> Fingerprint {
        let sh = self;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(sh.columns.len() as u64).to_le_bytes());
        for c in &sh.columns {
            h.update(&(c.rows() as u64).to_le_bytes());
            h.update(&(c.row_bytes() as u64).to_le_bytes());
        }
        let rows = sh.columns.first().map_or(0, |c| c.rows());
        Fingerprint::new(sh.sampler.spec(), rows, h.digest(), "none".into())
    }
}

/// What a GPU array batch carries besides its bytes.
#[derive(Debug, Clone)]
pub struct ArrayMeta {
    /// Batch number within the epoch.
    pub index: usize,
    /// Rows.
    pub len: usize,
    /// Dataset indices of the rows.
    pub indices: Vec<u32>,
}

impl crate::shell::kind::HostBatch for ArrayBatch {
    type Meta = ArrayMeta;

    fn regions(&self, out: &mut Vec<(*const u8, usize)>) {
        for c in 0..self.num_columns() {
            let col = self.column(c);
            out.push((col.as_ptr(), col.len()));
        }
    }

    fn meta(&self) -> ArrayMeta {
        ArrayMeta { index: self.index(), len: self.len(), indices: self.indices() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(rows: usize, width: usize) -> Column {
        let data: Arc<Vec<f32>> = Arc::new((0..rows * width).map(|v| v as f32).collect());
        let ptr = data.as_ptr().cast::<u8>();
        // SAFETY: `data` is owned by the column and never mutated.
        unsafe { Column::from_raw(ptr, rows, width * 4, data) }
    }

    #[test]
    fn gathers_the_sampler_rows_in_order() {
        let spec = SamplerSpec { batch_size: 100, shuffle: true, seed: 3, ..SamplerSpec::default() };
        let cfg = ArrayConfig { sampler: spec.clone(), threads: Some(3), prefetch: 2, memory_limit: None };
        let l = ArrayLoader::new(vec![column(1000, 5)], cfg).unwrap();
        let order = Sampler::new(1000, spec).unwrap().epoch_order(0);
        let mut seen = vec![];
        for b in l.iter().unwrap() {
            let b = b.unwrap();
            let rows: Vec<f32> = b.column(0).chunks(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect();
            for (k, &i) in b.indices().iter().enumerate() {
                assert_eq!(rows[k * 5], (i as usize * 5) as f32);
            }
            seen.extend(b.indices());
        }
        assert_eq!(seen, order);
    }
}
