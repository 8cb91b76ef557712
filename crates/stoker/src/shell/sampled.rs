//! [`SamplerKind`]: the kinds whose order is the sampler's (images, arrays). Their position is
//! the sampler's, so their saved state is written once here: [`SampledState`] (the sampler's
//! position and the elastic base of an epoch continued from other ranks), its state dict, and
//! how the states of every rank of a saved run continue on this loader's ranks.

use super::kind::{Kind, Loader};
use super::resume::{one_run, Ranked, Resumable, ONE_RUN};
use super::sampler::{ElasticBase, ElasticStep, Fingerprint, Position, Sampler, SamplerState};
use crate::error::Result;
use serde_json::{json, Value};

/// A kind whose order is the sampler's (images, arrays).
pub trait SamplerKind: Kind<Position = Position> {
    /// The sampler.
    fn sampler(&self) -> &Sampler;

    /// What a saved state is valid for: the samples and their hash, batching, sharding, the
    /// transform.
    fn fingerprint(&self) -> Fingerprint;
}

/// The saved state of a kind over the sampler: its position and, when its epoch continues
/// saved runs on another number of ranks, their elastic base.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SampledState {
    /// Seed, epoch and the next batch (of the elastic epoch's order, with `elastic`).
    pub state: SamplerState,
    /// The saved runs the epoch continues (`state_dict()['elastic']`), if any.
    pub elastic: Option<ElasticBase>,
}

/// A position of a normal epoch (no elastic base).
impl From<SamplerState> for SampledState {
    fn from(state: SamplerState) -> Self {
        SampledState { state, elastic: None }
    }
}

impl<K: SamplerKind> Resumable for K {
    type State = SampledState;
    type Fingerprint = Fingerprint;

    fn fingerprint(&self) -> Fingerprint {
        SamplerKind::fingerprint(self)
    }

    fn save(&self, position: &Position) -> SampledState {
        SampledState { state: position.state(self.sampler().spec().seed), elastic: position.elastic() }
    }

    /// `{version, seed, epoch, next_batch, batches_per_epoch, rank, world_size[, elastic]}`:
    /// version 2, or 3 in an epoch continued from other ranks' states (with its `elastic`).
    fn fields(&self, position: &Position, st: &SampledState) -> Result<Value> {
        let (s, spec) = (&st.state, self.sampler().spec());
        let mut v = json!({
            "version": if st.elastic.is_some() { 3 } else { 2 }, "seed": s.seed, "epoch": s.epoch,
            "next_batch": s.next_batch, "batches_per_epoch": position.batches(self.sampler()),
            "rank": spec.rank, "world_size": spec.world_size,
        });
        if let Some(e) = &st.elastic {
            v["elastic"] = json!(e);
        }
        Ok(v)
    }

    fn restore(&self, position: &Position, st: SampledState) -> Result<()> {
        position.restore(st.state, st.elastic, self.sampler())
    }

    fn continue_ranks(&self, saved: &[Ranked<SampledState>]) -> Result<SampledState> {
        continue_sampled(saved)
    }
}

impl<K: SamplerKind> Loader<K> {
    /// Batches per epoch on this rank (of the current epoch: a continued elastic epoch has
    /// its own count).
    pub fn len(&self) -> usize {
        self.epochs().batches(self.kind().sampler())
    }

    /// Whether an epoch has no batches (never true for a constructed loader).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sampler.
    pub fn sampler(&self) -> &Sampler {
        self.kind().sampler()
    }

    /// Restores `st` exactly as another loader had it, including whether it was still to be
    /// resumed: how a fork child's rebuilt loader continues its parent's.
    pub fn adopt_state(&self, st: SampledState, resume: bool) -> Result<()> {
        self.load_state(st)?;
        self.epochs().position().set_resume(resume);
        Ok(())
    }
}

/// The state that continues the saved run of `saved` (every rank's state, in rank order),
/// all of one seed, epoch and elastic base: the continued epoch starts at batch 0 of an
/// elastic base that is theirs plus one step: what each saved rank had delivered.
pub(crate) fn continue_sampled(saved: &[Ranked<SampledState>]) -> Result<SampledState> {
    one_run(
        saved,
        &[
            ("seed", |s: &SampledState| json!(s.state.seed)),
            ("epoch", |s: &SampledState| json!(s.state.epoch)),
            ("elastic", |s: &SampledState| json!(s.elastic)),
        ],
        ONE_RUN,
    )?;
    let f = &saved[0].state;
    let mut base = f.elastic.clone().unwrap_or_default();
    let next_batch = saved.iter().map(|r| r.state.state.next_batch).collect();
    base.0.push(ElasticStep { world_size: saved.len(), next_batch });
    Ok(SampledState { state: SamplerState { next_batch: 0, ..f.state }, elastic: Some(base) })
}
