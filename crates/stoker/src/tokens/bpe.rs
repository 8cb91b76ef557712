//! stoker's own exact encoder for byte-level BPE files (GPT-2, GPT-NeoX, Llama 3, Qwen2, GPT-4o
//! and their kin): the same ids as the `tokenizers` crate, several times faster, chosen by
//! [`super::TextTokenizer`] only for a `tokenizer.json` whose whole pipeline it reproduces (see
//! [`BpeModel::from_json`] for the list); every other file stays on `tokenizers`, with the
//! reason kept.
//!
//! The pipeline, as `tokenizers` runs it: added tokens with `normalized: false` are split out of
//! the text first (leftmost-longest, with `tokenizers`' rules for `lstrip`, `rstrip` and
//! `single_word`), each gap is normalized (NFC, when the file says so), those with
//! `normalized: true` are split out of the normalized gaps, each remaining gap is cut into
//! pieces by the file's pattern (`pretok.rs`: GPT-2's, cl100k's, Qwen2's or o200k's, scanned by
//! hand; any other `Split` regex, or a sequence of them as DeepSeek's files have, by the very
//! matcher `tokenizers` runs for it, Oniguruma, each split cutting every piece of the one
//! before), and each
//! piece's bytes are merged by the lowest merge rank, leftmost first among equal ranks, exactly
//! like `tokenizers`' `Word::merge_all`. The post-processor's special tokens (a template's
//! `<|begin_of_text|>`, say) go around the result.
//!
//! Speed: pieces are found 32 at a time (64 bytes of ASCII at once by bit masks for GPT-2's,
//! cl100k's and Qwen2's patterns: `pretok_block.rs`) and each short one's line of the per-thread
//! table of short pieces ([`super::piece_cache::ShortCache`]: pieces of 2 to 15 bytes, up to four
//! ids inline) is prefetched before the 32 are looked up, so a lookup rarely waits on memory; a
//! hit writes four id lanes and advances by its count. A piece the table lacks is merged, through
//! the merges as a flat table ([`super::pair_table`]) behind a small per-thread cache of pairs;
//! longer pieces go through a table of pieces up to 24 bytes, the vocabulary's own tokens that
//! merge into themselves (found once at load: [`BpeModel::fold`]), then a map.
//!
//! Memory: pieces are found 32 at a time (no list of a document's pieces is ever built), so a
//! long document costs its ids plus the merge state of its longest piece, about 20 bytes per
//! byte of that piece (`u32` links and heap entries); a gap that NFC changes is copied once,
//! normalized. A long piece is cut only between two bytes that no merge joins (a symbol ending
//! in the first byte never meets one starting with the second in any merge, so no token can
//! span the cut and each side merges alone, exactly); a piece with no such place (one letter
//! repeated, say) is merged whole. Each thread's caches are about 4.7 MiB per model (its pages
//! taken as they are first written; at most four models per thread), pieces of 25 to 64 bytes
//! in a bounded map beside it; long pieces merge with a heap over a linked list, so time grows
//! as `n log n` with a piece's length.

mod caches;
mod merge;
mod normalize;

use super::pair_table::{PairCache, PairTable};
use super::piece_cache::{FoldTable, Key, ShortKey, SHORT_IDS};
use super::pretok::{Cl100k, Gpt2, O200k, Pattern, Scanner};
use super::pretok_clip::{clip_pieces, CLIP_PATTERN};
use aho_corasick::{AhoCorasick, MatchKind};
use caches::{with_cache, Cache};
use normalize::Normalizer;
use regex::Regex;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use tokenizers::utils::SysRegex;
use tokenizers::{Encoding, NormalizedString, Normalizer as _, PostProcessor, Token};

/// Pieces up to this many bytes are cached (those up to 24 bytes in the table, longer ones in
/// a map).
const CACHE_MAX_PIECE: usize = 64;
/// Entries a thread's map of longer pieces holds before it is emptied (bounds its memory at a
/// few MiB).
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
    /// The id of each byte's character as the last symbol of a piece: with an
    /// `end_of_word_suffix` (CLIP's `</w>`), that character and the suffix; else `byte_ids`.
    last_ids: [u32; 256],
    /// The `end_of_word_suffix`, when the model has one (then `last_ids` differ).
    suffix: Option<String>,
    /// `(left, right)` -> `rank << 32 | merged id`; a pair listed twice keeps its last rank, as
    /// in `tokenizers`.
    merges: PairTable,
    /// Pieces of up to 24 bytes whose ids are known without merging, shared by every thread:
    /// the vocabulary's own tokens that merge into themselves (a merge run once per token at
    /// load), or with `ignore_merges` every token of the vocabulary.
    fold: FoldTable,
    /// With `ignore_merges`: the vocabulary by raw bytes (a piece found here is one token).
    whole: Option<FxMap<Box<[u8]>, u32>>,
    /// Added tokens with `normalized: false`, then those with `normalized: true`.
    added: [Option<Added>; 2],
    /// For special tokens encoded as the text they spell: which of the two tries is left out
    /// (it holds special tokens only; one without any is used as it is). `None` where a trie
    /// mixes special and other tokens (leaving the special ones out could then let another
    /// match where `tokenizers` skips a special match whole).
    as_text_skips: Option<[bool; 2]>,
    /// How text is cut into pieces.
    pre: Pre,
    /// What runs on each gap between added tokens first.
    norm: Normalizer,
    /// Ids the post-processor puts before and after a text's own.
    around: (Vec<u32>, Vec<u32>),
    /// Bit `a << 8 | b`: some merge joins a symbol ending in byte `a` to one starting with byte
    /// `b`. Where two adjacent bytes of a piece are not such a pair, no merge ever crosses
    /// between them, so the two sides merge independently: an exact cut.
    joins: Box<[u64; 1024]>,
}

/// DeepSeek-V3's three `Split` regexes, in order, as its `tokenizer.json` writes them
/// (`deepseek-ai/DeepSeek-V3`): digit runs of up to three, runs of CJK ideographs and kana, then
/// a cl100k-like pattern over letters, marks, punctuation and symbols. The fast path matches any
/// such sequence with Oniguruma, as `tokenizers` does; this one is named for the tests and
/// benchmarks that build DeepSeek-style files.
pub const DEEPSEEK_V3_SPLITS: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    concat!(
        r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"##,
        "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"
    ),
];

/// How the fast path cuts text into pieces (the pre-tokenizer).
#[derive(Debug)]
enum Pre {
    /// One pattern with a hand-written scanner (`pretok.rs`).
    Scan(Pattern),
    /// `Split(Regex, Isolated)`s in sequence, matched by `tokenizers`' own regex type (`SysRegex`:
    /// Oniguruma, as its `Split` holds it) with its rule for them (`Pattern::find_matches` and
    /// `PreTokenizedString::split`): every match and every gap between matches is a piece, empty
    /// ones are dropped, and each split cuts every piece of the one before, seeing only that
    /// piece.
    Regexes(Vec<SysRegex>),
    /// CLIP's `Split(Regex, Removed, invert)` then `ByteLevel` with its regex (`pretok_clip.rs`).
    Clip,
}

/// One of `tokenizers`' two added-token tries: leftmost-longest, with each pattern's id and
/// flags.
#[derive(Debug)]
struct Added {
    matcher: AhoCorasick,
    ids: Vec<u32>,
    flags: Vec<Flags>,
}

/// An added token's `single_word`, `lstrip` and `rstrip`.
#[derive(Debug, Clone, Copy, Default)]
struct Flags {
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
}

/// The added-token tries one encoding splits on (`normalized: false`, then `true`): the
/// model's, or with special tokens encoded as text, without a trie of special tokens only.
type Tries<'a> = [Option<&'a Added>; 2];

/// A part of a text split on added tokens.
enum Part<'a> {
    /// Text between added tokens.
    Gap(&'a str),
    /// An added token's id.
    Token(u32),
}

/// `tokenizers`' own tests for `single_word`, `lstrip` and `rstrip` (`added_vocabulary.rs`
/// runs the `regex` crate's `\w` and `\s`), applied to one character at a time.
static WORD_CHAR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\w$").expect("a valid regex"));
static SPACE_CHAR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\s$").expect("a valid regex"));

fn char_is(re: &Regex, c: char) -> bool {
    let mut buf = [0u8; 4];
    re.is_match(c.encode_utf8(&mut buf))
}

impl Added {
    /// Splits `text` on this trie's tokens exactly as `AddedVocabulary::find_matches` does:
    /// a `single_word` match touching a word character is skipped, `lstrip` takes the spaces
    /// before the token (not before the previous split's end), `rstrip` those after it.
    fn split<'t>(&self, text: &'t str, mut part: impl FnMut(Part<'t>)) {
        let mut start_offset = 0;
        for m in self.matcher.find_iter(text) {
            let (mut start, mut stop) = (m.start(), m.end());
            let k = m.pattern().as_usize();
            let f = self.flags[k];
            if f.single_word {
                // `!ends_with_word(&text[..start])`, `!starts_with_word(&text[stop..])`.
                let start_space = text[..start].chars().next_back().is_none_or(|c| !char_is(&WORD_CHAR, c));
                let stop_space = text[stop..].chars().next().is_none_or(|c| !char_is(&WORD_CHAR, c));
                if !stop_space || !start_space {
                    continue;
                }
            }
            if f.lstrip {
                // `max(space_leftmost_at_end(&text[..start]), start_offset)`: the start of the
                // spaces that end at `start`, no earlier than `start_offset`.
                if start_offset < start {
                    let gap = &text[start_offset..start];
                    let kept = gap.trim_end_matches(|c| char_is(&SPACE_CHAR, c)).len();
                    start = start_offset + kept;
                } else {
                    start = start_offset;
                }
            }
            if f.rstrip {
                // `stop + space_rightmost_at_start(&text[stop..])`.
                let rest = &text[stop..];
                stop += rest.len() - rest.trim_start_matches(|c| char_is(&SPACE_CHAR, c)).len();
            }
            if start_offset < start {
                part(Part::Gap(&text[start_offset..start]));
            }
            part(Part::Token(self.ids[k]));
            start_offset = stop;
        }
        if start_offset != text.len() {
            part(Part::Gap(&text[start_offset..]));
        }
    }
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

/// The post-processors that only put special tokens around a text's ids (and adjust offsets),
/// whatever the ids are.
fn is_wrapping(p: &Value) -> bool {
    match ty(p) {
        "ByteLevel" | "TemplateProcessing" | "BertProcessing" | "RobertaProcessing" => true,
        "Sequence" => p.get("processors").and_then(Value::as_array).is_some_and(|ps| ps.iter().all(is_wrapping)),
        _ => false,
    }
}

/// The regex of a `Split` with `Isolated` behaviour, not inverted.
fn isolated_split(v: &Value) -> Option<&str> {
    if ty(v) == "Split"
        && v.get("behavior").and_then(Value::as_str) == Some("Isolated")
        && v.get("invert").and_then(Value::as_bool) == Some(false)
    {
        v.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str)
    } else {
        None
    }
}

/// Whether `v` is CLIP's `Split`: its pattern, `Removed`, inverted (the matches are kept).
fn is_clip_split(v: &Value) -> bool {
    ty(v) == "Split"
        && v.get("behavior").and_then(Value::as_str) == Some("Removed")
        && v.get("invert").and_then(Value::as_bool) == Some(true)
        && v.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str) == Some(CLIP_PATTERN)
}

/// Checks the parts of the pipeline around the model: `Ok((pre-tokenizer, normalizer))`, or what
/// falls back.
fn check_pipeline(j: &Value) -> Result<(Pre, Normalizer), String> {
    let norm = Normalizer::of(j.get("normalizer"))?;
    if !is_null_or(j.get("truncation"), |_| false) || !is_null_or(j.get("padding"), |_| false) {
        return Err("truncation or padding is set".into());
    }
    if !is_null_or(j.get("post_processor"), is_wrapping) {
        return Err(format!("post-processor {:?} is not reproduced", ty(&j["post_processor"])));
    }
    let pre = j.get("pre_tokenizer").unwrap_or(&Value::Null);
    let splits: Option<Vec<&str>> = if is_byte_level(pre, true) {
        return Ok((Pre::Scan(Pattern::Gpt2), norm));
    } else if ty(pre) == "Sequence" {
        match pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice) {
            Some([split, bl]) if is_clip_split(split) && is_byte_level(bl, true) => return Ok((Pre::Clip, norm)),
            Some([splits @ .., bl]) if !splits.is_empty() && is_byte_level(bl, false) => {
                splits.iter().map(isolated_split).collect()
            }
            _ => None,
        }
    } else {
        None
    };
    let splits = splits.ok_or(
        "pre-tokenizer is neither ByteLevel without a prefix space, Split(Regex, Isolated)s + ByteLevel \
         without regex, nor CLIP's",
    )?;
    let pre = match splits[..] {
        [one] if Pattern::of(one).is_some() => Pre::Scan(Pattern::of(one).expect("just checked")),
        _ => Pre::Regexes(
            splits
                .iter()
                .map(|p| SysRegex::new(p).map_err(|e| format!("pre-tokenizer regex {p:?}: {e}")))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok((pre, norm))
}

/// The ids `tok`'s post-processor puts before and after a text's ids, found by running it on a
/// one-token encoding of an id no vocabulary has.
pub(crate) fn around(tok: &tokenizers::Tokenizer) -> Result<(Vec<u32>, Vec<u32>), String> {
    let Some(pp) = tok.get_post_processor() else {
        return Ok((vec![], vec![]));
    };
    const MARK: u32 = u32::MAX - 7;
    let one = Encoding::from_tokens(vec![Token::new(MARK, "\u{0}".into(), (0, 1))], 0);
    let ids = pp.process(one, None, true).map_err(|e| format!("post-processor: {e}"))?.get_ids().to_vec();
    match ids.iter().position(|&i| i == MARK) {
        Some(at) if ids.iter().filter(|&&i| i == MARK).count() == 1 => Ok((ids[..at].to_vec(), ids[at + 1..].to_vec())),
        _ => Err("post-processor does not keep the text's ids together".into()),
    }
}

impl BpeModel {
    /// Builds the fast path for `json` (the parsed `tokenizer.json` that `tok` was loaded from),
    /// or says why it cannot reproduce it. Eligible: a `BPE` model with no dropout, no subword
    /// prefix, no byte fallback, with every byte's character in the vocabulary (so an
    /// `unk_token` never applies), `ignore_merges` either way, or an `end_of_word_suffix` (CLIP's
    /// `</w>`) with every byte's character and the suffix in the vocabulary too, without
    /// `ignore_merges`; normalizers among `NFC`, `Lowercase` and `Replace(\s+, " ")` in any
    /// order ([`normalize`]); no truncation or padding; a `ByteLevel` pre-tokenizer (GPT-2's
    /// pattern, no prefix space), one or more `Split(Regex, Isolated)` then `ByteLevel` without
    /// regex (GPT-2's, cl100k's, Qwen2's or o200k's pattern alone is scanned by hand, anything
    /// else matched by Oniguruma), or CLIP's `Split` then `ByteLevel`; no post-processor, or ones
    /// that only put special tokens around the text (`ByteLevel`, `TemplateProcessing`,
    /// `BertProcessing`, `RobertaProcessing`, a `Sequence` of them); added tokens with any flags.
    pub fn from_json(j: &Value, tok: &tokenizers::Tokenizer) -> Result<BpeModel, String> {
        let (pre, norm) = check_pipeline(j)?;
        if tok.get_encode_special_tokens() {
            return Err("special tokens are encoded as text".into());
        }
        let m = j.get("model").ok_or("no model")?;
        if ty(m) != "BPE" {
            return Err(format!("model {:?} is not BPE", ty(m)));
        }
        if !is_null_or(m.get("dropout"), |d| d.as_f64() == Some(0.0)) {
            return Err("BPE dropout is set".into());
        }
        if !is_null_or(m.get("continuing_subword_prefix"), |v| v.as_str() == Some("")) {
            return Err("BPE has a continuing_subword_prefix".into());
        }
        let suffix = match m.get("end_of_word_suffix") {
            None | Some(Value::Null) => "",
            Some(v) => v.as_str().ok_or("BPE's end_of_word_suffix is not a string")?,
        };
        if !is_null_or(m.get("byte_fallback"), |v| v.as_bool() == Some(false)) {
            return Err("BPE uses byte fallback".into());
        }
        let ignore_merges = m.get("ignore_merges").and_then(Value::as_bool).unwrap_or(false);
        if ignore_merges && !suffix.is_empty() {
            return Err("BPE has both ignore_merges and an end_of_word_suffix".into());
        }
        let vocab = m.get("vocab").and_then(Value::as_object).ok_or("BPE vocab is not a map")?;
        // The vocabulary hashed once (the file's map is ordered: a lookup there compares strings).
        let mut ids = FxMap::<&str, u32>::default();
        ids.reserve(vocab.len());
        let mut seen = FxMap::<u32, ()>::default();
        for (s, v) in vocab {
            let v = v.as_u64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| format!("bad id for {s:?}"))?;
            if v >= u32::MAX - 8 {
                return Err(format!("id {v} is out of the fast path's range"));
            }
            if seen.insert(v, ()).is_some() {
                return Err(format!("id {v} is given to two tokens"));
            }
            ids.insert(s.as_str(), v);
        }
        let id = |s: &str| ids.get(s).copied();

        let chars = byte_chars();
        let mut back = FxMap::<char, u8>::default();
        let mut byte_ids = [0u32; 256];
        let mut last_ids = [0u32; 256];
        for (b, c) in chars.iter().enumerate() {
            byte_ids[b] =
                id(&c.to_string()).ok_or_else(|| format!("byte {b:#04x} ({c:?}) is not in the vocabulary"))?;
            last_ids[b] = id(&format!("{c}{suffix}"))
                .ok_or_else(|| format!("byte {b:#04x} ({c:?}) with the suffix {suffix:?} is not in the vocabulary"))?;
            back.insert(*c, b as u8);
        }

        let merges_v = m.get("merges").and_then(Value::as_array).ok_or("BPE merges are not a list")?;
        let mut merges = Vec::with_capacity(merges_v.len());
        let mut joins = Box::new([0u64; 1024]);
        let mut rank = 0u32;
        let mut joined = String::new();
        for mv in merges_v {
            let (a, b): (&str, &str) = match mv {
                Value::String(s) if s.starts_with("#version") => continue,
                Value::String(s) => match s.split_once(' ') {
                    Some((a, b)) if !b.contains(' ') => (a, b),
                    _ => return Err(format!("merge {s:?} is not two tokens")),
                },
                Value::Array(p) => match &p[..] {
                    [Value::String(a), Value::String(b)] => (a, b),
                    _ => return Err("a merge is not a pair of strings".into()),
                },
                _ => return Err("a merge is neither a string nor a pair".into()),
            };
            let missing = || format!("merge {a:?} {b:?} is not in the vocabulary");
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let (ia, ib, inew) = (id(a).ok_or_else(missing)?, id(b).ok_or_else(missing)?, id(&joined));
            merges.push(((ia, ib), (rank, inew.ok_or_else(missing)?)));
            // A merge whose sides are not byte-level text never fires (every symbol is).
            // (A left side that ends a word, with the suffix, never has a right side.)
            if let (Some(x), Some(y)) = (
                a.strip_suffix(suffix).unwrap_or(a).chars().next_back().and_then(|c| back.get(&c)),
                b.chars().next().and_then(|c| back.get(&c)),
            ) {
                let k = usize::from(*x) << 8 | usize::from(*y);
                joins[k >> 6] |= 1 << (k & 63);
            }
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
        let mut sets: [Vec<(String, u32, Flags, bool)>; 2] = [vec![], vec![]];
        let mut decoder: Vec<_> = tok.get_added_tokens_decoder().into_iter().collect();
        decoder.sort_by_key(|(i, _)| *i);
        for (_, t) in decoder {
            if t.content.is_empty() {
                continue;
            }
            let tid = tok.token_to_id(&t.content).ok_or_else(|| format!("added token {:?} has no id", t.content))?;
            if tid >= u32::MAX - 8 {
                return Err(format!("id {tid} is out of the fast path's range"));
            }
            let flags = Flags { single_word: t.single_word, lstrip: t.lstrip, rstrip: t.rstrip };
            let content = if t.normalized {
                // The normalized trie holds each token's normalized form, as `tokenizers` builds it.
                let mut n = NormalizedString::from(t.content.as_str());
                if let Some(norm) = tok.get_normalizer() {
                    norm.normalize(&mut n).map_err(|e| format!("normalizing {:?}: {e}", t.content))?;
                }
                n.get().to_string()
            } else {
                t.content
            };
            sets[usize::from(t.normalized)].push((content, tid, flags, t.special));
        }
        let build = |set: &[(String, u32, Flags, bool)]| -> Result<Option<Added>, String> {
            if set.is_empty() {
                return Ok(None);
            }
            // Two tokens of one trie with the same text (after normalization): which one wins
            // depends on `tokenizers`' insertion order, which the file does not pin down.
            let mut texts: Vec<&str> = set.iter().map(|(s, _, _, _)| s.as_str()).collect();
            texts.sort_unstable();
            if let Some(w) = texts.windows(2).find(|w| w[0] == w[1]) {
                return Err(format!("two added tokens match as {:?}", w[0]));
            }
            let matcher = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(set.iter().map(|(s, _, _, _)| s))
                .map_err(|e| format!("added tokens: {e}"))?;
            let ids = set.iter().map(|(_, i, _, _)| *i).collect();
            Ok(Some(Added { matcher, ids, flags: set.iter().map(|(_, _, f, _)| *f).collect() }))
        };
        let added = [build(&sets[0])?, build(&sets[1])?];
        // Special tokens as text: a trie of special tokens only then matches nothing, one with
        // none is as it was; a trie with both cannot be reproduced by leaving tokens out.
        let skips = |set: &[(String, u32, Flags, bool)]| match set.iter().filter(|t| t.3).count() {
            0 => Some(false),
            n if n == set.len() => Some(true),
            _ => None,
        };
        let as_text_skips = skips(&sets[0]).zip(skips(&sets[1])).map(|(a, b)| [a, b]);
        let around = around(tok)?;
        let key = NEXT_MODEL.fetch_add(1, Ordering::Relaxed);
        let merges = PairTable::new(&merges, &byte_ids)?;
        let mut model = BpeModel {
            key,
            byte_ids,
            last_ids,
            suffix: (!suffix.is_empty()).then(|| suffix.to_string()),
            merges,
            fold: FoldTable::new(&[]),
            whole,
            added,
            as_text_skips,
            pre,
            norm,
            around,
            joins,
        };
        model.fold = model.fold_vocabulary(vocab, &back);
        Ok(model)
    }

    /// The table of [`BpeModel::fold`]: each vocabulary token of 2 to 24 bytes (byte-level text)
    /// whose bytes merge into that token alone, or with `ignore_merges` each one.
    fn fold_vocabulary(&self, vocab: &serde_json::Map<String, Value>, back: &FxMap<char, u8>) -> FoldTable {
        let mut fold = Vec::new();
        let mut ids = Vec::new();
        let mut pairs = PairCache::new();
        for (s, v) in vocab {
            // With a suffix, only a token that ends a word can be a whole piece.
            let s = match &self.suffix {
                Some(x) => match s.strip_suffix(x.as_str()) {
                    Some(s) => s,
                    None => continue,
                },
                None => s.as_str(),
            };
            let (Some(bytes), Some(id)) = (
                s.chars().map(|c| back.get(&c).copied()).collect::<Option<Vec<u8>>>(),
                v.as_u64().and_then(|v| u32::try_from(v).ok()),
            ) else {
                continue;
            };
            let Some(key) = Key::of(&bytes, 0, bytes.len()) else { continue };
            if self.whole.is_none() {
                ids.clear();
                self.merge_scan(&bytes, &mut pairs, &mut ids);
                if ids[..] != [id] {
                    continue;
                }
            }
            fold.push((key, id));
        }
        FoldTable::new(&fold)
    }

    /// What the fast path reproduces for this file, for [`super::TextTokenizer::engine`]: e.g.
    /// "byte-level BPE, cl100k pattern, NFC, reproduced exactly".
    pub fn describe(&self) -> String {
        let pre = match &self.pre {
            Pre::Scan(p) => format!("{} pattern", p.name()),
            Pre::Regexes(r) if r.len() == 1 => "a Split regex matched by Oniguruma as in `tokenizers`".to_string(),
            Pre::Regexes(r) => {
                format!("{} Split regexes in sequence, matched by Oniguruma as in `tokenizers`", r.len())
            }
            Pre::Clip => "CLIP pattern".to_string(),
        };
        let norm = self.norm.describe();
        let norm = if norm.is_empty() { norm } else { format!(", {norm}") };
        let suffix = match &self.suffix {
            Some(s) => format!(", end-of-word suffix {s:?}"),
            None => String::new(),
        };
        format!("byte-level BPE, {pre}{norm}{suffix}, reproduced exactly")
    }

    /// Whether [`BpeModel::encode_into`] can encode special tokens as the text they spell.
    pub fn encodes_special_tokens_as_text(&self) -> bool {
        self.as_text_skips.is_some()
    }

    /// Appends the ids of `text` to `out`, the post-processor's special tokens included; with
    /// `specials_as_text`, special added tokens are encoded as the text they spell (as
    /// `tokenizers` does after `set_encode_special_tokens(true)`), where
    /// [`BpeModel::encodes_special_tokens_as_text`] (else they are split out as usual).
    pub fn encode_into(&self, text: &str, specials_as_text: bool, out: &mut Vec<u32>) {
        let skips = match (self.as_text_skips, specials_as_text) {
            (Some(skips), true) => skips,
            _ => [false; 2],
        };
        let added: Tries = [0, 1].map(|k| self.added[k].as_ref().filter(|_| !skips[k]));
        out.extend_from_slice(&self.around.0);
        with_cache(self.key, |c| self.split_raw(added, text, c, out));
        out.extend_from_slice(&self.around.1);
    }

    /// Splits the raw text on the added tokens with `normalized: false`.
    fn split_raw(&self, added: Tries<'_>, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        match added[0] {
            None => self.normalize_gap(added, text, c, out),
            Some(raw) => raw.split(text, |p| match p {
                Part::Gap(g) => self.normalize_gap(added, g, c, out),
                Part::Token(id) => out.push(id),
            }),
        }
    }

    /// Normalizes a gap, then splits it on the added tokens with `normalized: true`.
    fn normalize_gap(&self, added: Tries<'_>, gap: &str, c: &mut Cache, out: &mut Vec<u32>) {
        if self.norm.is_empty() {
            return self.split_normalized(added, gap, c, out);
        }
        // The thread's buffer, taken for the call (the encoder borrows the caches meanwhile).
        let mut text = std::mem::take(&mut c.text);
        self.norm.apply_into(gap, &mut text);
        self.split_normalized(added, &text, c, out);
        c.text = text;
    }

    fn split_normalized(&self, added: Tries<'_>, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        match added[1] {
            None => self.encode_plain(text, c, out),
            Some(added) => added.split(text, |p| match p {
                Part::Gap(g) => self.encode_plain(g, c, out),
                Part::Token(id) => out.push(id),
            }),
        }
    }

    /// Text without added tokens: pieces, then BPE on each.
    fn encode_plain(&self, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        match &self.pre {
            Pre::Scan(Pattern::Gpt2) => self.encode_pieces::<Gpt2>(text, c, out),
            Pre::Scan(Pattern::Cl100k) => self.encode_pieces::<Cl100k<3>>(text, c, out),
            Pre::Scan(Pattern::Qwen2) => self.encode_pieces::<Cl100k<1>>(text, c, out),
            Pre::Scan(Pattern::O200k) => self.encode_pieces::<O200k>(text, c, out),
            Pre::Regexes(r) => self.encode_splits(r, text, c, out),
            Pre::Clip => self.encode_clip(text, c, out),
        }
    }

    /// CLIP's pieces ([`clip_pieces`]), each through the short-piece table (captions are short:
    /// no batches of prefetched lines).
    fn encode_clip(&self, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        clip_pieces(bytes, |a, b| {
            if b - a == 1 {
                return out.push(self.last_ids[bytes[a] as usize]);
            }
            let k = ShortKey::of(bytes, a, b);
            if !k.is_some() {
                return self.encode_keyed(bytes, a, b, Key::of(bytes, a, b), c, out);
            }
            match c.short.get(&k) {
                Some((lanes, count)) if count > 0 => out.extend_from_slice(&lanes[..count]),
                found => self.encode_short(bytes, a, b, &k, found.is_some(), c, out),
            }
        });
    }

    /// Cuts `text` with the first regex (each match and each gap between matches a piece, empty
    /// ones dropped, as `tokenizers`' `Isolated` split), each piece with the next regex, and so
    /// on; BPE on what the last one leaves. Pieces are found one at a time, as with a scanner.
    fn encode_splits(&self, regexes: &[SysRegex], text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        let Some((re, rest)) = regexes.split_first() else {
            return self.encode_piece(text.as_bytes(), 0, text.len(), c, out);
        };
        let mut prev = 0;
        for (start, end) in re.find_iter(text) {
            if prev < start {
                self.encode_splits(rest, &text[prev..start], c, out);
            }
            if start < end {
                self.encode_splits(rest, &text[start..end], c, out);
            }
            prev = end;
        }
        if prev < text.len() {
            self.encode_splits(rest, &text[prev..], c, out);
        }
    }

    /// The pieces of `text` in batches: a batch's pieces are found and their lines of the
    /// short-piece table prefetched first, then encoded, so that each lookup finds its line
    /// already in the processor's cache instead of waiting on memory for it. Room for the
    /// batch's ids is made once (four a piece, the most a hit writes), so a hit stores its four
    /// lanes and advances by its count.
    fn encode_pieces<S: Scanner>(&self, text: &str, c: &mut Cache, out: &mut Vec<u32>) {
        const BATCH: usize = 32;
        // A block gives at most 63 pieces, and is never cut short by the batch.
        const ROOM: usize = BATCH + 64;
        let bytes = text.as_bytes();
        // Piece `i` of a batch is `bytes[ends[i]..ends[i + 1]]`, its short key `keys[i]`.
        let mut ends = [0usize; ROOM + 1];
        let mut keys = [ShortKey::default(); ROOM];
        let mut pos = 0;
        while pos < bytes.len() {
            ends[0] = pos;
            let mut n = 0;
            while n < BATCH && pos < bytes.len() {
                // A block of pieces where the scanner's bit masks decide them, else one piece.
                let mut got = S::block_ends(bytes, pos, &mut ends[n + 1..]);
                if got == 0 {
                    ends[n + 1] = S::end(bytes, pos);
                    got = 1;
                }
                for j in n..n + got {
                    let k = ShortKey::of(bytes, ends[j], ends[j + 1]);
                    c.short.prefetch(&k);
                    keys[j] = k;
                }
                n += got;
                pos = ends[n];
            }
            out.reserve(SHORT_IDS * n);
            for i in 0..n {
                let (a, b) = (ends[i], ends[i + 1]);
                // The usual cases here, inline: one byte, a short piece in the table.
                if b - a == 1 {
                    out.push(self.last_ids[bytes[a] as usize]);
                    continue;
                }
                let k = &keys[i];
                if k.is_some() {
                    match c.short.get(k) {
                        Some((lanes, count)) if count > 0 => {
                            out.extend_from_slice(&lanes);
                            out.truncate(out.len() - SHORT_IDS + count);
                            continue;
                        }
                        found => self.encode_short(bytes, a, b, k, found.is_some(), c, out),
                    }
                } else {
                    self.encode_keyed(bytes, a, b, Key::of(bytes, a, b), c, out);
                }
                out.reserve(SHORT_IDS * (n - i - 1));
            }
        }
    }

    /// The ids of the piece `text[a..b]`.
    #[inline]
    fn encode_piece(&self, text: &[u8], a: usize, b: usize, c: &mut Cache, out: &mut Vec<u32>) {
        self.encode_keyed(text, a, b, Key::of(text, a, b), c, out)
    }

    /// The ids of the short piece `text[a..b]` (key `k`) that the short-piece table lacks, or
    /// holds as having more ids than a slot (`more`, then looked up in the table of longer
    /// pieces): one token of the vocabulary, else merged; stored for next time.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn encode_short(
        &self,
        text: &[u8],
        a: usize,
        b: usize,
        k: &ShortKey,
        more: bool,
        c: &mut Cache,
        out: &mut Vec<u32>,
    ) {
        // The key in the table of longer pieces, only for the pieces kept there (a short piece
        // always has one: SHORT_MAX < MAX_KEY).
        if more && Key::of(text, a, b).is_some_and(|key| c.table.get(&key, out)) {
            return;
        }
        let from = out.len();
        self.encode_uncached(&text[a..b], &mut c.pairs, out);
        let ids = &out[from..];
        c.short.put(k, ids);
        if ids.len() > SHORT_IDS {
            if let Some(key) = Key::of(text, a, b) {
                c.table.put(&key, ids);
            }
        }
    }

    /// The ids of the piece `text[a..b]`, whose table key is `key` when it has one: a single
    /// byte directly, a short piece from the table (or merged and stored there), a longer one
    /// from the map of long pieces, the longest merged each time. Out of line: the batch loop
    /// of [`BpeModel::encode_pieces`] takes the usual cases itself.
    #[inline(never)]
    fn encode_keyed(&self, text: &[u8], a: usize, b: usize, key: Option<Key>, c: &mut Cache, out: &mut Vec<u32>) {
        if b - a == 1 {
            out.push(self.last_ids[text[a] as usize]);
            return;
        }
        if let Some(key) = key {
            if c.table.get(&key, out) {
                return;
            }
            if let Some(id) = self.fold.get(&key) {
                out.push(id);
                c.table.put(&key, &[id]);
                return;
            }
            let from = out.len();
            self.encode_uncached(&text[a..b], &mut c.pairs, out);
            c.table.put(&key, &out[from..]);
            return;
        }
        let piece = &text[a..b];
        if piece.len() > CACHE_MAX_PIECE {
            return self.encode_uncached(piece, &mut c.pairs, out);
        }
        if let Some(ids) = c.map.get(piece) {
            out.extend_from_slice(ids);
            return;
        }
        let from = out.len();
        self.encode_uncached(piece, &mut c.pairs, out);
        if c.map.len() >= CACHE_MAX_ENTRIES {
            c.map.clear();
        }
        c.map.insert(piece.into(), out[from..].into());
    }

    /// A piece's ids without the caches: one token when `ignore_merges` finds it whole, else
    /// merged.
    fn encode_uncached(&self, piece: &[u8], pairs: &mut PairCache, out: &mut Vec<u32>) {
        if let Some(w) = &self.whole {
            if let Some(&id) = w.get(piece) {
                out.push(id);
                return;
            }
        }
        if piece.len() >= HEAP_FROM {
            self.merge_long(piece, pairs, out);
        } else {
            self.merge_scan(piece, pairs, out);
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
