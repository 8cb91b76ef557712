//! Elastic resume of the token loader: the states of a run saved on other ranks merged into
//! one base ([`Elastic`]), and, for best-fit packing, which documents of each saved rank's
//! current block its delivered rows hold (the block read and tokenized again).

use super::config::PackMode;
use super::iter::TokenLoader;
use super::order::{elastic_positions, global_order};
use super::read::{RawDoc, Readers};
use super::state::{Elastic, TokenState};
use super::tokenize::{tokenize, Scratch};
use crate::error::{Error, Result};
use crate::tokens::pack::Resume;

impl TokenLoader {
    /// Continues a run saved by several ranks (`(state, rank, world_size)` of every one, any
    /// order) on this loader's ranks: every document that no saved rank had finished is dealt
    /// anew, each to exactly one rank (a partly used one without its used tokens). The states
    /// must be of one epoch; they may themselves continue a resume on other ranks (chains:
    /// 4 -> 3 -> 2). With `best_fit` packing, the documents of each saved rank's current block
    /// are tokenized again here to find which of them its delivered rows hold (a block's rows
    /// deliver whole documents, and the start of one longer than a row).
    pub fn load_states(&self, states: &[(TokenState, usize, usize)]) -> Result<()> {
        let (first, _, world) = states.first().ok_or_else(|| Error::config("state", "an empty list of states"))?;
        let mut at = vec![None; *world];
        for (st, rank, w) in states {
            if *w != *world || *rank >= *world {
                return Err(Error::config(
                    "state",
                    format!("rank {rank} of world_size {w} in a list for {world} ranks"),
                ));
            }
            if st.seed != first.seed || st.epoch != first.epoch || st.at.epoch != first.at.epoch {
                return Err(Error::config(
                    "state",
                    "the states are of different seeds or epochs: give one run's states",
                ));
            }
            if st.elastic != first.elastic {
                return Err(Error::config(
                    "state",
                    "the states continue different resumes on other ranks: give one run's states",
                ));
            }
            if at[*rank].replace(st.at).is_some() {
                return Err(Error::config("state", format!("two states of rank {rank}")));
            }
        }
        let at: Vec<Resume> = at
            .into_iter()
            .enumerate()
            .map(|(r, a)| a.ok_or_else(|| Error::config("state", format!("no state of rank {r} of {world}"))))
            .collect::<Result<_>>()?;
        let base = first.elastic.clone().filter(|b| b.at.first().is_some_and(|a| a.epoch == first.at.epoch));
        let mut elastic = Elastic { world_size: *world, at, delivered: Vec::new(), base: base.map(Box::new) };
        if self.kind().config.pack == PackMode::BestFit {
            elastic.delivered = self.best_fit_delivered(&elastic)?;
            for a in &mut elastic.at {
                a.offset = 0;
            }
        }
        let cursor_epoch = first.at.epoch;
        self.load_state(TokenState {
            seed: first.seed,
            epoch: first.epoch,
            next_batch: 0,
            at: Resume { epoch: cursor_epoch, cursor: 0, offset: 0 },
            elastic: Some(elastic),
        })
    }

    /// For each saved rank of `e` (best-fit packing, `at[r]` a block's start and the rows of it
    /// delivered): the documents of that block its delivered rows hold, wholly (`u64::MAX`) or
    /// their first tokens. The block's documents are read and tokenized again, and packed by
    /// the same plan as then.
    pub(super) fn best_fit_delivered(&self, e: &Elastic) -> Result<Vec<Vec<(u64, u64)>>> {
        let sh = &self.kind();
        let cfg = &sh.config;
        let Some(epoch) = e.at.first().map(|a| a.epoch) else { return Ok(vec![]) };
        let (all, _) = global_order(&sh.source, cfg, epoch);
        let mut out = Vec::with_capacity(e.world_size);
        for (q, at) in e.at.iter().enumerate() {
            if at.offset == 0 {
                out.push(vec![]);
                continue;
            }
            let mine = elastic_positions(all.len(), e.base.as_deref(), q, e.world_size);
            let (b0, b1) = (at.cursor as usize, (at.cursor + cfg.pack_window).min(mine.len() as u64) as usize);
            let block = mine.get(b0..b1).unwrap_or(&[]);
            let docs: Vec<(u64, u64)> = block.iter().map(|&(p, skip)| (all[p], skip)).collect();
            let lens = self.token_counts(&docs)?;
            let rows = crate::tokens::pack::plan_rows(&lens, cfg.seq_len);
            let mut used = vec![0u64; lens.len()];
            for row in rows.iter().take(at.offset as usize) {
                for &(k, s, n) in row {
                    if s as u64 != used[k] {
                        return Err(Error::Internal(
                            "a best-fit block delivered a document's pieces out of order".into(),
                        ));
                    }
                    used[k] += n as u64;
                }
            }
            out.push(
                lens.iter()
                    .zip(&used)
                    .enumerate()
                    .filter_map(|(k, (&n, &u))| {
                        let c = at.cursor + k as u64;
                        match u {
                            _ if n == 0 || u == n as u64 => Some((c, u64::MAX)),
                            0 => None,
                            u => Some((c, u)),
                        }
                    })
                    .collect(),
            );
        }
        Ok(out)
    }

    /// The token counts of documents `(global number, tokens already used)`, read and
    /// tokenized (BOS/EOS as configured) on the calling thread; a failed document counts 0.
    pub(super) fn token_counts(&self, docs: &[(u64, u64)]) -> Result<Vec<usize>> {
        let sh = &self.kind();
        let src = &sh.source;
        let mut order: Vec<(usize, usize, usize)> = docs
            .iter()
            .enumerate()
            .map(|(i, &(g, _))| {
                let (f, k) = src.locate(g);
                (f, k, i)
            })
            .collect();
        order.sort_unstable();
        let mut lens = vec![0usize; docs.len()];
        let mut readers = Readers::new(src);
        let mut scratch = Scratch::default();
        for (f, k, i) in order {
            let bytes = readers.read(src, (f, k), sh.config.max_document_bytes, &sh.config.text_key);
            let raw = RawDoc { epoch: 0, cursor: 0, at: (f, k), bytes, skip: docs[i].1, doc: docs[i].0, cached: false };
            let (d, _) = tokenize(sh, sh.tokenizer.as_ref(), raw, &mut scratch);
            lens[i] = d.tokens.len();
        }
        Ok(lens)
    }
}
