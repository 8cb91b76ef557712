//! Captions as a CLIP text model reads them: a fixed row of `context_length` ids (start of
//! text, the caption's tokens, end of text, padding) and a mask, for image-text pairs.
//!
//! Two conventions exist, and a model was trained with one of them:
//!
//! - open_clip's `SimpleTokenizer` ([`Clean::OpenClip`]): the caption is cleaned first (ftfy,
//!   HTML references replaced twice, whitespace collapsed, lowercased), padded with id 0 (a real
//!   token, `!`; models pool at the end-of-text position, found by `argmax`);
//! - HuggingFace's `CLIPTokenizerFast` with `padding="max_length", truncation=True`
//!   ([`Clean::None`]): only the tokenizer's own normalizer (NFC, whitespace, lowercase), padded
//!   with `<|endoftext|>` (49407).
//!
//! Both truncate to `context_length` with the end-of-text id in the last slot, so a long
//! caption ends `..., 49407` at index 76 either way. The pad id is its own option
//! ([`CaptionOptions::pad_id`]).
//!
//! [`Clean::OpenClip`] does what open_clip's `basic_clean` and `whitespace_clean` do except
//! ftfy: HTML references replaced twice by Python's own algorithm ([`super::html`]), the caption
//! split on Python's whitespace (`str.split()`) and joined with single spaces, then lowercased as
//! Python's `str.lower` does (a final capital sigma becomes `ς`); a special token spelled in a
//! caption (`<|endoftext|>`) is encoded as its text, as open_clip does (open_clip itself does
//! turn its own spellings, `<start_of_text>` and `<end_of_text>`, into the special ids; here
//! they stay text). **ftfy is not run**: it
//! repairs mojibake (`cafÃ©` to `café`), curly quotes (`’` to `'`) and some other text, so
//! captions with those get other ids than open_clip gives (about 1 caption in 100 of English
//! Wikipedia sentences, mostly for `’`); ftfy's NFC is done, by the tokenizer's normalizer. Clean
//! the captions with ftfy when the dataset is written to match open_clip exactly.
//!
//! The ids come from a [`TextTokenizer`] (the same loaded `tokenizer.json` as every other text
//! path: CLIP's file runs on stoker's own byte-level encoder, special tokens spelled as text or
//! not); its post-processor may put the start and end ids around a text (as CLIP's does) or
//! nothing (they are added here).

use super::html;
use super::tokenizer::TextTokenizer;
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::cell::RefCell;

/// The start-of-text token a caption tokenizer must have.
pub const SOT: &str = "<|startoftext|>";
/// The end-of-text token a caption tokenizer must have.
pub const EOT: &str = "<|endoftext|>";

/// How a caption is cleaned before its tokenizer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clean {
    /// Nothing: the tokenizer's own normalizer alone (HuggingFace `CLIPTokenizerFast`).
    None,
    /// open_clip's cleaning without ftfy (see the module's documentation).
    OpenClip,
}

impl Clean {
    /// The names a user gives (`"none"`, `"open_clip"`).
    pub const NAMES: [&'static str; 2] = ["none", "open_clip"];

    /// The cleaning named `name`, if it is one of [`Clean::NAMES`].
    pub fn from_name(name: &str) -> Option<Clean> {
        match name {
            "none" => Some(Clean::None),
            "open_clip" => Some(Clean::OpenClip),
            _ => None,
        }
    }
}

/// What a caption row looks like (checked by [`crate::args::caption_options`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaptionOptions {
    /// Ids per caption, start and end of text included (CLIP: 77).
    pub context_length: usize,
    /// The id after the caption's last one (open_clip: 0; HuggingFace: 49407).
    pub pad_id: u32,
    /// How a caption is cleaned first.
    pub clean: Clean,
}

impl Default for CaptionOptions {
    /// open_clip's: 77 ids, padded with 0, cleaned.
    fn default() -> Self {
        CaptionOptions { context_length: 77, pad_id: 0, clean: Clean::OpenClip }
    }
}

/// Where an image-text pair's caption is read from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptionField {
    /// The whole `KEY.txt` member (open_clip's `txt`).
    Txt,
    /// A string field of the `KEY.json` member (img2dataset writes `caption` there).
    Json(String),
}

impl CaptionField {
    /// The member the caption is in.
    pub fn member(&self) -> crate::source::TextKind {
        match self {
            CaptionField::Txt => crate::source::TextKind::Txt,
            CaptionField::Json(_) => crate::source::TextKind::Json,
        }
    }

    /// The caption's bytes in `member` (what [`CaptionField::member`] names), or why there is
    /// none: a JSON member that is not a JSON object, or whose field is missing or not a string.
    pub fn caption<'a>(&self, member: &'a [u8]) -> std::result::Result<Cow<'a, [u8]>, String> {
        let CaptionField::Json(field) = self else { return Ok(Cow::Borrowed(member)) };
        let value: serde_json::Value =
            serde_json::from_slice(member).map_err(|e| format!("its JSON member is not JSON: {e}"))?;
        match value.get(field) {
            Some(serde_json::Value::String(s)) => Ok(Cow::Owned(s.clone().into_bytes())),
            Some(serde_json::Value::Null) | None => Err(format!("no caption: its JSON member has no {field:?}")),
            Some(other) => Err(format!("its JSON member's {field:?} is not a string ({other})")),
        }
    }
}

/// The captions of an image-text pair loader: the tokenizer file, the row options and where
/// the caption is read from (checked by [`crate::args::captions`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaptionSpec {
    /// The `tokenizer.json` (a local file).
    pub tokenizer: std::path::PathBuf,
    /// The rows made of each caption.
    pub options: CaptionOptions,
    /// Where each sample's caption is.
    pub field: CaptionField,
}

impl CaptionSpec {
    /// The encoder this spec describes (its tokenizer loaded and checked).
    pub fn encoder(&self) -> Result<CaptionEncoder> {
        CaptionEncoder::new(TextTokenizer::from_file(&self.tokenizer)?, self.options)
    }
}

/// Encodes captions into fixed rows of ids and masks.
#[derive(Debug, Clone)]
pub struct CaptionEncoder {
    tokenizer: TextTokenizer,
    options: CaptionOptions,
    sot: u32,
    eot: u32,
    /// The tokenizer's post-processor puts `sot` and `eot` around a text (else nothing).
    wrapped: bool,
}

thread_local! {
    /// Each thread's ids of the caption at hand (reused: no allocation per caption).
    static SCRATCH: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

impl CaptionEncoder {
    /// An encoder on `tokenizer` (which must have [`SOT`] and [`EOT`]) with `options`, checked
    /// by [`crate::values::check_caption_values`] against its vocabulary.
    pub fn new(tokenizer: TextTokenizer, options: CaptionOptions) -> Result<Self> {
        crate::values::check_caption_values(options.context_length, options.pad_id, Some(tokenizer.vocab_size()))?;
        let special = |name: &str| {
            tokenizer.id_of(name).ok_or_else(|| {
                Error::config(
                    "tokenizer",
                    format!(
                        "{}: has no {name} token; a caption tokenizer needs {SOT} and {EOT} (CLIP's)",
                        tokenizer.origin.display()
                    ),
                )
            })
        };
        let (sot, eot) = (special(SOT)?, special(EOT)?);
        let tokenizer = match options.clean {
            Clean::OpenClip => tokenizer.with_special_tokens_as_text(),
            Clean::None => tokenizer,
        };
        let mut around = vec![];
        tokenizer.encode_into("", &mut around)?;
        let wrapped = match around[..] {
            [] => false,
            [a, b] if a == sot && b == eot => true,
            _ => {
                return Err(Error::config(
                    "tokenizer",
                    format!(
                        "{}: its post-processor puts {around:?} around a text; a caption tokenizer puts \
                         {SOT} and {EOT} ({sot}, {eot}) or nothing",
                        tokenizer.origin.display()
                    ),
                ))
            }
        };
        Ok(CaptionEncoder { tokenizer, options, sot, eot, wrapped })
    }

    /// The options it encodes with.
    pub fn options(&self) -> &CaptionOptions {
        &self.options
    }

    /// The start- and end-of-text ids.
    pub fn specials(&self) -> (u32, u32) {
        (self.sot, self.eot)
    }

    /// Which encoder the tokenizer runs on, and why ([`TextTokenizer::engine`]).
    pub fn engine(&self) -> (&'static str, &str) {
        self.tokenizer.engine()
    }

    /// Writes the row of `text` (UTF-8) into `ids` and `mask` (each `context_length` long):
    /// start of text, the caption's ids, end of text, cut to `context_length` with the end of
    /// text in the last slot, then `pad_id`; the mask is 1 for those ids and 0 for padding.
    /// Returns the number of ids before the padding. A caption that is not UTF-8 is an
    /// [`Error::Decode`] saying where; `ids` and `mask` are then left as they were.
    pub fn encode_into(&self, text: &[u8], ids: &mut [i32], mask: &mut [i32]) -> Result<usize> {
        let n = self.options.context_length;
        if ids.len() != n || mask.len() != n {
            return Err(Error::Internal(format!(
                "caption rows of {} ids and {} mask values for a context length of {n}",
                ids.len(),
                mask.len()
            )));
        }
        let text = std::str::from_utf8(text).map_err(|e| Error::decode("caption", format!("not UTF-8: {e}")))?;
        let text = match self.options.clean {
            Clean::None => Cow::Borrowed(text),
            Clean::OpenClip => Cow::Owned(open_clip_clean(text)),
        };
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.clear();
            if !self.wrapped {
                s.push(self.sot);
            }
            self.tokenizer.encode_into(&text, &mut s)?;
            if !self.wrapped {
                s.push(self.eot);
            }
            let used = s.len().min(n);
            for (slot, id) in ids.iter_mut().zip(&s[..used]) {
                // Ids are below the vocabulary size, checked to fit an i32 with the pad id.
                *slot = *id as i32;
            }
            if s.len() > n {
                ids[n - 1] = self.eot as i32;
            }
            ids[used..].fill(self.options.pad_id as i32);
            mask[..used].fill(1);
            mask[used..].fill(0);
            Ok(used)
        })
    }
}

/// Python's `str.isspace` (what `str.split()` splits on): Unicode's White_Space and the
/// four information separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// open_clip's `_clean_lower` without ftfy: `html.unescape` twice, whitespace collapsed and
/// stripped, lowercased.
fn open_clip_clean(text: &str) -> String {
    let once = html::unescape(text);
    let twice = html::unescape(&once);
    let mut out = String::with_capacity(twice.len());
    for word in twice.split(python_space).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out.to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// CLIP's tokenizer, kept in the repository (`tests/data/text/README.md`).
    fn clip() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text/tokenizer-clip.json")
    }

    fn encoder(clean: Clean, pad_id: u32) -> CaptionEncoder {
        let t = TextTokenizer::from_file(&clip()).unwrap();
        CaptionEncoder::new(t, CaptionOptions { context_length: 77, pad_id, clean }).unwrap()
    }

    /// The row of `text`: its ids up to the padding, and the count.
    fn row(e: &CaptionEncoder, text: &[u8]) -> (Vec<i32>, Vec<i32>, usize) {
        let (mut ids, mut mask) = (vec![-1; 77], vec![-1; 77]);
        let n = e.encode_into(text, &mut ids, &mut mask).unwrap();
        (ids, mask, n)
    }

    /// Checks the row of `text` against `want` (the ids before padding): the padding, the mask.
    fn check(e: &CaptionEncoder, text: &str, want: &[i32]) {
        let (ids, mask, n) = row(e, text.as_bytes());
        assert_eq!(&ids[..n], want, "{text:?}");
        assert!(ids[n..].iter().all(|&i| i == e.options.pad_id as i32), "{text:?}: {ids:?}");
        assert_eq!(mask.iter().filter(|&&m| m == 1).count(), n);
        assert!(mask[..n].iter().all(|&m| m == 1) && mask[n..].iter().all(|&m| m == 0));
    }

    // The expected ids below are open_clip's `SimpleTokenizer` (open_clip at commit 89fb801,
    // run with `ftfy.fix_text` replaced by NFC alone, on `bpe_simple_vocab_16e6.txt.gz`) for
    // `Clean::OpenClip`, and the Python `tokenizers` library on `tokenizer-clip.json` with
    // `enable_truncation(77)` for `Clean::None`; see `python/tests/test_captions.py` for the
    // same comparison on a few hundred sentences.

    #[test]
    fn plain_captions_match_both_references() {
        for clean in [Clean::OpenClip, Clean::None] {
            let e = encoder(clean, 0);
            check(&e, "a photo of a cat", &[49406, 320, 1125, 539, 320, 2368, 49407]);
            check(&e, "A Photo  of\ta\nDOG.", &[49406, 320, 1125, 539, 320, 1929, 269, 49407]);
            check(&e, "it's 3 o'clock", &[49406, 585, 568, 274, 334, 262, 6716, 49407]);
        }
        // Both on stoker's own encoder (CLIP's file, special tokens split out or spelled).
        for clean in [Clean::OpenClip, Clean::None] {
            assert_eq!(encoder(clean, 0).engine().0, "stoker byte-level BPE");
        }
    }

    #[test]
    fn html_references_are_replaced_twice_for_open_clip_only() {
        let oc = encoder(Clean::OpenClip, 0);
        let hf = encoder(Clean::None, 0);
        // "tom & jerry": open_clip; HuggingFace keeps the reference as text.
        check(&oc, "Tom &amp; Jerry", &[49406, 2435, 261, 9164, 49407]);
        check(&hf, "Tom &amp; Jerry", &[49406, 2435, 261, 6259, 282, 9164, 49407]);
        check(&oc, "&quot;quoted&quot; &#39;single&#39;", &[49406, 257, 27706, 257, 568, 17005, 262, 49407]);
        check(&oc, "fish &amp;amp; chips", &[49406, 2759, 261, 8855, 49407]);
        check(&hf, "fish &amp;amp; chips", &[49406, 2759, 261, 6259, 282, 6259, 282, 8855, 49407]);
    }

    #[test]
    fn mojibake_emoji_and_other_scripts() {
        for clean in [Clean::OpenClip, Clean::None] {
            let e = encoder(clean, 0);
            // Mojibake stays mojibake (ftfy would repair it; see the module's documentation).
            check(&e, "caf\u{c3}\u{a9} au lait", &[49406, 3471, 127, 352, 5811, 2566, 572, 585, 49407]);
            check(&e, "cafe\u{301}", &[49406, 15304, 49407]);
            check(&e, "\u{1f431} cat \u{1f600}", &[49406, 22979, 2368, 7334, 49407]);
            check(&e, "東京タワー", &[49406, 48338, 21078, 105, 34941, 2429, 107, 30391, 49407]);
        }
        // Python's `str.lower` makes a final capital sigma `ς`; HuggingFace's normalizer `σ`.
        check(&encoder(Clean::OpenClip, 0), "ΟΔΟΣ", &[49406, 138, 123, 138, 112, 138, 123, 139, 480, 49407]);
        check(&encoder(Clean::None, 0), "ΟΔΟΣ", &[49406, 138, 123, 138, 112, 138, 123, 139, 481, 49407]);
        // A special token in a caption: text for open_clip, the token for HuggingFace.
        check(&encoder(Clean::OpenClip, 0), "<|endoftext|>", &[49406, 27, 347, 40786, 4160, 91, 285, 49407]);
        check(&encoder(Clean::None, 0), "<|endoftext|>", &[49406, 49407, 49407]);
    }

    #[test]
    fn a_long_caption_ends_with_eot_at_index_76() {
        for clean in [Clean::OpenClip, Clean::None] {
            let e = encoder(clean, 0);
            let (ids, mask, n) = row(&e, "word ".repeat(100).as_bytes());
            assert_eq!(n, 77);
            assert_eq!(ids[0], 49406);
            assert!(ids[1..76].iter().all(|&i| i == 2653), "{ids:?}");
            assert_eq!(ids[76], 49407);
            assert!(mask.iter().all(|&m| m == 1));
        }
    }

    #[test]
    fn empty_captions_and_the_pad_id() {
        for (clean, pad) in [(Clean::OpenClip, 0), (Clean::None, 49407), (Clean::OpenClip, 49407)] {
            let e = encoder(clean, pad);
            for text in ["", "   ", "\t\n"] {
                let (ids, mask, n) = row(&e, text.as_bytes());
                assert_eq!(n, 2, "{text:?}");
                assert_eq!(&ids[..2], &[49406, 49407]);
                assert!(ids[2..].iter().all(|&i| i == pad as i32));
                assert_eq!(&mask[..3], &[1, 1, 0]);
            }
        }
        let (ids, _, _) = row(&encoder(Clean::None, 49407), b"a dog");
        assert_eq!(&ids[..6], &[49406, 320, 1929, 49407, 49407, 49407]);
    }

    #[test]
    fn a_caption_that_is_not_utf8_is_a_decode_error() {
        let e = encoder(Clean::OpenClip, 0);
        let (mut ids, mut mask) = (vec![7; 77], vec![7; 77]);
        let err = e.encode_into(b"caf\xe9 au lait", &mut ids, &mut mask).unwrap_err();
        assert!(matches!(err, Error::Decode { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("not UTF-8") && msg.contains("index 3"), "{msg}");
        assert!(ids.iter().chain(&mask).all(|&v| v == 7));
    }

    #[test]
    fn bad_options_and_tokenizers_are_refused() {
        let t = TextTokenizer::from_file(&clip()).unwrap();
        let opts = |context_length, pad_id| CaptionOptions { context_length, pad_id, clean: Clean::None };
        let e = CaptionEncoder::new(t.clone(), opts(1, 0)).unwrap_err().to_string();
        assert!(e.contains("`context_length`"), "{e}");
        let e = CaptionEncoder::new(t.clone(), opts(77, 49408)).unwrap_err().to_string();
        assert!(e.contains("`pad_id`") && e.contains("49408"), "{e}");
        // GPT-2's tokenizer has <|endoftext|> but no <|startoftext|>.
        let gpt2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text/tokenizer-gpt2.json");
        let e = CaptionEncoder::new(TextTokenizer::from_file(&gpt2).unwrap(), opts(77, 0)).unwrap_err().to_string();
        assert!(e.contains("<|startoftext|>") && e.contains("tokenizer-gpt2.json"), "{e}");
        let e = encoder(Clean::None, 0);
        let err = e.encode_into(b"x", &mut [0; 76], &mut [0; 77]).unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
    }
}
