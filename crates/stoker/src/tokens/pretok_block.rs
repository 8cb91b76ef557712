//! GPT-2's pieces up to 64 bytes at a time, where the text is ASCII without apostrophes: the
//! bytes are classified at once into bit masks (letters, digits, white space, the space
//! character itself), and the piece boundaries come out of a few shifts and ands on them.
//!
//! On that alphabet [`super::pretok::GPT2_PATTERN`] is local: with no contraction possible (no
//! `'`), a piece starts at `p` exactly when
//! - `p` and `p - 1` are both not white space and of different classes, or
//! - `p` is not white space and `p - 1` is white space other than `' '` (a `' '` joins the run
//!   after it instead: ` ?\p{L}+` and its kin), or
//! - `p` is white space and `p - 1` is not, or
//! - `p` is the last of a run of two or more white-space characters and a non-space follows
//!   (`\s+(?!\S)` backs off one character; at the end of the text the run stays whole).
//!
//! A piece end is only given where those rules can be read: the first apostrophe or non-ASCII
//! byte stops the block, and a boundary needs the byte after it unless the text ends. The
//! caller then takes the next piece from the character-by-character scanner, which stays the
//! reference ([`super::pretok::Gpt2`]; the tests compare the two on every kind of text).
//!
//! Owns: the bit-mask form of GPT-2's pattern on ASCII. May not touch: any other pattern, what
//! is done with the pieces.

#[cfg(any(test, not(target_arch = "x86_64")))]
use super::{pretok::ascii_class, pretok_class::Class};

/// One bit per byte of a block (bit `i` for byte `i`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Masks {
    /// `\p{L}` (ASCII: `A-Z`, `a-z`).
    letter: u64,
    /// `\p{N}` (ASCII: `0-9`).
    digit: u64,
    /// `\s` (ASCII white space).
    space: u64,
    /// The space character `' '` itself.
    blank: u64,
    /// Bytes the masks cannot decide: `'` and every byte of 0x80 or more.
    stop: u64,
    /// `\r` and `\n` (white space that cl100k's pattern treats apart).
    newline: u64,
}

/// The masks of `w`, a byte at a time from the class table (the reference of [`masks`], and
/// its stand-in where there is no SSE2).
#[cfg(any(test, not(target_arch = "x86_64")))]
fn masks_by_table(w: &[u8; 64]) -> Masks {
    let mut m = Masks::default();
    for (i, &b) in w.iter().enumerate() {
        let bit = 1u64 << i;
        if b >= 0x80 || b == b'\'' {
            m.stop |= bit;
            continue;
        }
        match ascii_class(b) {
            Class::Letter => m.letter |= bit,
            Class::Number => m.digit |= bit,
            Class::Space => m.space |= bit,
            Class::Other => {}
        }
        if b == b' ' {
            m.blank |= bit;
        }
        if b == b'\r' || b == b'\n' {
            m.newline |= bit;
        }
    }
    m
}

/// The masks of `w`, sixteen bytes per SSE2 instruction.
#[cfg(target_arch = "x86_64")]
#[inline]
fn masks(w: &[u8; 64]) -> Masks {
    use std::arch::x86_64::*;
    let mut m = Masks::default();
    for k in 0..4 {
        // SAFETY: SSE2 is part of x86_64; the load reads bytes 16k..16k+16 of the 64-byte
        // array `w`, unaligned loads allowed.
        let part = unsafe {
            let x = _mm_loadu_si128(w.as_ptr().add(16 * k).cast());
            // As signed bytes, ASCII is 0..=127 and every other byte negative, so signed
            // range compares select ASCII bytes only.
            let within = |lo: i8, hi: i8, v: __m128i| {
                _mm_and_si128(_mm_cmpgt_epi8(v, _mm_set1_epi8(lo - 1)), _mm_cmplt_epi8(v, _mm_set1_epi8(hi + 1)))
            };
            let letter = within(b'a' as i8, b'z' as i8, _mm_or_si128(x, _mm_set1_epi8(0x20)));
            let digit = within(b'0' as i8, b'9' as i8, x);
            let blank = _mm_cmpeq_epi8(x, _mm_set1_epi8(b' ' as i8));
            let space = _mm_or_si128(within(0x09, 0x0D, x), blank);
            let apostrophe = _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\'' as i8));
            let newline = _mm_or_si128(
                _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\r' as i8)),
                _mm_cmpeq_epi8(x, _mm_set1_epi8(b'\n' as i8)),
            );
            let bits = |v: __m128i| (_mm_movemask_epi8(v) as u32 as u64) << (16 * k);
            Masks {
                letter: bits(letter),
                digit: bits(digit),
                space: bits(space),
                blank: bits(blank),
                stop: bits(_mm_or_si128(x, apostrophe)),
                newline: bits(newline),
            }
        };
        m.letter |= part.letter;
        m.digit |= part.digit;
        m.space |= part.space;
        m.blank |= part.blank;
        m.stop |= part.stop;
        m.newline |= part.newline;
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn masks(w: &[u8; 64]) -> Masks {
    masks_by_table(w)
}

/// The masks of the last bytes of a text (fewer than 64), zeros after them.
#[cold]
fn tail_masks(tail: &[u8]) -> Masks {
    let mut buf = [0u8; 64];
    buf[..tail.len()].copy_from_slice(tail);
    masks(&buf)
}

/// The part of a block of `s` from the piece start `pos` that bit masks can decide: its masks
/// (bits past `lim` cleared), `lim` (bytes before the first one in `stop`), `upto` (boundaries
/// are read at `1..upto`: each needs the byte after it, unless the text ends there) and whether
/// the text ends at `lim`. `None` when no boundary can be read.
#[inline(always)]
fn window(s: &[u8], pos: usize, stop: impl Fn(&Masks) -> u64) -> Option<(Masks, u32, u32, bool)> {
    let left = s.len() - pos;
    let m = match s.get(pos..pos + 64) {
        Some(w) => masks(w.try_into().expect("64 bytes")),
        None => tail_masks(&s[pos..]),
    };
    let len = left.min(64) as u32;
    let valid = below(len);
    let lim = (stop(&m) & valid).trailing_zeros().min(len);
    let at_end = lim == len && pos + len as usize == s.len();
    let upto = if at_end { lim } else { lim.saturating_sub(1) };
    if upto <= 1 && !at_end {
        return None;
    }
    let inside = below(lim);
    let m = Masks {
        letter: m.letter & inside,
        digit: m.digit & inside,
        space: m.space & inside,
        blank: m.blank & inside,
        stop: 0,
        newline: m.newline & inside,
    };
    Some((m, lim, upto, at_end))
}

/// The low `n` bits set, for `n` in `0..=64`.
#[inline(always)]
fn below(n: u32) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// Writes the piece ends that the start bits `starts` (bit `i` for byte `pos + i`) give below
/// `upto` into `ends` (as many as it holds), and the text's end after them when the block
/// reaches it; returns how many.
#[inline(always)]
fn write_ends(s: &[u8], pos: usize, starts: u64, upto: u32, at_end: bool, ends: &mut [usize]) -> usize {
    let mut bits = starts & below(upto) & !1;
    let mut k = 0;
    while bits != 0 && k < ends.len() {
        ends[k] = pos + bits.trailing_zeros() as usize;
        k += 1;
        bits &= bits - 1;
    }
    if at_end && bits == 0 && k < ends.len() {
        ends[k] = s.len();
        k += 1;
    }
    k
}

/// Writes the ends of the pieces that follow the piece start `pos` of `s` into `ends`, as many
/// as the block decides and `ends` holds, and returns how many (0: none decided, take the next
/// piece from the scanner).
#[inline]
pub(crate) fn gpt2_ends(s: &[u8], pos: usize, ends: &mut [usize]) -> usize {
    let Some((m, lim, upto, at_end)) = window(s, pos, |m| m.stop) else {
        return 0;
    };
    let inside = below(lim);
    let space = m.space;
    let solid = !m.space & inside;
    let (letter, digit) = (m.letter, m.digit);
    let other = solid & !letter & !digit;
    let same = (letter & letter << 1) | (digit & digit << 1) | (other & other << 1);
    let starts = (solid & solid << 1 & !same)
        | (solid & (space & !m.blank) << 1)
        | (space & solid << 1)
        | (space & space << 1 & solid >> 1);
    write_ends(s, pos, starts, upto, at_end, ends)
}

/// [`gpt2_ends`] for cl100k's pattern (`DIGITS` = 3) and Qwen2's (`DIGITS` = 1), on ASCII
/// without `'`, CR or LF (each stops the block: contractions and `\s*[\r\n]+` are left to the
/// scanner). There, with white space meaning tab, vertical tab, form feed and `' '`, a piece
/// starts at `p` exactly when
/// - `p` is a letter after a non-letter, unless the character before is white space (it takes
///   the letters: `[^\r\n\p{L}\p{N}]?\p{L}+`) or a lone other character that itself starts a
///   piece (not after a `' '`);
/// - `p` is a digit at the start of its run, or `DIGITS` digits after a start (`\p{N}{1,3}`);
/// - `p` is another character after a non-other one, unless that one is `' '` (it takes the
///   run: ` ?[^\s\p{L}\p{N}]+`);
/// - `p` is white space after a non-white-space one, or the last of a run of two or more that
///   something else follows (`\s+(?!\S)` backs off one character; at the end of the text the
///   run stays whole).
#[inline]
pub(crate) fn cl100k_ends<const DIGITS: usize>(s: &[u8], pos: usize, ends: &mut [usize]) -> usize {
    let Some((m, lim, upto, at_end)) = window(s, pos, |m| m.stop | m.newline) else {
        return 0;
    };
    let inside = below(lim);
    let ws = m.space;
    let solid = !ws & inside;
    let (letter, digit, blank) = (m.letter, m.digit, m.blank);
    let other = solid & !letter & !digit;
    let lone_other = other & !(other << 1) & !(other >> 1) & !(blank << 1);
    let letter_starts = letter & !(letter << 1) & !(ws << 1) & !(lone_other << 1);
    let other_starts = other & !(other << 1) & !(blank << 1);
    let ws_starts = ws & (!(ws << 1) | solid >> 1);
    let mut digit_starts = digit & !(digit << 1);
    if DIGITS > 1 {
        // Every DIGITS-th digit of a run after its first.
        let mut from = digit_starts;
        while from != 0 {
            for _ in 0..DIGITS {
                from = from << 1 & digit;
            }
            digit_starts |= from;
        }
    } else {
        digit_starts = digit;
    }
    write_ends(s, pos, letter_starts | other_starts | ws_starts | digit_starts, upto, at_end, ends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::pretok::{Cl100k, Gpt2, Pieces, Scanner};

    #[test]
    fn sse2_masks_equal_the_class_table_for_every_byte_in_every_lane() {
        for b in 0..=255u8 {
            for lane in [0, 1, 15, 16, 31, 47, 63] {
                let mut w = [b'x'; 64];
                w[lane] = b;
                assert_eq!(masks(&w), masks_by_table(&w), "byte {b:#04x} in lane {lane}");
            }
        }
    }

    /// The pieces of `text` from `S`'s blocks where they decide, its scanner elsewhere.
    fn pieces<S: Scanner>(text: &[u8]) -> Vec<usize> {
        let (mut out, mut pos, mut ends) = (vec![], 0, [0usize; 7]);
        while pos < text.len() {
            let k = S::block_ends(text, pos, &mut ends);
            if k == 0 {
                pos = S::end(text, pos);
                out.push(pos);
            } else {
                out.extend_from_slice(&ends[..k]);
                pos = ends[k - 1];
            }
        }
        out
    }

    /// The piece ends of `S`'s scanner alone.
    fn scanner<S: Scanner>(text: &[u8]) -> Vec<usize> {
        let text = std::str::from_utf8(text).expect("UTF-8");
        Pieces::<S>::new(text).map(|(_, end)| end).collect()
    }

    /// Random texts over `alphabet` (UTF-8 pieces), every length up to 200, 50 of each.
    fn random_texts(alphabet: &[&str]) -> Vec<Vec<u8>> {
        let mut x: u64 = 1;
        let mut out = Vec::new();
        for len in 0..200 {
            for _ in 0..50 {
                let mut t = Vec::new();
                for _ in 0..len {
                    x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    t.extend_from_slice(alphabet[(x >> 33) as usize % alphabet.len()].as_bytes());
                }
                out.push(t);
            }
        }
        out
    }

    /// Texts where the rules of the patterns differ, written out.
    const TEXTS: [&str; 16] = [
        "Hello world, this is a test.",
        "a  b\t\tc \n d\n\n\ne   ",
        "x's  don't  I'm 1234 5,6.7 !!?? (ok)",
        " \t \n\r\n\u{b}\u{c}end",
        "ünïcödé  words\u{a0} and  more",
        "trailing space ",
        "trailing spaces  ",
        "  ",
        "a",
        " a",
        "The quick brown fox jumps over the lazy dog; 1984: the year. \"Quoted\" -- dashes -- and\nnew lines.\n\n",
        " !word !!word (word) $100 12345678 x1y22z333 a.b ..c \tword \t!x\x0b!y",
        "  !x   !!y\t\t(z) \x0c\x0cw 1 22 333 4444",
        "end with digits 1234567",
        "end with other !!",
        "!a",
    ];

    #[test]
    fn gpt2_blocks_cut_as_the_scanner_does() {
        for t in TEXTS {
            assert_eq!(pieces::<Gpt2>(t.as_bytes()), scanner::<Gpt2>(t.as_bytes()), "{t:?}");
        }
        let alphabet = [
            "a", "b", " ", "Z", "0", "9", " ", "\t", "\n", "\r", "\x0b", "\x0c", ".", ",", "!", "'", "_", "-", "\0",
            "\x1f", "\x7f",
        ];
        for t in random_texts(&alphabet) {
            assert_eq!(pieces::<Gpt2>(&t), scanner::<Gpt2>(&t), "{:?}", String::from_utf8_lossy(&t));
        }
    }

    #[test]
    fn cl100k_and_qwen2_blocks_cut_as_the_scanner_does() {
        for t in TEXTS {
            assert_eq!(pieces::<Cl100k<3>>(t.as_bytes()), scanner::<Cl100k<3>>(t.as_bytes()), "{t:?}");
            assert_eq!(pieces::<Cl100k<1>>(t.as_bytes()), scanner::<Cl100k<1>>(t.as_bytes()), "{t:?}");
        }
        // Where the rules differ: lone and repeated others before letters, after spaces and
        // tabs; digit runs; white space runs with and without CR/LF; stops (', non-ASCII letters
        // and spaces).
        let alphabet = [
            "a", "b", "Z", " ", " ", "\t", "\x0b", "\x0c", "\n", "\r", "0", "7", ".", "!", "(", "'", "\0", "\x7f", "é",
            "\u{a0}", "²",
        ];
        for t in random_texts(&alphabet) {
            assert_eq!(pieces::<Cl100k<3>>(&t), scanner::<Cl100k<3>>(&t), "{:?}", String::from_utf8_lossy(&t));
            assert_eq!(pieces::<Cl100k<1>>(&t), scanner::<Cl100k<1>>(&t), "{:?}", String::from_utf8_lossy(&t));
        }
    }
}
