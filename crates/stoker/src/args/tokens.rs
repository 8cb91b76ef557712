//! The token loader's rule book: its arguments ([`token_config`]), the size of its batches
//! ([`token_values`]) and the state a user hands back to it ([`token_state`]).

use super::env::{apply_env, budget_registry_path, Env};
use super::shared::{cache, common, ranks, trace};
use super::state::{read_state, ReadState, Saved};
use super::{Args, Taker};
use crate::error::{Error, Result};
use crate::tokens::pack::Resume;
use crate::tokens::pipeline::{MixFingerprint, MixState, TokenMix, Tokens};
use crate::tokens::{Elastic, PackMode, TokenConfig, TokenFingerprint, TokenState};
use crate::values::{boolean, bounded, bytes, cpu_budget, non_negative, positive, shown, text, token_values, unsigned};
use serde_json::Value;
use std::path::PathBuf;

/// The most documents a best-fit block may hold (its plan is quadratic in the worst case).
pub const MAX_PACK_WINDOW: usize = 1 << 16;

/// A token mixture (see `args::mixture`): each source's `data` (a path, glob, folder or URL,
/// or a list of them) and `text_key`; its epoch is `epoch_items` rows over all ranks (a text's
/// row count is known only once tokenized), or, with a source that stops it
/// (`exhausted: stop`), until that source's pass runs out (at most `epoch_items` when given).
fn token_mixture(v: &Value) -> Result<crate::tokens::pipeline::TokenMixture> {
    let (spec, sources) = super::mixture::mixture(v)?;
    let stops = spec.parts.iter().any(|p| p.exhausted == crate::shell::mix::Exhausted::Stop);
    if spec.epoch_items.is_none() && !stops {
        return Err(Error::config(
            "epoch_items",
            "a token mixture needs its epoch's length: epoch_items rows (sequences) over all ranks, or a source \
             that ends it (exhausted='stop')",
        ));
    }
    let mut out = Vec::with_capacity(sources.len());
    for mut s in sources {
        let data = s.paths("data", "expected a path, a glob, a folder or a URL, or a list of them")?;
        let key = match s.take("text_key") {
            None => None,
            Some(Value::String(k)) => Some(k),
            Some(v) => return Err(s.error("text_key", format!("expected a JSON key, got {}", shown(&v)))),
        };
        s.finish()?;
        out.push((data, key));
    }
    Ok(crate::tokens::pipeline::TokenMixture { spec, sources: out })
}

/// A [`TokenConfig`] and the tokenizer file from named arguments: `tokenizer` (a path; none
/// for token files), `seq_len` (default 2048), `batch_size` (default 8), `pack` (`concat`,
/// `best_fit`), `pack_window`, `shuffle`, `seed`, `drop_last`, `rank`, `world_size`,
/// `infinite`, `shuffle_window`, `threads` (a number, or `auto`: autotuned within `cpu_budget`
/// cores), `cpu_budget`, `prefetch`, `memory_limit`,
/// `max_document_bytes`, `text_key`, `document` (`file`, `line`: plain text), `token_bytes`
/// (2, 4: `.bin` files), `add_bos`, `add_eos`, `bos_token`, `eos_token`, `eos_id`, `pad_id`,
/// `on_bad_document` (`skip`, `raise`), `max_failures` (a count), `index_cache` (a directory,
/// or `False`; default [`super::index_dir`]), `cache` (`"ram"` or a directory: the automatic token
/// cache) and `cache_bytes` (its byte budget), as for images.
pub fn token_config(args: Args) -> Result<(TokenConfig, Option<PathBuf>)> {
    token_config_in(args, &apply_env()?)
}

/// [`token_config`] with the environment `env`.
pub(super) fn token_config_in(args: Args, env: &Env) -> Result<(TokenConfig, Option<PathBuf>)> {
    let mut a = Taker::new(args);
    let tokenizer = match a.take("tokenizer") {
        None | Some(Value::Null) => None,
        Some(v) => Some(PathBuf::from(text("tokenizer", &v, "the path of a tokenizer.json")?)),
    };
    let seq_len = a.typed("seq_len").map(|v| positive("seq_len", &v)).transpose()?.unwrap_or(2048);
    let batch_size = a.typed("batch_size").map(|v| positive("batch_size", &v)).transpose()?.unwrap_or(8);
    token_values(batch_size, seq_len)?;
    let mut c = TokenConfig::new(batch_size, seq_len);
    c.cpu_registry = budget_registry_path(&env.budget);
    if let Some(v) = a.take("pack") {
        c.pack = match text("pack", &v, "'concat' or 'best_fit'")? {
            "concat" => PackMode::Concat,
            "best_fit" => PackMode::BestFit,
            other => return Err(Error::config("pack", format!("expected 'concat' or 'best_fit', got {other:?}"))),
        };
    }
    let int = |a: &mut Taker, k: &str| a.typed(k).map(|v| positive(k, &v)).transpose();
    if let Some(v) = a.typed("pack_window") {
        c.pack_window = bounded("pack_window", &v, MAX_PACK_WINDOW, "documents")? as u64;
    }
    if let Some(n) = int(&mut a, "shuffle_window")? {
        c.shuffle_window = n as u64;
    }
    let flag = |a: &mut Taker, k: &str| a.typed(k).map(|v| boolean(k, &v)).transpose();
    c.shuffle = flag(&mut a, "shuffle")?.unwrap_or(false);
    c.drop_last = flag(&mut a, "drop_last")?.unwrap_or(false);
    c.infinite = flag(&mut a, "infinite")?.unwrap_or(false);
    c.add_bos = flag(&mut a, "add_bos")?.unwrap_or(false);
    c.add_eos = flag(&mut a, "add_eos")?.unwrap_or(true);
    c.seed = a.typed("seed").map(|v| non_negative("seed", &v)).transpose()?.unwrap_or(0);
    (c.rank, c.world_size) = ranks(&mut a, env)?;
    let (threads, prefetch, memory_limit) = common(&mut a, env)?;
    c.threads = threads;
    c.cpu_budget = a.typed("cpu_budget").map(|v| cpu_budget("cpu_budget", &v)).transpose()?;
    if c.cpu_budget.is_some() && c.threads.is_some() {
        return Err(Error::config("cpu_budget", "bounds threads='auto': give threads='auto' or no cpu_budget"));
    }
    c.prefetch =
        prefetch.ok_or_else(|| Error::config("prefetch", "'auto' is for image loaders; give TokenLoader a number"))?;
    c.memory_limit = memory_limit;
    if let Some(v) = a.typed("max_document_bytes") {
        c.max_document_bytes = bytes("max_document_bytes", &v)?;
        if c.max_document_bytes == 0 {
            return Err(Error::config("max_document_bytes", "must be at least 1 byte"));
        }
    }
    if let Some(v) = a.take("text_key") {
        c.text_key = text("text_key", &v, "the JSON key of the text")?.to_string();
    }
    if let Some(v) = a.take("document") {
        c.lines = match text("document", &v, "'file' or 'line'")? {
            "file" => false,
            "line" => true,
            other => return Err(Error::config("document", format!("expected 'file' or 'line', got {other:?}"))),
        };
    }
    if let Some(v) = a.typed("token_bytes") {
        c.token_bytes = match unsigned("token_bytes", &v, "2 or 4")? {
            2 => 2,
            4 => 4,
            n => return Err(Error::config("token_bytes", format!("expected 2 (uint16) or 4 (uint32), got {n}"))),
        };
    }
    let name = |a: &mut Taker, k: &str| -> Result<Option<String>> {
        match a.take(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(text(k, &v, "a token's text")?.to_string())),
        }
    };
    c.bos_token = name(&mut a, "bos_token")?;
    c.eos_token = name(&mut a, "eos_token")?;
    let id = |a: &mut Taker, k: &str| -> Result<Option<u32>> {
        match a.typed(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                let n = non_negative(k, &v)?;
                u32::try_from(n)
                    .map(Some)
                    .map_err(|_| Error::config(k, format!("{n} is not a token id (at most 2^32 - 1)")))
            }
        }
    };
    c.eos_id = id(&mut a, "eos_id")?;
    c.pad_id = id(&mut a, "pad_id")?;
    if let Some(v) = a.take("on_bad_document") {
        c.raise = match text("on_bad_document", &v, "'skip' or 'raise'")? {
            "skip" => false,
            "raise" => true,
            other => {
                return Err(Error::config("on_bad_document", format!("expected 'skip' or 'raise', got {other:?}")))
            }
        };
    }
    if let Some(v) = a.typed("max_failures") {
        c.max_failures = match v {
            Value::Null => u64::MAX,
            v => non_negative("max_failures", &v)?,
        };
    }
    c.trace = trace(&mut a)?;
    let spec = cache(&mut a, env)?;
    if spec.as_ref().is_some_and(|s| s.max_side.is_some()) {
        return Err(Error::config("cache_max_side", "is for decoded images: a token cache stores whole documents"));
    }
    c.cache = spec.map(|s| s.store());
    c.index_dir = match a.take("index_cache") {
        None | Some(Value::Null) => env.index_dir.clone(),
        Some(Value::Bool(false)) => None,
        Some(v) => match text("index_cache", &v, "a directory, or False")? {
            "off" | "false" | "False" => None,
            d => Some(absolute(PathBuf::from(d))),
        },
    };
    if let Some(v) = a.take("mixture") {
        c.mixture = Some(token_mixture(&v)?);
        if c.trace.is_some() {
            return Err(Error::config(
                "trace",
                "a token mixture records no trace yet: trace one source's loader alone",
            ));
        }
        if c.infinite {
            return Err(Error::config(
                "infinite",
                "a token mixture's epoch is epoch_items rows, or ends with a source that stops it: give the rows you train on",
            ));
        }
    }
    a.finish()?;
    Ok((c, tokenizer))
}

/// `p` made absolute against the current directory (kept as given where that is unknown).
fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        return p;
    }
    std::env::current_dir().map(|c| c.join(&p)).unwrap_or(p)
}

/// How many resumes on other ranks a state may chain within one epoch.
const MAX_ELASTIC_DEPTH: usize = 32;
/// The most ranks a saved run may have had.
const MAX_RANKS: usize = 1 << 20;

/// Checks an elastic base from a saved state (and its own bases): one position per saved
/// rank, all in one epoch, delivered lists no longer than a block can be, a bounded chain.
fn check_elastic(e: &crate::tokens::Elastic, depth: usize) -> std::result::Result<(), String> {
    if depth >= MAX_ELASTIC_DEPTH {
        return Err(format!("more than {MAX_ELASTIC_DEPTH} resumes on other ranks chained in one epoch"));
    }
    if e.world_size == 0 || e.world_size > MAX_RANKS || e.at.len() != e.world_size {
        return Err(format!("{} positions for world_size {}: expected one per saved rank", e.at.len(), e.world_size));
    }
    if e.at.iter().any(|a| a.epoch != e.at[0].epoch) {
        return Err("positions of different epochs".into());
    }
    if e.delivered.len() > e.world_size || e.delivered.iter().any(|d| d.len() > MAX_PACK_WINDOW) {
        return Err("a delivered list longer than the saved ranks or a block".into());
    }
    if let Some(b) = &e.base {
        if b.at.first().map(|a| a.epoch) != Some(e.at[0].epoch) {
            return Err("a base of another epoch".into());
        }
        check_elastic(b, depth + 1)?;
    }
    Ok(())
}

/// What a token kind's saved state always has (`what` names the state, `from` the call that
/// gives it): version 1, when it has a version, and a fingerprint, which [`read_state`]
/// compared with the loader's.
fn token_state_basics(s: &Saved<'_>, what: &str, from: &str) -> Result<()> {
    if let Some(v) = s.integer("version", false, 0)?.filter(|&v| v != 1) {
        return Err(Error::config(s.name("version"), format!("expected 1 ({what}), got {v}")));
    }
    if !s.fields.contains_key("fingerprint") {
        return Err(Error::config(s.prefix, format!("has no 'fingerprint': expected a dict from {from}")));
    }
    Ok(())
}

/// A token mixture's state dict (`TokenLoader({...}).state_dict()`): `version` 1, `seed`,
/// `epoch`, `next_batch`, `end` and `offset` (rows per rank of an epoch continued from another
/// number of ranks, and the schedule's rows before it; absent otherwise), and each source's
/// loader state dict under `sources` (`None` before its first row), each read as a token
/// loader's against its source's fingerprint. The fingerprint holds the mixture (names,
/// weights, rows per epoch): a state of another mixture is refused, naming the field.
impl ReadState for TokenMix {
    fn read(s: &Saved<'_>, mine: &MixFingerprint, ranks_may_differ: bool) -> Result<MixState> {
        token_state_basics(s, "a token mixture's state", "TokenLoader({...}).state_dict()")?;
        let int = |k: &str| s.integer(k, true, 0).map(|v| v.unwrap_or_default());
        let sources = &mine.sources;
        let list = match s.fields.get("sources") {
            Some(Value::Array(l)) if l.len() == sources.len() => l,
            other => {
                return Err(Error::config(
                    s.name("sources"),
                    format!(
                        "expected a list of {} sources' states, got {}",
                        sources.len(),
                        other.map_or("none".into(), shown)
                    ),
                ))
            }
        };
        let mut states = Vec::with_capacity(list.len());
        for (d, (v, fp)) in list.iter().zip(sources).enumerate() {
            states.push(match v {
                Value::Null => None,
                v => Some(read_state::<Tokens>(v, fp, &format!("{}[{d}]", s.name("sources")), ranks_may_differ)?.0),
            });
        }
        Ok(MixState {
            seed: int("seed")?,
            epoch: int("epoch")?,
            next_batch: int("next_batch")?,
            sources: states,
            end: s.integer("end", false, 0)?,
            offset: s.integer("offset", false, 0)?.unwrap_or(0),
        })
    }
}

/// A token loader's state dict (`TokenLoader.state_dict()`): `seed`, `epoch`, `next_batch`,
/// `cursor_epoch`, `cursor`, `offset` (non-negative integers), `elastic` (absent, or the saved
/// run an elastic resume continues), `version` (1) and a `fingerprint`.
impl ReadState for Tokens {
    fn read(s: &Saved<'_>, _: &TokenFingerprint, _: bool) -> Result<TokenState> {
        token_state_basics(s, "a TokenLoader state", "TokenLoader.state_dict()")?;
        let int = |k: &str| s.integer(k, true, 0).map(|v| v.unwrap_or_default());
        Ok(TokenState {
            seed: int("seed")?,
            epoch: int("epoch")?,
            next_batch: int("next_batch")?,
            at: Resume { epoch: int("cursor_epoch")?, cursor: int("cursor")?, offset: int("offset")? },
            elastic: match s.fields.get("elastic") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    let e: Elastic = serde_json::from_value(v.clone()).map_err(|e| {
                        Error::config(s.name("elastic"), format!("expected the dict state_dict() gives: {e}"))
                    })?;
                    check_elastic(&e, 0).map_err(|why| Error::config(s.name("elastic"), why))?;
                    Some(e)
                }
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::args;
    use crate::args::env::env_of;
    use crate::args::INDEX_DIR_VAR;
    use crate::values::{MAX_BATCH_TOKENS, MAX_SEQ_LEN};
    use serde_json::json;

    #[test]
    fn the_document_index_directory_comes_from_the_argument_or_the_environment() {
        let dir = |vars: &[(&str, Option<&str>)], a: Value| {
            env_of(vars).and_then(|e| token_config_in(args(a), &e)).map(|(c, _)| c.index_dir)
        };
        let home = [("HOME", Some("/home/u"))];
        assert_eq!(dir(&home, json!({})).unwrap(), Some(PathBuf::from("/home/u/.cache/stoker/doc-index")));
        let xdg = [("HOME", Some("/home/u")), ("XDG_CACHE_HOME", Some("/c"))];
        assert_eq!(dir(&xdg, json!({})).unwrap(), Some(PathBuf::from("/c/stoker/doc-index")));
        let set = [("HOME", Some("/home/u")), (INDEX_DIR_VAR, Some("/idx"))];
        assert_eq!(dir(&set, json!({})).unwrap(), Some(PathBuf::from("/idx")));
        assert_eq!(dir(&[(INDEX_DIR_VAR, Some("off"))], json!({})).unwrap(), None);
        assert_eq!(dir(&[], json!({})).unwrap(), None, "no HOME, no store");
        assert_eq!(dir(&set, json!({"index_cache": false})).unwrap(), None);
        assert_eq!(dir(&set, json!({"index_cache": "/mine"})).unwrap(), Some(PathBuf::from("/mine")));
        let e = dir(&[(INDEX_DIR_VAR, Some("rel/dir"))], json!({})).unwrap_err().to_string();
        assert!(e.contains("STOKER_INDEX_DIR") && e.contains("absolute"), "{e}");
        assert!(dir(&home, json!({"index_cache": 3})).unwrap_err().to_string().contains("index_cache"));
    }

    #[test]
    fn a_batch_of_tokens_is_bounded_once() {
        assert_eq!(token_values(8, 2048).unwrap(), 8 * 2048);
        assert_eq!(token_values(1, MAX_SEQ_LEN).unwrap(), MAX_SEQ_LEN);
        assert_eq!(token_values(MAX_BATCH_TOKENS, 1).unwrap(), MAX_BATCH_TOKENS);
        for (bs, len) in [(MAX_BATCH_TOKENS + 1, 1), (1 << 6, 1 << 23), (usize::MAX, 2)] {
            let e = token_values(bs, len).unwrap_err().to_string();
            assert!(e.starts_with("invalid argument `batch_size`") && e.contains("(2^29 - 1) tokens a batch"), "{e}");
        }
        let e = token_values(1, MAX_SEQ_LEN + 1).unwrap_err().to_string();
        assert!(e.contains("`seq_len`") && e.contains("from 1 to 16777216 tokens"), "{e}");
        assert!(token_values(1, 0).unwrap_err().to_string().contains("`seq_len`"));
        assert!(token_values(0, 8).unwrap_err().to_string().contains("`batch_size`: must be at least 1"));
        // The arguments' rule is the same one.
        let config = |v: Value| token_config_in(args(v), &env_of(&[]).unwrap()).map(|(c, _)| (c.batch_size, c.seq_len));
        assert_eq!(config(json!({"batch_size": 4, "seq_len": 64})).unwrap(), (4, 64));
        for v in [json!({"batch_size": 1 << 20, "seq_len": 1 << 10}), json!({"seq_len": (1 << 24) + 1})] {
            let (bs, len) = (v["batch_size"].as_u64().unwrap_or(8) as usize, v["seq_len"].as_u64().unwrap() as usize);
            assert_eq!(config(v).unwrap_err().to_string(), token_values(bs, len).unwrap_err().to_string());
        }
    }
}
