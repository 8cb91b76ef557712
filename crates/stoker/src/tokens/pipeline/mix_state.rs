//! Where a token mixture stands: the epoch, batches delivered in it, and each source's place
//! ([`SourceAt`]: the state of its loader before the batch of rows it is taking, and how many of
//! those rows the mixture took). What a saved state holds, and where a pass starts.

use super::state::TokenState;
use crate::error::{Error, Result};
use crate::shell::epochs::Positioned;
use std::sync::Mutex;

/// One source of a token mixture: its loader's state before the batch of rows the mixture is
/// taking from, and how many rows of that batch it took.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceAt {
    /// The source loader's state before that batch.
    pub state: TokenState,
    /// Rows of that batch the mixture took.
    pub taken: usize,
}

/// A token mixture's resumable state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MixState {
    /// The seed (checked on restore).
    pub seed: u64,
    /// The mixture's epoch.
    pub epoch: u64,
    /// Batches delivered in it.
    pub next_batch: u64,
    /// Each source's place (`None`: not read yet in this epoch).
    pub sources: Vec<Option<SourceAt>>,
}

#[derive(Debug, Default)]
struct Inner {
    epoch: u64,
    next_batch: u64,
    sources: Vec<Option<SourceAt>>,
    resume: bool,
}

/// Where a token mixture's iterations start and stand.
#[derive(Debug, Default)]
pub struct MixPosition(Mutex<Inner>);

/// Where a pass starts: the epoch, its first batch and each source's place.
pub(super) type MixStart = (u64, u64, Vec<Option<SourceAt>>);

impl MixPosition {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The resumable state, for a mixture seeded with `seed`.
    pub(super) fn state(&self, seed: u64) -> MixState {
        let p = self.lock();
        MixState { seed, epoch: p.epoch, next_batch: p.next_batch, sources: p.sources.clone() }
    }

    /// Restores `st` after checking it against the mixture's `seed` and its `sources` count:
    /// the next pass resumes there.
    pub(super) fn restore(&self, st: MixState, seed: u64, sources: usize) -> Result<()> {
        if st.seed != seed {
            return Err(Error::config("state", format!("seed {} does not match the loader's seed {seed}", st.seed)));
        }
        if st.sources.len() != sources {
            return Err(Error::config(
                "state",
                format!("has {} mixture sources, this loader has {sources}", st.sources.len()),
            ));
        }
        *self.lock() = Inner { epoch: st.epoch, next_batch: st.next_batch, sources: st.sources, resume: true };
        Ok(())
    }

    /// Where a new pass starts: the restored position if a state was loaded since the last
    /// pass started, else the epoch's first batch with every source at its start.
    pub(super) fn start(&self, sources: usize) -> MixStart {
        let mut p = self.lock();
        if !std::mem::take(&mut p.resume) {
            p.next_batch = 0;
            p.sources = vec![None; sources];
        }
        (p.epoch, p.next_batch, p.sources.clone())
    }

    /// A batch was delivered; the sources stand at `after`.
    pub(super) fn advance(&self, after: Vec<Option<SourceAt>>) {
        let mut p = self.lock();
        p.next_batch += 1;
        p.sources = after;
    }
}

impl Positioned for MixPosition {
    fn set_epoch(&self, epoch: u64) -> bool {
        let mut p = self.lock();
        let changed = p.epoch != epoch;
        if changed {
            *p = Inner { epoch, ..Inner::default() };
        }
        changed
    }

    fn resume_pending(&self) -> bool {
        self.lock().resume
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::pack::Resume;

    fn at(cursor: u64, taken: usize) -> Option<SourceAt> {
        let state =
            TokenState { seed: 1, epoch: 0, next_batch: 2, at: Resume { epoch: 0, cursor, offset: 0 }, elastic: None };
        Some(SourceAt { state, taken })
    }

    #[test]
    fn a_mixture_state_round_trips_resumes_once_and_checks_seed_and_sources() {
        let p = MixPosition::default();
        assert!(p.set_epoch(3));
        assert_eq!(p.start(2), (3, 0, vec![None, None]));
        p.advance(vec![at(5, 1), None]);
        p.advance(vec![at(9, 3), at(2, 0)]);
        let st = p.state(7);
        let back: MixState = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
        assert_eq!(back, st);
        let q = MixPosition::default();
        assert!(q.restore(back.clone(), 8, 2).unwrap_err().to_string().contains("seed 7"));
        assert!(q.restore(back.clone(), 7, 3).unwrap_err().to_string().contains("2 mixture sources"));
        q.restore(back, 7, 2).unwrap();
        assert!(q.resume_pending() && !q.set_epoch(3));
        assert_eq!(q.start(2), (3, 2, vec![at(9, 3), at(2, 0)]));
        assert_eq!(q.start(2), (3, 0, vec![None, None]), "a second pass starts the epoch anew");
    }
}
