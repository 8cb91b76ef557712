//! The pre-tokenizer patterns of the byte-level BPE fast path, written out by hand, with the
//! semantics the `tokenizers` crate gives them through Oniguruma (first alternative that matches,
//! greedy runs, backtracking, `\s+(?!\S)` backing off one character before a non-space,
//! `(?i:...)` case folding). The character classes come from Oniguruma itself
//! (`pretok_tables.rs`), so `\p{L}`, `\p{N}` and `\s` are exactly what the regex engine says,
//! Unicode version included. Each pattern is recognised by its exact string ([`Pattern::of`]);
//! any other string stays on `tokenizers`.
//!
//! - GPT-2 (also GPT-NeoX, OLMo, ...): [`GPT2_PATTERN`].
//! - cl100k (Llama 3, and converted `cl100k_base` files): [`CL100K_PATTERN`].
//! - Qwen2: [`QWEN2_PATTERN`], cl100k with single digits.
//! - o200k (GPT-4o, gpt-oss): [`O200K_PATTERN`], with letters told apart by case.
//!
//! Every character of the text is in exactly one match of each of these patterns (each class
//! of character starts some alternative, none matches the empty string), so the matches are the
//! `Split(Isolated)` pieces with no gaps between them.

use super::pretok_class::{Class, Fine};
use super::pretok_tables::{O200K_RANGES, RANGES};

/// The class of each ASCII byte, from the same table.
static ASCII: [Class; 128] = ascii_table!(RANGES, Class::Other);
/// The fine class of each ASCII byte.
static ASCII_FINE: [Fine; 128] = ascii_table!(O200K_RANGES, Fine::Other);

/// The class of each ASCII byte in `ranges` (`(first, last, class)`), `other` elsewhere: a
/// macro, since a `const fn` cannot copy a generic value.
macro_rules! ascii_table {
    ($ranges:expr, $other:expr) => {{
        let mut t = [$other; 128];
        let mut i = 0;
        while i < $ranges.len() {
            let (a, b, k) = $ranges[i];
            let mut c = a;
            while c <= b && c < 128 {
                t[c as usize] = k;
                c += 1;
            }
            i += 1;
        }
        t
    }};
}
use ascii_table;

/// The fine class and UTF-8 length of the character at `s[i]`, like [`class_at`].
#[inline]
fn fine_at(s: &[u8], i: usize) -> (Fine, usize) {
    let b0 = s[i];
    if b0 < 0x80 {
        return (ASCII_FINE[b0 as usize], 1);
    }
    let (c, len) = decode(s, i, b0);
    (in_ranges(O200K_RANGES, c, Fine::Other), len)
}

/// The scalar value and length of the multi-byte character at `s[i]` (first byte `b0`).
#[inline]
fn decode(s: &[u8], i: usize, b0: u8) -> (u32, usize) {
    // `s` is valid UTF-8 and `i` a boundary, so the continuation bytes are there.
    let (len, mut c) = match b0 {
        0xC0..=0xDF => (2, (b0 & 0x1F) as u32),
        0xE0..=0xEF => (3, (b0 & 0x0F) as u32),
        _ => (4, (b0 & 0x07) as u32),
    };
    for k in 1..len {
        c = (c << 6) | (s.get(i + k).copied().unwrap_or(0x80) & 0x3F) as u32;
    }
    (c, len)
}

/// The class of an ASCII byte.
#[cfg(any(test, not(target_arch = "x86_64")))]
#[inline]
pub(crate) fn ascii_class(b: u8) -> Class {
    ASCII[b as usize & 0x7F]
}

/// The class of a non-ASCII scalar value.
fn class_of(c: u32) -> Class {
    in_ranges(RANGES, c, Class::Other)
}

/// The class of scalar value `c` in `ranges` (sorted `(first, last, class)`), `other` where no
/// range holds it.
#[inline]
fn in_ranges<K: Copy>(ranges: &[(u32, u32, K)], c: u32, other: K) -> K {
    match ranges.binary_search_by(|&(a, b, _)| {
        if b < c {
            std::cmp::Ordering::Less
        } else if a > c {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(i) => ranges[i].2,
        Err(_) => other,
    }
}

/// The class and UTF-8 length of the character that starts at `s[i]` (`i` on a char boundary,
/// `i < s.len()`).
#[inline]
pub(crate) fn class_at(s: &[u8], i: usize) -> (Class, usize) {
    let b0 = s[i];
    if b0 < 0x80 {
        return (ASCII[b0 as usize], 1);
    }
    let (c, len) = decode(s, i, b0);
    (class_of(c), len)
}

/// GPT-2's pattern, as `tokenizers` writes it for `ByteLevel(use_regex=true)`.
pub(crate) const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// cl100k's pattern, as Llama 3's `tokenizer.json` (and converted `cl100k_base` files) write it.
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's pattern, as GPT-4o's and gpt-oss's `tokenizer.json` write it.
pub(crate) const O200K_PATTERN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// Qwen2's pattern: cl100k's with one digit per piece.
pub(crate) const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer pattern the fast path reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// [`GPT2_PATTERN`].
    Gpt2,
    /// [`CL100K_PATTERN`].
    Cl100k,
    /// [`QWEN2_PATTERN`].
    Qwen2,
    /// [`O200K_PATTERN`].
    O200k,
}

impl Pattern {
    /// The pattern whose regex is exactly `regex`, if it is one of ours.
    pub(crate) fn of(regex: &str) -> Option<Pattern> {
        [
            (GPT2_PATTERN, Pattern::Gpt2),
            (CL100K_PATTERN, Pattern::Cl100k),
            (QWEN2_PATTERN, Pattern::Qwen2),
            (O200K_PATTERN, Pattern::O200k),
        ]
        .into_iter()
        .find(|(p, _)| *p == regex)
        .map(|(_, k)| k)
    }

    /// Its short name, for the reason a file got the fast path.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Pattern::Gpt2 => "GPT-2",
            Pattern::Cl100k => "cl100k",
            Pattern::Qwen2 => "Qwen2",
            Pattern::O200k => "o200k",
        }
    }
}

/// One pattern's matcher: where the match that starts at `i` ends.
pub(crate) trait Scanner {
    /// The end of the match at `i` (`i < s.len()`, on a char boundary of valid UTF-8 `s`); it
    /// is always past `i`.
    fn end(s: &[u8], i: usize) -> usize;

    /// The ends of as many pieces after the piece start `i` as a block decides at once, into
    /// `ends` (at most its length); how many, 0 where [`Scanner::end`] must take the next one.
    #[inline]
    fn block_ends(_s: &[u8], _i: usize, _ends: &mut [usize]) -> usize {
        0
    }
}

/// The pieces of a text, as byte ranges, in order and covering it: the matches of the pattern
/// of `S` (for the tests; the encoder calls [`Scanner::end`] itself, a batch of pieces at a
/// time).
#[cfg(test)]
pub(crate) struct Pieces<'a, S> {
    s: &'a [u8],
    pos: usize,
    scanner: std::marker::PhantomData<S>,
}

#[cfg(test)]
impl<'a, S: Scanner> Pieces<'a, S> {
    /// Pieces of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        Pieces { s: text.as_bytes(), pos: 0, scanner: std::marker::PhantomData }
    }
}

#[cfg(test)]
impl<S: Scanner> Iterator for Pieces<'_, S> {
    type Item = (usize, usize);

    #[inline]
    fn next(&mut self) -> Option<(usize, usize)> {
        let i = self.pos;
        if i >= self.s.len() {
            return None;
        }
        let end = S::end(self.s, i);
        self.pos = end;
        Some((i, end))
    }
}

const HIGH: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that is in `a..=z` (each byte is taken as is).
#[inline]
fn lower_bits(w: u64) -> u64 {
    let y = w & !HIGH;
    // Per byte (each below 0x80, so no carry crosses into the next): its high bit set when the
    // byte is at least 'a', and when it is at least '{' (one past 'z'); bytes of 0x80 and over
    // are no letters.
    let from_a = (y + 0x1F1F_1F1F_1F1F_1F1F) & HIGH;
    let past_z = (y + 0x0505_0505_0505_0505) & HIGH;
    from_a & !past_z & !(w & HIGH)
}

/// How many of the eight bytes of `w` (little-endian: the first byte lowest), from the first on,
/// are ASCII letters (`A-Z`, `a-z`: exactly the ASCII characters in `\p{L}`).
#[inline]
fn ascii_letters(w: u64) -> usize {
    // Upper case to lower case; no other ASCII byte lands among the lower-case letters, and
    // bytes of 0x80 and over keep their high bit.
    leading(lower_bits(w | 0x2020_2020_2020_2020))
}

/// How many of the eight bytes of `w`, from the first on, are ASCII lower-case letters (`a-z`:
/// exactly the ASCII characters in `\p{Ll}`, and no ASCII character is in `\p{Lm}`, `\p{Lo}`
/// or `\p{M}`).
#[inline]
fn ascii_lower(w: u64) -> usize {
    leading(lower_bits(w))
}

/// The number of leading bytes whose high bit is set in `bits`.
#[inline]
fn leading(bits: u64) -> usize {
    ((!bits & HIGH).trailing_zeros() / 8) as usize
}

/// The end of a run that starts at `i`: eight ASCII bytes at a time while `count` says all eight
/// belong, else one character at a time by `belongs` (the character's length when it is in the
/// run), where the text is not ASCII or near its end.
#[inline]
fn fast_run(s: &[u8], mut i: usize, count: fn(u64) -> usize, belongs: impl Fn(&[u8], usize) -> Option<usize>) -> usize {
    loop {
        while let Some(w) = s.get(i..i + 8) {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            let n = count(u64::from_le_bytes(b));
            i += n;
            if n < 8 {
                break;
            }
        }
        if i >= s.len() {
            return i;
        }
        match belongs(s, i) {
            Some(l) => i += l,
            None => return i,
        }
    }
}

/// The end of the run of letters (`\p{L}`) that starts at `i`.
#[inline]
fn letters(s: &[u8], i: usize) -> usize {
    fast_run(s, i, ascii_letters, |s, i| {
        let (c, l) = class_at(s, i);
        (c == Class::Letter).then_some(l)
    })
}

/// The end of the run of o200k's lower-case letters (`[\p{Ll}\p{Lm}\p{Lo}\p{M}]`) that
/// starts at `i`.
#[inline]
fn lowers(s: &[u8], i: usize) -> usize {
    fast_run(s, i, ascii_lower, |s, i| {
        let (k, l) = fine_at(s, i);
        is_lowerish(k).then_some(l)
    })
}

/// The end of the run of characters of class `k` that starts at `i`.
#[inline]
fn run(s: &[u8], mut i: usize, k: Class) -> usize {
    if k == Class::Letter {
        return letters(s, i);
    }
    while i < s.len() {
        let (c, l) = class_at(s, i);
        if c != k {
            break;
        }
        i += l;
    }
    i
}

/// `\s+(?!\S)|\s+` at `i` (a space): the whole run at the end of the text; before a non-space,
/// all but the run's last character if it has two or more, else the one character.
#[inline]
fn spaces(s: &[u8], i: usize, l: usize) -> usize {
    let n = s.len();
    let mut last = i;
    let mut j = i + l;
    while j < n {
        let (k, l) = class_at(s, j);
        if k != Class::Space {
            break;
        }
        last = j;
        j += l;
    }
    if j < n && last > i {
        last
    } else {
        j
    }
}

/// [`GPT2_PATTERN`].
pub(crate) struct Gpt2;

impl Scanner for Gpt2 {
    #[inline]
    fn block_ends(s: &[u8], i: usize, ends: &mut [usize]) -> usize {
        super::pretok_block::gpt2_ends(s, i, ends)
    }

    #[inline]
    fn end(s: &[u8], i: usize) -> usize {
        let n = s.len();
        let b = s[i];
        // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
        if b == b'\'' && i + 1 < n {
            match s[i + 1] {
                b's' | b't' | b'm' | b'd' => return i + 2,
                b'r' | b'v' if i + 2 < n && s[i + 2] == b'e' => return i + 3,
                b'l' if i + 2 < n && s[i + 2] == b'l' => return i + 3,
                _ => {}
            }
        }
        // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: a space joins the run of non-space that follows.
        if b == b' ' && i + 1 < n {
            let (k, l) = class_at(s, i + 1);
            if k != Class::Space {
                return run(s, i + 1 + l, k);
            }
        }
        let (k, l) = class_at(s, i);
        if k != Class::Space {
            return run(s, i + l, k);
        }
        spaces(s, i, l)
    }
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)` at `i` (where `s[i]` is `'`): its end, if it matches.
/// Oniguruma's case folding adds `S T R E V M L D` and `ſ` (U+017F, folded to `s`); no other
/// character folds to one of these letters (the tests check every scalar value).
#[inline]
fn contraction_ci(s: &[u8], i: usize) -> Option<usize> {
    // ASCII letters only compare equal to a lower-case letter here after `| 0x20`.
    let at = |k: usize| s.get(k).map(|b| b | 0x20);
    match at(i + 1)? {
        b's' | b't' | b'm' | b'd' => Some(i + 2),
        b'r' | b'v' if at(i + 2) == Some(b'e') => Some(i + 3),
        b'l' if at(i + 2) == Some(b'l') => Some(i + 3),
        _ if s[i + 1..].starts_with("\u{17f}".as_bytes()) => Some(i + 3),
        _ => None,
    }
}

/// [`CL100K_PATTERN`] (`DIGITS` = 3) and [`QWEN2_PATTERN`] (`DIGITS` = 1).
pub(crate) struct Cl100k<const DIGITS: usize>;

impl<const DIGITS: usize> Scanner for Cl100k<DIGITS> {
    #[inline]
    fn block_ends(s: &[u8], i: usize, ends: &mut [usize]) -> usize {
        super::pretok_block::cl100k_ends::<DIGITS>(s, i, ends)
    }

    #[inline]
    fn end(s: &[u8], i: usize) -> usize {
        let n = s.len();
        let b = s[i];
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if b == b'\'' {
            if let Some(e) = contraction_ci(s, i) {
                return e;
            }
        }
        let (k, l) = class_at(s, i);
        match k {
            // `[^\r\n\p{L}\p{N}]?\p{L}+`, no prefix: the letters.
            Class::Letter => return run(s, i + l, Class::Letter),
            // `\p{N}{1,3}` (or `\p{N}`).
            Class::Number => {
                let (mut j, mut count) = (i + l, 1);
                while count < DIGITS && j < n {
                    let (k, l) = class_at(s, j);
                    if k != Class::Number {
                        break;
                    }
                    j += l;
                    count += 1;
                }
                return j;
            }
            Class::Space | Class::Other => {}
        }
        if b != b'\r' && b != b'\n' && i + l < n {
            let (k2, l2) = class_at(s, i + l);
            // `[^\r\n\p{L}\p{N}]?\p{L}+`: one character that is neither CR, LF, letter nor
            // number, then letters.
            if k2 == Class::Letter {
                return run(s, i + l + l2, Class::Letter);
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n]*` with the space.
            if b == b' ' && k2 == Class::Other {
                return crlf(s, run(s, i + 1 + l2, Class::Other));
            }
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*` without it.
        if k == Class::Other {
            return crlf(s, run(s, i + l, Class::Other));
        }
        space_run(s, i, l)
    }
}

/// The end of the run of spaces at `i` (its first character `l` bytes long) under cl100k's
/// rules: `\s*[\r\n]+` where the run holds a CR or LF (it ends after its last one: `\s*`
/// backs off to it, `[\r\n]+` cannot go further, the next is not CR or LF), else
/// `\s+(?!\S)|\s+`.
fn space_run(s: &[u8], i: usize, l: usize) -> usize {
    let mut j = i;
    let mut after_nl = None;
    while j < s.len() {
        let (k, l) = class_at(s, j);
        if k != Class::Space {
            break;
        }
        if s[j] == b'\r' || s[j] == b'\n' {
            after_nl = Some(j + 1);
        }
        j += l;
    }
    match after_nl {
        Some(e) => e,
        None => spaces(s, i, l),
    }
}

/// [`O200K_PATTERN`].
pub(crate) struct O200k;

/// `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]`: upper-case letters, caseless letters and marks.
#[inline]
fn is_upperish(k: Fine) -> bool {
    matches!(k, Fine::Upper | Fine::Caseless | Fine::Mark)
}

/// `[\p{Ll}\p{Lm}\p{Lo}\p{M}]`: lower-case letters, caseless letters and marks.
#[inline]
fn is_lowerish(k: Fine) -> bool {
    matches!(k, Fine::Lower | Fine::Caseless | Fine::Mark)
}

/// The end of the run of characters in `set` from `i`.
#[inline]
fn run_fine(s: &[u8], mut i: usize, set: fn(Fine) -> bool) -> usize {
    while i < s.len() {
        let (k, l) = fine_at(s, i);
        if !set(k) {
            break;
        }
        i += l;
    }
    i
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `i`.
#[inline]
fn opt_contraction(s: &[u8], i: usize) -> usize {
    if s.get(i) == Some(&b'\'') {
        if let Some(e) = contraction_ci(s, i) {
            return e;
        }
    }
    i
}

/// `[upper]*[lower]+` from `i`, with Oniguruma's backtracking: the upper-ish run, then the
/// lower-ish run after it; if the character after the upper-ish run is not lower-ish, `[lower]+`
/// takes the run's last character that is in both sets (a caseless letter or a mark), and the
/// match ends there; with none, no match.
#[inline]
fn lower_word(s: &[u8], i: usize) -> Option<usize> {
    let n = s.len();
    let mut j = i;
    let mut after_both = None;
    while j < n {
        let (k, l) = fine_at(s, j);
        if !is_upperish(k) {
            break;
        }
        if is_lowerish(k) {
            after_both = Some(j + l);
        }
        j += l;
    }
    if j < n {
        let (k, l) = fine_at(s, j);
        if is_lowerish(k) {
            return Some(lowers(s, j + l));
        }
    }
    after_both
}

impl Scanner for O200k {
    #[inline]
    fn end(s: &[u8], i: usize) -> usize {
        let n = s.len();
        let b = s[i];
        let (k, l) = fine_at(s, i);
        // `[^\r\n\p{L}\p{N}]?`: a space (not CR or LF), a mark or another non-letter.
        let prefix = matches!(k, Fine::Space | Fine::Other | Fine::Mark) && b != b'\r' && b != b'\n';
        // First alternative, with the prefix (when there is one), then without.
        if prefix {
            if let Some(e) = lower_word(s, i + l) {
                return opt_contraction(s, e);
            }
        }
        if let Some(e) = lower_word(s, i) {
            return opt_contraction(s, e);
        }
        // Second: `[upper]+[lower]*`, with the prefix, then without.
        if prefix && i + l < n {
            let (k2, l2) = fine_at(s, i + l);
            if is_upperish(k2) {
                let e = run_fine(s, i + l + l2, is_upperish);
                return opt_contraction(s, lowers(s, e));
            }
        }
        if is_upperish(k) {
            let e = run_fine(s, i + l, is_upperish);
            return opt_contraction(s, lowers(s, e));
        }
        // `\p{N}{1,3}`.
        if k == Fine::Number {
            let (mut j, mut count) = (i + l, 1);
            while count < 3 && j < n {
                let (k, l) = fine_at(s, j);
                if k != Fine::Number {
                    break;
                }
                j += l;
                count += 1;
            }
            return j;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*` (marks are in `[^\s\p{L}\p{N}]`, though a lone mark
        // never gets here: the first alternative takes it).
        let q = |k: Fine| matches!(k, Fine::Other | Fine::Mark);
        if b == b' ' && i + 1 < n {
            let (k2, l2) = fine_at(s, i + 1);
            if q(k2) {
                return crlf_slash(s, run_fine(s, i + 1 + l2, q));
            }
        }
        if q(k) {
            return crlf_slash(s, run_fine(s, i + l, q));
        }
        // Spaces, as in cl100k.
        space_run(s, i, l)
    }
}

/// `[\r\n/]*` from `i`.
#[inline]
fn crlf_slash(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && matches!(s[i], b'\r' | b'\n' | b'/') {
        i += 1;
    }
    i
}

/// `[\r\n]*` from `i`.
#[inline]
fn crlf(s: &[u8], mut i: usize) -> usize {
    while i < s.len() && (s[i] == b'\r' || s[i] == b'\n') {
        i += 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_letters_counts_the_leading_letters_of_every_byte_value() {
        // Each byte value in each of the eight places, after letters and before a letter.
        for b in 0..=255u8 {
            let is_letter = b.is_ascii_alphabetic();
            for at in 0..8 {
                let mut w = *b"abcdefgh";
                w[at] = b;
                let want = if is_letter { 8 } else { at };
                assert_eq!(ascii_letters(u64::from_le_bytes(w)), want, "byte {b:#04x} at {at}");
            }
        }
        assert_eq!(ascii_letters(u64::from_le_bytes(*b"AZaz@[`{")), 4);
        for b in 0..=255u8 {
            for at in 0..8 {
                let mut w = *b"abcdefgh";
                w[at] = b;
                let want = if b.is_ascii_lowercase() { 8 } else { at };
                assert_eq!(ascii_lower(u64::from_le_bytes(w)), want, "byte {b:#04x} at {at}");
            }
        }
        assert_eq!(lowers("ab\u{e9}\u{301}cD".as_bytes(), 0), 7);
        assert_eq!(lowers(b"abcdefghijklmnopqrstuvwxyzA", 2), 26);
        assert_eq!(letters("Wort\u{e9}e1".as_bytes(), 0), 7);
        assert_eq!(letters(b"abcdefghijklmnopqrstuvwxyz, and", 3), 26);
    }

    fn pieces(t: &str) -> Vec<&str> {
        Pieces::<Gpt2>::new(t).map(|(a, b)| &t[a..b]).collect()
    }

    #[test]
    fn gpt2_pattern_by_example() {
        assert_eq!(pieces("Hello world, it's 2024!"), ["Hello", " world", ",", " it", "'s", " 2024", "!"]);
        assert_eq!(pieces("a  b"), ["a", " ", " b"]);
        assert_eq!(pieces("a \n\tb  "), ["a", " \n", "\t", "b", "  "]);
        assert_eq!(pieces("I'LL 'S x'll"), ["I", "'", "LL", " '", "S", " x", "'ll"]);
        assert_eq!(pieces("?'s"), ["?'", "s"]);
        assert_eq!(pieces("\u{a0}a"), ["\u{a0}", "a"]);
        assert_eq!(pieces("été ٣٤"), ["été", " ٣٤"]);
        assert_eq!(pieces(""), Vec::<&str>::new());
    }

    fn cl100k(t: &str) -> Vec<&str> {
        Pieces::<Cl100k<3>>::new(t).map(|(a, b)| &t[a..b]).collect()
    }

    #[test]
    fn cl100k_pattern_by_example() {
        assert_eq!(cl100k("Hello world, it's 2024!"), ["Hello", " world", ",", " it", "'s", " ", "202", "4", "!"]);
        assert_eq!(cl100k("DON'T 'S x'LL"), ["DON", "'T", " '", "S", " x", "'LL"]);
        assert_eq!(cl100k("(hello)\n\n  x  \n"), ["(hello", ")\n\n", " ", " x", "  \n"]);
        assert_eq!(cl100k("a \r\n\t b"), ["a", " \r\n", "\t", " b"]);
        assert_eq!(cl100k("'sounds ſ'ſ"), ["'s", "ounds", " ſ", "'ſ"]);
        assert_eq!(cl100k("\u{a0}a \u{3000}"), ["\u{a0}a", " \u{3000}"]);
        let qwen: Vec<&str> = Pieces::<Cl100k<1>>::new("x 123").map(|(a, b)| &"x 123"[a..b]).collect();
        assert_eq!(qwen, ["x", " ", "1", "2", "3"]);
    }

    #[test]
    fn o200k_pattern_by_example() {
        let t = "HELLOworld HelloWorld's ABC'S x//\n1234";
        let p: Vec<&str> = Pieces::<O200k>::new(t).map(|(a, b)| &t[a..b]).collect();
        assert_eq!(p, ["HELLOworld", " Hello", "World's", " ABC'S", " x", "//\n", "123", "4"]);
    }

    /// The pieces `tokenizers`' `Split(pattern, Isolated)` makes, through Oniguruma: its matches
    /// and the gaps between them.
    fn onig_split(re: &tokenizers::utils::SysRegex, t: &str) -> Vec<(usize, usize)> {
        let mut out = vec![];
        let mut prev = 0;
        for (a, b) in re.find_iter(t) {
            if prev != a {
                out.push((prev, a));
            }
            out.push((a, b));
            prev = b;
        }
        if prev != t.len() {
            out.push((prev, t.len()));
        }
        out
    }

    /// A scanner's pieces of a text.
    type Split = fn(&str) -> Vec<(usize, usize)>;

    fn scanners() -> Vec<(&'static str, Split)> {
        vec![
            (GPT2_PATTERN, |t| Pieces::<Gpt2>::new(t).collect()),
            (CL100K_PATTERN, |t| Pieces::<Cl100k<3>>::new(t).collect()),
            (QWEN2_PATTERN, |t| Pieces::<Cl100k<1>>::new(t).collect()),
            (O200K_PATTERN, |t| Pieces::<O200k>::new(t).collect()),
        ]
    }

    fn check_all(texts: &[String]) {
        for (pat, ours) in scanners() {
            let re = tokenizers::utils::SysRegex::new(pat).unwrap();
            // Joined with a plain letter run first (few calls); narrowed down on a difference.
            let joined = texts.join("\u{1}zz\u{1}");
            if ours(&joined) != onig_split(&re, &joined) {
                for t in texts {
                    assert_eq!(ours(t), onig_split(&re, t), "{pat}: {t:?}");
                }
                panic!("{pat}: the joined texts split differently, each alone does not: {joined:?}");
            }
        }
    }

    /// Every scalar value in forms that reach each branch of each pattern (contractions with
    /// case folding included), against Oniguruma: in two tests (below and from U+88000, about
    /// half of the scalar values each) so that the test runner's two threads share the sweep
    /// instead of one thread running it alone at the end.
    #[test]
    fn every_scalar_value_below_u88000_splits_as_oniguruma() {
        every_scalar_value_splits_as_oniguruma(0..0x88000);
    }

    /// The rest of the sweep above.
    #[test]
    fn every_scalar_value_from_u88000_splits_as_oniguruma() {
        every_scalar_value_splits_as_oniguruma(0x88000..0x110000);
    }

    fn every_scalar_value_splits_as_oniguruma(range: std::ops::Range<u32>) {
        let forms: [fn(char) -> String; 12] = [
            |c| format!("{c}"),
            |c| format!("'{c}"),
            |c| format!("'{c}e'{c}l"),
            |c| format!("'r{c} 'v{c} 'l{c}"),
            |c| format!("a{c}b"),
            |c| format!(" {c}{c}x"),
            |c| format!("{c}  x"),
            |c| format!("1{c}234{c}"),
            |c| format!("x {c}\u{a0}{c}y"),
            |c| format!("?{c}'s\n{c}"),
            |c| format!("\r{c}\n {c}"),
            |c| format!("{c}\r\n{c} "),
        ];
        let all: Vec<char> = range.filter_map(char::from_u32).collect();
        for chunk in all.chunks(2048) {
            let texts: Vec<String> = chunk.iter().flat_map(|&c| forms.iter().map(move |f| f(c))).collect();
            check_all(&texts);
        }
    }

    /// Seeded random text from the characters that matter to these patterns.
    #[test]
    fn random_text_splits_as_oniguruma() {
        let alphabet: Vec<char> =
            "aZAé'sStTrReEvVmMlLdDſǅʰि 1٣½\t\r\n\u{a0}\u{2028}\u{3000}\u{85}\u{b}\u{c}!?/.-\u{301}\u{200d}😀日\u{0}"
                .chars()
                .collect();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..200 {
            let texts: Vec<String> = (0..500)
                .map(|_| {
                    let n = (next() % 24) as usize;
                    (0..n).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
                })
                .collect();
            check_all(&texts);
        }
    }
}
