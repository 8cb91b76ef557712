//! Exact byte-level BPE: the Rust crates side by side (issue 25, "chosen by measurement").
//!
//! Every document of the shared Wikipedia corpus is decoded into memory first (not timed). The
//! reference ids are the `tokenizers` crate's (`encode_fast`) on a `tokenizer.json`; every other
//! contender's ids are compared with them document by document, and the documents whose ids
//! differ are counted (a contender with any is not exact). Then every contender encodes the whole
//! corpus on this thread in interleaved rounds (A B C ... A B C ...); CPU time is the process's
//! (`getrusage`, user + system, so a crate that used other threads would pay for them too).
//! Medians over the rounds, and each contender's paired ratio to stoker (median of the
//! per-round ratios).
//!
//! Vocabularies: `gpt2` (the shared `tokenizer-gpt2.json`; the other crates get the same ranks,
//! i.e. OpenAI's `r50k_base`), and `cl100k`/`o200k` (the ranks shipped by `bpe-openai`, which
//! equal tiktoken's; `tokenizers` and stoker get a `tokenizer.json` built from them here: the
//! byte-level vocabulary, merges recovered by running BPE on each token with the lower ranks, the
//! pattern as Llama 3's / GPT-4o's files write it, Split + ByteLevel, `ignore_merges`).
//!
//! `--vocab deepseek`: GPT-2's vocabulary under DeepSeek-V3's three `Split`s (stoker matches
//! them with Oniguruma, as `tokenizers` does), stoker and `tokenizers` only.
//!
//! `--vocab clip`: CLIP's own file (`tests/data/text/tokenizer-clip.json`: NFC, whitespace
//! runs as one space, lowercase, CLIP's pattern, `</w>`), stoker and `tokenizers` only.
//!
//! `--captions`: each document is cut into caption-like texts first (its lines cut at ". ",
//! those of 20 to 300 bytes kept), as image-text pairs' captions are.
//!
//! `bpe_crates [--vocab gpt2,cl100k,o200k,deepseek,clip] [--shards N] [--rounds R] [--only NAMES]
//! [--captions] [TEXT_DIR]` (defaults: the first three, every shard, 3 rounds, every contender,
//! `/work/shared/text`; `--only stoker,1.0` keeps the contenders whose names hold one of the
//! comma-separated parts).

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use base64::Engine as _;
use serde_json::{json, Value};
use wordchipper::TokenEncoder as _;

/// cl100k's pattern as Llama 3's `tokenizer.json` writes it.
const CL100K_HF: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k's as GPT-4o's `tokenizer.json` writes it.
const O200K_HF: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
/// tiktoken's own patterns (as `tiktoken-rs` and riptoken's prebuilt DFAs have them).
const R50K_TT: &str = r"'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s";
const CL100K_TT: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s";
const O200K_TT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

use stoker::tokens::bpe::DEEPSEEK_V3_SPLITS as DEEPSEEK_V3;

/// User + system CPU seconds of this process.
fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode`).
fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        };
    }
    out
}

fn to_byte_level(bytes: &[u8], table: &[char; 256]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

/// The ranks (token bytes by id) of a byte-level `tokenizer.json`'s vocabulary.
fn ranks_from_json(j: &Value) -> Vec<Vec<u8>> {
    let table = byte_chars();
    let back: HashMap<char, u8> = table.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
    let vocab = j["model"]["vocab"].as_object().expect("a BPE vocab");
    let mut ranks = vec![Vec::new(); vocab.len()];
    for (s, id) in vocab {
        ranks[id.as_u64().unwrap() as usize] = s.chars().map(|c| back[&c]).collect();
    }
    assert!(ranks.iter().all(|r| !r.is_empty()), "ids are dense");
    // The added tokens at the end (GPT-2's `<|endoftext|>`, 50256) are tiktoken's special tokens,
    // not ranks: `r50k_base` has 50,256 ranks.
    let added: Vec<u64> = j["added_tokens"].as_array().into_iter().flatten().filter_map(|a| a["id"].as_u64()).collect();
    while ranks.len().checked_sub(1).is_some_and(|last| added.contains(&(last as u64))) {
        ranks.pop();
    }
    ranks
}

/// A `tokenizer.json` for tiktoken ranks: byte-level vocabulary, the merges recovered by running
/// BPE on every token with the ranks below its own (the last step is its merge), `pattern` as the
/// Split of a Split + ByteLevel pre-tokenizer, and `ignore_merges` (a piece that is a token is
/// that token, as in tiktoken).
fn json_from_ranks(ranks: &[Vec<u8>], pattern: &str) -> Value {
    let table = byte_chars();
    let rank: HashMap<&[u8], u32> = ranks.iter().enumerate().map(|(i, t)| (t.as_slice(), i as u32)).collect();
    let mut vocab = serde_json::Map::new();
    let mut merges = Vec::new();
    for (id, tok) in ranks.iter().enumerate() {
        vocab.insert(to_byte_level(tok, &table), json!(id));
        if tok.len() < 2 {
            continue;
        }
        let mut parts: Vec<&[u8]> = (0..tok.len()).map(|i| &tok[i..i + 1]).collect();
        loop {
            let mut best: Option<(u32, usize)> = None;
            for i in 0..parts.len() - 1 {
                let joined = &tok[offset(tok, parts[i])..offset(tok, parts[i + 1]) + parts[i + 1].len()];
                if let Some(&r) = rank.get(joined) {
                    if (r as usize) < id && best.is_none_or(|(b, _)| r < b) {
                        best = Some((r, i));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let start = offset(tok, parts[i]);
            let end = offset(tok, parts[i + 1]) + parts[i + 1].len();
            parts[i] = &tok[start..end];
            parts.remove(i + 1);
        }
        if parts.len() == 2 {
            merges.push(json!(format!("{} {}", to_byte_level(parts[0], &table), to_byte_level(parts[1], &table))));
        }
    }
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": true, "vocab": vocab, "merges": merges}
    })
}

/// Where `part` (a subslice of `whole`) starts in it.
fn offset(whole: &[u8], part: &[u8]) -> usize {
    part.as_ptr() as usize - whole.as_ptr() as usize
}

/// The message of a caught panic.
fn panic_text(e: Box<dyn std::any::Any + Send>) -> String {
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panic".into())
}

type Encode = Box<dyn Fn(&str, &mut Vec<u32>)>;

struct Contender {
    name: String,
    encode: Encode,
}

fn load_texts(dir: &Path, max_shards: usize) -> (Vec<String>, Vec<String>) {
    let mut shards: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("TEXT_DIR").filter_map(|e| e.ok().map(|e| e.path())).collect();
    shards.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("wiki-en-2015-") && n.ends_with(".jsonl.zst"))
    });
    shards.sort();
    shards.truncate(max_shards);
    let mut texts = Vec::new();
    for s in &shards {
        let raw = zstd::decode_all(std::fs::File::open(s).expect("open shard")).expect("decompress shard");
        for line in raw.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let v: Value = serde_json::from_slice(line).expect("a JSON line");
            texts.push(v["text"].as_str().expect("a text field").to_string());
        }
    }
    let names = shards.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    (texts, names)
}

/// The contenders for one vocabulary; a crate that cannot be built for it is reported and left out.
fn contenders(vocab: &str, dir: &Path) -> (tokenizers::Tokenizer, Vec<Contender>, Vec<String>) {
    let mut notes = Vec::new();
    // Ranks and the `tokenizer.json` that `tokenizers` and stoker load.
    let (ranks, json, tt_pattern, lookahead): (Vec<Vec<u8>>, Value, &str, Vec<(String, bool)>) = match vocab {
        "clip" => {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/text/tokenizer-clip.json");
            (vec![], serde_json::from_slice(&std::fs::read(path).expect("tokenizer-clip.json")).unwrap(), "", vec![])
        }
        "deepseek" => {
            // GPT-2's vocabulary under DeepSeek-V3's pre-tokenizer (three Splits in sequence) and
            // empty normalizer Sequence: stoker and `tokenizers` only (no other crate reads it).
            let mut j: Value =
                serde_json::from_slice(&std::fs::read(dir.join("tokenizer-gpt2.json")).expect("tokenizer-gpt2.json"))
                    .unwrap();
            j["normalizer"] = json!({"type": "Sequence", "normalizers": []});
            let mut list: Vec<Value> = DEEPSEEK_V3
                .iter()
                .map(|p| json!({"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false}))
                .collect();
            list.push(
                json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}),
            );
            j["pre_tokenizer"] = json!({"type": "Sequence", "pretokenizers": list});
            (vec![], j, "", vec![])
        }
        "gpt2" => {
            let j: Value =
                serde_json::from_slice(&std::fs::read(dir.join("tokenizer-gpt2.json")).expect("tokenizer-gpt2.json"))
                    .unwrap();
            // bpe-openai's look-ahead form of GPT-2's pattern (as it writes cl100k's): `\s+(?!\S)`
            // becomes `\s+\s` minus its last character, plus `\s+$`.
            let la = vec![
                (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+$".to_string(), false),
                (r"\s+\s".to_string(), true),
                (r"\s+".to_string(), false),
            ];
            (ranks_from_json(&j), j, R50K_TT, la)
        }
        "cl100k" | "o200k" => {
            let t = if vocab == "cl100k" { bpe_openai::cl100k_base() } else { bpe_openai::o200k_base() };
            let ranks: Vec<Vec<u8>> = (0..t.bpe.num_tokens() as u32).map(|i| t.bpe.token_bytes(i).to_vec()).collect();
            let (hf, tt) = if vocab == "cl100k" { (CL100K_HF, CL100K_TT) } else { (O200K_HF, O200K_TT) };
            (ranks.clone(), json_from_ranks(&ranks, hf), tt, vec![])
        }
        other => panic!("--vocab {other}: gpt2, cl100k, o200k, deepseek or clip"),
    };
    let bytes = serde_json::to_vec(&json).unwrap();
    let reference = tokenizers::Tokenizer::from_bytes(&bytes).expect("tokenizers loads the file");
    let mut out: Vec<Contender> = Vec::new();

    let floor = tokenizers::Tokenizer::from_bytes(&bytes).unwrap();
    out.push(Contender {
        name: "tokenizers 0.22.2 (encode_fast)".into(),
        encode: Box::new(move |t, ids| ids.extend_from_slice(floor.encode_fast(t, true).unwrap().get_ids())),
    });

    // `tokenizers` 1.0: the file upgraded to its format, then `encode_into` (ids only).
    let one = serde_json::from_slice::<Value>(&bytes)
        .map_err(|e| e.to_string())
        .and_then(|mut v| tokenizers1::canonicalize_value(&mut v).map(|_| v).map_err(|e| e.to_string()))
        .and_then(|v| tokenizers1::from_json(&v.to_string()).map_err(|e| e.to_string()));
    // A file that loads but cannot encode (CLIP's in 1.0.0-rc.3: its inverted `Split` has no
    // regex backend) is left out with the reason.
    let one = one.and_then(|one| {
        let mut probe = Vec::new();
        one.encode_into("a probe", &tokenizers1::pipeline::EncodeOptions::default(), &mut probe)
            .map(|_| one)
            .map_err(|e| format!("cannot encode: {e}"))
    });
    match one {
        Ok(one) => {
            let opts = tokenizers1::pipeline::EncodeOptions::default();
            // One buffer reused across documents, as stoker's caller reuses its own.
            let buf = std::cell::RefCell::new(Vec::<tokenizers1::pipeline::PipelineToken>::new());
            out.push(Contender {
                name: "tokenizers 1.0.0-rc.3 (encode_into)".into(),
                encode: Box::new(move |t, ids| {
                    let mut v = buf.borrow_mut();
                    v.clear();
                    one.encode_into(t, &opts, &mut v).unwrap();
                    ids.extend_from_slice(tokenizers1::pipeline::PipelineToken::cast_slice(&v));
                }),
            });
        }
        Err(e) => notes.push(format!("tokenizers 1.0.0-rc.3: {e}")),
    }

    let ours = stoker::tokens::TextTokenizer::from_json(&bytes, Path::new("<bench>")).expect("stoker loads the file");
    assert_eq!(ours.engine().0, "stoker byte-level BPE", "{:?}", ours.engine());
    notes.push(format!("stoker: {:?}", ours.engine()));
    out.push(Contender {
        name: "stoker (this repo)".into(),
        encode: Box::new(move |t, ids| ours.encode_into(t, ids).unwrap()),
    });

    if vocab == "deepseek" || vocab == "clip" {
        return (reference, out, notes);
    }
    let tk = match vocab {
        "gpt2" => tiktoken_rs::r50k_base(),
        "cl100k" => tiktoken_rs::cl100k_base(),
        _ => tiktoken_rs::o200k_base(),
    };
    match tk {
        Ok(tk) => out.push(Contender {
            name: "tiktoken-rs 0.12.1 (encode_ordinary)".into(),
            encode: Box::new(move |t, ids| ids.extend(tk.encode_ordinary(t))),
        }),
        Err(e) => notes.push(format!("tiktoken-rs: {e}")),
    }

    // bpe-openai: its own cl100k/o200k; for GPT-2 (not shipped) the same Tokenizer type built here
    // from the ranks with the `bpe` crate, the way its build script builds the others.
    let gems = match vocab {
        "cl100k" => Ok(("bpe-openai 0.3.2 (cl100k_base)", None)),
        "o200k" => Ok(("bpe-openai 0.3.2 (o200k_base)", None)),
        _ => {
            let r = ranks.clone();
            let la = lookahead.clone();
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let built = catch_unwind(AssertUnwindSafe(move || {
                let bpe = bpe::byte_pair_encoding::BytePairEncoding::from_dictionary(r, Some(17846336922010275747));
                let pats: Vec<(&str, bool)> = la.iter().map(|(p, b)| (p.as_str(), *b)).collect();
                bpe_openai::Tokenizer::new_lookahead(bpe, &pats, false).expect("regex builds")
            }));
            std::panic::set_hook(hook);
            built.map(|t| ("bpe-openai 0.3.2 + bpe 0.2.3 (GPT-2 ranks, built here)", Some(t))).map_err(panic_text)
        }
    };
    match gems {
        Ok((name, Some(t))) => {
            out.push(Contender { name: name.into(), encode: Box::new(move |s, ids| ids.extend(t.encode(s))) })
        }
        Ok((name, None)) => {
            let t = if vocab == "cl100k" { bpe_openai::cl100k_base() } else { bpe_openai::o200k_base() };
            out.push(Contender { name: name.into(), encode: Box::new(move |s, ids| ids.extend(t.encode(s))) })
        }
        Err(e) => notes.push(format!("bpe-openai/bpe with GPT-2's ranks: cannot be built: {e}")),
    }

    let encoder: rustc_hash::FxHashMap<Vec<u8>, u32> =
        ranks.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    match riptoken::CoreBPE::new(encoder, Default::default(), tt_pattern) {
        Ok(rt) => out.push(Contender {
            name: "riptoken 0.3.0 (encode_ordinary)".into(),
            encode: Box::new(move |t, ids| ids.extend(rt.encode_ordinary(t))),
        }),
        Err(e) => notes.push(format!("riptoken: {e:?}")),
    }

    // wordchipper: its OpenAI factory (pattern, accelerated lexer) over the same ranks, read
    // from tiktoken's base64 format in memory (no download).
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut tiktoken_text = String::new();
    for (i, t) in ranks.iter().enumerate() {
        tiktoken_text.push_str(&format!("{} {i}\n", b64.encode(t)));
    }
    let which = match vocab {
        "gpt2" => wordchipper::pretrained::openai::OATokenizer::R50kBase,
        "cl100k" => wordchipper::pretrained::openai::OATokenizer::Cl100kBase,
        _ => wordchipper::pretrained::openai::OATokenizer::O200kBase,
    };
    match which.read_vocab::<u32>(&mut std::io::Cursor::new(tiktoken_text.into_bytes())) {
        Ok(v) => {
            let wc = wordchipper::TokenizerOptions::default().build(Arc::new(v));
            out.push(Contender {
                name: "wordchipper 0.9.2 (try_encode_append)".into(),
                encode: Box::new(move |t, ids| wc.try_encode_append(t, ids, None).unwrap()),
            });
        }
        Err(e) => notes.push(format!("wordchipper: {e}")),
    }
    (reference, out, notes)
}

/// Hostile text, for the exactness check only (not timed): every Unicode scalar value in three
/// contexts (run together, each after a space, each before `a1 `), in documents of 256, and
/// 3,000 documents drawn from pieces that pre-tokenizers get wrong (Unicode spaces, line and
/// paragraph separators, `\r\n`, combining marks, contractions in both cases, digits of other
/// scripts, CJK, emoji with modifiers, private use, the last scalar value).
fn hostile() -> Vec<String> {
    let all: Vec<char> = (0..=0x10FFFFu32).filter_map(char::from_u32).collect();
    let mut docs = Vec::new();
    for block in all.chunks(256) {
        docs.push(block.iter().collect());
        docs.push(block.iter().flat_map(|&c| [' ', c]).collect());
        docs.push(block.iter().map(|&c| format!("{c}a1 ")).collect());
    }
    const PIECES: &[&str] = &[
        "a",
        "Z",
        "word",
        " the",
        "é",
        "e\u{301}",
        "\u{301}",
        "ß",
        "İ",
        "Σ",
        "ς",
        "ǅ",
        "中",
        "文字",
        "ー",
        "ア",
        "한",
        "🙂",
        "👍🏽",
        "\u{200d}",
        "١٢٣",
        "5",
        "0123",
        "½",
        "Ⅻ",
        "²",
        "𝔘",
        " ",
        "  ",
        "   ",
        "\t",
        "\n",
        "\n\n",
        "\r\n",
        "\r",
        "\u{a0}",
        "\u{2009}",
        "\u{3000}",
        "\u{2028}",
        "\u{2029}",
        "\u{85}",
        "\u{b}",
        "\u{c}",
        "'",
        "'s",
        "'S",
        "'ll",
        "'LL",
        "'Re",
        "’",
        "\"",
        ".",
        ",",
        "!?",
        "/",
        "-",
        "_",
        "...",
        "\u{0}",
        "\u{7f}",
        "\u{feff}",
        "\u{fffd}",
        "\u{e000}",
        "\u{10ffff}",
        "x/",
        "/\n",
        "ǲ",
        "ǈ",
        "ʰ",
        "ـ",
        "ก",
        "่",
    ];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..3000 {
        let len = 1 + next(120);
        docs.push((0..len).map(|_| PIECES[next(PIECES.len())]).collect());
    }
    docs
}

fn main() {
    let mut vocabs = vec!["gpt2".to_string(), "cl100k".into(), "o200k".into()];
    let (mut shards, mut rounds, mut dir) = (usize::MAX, 3usize, PathBuf::from("/work/shared/text"));
    // Contenders to run, by part of their names (all when empty).
    let mut only: Vec<String> = vec![];
    let mut captions = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--vocab" => vocabs = args.next().unwrap().split(',').map(String::from).collect(),
            "--shards" => shards = args.next().unwrap().parse().unwrap(),
            "--rounds" => rounds = args.next().unwrap().parse().unwrap(),
            "--only" => only = args.next().unwrap().split(',').map(String::from).collect(),
            "--captions" => captions = true,
            "--bench" => {}
            _ => dir = PathBuf::from(a),
        }
    }
    let (mut texts, names) = load_texts(&dir, shards);
    if captions {
        texts = texts
            .iter()
            .flat_map(|t| t.lines().flat_map(|l| l.split(". ")))
            .filter(|c| (20..=300).contains(&c.len()))
            .map(String::from)
            .collect();
    }
    let bytes: usize = texts.iter().map(String::len).sum();
    println!(
        "corpus: {} ({} {}, {:.1} MB of text), {rounds} rounds",
        names.join(" "),
        texts.len(),
        if captions { "captions" } else { "documents" },
        bytes as f64 / 1e6
    );

    for vocab in &vocabs {
        let t0 = Instant::now();
        let (reference, mut cs, notes) = contenders(vocab, &dir);
        cs.retain(|c| only.is_empty() || only.iter().any(|o| c.name.contains(o.as_str())));
        println!("\n## {vocab} (setup {:.1} s)", t0.elapsed().as_secs_f64());
        for n in &notes {
            println!("note: {n}");
        }
        // Reference ids, then every contender's, document by document (untimed).
        let want: Vec<Vec<u32>> =
            texts.iter().map(|t| reference.encode_fast(t.as_str(), true).unwrap().get_ids().to_vec()).collect();
        let tokens: usize = want.iter().map(Vec::len).sum();
        let mut exact = Vec::new();
        let mut hostile_bad = Vec::new();
        let mut ids = Vec::new();
        for c in &cs {
            let (mut bad, mut first) = (0usize, None);
            for (i, t) in texts.iter().enumerate() {
                ids.clear();
                (c.encode)(t, &mut ids);
                if ids != want[i] {
                    bad += 1;
                    if first.is_none() {
                        let at =
                            ids.iter().zip(&want[i]).position(|(a, b)| a != b).unwrap_or(ids.len().min(want[i].len()));
                        let lo = at.saturating_sub(3);
                        first = Some(format!(
                            "doc {i} token {at}: got {:?} want {:?}",
                            &ids[lo..(at + 4).min(ids.len())],
                            &want[i][lo..(at + 4).min(want[i].len())]
                        ));
                    }
                }
            }
            println!(
                "ids: {:<55} {} of {} documents differ from tokenizers{}",
                c.name,
                bad,
                texts.len(),
                first.map(|f| format!(" (first: {f})")).unwrap_or_default()
            );
            exact.push(bad);
        }
        println!("reference: {tokens} tokens");
        let hard = hostile();
        let hard_want: Vec<Vec<u32>> =
            hard.iter().map(|t| reference.encode_fast(t.as_str(), true).unwrap().get_ids().to_vec()).collect();
        for c in &cs {
            let mut bad = Vec::new();
            for (t, want) in hard.iter().zip(&hard_want) {
                ids.clear();
                (c.encode)(t, &mut ids);
                if &ids != want {
                    bad.push(t);
                }
            }
            println!("hostile: {:<55} {} of {} documents differ from tokenizers", c.name, bad.len(), hard.len());
            for t in bad.iter().take(4) {
                // The shortest prefix (by chars) whose ids already differ.
                let chars: Vec<(usize, char)> = t.char_indices().collect();
                let end = (1..=chars.len())
                    .map(|n| chars.get(n).map_or(t.len(), |c| c.0))
                    .find(|&e| {
                        ids.clear();
                        (c.encode)(&t[..e], &mut ids);
                        ids.as_slice() != reference.encode_fast(&t[..e], true).unwrap().get_ids()
                    })
                    .unwrap_or(t.len());
                let from = t[..end].char_indices().rev().nth(11).map_or(0, |c| c.0);
                ids.clear();
                (c.encode)(&t[..end], &mut ids);
                let want = reference.encode_fast(&t[..end], true).unwrap().get_ids().to_vec();
                println!(
                    "  e.g. text ending {:?}: got {:?}, want {:?}",
                    &t[from..end],
                    &ids[ids.len().saturating_sub(4)..],
                    &want[want.len().saturating_sub(4)..]
                );
            }
            hostile_bad.push(bad.len());
        }

        let mut cpu = vec![Vec::new(); cs.len()];
        for round in 0..rounds {
            for (k, c) in cs.iter().enumerate() {
                let (c0, w0) = (cpu_seconds(), Instant::now());
                let mut n = 0usize;
                for t in &texts {
                    ids.clear();
                    (c.encode)(t, &mut ids);
                    n += ids.len();
                }
                let (s, w) = (cpu_seconds() - c0, w0.elapsed().as_secs_f64());
                println!(
                    "round {round} {:<55} {s:7.3} CPU-s {w:7.3} s wall {:6.2} M tokens/CPU-s",
                    c.name,
                    n as f64 / s / 1e6
                );
                cpu[k].push(s);
            }
        }
        let ours = cs.iter().position(|c| c.name.starts_with("stoker")).unwrap();
        println!("\n| encoder ({vocab}, one thread) | exact on the corpus (documents differing) | hostile documents differing | CPU-s per corpus (rounds) | median CPU-s | M tokens / CPU-s | MB / CPU-s | stoker's speed over it (paired median) |");
        println!("|---|---|---|---|---|---|---|---|");
        for (k, c) in cs.iter().enumerate() {
            let m = median(cpu[k].clone());
            let ratio = median(cpu[k].iter().zip(&cpu[ours]).map(|(a, b)| a / b).collect());
            println!(
                "| {} | {} | {} | {} | {m:.2} | {:.2} | {:.1} | {ratio:.2}x |",
                c.name,
                if exact[k] == 0 { "yes (0)".to_string() } else { format!("**no ({})**", exact[k]) },
                hostile_bad[k],
                cpu[k].iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>().join(", "),
                tokens as f64 / m / 1e6,
                bytes as f64 / m / 1e6,
            );
        }
    }
}
