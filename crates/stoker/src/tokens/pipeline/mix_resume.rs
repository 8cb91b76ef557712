//! The token mixture's saved state ([`Resumable`]): its fingerprint (the mixture and each
//! source's loader's), its state dict (each source's loader's state dict inside), and how the
//! states of every rank of a run continue on another number of ranks: each source through its
//! own loader's elastic resume, the epoch ending when the saved run's rows are delivered.

use super::mix::{rows_per_rank, TokenMix};
use super::mix_state::{MixFingerprint, MixPosition, MixState};
use super::state::TokenState;
use crate::error::{Error, Result};
use crate::shell::resume::{one_run, Ranked, Resumable, ONE_RUN};
use crate::tokens::pack::Resume;
use serde_json::{json, Value};

impl Resumable for TokenMix {
    type State = MixState;
    type Fingerprint = MixFingerprint;

    /// The mixture (names, weights, rows per epoch), each source's loader's fingerprint, and
    /// the ranks.
    fn fingerprint(&self) -> MixFingerprint {
        MixFingerprint {
            mixture: self.spec.clone(),
            sources: self.subs.iter().map(|s| s.fingerprint()).collect(),
            rank: self.config.rank,
            world_size: self.config.world_size,
        }
    }

    fn save(&self, position: &MixPosition) -> MixState {
        position.state(self.config.seed, self.subs.len())
    }

    /// `{version: 1, kind: "token-mixture", seed, epoch, next_batch, sources[, end, offset]}`,
    /// each source's state dict (its loader's) under `sources`.
    fn fields(&self, _: &MixPosition, st: &MixState) -> Result<Value> {
        let sources = st
            .sources
            .iter()
            .zip(&self.subs)
            .map(|(at, sub)| at.as_ref().map_or(Ok(Value::Null), |a| sub.state_value(a)))
            .collect::<Result<Vec<_>>>()?;
        let mut v = json!({
            "version": 1, "kind": "token-mixture", "seed": st.seed, "epoch": st.epoch, "next_batch": st.next_batch,
            "sources": sources,
        });
        if let Some(end) = st.end {
            v["end"] = end.into();
            v["offset"] = st.offset.into();
        }
        Ok(v)
    }

    fn restore(&self, position: &MixPosition, st: MixState) -> Result<()> {
        position.restore(st, self.config.seed, self.subs.len())
    }

    /// All saved ranks at the same batch of one epoch: each source continues through its
    /// loader's elastic resume (every document no saved rank finished, dealt anew), and the
    /// epoch ends when the rows of the saved run's epoch are delivered.
    fn continue_ranks(&self, saved: &[Ranked<MixState>]) -> Result<MixState> {
        let c = &self.config;
        one_run(
            saved,
            &[
                ("epoch", |s: &MixState| json!(s.epoch)),
                ("next_batch", |s: &MixState| json!(s.next_batch)),
                ("end", |s: &MixState| json!([s.end, s.offset])),
            ],
            &format!("the ranks of a token mixture stop at the same batch of one epoch: {ONE_RUN}"),
        )?;
        let f = &saved[0].state;
        let old_world = saved.len();
        let start = TokenState {
            seed: c.seed,
            epoch: f.epoch << 32,
            next_batch: 0,
            at: Resume { epoch: f.epoch << 32, cursor: 0, offset: 0 },
            elastic: None,
        };
        for (d, sub) in self.subs.iter().enumerate() {
            let list: Vec<(TokenState, usize, usize)> = saved
                .iter()
                .enumerate()
                .map(|(rank, r)| (r.state.sources[d].clone().unwrap_or_else(|| start.clone()), rank, old_world))
                .collect();
            sub.load_states(list)
                .map_err(|e| Error::config("state", format!("mixture source '{}': {e}", self.spec.parts[d].name)))?;
        }
        // The rows of the saved epoch over all ranks, less those delivered, shared by these ranks.
        let done = f.next_batch * c.batch_size as u64;
        // Until a `stop` source runs out, when no `epoch_items` bounds the epoch: still so.
        let end = f.end.or_else(|| self.spec.epoch_items.map(|n| rows_per_rank(c, n, old_world))).map(|old_rows| {
            let done = done.min(old_rows);
            rows_per_rank(c, (old_rows - done) * old_world as u64, c.world_size)
        });
        Ok(MixState {
            seed: c.seed,
            epoch: f.epoch,
            next_batch: 0,
            sources: self.subs.iter().map(|s| Some(s.state())).collect(),
            end,
            offset: f.offset + done,
        })
    }
}
