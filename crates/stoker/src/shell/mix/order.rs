//! [`Mixture`]: the sample order of a weighted mixture of sources, per rank and epoch.
//!
//! Every rank follows the same [`Schedule`] over its own positions `m = 0, 1, ...`. Each source
//! is read as one long sequence of its items, pass after pass, each pass a fresh seeded
//! permutation (dataset order without shuffling). Each time the schedule takes source `d`, every
//! rank takes one item of it: the ranks' items are consecutive in that sequence (rank `r` of `w`
//! takes the `r`-th of the next `w`), so the ranks read disjoint items and together consume the
//! sequence from its start, without padding or dropping anything at a pass boundary.
//!
//! When a source runs out (its pass ends):
//! - `repeat` (the default): it starts its next pass, while the others go on. The mixture is
//!   then endless, and its "epoch" is a fixed number of items (`epoch_items` over all ranks,
//!   by default the sources' total length); epoch `e` is positions `e L .. (e + 1) L` of the
//!   one schedule (`L` per rank), so shares stay exact across epochs.
//! - `stop`: the epoch ends when this source cannot give every rank an item; each epoch then
//!   starts the schedule and every source afresh (their pass `e`).
//!
//! A position is therefore `(m, each source's place in its sequence)`, and that is what an
//! elastic resume continues: the sequence consumed so far is a prefix of each source's, so
//! another number of ranks carries on exactly where the saved ranks stopped.

use super::schedule::{Schedule, Weights};
use crate::error::{Error, Result};
use crate::shell::rng::{self, Rng};

/// What a source does when its pass ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Exhausted {
    /// Start its next pass (a fresh permutation); the others go on.
    Repeat,
    /// End the epoch.
    Stop,
}

impl Exhausted {
    /// The policy named `repeat` or `stop`.
    pub fn parse(name: &str) -> Option<Exhausted> {
        match name {
            "repeat" => Some(Exhausted::Repeat),
            "stop" => Some(Exhausted::Stop),
            _ => None,
        }
    }
}

/// One source of a mixture, as configured.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MixPart {
    /// Its name (a key of the mixture).
    pub name: String,
    /// Its weight (any positive scale; see [`Weights`]).
    pub weight: f64,
    /// What happens when its pass ends.
    pub exhausted: Exhausted,
}

/// A mixture's configuration.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MixSpec {
    /// The sources, in the order their items are numbered.
    pub parts: Vec<MixPart>,
    /// Items per epoch over all ranks when no source stops the epoch (`None`: the sources'
    /// total length).
    pub epoch_items: Option<u64>,
}

/// One source of a built mixture, as reports and the bindings show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SourceInfo {
    /// Its name.
    pub name: String,
    /// Its weight as given.
    pub weight: f64,
    /// Its share of the positions (exact: the integer weights' ratio).
    pub share: f64,
    /// What happens when its pass ends.
    pub exhausted: Exhausted,
    /// Its samples.
    pub samples: u64,
    /// The index of its first sample among all the mixture's.
    pub start: u64,
}

/// How the samples are dealt: the sampler's seed, shuffle, batch size, `drop_last` and ranks
/// (the sampler builds it from its spec; the mixture imports nothing of the sampler's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deal {
    /// The seed of the sources' permutations.
    pub seed: u64,
    /// A seeded permutation per pass (else each source in its order).
    pub shuffle: bool,
    /// Samples per batch (≥ 1).
    pub batch_size: usize,
    /// Cut an epoch to whole batches.
    pub drop_last: bool,
    /// This rank.
    pub rank: usize,
    /// Ranks sharing the sources.
    pub world_size: usize,
}

/// One source's sequence: its length and where its items start in the mixture's numbering.
#[derive(Debug, Clone)]
struct Part {
    len: u64,
    offset: u64,
    stop: bool,
}

/// The order of a mixture ([module docs](self)).
#[derive(Debug, Clone)]
pub struct Mixture {
    schedule: Schedule,
    parts: Vec<Part>,
    seed: u64,
    shuffle: bool,
    batch_size: u64,
    drop_last: bool,
    rank: u64,
    world: u64,
    /// Items per epoch over all ranks (the `repeat` mixture's).
    epoch_items: u64,
    /// Whether a source stops the epoch.
    stops: bool,
    /// Positions per rank in an epoch that starts afresh with `world` ranks.
    items: u64,
}

/// Where an epoch stands: the schedule's position and each source's place in its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cursor {
    m: u64,
    flat: Vec<u64>,
}

impl Mixture {
    /// The mixture of `spec` over sources of `lens` items, ordered as `sampler` says (seed,
    /// shuffle, batch size, `drop_last`, ranks). An error when a source is empty, or when an
    /// epoch would have no batch.
    pub fn new(spec: &MixSpec, lens: &[usize], sampler: &Deal) -> Result<Mixture> {
        if spec.parts.len() != lens.len() {
            return Err(Error::Internal(format!("{} mixture parts for {} sources", spec.parts.len(), lens.len())));
        }
        let weights: Vec<f64> = spec.parts.iter().map(|p| p.weight).collect();
        let schedule = Schedule::new(Weights::new(&weights)?);
        let mut parts = Vec::with_capacity(lens.len());
        let mut offset = 0u64;
        for (p, &len) in spec.parts.iter().zip(lens) {
            if len == 0 {
                return Err(Error::Dataset(format!("mixture source `{}` has no samples", p.name)));
            }
            parts.push(Part { len: len as u64, offset, stop: p.exhausted == Exhausted::Stop });
            offset += len as u64;
        }
        let epoch_items = spec.epoch_items.unwrap_or(offset);
        if epoch_items == 0 {
            return Err(Error::config("epoch_items", "must be at least 1"));
        }
        let mut mix = Mixture {
            schedule,
            stops: parts.iter().any(|p| p.stop),
            parts,
            seed: sampler.seed,
            shuffle: sampler.shuffle,
            batch_size: sampler.batch_size as u64,
            drop_last: sampler.drop_last,
            rank: sampler.rank as u64,
            world: sampler.world_size as u64,
            epoch_items,
            items: 0,
        };
        mix.items = mix.epoch_positions(mix.world);
        if mix.batches(mix.items) == 0 {
            return Err(Error::config(
                "batch_size",
                format!(
                    "{} leaves no batch: an epoch of this mixture has {} samples per rank{}",
                    mix.batch_size,
                    mix.items,
                    if mix.stops { " before a `stop` source runs out" } else { "" }
                ),
            ));
        }
        Ok(mix)
    }

    /// The sources of `spec` (the spec this mixture was built from) as built.
    pub fn sources(&self, spec: &MixSpec) -> Vec<SourceInfo> {
        spec.parts
            .iter()
            .zip(&self.parts)
            .enumerate()
            .map(|(d, (s, p))| SourceInfo {
                name: s.name.clone(),
                weight: s.weight,
                share: self.schedule.weights().share(d),
                exhausted: s.exhausted,
                samples: p.len,
                start: p.offset,
            })
            .collect()
    }

    /// The schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Which source the mixture's sample `index` (an index into the sources' concatenation)
    /// comes from.
    pub fn source_of(&self, index: u32) -> usize {
        self.parts.partition_point(|p| p.offset <= index as u64) - 1
    }

    /// Samples per rank in an epoch (cut to whole batches with `drop_last`).
    pub fn samples_per_rank(&self) -> usize {
        self.cut(self.items) as usize
    }

    /// Batches per rank in an epoch.
    pub fn num_batches(&self) -> usize {
        self.batches(self.items) as usize
    }

    fn batches(&self, items: u64) -> u64 {
        if self.drop_last {
            items / self.batch_size
        } else {
            items.div_ceil(self.batch_size)
        }
    }

    fn cut(&self, items: u64) -> u64 {
        if self.drop_last {
            items / self.batch_size * self.batch_size
        } else {
            items
        }
    }

    /// Positions per rank of an epoch started afresh by `world` ranks: `epoch_items / world`,
    /// or, with a `stop` source, up to the position it can no longer serve.
    fn epoch_positions(&self, world: u64) -> u64 {
        if !self.stops {
            return self.epoch_items / world;
        }
        let w = self.schedule.weights();
        let mut end = u64::MAX;
        for (d, p) in self.parts.iter().enumerate().filter(|(_, p)| p.stop) {
            // Source d serves `len / world` rounds; the epoch ends at its next occurrence.
            let rounds = p.len / world;
            let (whole, nth) = (rounds / w.parts[d], rounds % w.parts[d]);
            let mut at = whole * w.total;
            let mut seen = 0;
            for k in 0..w.total {
                if self.schedule.source(k) == d {
                    if seen == nth {
                        at += k;
                        break;
                    }
                    seen += 1;
                }
            }
            end = end.min(at);
        }
        end
    }

    /// Where epoch `epoch` starts when `world` ranks run it from its beginning.
    fn start(&self, epoch: u64, world: u64) -> Cursor {
        if self.stops {
            return Cursor { m: 0, flat: vec![0; self.parts.len()] };
        }
        let m = epoch * self.cut(self.epoch_positions(world));
        Cursor { m, flat: self.schedule.counts_at(m).iter().map(|c| c * world).collect() }
    }

    /// `cursor` moved `n` positions on, with `world` ranks taking an item at each.
    fn advance(&self, cursor: &Cursor, n: u64, world: u64) -> Cursor {
        let (before, after) = (self.schedule.counts_at(cursor.m), self.schedule.counts_at(cursor.m + n));
        let flat = cursor.flat.iter().enumerate().map(|(d, f)| f + (after[d] - before[d]) * world).collect();
        Cursor { m: cursor.m + n, flat }
    }

    /// This rank's order for `epoch`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<u32> {
        self.walk(epoch, self.start(epoch, self.world), self.items)
    }

    /// This rank's order for the rest of `epoch` after the saved runs of `base` (oldest first,
    /// each `(world_size, next_batch of each of its ranks)`, whose ranks must all have stopped
    /// at the same batch: a mixture's ranks move in step). The continued epoch has what remains
    /// of the epoch's samples over all ranks, shared by this run's ranks.
    pub fn elastic_order(&self, epoch: u64, base: &[(usize, &[usize])]) -> Result<Vec<u32>> {
        let Some(&(first, _)) = base.first() else {
            return Ok(self.epoch_order(epoch));
        };
        let mut cursor = self.start(epoch, first as u64);
        let mut left = self.cut(self.epoch_positions(first as u64)) * first as u64;
        for (k, &(world, next_batch)) in base.iter().enumerate() {
            let w = world as u64;
            let done = match next_batch {
                [] => return Err(Error::config("state", format!("elastic step {k} has no ranks"))),
                [n, rest @ ..] if rest.iter().all(|x| x == n) => *n as u64,
                all => {
                    return Err(Error::config(
                        "state",
                        format!(
                            "elastic step {k}: the ranks of a mixture stop at the same batch, but they saved \
                             next_batch {all:?}"
                        ),
                    ))
                }
            };
            let per_rank = if self.stops { self.span(&cursor, w) } else { left / w };
            let positions = (done * self.batch_size).min(per_rank);
            if done > self.batches(per_rank) {
                return Err(Error::config(
                    "state",
                    format!(
                        "elastic step {k}: next_batch={done}, but its ranks had {} batches",
                        self.batches(per_rank)
                    ),
                ));
            }
            cursor = self.advance(&cursor, positions, w);
            left -= positions * w;
        }
        let positions = if self.stops { u64::MAX } else { left / self.world };
        Ok(self.walk(epoch, cursor, positions))
    }

    /// Positions `world` ranks can take from `cursor` before a `stop` source runs out.
    fn span(&self, cursor: &Cursor, world: u64) -> u64 {
        let mut c = cursor.clone();
        loop {
            let d = self.schedule.source(c.m);
            if self.parts[d].stop && c.flat[d] + world > self.parts[d].len {
                return c.m - cursor.m;
            }
            c.flat[d] += world;
            c.m += 1;
        }
    }

    /// This rank's samples from `cursor` for at most `positions` positions (a `stop` source
    /// that cannot serve every rank ends them sooner), cut to whole batches with `drop_last`.
    fn walk(&self, epoch: u64, mut cursor: Cursor, positions: u64) -> Vec<u32> {
        let mut perms: Vec<Option<(u64, Vec<u32>)>> = vec![None; self.parts.len()];
        let mut order = Vec::new();
        for _ in 0..positions {
            let d = self.schedule.source(cursor.m);
            let p = &self.parts[d];
            if p.stop && cursor.flat[d] + self.world > p.len {
                break;
            }
            let f = cursor.flat[d] + self.rank;
            let pass = f / p.len;
            let perm = match &mut perms[d] {
                Some((at, perm)) if *at == pass => perm,
                slot => &mut slot.insert((pass, self.permutation(d, epoch, pass))).1,
            };
            order.push((p.offset + perm[(f % p.len) as usize] as u64) as u32);
            cursor.flat[d] += self.world;
            cursor.m += 1;
        }
        order.truncate(self.cut(order.len() as u64) as usize);
        order
    }

    /// Pass `pass` of source `d` (of `epoch`, when each epoch starts the sources afresh).
    fn permutation(&self, d: usize, epoch: u64, pass: u64) -> Vec<u32> {
        let mut perm: Vec<u32> = (0..self.parts[d].len as u32).collect();
        if self.shuffle {
            let key = if self.stops { rng::mix64(epoch) ^ pass } else { pass };
            let mut r = Rng::new(rng::mix64(self.seed ^ rng::mix64(d as u64 + 1)), rng::stream::MIXTURE, key);
            rng::shuffle(&mut perm, &mut r);
        }
        perm
    }
}
