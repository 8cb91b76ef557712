//! GPT-2's pre-tokenizer regex, written out by hand:
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, with the
//! semantics the `tokenizers` crate gives it through Oniguruma (first alternative that matches,
//! greedy runs, `\s+(?!\S)` backing off one character before a non-space). The character
//! classes come from Oniguruma itself (`pretok_tables.rs`), so `\p{L}`, `\p{N}` and `\s`
//! are exactly what the regex engine says, Unicode version included.

use super::pretok_tables::RANGES;

/// The four classes the pattern tells apart; they partition the Unicode scalar values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// `\p{L}`: general category L.
    Letter,
    /// `\p{N}`: general category N.
    Number,
    /// `\s`: Unicode White_Space.
    Space,
    /// Everything else: `[^\s\p{L}\p{N}]`.
    Other,
}

/// The class of each ASCII byte, from the same table.
static ASCII: [Class; 128] = ascii_table();

const fn ascii_table() -> [Class; 128] {
    let mut t = [Class::Other; 128];
    let mut i = 0;
    while i < RANGES.len() {
        let (a, b, k) = RANGES[i];
        let mut c = a;
        while c <= b && c < 128 {
            t[c as usize] = k;
            c += 1;
        }
        i += 1;
    }
    t
}

/// The class of a non-ASCII scalar value.
fn class_of(c: u32) -> Class {
    match RANGES.binary_search_by(|&(a, b, _)| {
        if b < c {
            std::cmp::Ordering::Less
        } else if a > c {
            std::cmp::Ordering::Greater
        } else {
            std::cmp::Ordering::Equal
        }
    }) {
        Ok(i) => RANGES[i].2,
        Err(_) => Class::Other,
    }
}

/// The class and UTF-8 length of the character that starts at `s[i]` (`i` on a char boundary,
/// `i < s.len()`).
#[inline]
fn class_at(s: &[u8], i: usize) -> (Class, usize) {
    let b0 = s[i];
    if b0 < 0x80 {
        return (ASCII[b0 as usize], 1);
    }
    // `s` is valid UTF-8 and `i` a boundary, so the continuation bytes are there.
    let (len, mut c) = match b0 {
        0xC0..=0xDF => (2, (b0 & 0x1F) as u32),
        0xE0..=0xEF => (3, (b0 & 0x0F) as u32),
        _ => (4, (b0 & 0x07) as u32),
    };
    for k in 1..len {
        c = (c << 6) | (s.get(i + k).copied().unwrap_or(0x80) & 0x3F) as u32;
    }
    (class_of(c), len)
}

/// The pieces of `text`, as byte ranges, in order and covering it: the matches of GPT-2's
/// pattern (which leaves no gaps, since every character is in one of the four classes).
pub(crate) struct Pieces<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Pieces<'a> {
    /// Pieces of `text`.
    pub(crate) fn new(text: &'a str) -> Self {
        Pieces { s: text.as_bytes(), pos: 0 }
    }

    /// The end of the run of characters of class `k` that starts at `i`.
    #[inline]
    fn run(&self, mut i: usize, k: Class) -> usize {
        let s = self.s;
        while i < s.len() {
            let (c, l) = class_at(s, i);
            if c != k {
                break;
            }
            i += l;
        }
        i
    }
}

impl Iterator for Pieces<'_> {
    type Item = (usize, usize);

    #[inline]
    fn next(&mut self) -> Option<(usize, usize)> {
        let s = self.s;
        let i = self.pos;
        if i >= s.len() {
            return None;
        }
        let end = piece_end(self, i);
        self.pos = end;
        Some((i, end))
    }
}

/// Where the match starting at `i` ends.
#[inline]
fn piece_end(p: &Pieces<'_>, i: usize) -> usize {
    let s = p.s;
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
            return p.run(i + 1 + l, k);
        }
    }
    let (k, l) = class_at(s, i);
    if k != Class::Space {
        return p.run(i + l, k);
    }
    // `\s+(?!\S)|\s+`: the whole run at the end of the text; before a non-space, all but the
    // run's last character if it has two or more, else the one character.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(t: &str) -> Vec<&str> {
        Pieces::new(t).map(|(a, b)| &t[a..b]).collect()
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
}
