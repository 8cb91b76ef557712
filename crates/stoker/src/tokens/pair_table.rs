//! The merges of a byte-level BPE model as a lookup table for the fast path: pair of ids -> one
//! packed word, the merge's rank in the high half and the merged id in the low half, so that
//! the smallest word is the merge to apply first and comparing two needs no unpacking. Pairs of
//! two single bytes (every pair a piece starts with) are a dense 256 x 256 array indexed by the
//! bytes themselves; every pair by a flat table, open addressing with linear probing at most
//! half full, the pair and its rank in one 8-byte word (the merged id by rank from an array
//! beside it). Each thread puts a small [`PairCache`] in front: merging is a chain of lookups,
//! each waiting on the one before, and the pairs that rare words merge through are mostly the
//! same few thousand, so they are answered from the processor's cache.

/// No merge joins the pair.
pub(crate) const NONE: u64 = u64::MAX;
/// No merge has this rank.
const NO_RANK: u32 = u32::MAX;
/// A slot no pair holds.
const EMPTY: u64 = u64::MAX;
/// Bits of an id in a slot's key: ids must be below `2^19 - 1` (Gemma's 262,144 tokens fit).
const ID_BITS: u32 = 19;
/// Bits of a rank in a slot.
const RANK_BITS: u32 = 64 - 2 * ID_BITS;

/// One merge as the file lists it: `((left, right), (rank, merged))`.
pub(crate) type Merge = ((u32, u32), (u32, u32));

/// See the module's description.
#[derive(Debug)]
pub(crate) struct PairTable {
    /// `(left << ID_BITS | right) << RANK_BITS | rank`, or `EMPTY`.
    slots: Box<[u64]>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the home slot.
    shift: u32,
    /// The merged id of each rank (`u32::MAX` for a rank that a later listing of its pair
    /// replaced).
    merged: Box<[u32]>,
    /// The packed merge of each pair of raw bytes (`a << 8 | b`), through their byte-level ids.
    bytes: Box<[u64]>,
}

#[inline]
fn home(key: u64, shift: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl PairTable {
    /// The table of `merges`, `((left, right), (rank, merged))`, a later entry for the same pair
    /// replacing an earlier one; `byte_ids` gives each byte's id. Refused (the reason returned)
    /// where an id does not fit the packed slots or ranks are not below the merges' count.
    pub(crate) fn new(merges: &[Merge], byte_ids: &[u32; 256]) -> Result<PairTable, String> {
        let id_max = (1u32 << ID_BITS) - 1;
        let size = (merges.len() * 2).max(16).next_power_of_two();
        let shift = 64 - size.trailing_zeros();
        let mut slots = vec![EMPTY; size].into_boxed_slice();
        let mut merged = vec![u32::MAX; merges.len()].into_boxed_slice();
        let mask = size - 1;
        if merges.len() as u64 >= 1 << RANK_BITS {
            return Err(format!("{} merges: the fast path holds fewer than 2^{RANK_BITS}", merges.len()));
        }
        for &((a, b), (rank, id)) in merges {
            if a >= id_max || b >= id_max {
                return Err(format!("merge of ids {a} and {b}: the fast path holds ids below {id_max}"));
            }
            let Some(slot) = merged.get_mut(rank as usize) else {
                return Err(format!("merge rank {rank} of {} merges", merges.len()));
            };
            *slot = id;
            let key = u64::from(a) << ID_BITS | u64::from(b);
            let mut h = home(key, shift);
            while slots[h] != EMPTY && slots[h] >> RANK_BITS != key {
                h = (h + 1) & mask;
            }
            if slots[h] != EMPTY {
                // Listed twice: the later rank, as `tokenizers` keeps it.
                merged[(slots[h] & ((1 << RANK_BITS) - 1)) as usize] = u32::MAX;
            }
            slots[h] = key << RANK_BITS | u64::from(rank);
        }
        let mut t = PairTable { slots, shift, merged, bytes: Box::new([]) };
        let bytes: Vec<u64> = (0..1usize << 16).map(|k| t.get(byte_ids[k >> 8], byte_ids[k & 0xFF])).collect();
        t.bytes = bytes.into_boxed_slice();
        Ok(t)
    }

    /// The packed merge of `(a, b)`: `rank << 32 | merged`, or [`NONE`].
    #[inline]
    pub(crate) fn get(&self, a: u32, b: u32) -> u64 {
        match self.rank(a, b) {
            NO_RANK => NONE,
            r => u64::from(r) << 32 | u64::from(self.merged[r as usize]),
        }
    }

    /// The rank of the merge of `(a, b)`, or [`NO_RANK`].
    #[inline]
    fn rank(&self, a: u32, b: u32) -> u32 {
        if a >= (1 << ID_BITS) - 1 || b >= (1 << ID_BITS) - 1 {
            return NO_RANK;
        }
        let key = u64::from(a) << ID_BITS | u64::from(b);
        let mask = self.slots.len() - 1;
        let mut h = home(key, self.shift);
        loop {
            let s = self.slots[h];
            if s >> RANK_BITS == key {
                return (s & ((1 << RANK_BITS) - 1)) as u32;
            }
            if s == EMPTY {
                return NO_RANK;
            }
            h = (h + 1) & mask;
        }
    }

    /// The packed merge of the byte-level ids of raw bytes `a` and `b`.
    #[inline]
    pub(crate) fn of_bytes(&self, a: u8, b: u8) -> u64 {
        self.bytes[usize::from(a) << 8 | usize::from(b)]
    }
}

/// Slots of a [`PairCache`]: 2^13, 128 KiB.
const CACHE_LOG2: u32 = 13;

/// A thread's cache of [`PairTable::get`]: direct-mapped, each slot a pair (`left << 32 |
/// right`, `u64::MAX` for none) and its packed merge, [`NONE`] included (a pair that no merge
/// joins is asked about as often as one that some merge does).
pub(crate) struct PairCache {
    slots: Box<[(u64, u64); 1 << CACHE_LOG2]>,
}

impl PairCache {
    /// An empty cache.
    pub(crate) fn new() -> PairCache {
        PairCache { slots: Box::new([(u64::MAX, NONE); 1 << CACHE_LOG2]) }
    }

    /// [`PairTable::get`] of `t` (the one table this cache serves).
    #[inline]
    pub(crate) fn get(&mut self, t: &PairTable, a: u32, b: u32) -> u64 {
        let key = u64::from(a) << 32 | u64::from(b);
        let slot = &mut self.slots[(key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - CACHE_LOG2)) as usize];
        if slot.0 != key {
            *slot = (key, t.get(a, b));
        }
        slot.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_pair_keeps_the_last_rank_and_misses_the_rest() {
        let mut byte_ids = [0u32; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = 1000 + b as u32;
        }
        // Pairs whose keys collide in their home slots are found all the same.
        let mut merges: Vec<Merge> = (0..5000u32).map(|i| ((1000 + i % 256, 1000 + i / 256), (i, 2000 + i))).collect();
        merges.push(((1000 + 7, 1000), (5000, 42)));
        let t = PairTable::new(&merges, &byte_ids).expect("fits");
        let mut c = PairCache::new();
        for &((a, b), (rank, id)) in merges.iter().filter(|m| m.0 != (1007, 1000)) {
            assert_eq!(t.get(a, b), u64::from(rank) << 32 | u64::from(id));
            assert_eq!(c.get(&t, a, b), t.get(a, b));
        }
        // Listed twice: the later rank.
        assert_eq!(t.get(1007, 1000), 5000 << 32 | 42);
        assert_eq!(t.of_bytes(7, 0), 5000 << 32 | 42);
        assert_eq!(t.of_bytes(1, 1), 257 << 32 | (2000 + 257));
        assert_eq!(t.get(1000 + 100, 1000 + 200), NONE);
        assert_eq!(c.get(&t, 1000 + 100, 1000 + 200), NONE);
        assert_eq!(t.of_bytes(255, 255), NONE);
        assert_eq!(t.get(0, 0), NONE);
        assert_eq!(t.get(u32::MAX, 0), NONE);
        // The cache answers again, and still right after its slots were reused.
        for &((a, b), (rank, id)) in merges.iter().rev().filter(|m| m.0 != (1007, 1000)) {
            assert_eq!(c.get(&t, a, b), u64::from(rank) << 32 | u64::from(id));
        }
    }

    #[test]
    fn refuses_ids_past_the_packed_width() {
        let byte_ids = [0u32; 256];
        let err = PairTable::new(&[((1 << ID_BITS, 1), (0, 2))], &byte_ids).expect_err("too big");
        assert!(err.contains("ids below"), "{err}");
    }
}
