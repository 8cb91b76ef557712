//! [`Tally`]: a mixture's counters per source (items delivered, and the time the kind's threads
//! spent on each source's items), and their report ([`MixReport`]): each source's items against
//! its share, and which source starves the mixture when the consumer waits.

use super::order::MixSpec;
use super::schedule::Weights;
use crate::observe::report::{percent, Bottleneck};
use std::sync::atomic::{AtomicU64, Ordering};

/// Per-source counters of a mixture.
#[derive(Debug)]
pub struct Tally {
    delivered: Vec<AtomicU64>,
    busy_ns: Vec<AtomicU64>,
    made: Vec<AtomicU64>,
}

impl Tally {
    /// Counters for `sources` sources.
    pub fn new(sources: usize) -> Tally {
        let zeros = || (0..sources).map(|_| AtomicU64::new(0)).collect();
        Tally { delivered: zeros(), busy_ns: zeros(), made: zeros() }
    }

    /// `n` items of source `d` were delivered.
    pub fn delivered(&self, d: usize, n: u64) {
        self.delivered[d].fetch_add(n, Ordering::Relaxed);
    }

    /// An item of source `d` was made in `ns` nanoseconds of a thread's time.
    pub fn worked(&self, d: usize, ns: u64) {
        self.busy_ns[d].fetch_add(ns, Ordering::Relaxed);
        self.made[d].fetch_add(1, Ordering::Relaxed);
    }

    /// `ns` more nanoseconds of a thread's time on an item of source `d` (another stage of the
    /// same item: reading it).
    pub fn add_busy(&self, d: usize, ns: u64) {
        self.busy_ns[d].fetch_add(ns, Ordering::Relaxed);
    }

    /// Source `d`'s items were made in `ns` nanoseconds in all (`made` of them): for a kind
    /// whose sources keep their own counters (a token mixture's loaders).
    pub fn set_work(&self, d: usize, ns: u64, made: u64) {
        self.busy_ns[d].store(ns, Ordering::Relaxed);
        self.made[d].store(made, Ordering::Relaxed);
    }

    /// Zeroes the counters.
    pub fn reset(&self) {
        for a in self.delivered.iter().chain(&self.busy_ns).chain(&self.made) {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// The counters of the mixture `spec`, whose schedule has `weights`.
    pub fn report(&self, spec: &MixSpec, weights: &Weights) -> MixReport {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let total: u64 = self.delivered.iter().map(g).sum();
        let sources = spec
            .parts
            .iter()
            .enumerate()
            .map(|(d, p)| {
                let (items, busy) = (g(&self.delivered[d]), g(&self.busy_ns[d]) as f64 / 1e9);
                SourceReport {
                    name: p.name.clone(),
                    weight: p.weight,
                    share: weights.share(d),
                    items,
                    item_share: if total > 0 { items as f64 / total as f64 } else { 0.0 },
                    busy_seconds: busy,
                    seconds_per_item: busy / g(&self.made[d]).max(1) as f64,
                }
            })
            .collect();
        MixReport { sources }
    }
}

/// One source of a mixture in a report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SourceReport {
    /// Its name.
    pub name: String,
    /// Its weight as given.
    pub weight: f64,
    /// Its share of the items (the schedule's).
    pub share: f64,
    /// Items (samples, rows) of it delivered.
    pub items: u64,
    /// Its share of the items delivered.
    pub item_share: f64,
    /// Thread time spent making its items.
    pub busy_seconds: f64,
    /// Of that, per item made.
    pub seconds_per_item: f64,
}

/// A mixture's part of a report.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MixReport {
    /// The sources, in the order of their ids.
    pub sources: Vec<SourceReport>,
}

impl MixReport {
    /// A line per source for a report's summary (`items`: what an item is called).
    pub fn text(&self, items: &str) -> String {
        self.sources
            .iter()
            .map(|s| {
                format!(
                    "source {}: {} {items} ({:.1}%, share {:.1}%), {:.2} ms each\n",
                    s.name,
                    s.items,
                    s.item_share * 100.0,
                    s.share * 100.0,
                    s.seconds_per_item * 1e3
                )
            })
            .collect()
    }

    /// The source whose items take the most of the threads' time (its time per item times its
    /// share), as the verdict of a mixture whose consumer waits; `None` before any item was
    /// made.
    pub fn starved_by(&self) -> Option<Bottleneck> {
        let cost: Vec<f64> = self.sources.iter().map(|s| s.seconds_per_item * s.share).collect();
        let all: f64 = cost.iter().sum();
        if all <= 0.0 {
            return None;
        }
        let d = cost.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(d, _)| d);
        let s = &self.sources[d];
        Some(Bottleneck {
            stage: format!("source {}", s.name),
            reason: format!(
                "the items of '{}' take {} of the work ({:.2} ms each, {} of the items)",
                s.name,
                percent(cost[d] / all),
                s.seconds_per_item * 1e3,
                percent(s.share)
            ),
            suggestion: format!(
                "speed up '{}': faster storage for it, pre-processed files (smaller images: `stoker pack \
                 --max-side`; tokens: `stoker tokenize`), or more threads",
                s.name
            ),
        })
    }
}

/// `verdict` (a kind's, when its consumer waits) with the source of `mix` that costs the most
/// named in its reason and suggestion.
pub fn with_slowest(verdict: Bottleneck, mix: &MixReport) -> Bottleneck {
    match mix.starved_by() {
        None => verdict,
        Some(s) => Bottleneck {
            stage: verdict.stage,
            reason: format!("{}; of the mixture's sources, {}", verdict.reason, s.reason),
            suggestion: format!("{}; or {}", verdict.suggestion, s.suggestion),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::mix::{Exhausted, MixPart};

    #[test]
    fn the_report_counts_each_source_and_names_the_one_that_costs_most() {
        let part = |n: &str, w| MixPart { name: n.into(), weight: w, exhausted: Exhausted::Repeat };
        let spec = MixSpec { parts: vec![part("web", 0.8), part("books", 0.2)], epoch_items: None };
        let t = Tally::new(2);
        let w = Weights::new(&[0.8, 0.2]).unwrap();
        assert!(t.report(&spec, &w).starved_by().is_none(), "nothing made yet");
        t.delivered(0, 8);
        t.delivered(1, 2);
        for _ in 0..8 {
            t.worked(0, 1_000_000); // 1 ms a web item
        }
        for _ in 0..2 {
            t.worked(1, 9_000_000); // 9 ms a book
        }
        let r = t.report(&spec, &w);
        assert_eq!([r.sources[0].items, r.sources[1].items], [8, 2]);
        assert!((r.sources[1].item_share - 0.2).abs() < 1e-12 && (r.sources[1].share - 0.2).abs() < 1e-12);
        // Books: 9 ms x 0.2 = 1.8 against web's 1 ms x 0.8: books take 69% of the work.
        let b = r.starved_by().unwrap();
        assert_eq!(b.stage, "source books");
        assert!(b.reason.contains("69% of the work"), "{}", b.reason);
        assert!(r.text("samples").contains("source books: 2 samples (20.0%, share 20.0%), 9.00 ms each"));
        t.reset();
        assert_eq!(t.report(&spec, &w).sources[0].items, 0);
    }
}
