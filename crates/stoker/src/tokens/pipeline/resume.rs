//! The token loader's saved state ([`Resumable`]): its fingerprint and state dict, and its
//! elastic resume: the states of a run saved on other ranks merged into one base
//! ([`Elastic`]), and, for best-fit packing, which documents of each saved rank's current
//! block its delivered rows hold (the block read and tokenized again).

use super::config::PackMode;
use super::order::{elastic_positions, global_order};
use super::read::{RawDoc, Readers};
use super::shared::Tokens;
use super::state::{Elastic, TokenFingerprint, TokenPosition, TokenState};
use super::tokenize::{tokenize, Scratch};
use crate::error::{Error, Result};
use crate::shell::resume::{one_run, Ranked, Resumable, ONE_RUN};
use crate::tokens::pack::Resume;
use serde_json::{json, Value};

impl Resumable for Tokens {
    type State = TokenState;
    type Fingerprint = TokenFingerprint;

    fn fingerprint(&self) -> TokenFingerprint {
        let c = &self.config;
        let order = match (c.shuffle, self.source.random_access()) {
            (false, _) => "none".to_string(),
            (true, true) => "global".to_string(),
            (true, false) => format!("window:{}", c.shuffle_window),
        };
        TokenFingerprint {
            documents: self.source.len(),
            data_hash: format!("{:016x}", self.source.hash()),
            tokenizer_hash: self.tokenizer.as_ref().map_or("none".into(), |t| format!("{:016x}", t.hash)),
            batch_size: c.batch_size,
            seq_len: c.seq_len,
            pack: match c.pack {
                PackMode::Concat => "concat".into(),
                PackMode::BestFit => format!("best_fit:{}", c.pack_window),
            },
            order,
            special: format!("bos={:?}:{} eos={:?}:{} pad={}", self.bos, c.add_bos, self.eos, c.add_eos, self.pad),
            world_size: c.world_size,
            rank: c.rank,
        }
    }

    fn save(&self, position: &TokenPosition) -> TokenState {
        position.state(self.config.seed)
    }

    /// `{version: 1, kind: "tokens", seed, epoch, next_batch, cursor_epoch, cursor, offset,
    /// elastic}`.
    fn fields(&self, _: &TokenPosition, st: &TokenState) -> Result<Value> {
        Ok(json!({
            "version": 1, "kind": "tokens", "seed": st.seed, "epoch": st.epoch, "next_batch": st.next_batch,
            "cursor_epoch": st.at.epoch, "cursor": st.at.cursor, "offset": st.at.offset, "elastic": st.elastic,
        }))
    }

    fn restore(&self, position: &TokenPosition, st: TokenState) -> Result<()> {
        position.restore(st, self.config.seed)
    }

    /// Every document that no saved rank had finished is dealt anew, each to exactly one rank
    /// (a partly used one without its used tokens). The states must be of one epoch; they may
    /// themselves continue a resume on other ranks (chains: 4 -> 3 -> 2). With `best_fit`
    /// packing, the documents of each saved rank's current block are tokenized again here to
    /// find which of them its delivered rows hold (a block's rows deliver whole documents, and
    /// the start of one longer than a row).
    fn continue_ranks(&self, saved: &[Ranked<TokenState>]) -> Result<TokenState> {
        one_run(
            saved,
            &[
                ("seed", |s: &TokenState| json!(s.seed)),
                ("epoch", |s: &TokenState| json!(s.epoch)),
                ("cursor_epoch", |s: &TokenState| json!(s.at.epoch)),
                ("elastic", |s: &TokenState| json!(s.elastic)),
            ],
            ONE_RUN,
        )?;
        let f = &saved[0].state;
        let at: Vec<Resume> = saved.iter().map(|r| r.state.at).collect();
        let base = f.elastic.clone().filter(|b| b.at.first().is_some_and(|a| a.epoch == f.at.epoch));
        let mut elastic = Elastic { world_size: saved.len(), at, delivered: Vec::new(), base: base.map(Box::new) };
        if self.config.pack == PackMode::BestFit {
            elastic.delivered = self.best_fit_delivered(&elastic)?;
            for a in &mut elastic.at {
                a.offset = 0;
            }
        }
        Ok(TokenState {
            seed: f.seed,
            epoch: f.epoch,
            next_batch: 0,
            at: Resume { epoch: f.at.epoch, cursor: 0, offset: 0 },
            elastic: Some(elastic),
        })
    }
}

impl Tokens {
    /// For each saved rank of `e` (best-fit packing, `at[r]` a block's start and the rows of it
    /// delivered): the documents of that block its delivered rows hold, wholly (`u64::MAX`) or
    /// their first tokens. The block's documents are read and tokenized again, and packed by
    /// the same plan as then.
    pub(super) fn best_fit_delivered(&self, e: &Elastic) -> Result<Vec<Vec<(u64, u64)>>> {
        let cfg = &self.config;
        let Some(epoch) = e.at.first().map(|a| a.epoch) else { return Ok(vec![]) };
        let (all, _) = global_order(&self.source, cfg, epoch);
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
        let src = &self.source;
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
            let bytes = readers.read(src, (f, k), self.config.max_document_bytes, &self.config.text_key);
            let raw = RawDoc { epoch: 0, cursor: 0, at: (f, k), bytes, skip: docs[i].1, doc: docs[i].0, cached: false };
            let (d, _) = tokenize(self, self.tokenizer.as_ref(), raw, &mut scratch);
            lens[i] = d.tokens.len();
        }
        Ok(lens)
    }
}
