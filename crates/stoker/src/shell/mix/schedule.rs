//! [`Schedule`]: which source each position of a mixture takes, a pure function of the weights
//! and the position, with exact shares at every prefix.
//!
//! The weights become integers `a_d` with `D = sum(a_d)` ([`Weights`]): decimal weights as
//! written (`0.7, 0.2, 0.1` are `7, 2, 1`; `0.999, 0.001` are `999, 1`), integers as they are
//! (`3, 7`). Source `d`'s share is `a_d / D`.
//!
//! One period of `D` positions is laid out once by earliest-deadline-first over Pfair windows
//! (Baruah et al., "Proportionate progress"): the `j`-th item of source `d` (from 1) may take a
//! position in `[floor((j-1) D / a_d), ceil(j D / a_d))`; at each position the eligible source
//! whose window closes first takes it (ties: the lower source index). On one processor with
//! shares summing to one, EDF meets every window, so after `n` positions every source has
//! `count_d(n)` items with `|count_d(n) - n a_d / D| < 1`: exact at every prefix, within one
//! item, for any number of sources and any weights (Megatron's "furthest behind its share"
//! blend keeps this too, but is computed by replaying it from the start). After a period every source has exactly `a_d` items, so the schedule
//! repeats: position `n` takes `period[n mod D]`, and `count_d(n)` is closed form
//! ([`Schedule::counts_at`]): resuming at any position is O(D) at most, not O(n).

use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Most sources a mixture may have.
pub const MAX_SOURCES: usize = 255;

/// Longest period (the sum of the integer weights) the schedule lays out: weights that need a
/// longer one are rounded to shares of [`ROUNDED_TOTAL`].
pub const MAX_PERIOD: u64 = 1 << 24;

/// The total that weights with more than six decimals (or a longer period) are rounded to.
pub const ROUNDED_TOTAL: u64 = 1_000_000;

/// The weights as integers: source `d`'s share is `parts[d] / total`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weights {
    /// Integer weight per source (≥ 1), divided by their greatest common divisor.
    pub parts: Vec<u64>,
    /// Their sum: the schedule's period.
    pub total: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Weights {
    /// Integer weights for `weights` (finite, > 0): the integers themselves when all are
    /// integers, else the decimals as written with up to six places, else shares of
    /// [`ROUNDED_TOTAL`] by largest remainder. An error names a weight that is not positive and
    /// finite, or one too small to get a share.
    pub fn new(weights: &[f64]) -> Result<Weights> {
        if weights.is_empty() {
            return Err(Error::config("mixture", "has no source"));
        }
        if weights.len() > MAX_SOURCES {
            return Err(Error::config("mixture", format!("{} sources: at most {MAX_SOURCES}", weights.len())));
        }
        if let Some((d, w)) = weights.iter().enumerate().find(|(_, w)| !(w.is_finite() && **w > 0.0)) {
            return Err(Error::config("mixture", format!("weight {w} of source {d}: must be a positive number")));
        }
        let scaled = |scale: f64| -> Option<Vec<u64>> {
            weights
                .iter()
                .map(|&w| {
                    let x = w * scale;
                    let r = x.round();
                    ((x - r).abs() <= 1e-9 * r.max(1.0) && r >= 1.0 && r < MAX_PERIOD as f64).then_some(r as u64)
                })
                .collect()
        };
        let exact = (0..=6).find_map(|k| scaled(10f64.powi(k))).filter(|p| p.iter().sum::<u64>() <= MAX_PERIOD);
        let parts = match exact {
            Some(p) => p,
            None => Self::rounded(weights)?,
        };
        let g = parts.iter().fold(0, |g, &p| gcd(g, p));
        let parts: Vec<u64> = parts.iter().map(|p| p / g).collect();
        let total = parts.iter().sum();
        Ok(Weights { parts, total })
    }

    /// Shares of [`ROUNDED_TOTAL`] by largest remainder.
    fn rounded(weights: &[f64]) -> Result<Vec<u64>> {
        let sum: f64 = weights.iter().sum();
        let quotas: Vec<f64> = weights.iter().map(|w| w / sum * ROUNDED_TOTAL as f64).collect();
        let mut parts: Vec<u64> = quotas.iter().map(|q| q.floor() as u64).collect();
        let mut order: Vec<usize> = (0..weights.len()).collect();
        order.sort_by(|&a, &b| (quotas[b] - quotas[b].floor()).total_cmp(&(quotas[a] - quotas[a].floor())));
        let short = ROUNDED_TOTAL.saturating_sub(parts.iter().sum());
        for &d in order.iter().take(short as usize) {
            parts[d] += 1;
        }
        if let Some(d) = parts.iter().position(|&p| p == 0) {
            return Err(Error::config(
                "mixture",
                format!(
                    "weight {} of source {d} is under one part in {ROUNDED_TOTAL} of the total: too small to schedule",
                    weights[d]
                ),
            ));
        }
        Ok(parts)
    }

    /// Source `d`'s share, `parts[d] / total`.
    pub fn share(&self, d: usize) -> f64 {
        self.parts[d] as f64 / self.total as f64
    }
}

/// The source of every position of a mixture ([module docs](self)).
#[derive(Debug, Clone)]
pub struct Schedule {
    weights: Weights,
    /// The source of each position of one period.
    period: Vec<u8>,
}

impl Schedule {
    /// Lays out one period for `weights`.
    pub fn new(weights: Weights) -> Schedule {
        let (total, k) = (weights.total, weights.parts.len());
        let window = |d: usize, j: u64| {
            // The j-th item (from 1) of source d: release floor((j-1) D / a), deadline ceil(j D / a).
            let a = weights.parts[d];
            ((j - 1) * total / a, (j * total).div_ceil(a))
        };
        let mut period = Vec::with_capacity(total as usize);
        let mut next = vec![1u64; k];
        // Eligible items by (deadline, source); items not yet released by (release, source).
        let mut ready = BinaryHeap::new();
        let mut waiting = BinaryHeap::new();
        for d in 0..k {
            let (release, deadline) = window(d, 1);
            if release == 0 {
                ready.push(Reverse((deadline, d)));
            } else {
                waiting.push(Reverse((release, d)));
            }
        }
        for t in 0..total {
            while let Some(&Reverse((release, d))) = waiting.peek() {
                if release > t {
                    break;
                }
                waiting.pop();
                ready.push(Reverse((window(d, next[d]).1, d)));
            }
            let Reverse((_, d)) = ready.pop().expect("a Pfair schedule always has an eligible source");
            period.push(d as u8);
            next[d] += 1;
            if next[d] <= weights.parts[d] {
                let (release, deadline) = window(d, next[d]);
                if release <= t + 1 {
                    ready.push(Reverse((deadline, d)));
                } else {
                    waiting.push(Reverse((release, d)));
                }
            }
        }
        Schedule { weights, period }
    }

    /// The integer weights.
    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    /// Number of sources.
    pub fn sources(&self) -> usize {
        self.weights.parts.len()
    }

    /// The source of position `n`.
    pub fn source(&self, n: u64) -> usize {
        self.period[(n % self.weights.total) as usize] as usize
    }

    /// How many of positions `0..n` each source took.
    pub fn counts_at(&self, n: u64) -> Vec<u64> {
        let (whole, rest) = (n / self.weights.total, (n % self.weights.total) as usize);
        let mut counts: Vec<u64> = self.weights.parts.iter().map(|a| a * whole).collect();
        for &d in &self.period[..rest] {
            counts[d as usize] += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Checks `|count_d(n) - n w_d| < 1` at every prefix of two periods, with the shares of
    /// the weights as given (in exact rational arithmetic).
    fn exact_at_every_prefix(weights: &[f64]) {
        let w = Weights::new(weights).unwrap();
        let s = Schedule::new(w.clone());
        let mut counts = vec![0u64; w.parts.len()];
        for n in 1..=2 * w.total {
            counts[s.source(n - 1)] += 1;
            for (d, &c) in counts.iter().enumerate() {
                // |c D - n a| < D
                let lag = (c as i128 * w.total as i128 - n as i128 * w.parts[d] as i128).abs();
                assert!(lag < w.total as i128, "{weights:?}: source {d} has {c} of {n}");
            }
        }
        assert_eq!(counts, w.parts.iter().map(|a| 2 * a).collect::<Vec<_>>());
    }

    #[test]
    fn weights_are_the_decimals_or_integers_as_written() {
        assert_eq!(Weights::new(&[0.7, 0.2, 0.1]).unwrap().parts, vec![7, 2, 1]);
        assert_eq!(Weights::new(&[0.999, 0.001]).unwrap().parts, vec![999, 1]);
        assert_eq!(Weights::new(&[3.0, 7.0]).unwrap().parts, vec![3, 7]);
        assert_eq!(Weights::new(&[30.0, 70.0]).unwrap().parts, vec![3, 7]);
        assert_eq!(Weights::new(&[0.25, 0.25, 0.5]).unwrap().parts, vec![1, 1, 2]);
        // A third is rounded to millionths, largest remainder first.
        let third = Weights::new(&[1.0 / 3.0, 2.0 / 3.0]).unwrap();
        assert_eq!(third.parts, vec![333_333, 666_667]);
        for bad in [vec![], vec![0.5, 0.0], vec![1.0, f64::NAN], vec![-1.0], vec![1.0, 1e-9]] {
            assert!(Weights::new(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shares_are_exact_at_every_prefix() {
        for weights in [
            vec![0.7, 0.2, 0.1],
            vec![0.999, 0.001],
            vec![3.0, 7.0],
            vec![1.0, 1.0],
            vec![0.5, 0.3, 0.15, 0.05],
            vec![13.0, 1.0, 7.0, 2.0, 977.0],
            vec![0.123, 0.456, 0.421],
            vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        ] {
            exact_at_every_prefix(&weights);
        }
    }

    #[test]
    fn counts_are_closed_form_and_positions_repeat_every_period() {
        let s = Schedule::new(Weights::new(&[0.5, 0.3, 0.2]).unwrap());
        let mut counts = vec![0u64; 3];
        for n in 0..95u64 {
            assert_eq!(s.counts_at(n), counts, "at {n}");
            assert_eq!(s.source(n), s.source(n % 10));
            counts[s.source(n)] += 1;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn any_integer_weights_are_exact(parts in proptest::collection::vec(1u32..60, 2..6)) {
            let weights: Vec<f64> = parts.iter().map(|&p| p as f64).collect();
            exact_at_every_prefix(&weights);
        }
    }
}
