//! The image kind on the shell's loader: a pass's threads started over the shell's [`Run`],
//! its batches delivered by the shell's [`Pass`] (order, failure budget, stale iterators, the
//! consumer's telemetry), with the image kind's hooks (reads abandoned on shutdown, the tuner,
//! the trace file at the end of a pass). [`EpochIter`] is the shell's iterator of this kind.

use super::shared::samples_hash;
use super::shared::Images;
use super::shared::Task;
use super::stages::{decode_loop, dispatch, io_loop, Work};
use super::*;
use crate::shell::grow::{Lease, SlotPool};
use crate::shell::kind::{Delivery, Iter, Kind, PassPlan};
use crate::shell::ordered::Run;
use crate::shell::pass::{FailureBudget, PassHooks, PassSlot};
use crate::shell::sampled::SamplerKind;
use crate::source::StorageReport;

/// One pass over (the rest of) an epoch; yields batches in order. Dropping it stops and joins
/// every thread.
pub type EpochIter = Iter<Images>;

/// What an iteration shares with its loader, so that starting a new iteration (or
/// `set_epoch`, `load_state`) can stop this one and take its buffers back even while the old
/// iterator object is still alive: the generic ordered [`Run`] plus the read buffers.
/// What an iteration shares with its loader (see above).
pub struct IterCore {
    pub(super) shared: Arc<Images>,
    pub(super) run: Arc<Run<Arc<Slot>>>,
    pub(super) bytes_rx: Mutex<Option<Receiver<Vec<u8>>>>,
}

impl IterCore {
    /// Stops the threads, returns every slot to the pool and keeps the read buffers for the
    /// next epoch; idempotent.
    pub(super) fn shutdown(&self) {
        // Cancel first, so that no new read starts, then give up the reads in flight (a stalled
        // object store would otherwise hold the join below for its time-out), then join.
        self.run.cancel_flag().store(true, Ordering::Release);
        self.shared.source.abandon_reads();
        self.run.shutdown();
        if let Some(rx) = self.bytes_rx.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let mut stash = self.shared.stash.lock().unwrap_or_else(|p| p.into_inner());
            stash.bytes.extend(rx.try_iter());
        }
    }
}

impl crate::shell::epochs::Retire for IterCore {
    fn make_stale(&self, why: &str) {
        self.run.make_stale(why);
        self.shutdown();
    }
}

impl PassSlot for Slot {
    fn batch(&self) -> usize {
        self.batch.load(Ordering::Relaxed)
    }

    fn samples(&self) -> Option<usize> {
        Some(self.len.load(Ordering::Acquire))
    }

    fn take_failures(&self) -> Vec<Error> {
        let mut errs = std::mem::take(&mut *self.errors.lock().unwrap_or_else(|p| p.into_inner()));
        errs.sort_by_key(|(i, _)| *i);
        errs.into_iter().map(|(_, e)| e).collect()
    }
}

/// The image kind's part of a pass.
pub struct ImageHooks {
    core: Arc<IterCore>,
    position: Arc<Position>,
}

impl PassHooks for ImageHooks {
    fn shutdown(&self) {
        self.core.shutdown();
    }

    fn advanced(&self, next: usize) {
        self.position.advance(next);
        self.core.shared.tuner.consumed(next);
    }

    /// Tells the tuner the load after each batch.
    fn delivered(&self, _samples: usize) {
        let sh = &self.core.shared;
        sh.tuner.on_batch_load(sh.counters.load(&sh.telemetry));
    }
}

impl Kind for Images {
    type Position = Position;
    type Slot = Arc<Slot>;
    type Hooks = ImageHooks;
    type Batch = Batch;
    type Section = ImageSection;

    fn pool(&self) -> &SlotPool<Arc<Slot>> {
        &self.pool.slots
    }

    fn start(
        self: &Arc<Self>,
        position: &Arc<Position>,
        run: &Arc<Run<Arc<Slot>>>,
        done: Sender<Arc<Slot>>,
    ) -> Result<PassPlan<Self>> {
        let from = position.start(&self.sampler);
        start(self.clone(), position.clone(), from, run, done)
    }

    fn batch(self: &Arc<Self>, slot: Lease<Arc<Slot>>, _: &Position, at: Delivery) -> Batch {
        if self.tally.is_some() {
            for i in slot.indices() {
                if let Some((d, tally)) = self.mixed(i) {
                    tally.delivered(d, 1);
                }
            }
        }
        let plan = &self.plan;
        Batch {
            slot,
            sample_shape: plan.sample_shape(),
            dtype: plan.spec().dtype,
            layout: plan.spec().layout,
            epoch: at.epoch,
            context_length: self.captions.as_ref().map_or(0, |c| c.encoder.options().context_length),
            num_classes: self.mix.as_ref().map_or(0, |m| m.num_classes),
        }
    }

    /// The samples, the labels (int64), then the pool's extra regions (an image-text pair's
    /// caption ids and mask, or a mixed batch's soft labels).
    fn regions(&self) -> Vec<usize> {
        let batch_size = self.sampler.spec().batch_size;
        let mut regions = vec![self.pool.batch_bytes(), batch_size * 8];
        regions.extend((0..self.pool.extra_regions()).map(|k| self.pool.extra_bytes(k)));
        regions
    }

    /// The labels: keeping them never keeps the images' buffer.
    fn detached(&self) -> &'static [usize] {
        &[1]
    }

    fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }

    /// The image stages (read on the I/O threads; decode and ops on the decode threads now
    /// active), the decode warnings, restart decodes and the cache, the tuning, and the image
    /// verdict.
    fn report(&self) -> ImageReport {
        let tuning = self.tuner.report();
        let threads = tuning.threads_active;
        let counters = &self.counters;
        let stages = |wall| counters.stages(wall, threads, self.io_threads, self.captions.is_some());
        let mixture = self.tally.as_ref().and_then(|t| self.sampler.mixture_report(t));
        let storage = self.source.storage_report().map(|s| StorageReport { note: self.order_note.clone(), ..s });
        let section = counters.section(self.cache.as_ref().map(|c| c.report()), mixture, storage);
        let mut r = self.telemetry.report(stages, threads, section);
        let v = verdict(&r, threads, self.allowance, tuning.prefetch_active);
        r.bottleneck = Some(match &r.kind.mixture {
            Some(m) if v.stage != "consumer" => crate::shell::mix::with_slowest(v, m),
            _ => v,
        });
        r.tuning = Some(tuning);
        r
    }

    fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.tracer.as_ref()
    }

    /// The sample's path (or shard member).
    fn describe(&self, index: u32) -> String {
        self.source.describe(index as usize).display().to_string()
    }
}

impl SamplerKind for Images {
    fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// What a saved state is valid for (see [`Fingerprint`]); computed once, on first use.
    fn fingerprint(&self) -> Fingerprint {
        let sh = self;
        self.fingerprint
            .get_or_init(|| {
                // A pair loader's captions too (images alone hash as they always have).
                // A batch mixing too (loaders without one hash as they always have).
                let (spec, dct, roi) = (sh.plan.spec(), sh.decode_opts.dct_scaling, sh.decode_opts.roi);
                let transform = match (sh.captions.as_ref().map(|c| (c.encoder.options(), &c.field)), &sh.mix) {
                    (None, None) => serde_json::to_vec(&(spec, dct, roi)),
                    (Some(c), _) => serde_json::to_vec(&(spec, dct, roi, c)),
                    (None, Some(m)) => serde_json::to_vec(&(spec, dct, roi, "mix", m)),
                }
                .map(|b| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&b)))
                .unwrap_or_default();
                Fingerprint::new(sh.sampler.spec(), sh.source.len(), samples_hash(sh.source.as_ref()), transform)
            })
            .clone()
    }
}

/// Starts a pass's threads (dispatcher, I/O, decode) from `from` on `run`.
fn start(
    shared: Arc<Images>,
    state: Arc<Position>,
    from: Start,
    run: &Arc<Run<Arc<Slot>>>,
    done_tx: Sender<Arc<Slot>>,
) -> Result<PassPlan<Images>> {
    let Start { epoch, first: start, order, batches: end, samples } = from;
    let bs = shared.sampler.spec().batch_size;
    // Object storage fetches the parts this pass reads ahead, in its order.
    let from = (start * bs).min(order.len());
    shared.source.plan_reads(&order[from..], shared.readahead, bs + 16 * shared.io_threads);
    let (task_tx, task_rx) = bounded::<Task>(bs.max(64));
    let work_cap = shared.threads * 2;
    let (work_tx, work_rx) = bounded::<Work>(work_cap);
    let nbytes = work_cap + shared.threads + shared.io_threads;
    let (bytes_tx, bytes_rx) = bounded::<Vec<u8>>(nbytes);
    {
        let mut stash = shared.stash.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..nbytes {
            bytes_tx.send(stash.bytes.pop().unwrap_or_default()).expect("room");
        }
    }
    let core =
        Arc::new(IterCore { shared: shared.clone(), run: run.clone(), bytes_rx: Mutex::new(Some(bytes_rx.clone())) });
    let cancel = run.cancel_flag();
    let budget = FailureBudget::new(shared.max_failures.limit(samples), shared.on_error == ErrorPolicy::Raise);
    let hooks = ImageHooks { core: core.clone(), position: state };
    {
        let (sh, cancel, order) = (shared.clone(), cancel.clone(), order.clone());
        run.spawn("stoker-dispatch".into(), move || dispatch(&sh, &cancel, &order, (start, end), epoch, task_tx))?;
    }
    for k in 0..shared.io_threads {
        let (sh, cancel, rx, tx, brx) =
            (shared.clone(), cancel.clone(), task_rx.clone(), work_tx.clone(), bytes_rx.clone());
        let done = done_tx.clone();
        run.spawn(format!("stoker-io-{k}"), move || io_loop(&sh, &cancel, rx, tx, brx, done))?;
    }
    drop(task_rx);
    drop(work_tx);
    for k in 0..shared.threads {
        let (sh, cancel, rx, btx, done) =
            (shared.clone(), cancel.clone(), work_rx.clone(), bytes_tx.clone(), done_tx.clone());
        run.spawn(format!("stoker-decode-{k}"), move || decode_loop(&sh, k, &cancel, epoch, rx, btx, done))?;
    }
    shared.tuner.consumed(start);
    Ok(PassPlan { epoch, batches: (start, Some(end)), budget, hooks, retire: Some(core) })
}
