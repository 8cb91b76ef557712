//! The sampler decides the order: a seeded permutation per epoch, sharded by rank, cut into batches.
//!
//! Order is a pure function of `(len, spec, epoch)`, so a resumable state is tiny:
//! [`SamplerState`] `{seed, epoch, next_batch}`. Sharding follows `DistributedSampler`: with
//! `drop_last` the tail that does not divide evenly among ranks is dropped, otherwise the
//! permutation is padded by wrapping around, so every rank has the same number of samples and
//! therefore the same number of batches.
//!
//! Elastic resume: the states of every rank of a saved run ([`ElasticBase`]) continue the epoch
//! on another number of ranks. The remaining samples are the epoch's permutation less every
//! sample a saved rank delivered, in permutation order; they are dealt to the new ranks exactly
//! as a permutation is (above), so the continued epoch is again a pure function of its state.

use crate::error::{Error, Result};
use crate::shell::mix::{MixSpec, Mixture};
use crate::shell::rng::{self, Rng};
use crate::values::check_positive;

/// How to order and cut the samples.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplerSpec {
    /// Samples per batch (≥ 1).
    pub batch_size: usize,
    /// Shuffle with a seeded permutation each epoch; otherwise dataset order.
    pub shuffle: bool,
    /// The seed of every random choice.
    pub seed: u64,
    /// Drop the last incomplete batch (and the rank-uneven tail).
    pub drop_last: bool,
    /// This process's rank in `0..world_size`.
    pub rank: usize,
    /// Number of ranks sharing the dataset.
    pub world_size: usize,
    /// Shard-aware shuffling: permute the shards, then shuffle samples within windows of this
    /// many consecutive shards (for storage where random reads are slow). `None`: one global
    /// permutation. Needs a source made of shards.
    #[serde(default)]
    pub shard_window: Option<usize>,
    /// A weighted mixture of the sources the samples come from (see [`crate::shell::mix`]):
    /// the order is the mixture's instead of a permutation of all samples.
    #[serde(default)]
    pub mixture: Option<MixSpec>,
}

impl Default for SamplerSpec {
    fn default() -> Self {
        SamplerSpec {
            batch_size: 1,
            shuffle: false,
            seed: 0,
            drop_last: false,
            rank: 0,
            world_size: 1,
            shard_window: None,
            mixture: None,
        }
    }
}

/// Where an iteration stands: restoring it yields exactly the batches that were still to come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SamplerState {
    /// The seed (checked against the loader's on restore).
    pub seed: u64,
    /// The epoch.
    pub epoch: u64,
    /// The next batch to deliver in that epoch.
    pub next_batch: usize,
}

/// One hand-over of an epoch to another number of ranks: the saved run had `world_size` ranks
/// and rank `r` had delivered the first `next_batch[r]` batches of its share.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ElasticStep {
    /// Ranks of the saved run.
    pub world_size: usize,
    /// Batches each saved rank had delivered (index: its rank).
    pub next_batch: Vec<usize>,
}

/// The saved runs an epoch continues, oldest first: an epoch resumed on another number of ranks
/// (and perhaps resumed again, on yet another). What remains of the epoch is its permutation
/// less every sample these runs delivered ([`Sampler::remaining`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ElasticBase(pub Vec<ElasticStep>);

/// A restored elastic epoch: its base and this rank's order of the remaining samples.
#[derive(Debug)]
struct ElasticEpoch {
    base: ElasticBase,
    order: std::sync::Arc<Vec<u32>>,
}

/// Where a new iteration starts ([`Position::start`]).
#[derive(Debug, Clone)]
pub struct Start {
    /// The epoch.
    pub epoch: u64,
    /// The first batch to deliver.
    pub first: usize,
    /// This rank's sample order of the epoch (a continued elastic epoch's, or the normal one).
    pub order: std::sync::Arc<Vec<u32>>,
    /// Batches in that order.
    pub batches: usize,
    /// Samples this rank sees in the epoch (what a failure budget is a fraction of).
    pub samples: usize,
}

/// Where iteration stands, in atomics: no lock, so a process forked while another thread
/// iterates can still read it. Shared by a loader and its running iteration.
///
/// The rules (those of DataLoader and StatefulDataLoader): every new iteration starts the
/// current epoch at its first batch, unless a state was restored since the last one started,
/// in which case it resumes there. Changing the epoch forgets a restored position.
///
/// An elastic epoch (a restored [`ElasticBase`]) sits behind a lock that only the loader's own
/// calls (state, restore, a new iteration, `set_epoch`) take, for as long as it takes to clone
/// an `Arc`; the iteration's threads only ever advance the atomics.
#[derive(Debug, Default)]
pub struct Position {
    epoch: std::sync::atomic::AtomicU64,
    next_batch: std::sync::atomic::AtomicUsize,
    /// A state was restored and no iteration has started from it yet.
    resume: std::sync::atomic::AtomicBool,
    /// The elastic epoch the position is in, if it is one.
    elastic: std::sync::Mutex<Option<std::sync::Arc<ElasticEpoch>>>,
}

impl Position {
    fn elastic_epoch(&self) -> Option<std::sync::Arc<ElasticEpoch>> {
        self.elastic.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_elastic(&self, e: Option<std::sync::Arc<ElasticEpoch>>) {
        *self.elastic.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }

    /// Selects `epoch`; returns whether it changed (which forgets a restored position and an
    /// elastic epoch).
    pub fn set_epoch(&self, epoch: u64) -> bool {
        use std::sync::atomic::Ordering;
        let changed = self.epoch.swap(epoch, Ordering::AcqRel) != epoch;
        if changed {
            self.next_batch.store(0, Ordering::Release);
            self.resume.store(false, Ordering::Release);
            self.set_elastic(None);
        }
        changed
    }

    /// The state, for a sampler seeded with `seed`.
    pub fn state(&self, seed: u64) -> SamplerState {
        use std::sync::atomic::Ordering;
        SamplerState {
            seed,
            epoch: self.epoch.load(Ordering::Acquire),
            next_batch: self.next_batch.load(Ordering::Acquire),
        }
    }

    /// The elastic base of the epoch the position is in; `None` for a normal epoch.
    pub fn elastic(&self) -> Option<ElasticBase> {
        self.elastic_epoch().map(|e| e.base.clone())
    }

    /// Batches in the current epoch on this rank: a continued elastic epoch's, or the
    /// sampler's.
    pub fn batches(&self, sampler: &Sampler) -> usize {
        self.elastic_epoch().map_or_else(|| sampler.num_batches(), |e| sampler.batches_in(&e.order))
    }

    /// Restores `st` after checking it against `sampler`; with `elastic`, the epoch continues
    /// that base (and `st.next_batch` counts batches of its remaining order).
    pub fn restore(&self, st: SamplerState, elastic: Option<ElasticBase>, sampler: &Sampler) -> Result<()> {
        use std::sync::atomic::Ordering;
        if st.seed != sampler.spec().seed {
            return Err(Error::config(
                "state",
                format!("seed {} does not match the loader's seed {}", st.seed, sampler.spec().seed),
            ));
        }
        let elastic = match elastic {
            None => None,
            Some(base) => {
                let order = std::sync::Arc::new(sampler.elastic_order(st.epoch, &base)?);
                Some(std::sync::Arc::new(ElasticEpoch { base, order }))
            }
        };
        let batches = elastic.as_ref().map_or_else(|| sampler.num_batches(), |e| sampler.batches_in(&e.order));
        if st.next_batch > batches {
            let what = if elastic.is_some() { "batches of the continued elastic epoch" } else { "batches per epoch" };
            return Err(Error::config("state", format!("next_batch {} exceeds the {batches} {what}", st.next_batch)));
        }
        self.epoch.store(st.epoch, Ordering::Release);
        self.next_batch.store(st.next_batch, Ordering::Release);
        self.set_elastic(elastic);
        self.resume.store(true, Ordering::Release);
        Ok(())
    }

    /// Where a new iteration starts: the restored position if a state was loaded since the last
    /// iteration started (and it is not the end of its epoch), else batch 0. A new iteration
    /// that does not resume runs a normal epoch (an elastic epoch is left behind).
    pub fn start(&self, sampler: &Sampler) -> Start {
        use std::sync::atomic::Ordering;
        let resume = self.resume.swap(false, Ordering::AcqRel);
        if !resume {
            self.set_elastic(None);
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let (order, samples) = match self.elastic_epoch() {
            Some(e) => (e.order.clone(), e.order.len()),
            None => (std::sync::Arc::new(sampler.epoch_order(epoch)), sampler.samples_per_rank()),
        };
        let batches = sampler.batches_in(&order);
        if !resume || self.next_batch.load(Ordering::Acquire) >= batches {
            self.next_batch.store(0, Ordering::Release);
        }
        Start { epoch, first: self.next_batch.load(Ordering::Acquire), order, batches, samples }
    }

    /// Sets whether the position waits to be resumed by the next iteration (a process that
    /// rebuilds a loader, after `fork()`, carries the flag over).
    pub fn set_resume(&self, resume: bool) {
        self.resume.store(resume, std::sync::atomic::Ordering::Release);
    }

    /// Whether a restored state waits for the next iteration.
    pub fn resume_pending(&self) -> bool {
        self.resume.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records that batches before `next` were delivered.
    pub fn advance(&self, next: usize) {
        self.next_batch.store(next, std::sync::atomic::Ordering::Release);
    }
}

/// A validated sampler over `len` samples.
#[derive(Debug, Clone)]
pub struct Sampler {
    len: usize,
    spec: SamplerSpec,
    per_rank: usize,
    /// Samples per shard, in dataset order (for shard-aware shuffling).
    groups: Option<Vec<usize>>,
    /// Per sample, its group (with `groups`).
    group_of: Option<Vec<u32>>,
    /// The mixture's order, when the samples are a mixture's sources.
    mix: Option<std::sync::Arc<Mixture>>,
}

impl Sampler {
    /// Validates `spec` for a dataset of `len` samples.
    pub fn new(len: usize, spec: SamplerSpec) -> Result<Self> {
        check_positive("batch_size", spec.batch_size)?;
        check_positive("world_size", spec.world_size)?;
        if let Some(w) = spec.shard_window {
            check_positive("shard_window", w)?;
        }
        if spec.rank >= spec.world_size {
            return Err(Error::config(
                "rank",
                format!("must be in 0..{} (world_size), got {}", spec.world_size, spec.rank),
            ));
        }
        if len > u32::MAX as usize {
            return Err(Error::Dataset(format!("{len} samples: at most {} are supported", u32::MAX)));
        }
        let per_rank = if spec.drop_last { len / spec.world_size } else { len.div_ceil(spec.world_size) };
        Ok(Sampler { len, spec, per_rank, groups: None, group_of: None, mix: None })
    }

    /// Declares the samples as the consecutive sources of sizes `parts` (a mixture's, see
    /// [`crate::source::Source::parts`]): with a mixture in the spec, the order is the
    /// mixture's. An error when one is given without the other.
    pub fn with_parts(mut self, parts: Option<Vec<usize>>) -> Result<Self> {
        match (&self.spec.mixture, parts) {
            (None, None) => {}
            (Some(mix), Some(lens)) => {
                if self.spec.shard_window.is_some() {
                    return Err(Error::config(
                        "shuffle",
                        "shard-aware shuffling ('shards') does not apply to a mixture",
                    ));
                }
                let s = &self.spec;
                let deal = crate::shell::mix::Deal {
                    seed: s.seed,
                    shuffle: s.shuffle,
                    batch_size: s.batch_size,
                    drop_last: s.drop_last,
                    rank: s.rank,
                    world_size: s.world_size,
                };
                self.mix = Some(std::sync::Arc::new(Mixture::new(mix, &lens, &deal)?));
            }
            (Some(_), None) => return Err(Error::config("mixture", "the dataset is not a mixture of sources")),
            (None, Some(_)) => return Err(Error::Internal("a mixture's sources without a mixture spec".into())),
        }
        Ok(self)
    }

    /// The mixture's order, when the samples are a mixture's.
    pub fn mixture(&self) -> Option<&Mixture> {
        self.mix.as_deref()
    }

    /// `tally`'s report of the mixture, when the samples are a mixture's.
    pub fn mixture_report(&self, tally: &crate::shell::mix::Tally) -> Option<crate::shell::mix::MixReport> {
        Some(tally.report(self.spec.mixture.as_ref()?, self.mix.as_ref()?.schedule().weights()))
    }

    /// The mixture's sources (name, weight, share, samples, first index), when the samples
    /// are a mixture's.
    pub fn mixture_sources(&self) -> Option<Vec<crate::shell::mix::SourceInfo>> {
        Some(self.mix.as_ref()?.sources(self.spec.mixture.as_ref()?))
    }

    /// Declares the dataset as consecutive groups (shards) of these sizes, for shard-aware
    /// shuffling.
    pub fn with_groups(mut self, groups: Vec<usize>) -> Result<Self> {
        if groups.iter().sum::<usize>() != self.len {
            return Err(Error::Internal("shard sizes do not add up to the dataset length".into()));
        }
        let mut group_of = Vec::with_capacity(self.len);
        for (g, &n) in groups.iter().enumerate() {
            group_of.extend(std::iter::repeat_n(g as u32, n));
        }
        self.groups = Some(groups);
        self.group_of = Some(group_of);
        Ok(self)
    }

    /// The spec this sampler was built from.
    pub fn spec(&self) -> &SamplerSpec {
        &self.spec
    }

    /// Samples this rank sees per epoch (before batching).
    pub fn samples_per_rank(&self) -> usize {
        match &self.mix {
            Some(m) => m.samples_per_rank(),
            None => self.per_rank,
        }
    }

    /// Batches per epoch on this rank (equal on every rank).
    pub fn num_batches(&self) -> usize {
        if let Some(m) = &self.mix {
            return m.num_batches();
        }
        if self.spec.drop_last {
            self.per_rank / self.spec.batch_size
        } else {
            self.per_rank.div_ceil(self.spec.batch_size)
        }
    }

    /// This rank's sample order for `epoch` (only the samples that end up in batches).
    pub fn epoch_order(&self, epoch: u64) -> Vec<u32> {
        if let Some(m) = &self.mix {
            return m.epoch_order(epoch);
        }
        self.deal(&self.permutation(epoch), self.spec.rank, self.spec.world_size, epoch)
    }

    /// Every sample of `epoch` in the order ranks take them (before sharding): the seeded
    /// permutation (shard-aware when configured), or dataset order without shuffling.
    pub fn permutation(&self, epoch: u64) -> Vec<u32> {
        let mut perm: Vec<u32> = (0..self.len as u32).collect();
        let mut r = Rng::new(self.spec.seed, rng::stream::PERMUTATION, epoch);
        match (&self.groups, self.spec.shard_window) {
            (Some(groups), Some(_)) if self.spec.shuffle => {
                // Permute the groups (shards, or parts of large shards), each keeping its
                // samples in order: ranks take runs of this sequence and shuffle their own run
                // within windows of groups ([`Sampler::deal`]).
                let mut starts = Vec::with_capacity(groups.len());
                let mut acc = 0u32;
                for &g in groups {
                    starts.push((acc, g as u32));
                    acc += g as u32;
                }
                rng::shuffle(&mut starts, &mut r);
                perm.clear();
                for (s, n) in starts {
                    perm.extend(s..s + n);
                }
            }
            _ if self.spec.shuffle => rng::shuffle(&mut perm, &mut r),
            _ => {}
        }
        perm
    }

    /// Rank `rank` of `world`'s share of `seq`, as a normal epoch deals a permutation: `seq`
    /// made a multiple of `world` long (cut with `drop_last`, otherwise padded by wrapping
    /// around to its start), then cut to whole batches with `drop_last`. Every rank gets the
    /// same number of batches. A rank takes positions `rank, rank + world, ...`; in a
    /// shard-window order it takes the `rank`th run of consecutive positions instead (so that it
    /// reads its own groups' bytes, not a slice of every group) and shuffles it within windows
    /// of `shard_window` groups.
    fn deal(&self, seq: &[u32], rank: usize, world: usize, epoch: u64) -> Vec<u32> {
        let (bs, len) = (self.spec.batch_size, seq.len());
        let per_rank = if self.spec.drop_last { len / world } else { len.div_ceil(world) };
        let batches = if self.spec.drop_last { per_rank / bs } else { per_rank.div_ceil(bs) };
        // Padding wraps around (only when !drop_last and len % world != 0).
        let at = |k: usize| seq[k % len.max(1)];
        let mut mine: Vec<u32> = match (&self.group_of, self.spec.shard_window) {
            (Some(group_of), Some(window)) if self.spec.shuffle => {
                // Cut to whole batches before the shuffle: the samples dropped are the run's
                // last ones, so that the parts read hold no sample that is not delivered.
                let end = rank * per_rank + per_rank.min(batches * bs);
                let mut run: Vec<u32> = (rank * per_rank..end).map(at).collect();
                let stream = rng::stream::WINDOWS ^ ((((world as u64) << 32) | rank as u64) << 4);
                shuffle_windows(&mut run, group_of, window, bs, &mut Rng::new(self.spec.seed, stream, epoch));
                run
            }
            _ => (rank..per_rank * world).step_by(world).map(at).collect(),
        };
        mine.truncate((batches * bs).min(mine.len()));
        mine
    }

    /// What remains of `epoch` after the saved runs of `base`: the epoch's permutation less
    /// every sample that a rank of a saved run delivered (its first `next_batch` batches of the
    /// order that run dealt it), in permutation order. Each step of `base` is dealt the
    /// remainder of the steps before it. An error names a step that does not fit this sampler
    /// (its ranks, or more batches delivered than its ranks had).
    pub fn remaining(&self, epoch: u64, base: &ElasticBase) -> Result<Vec<u32>> {
        let mut seq = self.permutation(epoch);
        let mut delivered = vec![false; self.len];
        for (k, step) in base.0.iter().enumerate() {
            let w = step.world_size;
            if w == 0 || step.next_batch.len() != w {
                return Err(Error::config(
                    "state",
                    format!(
                        "elastic step {k} has world_size {w} and {} next_batch values: expected one per rank",
                        step.next_batch.len()
                    ),
                ));
            }
            for (r, &done) in step.next_batch.iter().enumerate() {
                let order = self.deal(&seq, r, w, epoch);
                let batches = self.batches_in(&order);
                if done > batches {
                    return Err(Error::config(
                        "state",
                        format!(
                            "rank {r} of {w} delivered next_batch={done} batches, but had only {batches} in \
                             epoch {epoch}{}",
                            if k > 0 { format!(" (elastic step {k})") } else { String::new() }
                        ),
                    ));
                }
                for &i in &order[..(done * self.spec.batch_size).min(order.len())] {
                    delivered[i as usize] = true;
                }
            }
            seq.retain(|&i| !delivered[i as usize]);
        }
        Ok(seq)
    }

    /// This rank's order of what remains of `epoch` after the saved runs of `base`
    /// ([`Sampler::remaining`]), dealt as a normal epoch's permutation is: equal batch counts on
    /// every rank; with `drop_last`, the last `remaining % (world_size * batch_size)` remaining
    /// samples are dropped; otherwise up to `world_size - 1` from the start of the remainder
    /// are repeated and the last batch may be short.
    pub fn elastic_order(&self, epoch: u64, base: &ElasticBase) -> Result<Vec<u32>> {
        if let Some(m) = &self.mix {
            let steps: Vec<(usize, &[usize])> =
                base.0.iter().map(|s| (s.world_size, s.next_batch.as_slice())).collect();
            return m.elastic_order(epoch, &steps);
        }
        Ok(self.deal(&self.remaining(epoch, base)?, self.spec.rank, self.spec.world_size, epoch))
    }

    /// Batches in an order from [`Sampler::epoch_order`] or [`Sampler::elastic_order`].
    pub fn batches_in(&self, order: &[u32]) -> usize {
        order.len().div_ceil(self.spec.batch_size)
    }

    /// The sample indices of batch `b` within an epoch order from [`Sampler::epoch_order`].
    pub fn batch<'a>(&self, order: &'a [u32], b: usize) -> &'a [u32] {
        let start = b * self.spec.batch_size;
        let end = (start + self.spec.batch_size).min(order.len());
        &order[start.min(end)..end]
    }
}

/// Shuffles `run` within windows of `window` groups: a window ends where the `window + 1`th
/// group (by `group_of`) since its start begins, so a reader of the run only ever holds about
/// `window` groups. The first windows ramp up: the first holds `first` samples (a batch), each
/// next one twice as many, until windows of `window` groups are the smaller. A pass's first
/// batch then needs the first samples of one group (over object storage, the start of one
/// part's answer), not a whole window; a shuffled pack makes those a random sample.
fn shuffle_windows(run: &mut [u32], group_of: &[u32], window: usize, first: usize, r: &mut Rng) {
    let (mut from, mut seen, mut last, mut cap) = (0, 0, None, first.max(1));
    for pos in 0..run.len() {
        let g = group_of[run[pos] as usize];
        let new_group = Some(g) != last;
        if pos > from && ((new_group && seen == window) || pos - from == cap) {
            rng::shuffle(&mut run[from..pos], r);
            (from, seen, last, cap) = (pos, 0, None, cap.saturating_mul(2));
        }
        if Some(g) != last {
            seen += 1;
            last = Some(g);
        }
    }
    rng::shuffle(&mut run[from..], r);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(bs: usize, shuffle: bool, drop_last: bool, rank: usize, ws: usize) -> SamplerSpec {
        SamplerSpec { batch_size: bs, shuffle, seed: 42, drop_last, rank, world_size: ws, ..SamplerSpec::default() }
    }

    #[test]
    fn bad_arguments_are_named() {
        // The counts follow the rule of `args` (one message for a config made by hand and for
        // a value given).
        let e = Sampler::new(10, spec(0, false, false, 0, 1)).unwrap_err();
        assert_eq!(e.to_string(), crate::values::check_positive("batch_size", 0).unwrap_err().to_string());
        let e = Sampler::new(10, spec(2, false, false, 0, 0)).unwrap_err();
        assert!(e.to_string().contains("`world_size`: must be at least 1, got 0"), "{e}");
        let e = Sampler::new(10, SamplerSpec { shard_window: Some(0), ..spec(2, true, false, 0, 1) }).unwrap_err();
        assert!(e.to_string().contains("`shard_window`: must be at least 1, got 0"), "{e}");
        let e = Sampler::new(10, spec(2, false, false, 3, 2)).unwrap_err();
        assert!(e.to_string().contains("rank"), "{e}");
    }

    #[test]
    fn unshuffled_is_dataset_order() {
        let s = Sampler::new(10, spec(4, false, false, 0, 1)).unwrap();
        let o = s.epoch_order(0);
        assert_eq!(o, (0..10).collect::<Vec<u32>>());
        assert_eq!(s.num_batches(), 3);
        assert_eq!(s.batch(&o, 2), &[8, 9]);
    }

    #[test]
    fn epochs_differ_and_seeds_repeat() {
        let s = Sampler::new(100, spec(10, true, false, 0, 1)).unwrap();
        assert_ne!(s.epoch_order(0), s.epoch_order(1));
        assert_eq!(s.epoch_order(3), Sampler::new(100, spec(10, true, false, 0, 1)).unwrap().epoch_order(3));
    }

    #[test]
    fn shard_aware_order_stays_within_windows() {
        let groups = vec![10, 7, 13, 10, 5, 9];
        let mut sp = spec(4, true, false, 0, 1);
        sp.shard_window = Some(2);
        let s = Sampler::new(54, sp).unwrap().with_groups(groups.clone()).unwrap();
        let o = s.epoch_order(3);
        let shard_of = |i: u32| {
            let mut acc = 0;
            groups.iter().position(|&g| {
                acc += g;
                (i as usize) < acc
            })
        };
        let mut sorted = o.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..54).collect::<Vec<_>>());
        assert_ne!(o, s.epoch_order(4));
        // Walking the order, at most 2 shards are "open" at any time and each closes for good.
        let mut done = std::collections::HashSet::new();
        let mut open: Vec<usize> = vec![];
        let mut seen_in = std::collections::HashMap::new();
        for &i in &o {
            *seen_in.entry(shard_of(i).unwrap()).or_insert(0) += 1;
        }
        let mut count = std::collections::HashMap::new();
        for &i in &o {
            let sh = shard_of(i).unwrap();
            assert!(!done.contains(&sh), "shard {sh} reopened");
            if !open.contains(&sh) {
                open.push(sh);
            }
            assert!(open.len() <= 2, "{open:?}");
            let c = count.entry(sh).or_insert(0);
            *c += 1;
            if *c == seen_in[&sh] {
                open.retain(|&x| x != sh);
                done.insert(sh);
            }
        }
    }

    /// What the saved ranks of `step` delivered (their first `next_batch` batches, as dealt the
    /// remainder of the steps before it) and what the new ranks of `spec_of` deliver in the
    /// whole continued epoch: `(delivered before, delivered after, remaining)`.
    fn elastic_run(
        len: usize,
        spec_of: impl Fn(usize, usize) -> SamplerSpec,
        base: &ElasticBase,
        new_world: usize,
        epoch: u64,
    ) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let mut before = vec![];
        let mut partial = ElasticBase::default();
        for step in &base.0 {
            for (r, &done) in step.next_batch.iter().enumerate() {
                let s = Sampler::new(len, spec_of(r, step.world_size)).unwrap();
                let o =
                    if partial.0.is_empty() { s.epoch_order(epoch) } else { s.elastic_order(epoch, &partial).unwrap() };
                for b in 0..done {
                    before.extend_from_slice(s.batch(&o, b));
                }
            }
            partial.0.push(step.clone());
        }
        let mut after = vec![];
        let mut counts = vec![];
        let mut remaining = None;
        for r in 0..new_world {
            let s = Sampler::new(len, spec_of(r, new_world)).unwrap();
            let o = s.elastic_order(epoch, base).unwrap();
            counts.push(s.batches_in(&o));
            for b in 0..s.batches_in(&o) {
                after.extend_from_slice(s.batch(&o, b));
            }
            let rem = s.remaining(epoch, base).unwrap();
            assert!(remaining.as_ref().is_none_or(|x| *x == rem), "every new rank sees one remainder");
            remaining = Some(rem);
        }
        assert!(counts.windows(2).all(|w| w[0] == w[1]), "equal batch counts on the new ranks: {counts:?}");
        (before, after, remaining.unwrap_or_default())
    }

    /// Checks what [`elastic_run`] gives: the remainder is every sample not delivered before,
    /// once, in permutation order; after the resume each of it is delivered exactly once,
    /// except the documented remainder (drop_last: its last `len % (W' * bs)` dropped;
    /// otherwise fewer than W' repeated from its start).
    fn check_elastic(len: usize, bs: usize, drop_last: bool, new_world: usize, run: &(Vec<u32>, Vec<u32>, Vec<u32>)) {
        let (before, after, remaining) = run;
        let mut seen_before = vec![false; len];
        for &i in before {
            seen_before[i as usize] = true;
        }
        let mut in_rem = vec![0u32; len];
        for &i in remaining {
            in_rem[i as usize] += 1;
        }
        for i in 0..len {
            assert_eq!(in_rem[i], u32::from(!seen_before[i]), "sample {i}: remaining once iff not delivered before");
        }
        let mut count = vec![0u32; len];
        for &i in after {
            count[i as usize] += 1;
            assert!(!seen_before[i as usize], "sample {i} delivered again after the resume");
        }
        let m = remaining.len();
        if drop_last {
            let kept = m - m % (new_world * bs);
            assert_eq!(after.len(), kept);
            for (p, &i) in remaining.iter().enumerate() {
                assert_eq!(count[i as usize], u32::from(p < kept), "sample {i} at {p} of the remainder");
            }
        } else {
            let extra: usize = remaining.iter().map(|&i| count[i as usize] as usize - 1).sum();
            assert!(remaining.iter().all(|&i| count[i as usize] >= 1), "every remaining sample delivered");
            assert_eq!(extra, after.len() - m);
            assert!(extra < new_world.max(1), "{extra} repeated for {new_world} ranks");
        }
    }

    fn spec_with(bs: usize, shuffle: bool, drop_last: bool) -> impl Fn(usize, usize) -> SamplerSpec {
        move |rank, ws| spec(bs, shuffle, drop_last, rank, ws)
    }

    #[test]
    fn elastic_remainder_is_dealt_to_the_new_ranks() {
        // 4 -> 3, 2 -> 5, 3 -> 1, each with and without shuffle and drop_last; the saved ranks
        // stopped at different batches.
        for (len, bs, old, delivered, new) in [
            (103usize, 4usize, 4usize, vec![3usize, 3, 2, 3], 3usize),
            (100, 5, 2, vec![4, 4], 5),
            (61, 3, 3, vec![1, 2, 0], 1),
        ] {
            for shuffle in [false, true] {
                for drop_last in [false, true] {
                    let base = ElasticBase(vec![ElasticStep { world_size: old, next_batch: delivered.clone() }]);
                    let run = elastic_run(len, spec_with(bs, shuffle, drop_last), &base, new, 2);
                    let want: usize = delivered.iter().sum::<usize>() * bs;
                    assert_eq!(run.0.len(), want, "{old} -> {new}");
                    check_elastic(len, bs, drop_last, new, &run);
                }
            }
        }
    }

    #[test]
    fn elastic_order_unshuffled_by_hand() {
        // 12 samples, 4 ranks delivered one batch of 1 each: 0, 1, 2, 3. The rest, 4..12, on 3
        // ranks: rank r takes positions r, r+3, r+6 of it; rank 2's third wraps around to 4.
        let base = ElasticBase(vec![ElasticStep { world_size: 4, next_batch: vec![1, 1, 1, 1] }]);
        let order = |rank, drop_last| {
            Sampler::new(12, spec(1, false, drop_last, rank, 3)).unwrap().elastic_order(0, &base).unwrap()
        };
        assert_eq!(
            Sampler::new(12, spec(1, false, false, 0, 3)).unwrap().remaining(0, &base).unwrap(),
            (4..12).collect::<Vec<u32>>()
        );
        assert_eq!(
            [order(0, false), order(1, false), order(2, false)],
            [vec![4, 7, 10], vec![5, 8, 11], vec![6, 9, 4]]
        );
        // drop_last: 8 remaining on 3 ranks, the last 8 % 3 = 2 (10 and 11) are dropped.
        assert_eq!([order(0, true), order(1, true), order(2, true)], [vec![4, 7], vec![5, 8], vec![6, 9]]);
    }

    #[test]
    fn elastic_steps_chain() {
        // 4 ranks, then 3 of their remainder, then 2: each step deals what the ones before left.
        for shuffle in [false, true] {
            for drop_last in [false, true] {
                let base = ElasticBase(vec![
                    ElasticStep { world_size: 4, next_batch: vec![2, 2, 2, 2] },
                    ElasticStep { world_size: 3, next_batch: vec![1, 2, 1] },
                ]);
                let run = elastic_run(90, spec_with(3, shuffle, drop_last), &base, 2, 5);
                assert_eq!(run.0.len(), (8 + 4) * 3);
                check_elastic(90, 3, drop_last, 2, &run);
            }
        }
    }

    #[test]
    fn elastic_steps_that_do_not_fit_are_named() {
        let s = Sampler::new(40, spec(4, true, false, 0, 2)).unwrap();
        let bad = |steps: Vec<ElasticStep>| s.remaining(1, &ElasticBase(steps)).unwrap_err().to_string();
        let e = bad(vec![ElasticStep { world_size: 2, next_batch: vec![1] }]);
        assert!(e.contains("world_size 2 and 1 next_batch"), "{e}");
        // 40 samples on 4 ranks: 10 each, 3 batches of 4.
        let e = bad(vec![ElasticStep { world_size: 4, next_batch: vec![1, 4, 1, 1] }]);
        assert!(e.contains("rank 1 of 4 delivered next_batch=4") && e.contains("only 3"), "{e}");
        let e = bad(vec![ElasticStep { world_size: 0, next_batch: vec![] }]);
        assert!(e.contains("world_size 0"), "{e}");
    }

    #[test]
    fn position_keeps_an_elastic_epoch_until_it_is_left() {
        let s = Sampler::new(50, spec(4, true, true, 1, 3)).unwrap();
        let base = ElasticBase(vec![ElasticStep { world_size: 2, next_batch: vec![3, 3] }]);
        let order = s.elastic_order(4, &base).unwrap();
        // 50 - 24 = 26 remaining on 3 ranks of batches of 4: 2 batches each.
        assert_eq!(s.batches_in(&order), 2);
        let p = Position::default();
        p.restore(SamplerState { seed: 42, epoch: 4, next_batch: 1 }, Some(base.clone()), &s).unwrap();
        assert_eq!((p.batches(&s), p.elastic(), p.state(42).next_batch), (2, Some(base.clone()), 1));
        let st = p.start(&s);
        assert_eq!((st.epoch, st.first, st.batches, st.order.as_slice()), (4, 1, 2, order.as_slice()));
        // A state taken now resumes the same order.
        let q = Position::default();
        q.restore(p.state(42), p.elastic(), &s).unwrap();
        assert_eq!(q.start(&s).order, st.order);
        // A new iteration without a loaded state runs a normal epoch, and so does a new epoch.
        let again = p.start(&s);
        assert_eq!((again.first, again.order.as_slice(), p.elastic()), (0, s.epoch_order(4).as_slice(), None));
        q.set_epoch(5);
        assert_eq!((q.elastic(), q.batches(&s)), (None, s.num_batches()));
        // Too far into the continued epoch.
        let e = p.restore(SamplerState { seed: 42, epoch: 4, next_batch: 3 }, Some(base), &s).unwrap_err();
        assert!(e.to_string().contains("exceeds the 2 batches of the continued elastic epoch"), "{e}");
    }

    proptest! {
        #[test]
        fn ranks_cover_every_sample_once(len in 1usize..400, bs in 1usize..17, ws in 1usize..9,
                                         shuffle: bool, epoch in 0u64..5) {
            // With world_size * batch_size dividing len, each sample is seen exactly once, with or
            // without drop_last.
            let len = (len / (ws * bs)).max(1) * ws * bs;
            for drop_last in [false, true] {
                let mut seen = vec![0u32; len];
                let mut batches = None;
                for rank in 0..ws {
                    let s = Sampler::new(len, spec(bs, shuffle, drop_last, rank, ws)).unwrap();
                    let o = s.epoch_order(epoch);
                    if let Some(b) = batches { prop_assert_eq!(b, s.num_batches()); }
                    batches = Some(s.num_batches());
                    for b in 0..s.num_batches() {
                        for &i in s.batch(&o, b) { seen[i as usize] += 1; }
                    }
                }
                prop_assert!(seen.iter().all(|&c| c == 1));
            }
        }

        #[test]
        fn elastic_resume_covers_the_rest_once(len in 1usize..300, bs in 1usize..9, old in 1usize..7,
                                               new in 1usize..7, shuffle: bool, drop_last: bool,
                                               done in proptest::collection::vec(0usize..40, 6)) {
            let mk = spec_with(bs, shuffle, drop_last);
            let Ok(first) = Sampler::new(len, mk(0, old)) else { return Ok(()) };
            let batches = first.num_batches();
            let next_batch: Vec<usize> = done[..old].iter().map(|&d| d.min(batches)).collect();
            let base = ElasticBase(vec![ElasticStep { world_size: old, next_batch }]);
            let run = elastic_run(len, &mk, &base, new, 3);
            check_elastic(len, bs, drop_last, new, &run);
        }

        #[test]
        fn uneven_splits_keep_equal_batches(len in 1usize..300, bs in 1usize..17, ws in 1usize..9,
                                            shuffle: bool) {
            // Otherwise: drop_last=false sees every sample at least once (padding repeats < ws
            // samples); drop_last=true sees none twice. Every rank has the same batch count.
            for drop_last in [false, true] {
                let mut seen = vec![0u32; len];
                let mut counts = vec![];
                for rank in 0..ws {
                    let s = Sampler::new(len, spec(bs, shuffle, drop_last, rank, ws)).unwrap();
                    let o = s.epoch_order(1);
                    counts.push(s.num_batches());
                    for b in 0..s.num_batches() {
                        let batch = s.batch(&o, b);
                        prop_assert!(!batch.is_empty() && batch.len() <= bs);
                        if drop_last { prop_assert_eq!(batch.len(), bs); }
                        for &i in batch { seen[i as usize] += 1; }
                    }
                }
                prop_assert!(counts.windows(2).all(|w| w[0] == w[1]));
                if drop_last {
                    prop_assert!(seen.iter().all(|&c| c <= 1));
                } else {
                    prop_assert!(seen.iter().all(|&c| c >= 1));
                    let extra: u32 = seen.iter().map(|&c| c - 1).sum();
                    prop_assert!((extra as usize) < ws);
                }
            }
        }
    }
}

/// What a saved position is only valid for: the data (count and a hash of the sample list),
/// how it is batched and sharded, and the transform. A state saved by one loader is refused
/// by a loader that differs in any of these, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// Samples (or rows) in the dataset.
    pub samples: usize,
    /// XXH3 of the sample list (names and labels, or column layouts), as hex.
    pub sample_hash: String,
    /// Samples per batch.
    pub batch_size: usize,
    /// Whether the last incomplete batch is dropped.
    pub drop_last: bool,
    /// `none`, `global` or `shards:W` (shard-aware with windows of W shards).
    pub shuffle: String,
    /// Ranks sharing the data.
    pub world_size: usize,
    /// This rank.
    pub rank: usize,
    /// XXH3 of the transform description, as hex (`none` for arrays).
    pub transform: String,
    /// The mixture: each source's name, weight and policy, and the epoch's items, as JSON
    /// (`none` when the samples are not a mixture; a state saved before mixtures has none).
    #[serde(default = "no_mixture")]
    pub mixture: String,
}

fn no_mixture() -> String {
    "none".into()
}

impl Fingerprint {
    /// The fingerprint of a sampler over data hashed as `sample_hash`, with transform hash
    /// `transform`.
    pub fn new(spec: &SamplerSpec, samples: usize, sample_hash: u64, transform: String) -> Self {
        Fingerprint {
            samples,
            sample_hash: format!("{sample_hash:016x}"),
            batch_size: spec.batch_size,
            drop_last: spec.drop_last,
            shuffle: match (spec.shuffle, spec.shard_window) {
                (false, _) => "none".into(),
                (true, None) => "global".into(),
                (true, Some(w)) => format!("shards:{w}"),
            },
            world_size: spec.world_size,
            rank: spec.rank,
            transform,
            mixture: spec.mixture.as_ref().map_or_else(no_mixture, |m| serde_json::to_string(m).unwrap_or_default()),
        }
    }
}
