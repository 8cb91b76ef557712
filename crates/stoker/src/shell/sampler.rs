//! The sampler decides the order: a seeded permutation per epoch, sharded by rank, cut into batches.
//!
//! Order is a pure function of `(len, spec, epoch)`, so a resumable state is tiny:
//! [`SamplerState`] `{seed, epoch, next_batch}`. Sharding follows `DistributedSampler`: with
//! `drop_last` the tail that does not divide evenly among ranks is dropped, otherwise the
//! permutation is padded by wrapping around, so every rank has the same number of samples and
//! therefore the same number of batches.

use crate::error::{Error, Result};
use crate::rng::{self, Rng};

/// How to order and cut the samples.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// Where iteration stands, in atomics: no lock, so a process forked while another thread
/// iterates can still read it. Shared by a loader and its running iteration.
#[derive(Debug, Default)]
///
/// The rules (those of DataLoader and StatefulDataLoader): every new iteration starts the
/// current epoch at its first batch, unless a state was restored since the last one started,
/// in which case it resumes there. Changing the epoch forgets a restored position.
pub struct Position {
    epoch: std::sync::atomic::AtomicU64,
    next_batch: std::sync::atomic::AtomicUsize,
    /// A state was restored and no iteration has started from it yet.
    resume: std::sync::atomic::AtomicBool,
}

impl Position {
    /// Selects `epoch`; returns whether it changed (which forgets a restored position).
    pub fn set_epoch(&self, epoch: u64) -> bool {
        use std::sync::atomic::Ordering;
        let changed = self.epoch.swap(epoch, Ordering::AcqRel) != epoch;
        if changed {
            self.next_batch.store(0, Ordering::Release);
            self.resume.store(false, Ordering::Release);
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

    /// Restores `st` after checking it against `sampler`.
    pub fn restore(&self, st: SamplerState, sampler: &Sampler) -> Result<()> {
        use std::sync::atomic::Ordering;
        if st.seed != sampler.spec().seed {
            return Err(Error::config(
                "state",
                format!("seed {} does not match the loader's seed {}", st.seed, sampler.spec().seed),
            ));
        }
        if st.next_batch > sampler.num_batches() {
            return Err(Error::config(
                "state",
                format!("next_batch {} exceeds the {} batches per epoch", st.next_batch, sampler.num_batches()),
            ));
        }
        self.epoch.store(st.epoch, Ordering::Release);
        self.next_batch.store(st.next_batch, Ordering::Release);
        self.resume.store(true, Ordering::Release);
        Ok(())
    }

    /// `(epoch, first batch)` of a new iteration: the restored position if a state was loaded
    /// since the last iteration started (and it is not the end of the epoch), else batch 0.
    pub fn start(&self, batches: usize) -> (u64, usize) {
        use std::sync::atomic::Ordering;
        let resume = self.resume.swap(false, Ordering::AcqRel);
        if !resume || self.next_batch.load(Ordering::Acquire) >= batches {
            self.next_batch.store(0, Ordering::Release);
        }
        (self.epoch.load(Ordering::Acquire), self.next_batch.load(Ordering::Acquire))
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
}

impl Sampler {
    /// Validates `spec` for a dataset of `len` samples.
    pub fn new(len: usize, spec: SamplerSpec) -> Result<Self> {
        if spec.batch_size == 0 {
            return Err(Error::config("batch_size", "must be at least 1"));
        }
        if spec.world_size == 0 {
            return Err(Error::config("world_size", "must be at least 1"));
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
        if spec.shard_window == Some(0) {
            return Err(Error::config("shard_window", "must be at least 1"));
        }
        Ok(Sampler { len, spec, per_rank, groups: None })
    }

    /// Declares the dataset as consecutive groups (shards) of these sizes, for shard-aware
    /// shuffling.
    pub fn with_groups(mut self, groups: Vec<usize>) -> Result<Self> {
        if groups.iter().sum::<usize>() != self.len {
            return Err(Error::Internal("shard sizes do not add up to the dataset length".into()));
        }
        self.groups = Some(groups);
        Ok(self)
    }

    /// The spec this sampler was built from.
    pub fn spec(&self) -> &SamplerSpec {
        &self.spec
    }

    /// Samples this rank sees per epoch (before batching).
    pub fn samples_per_rank(&self) -> usize {
        self.per_rank
    }

    /// Batches per epoch on this rank (equal on every rank).
    pub fn num_batches(&self) -> usize {
        if self.spec.drop_last {
            self.per_rank / self.spec.batch_size
        } else {
            self.per_rank.div_ceil(self.spec.batch_size)
        }
    }

    /// This rank's sample order for `epoch` (only the samples that end up in batches).
    pub fn epoch_order(&self, epoch: u64) -> Vec<u32> {
        let mut perm: Vec<u32> = (0..self.len as u32).collect();
        let mut r = Rng::new(self.spec.seed, rng::stream::PERMUTATION, epoch);
        match (&self.groups, self.spec.shard_window) {
            (Some(groups), Some(window)) if self.spec.shuffle => {
                // Permute the shards, then shuffle the samples of each window of `window`
                // consecutive shards together: a reader only ever touches `window` shards.
                let mut starts = Vec::with_capacity(groups.len());
                let mut acc = 0u32;
                for &g in groups {
                    starts.push((acc, g as u32));
                    acc += g as u32;
                }
                rng::shuffle(&mut starts, &mut r);
                perm.clear();
                for win in starts.chunks(window) {
                    let from = perm.len();
                    for &(s, n) in win {
                        perm.extend(s..s + n);
                    }
                    rng::shuffle(&mut perm[from..], &mut r);
                }
            }
            _ if self.spec.shuffle => rng::shuffle(&mut perm, &mut r),
            _ => {}
        }
        let ws = self.spec.world_size;
        let total = self.per_rank * ws;
        let mut mine = Vec::with_capacity(self.per_rank);
        let mut k = self.spec.rank;
        while k < total {
            // Padding wraps around the permutation (only when !drop_last and len % ws != 0).
            mine.push(perm[k % self.len.max(1)]);
            k += ws;
        }
        let used = self.num_batches() * self.spec.batch_size;
        mine.truncate(used.min(mine.len()));
        mine
    }

    /// The sample indices of batch `b` within an epoch order from [`Sampler::epoch_order`].
    pub fn batch<'a>(&self, order: &'a [u32], b: usize) -> &'a [u32] {
        let start = b * self.spec.batch_size;
        let end = (start + self.spec.batch_size).min(order.len());
        &order[start.min(end)..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(bs: usize, shuffle: bool, drop_last: bool, rank: usize, ws: usize) -> SamplerSpec {
        SamplerSpec { batch_size: bs, shuffle, seed: 42, drop_last, rank, world_size: ws, shard_window: None }
    }

    #[test]
    fn bad_arguments_are_named() {
        let e = Sampler::new(10, spec(0, false, false, 0, 1)).unwrap_err();
        assert!(e.to_string().contains("batch_size"), "{e}");
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
        }
    }

    /// Checks a saved fingerprint (JSON, from `state_dict()`) against this one; the error names
    /// the first field that differs.
    pub fn check(&self, saved: &serde_json::Value) -> Result<()> {
        let mine = serde_json::to_value(self).map_err(|e| Error::Internal(e.to_string()))?;
        let (Some(mine), Some(saved)) = (mine.as_object(), saved.as_object()) else {
            return Err(Error::config("state", "the saved fingerprint is not an object"));
        };
        // In the order of the struct: the most telling difference is named first.
        const FIELDS: [&str; 8] =
            ["samples", "sample_hash", "batch_size", "drop_last", "shuffle", "world_size", "rank", "transform"];
        for field in FIELDS {
            let Some(value) = mine.get(field) else { continue };
            match saved.get(field) {
                Some(v) if v == value => {}
                Some(v) => {
                    return Err(Error::config(
                        "state",
                        format!(
                            "saved with {field}={v}, this loader has {field}={value}: the state belongs to another \
                             loader configuration or dataset"
                        ),
                    ))
                }
                None => return Err(Error::config("state", format!("the saved fingerprint has no {field}"))),
            }
        }
        Ok(())
    }
}
