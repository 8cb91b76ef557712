//! [`Loader`] and [`Iter`]: the one loader of every kind. A kind ([`Kind`]: images, arrays,
//! tokens, the token mixture) brings what differs: its position (the sampler's, or documents),
//! its pool, its threads of a pass (on the shell's [`Run`]) with what the pass is
//! ([`PassPlan`]: batches, failure budget, hooks, trace), the consumer's view of a delivered
//! slot, and its part of the report (stages, section, verdict). The shell owns the rest,
//! written once: starting every pass ([`Loader::iter`]: the run over the kind's pool, then the
//! [`Pass`] observed in the kind's telemetry), epochs and the rule that a newer pass, epoch or
//! restored state makes the running pass stale ([`Epochs`]), the batches held, in-order
//! delivery with the failure budget and the consumer's observation, polling with a time-out,
//! stopping a pass, the trace file's lifecycle (written at the end of every pass that ends
//! well and when the loader is dropped, or when asked), and the report's common part.
//!
//! The state surface (`state`, `load_state`, `load_states`, the fingerprint) is written once
//! over a kind's [`super::resume::Resumable`] state; kinds over the sampler share theirs
//! ([`super::sampled`]).

use super::epochs::{Epochs, Positioned, Retire};
use super::grow::{Lease, SlotPool};
use super::ordered::Run;
use super::pass::{FailureBudget, Observe, Pass, PassHooks, PassSlot};
use super::stream::{Deliver, Stream};
use crate::error::{Error, Result};
use crate::observe::report::{Report, Section};
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::Tracer;
use crossbeam_channel::Sender;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a loader kind brings to the shell.
pub trait Kind: Send + Sync + Sized + 'static {
    /// Where its passes start and stand.
    type Position: Positioned;
    /// A pooled batch buffer its threads fill.
    type Slot: PassSlot;
    /// What it adds to a pass.
    type Hooks: PassHooks;
    /// The consumer's view of a delivered slot: what a transfer stage copies.
    type Batch: HostBatch;
    /// What the kind adds to its [`Report`].
    type Section: Section;

    /// The pool its passes' slots come from (the shell makes each pass's run over it, and
    /// lends the consumer each delivered slot).
    fn pool(&self) -> &SlotPool<Self::Slot>;

    /// Starts the kind's threads of a pass where `position` says, on the shell's `run` (they
    /// send each filled slot to `done`), and says what the pass is; the shell makes the pass.
    ///
    /// The threads take free slots from the pool in batch order (the slot of batch `b` before
    /// that of `b + 1`; filling them may finish in any order): the run keeps the batches that
    /// finish before their turn, so a pool handed out of order could be all held there, waiting
    /// for a batch that has no slot.
    fn start(
        self: &Arc<Self>,
        position: &Arc<Self::Position>,
        run: &Arc<Run<Self::Slot>>,
        done: Sender<Self::Slot>,
    ) -> Result<PassPlan<Self>>;

    /// The consumer's view of a delivered slot, lent to it (`slot` goes back to the pool when
    /// the batch drops it); a kind whose position advances with what the slot says advances it
    /// here.
    fn batch(self: &Arc<Self>, slot: Lease<Self::Slot>, position: &Self::Position, at: Delivery) -> Self::Batch;

    /// Bytes of each region of a batch at most, in the order of [`HostBatch::regions`]: what
    /// a transfer stage's device buffers hold.
    fn regions(&self) -> Vec<usize>;

    /// The regions a transfer stage copies into small device buffers of their own, so that a
    /// consumer keeping them does not keep the batch's buffer (an image batch's labels).
    fn detached(&self) -> &'static [usize] {
        &[]
    }

    /// The shell's counters of this loader (its passes record the wall clock, the samples and
    /// the consumer into them; a transfer stage the copies).
    fn telemetry(&self) -> &Arc<Telemetry>;

    /// The report: [`Telemetry::report`] with the kind's stages and section, and its verdict.
    fn report(&self) -> Report<Self::Section>;

    /// The trace recorder (`trace=`), when tracing is on: the kind's threads record into it,
    /// the shell's passes record the consumer's waits and deliveries, and the shell writes
    /// its file.
    fn tracer(&self) -> Option<&Arc<Tracer>> {
        None
    }

    /// How the traced sample `index` reads in the trace file (a path, a document number).
    fn describe(&self, index: u32) -> String {
        index.to_string()
    }
}

/// When and in which pass a slot is delivered.
#[derive(Debug, Clone, Copy)]
pub struct Delivery {
    /// The epoch the pass started in.
    pub epoch: u64,
}

/// What a kind says about a pass it started: where it starts and ends, its failure budget,
/// its hooks, whether its consumer's waits are traced, and what a newer pass makes stale.
pub struct PassPlan<K: Kind> {
    /// The epoch the pass starts in.
    pub epoch: u64,
    /// The first batch, and the end when it is known before the pass.
    pub batches: (usize, Option<usize>),
    /// The pass's failure budget.
    pub budget: FailureBudget,
    /// The kind's part of the pass.
    pub hooks: K::Hooks,
    /// What [`Epochs`] retires when a newer pass, epoch or state replaces this one: the run
    /// itself when `None`.
    pub retire: Option<Arc<dyn Retire>>,
}

/// A loader of kind `K`: the kind's shared part (what its passes' threads read) and its
/// epochs.
pub struct Loader<K: Kind> {
    kind: Arc<K>,
    epochs: Epochs<K::Position>,
}

impl<K: Kind> Loader<K> {
    /// A loader of the configured `kind`.
    pub fn of(kind: K) -> Self {
        Loader { kind: Arc::new(kind), epochs: Epochs::default() }
    }

    /// The kind's shared part.
    pub fn kind(&self) -> &Arc<K> {
        &self.kind
    }

    /// The epochs: position, the running pass.
    pub fn epochs(&self) -> &Epochs<K::Position> {
        &self.epochs
    }

    /// Selects the epoch for the next iteration (see [`Epochs::set_epoch`]: changing it makes
    /// a running iteration stale and forgets a restored position; setting the current epoch
    /// again changes nothing).
    pub fn set_epoch(&self, epoch: u64) {
        self.epochs.set_epoch(epoch);
    }

    /// Whether a state was loaded and no iteration has started from it yet.
    pub fn resume_pending(&self) -> bool {
        self.epochs.resume_pending()
    }

    /// Batches the consumer holds now.
    pub fn held(&self) -> usize {
        self.kind.pool().held()
    }

    /// Bytes of each region of a batch at most ([`Kind::regions`]).
    pub fn regions(&self) -> Vec<usize> {
        self.kind.regions()
    }

    /// The live counters (a transfer stage outside this crate records into them).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        self.kind.telemetry()
    }

    /// What the loader did since it was made (or its report was last reset): the stages, the
    /// consumer's starvation and the bottleneck verdict, with the kind's section.
    pub fn report(&self) -> Report<K::Section> {
        self.kind.report()
    }

    /// Starts an iteration of the current epoch: at its first batch, or where a state loaded
    /// since the last iteration says. A previous iteration of this loader becomes stale (it
    /// stops, its buffers return to the pool at once, and its next batch is an error naming
    /// why), even while its iterator object is alive.
    ///
    /// Every pass starts here: the run over the kind's pool, the kind's threads on it, then
    /// the in-order pass with the kind's failure budget and hooks, observed in its telemetry.
    pub fn iter(&self) -> Result<Iter<K>> {
        let position = self.epochs.begin_pass().clone();
        let pool = self.kind.pool().view();
        let (run, done) = Run::new(pool.growth.base(), pool.free.clone());
        let plan = match self.kind.start(&position, &run, done) {
            Ok(plan) => plan,
            Err(e) => {
                run.shutdown();
                return Err(e);
            }
        };
        let PassPlan { epoch, batches, budget, hooks, retire } = plan;
        let observe = Observe::new(Some(self.kind.telemetry().clone()), self.kind.tracer().cloned(), Some(epoch));
        let pass = Pass::new(run.clone(), pool, hooks, batches, budget, observe);
        self.epochs.started(retire.unwrap_or(run as Arc<dyn Retire>));
        Ok(Stream::new(pass, OfKind { kind: self.kind.clone(), position, epoch }))
    }
}

impl<K: Kind> Loader<K> {
    /// The trace recorder, when tracing is on (a transfer stage records its copies into it).
    pub fn tracer(&self) -> Option<&Arc<Tracer>> {
        self.kind.tracer()
    }

    /// The `trace=` file: written at the end of each pass that ends well, when the loader is
    /// dropped, and by [`Loader::write_trace`].
    pub fn trace_path(&self) -> Option<&Path> {
        self.kind.tracer().and_then(|t| t.path())
    }

    /// Writes the events recorded so far (the last `trace_events`) to `path`, else to the
    /// `trace=` file, now and atomically (a temporary file, then a rename); returns the path
    /// written. An error when tracing is off.
    pub fn write_trace(&self, path: Option<&Path>) -> Result<PathBuf> {
        let tracer = self.kind.tracer().ok_or_else(|| {
            Error::config("trace", "tracing is off: make the loader with trace=PATH to record a trace")
        })?;
        let path = path.or(tracer.path()).ok_or_else(|| Error::config("trace", "no path to write the trace to"))?;
        write_trace(&*self.kind, tracer, path)?;
        Ok(path.to_path_buf())
    }
}

/// Writes `tracer`'s events to `path`, each sample described by `kind`.
fn write_trace<K: Kind>(kind: &K, tracer: &Tracer, path: &Path) -> Result<()> {
    tracer.write(path, &|i| kind.describe(i)).map(drop).map_err(|e| Error::io(path, &e))
}

/// Writes the trace file by the loader's rule (the end of a pass that ended well, the
/// loader's drop), when tracing is on and this process made the tracer; the writer skips a
/// file that already holds every event. A failure goes to stderr: nobody called for it.
fn write_trace_file<K: Kind>(kind: &K) {
    let Some(t) = kind.tracer() else { return };
    if let Some(path) = t.auto_path() {
        if let Err(e) = write_trace(kind, t, path) {
            eprintln!("stoker: {e}");
        }
    }
}

impl<K: Kind> Drop for Loader<K> {
    fn drop(&mut self) {
        write_trace_file(&*self.kind);
    }
}

impl<K: Kind> std::fmt::Debug for Loader<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("kind", &std::any::type_name::<K>()).finish()
    }
}

/// The kind's side of an iteration: what a delivered slot becomes, and the trace file written
/// when the pass ends well.
pub struct OfKind<K: Kind> {
    kind: Arc<K>,
    position: Arc<K::Position>,
    epoch: u64,
}

impl<K: Kind> Deliver for OfKind<K> {
    type Slot = K::Slot;
    type Hooks = K::Hooks;
    type Batch = K::Batch;

    fn batch(&mut self, slot: Lease<K::Slot>) -> Result<K::Batch> {
        Ok(self.kind.batch(slot, &self.position, Delivery { epoch: self.epoch }))
    }

    fn completed(&mut self) {
        write_trace_file(&*self.kind);
    }
}

/// One pass over (the rest of) an epoch, or for ever for an infinite kind; yields batches in
/// order. Dropping it stops and joins every thread of the pass.
pub type Iter<K> = Stream<OfKind<K>>;

impl<K: Kind> Stream<OfKind<K>> {
    /// The epoch the pass started in.
    pub fn epoch(&self) -> u64 {
        self.delivery().epoch
    }

    /// The loader's counters (a transfer stage forwarding this pass records into them).
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        self.delivery().kind.telemetry()
    }
}

/// The batch contract of every kind: a host batch as a fixed number of contiguous byte
/// regions (what the CUDA transfer stage copies) and a description of it.
pub trait HostBatch: Send + 'static {
    /// What the consumer needs to know besides the bytes (shape, indices, ...).
    type Meta: Send + Sync + 'static;
    /// Appends the regions to copy, `(address, bytes)`, in order; always the same count. The
    /// memory stays valid while `self` lives.
    fn regions(&self, out: &mut Vec<(*const u8, usize)>);
    /// The batch's description.
    fn meta(&self) -> Self::Meta;
    /// The byte ranges of region 0 that hold GPU decode records instead of their samples'
    /// bytes ([`crate::image::gpu_job`]): the transfer stage decodes them on the device after
    /// the copy. None by default.
    fn deferred(&self, out: &mut Vec<std::ops::Range<usize>>) {
        let _ = out;
    }
}
