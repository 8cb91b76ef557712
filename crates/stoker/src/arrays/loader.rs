//! `ArrayLoader`: batches gathered from in-memory arrays or `.npy` files by the
//! sampler's indices, with parallel row copies straight into pooled buffers.
//!
//! This is the cure for `TensorDataset` + `DataLoader`: no per-item Python indexing, no
//! collation, no whole dataset copied into RAM (only the rows a batch needs are read from a
//! `.npy` file). Same sampler, resume state and sharding as the image loaders.
//!
//! `.npy` rows are read with positional reads (`pread`) straight into the batch buffer, one
//! read per run of consecutive rows, not through a memory mapping: a file that shrinks while it
//! is read (truncated by another process) is then a short read, which is that batch's
//! [`Error::Io`] naming the file, where a mapping would kill the process with `SIGBUS`. A read
//! costs a system call per row (about 1 µs, where a copy from a warm mapping costs a page
//! fault at most), so a file whose rows take at most [`READ_WHOLE_MAX`] bytes (labels, small
//! features) is read whole when it is opened and copied from memory.

use super::npy::{npy_layout, NpyHeader, NpyLayout, NPY_HEADER_MAX};
use crate::buffer::RawBuf;
use crate::error::{Error, Result};
use crate::pipeline::Run;
use crate::sampler::{ElasticBase, Fingerprint, Position, Sampler, SamplerSpec, SamplerState, Start};
use crate::shell::epochs::Epochs;
use crate::shell::grow::SlotPool;
use crate::shell::pass::{FailureBudget, MakeSlot, Next, Observe, Pass, PassHooks, PassSlot};
use crossbeam_channel::bounded;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A C-contiguous array viewed as rows of bytes: memory kept alive by its owner, or the rows
/// of a `.npy` file.
pub struct Column {
    rows: usize,
    row_bytes: usize,
    data: Data,
}

/// Where a column's rows are.
enum Data {
    /// In memory that `_owner` keeps alive and unchanged.
    Memory { ptr: *const u8, _owner: Arc<dyn Send + Sync> },
    /// In a file, from byte `offset` on, read with positional reads.
    File { file: std::fs::File, path: PathBuf, offset: u64 },
}

// SAFETY: a Column only reads its rows; the owner keeps the memory alive and unchanged for the
// Column's life (the caller of `from_raw` promises it); a file is only read with `pread`, which
// needs no exclusive access.
unsafe impl Send for Column {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for Column {}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Column").field("rows", &self.rows).field("row_bytes", &self.row_bytes).finish()
    }
}

/// `.npy` files whose rows take at most this many bytes are read whole when opened (see the
/// module doc); larger ones row by row.
pub const READ_WHOLE_MAX: usize = 32 << 20;

impl Column {
    /// Opens a `.npy` file: its header is read and checked against the file's length now, its
    /// rows when a batch needs them (or all of them now, when they take at most
    /// [`READ_WHOLE_MAX`] bytes). Returns the column and its header.
    pub fn from_npy(path: &Path) -> Result<(Self, NpyHeader)> {
        Self::open_npy(path, READ_WHOLE_MAX)
    }

    /// [`Column::from_npy`], reading the rows whole when they take at most `whole_max` bytes.
    fn open_npy(path: &Path, whole_max: usize) -> Result<(Self, NpyHeader)> {
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
        let meta = f.metadata().map_err(|e| Error::io(path, &e))?;
        if !meta.is_file() {
            return Err(Error::decode(path, "not a regular file"));
        }
        let len = usize::try_from(meta.len()).map_err(|_| Error::decode(path, "file too large"))?;
        let mut head = vec![0u8; len.min(NPY_HEADER_MAX)];
        f.read_exact_at(&mut head, 0).map_err(|e| Error::io(path, &e))?;
        let NpyLayout { header: h, rows, row_bytes } = npy_layout(&head, len, path)?;
        let bytes = rows * row_bytes; // within the file's length, checked by npy_layout
        let data = if bytes <= whole_max {
            let mut all = vec![0u8; bytes];
            f.read_exact_at(&mut all, h.data_offset as u64).map_err(|e| Error::io(path, &e))?;
            let all = Arc::new(all);
            Data::Memory { ptr: all.as_ptr(), _owner: all }
        } else {
            Data::File { file: f, path: path.to_path_buf(), offset: h.data_offset as u64 }
        };
        Ok((Column { rows, row_bytes, data }, h))
    }

    /// A column over memory owned by someone else.
    ///
    /// # Safety
    /// `ptr` must point to `rows * row_bytes` readable bytes that stay valid and unchanged while
    /// `owner` (or any clone of it) is alive.
    pub unsafe fn from_raw(ptr: *const u8, rows: usize, row_bytes: usize, owner: Arc<dyn Send + Sync>) -> Self {
        Column { rows, row_bytes, data: Data::Memory { ptr, _owner: owner } }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Copies rows `idx` (each `< rows`) back to back into `dst` (`idx.len() * row_bytes`
    /// bytes). From a file, each run of consecutive rows is one positional read; a file that
    /// has become shorter than its header promised is an [`Error::Io`] naming it.
    pub fn copy_rows(&self, idx: &[u32], dst: &mut [u8]) -> Result<()> {
        let rb = self.row_bytes;
        assert_eq!(dst.len(), idx.len() * rb, "destination size");
        assert!(idx.iter().all(|&i| (i as usize) < self.rows), "row out of range");
        match &self.data {
            Data::Memory { ptr, .. } => {
                for (d, &i) in dst.chunks_exact_mut(rb).zip(idx) {
                    // SAFETY: i < rows (checked above) and the memory holds rows * row_bytes
                    // bytes that stay valid while the owner lives (`from_raw`'s contract).
                    let row = unsafe { std::slice::from_raw_parts(ptr.add(i as usize * rb), rb) };
                    d.copy_from_slice(row);
                }
                Ok(())
            }
            Data::File { file, path, offset } => {
                let mut k = 0;
                while k < idx.len() {
                    let mut end = k + 1;
                    while end < idx.len() && idx[end] == idx[end - 1].wrapping_add(1) {
                        end += 1;
                    }
                    // rows * row_bytes + offset fits the file's length, checked at open.
                    let at = offset + idx[k] as u64 * rb as u64;
                    file.read_exact_at(&mut dst[k * rb..end * rb], at).map_err(|e| {
                        let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                            let now = file.metadata().map(|m| format!("{} bytes now", m.len()));
                            format!(
                                "the file became shorter while it was read (truncated or rewritten?): rows {}..{} \
                                 (bytes {at}..{}) are past its end ({}); the header promised {} bytes",
                                idx[k],
                                idx[end - 1] as u64 + 1,
                                at + ((end - k) * rb) as u64,
                                now.unwrap_or_else(|e| e.to_string()),
                                offset + self.rows as u64 * rb as u64
                            )
                        } else {
                            format!("cannot read rows {}..{}: {e}", idx[k], idx[end - 1] as u64 + 1)
                        };
                        Error::Io { path: path.clone(), reason: why }
                    })?;
                    k = end;
                }
                Ok(())
            }
        }
    }
}

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

struct ArraySlot {
    bufs: Vec<RawBuf>,
    indices: std::sync::RwLock<Vec<u32>>,
    batch: AtomicUsize,
    len: AtomicUsize,
    remaining: AtomicUsize,
    /// The first failed read of this batch (the task with the lowest first row wins).
    error: Mutex<Option<(usize, Error)>>,
}

struct Shared {
    columns: Vec<Column>,
    sampler: Sampler,
    threads: usize,
    pool: SlotPool<Arc<ArraySlot>>,
}

impl PassSlot for Arc<ArraySlot> {
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
struct ArrayHooks {
    position: Arc<Position>,
}

impl PassHooks for ArrayHooks {
    fn advanced(&self, next: usize) {
        self.position.advance(next);
    }
}

/// Batches of rows from one or more equally long arrays.
pub struct ArrayLoader {
    shared: Arc<Shared>,
    epochs: Epochs,
}

impl std::fmt::Debug for ArrayLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayLoader").field("columns", &self.shared.columns).finish()
    }
}

/// One batch: a view per column of a pool buffer, returned to the pool on drop.
pub struct ArrayBatch {
    slot: Option<Arc<ArraySlot>>,
    shared: Arc<Shared>,
}

impl ArrayBatch {
    /// Rows in this batch.
    pub fn len(&self) -> usize {
        self.slot.as_ref().expect("live").len.load(Ordering::Acquire)
    }

    /// Whether the batch is empty (never, for delivered batches).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Batch number within the epoch.
    pub fn index(&self) -> usize {
        self.slot.as_ref().expect("live").batch.load(Ordering::Relaxed)
    }

    /// Number of columns.
    pub fn num_columns(&self) -> usize {
        self.shared.columns.len()
    }

    /// Column `c`'s rows, back to back.
    pub fn column(&self, c: usize) -> &[u8] {
        let slot = self.slot.as_ref().expect("live");
        let n = self.len() * self.shared.columns[c].row_bytes;
        // SAFETY: the batch is complete, so no worker writes its buffers any more.
        unsafe { slot.bufs[c].slice(n) }
    }

    /// Address of column `c`'s first row.
    pub fn column_ptr(&self, c: usize) -> *const u8 {
        self.slot.as_ref().expect("live").bufs[c].as_ptr()
    }

    /// Dataset indices of the rows.
    pub fn indices(&self) -> Vec<u32> {
        self.slot.as_ref().expect("live").indices.read().expect("indices lock").clone()
    }
}

impl Drop for ArrayBatch {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.shared.pool.release(s);
        }
    }
}

impl ArrayLoader {
    /// Validates the columns (equal row counts) and allocates the pool on the heap.
    pub fn new(columns: Vec<Column>, config: ArrayConfig) -> Result<Self> {
        Self::new_in(columns, config, Arc::new(crate::buffer::HeapAllocator))
    }

    /// Like [`ArrayLoader::new`], with the batch buffers taken from `alloc` (e.g. pinned memory).
    pub fn new_in(
        columns: Vec<Column>,
        config: ArrayConfig,
        alloc: Arc<dyn crate::buffer::HostAllocator>,
    ) -> Result<Self> {
        let rows = columns.first().map(|c| c.rows).ok_or_else(|| Error::config("arrays", "give at least one array"))?;
        if let Some((k, c)) = columns.iter().enumerate().find(|(_, c)| c.rows != rows) {
            return Err(Error::config(
                "arrays",
                format!("array {k} has {} rows, array 0 has {rows}: all arrays need the same length", c.rows),
            ));
        }
        if rows == 0 {
            return Err(Error::Dataset("the arrays have no rows".into()));
        }
        let sampler = Sampler::new(rows, config.sampler.clone())?;
        if sampler.num_batches() == 0 {
            return Err(Error::config("batch_size", "with drop_last leaves no batch on this rank"));
        }
        if config.prefetch == 0 {
            return Err(Error::config("prefetch", "must be at least 1"));
        }
        let threads = match config.threads {
            Some(0) => return Err(Error::config("threads", "must be at least 1 (or auto)")),
            Some(n) => n,
            None => crate::cpu::default_threads(),
        };
        let bs = config.sampler.batch_size;
        let batch_bytes: usize = columns.iter().map(|c| c.row_bytes * bs).sum();
        let slots = crate::buffer::BufferPool::plan(config.prefetch + 2, batch_bytes, config.memory_limit)?;
        let row_bytes: Vec<usize> = columns.iter().map(|c| c.row_bytes).collect();
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
        Ok(ArrayLoader { shared: Arc::new(Shared { columns, sampler, threads, pool }), epochs: Epochs::default() })
    }

    /// Batches per epoch on this rank (of the current epoch: a continued elastic epoch has
    /// its own count).
    pub fn len(&self) -> usize {
        self.epochs.batches(&self.shared.sampler)
    }

    /// Whether there are no batches (never for a constructed loader).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy threads.
    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    /// Batches held by the consumer.
    pub fn held(&self) -> usize {
        self.shared.pool.held()
    }

    /// Selects the epoch for the next iteration (see [`Epochs::set_epoch`]: changing it makes
    /// a running iteration stale).
    pub fn set_epoch(&self, epoch: u64) {
        self.epochs.set_epoch(epoch);
    }

    /// The elastic base of the current epoch: the saved runs it continues on this loader's
    /// ranks (`None`: a normal epoch). Part of the state.
    pub fn elastic(&self) -> Option<ElasticBase> {
        self.epochs.elastic()
    }

    /// Restores `st` (and its elastic base) exactly as another loader had it, including
    /// whether it was still to be resumed: how a fork child's rebuilt loader continues its
    /// parent's.
    pub fn adopt_state(&self, st: SamplerState, elastic: Option<ElasticBase>, resume: bool) -> Result<()> {
        self.epochs.adopt_state(st, elastic, resume, &self.shared.sampler)
    }

    /// Whether a state was loaded and no iteration has started from it yet.
    pub fn resume_pending(&self) -> bool {
        self.epochs.resume_pending()
    }

    /// What a saved state is valid for: rows, column layouts, batching and sharding.
    pub fn fingerprint(&self) -> Fingerprint {
        let sh = &self.shared;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(sh.columns.len() as u64).to_le_bytes());
        for c in &sh.columns {
            h.update(&(c.rows as u64).to_le_bytes());
            h.update(&(c.row_bytes as u64).to_le_bytes());
        }
        let rows = sh.columns.first().map_or(0, |c| c.rows);
        Fingerprint::new(sh.sampler.spec(), rows, h.digest(), "none".into())
    }

    /// The resumable position.
    pub fn state(&self) -> SamplerState {
        self.epochs.state(&self.shared.sampler)
    }

    /// Restores a position: the next iteration resumes there; a running one becomes stale.
    pub fn load_state(&self, st: SamplerState) -> Result<()> {
        self.epochs.load_state(st, None, &self.shared.sampler)
    }

    /// Restores a state of an elastic epoch ([`ArrayLoader::elastic`]), or continues an epoch
    /// saved on another number of ranks (`elastic`: their base, from
    /// [`crate::args::saved_states`]): every row no saved rank delivered is dealt to this
    /// loader's ranks (see [`Sampler::elastic_order`]). A running one becomes stale.
    pub fn load_elastic(&self, st: SamplerState, elastic: ElasticBase) -> Result<()> {
        self.epochs.load_state(st, Some(elastic), &self.shared.sampler)
    }

    /// Starts an iteration of the current epoch (its first batch, or a position restored since
    /// the last iteration); a previous iteration becomes stale and its buffers return to the
    /// pool at once, even while its iterator object is alive.
    pub fn iter(&self) -> Result<ArrayIter> {
        let sh = self.shared.clone();
        let Start { first: start, order, batches: end, .. } = self.epochs.begin(&sh.sampler);
        let (task_tx, task_rx) = bounded::<(Arc<ArraySlot>, usize, usize)>(sh.threads * 4);
        let (run, done_tx) = Run::new(sh.pool.slots(), sh.pool.free_tx.clone());
        let cancel = run.cancel_flag();
        {
            let (sh, cancel, order) = (sh.clone(), cancel.clone(), order.clone());
            run.spawn("stoker-gather".into(), move || {
                for b in start..end {
                    let Some(slot) = crate::pipeline::take_free(&sh.pool.free_rx, &cancel) else { return };
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
                        let guard = slot.indices.read().unwrap_or_else(|p| p.into_inner());
                        let idx = &guard[lo..hi];
                        for (c, col) in sh.columns.iter().enumerate() {
                            let rb = col.row_bytes;
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
                    }
                    if slot.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                        if let Err(e) = done.send(slot) {
                            sh.pool.give_back(e.into_inner());
                        }
                    }
                }
            })?;
        }
        self.epochs.started(run.clone());
        let pool = sh.pool.view();
        let hooks = ArrayHooks { position: self.epochs.position().clone() };
        // A failed read ends the pass with its error (arrays have no skip policy).
        let pass = Pass::new(run, pool, hooks, (start, Some(end)), FailureBudget::new(0, true), Observe::default());
        Ok(ArrayIter { shared: sh, pass })
    }
}

/// One pass over (the rest of) an epoch.
pub struct ArrayIter {
    shared: Arc<Shared>,
    pass: Pass<Arc<ArraySlot>, ArrayHooks>,
}

impl std::fmt::Debug for ArrayIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayIter").field("next", &self.pass.next_batch()).finish()
    }
}

impl ArrayIter {
    /// Like `next`, but gives up after `timeout` ([`Next::NotYet`]).
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<ArrayBatch> {
        let shared = &self.shared;
        self.pass.poll_timeout(timeout).map(|slot| ArrayBatch { slot: Some(slot), shared: shared.clone() })
    }
}

impl Iterator for ArrayIter {
    type Item = Result<ArrayBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let shared = &self.shared;
        self.pass.poll(None).map(|slot| ArrayBatch { slot: Some(slot), shared: shared.clone() }).into_item()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arrays::npy::parse_npy_header;

    fn column(rows: usize, width: usize) -> Column {
        let data: Arc<Vec<f32>> = Arc::new((0..rows * width).map(|v| v as f32).collect());
        let ptr = data.as_ptr().cast::<u8>();
        // SAFETY: `data` is owned by the column and never mutated.
        unsafe { Column::from_raw(ptr, rows, width * 4, data) }
    }

    #[test]
    fn gathers_the_sampler_rows_in_order() {
        let spec = SamplerSpec {
            batch_size: 100,
            shuffle: true,
            seed: 3,
            drop_last: false,
            rank: 0,
            world_size: 1,
            shard_window: None,
        };
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

    #[test]
    fn npy_headers() {
        let h = b"\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }          \n";
        let p = parse_npy_header(h, Path::new("x.npy")).unwrap();
        assert_eq!((p.descr.as_str(), p.shape.clone()), ("<f4", vec![3, 4]));
        assert!(parse_npy_header(b"garbage", Path::new("x.npy")).is_err());
        let f = b"\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }           \n";
        assert!(parse_npy_header(f, Path::new("x.npy")).unwrap_err().to_string().contains("Fortran"));
    }

    /// A `.npy` file of `rows` x `width` little-endian u32 counting up from 0.
    fn npy_file(dir: &Path, rows: usize, width: usize) -> PathBuf {
        let header = format!("{{'descr': '<u4', 'fortran_order': False, 'shape': ({rows}, {width}), }}");
        let mut h = header.into_bytes();
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(b' ');
        }
        h.push(b'\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(h.len() as u16).to_le_bytes());
        b.extend_from_slice(&h);
        for v in 0..(rows * width) as u32 {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let path = dir.join("x.npy");
        std::fs::write(&path, b).unwrap();
        path
    }

    #[test]
    fn file_rows_are_read_in_runs_and_a_shrunk_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let path = npy_file(d.path(), 100, 3);
        // Small: read whole when opened, the same rows.
        let (small, _) = Column::from_npy(&path).unwrap();
        assert!(matches!(small.data, Data::Memory { .. }));
        let (col, h) = Column::open_npy(&path, 0).unwrap();
        assert!(matches!(col.data, Data::File { .. }));
        assert_eq!((col.rows(), col.row_bytes(), h.shape), (100, 12, vec![100, 3]));
        let idx = [5u32, 6, 7, 99, 0, 1, 42];
        let mut dst = vec![0u8; idx.len() * 12];
        col.copy_rows(&idx, &mut dst).unwrap();
        let got: Vec<u32> = dst.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let want: Vec<u32> = idx.iter().flat_map(|&i| (0..3).map(move |k| i * 3 + k)).collect();
        assert_eq!(got, want);
        let mut same = vec![0u8; dst.len()];
        small.copy_rows(&idx, &mut same).unwrap();
        assert_eq!(same, dst);
        // Another process truncates the file: the rows past its new end are an error naming it.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(h.data_offset as u64 + 50 * 12).unwrap();
        col.copy_rows(&[10, 11], &mut dst[..24]).unwrap();
        let err = col.copy_rows(&[49, 50, 51], &mut dst[..36]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()) && text.contains("rows 49..52"), "{text}");
        assert!(text.contains("became shorter"), "{text}");
    }
}
