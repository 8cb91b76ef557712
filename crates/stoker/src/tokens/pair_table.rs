//! The merges of a byte-level BPE model as a lookup table for the fast path: pair of ids ->
//! one packed word, the merge's rank in the high half and the merged id in the low half, so
//! that the smallest word is the merge to apply first and comparing two needs no unpacking.
//! Pairs of two single bytes (every pair a piece starts with) are a dense 256 x 256 array
//! indexed by the bytes themselves; every pair by a flat table, open addressing with linear
//! probing at most half full, one key and value per 16 bytes: a lookup is one multiply and
//! usually one cache line.

/// No merge joins the pair.
pub(crate) const NONE: u64 = u64::MAX;
/// A slot no pair holds.
const EMPTY: u64 = u64::MAX;

/// One merge as the file lists it: `((left, right), (rank, merged))`.
pub(crate) type Merge = ((u32, u32), (u32, u32));

/// See the module's description.
#[derive(Debug)]
pub(crate) struct PairTable {
    /// `(left << 32 | right, rank << 32 | merged)`, or `(EMPTY, _)`.
    slots: Box<[(u64, u64)]>,
    /// `64 - log2(slots.len())`: the hash's top bits pick the home slot.
    shift: u32,
    /// The packed merge of each pair of raw bytes (`a << 8 | b`), through their byte-level ids.
    bytes: Box<[u64]>,
}

#[inline]
fn home(key: u64, shift: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> shift) as usize
}

impl PairTable {
    /// The table of `merges`, `((left, right), (rank, merged))`, a later entry for the same pair
    /// replacing an earlier one; `byte_ids` gives each byte's id. Ids must be below `u32::MAX`.
    pub(crate) fn new(merges: &[Merge], byte_ids: &[u32; 256]) -> PairTable {
        let size = (merges.len() * 2).max(16).next_power_of_two();
        let shift = 64 - size.trailing_zeros();
        let mut slots = vec![(EMPTY, 0u64); size].into_boxed_slice();
        let mask = size - 1;
        for &((a, b), (rank, id)) in merges {
            let key = u64::from(a) << 32 | u64::from(b);
            let mut h = home(key, shift);
            while slots[h].0 != EMPTY && slots[h].0 != key {
                h = (h + 1) & mask;
            }
            slots[h] = (key, u64::from(rank) << 32 | u64::from(id));
        }
        let mut t = PairTable { slots, shift, bytes: Box::new([]) };
        let bytes: Vec<u64> = (0..1usize << 16).map(|k| t.get(byte_ids[k >> 8], byte_ids[k & 0xFF])).collect();
        t.bytes = bytes.into_boxed_slice();
        t
    }

    /// The packed merge of `(a, b)`: `rank << 32 | merged`, or [`NONE`].
    #[inline]
    pub(crate) fn get(&self, a: u32, b: u32) -> u64 {
        let key = u64::from(a) << 32 | u64::from(b);
        let mask = self.slots.len() - 1;
        let mut h = home(key, self.shift);
        loop {
            let (k, v) = self.slots[h];
            if k == key {
                return v;
            }
            if k == EMPTY {
                return NONE;
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
        merges.push(((1000 + 7, 1000), (9999, 42)));
        let t = PairTable::new(&merges, &byte_ids);
        for &((a, b), (rank, id)) in merges.iter().filter(|m| m.0 != (1007, 1000)) {
            assert_eq!(t.get(a, b), u64::from(rank) << 32 | u64::from(id));
        }
        // Listed twice: the later rank.
        assert_eq!(t.get(1007, 1000), 9999 << 32 | 42);
        assert_eq!(t.of_bytes(7, 0), 9999 << 32 | 42);
        assert_eq!(t.of_bytes(1, 1), 257 << 32 | (2000 + 257));
        assert_eq!(t.get(1000 + 100, 1000 + 200), NONE);
        assert_eq!(t.of_bytes(255, 255), NONE);
        assert_eq!(t.get(0, 0), NONE);
    }
}
