//! Merging a piece's bytes by the lowest merge rank, leftmost first among equal ranks, exactly
//! like `tokenizers`' `Word::merge_all`: short pieces by scanning the merges of adjacent
//! symbols, long ones cut where no merge can cross, then by a heap over a linked list.

use super::super::pair_table::{PairCache, NONE};
use super::super::piece_cache::MAX_KEY;
use super::{BpeModel, HEAP_FROM};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

impl BpeModel {
    #[inline]
    fn pair(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        match self.merges.get(a, b) {
            NONE => None,
            v => Some(((v >> 32) as u32, v as u32)),
        }
    }

    /// Pieces shorter than [`HEAP_FROM`] bytes: repeatedly merge the leftmost pair of lowest
    /// rank, found by scanning the packed merges of adjacent symbols (rank high, id low, so the
    /// smallest word is the merge to apply; the first of equal ones the leftmost).
    pub(super) fn merge_scan(&self, piece: &[u8], pairs: &mut PairCache, out: &mut Vec<u32>) {
        self.merge_scan_part(piece, true, pairs, out)
    }

    /// [`BpeModel::merge_scan`] on a part of a piece, its last part when `end` (whose last
    /// symbol then carries the model's end-of-word suffix, if it has one).
    fn merge_scan_part(&self, piece: &[u8], end: bool, pairs: &mut PairCache, out: &mut Vec<u32>) {
        let n = piece.len();
        if n >= HEAP_FROM {
            return self.merge_heap(piece, end, out);
        }
        // The table's pieces (the usual misses) on smaller arrays: less to clear each time.
        if n <= MAX_KEY {
            return self.merge_scan_in::<MAX_KEY>(piece, end, pairs, out);
        }
        self.merge_scan_in::<HEAP_FROM>(piece, end, pairs, out)
    }

    /// [`BpeModel::merge_scan_part`] on arrays of `N` (more than the piece's length).
    #[inline]
    fn merge_scan_in<const N: usize>(&self, piece: &[u8], end: bool, pairs: &mut PairCache, out: &mut Vec<u32>) {
        let n = piece.len();
        let mut syms = [0u32; N];
        let mut vals = [NONE; N];
        for (s, &b) in syms.iter_mut().zip(piece) {
            *s = self.byte_ids[b as usize];
        }
        for (v, w) in vals.iter_mut().zip(piece.windows(2)) {
            *v = self.merges.of_bytes(w[0], w[1]);
        }
        if end && self.suffix.is_some() {
            syms[n - 1] = self.last_ids[piece[n - 1] as usize];
            if n > 1 {
                vals[n - 2] = self.merges.get(syms[n - 2], syms[n - 1]);
            }
        }
        let mut len = n;
        while len > 1 {
            let (mut best, mut k) = (NONE, 0);
            for (i, &v) in vals[..len - 1].iter().enumerate() {
                if v < best {
                    best = v;
                    k = i;
                }
            }
            if best == NONE {
                break;
            }
            // Symbols k and k + 1 become one; the pairs after them move down by one (a few
            // each: plain loops, no call to memmove).
            syms[k] = best as u32;
            for j in k + 1..len - 1 {
                syms[j] = syms[j + 1];
            }
            for j in k + 1..len.saturating_sub(2) {
                vals[j] = vals[j + 1];
            }
            len -= 1;
            if k + 1 < len {
                vals[k] = pairs.get(&self.merges, syms[k], syms[k + 1]);
            }
            if k > 0 {
                vals[k - 1] = pairs.get(&self.merges, syms[k - 1], syms[k]);
            }
        }
        out.extend_from_slice(&syms[..len]);
    }

    /// Long pieces: cut where no merge can cross (see `joins`), each part merged alone.
    pub(super) fn merge_long(&self, piece: &[u8], pairs: &mut PairCache, out: &mut Vec<u32>) {
        let mut start = 0;
        for p in 1..piece.len() {
            let k = usize::from(piece[p - 1]) << 8 | usize::from(piece[p]);
            if self.joins[k >> 6] >> (k & 63) & 1 == 0 {
                self.merge_part(&piece[start..p], false, pairs, out);
                start = p;
            }
        }
        self.merge_part(&piece[start..], true, pairs, out);
    }

    /// A part of a piece, the last one when `end`.
    fn merge_part(&self, part: &[u8], end: bool, pairs: &mut PairCache, out: &mut Vec<u32>) {
        match part.len() {
            1 if end => out.push(self.last_ids[part[0] as usize]),
            1 => out.push(self.byte_ids[part[0] as usize]),
            n if n >= HEAP_FROM => self.merge_heap(part, end, out),
            _ => self.merge_scan_part(part, end, pairs, out),
        }
    }

    /// Long pieces: `tokenizers`' own algorithm, a min-heap of `(rank, position)` over a linked
    /// list of symbols, stale entries skipped. Positions are `u32` for pieces under 4 GiB (about
    /// 20 bytes of memory per byte of the piece, the heap included), `usize` beyond.
    fn merge_heap(&self, piece: &[u8], end: bool, out: &mut Vec<u32>) {
        if piece.len() < u32::MAX as usize {
            self.merge_heap_with::<u32>(piece, end, out)
        } else {
            self.merge_heap_with::<usize>(piece, end, out)
        }
    }

    fn merge_heap_with<I: Index>(&self, piece: &[u8], end: bool, out: &mut Vec<u32>) {
        const DEAD: u32 = u32::MAX;
        let n = piece.len();
        let none = I::NONE;
        let mut sym: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        if end {
            sym[n - 1] = self.last_ids[piece[n - 1] as usize];
        }
        // `prev[k]` and `next[k]`: the live neighbours of live symbol `k` (`NONE` at the ends).
        let mut prev: Vec<I> = (0..n).map(|i| if i == 0 { none } else { I::from_usize(i - 1) }).collect();
        let mut next: Vec<I> = (0..n).map(|i| if i + 1 == n { none } else { I::from_usize(i + 1) }).collect();
        // Entries `(rank, position)`, smallest first: the order of `tokenizers`' `Merge`. A rank
        // names one merge, so an entry is still valid when the pair at its position has it.
        // Packed into one integer each (rank high, position low), built in one heapify.
        let first: Vec<Reverse<I::Key>> = (0..n - 1)
            .filter_map(|k| self.pair(sym[k], sym[k + 1]).map(|(r, _)| Reverse(I::key(r, I::from_usize(k)))))
            .collect();
        let mut heap = BinaryHeap::from(first);
        while let Some(Reverse(key)) = heap.pop() {
            let (rank, pos_i) = I::unkey(key);
            let pos = pos_i.to_usize();
            let nx_i = next[pos];
            if sym[pos] == DEAD || nx_i == none {
                continue;
            }
            let nx = nx_i.to_usize();
            let Some((r, id)) = self.pair(sym[pos], sym[nx]) else { continue };
            if r != rank {
                continue;
            }
            sym[pos] = id;
            sym[nx] = DEAD;
            let after = next[nx];
            next[pos] = after;
            if after != none {
                prev[after.to_usize()] = pos_i;
            }
            let p = prev[pos];
            if p != none {
                if let Some((r, _)) = self.pair(sym[p.to_usize()], id) {
                    heap.push(Reverse(I::key(r, p)));
                }
            }
            if after != none {
                if let Some((r, _)) = self.pair(id, sym[after.to_usize()]) {
                    heap.push(Reverse(I::key(r, pos_i)));
                }
            }
        }
        out.extend(sym.into_iter().filter(|&s| s != DEAD));
    }
}

/// A position in a piece: `u32` for the usual pieces (half the memory), `usize` for huge ones.
trait Index: Copy + Ord + Eq {
    /// A heap entry: `(rank, position)` in one integer that orders the same way.
    type Key: Copy + Ord;
    const NONE: Self;
    fn from_usize(i: usize) -> Self;
    fn to_usize(self) -> usize;
    fn key(rank: u32, pos: Self) -> Self::Key;
    fn unkey(k: Self::Key) -> (u32, Self);
}

impl Index for u32 {
    type Key = u64;
    const NONE: u32 = u32::MAX;
    #[inline]
    fn key(rank: u32, pos: u32) -> u64 {
        (rank as u64) << 32 | pos as u64
    }
    #[inline]
    fn unkey(k: u64) -> (u32, u32) {
        ((k >> 32) as u32, k as u32)
    }
    #[inline]
    fn from_usize(i: usize) -> u32 {
        // Only used for pieces shorter than `u32::MAX` bytes.
        i as u32
    }
    #[inline]
    fn to_usize(self) -> usize {
        self as usize
    }
}

impl Index for usize {
    type Key = u128;
    const NONE: usize = usize::MAX;
    #[inline]
    fn key(rank: u32, pos: usize) -> u128 {
        (rank as u128) << 64 | pos as u128
    }
    #[inline]
    fn unkey(k: u128) -> (u32, usize) {
        ((k >> 64) as u32, k as usize)
    }
    #[inline]
    fn from_usize(i: usize) -> usize {
        i
    }
    #[inline]
    fn to_usize(self) -> usize {
        self
    }
}
