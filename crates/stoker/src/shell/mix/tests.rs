//! The mixture's order: ranks, passes, epochs, `stop`, elastic resumes.

use super::*;
use std::collections::HashSet;

fn spec(parts: &[(&str, f64, Exhausted)], epoch_items: Option<u64>) -> MixSpec {
    MixSpec {
        parts: parts.iter().map(|&(n, w, e)| MixPart { name: n.into(), weight: w, exhausted: e }).collect(),
        epoch_items,
    }
}

fn sampler(batch_size: usize, rank: usize, world_size: usize) -> Deal {
    Deal { batch_size, shuffle: true, seed: 7, rank, world_size, drop_last: false }
}

fn mix(s: &MixSpec, lens: &[usize], bs: usize, rank: usize, world: usize) -> Mixture {
    Mixture::new(s, lens, &sampler(bs, rank, world)).unwrap()
}

use Exhausted::{Repeat, Stop};

#[test]
fn every_rank_has_exact_shares_and_the_ranks_read_disjoint_items() {
    let s = spec(&[("a", 0.5, Repeat), ("b", 0.3, Repeat), ("c", 0.2, Repeat)], Some(600));
    let lens = [1000, 500, 300];
    let mut seen = HashSet::new();
    for rank in 0..3 {
        let m = mix(&s, &lens, 10, rank, 3);
        let order = m.epoch_order(0);
        assert_eq!(order.len(), 200);
        let mut counts = [0u64; 3];
        for (n, &i) in order.iter().enumerate() {
            counts[m.source_of(i)] += 1;
            for (d, share) in [(0, 5), (1, 3), (2, 2)] {
                let lag = (counts[d] as i64 * 10 - (n as i64 + 1) * share).abs();
                assert!(lag < 10, "rank {rank}, source {d}: {counts:?} after {}", n + 1);
            }
            assert!(seen.insert(i), "sample {i} taken twice");
        }
    }
    // Together the ranks took a prefix of each source's first pass: 300 of a, 180 of b, 120 of c.
    let by_source = |d: usize| seen.iter().filter(|&&i| mix(&s, &lens, 10, 0, 3).source_of(i) == d).count();
    assert_eq!([by_source(0), by_source(1), by_source(2)], [300, 180, 120]);
}

#[test]
fn a_source_that_runs_out_starts_a_fresh_pass_and_epochs_continue_the_schedule() {
    let s = spec(&[("big", 0.5, Repeat), ("small", 0.5, Repeat)], Some(40));
    let m = mix(&s, &[100, 4], 4, 0, 1);
    let order: Vec<u32> = (0..3).flat_map(|e| m.epoch_order(e)).collect();
    // The same as one epoch three times as long: the schedule and the passes run on.
    let long = mix(&spec(&[("big", 0.5, Repeat), ("small", 0.5, Repeat)], Some(120)), &[100, 4], 4, 0, 1);
    assert_eq!(order, long.epoch_order(0));
    let small: Vec<u32> = order.iter().copied().filter(|&i| m.source_of(i) == 1).collect();
    assert_eq!(small.len(), 60);
    let passes: Vec<Vec<u32>> = small.chunks(4).map(|c| c.to_vec()).collect();
    for p in &passes {
        let mut sorted = p.clone();
        sorted.sort();
        assert_eq!(sorted, vec![100, 101, 102, 103], "each pass is a permutation");
    }
    assert!(passes.windows(2).any(|w| w[0] != w[1]), "each pass is shuffled afresh");
    // The big source never repeats within its pass.
    let big: Vec<u32> = order.iter().copied().filter(|&i| m.source_of(i) == 0).take(100).collect();
    assert_eq!(big.iter().collect::<HashSet<_>>().len(), 60);
}

#[test]
fn a_stop_source_ends_the_epoch_on_every_rank_and_each_epoch_starts_afresh() {
    let s = spec(&[("web", 0.75, Repeat), ("books", 0.25, Stop)], None);
    // books serves 10 / 2 = 5 rounds; its 6th turn (position 21 of 0.25-spaced turns) ends the epoch.
    let ranks: Vec<Mixture> = (0..2).map(|r| mix(&s, &[1000, 10], 3, r, 2)).collect();
    let orders: Vec<Vec<u32>> = ranks.iter().map(|m| m.epoch_order(0)).collect();
    assert_eq!(orders[0].len(), orders[1].len());
    assert_eq!(ranks[0].num_batches(), orders[0].len().div_ceil(3));
    let books: HashSet<u32> = orders.iter().flatten().copied().filter(|&i| ranks[0].source_of(i) == 1).collect();
    assert_eq!(books.len(), 10, "every book once, then the epoch ends");
    let positions = orders[0].len();
    assert!((20..24).contains(&positions), "{positions}");
    // The next epoch starts every source afresh: a new permutation of the same books.
    let next = ranks[0].epoch_order(1);
    assert_eq!(next.len(), positions);
    assert_ne!(next, orders[0]);
}

#[test]
fn an_elastic_resume_from_four_ranks_to_three_takes_every_remaining_sample_once() {
    let s = spec(&[("a", 0.6, Repeat), ("b", 0.3, Repeat), ("c", 0.1, Repeat)], Some(480));
    let lens = [2000, 1000, 500];
    let bs = 8;
    // Four ranks deliver 5 of their 15 batches, then three ranks continue.
    let mut taken = Vec::new();
    for r in 0..4 {
        taken.extend_from_slice(&mix(&s, &lens, bs, r, 4).epoch_order(0)[..5 * bs]);
    }
    let base: &[(usize, &[usize])] = &[(4, &[5; 4])];
    let mut continued = vec![];
    for r in 0..3 {
        let order = mix(&s, &lens, bs, r, 3).elastic_order(0, base).unwrap();
        assert_eq!(order.len(), (480 - 160) / 3);
        continued.push(order);
    }
    let all: Vec<u32> = taken.iter().chain(continued.iter().flatten()).copied().collect();
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), all.len(), "no sample twice");
    // What four ranks would have taken in the whole epoch, per source, is what was taken.
    let m = mix(&s, &lens, bs, 0, 4);
    let count = |v: &[u32], d: usize| v.iter().filter(|&&i| m.source_of(i) == d).count();
    let whole: Vec<u32> = (0..4).flat_map(|r| mix(&s, &lens, bs, r, 4).epoch_order(0)).collect();
    for d in 0..3 {
        assert!(count(&all, d).abs_diff(count(&whole, d)) <= 3, "source {d}");
    }
    // Each new rank still has exact shares over its own continued positions.
    for order in &continued {
        let a = count(order, 0) as f64;
        assert!((a - 0.6 * order.len() as f64).abs() < 1.0 + 1e-9, "{a} of {}", order.len());
    }
    // Ranks that stopped at different batches are refused, naming what they saved.
    let uneven: &[(usize, &[usize])] = &[(2, &[3, 4])];
    let e = mix(&s, &lens, bs, 0, 3).elastic_order(0, uneven).unwrap_err().to_string();
    assert!(e.contains("[3, 4]"), "{e}");
}

#[test]
fn the_order_is_a_pure_function_of_the_spec() {
    let s = spec(&[("a", 3.0, Repeat), ("b", 7.0, Repeat)], Some(100));
    let a = mix(&s, &[30, 70], 5, 1, 2);
    assert_eq!(a.epoch_order(4), mix(&s, &[30, 70], 5, 1, 2).epoch_order(4));
    let mut other = sampler(5, 1, 2);
    other.seed = 8;
    assert_ne!(a.epoch_order(4), Mixture::new(&s, &[30, 70], &other).unwrap().epoch_order(4));
    // An empty source, and a mixture too short for one batch, are errors.
    assert!(Mixture::new(&s, &[0, 70], &other).is_err());
    assert!(Mixture::new(&spec(&[("a", 1.0, Repeat)], Some(3)), &[10], &sampler(2, 0, 4)).is_err());
}
