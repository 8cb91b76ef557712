//! The local shard cache (`shard_cache="ram"` or a directory, `shard_cache_bytes`): the parts of
//! shards in object storage that a pass fetched, kept on a local disk or in shared memory so
//! that later epochs (and other loaders of the same shards on the host) read them from there
//! instead of the store.
//!
//! A group of the cache store ([`crate::shell::store`], letter `s`): one group per dataset (the
//! shards' names, sizes and samples), under the root every stoker cache uses, with its byte
//! budget, lifecycle (`STOKER_CACHE_TTL`, groups in use never removed) and `stoker cache list` /
//! `stoker cache clear`. An entry is one whole part (see [`super::readahead::PART_BYTES`]),
//! named by its shard and byte range, written under a temporary name and renamed into place,
//! with an xxh3 checksum of its bytes at its end: an entry that fails it is removed and fetched
//! again. When the budget is spent (other idle groups are evicted first, least recently used
//! first), later parts are not stored: an epoch then reads the parts stored from the cache and
//! the others from the store, instead of evicting parts that the next epoch would need again
//! (an LRU over a cyclic scan hits nothing).
//!
//! Owns: the entries' files and their checks. May not touch: which parts are read when (the
//! readahead), requests.

use super::fetch::PartStore;
use crate::error::Result;
use crate::shell::store::{DatasetKey, Group, GroupKind, GroupReport, StoreSpec};
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The entry format: the part's bytes, then their xxh3 (8 bytes, little-endian).
const VERSION: u32 = 1;

/// What decides the entries (for `stoker cache`).
const SETTINGS: &str = "parts of shards, as stored";

/// The parts of one dataset's shards on local storage.
pub struct ShardCache {
    group: Group,
}

impl ShardCache {
    /// Opens (creating it if needed) the group of `dataset` in the cache `spec`. Errors are
    /// [`crate::Error::Config`] naming `shard_cache` (a directory that cannot be made or
    /// written).
    pub fn open(spec: &StoreSpec, dataset: &DatasetKey) -> Result<Self> {
        let kind = GroupKind { letter: 's', version: VERSION };
        let group =
            Group::open(&spec.location, spec.bytes, spec.ttl, kind, SETTINGS, dataset).map_err(|e| match e {
                crate::Error::Config { reason, .. } => crate::Error::config("shard_cache", reason),
                other => other,
            })?;
        Ok(ShardCache { group })
    }

    fn path(&self, shard: usize, range: &Range<u64>) -> std::path::PathBuf {
        self.group.dir().join(format!("{shard:06}-{:x}-{:x}", range.start, range.end))
    }

    /// The cache's counters and sizes.
    pub fn report(&self) -> GroupReport {
        self.group.report()
    }
}

impl PartStore for ShardCache {
    fn get(&self, shard: usize, range: &Range<u64>) -> Option<Vec<u8>> {
        let c = &self.group.counters;
        let path = self.path(shard, range);
        let want = (range.end - range.start) as usize;
        let mut bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(_) => {
                c.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let sum_ok = bytes.len() == want + 8 && {
            let (data, sum) = bytes.split_at(want);
            xxhash_rust::xxh3::xxh3_64(data).to_le_bytes() == sum
        };
        if !sum_ok {
            c.verify_failures.fetch_add(1, Ordering::Relaxed);
            c.misses.fetch_add(1, Ordering::Relaxed);
            if let Ok(m) = std::fs::metadata(&path) {
                self.group.remove_entry(&path, m.ino(), m.len());
            }
            return None;
        }
        bytes.truncate(want);
        c.hits.fetch_add(1, Ordering::Relaxed);
        c.read_bytes.fetch_add(want as u64, Ordering::Relaxed);
        Some(bytes)
    }

    fn put(self: Arc<Self>, shard: usize, range: Range<u64>, bytes: Arc<Vec<u8>>) {
        // Written on a thread of its own: the caller is a fetch's (an I/O runtime's) thread.
        let _ = std::thread::Builder::new().name("stoker-shard-cache".into()).spawn(move || {
            let c = &self.group.counters;
            let path = self.path(shard, &range);
            if path.exists() {
                return;
            }
            let n = bytes.len() as u64 + 8;
            match self.group.reserve(n) {
                Some(true) => {}
                _ => {
                    c.not_stored_budget.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            let tmp = self.group.dir().join(format!(".part-{}-{}", std::process::id(), self.group.next_seq()));
            let write = || -> std::io::Result<()> {
                use std::io::Write;
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(&bytes)?;
                f.write_all(&xxhash_rust::xxh3::xxh3_64(&bytes).to_le_bytes())?;
                std::fs::rename(&tmp, &path)
            };
            if write().is_err() {
                let _ = std::fs::remove_file(&tmp);
                self.group.unreserve(n);
                c.write_errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
            c.stored.fetch_add(1, Ordering::Relaxed);
            c.stored_bytes.fetch_add(n, Ordering::Relaxed);
        });
    }
}
