//! The normalizers the fast path reproduces, run on each gap between added tokens exactly as
//! `tokenizers` runs them: `NFC`, `Lowercase` (each character's own lower case, as
//! `NormalizedString::lowercase` maps them: no final-sigma rule), and `Replace` of the regex
//! `\s+` by one space (CLIP's), alone or in a `Sequence`, in the file's order.

use super::super::pretok::class_at;
use super::super::pretok_class::Class;
use super::ty;
use serde_json::Value;
use std::borrow::Cow;
use unicode_normalization_alignments::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// One step of a normalizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `NFC`.
    Nfc,
    /// `Lowercase`.
    Lower,
    /// `Replace(Regex("\s+"), " ")`: each run of whitespace (Oniguruma's `\s`) becomes one space.
    Spaces,
}

/// A file's normalizer as the steps the fast path runs (none: the text as it is).
#[derive(Debug, Default)]
pub(super) struct Normalizer {
    steps: Vec<Step>,
}

impl Normalizer {
    /// The normalizer of a `tokenizer.json` (its `"normalizer"` value), or why the fast path
    /// does not reproduce it.
    pub(super) fn of(n: Option<&Value>) -> Result<Normalizer, String> {
        let mut steps = vec![];
        if let Some(n) = n.filter(|n| !n.is_null()) {
            push(n, &mut steps)?;
        }
        Ok(Normalizer { steps })
    }

    /// Its short description ("NFC, lowercase"), empty when it does nothing.
    pub(super) fn describe(&self) -> String {
        let names: Vec<&str> = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Nfc => "NFC",
                Step::Lower => "lowercase",
                Step::Spaces => "whitespace runs as one space",
            })
            .collect();
        names.join(", ")
    }

    /// Whether it does nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// `gap` normalized into `out` (emptied first). An ASCII gap is done in one pass (NFC
    /// changes no ASCII text, and on ASCII lowercasing and collapsing whitespace commute);
    /// any other step by step.
    pub(super) fn apply_into(&self, gap: &str, out: &mut String) {
        out.clear();
        if !gap.is_ascii() {
            return out.push_str(&self.apply(gap));
        }
        let lower = self.steps.contains(&Step::Lower);
        let spaces = self.steps.contains(&Step::Spaces);
        out.reserve(gap.len());
        let mut in_run = false;
        for &b in gap.as_bytes() {
            if spaces && class_at(&[b], 0).0 == Class::Space {
                if !in_run {
                    out.push(' ');
                }
                in_run = true;
                continue;
            }
            in_run = false;
            out.push(char::from(if lower { b.to_ascii_lowercase() } else { b }));
        }
    }

    /// `gap` normalized, borrowed where no step changes it.
    pub(super) fn apply<'a>(&self, gap: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(gap);
        for step in &self.steps {
            let changed = match step {
                Step::Nfc => nfc(&text),
                Step::Lower => lower(&text),
                Step::Spaces => spaces(&text),
            };
            if let Some(t) = changed {
                text = Cow::Owned(t);
            }
        }
        text
    }
}

fn push(n: &Value, steps: &mut Vec<Step>) -> Result<(), String> {
    match ty(n) {
        "NFC" => steps.push(Step::Nfc),
        "Lowercase" => steps.push(Step::Lower),
        "Replace"
            if n.get("pattern").and_then(|p| p.get("Regex")).and_then(Value::as_str) == Some(r"\s+")
                && n.get("content").and_then(Value::as_str) == Some(" ") =>
        {
            steps.push(Step::Spaces)
        }
        "Sequence" => {
            for m in n.get("normalizers").and_then(Value::as_array).ok_or("a normalizer Sequence has no list")? {
                push(m, steps)?;
            }
        }
        t => return Err(format!("normalizer {t:?} is not reproduced")),
    }
    Ok(())
}

/// NFC, unless the text is ASCII or passes NFC's quick check (then it is its own NFC).
fn nfc(t: &str) -> Option<String> {
    if t.is_ascii() || is_nfc_quick(t.chars()) == IsNormalized::Yes {
        return None;
    }
    // The very function `tokenizers`' NFC normalizer runs.
    Some(t.nfc().map(|(ch, _)| ch).collect())
}

fn lower(t: &str) -> Option<String> {
    if t.is_ascii() {
        return t.bytes().any(|b| b.is_ascii_uppercase()).then(|| t.to_ascii_lowercase());
    }
    let mut chars = t.chars();
    // Only a character whose lower case is not itself changes the text.
    if chars.all(|c| c.to_lowercase().eq(std::iter::once(c))) {
        return None;
    }
    Some(t.chars().flat_map(char::to_lowercase).collect())
}

/// Each run of whitespace as one space; `None` when every run is already one space.
fn spaces(t: &str) -> Option<String> {
    let s = t.as_bytes();
    let mut runs = vec![];
    let mut i = 0;
    while i < s.len() {
        let (k, len) = class_at(s, i);
        if k != Class::Space {
            i += len;
            continue;
        }
        let start = i;
        i += len;
        while i < s.len() {
            let (k, len) = class_at(s, i);
            if k != Class::Space {
                break;
            }
            i += len;
        }
        if &s[start..i] != b" " {
            runs.push((start, i));
        }
    }
    if runs.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(t.len());
    let mut prev = 0;
    for (a, b) in runs {
        out.push_str(&t[prev..a]);
        out.push(' ');
        prev = b;
    }
    out.push_str(&t[prev..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokenizers::{NormalizedString, Normalizer as _, NormalizerWrapper};

    /// CLIP's normalizer against `tokenizers`' own, on every scalar value in a few contexts.
    #[test]
    fn clip_normalizer_matches_tokenizers() {
        let j = json!({"type": "Sequence", "normalizers": [
            {"type": "NFC"}, {"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}, {"type": "Lowercase"}]});
        let ours = Normalizer::of(Some(&j)).unwrap();
        let theirs: NormalizerWrapper = serde_json::from_value(j).unwrap();
        let all: Vec<char> = (0..=0x10FFFFu32).filter_map(char::from_u32).collect();
        for chunk in all.chunks(1024) {
            let text: String = chunk.iter().flat_map(|&c| [c, 'A', c, c, ' ', ' ', c, '\u{301}', '\n', c]).collect();
            let mut n = NormalizedString::from(text.as_str());
            theirs.normalize(&mut n).unwrap();
            assert_eq!(ours.apply(&text), n.get(), "chunk from {:?}", chunk[0]);
        }
        // The one-pass ASCII form, on every pair of ASCII characters in context.
        let mut out = String::new();
        for a in 0..128u8 {
            let text: String =
                (0..128u8).flat_map(|b| [a, b, b' ', a, b'\t', b'\n', b'A', b]).map(char::from).collect();
            ours.apply_into(&text, &mut out);
            assert_eq!(out, ours.apply(&text), "{a}");
        }
        assert!(matches!(ours.apply("a cat on a mat"), Cow::Borrowed(_)));
    }

    /// The NFC shortcut: a scalar value that passes the quick check is its own NFC, alone and
    /// after a letter (so skipping `nfc()` for a quick-check-yes gap changes nothing).
    #[test]
    fn nfc_quick_check_yes_means_unchanged() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            for s in [c.to_string(), format!("a{c}")] {
                if is_nfc_quick(s.chars()) == IsNormalized::Yes {
                    let n: String = s.nfc().map(|(ch, _)| ch).collect();
                    assert_eq!(n, s, "{c:?}");
                }
            }
        }
    }

    #[test]
    fn other_normalizers_are_refused() {
        for j in [json!({"type": "NFKC"}), json!({"type": "Replace", "pattern": {"String": " "}, "content": "_"})] {
            assert!(Normalizer::of(Some(&j)).is_err(), "{j}");
        }
        assert!(Normalizer::of(None).unwrap().steps.is_empty());
    }
}
