//! Where a token mixture stands: the epoch, batches delivered in it, each source's loader state
//! after the last row the mixture took from it, and where an epoch continued on another number
//! of ranks ends. What a saved state holds and is valid for, and where a pass starts.

use super::state::{TokenFingerprint, TokenState};
use crate::error::{Error, Result};
use crate::shell::epochs::Positioned;
use std::sync::Mutex;

/// What a token mixture's saved state is valid for.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MixFingerprint {
    /// The mixture: the sources' names, weights and exhaustion, rows per epoch.
    pub mixture: crate::shell::mix::MixSpec,
    /// Each source's loader's fingerprint, in the order of the sources.
    pub sources: Vec<TokenFingerprint>,
    /// This loader's rank.
    pub rank: usize,
    /// The ranks.
    pub world_size: usize,
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
    /// Each source's loader state after the last row taken from it (`None`: none taken yet in
    /// this epoch).
    pub sources: Vec<Option<TokenState>>,
    /// Rows per rank of this epoch, when it continues a run of another number of ranks (`None`:
    /// the mixture's rows per epoch).
    pub end: Option<u64>,
    /// Rows per rank of the schedule before this epoch's first batch: a continued epoch goes on
    /// where the saved run's ranks stopped.
    #[serde(default)]
    pub offset: u64,
}

#[derive(Debug, Default)]
struct Inner {
    state: Option<MixState>,
    epoch: u64,
    resume: bool,
}

/// Where a token mixture's iterations start and stand.
#[derive(Debug, Default)]
pub struct MixPosition(Mutex<Inner>);

impl MixPosition {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The resumable state of a mixture of `sources` seeded with `seed`.
    pub(super) fn state(&self, seed: u64, sources: usize) -> MixState {
        let p = self.lock();
        match &p.state {
            Some(s) => MixState { seed, ..s.clone() },
            None => {
                MixState { seed, epoch: p.epoch, next_batch: 0, sources: vec![None; sources], end: None, offset: 0 }
            }
        }
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
        *self.lock() = Inner { epoch: st.epoch, state: Some(st), resume: true };
        Ok(())
    }

    /// Where a new pass starts: the restored state if one was loaded since the last pass
    /// started, else the epoch's first batch with no source read.
    pub(super) fn start(&self, seed: u64, sources: usize) -> MixState {
        let mut p = self.lock();
        if !std::mem::take(&mut p.resume) {
            p.state = None;
        }
        drop(p);
        self.state(seed, sources)
    }

    /// A batch was delivered; the sources stand at `after`.
    pub(super) fn advance(&self, after: Vec<Option<TokenState>>, seed: u64) {
        let mut p = self.lock();
        let epoch = p.epoch;
        let s = p.state.get_or_insert(MixState { seed, epoch, next_batch: 0, sources: vec![], end: None, offset: 0 });
        s.next_batch += 1;
        s.sources = after;
    }

    /// Rows per rank after which the current epoch ends, when it continues another run.
    pub(super) fn end(&self) -> Option<u64> {
        self.lock().state.as_ref().and_then(|s| s.end)
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

    fn at(cursor: u64) -> Option<TokenState> {
        Some(TokenState { seed: 1, epoch: 0, next_batch: 2, at: Resume { epoch: 0, cursor, offset: 0 }, elastic: None })
    }

    #[test]
    fn a_mixture_state_round_trips_resumes_once_and_checks_seed_and_sources() {
        let p = MixPosition::default();
        assert!(p.set_epoch(3));
        let fresh = MixState { seed: 7, epoch: 3, next_batch: 0, sources: vec![None, None], end: None, offset: 0 };
        assert_eq!(p.start(7, 2), fresh);
        p.advance(vec![at(5), None], 7);
        p.advance(vec![at(9), at(2)], 7);
        let st = p.state(7, 2);
        assert_eq!((st.epoch, st.next_batch), (3, 2));
        let back: MixState = serde_json::from_str(&serde_json::to_string(&st).unwrap()).unwrap();
        assert_eq!(back, st);
        let q = MixPosition::default();
        assert!(q.restore(back.clone(), 8, 2).unwrap_err().to_string().contains("seed 7"));
        assert!(q.restore(back.clone(), 7, 3).unwrap_err().to_string().contains("2 mixture sources"));
        q.restore(back.clone(), 7, 2).unwrap();
        assert!(q.resume_pending() && !q.set_epoch(3));
        assert_eq!(q.start(7, 2), back);
        assert_eq!(q.start(7, 2), fresh, "a second pass starts the epoch anew");
    }
}
