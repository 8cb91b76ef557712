//! stoker's own exact encoder for byte-level BPE files (GPT-2 and its kin): the same ids as the
//! `tokenizers` crate, several times faster, chosen by [`super::TextTokenizer`] only for a
//! `tokenizer.json` whose whole pipeline it reproduces (see [`BpeModel::from_json`] for the
//! list); every other file stays on `tokenizers`, with the reason kept.
//!
//! The pipeline, as `tokenizers` runs it: added tokens are split out first (tokens with
//! `normalized: false`, leftmost-longest over the text, then those with `normalized: true` in the
//! gaps), each gap is cut into pieces by GPT-2's pattern (`pretok.rs`), and each piece's
//! bytes are merged by the lowest merge rank, leftmost first among equal ranks, exactly like
//! `tokenizers`' `Word::merge_all`. Frequent pieces are cached per thread (no shared mutable
//! state; the cache is bounded); long pieces merge with a heap over a linked list, so time
//! grows as `n log n` with a piece's length.

use super::pretok::Pieces;
use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// GPT-2's pre-tokenizer pattern, as `tokenizers` writes it for `ByteLevel(use_regex=true)`.
pub(crate) const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Pieces up to this many bytes are cached.
const CACHE_MAX_PIECE: usize = 64;
/// Entries a thread's cache holds before it is emptied (bounds its memory at a few MiB).
const CACHE_MAX_ENTRIES: usize = 1 << 15;
/// Pieces longer than this many bytes merge with the heap; shorter ones by scanning.
const HEAP_FROM: usize = 96;

/// A small multiplicative hasher (the `FxHasher` of rustc) for ids and short byte strings:
/// keys here are not attacker-chosen in a way that matters (a slow map is the worst case).
#[derive(Default, Clone, Copy)]
struct Fx(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(FX_K);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// Gives each loaded model its own key for the per-thread caches.
static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);

/// A byte-level BPE model the fast path reproduces exactly, built from a `tokenizer.json`.
#[derive(Debug)]
pub struct BpeModel {
    /// Unique per loaded model: keys the per-thread cache.
    key: u64,
    /// The id of each byte's byte-level character.
    byte_ids: [u32; 256],
    /// `(left << 32 | right)` -> `(rank, merged id)`; a pair listed twice keeps its last rank,
    /// as in `tokenizers`.
    merges: FxMap<u64, (u32, u32)>,
    /// With `ignore_merges`: the vocabulary by raw bytes (a piece found here is one token).
    whole: Option<FxMap<Box<[u8]>, u32>>,
    /// Added tokens with `normalized: false`, then those with `normalized: true`.
    added: [Option<Added>; 2],
}

/// One of `tokenizers`' two added-token tries: leftmost-longest, with each pattern's id.
#[derive(Debug)]
struct Added {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

/// The per-thread cache and scratch space.
struct Cache {
    model: u64,
    map: FxMap<Box<[u8]>, Box<[u32]>>,
    syms: Vec<u32>,
    ranks: Vec<(u32, u32)>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        model: 0,
        map: FxMap::default(),
        syms: Vec::new(),
        ranks: Vec::new(),
    });
}

/// GPT-2's `bytes_to_unicode`: the printable character standing for each byte.
pub(crate) fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let c = if printable {
            b
        } else {
            n += 1;
            255 + n
        };
        // All values are below 0x200, valid scalar values.
        out[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    out
}

fn is_null_or(v: Option<&Value>, ok: impl Fn(&Value) -> bool) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(v) => ok(v),
    }
}

fn ty(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Whether `v` is a ByteLevel pre-tokenizer with `add_prefix_space: false` and the given
/// `use_regex` (both default to true in `tokenizers`).
fn is_byte_level(v: &Value, use_regex: bool) -> bool {
    ty(v) == "ByteLevel"
        && v.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
        && v.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == use_regex
}

/// Checks the parts of the pipeline around the model; `Err` says what falls back.
fn check_pipeline(j: &Value) -> Result<(), String> {
    if !is_null_or(j.get("normalizer"), |_| false) {
        return Err(format!("normalizer {:?} is not reproduced", ty(&j["normalizer"])));
    }
    if !is_null_or(j.get("truncation"), |_| false) || !is_null_or(j.get("padding"), |_| false) {
        return Err("truncation or padding is set".into());
    }
    if !is_null_or(j.get("post_processor"), |p| ty(p) == "ByteLevel") {
        return Err(format!("post-processor {:?} may add tokens", ty(&j["post_processor"])));
    }
    let pre = j.get("pre_tokenizer").unwrap_or(&Value::Null);
    let ok = is_byte_level(pre, true)
        || (ty(pre) == "Sequence"
            && match pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice) {
                Some([split, bl]) => {
                    ty(split) == "Split"
                        && split.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str)
                            == Some(GPT2_PATTERN)
                        && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
                        && split.get("invert").and_then(Value::as_bool) == Some(false)
                        && is_byte_level(bl, false)
                }
                _ => false,
            });
    if !ok {
        return Err("pre-tokenizer is not GPT-2's ByteLevel pattern without a prefix space".into());
    }
    Ok(())
}

impl BpeModel {
    /// Builds the fast path for `json` (the parsed `tokenizer.json` that `tok` was loaded from),
    /// or says why it cannot reproduce it. Eligible: a `BPE` model with no dropout, no
    /// `unk_token`, no subword prefix or suffix, no byte fallback (`ignore_merges` either way),
    /// with every byte's character in the vocabulary; no normalizer, truncation or padding; a
    /// `ByteLevel` pre-tokenizer (GPT-2's pattern, no prefix space) or `Split` on that pattern
    /// then `ByteLevel` without regex; no post-processor or a `ByteLevel` one; added tokens
    /// without `single_word`, `lstrip` or `rstrip`.
    pub fn from_json(j: &Value, tok: &tokenizers::Tokenizer) -> Result<BpeModel, String> {
        check_pipeline(j)?;
        let m = j.get("model").ok_or("no model")?;
        if ty(m) != "BPE" {
            return Err(format!("model {:?} is not BPE", ty(m)));
        }
        if !is_null_or(m.get("dropout"), |d| d.as_f64() == Some(0.0)) {
            return Err("BPE dropout is set".into());
        }
        if !is_null_or(m.get("unk_token"), |_| false) {
            return Err("BPE has an unk_token".into());
        }
        for k in ["continuing_subword_prefix", "end_of_word_suffix"] {
            if !is_null_or(m.get(k), |v| v.as_str() == Some("")) {
                return Err(format!("BPE has a {k}"));
            }
        }
        if !is_null_or(m.get("byte_fallback"), |v| v.as_bool() == Some(false)) {
            return Err("BPE uses byte fallback".into());
        }
        let ignore_merges = m.get("ignore_merges").and_then(Value::as_bool).unwrap_or(false);
        let vocab = m.get("vocab").and_then(Value::as_object).ok_or("BPE vocab is not a map")?;
        let id = |s: &str| vocab.get(s).and_then(Value::as_u64).and_then(|v| u32::try_from(v).ok());
        let mut seen = FxMap::<u32, ()>::default();
        for (s, v) in vocab {
            let v = v.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| format!("bad id for {s:?}"))?;
            if seen.insert(v, ()).is_some() {
                return Err(format!("id {v} is given to two tokens"));
            }
        }

        let chars = byte_chars();
        let mut back = FxMap::<char, u8>::default();
        let mut byte_ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            byte_ids[b] =
                id(&c.to_string()).ok_or_else(|| format!("byte {b:#04x} ({c:?}) is not in the vocabulary"))?;
            back.insert(*c, b as u8);
        }

        let merges_v = m.get("merges").and_then(Value::as_array).ok_or("BPE merges are not a list")?;
        let mut merges = FxMap::<u64, (u32, u32)>::default();
        merges.reserve(merges_v.len());
        let mut rank = 0u32;
        for mv in merges_v {
            let (a, b) = match mv {
                Value::String(s) if s.starts_with("#version") => continue,
                Value::String(s) => match s.split(' ').collect::<Vec<_>>()[..] {
                    [a, b] => (a.to_string(), b.to_string()),
                    _ => return Err(format!("merge {s:?} is not two tokens")),
                },
                Value::Array(p) => match &p[..] {
                    [Value::String(a), Value::String(b)] => (a.clone(), b.clone()),
                    _ => return Err("a merge is not a pair of strings".into()),
                },
                _ => return Err("a merge is neither a string nor a pair".into()),
            };
            let missing = || format!("merge {a:?} {b:?} is not in the vocabulary");
            let (ia, ib, inew) = (id(&a).ok_or_else(missing)?, id(&b).ok_or_else(missing)?, id(&(a.clone() + &b)));
            merges.insert((ia as u64) << 32 | ib as u64, (rank, inew.ok_or_else(missing)?));
            rank = rank.checked_add(1).ok_or("too many merges")?;
        }

        let whole = ignore_merges.then(|| {
            let mut w = FxMap::default();
            for (s, v) in vocab {
                let bytes: Option<Vec<u8>> = s.chars().map(|c| back.get(&c).copied()).collect();
                if let (Some(bytes), Some(v)) = (bytes, v.as_u64()) {
                    w.insert(bytes.into_boxed_slice(), v as u32);
                }
            }
            w
        });

        // Added tokens, from the loaded tokenizer itself (its flags and ids after loading).
        let mut sets: [Vec<(String, u32)>; 2] = [vec![], vec![]];
        let mut decoder: Vec<_> = tok.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_by_key(|(i, _)| *i);
        for (_, t) in decoder {
            if t.content.is_empty() {
                continue;
            }
            if t.single_word || t.lstrip || t.rstrip {
                return Err(format!("added token {:?} uses single_word, lstrip or rstrip", t.content));
            }
            let tid = tok.token_to_id(&t.content).ok_or_else(|| format!("added token {:?} has no id", t.content))?;
            sets[usize::from(t.normalized)].push((t.content, tid));
        }
        let build = |set: &Vec<(String, u32)>| -> Result<Option<Added>, String> {
            if set.is_empty() {
                return Ok(None);
            }
            let matcher = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(set.iter().map(|(s, _)| s))
                .map_err(|e| format!("added tokens: {e}"))?;
            Ok(Some(Added { matcher, ids: set.iter().map(|(_, i)| *i).collect() }))
        };
        let added = [build(&sets[0])?, build(&sets[1])?];
        let key = NEXT_MODEL.fetch_add(1, Ordering::Relaxed);
        Ok(BpeModel { key, byte_ids, merges, whole, added })
    }

    /// Appends the ids of `text` to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        CACHE.with(|c| match c.try_borrow_mut() {
            Ok(mut c) => {
                if c.model != self.key {
                    c.map.clear();
                    c.model = self.key;
                }
                self.split_added(text, 0, &mut c, out)
            }
            // Only reachable by re-entry, which nothing here does: work without the cache.
            Err(_) => {
                let mut c = Cache { model: 0, map: FxMap::default(), syms: vec![], ranks: vec![] };
                self.split_added(text, 0, &mut c, out)
            }
        })
    }

    /// Splits `text` on the added tokens of trie `stage` and later ones, encoding the gaps.
    fn split_added(&self, text: &str, stage: usize, c: &mut Cache, out: &mut Vec<u32>) {
        let Some(set) = self.added.get(stage) else {
            return self.encode_plain(text, c, out);
        };
        let Some(added) = set else {
            return self.split_added(text, stage + 1, c, out);
        };
        let mut at = 0;
        for m in added.matcher.find_iter(text) {
            if m.start() > at {
                self.split_added(&text[at..m.start()], stage + 1, c, out);
            }
            out.push(added.ids[m.pattern().as_usize()]);
            at = m.end();
        }
        if at < text.len() {
            self.split_added(&text[at..], stage + 1, c, out);
        }
    }

    /// Text without added tokens: pieces, then BPE on each.
    fn encode_plain(&self, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        for (a, b) in Pieces::new(text) {
            self.encode_piece(&bytes[a..b], c, out);
        }
    }

    #[inline]
    fn encode_piece(&self, piece: &[u8], c: &mut Cache, out: &mut Vec<u32>) {
        if let Some(w) = &self.whole {
            if let Some(&id) = w.get(piece) {
                out.push(id);
                return;
            }
        }
        if piece.len() == 1 {
            out.push(self.byte_ids[piece[0] as usize]);
            return;
        }
        if piece.len() > CACHE_MAX_PIECE {
            if piece.len() >= HEAP_FROM {
                self.merge_heap(piece, out);
            } else {
                self.merge_scan(piece, c, out);
            }
            return;
        }
        if let Some(ids) = c.map.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let from = out.len();
        self.merge_scan(piece, c, out);
        if c.map.len() >= CACHE_MAX_ENTRIES {
            c.map.clear();
        }
        c.map.insert(piece.into(), out[from..].into());
    }

    #[inline]
    fn pair(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.merges.get(&((a as u64) << 32 | b as u64)).copied()
    }

    /// Short pieces: repeatedly merge the leftmost pair of lowest rank, by scanning.
    fn merge_scan(&self, piece: &[u8], c: &mut Cache, out: &mut Vec<u32>) {
        let Cache { syms, ranks, .. } = c;
        syms.clear();
        syms.extend(piece.iter().map(|&b| self.byte_ids[b as usize]));
        ranks.clear();
        ranks.extend(syms.windows(2).map(|w| self.pair(w[0], w[1]).unwrap_or((u32::MAX, 0))));
        loop {
            let mut best = (u32::MAX, 0usize);
            for (k, &(r, _)) in ranks.iter().enumerate() {
                if r < best.0 {
                    best = (r, k);
                }
            }
            if best.0 == u32::MAX {
                break;
            }
            let k = best.1;
            syms[k] = ranks[k].1;
            syms.remove(k + 1);
            ranks.remove(k);
            if k < ranks.len() {
                ranks[k] = self.pair(syms[k], syms[k + 1]).unwrap_or((u32::MAX, 0));
            }
            if k > 0 {
                ranks[k - 1] = self.pair(syms[k - 1], syms[k]).unwrap_or((u32::MAX, 0));
            }
        }
        out.extend_from_slice(syms);
    }

    /// Long pieces: `tokenizers`' own algorithm, a min-heap of `(rank, position)` over a linked
    /// list of symbols, stale entries skipped.
    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        const NONE: usize = usize::MAX;
        let n = piece.len();
        let mut sym: Vec<u32> = piece.iter().map(|&b| self.byte_ids[b as usize]).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i == n { NONE } else { i }).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for k in 0..n - 1 {
            if let Some((r, id)) = self.pair(sym[k], sym[k + 1]) {
                heap.push(Reverse((r, k, id)));
            }
        }
        while let Some(Reverse((_, pos, id))) = heap.pop() {
            let nx = next[pos];
            if !alive[pos] || nx == NONE {
                continue;
            }
            if self.pair(sym[pos], sym[nx]).map(|p| p.1) != Some(id) {
                continue;
            }
            sym[pos] = id;
            alive[nx] = false;
            next[pos] = next[nx];
            if next[nx] != NONE {
                prev[next[nx]] = pos;
            }
            let p = prev[pos];
            if p != NONE {
                if let Some((r, nid)) = self.pair(sym[p], sym[pos]) {
                    heap.push(Reverse((r, p, nid)));
                }
            }
            let q = next[pos];
            if q != NONE {
                if let Some((r, nid)) = self.pair(sym[pos], sym[q]) {
                    heap.push(Reverse((r, pos, nid)));
                }
            }
        }
        let mut k = 0;
        while k != NONE {
            out.push(sym[k]);
            k = next[k];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!((c[b'!' as usize], c[b' ' as usize], c[0], c[b'\n' as usize], c[0xAD]), ('!', 'Ġ', 'Ā', 'Ċ', 'Ń'));
        let mut s: Vec<char> = c.to_vec();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), 256);
    }

    #[test]
    fn fx_hashes_differ_by_length() {
        let h = |b: &[u8]| {
            let mut f = Fx::default();
            f.write(b);
            f.finish()
        };
        assert_ne!(h(b"a"), h(b"a\0"));
    }
}
