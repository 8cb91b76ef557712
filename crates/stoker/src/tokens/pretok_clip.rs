//! CLIP's pre-tokenizer, written out by hand: the `Split` of [`CLIP_PATTERN`] with
//! `Removed` behaviour, inverted (the matches are the pieces, the whitespace between them is
//! dropped), then `ByteLevel` with GPT-2's pattern over each piece. That second split changes
//! only the two literal special tokens (`<|startoftext|>` becomes `<|`, `startoftext`, `|>`):
//! every other match is a letter run, one number, a contraction or a run of other characters,
//! which GPT-2's pattern matches whole (no space inside, and a contraction needs a letter that a
//! run of other characters cannot hold). Classes are Oniguruma's ([`super::pretok::class_at`]).

use super::pretok::class_at;
use super::pretok_class::Class;

/// CLIP's pattern, as `openai/clip-vit-*`'s `tokenizer.json` writes it.
pub(crate) const CLIP_PATTERN: &str =
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";

/// The two literals of the pattern, each with the three pieces GPT-2's pattern cuts it into.
const LITERALS: [(&[u8], [usize; 2]); 2] = [(b"<|startoftext|>", [2, 13]), (b"<|endoftext|>", [2, 11])];

/// The contractions, tried in the pattern's order (no one is a prefix of another).
const CONTRACTIONS: [&[u8]; 7] = [b"'s", b"'t", b"'re", b"'ve", b"'m", b"'ll", b"'d"];

/// Calls `piece(a, b)` for each piece `s[a..b]` of the valid UTF-8 text `s`, in order.
pub(crate) fn clip_pieces(s: &[u8], mut piece: impl FnMut(usize, usize)) {
    let mut i = 0;
    'next: while i < s.len() {
        let rest = &s[i..];
        if rest[0] == b'<' {
            for (lit, [x, y]) in LITERALS {
                if rest.starts_with(lit) {
                    piece(i, i + x);
                    piece(i + x, i + y);
                    piece(i + y, i + lit.len());
                    i += lit.len();
                    continue 'next;
                }
            }
        } else if rest[0] == b'\'' {
            if let Some(c) = CONTRACTIONS.iter().find(|c| rest.starts_with(c)) {
                piece(i, i + c.len());
                i += c.len();
                continue;
            }
        }
        let (k, len) = class_at(s, i);
        let mut end = i + len;
        match k {
            Class::Space => {
                i = end;
                continue;
            }
            Class::Number => {}
            Class::Letter | Class::Other => {
                while end < s.len() {
                    let (k2, l2) = class_at(s, end);
                    if k2 != k {
                        break;
                    }
                    end += l2;
                }
            }
        }
        piece(i, end);
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::pre_tokenizers::PreTokenizerWrapper;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

    /// The pieces `tokenizers` itself cuts `text` into with CLIP's pre-tokenizer, as byte ranges.
    fn reference(text: &str) -> Vec<(usize, usize)> {
        let split = Split::new(SplitPattern::Regex(CLIP_PATTERN.into()), SplitDelimiterBehavior::Removed, true)
            .expect("CLIP's pattern compiles");
        let pre = Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ]);
        let mut p = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut p).expect("pre-tokenizes");
        p.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(_, o, _)| o).collect()
    }

    fn ours(text: &str) -> Vec<(usize, usize)> {
        let mut v = vec![];
        clip_pieces(text.as_bytes(), |a, b| v.push((a, b)));
        v
    }

    #[test]
    fn pieces_match_tokenizers_on_hand_picked_text() {
        for t in [
            "a photo of a cat",
            "it's 2024! <|endoftext|>!x <|startoftext|>",
            "((<|endoftext|>)) 'll'd 'x '' ''s",
            "HELLO 'S world\u{a0}\u{3000}日本語 ½ ٣٣ é e\u{301} 😀👩\u{200d}👧",
            "<|endoftext <|endoftext|><|endoftext|>",
            "  \t\n ",
            "",
        ] {
            assert_eq!(ours(t), reference(t), "{t:?}");
        }
    }

    /// Every scalar value alone and between others, against `tokenizers`' own split.
    #[test]
    fn every_scalar_value_matches_tokenizers() {
        let all: Vec<char> = (0..=0x10FFFFu32).filter_map(char::from_u32).collect();
        for chunk in all.chunks(2048) {
            let text: String = chunk.iter().flat_map(|&c| [c, 'a', c, c, '\'', c, '1', c, ' ', c]).collect();
            assert_eq!(ours(&text), reference(&text), "chunk from {:?}", chunk[0]);
        }
    }
}
