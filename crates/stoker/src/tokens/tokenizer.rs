//! The HuggingFace `tokenizers` crate behind one small type: a `tokenizer.json` loaded once,
//! cloned for each worker thread (one instance per thread: a shared instance's
//! `encode_batch` scales badly past a few cores), encoding without character offsets.
//! A byte-level BPE file that [`super::bpe`] reproduces exactly (GPT-2's, GPT-NeoX's, Llama 3's
//! or Qwen2's kind) is encoded by that fast path instead, and a file that `tokenizers` 1.0
//! encodes with 0.22's ids ([`super::tokenizer_v1`]: Llama 2's, WordPiece, Unigram) by 1.0;
//! [`TextTokenizer::engine`] says which path a file got and why.

use super::bpe::BpeModel;
use super::tokenizer_v1::V1;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Names tried, in order, for the end-of-sequence token when none is given.
const EOS_NAMES: [&str; 5] = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[SEP]"];
/// Names tried, in order, for the beginning-of-sequence token when none is given.
const BOS_NAMES: [&str; 5] = ["<s>", "<|begin_of_text|>", "<bos>", "[CLS]", "<|endoftext|>"];

/// A loaded tokenizer and the special ids stoker adds around documents.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// stoker's own encoder, when the file is one it reproduces exactly.
    fast: Option<Arc<BpeModel>>,
    /// Special added tokens are encoded as the text they spell
    /// ([`TextTokenizer::with_special_tokens_as_text`]).
    specials_as_text: bool,
    /// `tokenizers` 1.0, when the fast path does not take the file and 1.0 gives 0.22's ids.
    v1: Option<V1>,
    /// Why the file got its engine.
    why: Arc<str>,
    /// The ids the post-processor puts before and after a text's ids, when it only puts ids
    /// around them ([`super::bpe::around`]): what [`TextTokenizer::encode_text_into`] leaves out.
    around: Option<Arc<(Vec<u32>, Vec<u32>)>>,
    /// The file it came from (or `<json>`).
    pub origin: PathBuf,
    /// A hash of its JSON, for fingerprints and caches.
    pub hash: u64,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer").field("origin", &self.origin).field("engine", &self.engine()).finish()
    }
}

impl TextTokenizer {
    /// Loads a `tokenizer.json`; a missing or malformed file is a config error naming it.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_json(&Self::read(path)?, path)
    }

    /// The bytes of the `tokenizer.json` at `path`; a missing or unreadable file is a config
    /// error naming it.
    pub fn read(path: &Path) -> Result<Vec<u8>> {
        std::fs::read(path).map_err(|e| Error::config("tokenizer", format!("{}: {e}", path.display())))
    }

    /// Loads a tokenizer from its JSON (`origin` names it in errors).
    pub fn from_json(json: &[u8], origin: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| {
            Error::config("tokenizer", format!("{}: not a valid tokenizer.json: {e}", origin.display()))
        })?;
        let hash = xxhash_rust::xxh3::xxh3_64(json);
        let json = serde_json::from_slice::<serde_json::Value>(json).map_err(|e| e.to_string());
        let around = super::bpe::around(&inner).ok().map(Arc::new);
        let (mut fast, mut v1) = (None, None);
        let why = match json.as_ref().map_err(Clone::clone).and_then(|j| BpeModel::from_json(j, &inner)) {
            Ok(m) => {
                let why = m.describe();
                fast = Some(Arc::new(m));
                why
            }
            Err(why) => match json.as_ref().map_err(Clone::clone).and_then(|j| V1::admit(j, &inner)) {
                Ok(one) => {
                    v1 = Some(one);
                    format!("{why}; tokenizers 1.0 gives 0.22's ids on the probe")
                }
                Err(not) => format!("{why}; {not}"),
            },
        };
        Ok(TextTokenizer {
            inner,
            fast,
            specials_as_text: false,
            v1,
            why: why.into(),
            around,
            origin: origin.to_path_buf(),
            hash,
        })
    }

    /// Which encoder this file got, `"stoker byte-level BPE"`, `"tokenizers 1.0"` or
    /// `"tokenizers"` (0.22), and why.
    pub fn engine(&self) -> (&'static str, &str) {
        let name = match (&self.fast, &self.v1) {
            (Some(_), _) => "stoker byte-level BPE",
            (None, Some(_)) => "tokenizers 1.0",
            (None, None) => "tokenizers",
        };
        (name, &self.why)
    }

    /// Whether worker threads may share this one instance: stoker's own encoder takes `&self`
    /// and keeps its caches per thread, and 1.0 keeps its scratch in a pool of shards, so both
    /// scale on one instance; the 0.22 crate does not (see the module's note), and each thread
    /// then takes its own clone (a clone copies the whole vocabulary and merges: tens of
    /// milliseconds for GPT-2's).
    pub fn shares_across_threads(&self) -> bool {
        self.fast.is_some() || self.v1.is_some()
    }

    /// The same tokenizer on the `tokenizers` crate 0.22 alone (for comparisons and benchmarks).
    pub fn without_fast_path(&self) -> Self {
        TextTokenizer {
            fast: None,
            specials_as_text: false,
            v1: None,
            why: "fast paths turned off by the caller".into(),
            ..self.clone()
        }
    }

    /// The same tokenizer with its special added tokens (`<|endoftext|>`, say) encoded as the
    /// text they spell when a text contains them, as open_clip's tokenizer does; the
    /// post-processor's special tokens are still added. On stoker's encoder where it takes the
    /// mode (every added token of the file special, or none: CLIP's), else on the `tokenizers`
    /// crate 0.22.
    pub fn with_special_tokens_as_text(&self) -> Self {
        let mut inner = self.inner.clone();
        inner.set_encode_special_tokens(true);
        match &self.fast {
            Some(f) if f.encodes_special_tokens_as_text() => {
                TextTokenizer { inner, specials_as_text: true, ..self.clone() }
            }
            _ => TextTokenizer {
                inner,
                fast: None,
                v1: None,
                why: "special tokens are encoded as text".into(),
                ..self.clone()
            },
        }
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary size (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Bytes per stored id in token caches: 2 when every id fits in a `u16`, else 4.
    pub fn id_width(&self) -> u8 {
        if self.vocab_size() <= 1 << 16 {
            2
        } else {
            4
        }
    }

    /// The end-of-sequence id: `name` if given, else the first of the usual names found.
    pub fn eos(&self, name: Option<&str>) -> Result<Option<u32>> {
        self.special(name, &EOS_NAMES, "eos_token")
    }

    /// The beginning-of-sequence id, like [`TextTokenizer::eos`].
    pub fn bos(&self, name: Option<&str>) -> Result<Option<u32>> {
        self.special(name, &BOS_NAMES, "bos_token")
    }

    fn special(&self, name: Option<&str>, usual: &[&str], arg: &str) -> Result<Option<u32>> {
        match name {
            Some(n) => self
                .id_of(n)
                .map(Some)
                .ok_or_else(|| Error::config(arg, format!("{n:?} is not a token of {}", self.origin.display()))),
            None => Ok(usual.iter().find_map(|n| self.id_of(n))),
        }
    }

    /// The ids of `text`, with the tokenizer's own special tokens (its post-processor) and no
    /// character offsets, appended to `out`.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        self.encode_raw(text, true, out)
            .map_err(|e| Error::Internal(format!("{}: cannot encode: {e}", self.origin.display())))
    }

    /// The ids of `text` without the post-processor's special tokens (what `tokenizers` gives
    /// with `add_special_tokens=False`), appended to `out`.
    pub fn encode_text_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        self.encode_raw(text, false, out)
            .map_err(|e| Error::Internal(format!("{}: cannot encode: {e}", self.origin.display())))
    }

    /// The ids of `text` appended to `out`, the post-processor's special tokens with
    /// `specials`; the reason, when the tokenizer cannot encode it. The fast paths always put
    /// the post-processor's ids around the text; without `specials` they are taken off again
    /// (known once per file, and checked on each text), else the text goes to 0.22.
    pub(crate) fn encode_raw(&self, text: &str, specials: bool, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        let around = match (specials, self.around.as_deref()) {
            (true, _) => None,
            (false, Some(a)) => Some(a),
            (false, None) => return self.encode_slow(text, false, out),
        };
        let start = out.len();
        if let Some(fast) = &self.fast {
            fast.encode_into(text, self.specials_as_text, out);
        } else if let Some(v1) = &self.v1 {
            v1.encode_into(text, out)?;
        } else {
            return self.encode_slow(text, specials, out);
        }
        let Some((pre, post)) = around else { return Ok(()) };
        let got = &out[start..];
        if got.len() >= pre.len() + post.len() && got.starts_with(pre) && got.ends_with(post) {
            out.truncate(out.len() - post.len());
            out.drain(start..start + pre.len());
            return Ok(());
        }
        out.truncate(start);
        self.encode_slow(text, false, out)
    }

    /// [`TextTokenizer::encode_raw`] on the `tokenizers` crate 0.22.
    fn encode_slow(&self, text: &str, specials: bool, out: &mut Vec<u32>) -> std::result::Result<(), String> {
        let enc = self.inner.encode_fast(text, specials).map_err(|e| e.to_string())?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The real GPT-2 tokenizer, kept in the repository (`tests/data/text/README.md`).
    pub(crate) fn gpt2() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text/tokenizer-gpt2.json")
    }

    #[test]
    fn gpt2_ids_match_the_reference() {
        let p = gpt2();
        let t = TextTokenizer::from_file(&p).unwrap();
        let mut ids = vec![];
        t.encode_into("Hello world, this is a test.", &mut ids).unwrap();
        assert_eq!(ids, [15496, 995, 11, 428, 318, 257, 1332, 13]);
        assert_eq!(t.eos(None).unwrap(), Some(50256));
        assert_eq!(t.engine().0, "stoker byte-level BPE", "{:?}", t.engine());
        let mut slow = vec![];
        t.without_fast_path().encode_into("Hello world, this is a test.", &mut slow).unwrap();
        assert_eq!(slow, ids);
    }

    #[test]
    fn a_corrupt_tokenizer_is_a_config_error_naming_it() {
        let e = TextTokenizer::from_json(b"{\"model\": 3}", Path::new("/x/tokenizer.json")).unwrap_err().to_string();
        assert!(e.contains("`tokenizer`") && e.contains("/x/tokenizer.json") && e.contains("not a valid"), "{e}");
        let e = TextTokenizer::from_file(Path::new("/no/such/tokenizer.json")).unwrap_err().to_string();
        assert!(e.contains("/no/such/tokenizer.json"), "{e}");
    }
}
