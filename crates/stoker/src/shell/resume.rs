//! [`Resumable`]: what a kind's saved state is, and the state surface of [`Loader`] written
//! once over it: the state, the fingerprint, the state dict, restoring a state, and continuing
//! the states of every rank of a saved run on this loader's ranks (elastic resume), with the
//! rule that each saved rank is given exactly once.
//!
//! Reading a state dict a user hands back (its fields checked, its fingerprint compared with
//! the loader's) is `args`' job: [`crate::args::load_state_dict`].

use super::kind::{Kind, Loader};
use crate::error::{Error, Result};
use serde_json::Value;

/// A kind whose position can be saved and restored.
pub trait Resumable: Kind {
    /// One rank's saved position.
    type State: Clone + Send + 'static;
    /// What a saved state is valid for (data, batching, transforms, sharding), as its state
    /// dict's `fingerprint` holds it; its `rank` and `world_size` fields say which rank of how
    /// many saved it.
    type Fingerprint: serde::Serialize + serde::de::DeserializeOwned + Clone + Send + 'static;

    /// What a state saved by this loader is valid for.
    fn fingerprint(&self) -> Self::Fingerprint;

    /// The state at `position`: where the next pass would start.
    fn save(&self, position: &Self::Position) -> Self::State;

    /// `state`'s state dict, an object, but its `fingerprint` (the shell adds it).
    fn fields(&self, position: &Self::Position, state: &Self::State) -> Result<Value>;

    /// Restores `state` into `position`, checked against this loader (its seed, its epoch's
    /// batches): the next pass starts there.
    fn restore(&self, position: &Self::Position, state: Self::State) -> Result<()>;

    /// The state that continues, on this loader's ranks, the run `saved` holds: the state of
    /// every one of its ranks, in rank order. The kind checks that they are of one run (seed,
    /// epoch, ...), naming a state by where it stood in the user's list ([`Ranked::index`]).
    fn continue_ranks(&self, saved: &[Ranked<Self::State>]) -> Result<Self::State>;
}

/// One saved rank's state, in a list of every rank's.
#[derive(Debug, Clone)]
pub struct Ranked<S> {
    /// Where it stood in the list given (`state[index]` in errors).
    pub index: usize,
    /// The state.
    pub state: S,
}

/// The state surface of every resumable kind.
impl<K: Resumable> Loader<K> {
    /// The resumable state: where the next iteration would start.
    pub fn state(&self) -> K::State {
        self.kind().save(self.epochs().position())
    }

    /// What a saved state of this loader is valid for.
    pub fn fingerprint(&self) -> K::Fingerprint {
        self.kind().fingerprint()
    }

    /// The state dict (`state_dict()`): the kind's fields of the current state, and the
    /// fingerprint.
    pub fn state_dict(&self) -> Result<Value> {
        self.state_value(&self.state())
    }

    /// The state dict of `state` (a state of this loader).
    pub fn state_value(&self, state: &K::State) -> Result<Value> {
        let mut v = self.kind().fields(self.epochs().position(), state)?;
        let fingerprint = serde_json::to_value(self.fingerprint()).map_err(|e| Error::Internal(e.to_string()))?;
        let Value::Object(fields) = &mut v else {
            return Err(Error::Internal("a state dict that is not a dict".into()));
        };
        fields.insert("fingerprint".into(), fingerprint);
        Ok(v)
    }

    /// Restores a state from [`Loader::state`]: the next iteration resumes there. A running
    /// iteration becomes stale.
    pub fn load_state(&self, state: K::State) -> Result<()> {
        self.kind().restore(self.epochs().position(), state)?;
        self.epochs().restored();
        Ok(())
    }

    /// Continues a run saved by several ranks, `(state, rank, world_size)` of every one in any
    /// order, on this loader's ranks, which may be more or fewer: every sample no saved rank
    /// delivered is dealt anew to exactly one of them. Each saved rank `0..world_size` must be
    /// given once. A running iteration becomes stale.
    pub fn load_states(&self, states: Vec<(K::State, usize, usize)>) -> Result<()> {
        let saved = every_rank(states)?;
        let state = self.kind().continue_ranks(&saved)?;
        self.load_state(state)
    }
}

/// The states of a saved run in rank order: all of one `world_size`, each rank of it once.
/// Errors name a state by its place in the list (`state[2]`).
pub(crate) fn every_rank<S>(states: Vec<(S, usize, usize)>) -> Result<Vec<Ranked<S>>> {
    let Some(&(_, _, world)) = states.first() else {
        return Err(Error::config("state", "an empty list: give the state_dict() of every rank of the saved run"));
    };
    if let Some((index, &(_, _, w))) = states.iter().enumerate().find(|(_, s)| s.2 != world) {
        return Err(Error::config(
            format!("state[{index}]['fingerprint']['world_size']"),
            format!("is {w}, state[0] has {world}: {ONE_RUN}"),
        ));
    }
    // The ranks are counted before any table of them is made: `world_size` is the user's.
    let missing = |r: usize| {
        Error::config(
            "state",
            format!(
                "has no state of rank {r} of the saved run's {world} ranks: give every rank's state_dict() (e.g. \
                 gathered with dist.all_gather_object)"
            ),
        )
    };
    if states.len() < world {
        let given: std::collections::BTreeSet<usize> = states.iter().map(|s| s.1).collect();
        return Err(missing((0..).find(|r| !given.contains(r)).unwrap_or(0)));
    }
    let mut at: Vec<Option<Ranked<S>>> = (0..world).map(|_| None).collect();
    for (index, (state, rank, _)) in states.into_iter().enumerate() {
        let Some(slot) = at.get_mut(rank) else {
            return Err(Error::config(
                format!("state[{index}]['fingerprint']['rank']"),
                format!("rank {rank} is not in 0..{world} (world_size)"),
            ));
        };
        if let Some(other) = slot.replace(Ranked { index, state }) {
            return Err(Error::config(
                format!("state[{index}]['fingerprint']['rank']"),
                format!(
                    "rank {rank} appears twice in the list (state[{}] and state[{index}]): give each rank's state once",
                    other.index
                ),
            ));
        }
    }
    at.into_iter().enumerate().map(|(r, one)| one.ok_or_else(|| missing(r))).collect()
}

/// Why states that differ are refused, unless a kind says more.
pub const ONE_RUN: &str = "give the states of one run, saved at one time";

/// A field of a saved state: its name, and its value.
pub type Field<S> = (&'static str, fn(&S) -> Value);

/// Checks that every state of a saved run agrees with the first rank's in each of `fields`
/// (a name, and the field's value), naming the first that differs and why it must not
/// (`why`, [`ONE_RUN`] unless the kind says more).
pub fn one_run<S>(saved: &[Ranked<S>], fields: &[Field<S>], why: &str) -> Result<()> {
    let Some(first) = saved.first() else { return Ok(()) };
    for one in &saved[1..] {
        for (field, value) in fields {
            let (theirs, ours) = (value(&one.state), value(&first.state));
            if theirs != ours {
                return Err(Error::config(
                    format!("state[{}]['{field}']", one.index),
                    format!("is {theirs}, state[{}] has {ours}: {why}", first.index),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranks(list: &[(usize, usize)]) -> Result<Vec<usize>> {
        let states = list.iter().enumerate().map(|(i, &(rank, world))| (i, rank, world)).collect();
        every_rank(states).map(|v| v.into_iter().map(|r| r.state).collect())
    }

    #[test]
    fn a_saved_run_s_states_agree_in_the_fields_the_kind_names() {
        let saved: Vec<Ranked<(u64, u64)>> =
            [(1, 5), (1, 5), (2, 5)].into_iter().enumerate().map(|(i, state)| Ranked { index: 2 - i, state }).collect();
        let fields: &[Field<(u64, u64)>] = &[("epoch", |s| s.1.into()), ("seed", |s| s.0.into())];
        let e = one_run(&saved, fields, ONE_RUN).unwrap_err().to_string();
        assert!(e.contains("`state[0]['seed']`: is 2, state[2] has 1: give the states of one run"), "{e}");
        one_run(&saved[..2], fields, ONE_RUN).unwrap();
    }

    #[test]
    fn every_saved_rank_is_given_once_in_any_order() {
        assert_eq!(ranks(&[(2, 3), (0, 3), (1, 3)]).unwrap(), vec![1, 2, 0], "list places, in rank order");
        let e = |list: &[(usize, usize)]| ranks(list).unwrap_err().to_string();
        assert!(e(&[]).contains("an empty list"));
        assert!(e(&[(0, 2)]).contains("no state of rank 1 of the saved run's 2 ranks"));
        let twice = e(&[(0, 2), (0, 2)]);
        assert!(
            twice.contains("`state[1]['fingerprint']['rank']`: rank 0 appears twice")
                && twice.contains("state[0] and state[1]")
        );
        assert!(e(&[(0, 2), (2, 2)]).contains("rank 2 is not in 0..2"));
        assert!(e(&[(0, 2), (1, 3)]).contains("`state[1]['fingerprint']['world_size']`: is 3, state[0] has 2"));
        // A hostile world size is refused before a table of its ranks is made.
        assert!(e(&[(1, usize::MAX)]).contains("no state of rank 0 of the saved run's 18446744073709551615 ranks"));
        assert!(e(&[(0, 3), (0, 3), (1, 3)]).contains("rank 0 appears twice"));
    }
}
