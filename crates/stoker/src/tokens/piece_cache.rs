//! The byte-level BPE fast path's per-thread cache of short pieces: a fixed table of 64-byte
//! lines, each holding one piece of up to [`MAX_KEY`] bytes inline (zero-padded words and the
//! length) and up to [`MAX_IDS`] of its ids, two lines to a set (the newer first), and a small
//! table in front of it (one line per slot) holding the lines used last. A lookup reads a line
//! of each at most and compares three words: no pointer to follow, no allocation, no `memcmp`
//! call. A miss costs a merge; an insert replaces the set's older line, so the table never
//! grows and never needs emptying. The table is allocated zeroed
//! (pages the kernel hands out on first touch), so a thread that encodes little costs little.

/// The longest piece, in bytes, the table holds.
pub(crate) const MAX_KEY: usize = 24;
/// The most ids one line holds.
pub(crate) const MAX_IDS: usize = 9;
/// Sets of two lines: 2^15 sets, 4 MiB per thread and model.
const SETS_LOG2: u32 = 15;
/// Lines of the small table in front: 2^12, 256 KiB, which stays in the processor's cache.
const FRONT_LOG2: u32 = 12;

/// A piece's key: its bytes as three little-endian words, zero beyond its length, and the
/// length itself (in 2..=[`MAX_KEY`]; zero marks an empty line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    words: [u64; 3],
    len: u64,
    /// A hash of the words and length; its top bits pick a set (or a slot of a [`FoldTable`]).
    hash: u64,
}

/// The mask that keeps the first `n` bytes of a little-endian word, for `n` in `0..=8`.
const KEEP: [u64; 9] = {
    let mut t = [0u64; 9];
    let mut n = 1;
    while n <= 8 {
        t[n] = u64::MAX >> (64 - 8 * n);
        n += 1;
    }
    t
};

impl Key {
    /// The key of `text[a..b]`, if the piece has one: from 2 to [`MAX_KEY`] bytes (a single
    /// byte's id is looked up directly).
    #[inline]
    pub(crate) fn of(text: &[u8], a: usize, b: usize) -> Option<Key> {
        let len = b - a;
        if !(2..=MAX_KEY).contains(&len) {
            return None;
        }
        let mut words = [0u64; 3];
        if len <= 8 {
            // Most pieces: one word (the same words and hash as the general case below).
            if let Some(window) = text.get(a..a + 8) {
                let mut b8 = [0u8; 8];
                b8.copy_from_slice(window);
                words[0] = u64::from_le_bytes(b8) & KEEP[len];
                return Some(Key::hashed(words, len));
            }
        }
        if let Some(window) = text.get(a..a + MAX_KEY) {
            // Three whole words, then the bytes past the piece masked off.
            for (k, w) in words.iter_mut().enumerate() {
                let mut b8 = [0u8; 8];
                b8.copy_from_slice(&window[8 * k..8 * k + 8]);
                *w = u64::from_le_bytes(b8) & KEEP[len.saturating_sub(8 * k).min(8)];
            }
        } else {
            let mut buf = [0u8; MAX_KEY];
            buf[..len].copy_from_slice(&text[a..b]);
            for (k, w) in words.iter_mut().enumerate() {
                let mut b8 = [0u8; 8];
                b8.copy_from_slice(&buf[8 * k..8 * k + 8]);
                *w = u64::from_le_bytes(b8);
            }
        }
        Some(Key::hashed(words, len))
    }

    /// The key of these words and length, with its hash (two words of zeros, the usual short
    /// piece, cost one multiplication less each).
    #[inline]
    fn hashed(words: [u64; 3], len: usize) -> Key {
        let mut h = words[0].wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ len as u64;
        if words[1] | words[2] != 0 {
            h ^= words[1].wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(23)
                ^ words[2].wrapping_mul(0x1656_67B1_9E37_79F9).rotate_left(41);
        }
        Key { words, len: len as u64, hash: h.wrapping_mul(0x2545_F491_4F6C_DD1D) }
    }

    /// The set this key belongs to.
    #[inline]
    fn set(&self) -> usize {
        (self.hash >> (64 - SETS_LOG2)) as usize
    }

    /// Its slot in the table in front.
    #[inline]
    fn front(&self) -> usize {
        (self.hash >> (64 - FRONT_LOG2)) as usize
    }
}

/// One line: words 0-2 the key, word 3 the length (bits 0-7), the id count (bits 8-15) and the
/// first id (bits 32-63), words 4-7 two ids each.
type Line = [u64; 8];

/// The table (see the module's description).
pub(crate) struct PieceCache {
    lines: Vec<Line>,
    front: Vec<Line>,
}

impl PieceCache {
    /// An empty table; its memory is taken from the kernel as lines are first written.
    pub(crate) fn new() -> PieceCache {
        // A zeroed vector of plain words is allocated zeroed (no writes), so untouched pages
        // stay unbacked.
        PieceCache { lines: vec![[0u64; 8]; 2 << SETS_LOG2], front: vec![[0u64; 8]; 1 << FRONT_LOG2] }
    }

    #[inline]
    fn matches(line: &Line, k: &Key) -> bool {
        line[0] == k.words[0] && line[1] == k.words[1] && line[2] == k.words[2] && line[3] & 0xFF == k.len
    }

    /// Asks the processor to bring `k`'s set into its cache, so that a lookup a little later
    /// does not wait on memory (the caller finds a batch of pieces first, then looks them up):
    /// the piece's line of the table in front and its set, without reading either (a read here
    /// would wait).
    #[inline]
    pub(crate) fn prefetch(&self, k: &Key) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let front: *const Line = &self.front[k.front()];
            let line: *const Line = &self.lines[2 * k.set()];
            // SAFETY: a prefetch is a hint that never faults and reads nothing into the
            // program; the pointers are to live elements of `front` and `lines` anyway.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(front.cast());
                _mm_prefetch::<_MM_HINT_T0>(line.cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = k;
    }

    /// Appends the cached ids of `k` to `out`; false when the piece is not in the table.
    #[inline(always)]
    pub(crate) fn get(&mut self, k: &Key, out: &mut Vec<u32>) -> bool {
        let f = k.front();
        let line = if Self::matches(&self.front[f], k) {
            &self.front[f]
        } else {
            let s = 2 * k.set();
            let hit = if Self::matches(&self.lines[s], k) {
                s
            } else if Self::matches(&self.lines[s + 1], k) {
                s + 1
            } else {
                return false;
            };
            self.front[f] = self.lines[hit];
            &self.front[f]
        };
        let n = (line[3] >> 8 & 0xFF) as usize;
        out.push((line[3] >> 32) as u32);
        if n > 1 {
            Self::more_ids(line, n, out);
        }
        true
    }

    /// The ids of a line after its first (`n` in all).
    #[inline(never)]
    fn more_ids(line: &Line, n: usize, out: &mut Vec<u32>) {
        for i in 1..n {
            out.push((line[4 + (i - 1) / 2] >> (32 * ((i - 1) % 2))) as u32);
        }
    }

    /// Stores the ids of `k` (ignored when there are more than [`MAX_IDS`] or none), in place of
    /// its set's older line.
    #[inline]
    pub(crate) fn put(&mut self, k: &Key, ids: &[u32]) {
        if ids.is_empty() || ids.len() > MAX_IDS {
            return;
        }
        let s = 2 * k.set();
        self.lines[s + 1] = self.lines[s];
        let mut line = [0u64; 8];
        line[..3].copy_from_slice(&k.words);
        line[3] = k.len | (ids.len() as u64) << 8 | u64::from(ids[0]) << 32;
        for (i, &id) in ids.iter().enumerate().skip(1) {
            line[4 + (i - 1) / 2] |= u64::from(id) << (32 * ((i - 1) % 2));
        }
        self.lines[s] = line;
        self.front[k.front()] = line;
    }
}

/// Short pieces that are one token each, read-only and shared by threads (see
/// [`super::bpe::BpeModel`]'s `fold`): open addressing with linear probing, at most half full,
/// 32 bytes a slot (the key's words, then its length and the id), an all-zero slot empty.
#[derive(Debug)]
pub(crate) struct FoldTable {
    slots: Box<[[u64; 4]]>,
    /// `64 - log2(slots.len())`.
    shift: u32,
}

impl FoldTable {
    /// The table of `entries` (distinct keys).
    pub(crate) fn new(entries: &[(Key, u32)]) -> FoldTable {
        let size = (entries.len() * 2).max(16).next_power_of_two();
        let mut slots = vec![[0u64; 4]; size].into_boxed_slice();
        let shift = 64 - size.trailing_zeros();
        for (k, id) in entries {
            let mut h = (k.hash >> shift) as usize;
            while slots[h][3] != 0 {
                h = (h + 1) & (size - 1);
            }
            slots[h] = [k.words[0], k.words[1], k.words[2], k.len | u64::from(*id) << 32];
        }
        FoldTable { slots, shift }
    }

    /// The id of the piece `k`, if it is in the table.
    #[inline]
    pub(crate) fn get(&self, k: &Key) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut h = (k.hash >> self.shift) as usize;
        loop {
            let s = &self.slots[h];
            if s[3] == 0 {
                return None;
            }
            if s[0] == k.words[0] && s[1] == k.words[1] && s[2] == k.words[2] && s[3] & 0xFF == k.len {
                return Some((s[3] >> 32) as u32);
            }
            h = (h + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_bytes_and_length_wherever_the_piece_lies() {
        let text = b"xx hello\0world and some more bytes after it, enough for a window";
        // The same piece read with a full window behind it and at the very end of a text.
        let near = Key::of(text, 2, 8).expect("short");
        let end = Key::of(b" hello", 0, 6).expect("short");
        assert_eq!(near, end);
        // A trailing zero byte is part of the key: not the same piece as without it.
        let with_nul = Key::of(text, 3, 9).expect("short");
        let without = Key::of(text, 3, 8).expect("short");
        assert_ne!(with_nul, without);
        assert!(Key::of(text, 0, MAX_KEY + 1).is_none());
        assert!(Key::of(text, 3, 4).is_none(), "a single byte has no key");
        assert!(Key::of(text, 0, MAX_KEY).is_some());
    }

    #[test]
    fn the_fold_table_finds_each_piece_and_nothing_else() {
        let words: Vec<String> = (0..3000).map(|i| format!(" w{i}")).collect();
        let entries: Vec<(Key, u32)> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (Key::of(w.as_bytes(), 0, w.len()).expect("short"), i as u32 * 7))
            .collect();
        let t = FoldTable::new(&entries);
        for (k, id) in &entries {
            assert_eq!(t.get(k), Some(*id));
        }
        for miss in [" w3000", " w", "w1", " w1 ", " W1"] {
            assert_eq!(t.get(&Key::of(miss.as_bytes(), 0, miss.len()).expect("short")), None, "{miss:?}");
        }
    }

    #[test]
    fn stores_and_returns_ids_and_keeps_the_two_latest_of_a_set() {
        let mut c = PieceCache::new();
        let text = b" alpha beta gamma";
        let (a, b) = (Key::of(text, 0, 6).expect("short"), Key::of(text, 6, 11).expect("short"));
        let mut out = vec![];
        assert!(!c.get(&a, &mut out));
        let nine: Vec<u32> = (1..=9).map(|i| i * 70_001).collect();
        c.put(&a, &nine);
        c.put(&b, &[7]);
        c.put(&Key::of(text, 11, 17).expect("short"), &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        assert!(c.get(&a, &mut out));
        assert!(c.get(&b, &mut out));
        out.push(0);
        assert_eq!(out[..9], nine[..]);
        assert_eq!(out[9..], [7, 0]);
        // Ten ids are not stored.
        assert!(!c.get(&Key::of(text, 11, 17).expect("short"), &mut out));
        // Three keys in one set: the oldest leaves.
        let mut same = vec![];
        for i in 0u32..1_000_000 {
            let t = format!("w{i}");
            let k = Key::of(t.as_bytes(), 0, t.len()).expect("short");
            if k.set() == a.set() {
                same.push(k);
                if same.len() == 3 {
                    break;
                }
            }
        }
        c.put(&same[0], &[1]);
        c.put(&same[1], &[2]);
        c.put(&same[2], &[3]);
        let mut o = vec![];
        assert!(!c.get(&same[0], &mut o));
        assert!(c.get(&same[1], &mut o) && c.get(&same[2], &mut o));
        assert_eq!(o, [2, 3]);
    }
}
