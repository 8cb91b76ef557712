//! The byte-level BPE fast path against the `tokenizers` crate on arbitrary bytes (read as lossy
//! UTF-8): the same ids, for GPT-2's `tokenizer.json` and, when the first byte is odd, for the
//! same vocabulary under Llama 3's pipeline (cl100k's pattern, a `<|endoftext|>` template).
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::OnceLock;
use stoker::tokens::TextTokenizer;

static GPT2: &[u8] = include_bytes!("../../tests/data/text/tokenizer-gpt2.json");
const CL100K: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `(fast, tokenizers)` for each file.
fn pairs() -> &'static [(TextTokenizer, TextTokenizer); 2] {
    static P: OnceLock<[(TextTokenizer, TextTokenizer); 2]> = OnceLock::new();
    P.get_or_init(|| {
        let gpt2: Value = serde_json::from_slice(GPT2).expect("GPT-2 JSON");
        let mut cl = gpt2.clone();
        cl["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": CL100K}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]});
        cl["post_processor"] = json!({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}}});
        [gpt2, cl].map(|j| {
            let t = TextTokenizer::from_json(&serde_json::to_vec(&j).expect("JSON"), Path::new("<fuzz>")).expect("load");
            assert_eq!(t.engine().0, "stoker byte-level BPE", "{:?}", t.engine());
            let slow = t.without_fast_path();
            (t, slow)
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let (fast, slow) = &pairs()[usize::from(data.first().is_some_and(|b| b & 1 == 1))];
    let text = String::from_utf8_lossy(data);
    let (mut a, mut b) = (vec![], vec![]);
    fast.encode_into(&text, &mut a).expect("fast path");
    slow.encode_into(&text, &mut b).expect("tokenizers");
    assert_eq!(a, b, "{text:?}");
});
