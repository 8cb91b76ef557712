//! [`Loader`] and [`Iter`]: the one loader of every kind. A kind ([`Kind`]: images, arrays,
//! tokens, the token mixture) brings what differs: its position (the sampler's, or documents),
//! its pool, its threads of a pass (on the shell's [`Run`]) with what the pass is
//! ([`PassPlan`]: batches, failure budget, hooks, trace), the consumer's view of a delivered
//! slot, and its part of the report (stages, section, verdict). The shell owns the rest,
//! written once: starting every pass ([`Loader::iter`]: the run over the kind's pool, then the
//! [`Pass`] observed in the kind's telemetry), epochs and the rule that a newer pass, epoch or
//! restored state makes the running pass stale ([`Epochs`]), the batches held, in-order
//! delivery with the failure budget and the consumer's observation, polling with a time-out,
//! stopping a pass, and the report's common part.
//!
//! Kinds over the sampler ([`SamplerKind`]: images, arrays) share their state surface too
//! (`len`, `state`, `load_state`, elastic bases), here once.

use super::epochs::{Epochs, Positioned, Retire};
use super::grow::PoolView;
use super::ordered::Run;
use super::pass::{FailureBudget, Next, Observe, Pass, PassHooks, PassSlot};
use super::sampler::{ElasticBase, Position, Sampler, SamplerState};
use crate::error::Result;
use crate::observe::report::{Report, Section};
use crate::observe::telemetry::Telemetry;
use crate::observe::trace::Tracer;
use crossbeam_channel::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

    /// The pool its passes' slots come from (the shell makes each pass's run over it).
    fn pool(&self) -> PoolView<Self::Slot>;

    /// Starts the kind's threads of a pass where `position` says, on the shell's `run` (they
    /// send each filled slot to `done`), and says what the pass is; the shell makes the pass.
    fn start(
        self: &Arc<Self>,
        position: &Arc<Self::Position>,
        run: &Arc<Run<Self::Slot>>,
        done: Sender<Self::Slot>,
    ) -> Result<PassPlan<Self>>;

    /// The consumer's view of a delivered `slot` (a kind whose position advances with what the
    /// slot says advances it here).
    fn batch(self: &Arc<Self>, slot: Self::Slot, position: &Self::Position, at: Delivery) -> Self::Batch;

    /// Batches the consumer holds now.
    fn held(&self) -> usize;

    /// The shell's counters of this loader (its passes record the wall clock, the samples and
    /// the consumer into them; a transfer stage the copies).
    fn telemetry(&self) -> &Arc<Telemetry>;

    /// The report: [`Telemetry::report`] with the kind's stages and section, and its verdict.
    fn report(&self) -> Report<Self::Section>;

    /// The loader is dropped (a kind writes its trace file here).
    fn dropped(&self) {}
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
    /// Where the consumer's waits and deliveries are traced (`None`: not traced).
    pub tracer: Option<Arc<Tracer>>,
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
        self.kind.held()
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
        let pool = self.kind.pool();
        let (run, done) = Run::new(pool.growth.base(), pool.free.clone());
        let plan = match self.kind.start(&position, &run, done) {
            Ok(plan) => plan,
            Err(e) => {
                run.shutdown();
                return Err(e);
            }
        };
        let PassPlan { epoch, batches, budget, hooks, tracer, retire } = plan;
        let observe = Observe::new(Some(self.kind.telemetry().clone()), tracer, Some(epoch));
        let pass = Pass::new(run.clone(), pool, hooks, batches, budget, observe);
        self.epochs.started(retire.unwrap_or(run as Arc<dyn Retire>));
        Ok(Iter { kind: self.kind.clone(), position, pass, epoch })
    }
}

impl<K: Kind> Drop for Loader<K> {
    fn drop(&mut self) {
        self.kind.dropped();
    }
}

impl<K: Kind> std::fmt::Debug for Loader<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("kind", &std::any::type_name::<K>()).finish()
    }
}

/// One pass over (the rest of) an epoch, or for ever for an infinite kind; yields batches in
/// order. Dropping it stops and joins every thread of the pass.
pub struct Iter<K: Kind> {
    kind: Arc<K>,
    position: Arc<K::Position>,
    pass: Pass<K::Slot, K::Hooks>,
    epoch: u64,
}

impl<K: Kind> std::fmt::Debug for Iter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter").field("epoch", &self.epoch).field("next_batch", &self.pass.next_batch()).finish()
    }
}

impl<K: Kind> Iter<K> {
    /// Like [`Iterator::next`], but gives up after `timeout` ([`Next::NotYet`]): for callers
    /// that must stay responsive, such as the Python binding checking for Ctrl-C between waits.
    pub fn next_timeout(&mut self, timeout: Duration) -> Next<K::Batch> {
        self.poll(Some(Instant::now() + timeout))
    }

    fn poll(&mut self, deadline: Option<Instant>) -> Next<K::Batch> {
        let got = self.pass.poll(deadline);
        let (kind, position) = (&self.kind, &*self.position);
        let at = Delivery { epoch: self.epoch };
        got.map(|slot| kind.batch(slot, position, at))
    }

    /// The epoch the pass started in.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Batches left in this pass (0 when the producer decides the end).
    pub fn remaining(&self) -> usize {
        self.pass.remaining()
    }

    /// Stops counting this iterator's caller as the consumer: for a stage that forwards the
    /// batches (the GPU transfer) and measures the real consumer itself.
    pub fn forwarding(mut self) -> Self {
        self.pass.observe.consumer = false;
        self
    }

    /// The kind's hooks of this pass.
    pub fn hooks(&self) -> &K::Hooks {
        self.pass.hooks()
    }

    /// Stops the iteration now (every thread joined, every buffer back in the pool).
    pub fn close(&mut self) {
        self.pass.shutdown();
    }
}

impl<K: Kind> Iterator for Iter<K> {
    type Item = Result<K::Batch>;

    fn next(&mut self) -> Option<Self::Item> {
        self.poll(None).into_item()
    }
}

/// A kind whose order is the sampler's (images, arrays): its position is the sampler's, and
/// its state surface is written once below.
pub trait SamplerKind: Kind<Position = Position> {
    /// The sampler.
    fn sampler(&self) -> &Sampler;
}

impl<K: SamplerKind> Loader<K> {
    /// Batches per epoch on this rank (of the current epoch: a continued elastic epoch has
    /// its own count).
    pub fn len(&self) -> usize {
        self.epochs.batches(self.kind.sampler())
    }

    /// Whether an epoch has no batches (never true for a constructed loader).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        self.kind.sampler()
    }

    /// The resumable state: where the next iteration would start.
    pub fn state(&self) -> SamplerState {
        self.epochs.state(self.kind.sampler())
    }

    /// The elastic base of the current epoch: the saved runs it continues on this loader's
    /// ranks (`None`: a normal epoch). Part of the state.
    pub fn elastic(&self) -> Option<ElasticBase> {
        self.epochs.elastic()
    }

    /// Restores a state from [`Loader::state`]: the next iteration resumes there. A running
    /// iteration becomes stale.
    pub fn load_state(&self, st: SamplerState) -> Result<()> {
        self.epochs.load_state(st, None, self.kind.sampler())
    }

    /// Restores a state of an elastic epoch ([`Loader::elastic`]), or continues an epoch saved
    /// on another number of ranks (`elastic`: their base, from
    /// [`crate::args::saved_states`]): every sample no saved rank delivered is dealt to this
    /// loader's ranks (see [`Sampler::elastic_order`]). A running iteration becomes stale.
    pub fn load_elastic(&self, st: SamplerState, elastic: ElasticBase) -> Result<()> {
        self.epochs.load_state(st, Some(elastic), self.kind.sampler())
    }

    /// Restores `st` (and its elastic base) exactly as another loader had it, including
    /// whether it was still to be resumed: how a fork child's rebuilt loader continues its
    /// parent's.
    pub fn adopt_state(&self, st: SamplerState, elastic: Option<ElasticBase>, resume: bool) -> Result<()> {
        self.epochs.adopt_state(st, elastic, resume, self.kind.sampler())
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
