//! Each thread's caches of a byte-level BPE model (short pieces, pairs, longer pieces) and the
//! spare caches that threads leave when they end, so that the next thread starts warm.

use super::super::pair_table::PairCache;
use super::super::piece_cache::{PieceCache, ShortCache};
use super::{BpeModel, FxMap};
use std::cell::RefCell;
use std::sync::{LazyLock, Mutex};

/// Models whose caches a thread keeps at once (a mixture of tokenizers alternates between them);
/// the one used longest ago gives way.
const MODELS_PER_THREAD: usize = 4;

/// A thread's cache and scratch space for one model.
pub(super) struct Cache {
    model: u64,
    pub(super) short: ShortCache,
    pub(super) pairs: PairCache,
    pub(super) table: PieceCache,
    pub(super) map: FxMap<Box<[u8]>, Box<[u32]>>,
    /// Room for a normalized gap (reused: no allocation per text).
    pub(super) text: String,
}

impl Cache {
    fn new(model: u64) -> Cache {
        Cache {
            model,
            short: ShortCache::new(),
            pairs: PairCache::new(),
            table: PieceCache::new(),
            map: FxMap::default(),
            text: String::new(),
        }
    }
}

/// A thread's caches, the one used last first. When the thread ends they go to [`SPARE`], so
/// that the next thread to encode with the same model starts warm: a loader's pass and a
/// `Tokenizer` call each make their threads anew, and a cold cache merges every piece it meets
/// for the first time.
struct ThreadCaches(Vec<Cache>);

impl Drop for ThreadCaches {
    fn drop(&mut self) {
        if self.0.is_empty() {
            return;
        }
        let keep = *KEEP;
        // Never waits: with the lock taken elsewhere (or poisoned) the caches are dropped.
        if let Ok(mut spare) = SPARE.try_lock() {
            spare.give(self.0.drain(..), keep);
        }
    }
}

/// The most spare caches kept: one per CPU the process may use, read once (the allowance reads
/// the affinity mask and cgroup files: not for every thread that ends, nor under the lock).
static KEEP: LazyLock<usize> = LazyLock::new(crate::observe::cpu::default_threads);

/// Caches of threads that ended, for the threads after them.
struct Spare(Vec<Cache>);

impl Spare {
    /// Keeps `caches`, at most `keep` in all, the oldest giving way (it may be a dropped model's).
    fn give(&mut self, caches: impl Iterator<Item = Cache>, keep: usize) {
        for c in caches {
            if self.0.len() >= keep.max(1) {
                self.0.remove(0);
            }
            self.0.push(c);
        }
    }

    /// The newest cache of `model`, taken out.
    fn take(&mut self, model: u64) -> Option<Cache> {
        let i = self.0.iter().rposition(|c| c.model == model)?;
        Some(self.0.remove(i))
    }

    /// Drops every cache of `model`.
    fn forget(&mut self, model: u64) {
        self.0.retain(|c| c.model != model);
    }
}

/// The spare caches of the process: at most one per CPU it may use; those of a model go when it
/// is dropped. Only ever held for a push, a take or a sweep of that short list.
static SPARE: Mutex<Spare> = Mutex::new(Spare(Vec::new()));

/// A spare cache of `model`, if one is there (and the lock is free: this never waits).
fn spare_cache(model: u64) -> Option<Cache> {
    SPARE.try_lock().ok()?.take(model)
}

thread_local! {
    /// This thread's caches.
    static CACHES: RefCell<ThreadCaches> = const { RefCell::new(ThreadCaches(Vec::new())) };
}

/// Runs `f` with this thread's cache for `model` (made, or taken from a thread that ended, the
/// first time).
pub(super) fn with_cache<R>(model: u64, f: impl FnOnce(&mut Cache) -> R) -> R {
    CACHES.with(|caches| match caches.try_borrow_mut() {
        Ok(mut caches) => {
            let caches = &mut caches.0;
            match caches.iter().position(|c| c.model == model) {
                Some(i) => caches[..=i].rotate_right(1),
                None => {
                    caches.truncate(MODELS_PER_THREAD - 1);
                    caches.insert(0, spare_cache(model).unwrap_or_else(|| Cache::new(model)));
                }
            }
            f(&mut caches[0])
        }
        // Only reachable by re-entry, which nothing here does: work with a fresh cache.
        Err(_) => f(&mut Cache::new(model)),
    })
}

impl Drop for BpeModel {
    fn drop(&mut self) {
        // Waiting is bounded: see `SPARE`.
        SPARE.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).forget(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_caches_are_kept_newest_last_bounded_and_forgotten_with_their_model() {
        let mut spare = Spare(Vec::new());
        spare.give([Cache::new(1), Cache::new(2), Cache::new(1)].into_iter(), 3);
        assert_eq!(spare.0.iter().map(|c| c.model).collect::<Vec<_>>(), [1, 2, 1]);
        // Full: the oldest gives way.
        spare.give([Cache::new(3)].into_iter(), 3);
        assert_eq!(spare.0.iter().map(|c| c.model).collect::<Vec<_>>(), [2, 1, 3]);
        assert_eq!(spare.take(1).map(|c| c.model), Some(1));
        assert!(spare.take(1).is_none());
        spare.forget(2);
        assert_eq!(spare.0.iter().map(|c| c.model).collect::<Vec<_>>(), [3]);
        // At least one is kept, whatever the bound.
        spare.give([Cache::new(4)].into_iter(), 0);
        assert_eq!(spare.0.iter().map(|c| c.model).collect::<Vec<_>>(), [4]);
    }
}
