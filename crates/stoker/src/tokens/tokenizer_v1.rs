//! `tokenizers` 1.0 (the pinned release candidate, crate `tokenizers1`) for the files stoker's
//! own byte-level BPE does not take: SentencePiece-style BPE (Llama 2's), WordPiece, Unigram.
//! There it encodes 3-4x faster than 0.22 with the same ids (BENCHMARKS.md, issue 49).
//!
//! 1.0 is a rewrite, and a release candidate: some files it does not load, and on some it
//! gives other ids than 0.22 (CLIP's one-character words, an `rstrip` added token, recently
//! assigned code points, a byte-level file with an `unk_token`: common words merged
//! otherwise). So a file is admitted only when
//! - it is not byte-level (no `ByteLevel` step: 1.0 rewrites those vocabularies, and that is
//!   where its ids differed; stoker's own BPE takes the usual ones),
//! - its regexes (`Split`, `Replace`) have no class whose meaning depends on the engine's
//!   Unicode tables or case folding (`\p{..}`, `\s`, `\w`, `\d`, `\b`, `[[:..:]]`, `(?..)`
//!   flags and groups): 1.0 runs them on fancy-regex, 0.22 on Oniguruma (` {2,}`, Unigram's
//!   usual one, is fine), and
//! - 1.0 loads it and gives 0.22's ids, special tokens included, on a probe: [`PROBE`]
//!   (whitespace runs, scripts, marks, digits, emoji, the code points known to differ, a
//!   paragraph of English) and every added token of the file next to itself, to text and to
//!   whitespace.
//!
//! Anything else stays on 0.22 and [`super::tokenizer::TextTokenizer::engine`] says why.
//!
//! Owns: loading a file into 1.0, the admission probe, encoding with the post-processor's
//! tokens added around the sequence. May not touch: which files stoker's own BPE takes.

use tokenizers1::pipeline::{EncodeOptions, PipelineToken, PipelineTokenizer};

/// Texts both versions must encode alike before a file is admitted (with the added tokens'
/// own probe, [`added_token_probe`]).
const PROBE: &[&str] = &[
    "",
    " ",
    "a",
    "  Hello,  world!  ",
    "\n\n\n\n",
    "\t tabs\tand\r\nCRLF\r\n lines \n",
    "The year 1984 had 365 days; 3.14159 and 1,000,000 and 0x1F.",
    "don't won't it's I'm you're we've they'll he'd",
    "héllo wörld, Ünïcödé naïve café résumé Ærø",
    "Съешь же ещё этих мягких французских булок",
    "Ελληνικά και العربية و עברית",
    "日本語のテキストと中文文本와 한국어",
    "हिन्दी ภาษาไทย ქართული",
    "emoji 🤖🔥👍🏽 ok 👨‍👩‍👧",
    "\u{088f}\u{1acf}\u{0870} recent code points x\u{0301}y\u{0308}",
    "ﬁ ligature Ⅻ ℃ ① ＡＢＣ ｶﾀｶﾅ",
    "\u{00a0}non\u{2009}breaking\u{3000}spaces\u{200b}zero",
    "<s> </s> <unk> <pad> [CLS] [SEP] [MASK] [UNK] <|endoftext|>",
    "UPPER lower MiXeD camelCase snake_case kebab-case",
    "    def f(x):\n        return x ** 2  # code\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\u{fffd}\u{feff}BOM and replacement",
    "Anarchism is a political philosophy that advocates stateless societies, often defined as \
     self-governed voluntary institutions. The history of the region begins in antiquity; its \
     inhabitants were farmers, merchants and soldiers. Albedo (from Latin albus, white) is the \
     fraction of sunlight reflected by a surface. Abraham Lincoln was the 16th President of the \
     United States, from March 1861 until his assassination in April 1865.",
];

/// At most this many added tokens are probed (a file with more probes its first ones by id).
const ADDED_PROBED: usize = 512;

/// A file on `tokenizers` 1.0, admitted by the probe.
#[derive(Clone)]
pub struct V1 {
    inner: PipelineTokenizer,
    /// The post-processor's tokens before and after a single sequence.
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

impl V1 {
    /// Loads `json` into 1.0 and checks it against `reference` (0.22, the same file); the
    /// reason when it is not admitted.
    pub fn admit(json: &serde_json::Value, reference: &tokenizers::Tokenizer) -> Result<V1, String> {
        if byte_level(json) {
            return Err(
                "a byte-level file stays on 0.22 (1.0 rewrites its vocabulary and gave other ids on some)".into()
            );
        }
        if let Some(p) = engine_dependent_regex(json) {
            return Err(format!("its regex {p:?} has classes Oniguruma and 1.0's fancy-regex may read differently"));
        }
        if reference.get_truncation().is_some() || reference.get_padding().is_some() {
            return Err("the file sets truncation or padding, which tokenizers 1.0 applies differently".into());
        }
        let mut upgraded = json.clone();
        tokenizers1::canonicalize_value(&mut upgraded).map_err(|e| format!("tokenizers 1.0 cannot upgrade it: {e}"))?;
        let inner = tokenizers1::from_json(&upgraded.to_string())
            .map_err(|e| format!("tokenizers 1.0 does not load it: {e}"))?;
        let template = &inner.get_post_processor().single;
        let (prefix, suffix) = (ids(&template.prefix), ids(&template.suffix));
        let v1 = V1 { inner, prefix, suffix };
        let mut added: Vec<(u32, String)> =
            reference.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content)).collect();
        added.sort_unstable();
        let extra = added.iter().take(ADDED_PROBED).map(|(_, t)| added_token_probe(t));
        let mut got = Vec::new();
        for text in PROBE.iter().map(|s| s.to_string()).chain(extra) {
            got.clear();
            v1.encode_into(&text, &mut got).map_err(|e| format!("tokenizers 1.0 cannot encode {text:?}: {e}"))?;
            let want = reference.encode_fast(text.as_str(), true).map_err(|e| format!("probe {text:?}: {e}"))?;
            if got != want.get_ids() {
                return Err(format!("tokenizers 1.0 gives other ids than 0.22 for {text:?}"));
            }
        }
        Ok(v1)
    }

    /// The ids of `text` with the post-processor's tokens around them, appended to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<(), String> {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<PipelineToken>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        out.extend_from_slice(&self.prefix);
        SCRATCH.with_borrow_mut(|seq| {
            seq.clear();
            let r = self.inner.encode_into(text, &EncodeOptions::no_specials(), seq).map_err(|e| e.to_string());
            out.extend_from_slice(PipelineToken::cast_slice(seq));
            // A long document's buffer is not kept for the thread's lifetime.
            if seq.capacity() > 1 << 20 {
                *seq = Vec::new();
            }
            r
        })?;
        out.extend_from_slice(&self.suffix);
        Ok(())
    }
}

/// Whether any step of the file (pre-tokenizer, decoder, post-processor, at any depth) is
/// `ByteLevel`.
fn byte_level(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => {
            m.get("type").and_then(|t| t.as_str()) == Some("ByteLevel") || m.values().any(byte_level)
        }
        serde_json::Value::Array(a) => a.iter().any(byte_level),
        _ => false,
    }
}

/// The first regex pattern of the file (`{"Regex": ..}` at any depth) whose classes depend on
/// the regex engine's Unicode tables or case folding.
fn engine_dependent_regex(v: &serde_json::Value) -> Option<&str> {
    const CLASSES: [&str; 14] =
        ["\\p", "\\P", "\\s", "\\S", "\\w", "\\W", "\\d", "\\D", "\\b", "\\B", "\\X", "\\h", "[[:", "(?"];
    match v {
        serde_json::Value::Object(m) => {
            if let Some(p) = m.get("Regex").and_then(|p| p.as_str()) {
                if CLASSES.iter().any(|c| p.contains(c)) {
                    return Some(p);
                }
            }
            m.values().find_map(engine_dependent_regex)
        }
        serde_json::Value::Array(a) => a.iter().find_map(engine_dependent_regex),
        _ => None,
    }
}

/// The ids of a template's special tokens.
fn ids(tokens: &[(PipelineToken, u8)]) -> Vec<u32> {
    tokens.iter().map(|(t, _)| t.id()).collect()
}

/// An added token next to itself, to text and to whitespace on both sides (where `lstrip`,
/// `rstrip`, `single_word` and `normalized` show).
fn added_token_probe(token: &str) -> String {
    format!("{token}{token} x{token}y {token}\n\n{token}  {token}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::tokenizer::tests::gpt2;

    fn load(path: &std::path::Path) -> (serde_json::Value, tokenizers::Tokenizer) {
        let bytes = std::fs::read(path).unwrap();
        (serde_json::from_slice(&bytes).unwrap(), tokenizers::Tokenizer::from_bytes(&bytes).unwrap())
    }

    #[test]
    fn byte_level_files_are_refused_with_the_reason() {
        for name in ["tokenizer-gpt2.json", "tokenizer-clip.json"] {
            let (json, reference) = load(&gpt2().with_file_name(name));
            let why = V1::admit(&json, &reference).err().unwrap();
            assert!(why.contains("byte-level"), "{name}: {why}");
        }
    }

    #[test]
    fn regexes_with_engine_dependent_classes_are_found() {
        let file = |p: &str| {
            serde_json::json!({"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Replace", "pattern": {"Regex": p}, "content": " "}]}})
        };
        assert_eq!(engine_dependent_regex(&file(" {2,}")), None);
        assert_eq!(engine_dependent_regex(&file("[ab]+|c")), None);
        for p in ["\\p{L}+", "\\s+", "(?i:'s)", "[[:alpha:]]", "x\\b"] {
            assert_eq!(engine_dependent_regex(&file(p)), Some(p), "{p}");
        }
    }
}
