//! The document order of an epoch: every document in a seeded order (global for random
//! access, windows of a file for streams), each rank's part, what a saved run of other ranks
//! left (elastic), and the rows every rank delivers when token counts are known.

use super::config::{PackMode, TokenConfig};
use super::state::Elastic;
use crate::shell::rng::{self, Rng};
use crate::tokens::corpus::DocSource;
use crate::tokens::docs::Format;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// This rank's documents of one epoch, in order, and where each read group starts (a window
/// of a compressed file, read from its stream together).
pub(super) struct EpochOrder {
    pub(super) docs: Vec<u64>,
    pub(super) groups: Vec<usize>,
    /// Tokens already delivered of some documents (by cursor): an elastic resume's partly
    /// used documents.
    pub(super) skips: BTreeMap<u64, u64>,
}

/// Bytes of the documents of one shuffle window of a compressed file, at most.
pub(super) const WINDOW_BYTES: u64 = 64 << 20;

pub(super) fn epoch_order(src: &DocSource, cfg: &TokenConfig, epoch: u64, elastic: Option<&Elastic>) -> EpochOrder {
    let (all, bounds) = global_order(src, cfg, epoch);
    match elastic {
        None => rank_order(&all, &bounds, cfg.rank, cfg.world_size),
        Some(e) => elastic_order(&all, &bounds, e, cfg.rank, cfg.world_size),
    }
}

/// Rank `k` of `w`'s positions in a global order of `n` documents, each with the tokens of it
/// already delivered: every `w`-th position without a base; with one, every `w`-th of what
/// the saved run of `e.world_size` ranks left (the positions none of its ranks had finished,
/// in the global order; a partly used document with its used tokens). Chains: the saved
/// run's ranks' own positions come from its base, if it had one.
pub(super) fn elastic_positions(n: usize, e: Option<&Elastic>, k: usize, w: usize) -> Vec<(usize, u64)> {
    let Some(e) = e else { return (k..n).step_by(w.max(1)).map(|p| (p, 0)).collect() };
    let mut remaining: Vec<(usize, u64)> = Vec::new(); // (position, tokens to skip)
    for q in 0..e.world_size {
        let at = e.at[q];
        let delivered: BTreeMap<u64, u64> = e.delivered.get(q).map(|d| d.iter().copied().collect()).unwrap_or_default();
        for (c, (p, skip)) in elastic_positions(n, e.base.as_deref(), q, e.world_size).into_iter().enumerate() {
            let c = c as u64;
            if c < at.cursor {
                continue;
            }
            let used = match delivered.get(&c) {
                Some(&u64::MAX) => continue,
                Some(&t) => t,
                None if c == at.cursor => at.offset,
                None => 0,
            };
            remaining.push((p, skip + used));
        }
    }
    remaining.sort_unstable();
    remaining.into_iter().skip(k).step_by(w.max(1)).collect()
}

/// Rank `k` of `w`'s part of what a saved run left of a global order (see
/// [`elastic_positions`]), with its read groups.
pub(super) fn elastic_order(all: &[u64], bounds: &[usize], e: &Elastic, k: usize, w: usize) -> EpochOrder {
    let mine = elastic_positions(all.len(), Some(e), k, w);
    let docs = mine.iter().map(|&(p, _)| all[p]).collect();
    let skips = mine.iter().enumerate().filter(|(_, m)| m.1 > 0).map(|(c, m)| (c as u64, m.1)).collect();
    // A new read group wherever a document comes from another window of the order.
    let mut groups = vec![0];
    let mut last = None;
    for (c, &(p, _)) in mine.iter().enumerate() {
        let g = bounds.partition_point(|&b| b <= p);
        if last.is_some_and(|l| l != g) {
            groups.push(c);
        }
        last = Some(g);
    }
    groups.push(mine.len());
    groups.dedup();
    EpochOrder { docs, groups, skips }
}

/// Every document of `epoch` in order, and where each read group starts. A global
/// permutation for local uncompressed files; windows of a file otherwise (compressed files,
/// and objects in a store, read at positions in cached blocks: a window's documents are read
/// in file order, so a pass fetches each block of an object once instead of one request per
/// document).
pub(super) fn global_order(src: &DocSource, cfg: &TokenConfig, epoch: u64) -> (Vec<u64>, Vec<usize>) {
    let mut r = Rng::new(cfg.seed, rng::stream::PERMUTATION, epoch);
    let (mut all, mut bounds) = (Vec::with_capacity(src.len() as usize), vec![0usize]);
    if src.random_access() {
        all.extend(0..src.len());
        if cfg.shuffle {
            rng::shuffle(&mut all, &mut r);
        }
    } else {
        // Streams are read in windows of consecutive documents of one file (bounded by count
        // and bytes); shuffled, the files are permuted and each window shuffled.
        let mut files: Vec<usize> = (0..src.files.len()).collect();
        if cfg.shuffle {
            rng::shuffle(&mut files, &mut r);
        }
        let first = |f: usize| src.files[..f].iter().map(|x| x.docs.len() as u64).sum::<u64>();
        for f in files {
            let base = first(f);
            let docs = &src.files[f].docs;
            let mut s = 0;
            while s < docs.len() {
                let (mut e, mut bytes) = (s, 0u64);
                let parquet = src.files[f].compression == crate::tokens::docs::Compression::Parquet;
                while e < docs.len()
                    && (e - s) < cfg.shuffle_window as usize
                    && (if parquet {
                        docs[e].offset == docs[s].offset
                    } else {
                        e == s || bytes + docs[e].len <= WINDOW_BYTES
                    })
                {
                    bytes += docs[e].len;
                    e += 1;
                }
                let from = all.len();
                all.extend((s..e).map(|k| base + k as u64));
                if cfg.shuffle {
                    rng::shuffle(&mut all[from..], &mut r);
                }
                bounds.push(all.len());
                s = e;
            }
        }
    }
    (all, bounds)
}

/// Rank `k` of `w`'s part of a global order: position p goes to rank p % w.
pub(super) fn rank_order(all: &[u64], bounds: &[usize], k: usize, w: usize) -> EpochOrder {
    let docs: Vec<u64> = all.iter().skip(k).step_by(w).copied().collect();
    let mut groups: Vec<usize> = bounds.iter().map(|&b| ((b + w - 1 - k.min(b + w - 1)) / w).min(docs.len())).collect();
    groups.dedup();
    EpochOrder { docs, groups, skips: BTreeMap::new() }
}

/// Rows every rank delivers in an epoch when the documents' token counts are known without
/// tokenizing (token files), remembered for the last epoch asked (`len()` asks every epoch).
#[derive(Debug, Default)]
pub(super) struct RowsMemo(Mutex<Option<RowsKey>>);

/// `((epoch, elastic base), rows per rank)`.
type RowsKey = ((u64, Option<Elastic>), Option<u64>);

impl RowsMemo {
    /// See [`count_rows_per_rank`]; computed once per epoch and elastic base.
    pub(super) fn rows_per_rank(
        &self,
        src: &DocSource,
        cfg: &TokenConfig,
        epoch: u64,
        elastic: Option<&Elastic>,
    ) -> Option<u64> {
        let key = (epoch, elastic.cloned());
        let mut memo = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((k, rows)) = memo.as_ref() {
            if *k == key {
                return *rows;
            }
        }
        let rows = count_rows_per_rank(src, cfg, epoch, elastic);
        *memo = Some((key, rows));
        rows
    }
}

/// Rows every rank delivers in `epoch` when the documents' token counts are known without
/// tokenizing (token files): the fewest any rank's documents fill, so that every rank has
/// the same number of batches. `None` for text (known only once tokenized).
fn count_rows_per_rank(src: &DocSource, cfg: &TokenConfig, epoch: u64, elastic: Option<&Elastic>) -> Option<u64> {
    if !matches!(src.format, Format::Tokens(_) | Format::Cache(_)) || cfg.infinite {
        return None;
    }
    // A cache's documents get BOS/EOS as text does.
    let extra = match src.format {
        Format::Cache(_) => usize::from(cfg.add_bos) + usize::from(cfg.add_eos),
        _ => 0,
    };
    let (all, bounds) = global_order(src, cfg, epoch);
    let len = cfg.seq_len;
    let tokens = |g: u64| {
        let (f, k) = src.locate(g);
        let file = &src.files[f];
        (file.docs[k].len / file.width.max(1) as u64) as usize + extra
    };
    (0..cfg.world_size)
        .map(|r| {
            let order = match elastic {
                None => rank_order(&all, &bounds, r, cfg.world_size),
                Some(e) => elastic_order(&all, &bounds, e, r, cfg.world_size),
            };
            let skipped: u64 = order.skips.values().sum();
            match cfg.pack {
                PackMode::Concat => (order.docs.iter().map(|&g| tokens(g) as u64).sum::<u64>() - skipped) / len as u64,
                PackMode::BestFit => order
                    .docs
                    .chunks(cfg.pack_window as usize)
                    .enumerate()
                    .map(|(b, block)| {
                        let first = b as u64 * cfg.pack_window;
                        let lens: Vec<usize> = block
                            .iter()
                            .enumerate()
                            .map(|(k, &g)| {
                                let skip = order.skips.get(&(first + k as u64)).copied().unwrap_or(0);
                                tokens(g).saturating_sub(skip as usize)
                            })
                            .collect();
                        crate::tokens::pack::plan_rows(&lens, len).len() as u64
                    })
                    .sum(),
            }
        })
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::pack::Resume;
    use std::collections::BTreeSet;

    fn at(cursor: u64, offset: u64) -> Resume {
        Resume { epoch: 0, cursor, offset }
    }

    #[test]
    fn ranks_deal_a_global_order_disjointly_and_keep_its_read_groups() {
        let all: Vec<u64> = (0..23).rev().collect();
        let bounds = vec![0, 5, 12, 23];
        let mut seen = BTreeSet::new();
        for k in 0..3 {
            let o = rank_order(&all, &bounds, k, 3);
            let want: Vec<u64> = all.iter().skip(k).step_by(3).copied().collect();
            assert_eq!(o.docs, want);
            assert!(o.docs.iter().all(|d| seen.insert(*d)), "rank {k} repeats a document");
            // Each group is the rank's share of one window of the global order.
            assert_eq!((o.groups[0], *o.groups.last().unwrap()), (0, o.docs.len()));
            for g in o.groups.windows(2) {
                let window = |c: usize| bounds.partition_point(|&b| b <= k + 3 * c);
                assert!((g[0]..g[1]).all(|c| window(c) == window(g[0])), "rank {k}: {:?}", o.groups);
            }
        }
        assert_eq!(seen.len(), all.len());
    }

    #[test]
    fn an_elastic_resume_deals_what_no_saved_rank_finished_exactly_once() {
        let n = 40;
        // Three saved ranks: rank 0 finished 4 of its documents and 9 tokens of the fifth,
        // rank 1 finished 6, rank 2 none.
        let e = Elastic { world_size: 3, at: vec![at(4, 9), at(6, 0), at(0, 0)], delivered: vec![], base: None };
        let finished: BTreeSet<usize> = (0..3)
            .flat_map(|q| elastic_positions(n, None, q, 3).into_iter().take(e.at[q].cursor as usize))
            .map(|(p, _)| p)
            .collect();
        let mut dealt = BTreeSet::new();
        for k in 0..2 {
            for (p, skip) in elastic_positions(n, Some(&e), k, 2) {
                assert!(dealt.insert(p), "position {p} dealt twice");
                // Rank 0's fifth document (global position 12) goes on after its 9 tokens.
                assert_eq!(skip, if p == 12 { 9 } else { 0 }, "position {p}");
            }
        }
        assert!(finished.is_disjoint(&dealt));
        assert_eq!(finished.len() + dealt.len(), n);
        // Chains: the 2 ranks stop again and 3 go on; nothing is lost or repeated.
        let e2 = Elastic { world_size: 2, at: vec![at(3, 0), at(5, 2)], delivered: vec![], base: Some(Box::new(e)) };
        let second: BTreeSet<usize> = (0..2)
            .flat_map(|q| elastic_positions(n, e2.base.as_deref(), q, 2).into_iter().take(e2.at[q].cursor as usize))
            .map(|(p, _)| p)
            .collect();
        let mut third = BTreeSet::new();
        for k in 0..3 {
            for (p, _) in elastic_positions(n, Some(&e2), k, 3) {
                assert!(third.insert(p), "position {p} dealt twice after the chain");
            }
        }
        assert!(second.is_disjoint(&third) && finished.is_disjoint(&third));
        assert_eq!(finished.len() + second.len() + third.len(), n);
    }

    #[test]
    fn best_fit_documents_delivered_in_a_block_are_not_dealt_again() {
        // Saved rank 0 of 1 stood at a block starting at its document 2; of that block it had
        // delivered document 3 whole and 5 tokens of document 4.
        let e = Elastic { world_size: 1, at: vec![at(2, 0)], delivered: vec![vec![(3, u64::MAX), (4, 5)]], base: None };
        let got = elastic_positions(8, Some(&e), 0, 1);
        assert_eq!(got, vec![(2, 0), (4, 5), (5, 0), (6, 0), (7, 0)]);
        let o = elastic_order(&(10..18).collect::<Vec<_>>(), &[0, 4, 8], &e, 0, 1);
        assert_eq!(o.docs, vec![12, 14, 15, 16, 17]);
        assert_eq!(o.skips, BTreeMap::from([(1, 5)]));
        assert_eq!(o.groups, vec![0, 1, 5], "a new read group where the order's window changes");
    }
}
