//! The saved state of a token loader: where iteration stands ([`TokenState`]), the elastic
//! base of an epoch continued on another number of ranks ([`Elastic`]) and what a state is
//! valid for ([`TokenFingerprint`]).

use crate::error::{Error, Result};
use crate::shell::epochs::Positioned;
use crate::tokens::pack::Resume;
use std::sync::Mutex;

/// Where the ranks of a saved run stood in one epoch, for a resume on another number of ranks:
/// rank `r` of `world_size` had delivered its documents before `at[r]` (and `at[r].offset`
/// tokens of the one there). The remaining documents of that epoch's order are dealt anew.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Elastic {
    /// Ranks of the saved run.
    pub world_size: usize,
    /// Where each of them stood (all in the same epoch).
    pub at: Vec<Resume>,
    /// Best-fit packing: per saved rank, the documents of its current block (by cursor, at or
    /// after `at[r].cursor`) already delivered wholly (`u64::MAX`) or in part (the tokens of
    /// their start delivered).
    #[serde(default)]
    pub delivered: Vec<Vec<(u64, u64)>>,
    /// The saved run's own elastic base, when it continued another run on other ranks in
    /// this epoch (its ranks' orders are that base's remainder, dealt).
    #[serde(default)]
    pub base: Option<Box<Elastic>>,
}

/// Where iteration stands: the epoch, batches delivered in it, and where the next batch's
/// first row starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenState {
    /// The seed (checked on restore).
    pub seed: u64,
    /// The epoch selected by `set_epoch` (infinite loaders: the one the pass started in).
    pub epoch: u64,
    /// Batches delivered since that epoch's start.
    pub next_batch: u64,
    /// Where the next row starts.
    pub at: Resume,
    /// The saved run this epoch's order continues, when it was resumed on another number of
    /// ranks (`at.cursor` counts this rank's documents of the remaining ones).
    pub elastic: Option<Elastic>,
}

#[derive(Debug, Default)]
struct PositionInner {
    epoch: u64,
    next_batch: u64,
    at: Resume,
    resume: bool,
    elastic: Option<Elastic>,
}

/// Where a token loader's iterations start and stand: the epoch, batches delivered in it,
/// where the next row starts, and whether a restored state waits for the next pass.
#[derive(Debug, Default)]
pub struct TokenPosition(Mutex<PositionInner>);

/// Where a pass starts: the resume point, its batch number, and the elastic base its epoch
/// continues.
pub(super) type TokenStart = (Resume, u64, Option<Elastic>);

impl TokenPosition {
    fn lock(&self) -> std::sync::MutexGuard<'_, PositionInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch selected.
    pub(super) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// The elastic base of the current epoch (`None`: a normal epoch).
    pub(super) fn elastic(&self) -> Option<Elastic> {
        self.lock().elastic.clone()
    }

    /// The resumable state, for a loader seeded with `seed`.
    pub(super) fn state(&self, seed: u64) -> TokenState {
        let p = self.lock();
        TokenState { seed, epoch: p.epoch, next_batch: p.next_batch, at: p.at, elastic: p.elastic.clone() }
    }

    /// Restores `st` after checking it against the loader's `seed`: the next pass resumes there.
    pub(super) fn restore(&self, st: TokenState, seed: u64) -> Result<()> {
        if st.seed != seed {
            return Err(Error::config("state", format!("seed {} does not match the loader's seed {seed}", st.seed)));
        }
        if let Some(e) = &st.elastic {
            if e.at.len() != e.world_size || e.at.iter().any(|a| a.epoch != st.at.epoch) {
                return Err(Error::config("state", "an elastic base needs one position per saved rank, in one epoch"));
            }
        }
        *self.lock() =
            PositionInner { epoch: st.epoch, next_batch: st.next_batch, at: st.at, resume: true, elastic: st.elastic };
        Ok(())
    }

    /// Where a new pass starts: the restored position if a state was loaded since the last
    /// pass started, else the epoch's first batch (an elastic base is left behind).
    pub(super) fn start(&self) -> TokenStart {
        let mut p = self.lock();
        if std::mem::take(&mut p.resume) {
            (p.at, p.next_batch, p.elastic.clone())
        } else {
            p.next_batch = 0;
            p.at = Resume { epoch: p.epoch, cursor: 0, offset: 0 };
            p.elastic = None;
            (p.at, 0, None)
        }
    }

    /// A batch was delivered; the next one starts at `at`.
    pub(super) fn advance(&self, at: Resume) {
        let mut p = self.lock();
        p.next_batch += 1;
        p.at = at;
    }
}

impl Positioned for TokenPosition {
    fn set_epoch(&self, epoch: u64) -> bool {
        let mut p = self.lock();
        let changed = p.epoch != epoch;
        if changed {
            *p = PositionInner {
                epoch,
                next_batch: 0,
                at: Resume { epoch, cursor: 0, offset: 0 },
                resume: false,
                elastic: None,
            };
        }
        changed
    }

    fn resume_pending(&self) -> bool {
        self.lock().resume
    }
}

/// What a saved state is valid for.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenFingerprint {
    /// Documents in the source.
    pub documents: u64,
    /// A hash of the files and their indexes.
    pub data_hash: String,
    /// A hash of the tokenizer's JSON (`none` for token files).
    pub tokenizer_hash: String,
    /// Rows per batch.
    pub batch_size: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// `concat` or `best_fit`, with the block size.
    pub pack: String,
    /// Document order: `none`, `global` or `window:N`.
    pub order: String,
    /// BOS/EOS added.
    pub special: String,
    /// Ranks.
    pub world_size: usize,
    /// This rank.
    pub rank: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: u64, cursor: u64, offset: u64) -> Resume {
        Resume { epoch, cursor, offset }
    }

    #[test]
    fn a_state_round_trips_and_resumes_once() {
        let p = TokenPosition::default();
        assert!(p.set_epoch(2));
        p.advance(at(2, 7, 3));
        p.advance(at(2, 9, 0));
        let st = p.state(5);
        assert_eq!((st.epoch, st.next_batch, st.at), (2, 2, at(2, 9, 0)));
        let json = serde_json::to_string(&st).unwrap();
        let back: TokenState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
        let q = TokenPosition::default();
        q.restore(back, 5).unwrap();
        assert!(q.resume_pending());
        assert!(!q.set_epoch(2), "the same epoch keeps a restored state");
        assert_eq!(q.start(), (at(2, 9, 0), 2, None));
        assert!(!q.resume_pending());
        assert_eq!(q.start(), (at(2, 0, 0), 0, None), "a second pass starts the epoch anew");
    }

    #[test]
    fn a_restore_checks_the_seed_and_the_elastic_base() {
        let p = TokenPosition::default();
        let st = TokenState { seed: 1, epoch: 0, next_batch: 0, at: at(0, 0, 0), elastic: None };
        let e = p.restore(st.clone(), 2).unwrap_err().to_string();
        assert!(e.contains("seed 1 does not match the loader's seed 2"), "{e}");
        let base = Elastic { world_size: 2, at: vec![at(0, 1, 0)], delivered: vec![], base: None };
        let e = p.restore(TokenState { elastic: Some(base), ..st.clone() }, 1).unwrap_err().to_string();
        assert!(e.contains("one position per saved rank"), "{e}");
        assert!(!p.resume_pending(), "a refused state changes nothing");
        assert!(p.set_epoch(4) && !p.set_epoch(4));
    }
}
