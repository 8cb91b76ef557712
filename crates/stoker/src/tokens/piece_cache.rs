//! The byte-level BPE fast path's per-thread caches of pieces, on 64-byte lines of the
//! processor's cache: [`ShortCache`] for pieces of 2 to 15 bytes (almost all of them: one line
//! a lookup, two words compared), and [`PieceCache`] for pieces of up to [`MAX_KEY`] bytes with
//! up to [`MAX_IDS`] ids (each line one piece inline, zero-padded words and the length, two
//! lines to a set, the newer first, and a small table in front holding the lines used last).
//! No pointer to follow, no allocation, no `memcmp` call. A miss costs a merge; an insert
//! replaces a line of its set, so the tables never grow and never need emptying. They are
//! allocated zeroed (pages the kernel hands out on first touch), so a thread that encodes
//! little costs little. [`FoldTable`] is the read-only table of the vocabulary's own tokens.

/// The longest piece, in bytes, the table holds.
pub(crate) const MAX_KEY: usize = 24;
/// The most ids one line holds.
pub(crate) const MAX_IDS: usize = 9;
/// Sets of two lines: 2^12 sets, 512 KiB per thread and model (most pieces are short, and kept
/// in a [`ShortCache`]).
const SETS_LOG2: u32 = 12;
/// Lines of the small table in front: 2^10, 64 KiB, which stays in the processor's cache.
const FRONT_LOG2: u32 = 10;

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

/// Eight words on one 64-byte line of the processor's cache. In a [`PieceCache`]: words 0-2
/// the key, word 3 the length (bits 0-7), the id count (bits 8-15) and the first id (bits
/// 32-63), words 4-7 two ids each. In a [`ShortCache`]: two slots of four words.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// `N` lines of zeros, taken from the allocator zeroed: pages the kernel hands out on first
/// touch, so the part of a table a thread never writes costs no memory.
fn zeroed_lines<const N: usize>() -> Box<[Line; N]> {
    let layout = std::alloc::Layout::new::<[Line; N]>();
    assert!(layout.size() > 0, "a table has lines");
    // SAFETY: the layout has a non-zero size (checked); all-zero bytes are a valid `[Line; N]`
    // (plain words); the pointer comes from the global allocator with exactly this layout, as
    // `Box::from_raw` requires, and a null one (allocation failure) is handed to the allocator's
    // error handler instead.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout);
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Box::from_raw(p.cast::<[Line; N]>())
    }
}

/// The table (see the module's description).
pub(crate) struct PieceCache {
    lines: Box<[Line; 2 << SETS_LOG2]>,
    front: Box<[Line; 1 << FRONT_LOG2]>,
}

impl PieceCache {
    /// An empty table; its memory is taken from the kernel as lines are first written.
    pub(crate) fn new() -> PieceCache {
        PieceCache { lines: zeroed_lines(), front: zeroed_lines() }
    }

    #[inline]
    fn matches(line: &Line, k: &Key) -> bool {
        let w = &line.0;
        w[0] == k.words[0] && w[1] == k.words[1] && w[2] == k.words[2] && w[3] & 0xFF == k.len
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
        let n = (line.0[3] >> 8 & 0xFF) as usize;
        out.push((line.0[3] >> 32) as u32);
        if n > 1 {
            Self::more_ids(line, n, out);
        }
        true
    }

    /// The ids of a line after its first (`n` in all).
    #[inline(never)]
    fn more_ids(line: &Line, n: usize, out: &mut Vec<u32>) {
        for i in 1..n {
            out.push((line.0[4 + (i - 1) / 2] >> (32 * ((i - 1) % 2))) as u32);
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
        let mut line = Line([0u64; 8]);
        line.0[..3].copy_from_slice(&k.words);
        line.0[3] = k.len | (ids.len() as u64) << 8 | u64::from(ids[0]) << 32;
        for (i, &id) in ids.iter().enumerate().skip(1) {
            line.0[4 + (i - 1) / 2] |= u64::from(id) << (32 * ((i - 1) % 2));
        }
        self.lines[s] = line;
        self.front[k.front()] = line;
    }
}

/// The longest piece, in bytes, a [`ShortCache`] holds.
pub(crate) const SHORT_MAX: usize = 15;
/// The most ids a [`ShortCache`] slot holds.
pub(crate) const SHORT_IDS: usize = 4;
/// Sets of two slots (one 64-byte line each): 2^16 sets, 4 MiB per thread and model.
const SHORT_SETS_LOG2: u32 = 16;

// Every short piece also has a [`Key`] (the table of longer pieces keeps those with many ids).
const _: () = assert!(SHORT_MAX <= MAX_KEY);

/// The key of a piece of 2 to [`SHORT_MAX`] bytes: its first eight bytes, then the rest with its
/// length in the top byte (zero beyond its length), and the set that key belongs to. The
/// default value is no piece's key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ShortKey {
    lo: u64,
    hi: u64,
    set: usize,
}

/// The masks that keep the first `n` bytes of a piece of `n` bytes in its two words.
const SHORT_MASKS: [(u64, u64); SHORT_MAX + 1] = {
    let mut t = [(0u64, 0u64); SHORT_MAX + 1];
    let mut n = 0;
    while n <= SHORT_MAX {
        t[n] = (KEEP[if n < 8 { n } else { 8 }], KEEP[n.saturating_sub(8)]);
        n += 1;
    }
    t
};

impl ShortKey {
    /// The key of `text[a..b]`, or the default (no piece's key) where the piece is not 2 to
    /// [`SHORT_MAX`] bytes long.
    #[inline(always)]
    pub(crate) fn of(text: &[u8], a: usize, b: usize) -> ShortKey {
        let len = b - a;
        if !(2..=SHORT_MAX).contains(&len) {
            return ShortKey::default();
        }
        let (w0, w1) = match text.get(a..a + 16) {
            Some(w) => {
                let (x, y) = w.split_at(8);
                (
                    u64::from_le_bytes(x.try_into().unwrap_or_default()),
                    u64::from_le_bytes(y.try_into().unwrap_or_default()),
                )
            }
            None => Self::words_near_end(&text[a..b]),
        };
        let (m0, m1) = SHORT_MASKS[len];
        let (lo, hi) = (w0 & m0, w1 & m1 | (len as u64) << 56);
        let h = lo.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ hi.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
        ShortKey { lo, hi, set: (h >> (64 - SHORT_SETS_LOG2)) as usize }
    }

    /// Whether this is a piece's key (not the default).
    #[inline(always)]
    pub(crate) fn is_some(&self) -> bool {
        self.hi != 0
    }

    /// The two words of a piece that ends less than 16 bytes before its text does.
    #[cold]
    fn words_near_end(piece: &[u8]) -> (u64, u64) {
        let mut buf = [0u8; 16];
        buf[..piece.len()].copy_from_slice(piece);
        let (x, y) = buf.split_at(8);
        (u64::from_le_bytes(x.try_into().unwrap_or_default()), u64::from_le_bytes(y.try_into().unwrap_or_default()))
    }
}

/// The per-thread table of short pieces (2 to [`SHORT_MAX`] bytes, at most [`SHORT_IDS`] ids):
/// sets of two 32-byte slots in one 64-byte line, the newer first, so a lookup reads one line
/// and compares two words. A slot is the key's two words (the id count in bits 60-62 of the
/// second), then four ids; a lookup writes all four and the caller advances by the count, so
/// a hit costs no branch on its length. Allocated zeroed (an all-zero slot is no piece's:
/// every key has its length in its second word), its pages taken as they are first written.
pub(crate) struct ShortCache {
    sets: Box<[Line; 1 << SHORT_SETS_LOG2]>,
}

impl ShortCache {
    /// An empty table.
    pub(crate) fn new() -> ShortCache {
        ShortCache { sets: zeroed_lines() }
    }

    #[inline(always)]
    fn set(&self, k: &ShortKey) -> &[u64; 8] {
        &self.sets[k.set & ((1 << SHORT_SETS_LOG2) - 1)].0
    }

    /// `k`'s set, to write (the mask lets the compiler drop the bounds check).
    #[inline(always)]
    fn set_mut(&mut self, k: &ShortKey) -> &mut [u64; 8] {
        &mut self.sets[k.set & ((1 << SHORT_SETS_LOG2) - 1)].0
    }

    /// Asks the processor to bring `k`'s line into its cache without waiting for it.
    #[inline(always)]
    pub(crate) fn prefetch(&self, k: &ShortKey) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let line: *const [u64; 8] = self.set(k);
            // SAFETY: a prefetch is a hint that never faults and reads nothing into the
            // program; the pointer is to a live line of `sets` anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.cast()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = k;
    }

    /// The four id lanes of `k` and its id count, or `None` when the piece is not in the table
    /// (the lanes after the count are zeros). A count of 0: the piece has more ids than a slot
    /// holds (see [`ShortCache::put`]). A piece found in its set's second slot moves to the
    /// first, so that pieces used again and again stay while pieces seen once come and go.
    #[inline(always)]
    pub(crate) fn get(&mut self, k: &ShortKey) -> Option<([u32; SHORT_IDS], usize)> {
        const COUNT: u64 = 7 << 60;
        let s = self.set_mut(k);
        let slot = if s[0] == k.lo && s[1] & !COUNT == k.hi {
            [s[1], s[2], s[3]]
        } else if s[4] == k.lo && s[5] & !COUNT == k.hi {
            let second = [s[4], s[5], s[6], s[7]];
            s.copy_within(0..4, 4);
            s[..4].copy_from_slice(&second);
            [second[1], second[2], second[3]]
        } else {
            return None;
        };
        Some((
            [slot[1] as u32, (slot[1] >> 32) as u32, slot[2] as u32, (slot[2] >> 32) as u32],
            (slot[0] >> 60) as usize,
        ))
    }

    /// Stores the ids of `k` in its set's second slot (the first when that one is empty), the
    /// piece there giving way; with none or more than [`SHORT_IDS`] ids only the count 0, which
    /// tells the caller to look further (a [`PieceCache`] holds up to [`MAX_IDS`]).
    #[inline]
    pub(crate) fn put(&mut self, k: &ShortKey, ids: &[u32]) {
        let mut lanes = [0u32; SHORT_IDS];
        let count = if ids.len() <= SHORT_IDS { ids.len() } else { 0 };
        lanes[..count].copy_from_slice(&ids[..count]);
        let s = self.set_mut(k);
        let at = if s[1] == 0 { 0 } else { 4 };
        s[at] = k.lo;
        s[at + 1] = k.hi | (count as u64) << 60;
        s[at + 2] = u64::from(lanes[0]) | u64::from(lanes[1]) << 32;
        s[at + 3] = u64::from(lanes[2]) | u64::from(lanes[3]) << 32;
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

    #[test]
    fn short_keys_are_the_bytes_and_length_wherever_the_piece_lies() {
        let text = b"xx hello\0world and some more bytes after it";
        assert_eq!(ShortKey::of(text, 2, 8), ShortKey::of(b" hello", 0, 6));
        assert_ne!(ShortKey::of(text, 3, 9), ShortKey::of(text, 3, 8), "a trailing zero byte counts");
        // Fifteen bytes, near the end and not.
        assert_eq!(ShortKey::of(text, 3, 18), ShortKey::of(&text[..18], 3, 18));
        assert!(ShortKey::of(text, 3, 18).is_some());
        assert!(!ShortKey::of(text, 3, 19).is_some(), "sixteen bytes are not short");
        assert!(!ShortKey::of(text, 3, 4).is_some(), "a single byte has no key");
    }

    #[test]
    fn the_short_table_returns_ids_and_keeps_pieces_used_again() {
        let mut c = ShortCache::new();
        let text = b" alpha beta gamma delta";
        let (a, b) = (ShortKey::of(text, 0, 6), ShortKey::of(text, 6, 11));
        assert_eq!(c.get(&a), None);
        c.put(&a, &[7, 8, 9]);
        c.put(&b, &[70_001, 2, 3, 4, 5]);
        assert_eq!(c.get(&a), Some(([7, 8, 9, 0], 3)));
        assert_eq!(c.get(&b), Some(([0; 4], 0)), "more ids than a slot holds: count 0");
        // Three keys of one set: the one found again stays, the one not looked up since leaves.
        let mut same = vec![];
        let words: Vec<String> = (0u32..1_000_000).map(|i| format!("w{i}")).collect();
        for w in &words {
            let k = ShortKey::of(w.as_bytes(), 0, w.len());
            if k.set == a.set {
                same.push(k);
                if same.len() == 3 {
                    break;
                }
            }
        }
        let mut c = ShortCache::new();
        c.put(&same[0], &[1]);
        c.put(&same[1], &[2]);
        assert_eq!(c.get(&same[1]), Some(([2, 0, 0, 0], 1)));
        c.put(&same[2], &[3]);
        assert_eq!(c.get(&same[0]), None);
        assert_eq!(c.get(&same[1]), Some(([2, 0, 0, 0], 1)));
        assert_eq!(c.get(&same[2]), Some(([3, 0, 0, 0], 1)));
    }
}
