//! The rules for one value, whoever gives it: a JSON value (a Python keyword, or a flag's text
//! made typed by [`text_value`]) or a plain number a config already holds. Each limit is
//! written here once, with one wording, and the loaders check what a hand-made config holds
//! with the same functions ([`check_threads`], [`check_io_threads`], [`check_prefetch`],
//! [`batch_bytes`]), so a limit cannot be one thing here and another there.
//!
//! This file needs nothing but the error type and the value types it returns, and sits beside
//! `error.rs`, below every room: the loaders call it without importing the configs that the
//! rule books of [`crate::args`] build (it is [`crate::args`]'s, re-exported there).
//!
//! [`augment`] holds the rules of the augmentation ops' arguments, which compiling a transform
//! (in `image::ops`) calls, so they too sit below the rooms.

pub mod augment;

use crate::error::{Error, Result};
use crate::shell::store::Ttl;
use serde_json::Value;
use std::time::Duration;

/// The most threads of one kind a loader starts (`threads`, `io_threads`,
/// `STOKER_NUM_THREADS`, and the cores of a `cpu_budget`, one decode thread each). Far above
/// any useful count (a decode thread per core of the largest hosts), far below where starting
/// them fails (`ulimit -u`, the stack space of 100000 threads).
pub const MAX_THREADS: usize = 1024;

/// The most batches a loader prefetches (each is a batch buffer of its own).
pub const MAX_PREFETCH: usize = 1024;

/// The largest batch buffer: 128 TiB, the whole address space of a process on x86-64 (47 bits
/// of user space), so no machine can hold a larger one. A batch size whose buffer is larger, or
/// whose size does not fit in 64 bits, is refused before anything is allocated.
pub const MAX_BATCH_BYTES: u64 = 1 << 47;

/// Bytes a batch slot keeps per sample besides the sample itself: its label (8), its dataset
/// index (4) and its status (1).
pub const SLOT_BYTES_PER_SAMPLE: u64 = 13;

/// How the unit of `threads` reads in its limit's message (`None` in a config: `auto`).
const THREADS_OR_AUTO: &str = "threads (or 'auto')";
/// How the unit of `io_threads` (always a fixed count) reads in its limit's message.
const THREADS: &str = "threads";
/// How the unit of `prefetch` reads in its limit's message.
const BATCHES_OR_AUTO: &str = "batches (or 'auto')";

/// A value as an error message shows it, in Python's spelling (`True`, `None`, `"text"`).
pub(super) fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// An unsigned integer: a JSON integer. Text, booleans and floats are not integers (a flag's
/// text is made a number by [`text_value`] before it gets here).
pub(super) fn unsigned(arg: &str, v: &Value, what: &str) -> Result<u64> {
    v.as_u64().ok_or_else(|| Error::config(arg, format!("expected {what}, got {}", shown_typed(v))))
}

/// A value as an error message shows it, with its type where the type is what is wrong
/// (`"128" (a str)`, `1.5 (a float)`, `True (a bool)`).
fn shown_typed(v: &Value) -> String {
    match v {
        Value::String(_) => format!("{} (a str)", shown(v)),
        Value::Bool(_) => format!("{} (a bool)", shown(v)),
        Value::Number(n) if !n.is_u64() && !n.is_i64() => format!("{n} (a float)"),
        other => shown(other),
    }
}

/// The typed value of a command-line flag's text: decimal integers and other numbers become
/// JSON numbers, `true`/`false` booleans, anything else stays text. The CLI's values go
/// through it (in [`super::from_text`] arguments, every argument that is not text by nature),
/// so the rules below see one kind of value per argument, whoever gave it: Python's `"128"`
/// for a number stays text and is refused.
pub fn text_value(s: &str) -> Value {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return n.into();
    }
    match t {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    let numeric =
        !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e' | b'E'));
    match t.parse::<f64>().ok().filter(|_| numeric).and_then(serde_json::Number::from_f64) {
        Some(n) => Value::Number(n),
        None => Value::String(s.to_string()),
    }
}

/// A positive integer (≥ 1).
pub fn positive(arg: &str, v: &Value) -> Result<usize> {
    let n = unsigned(arg, v, "a positive integer")?;
    check_positive(arg, usize::try_from(n).map_err(|_| Error::config(arg, format!("{n} is too large")))?)
}

/// The rule of every count that must be positive (`batch_size`, `world_size`, `shard_window`,
/// `cache_max_side`), for a value a config holds: at least 1. What [`positive`] checks of a
/// given value.
pub fn check_positive(arg: &str, n: usize) -> Result<usize> {
    if n == 0 {
        return Err(Error::config(arg, "must be at least 1, got 0"));
    }
    Ok(n)
}

/// A non-negative integer.
pub fn non_negative(arg: &str, v: &Value) -> Result<u64> {
    unsigned(arg, v, "a non-negative integer")
}

/// A boolean: JSON `true`/`false` (a flag's `true`/`false` through [`text_value`]).
pub fn boolean(arg: &str, v: &Value) -> Result<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        _ => Err(Error::config(arg, format!("expected True or False, got {}", shown_typed(v)))),
    }
}

/// Text (`allowed` says what it may be, for the message).
pub(super) fn text<'a>(arg: &str, v: &'a Value, allowed: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| Error::config(arg, format!("expected a string ({allowed}), got {}", shown(v))))
}

/// The one rule of every counted limit: `n` from 1 to `max` (`what` names the unit in the
/// message: "threads").
pub(super) fn in_range(arg: &str, n: u64, max: usize, what: &str) -> Result<usize> {
    if n == 0 || n > max as u64 {
        return Err(Error::config(arg, format!("must be from 1 to {max} {what}, got {n}")));
    }
    Ok(n as usize)
}

/// A positive integer of at most `max` (`what` names the unit in the message: "threads").
pub(super) fn bounded(arg: &str, v: &Value, max: usize, what: &str) -> Result<usize> {
    in_range(arg, unsigned(arg, v, "a positive integer")?, max, what)
}

/// A fixed `threads` count a config holds (`None` there is `auto`): from 1 to
/// [`MAX_THREADS`]. What [`threads`] checks of a given value, for a config made by hand.
pub fn check_threads(n: usize) -> Result<usize> {
    in_range("threads", n as u64, MAX_THREADS, THREADS_OR_AUTO)
}

/// An `io_threads` count a config holds: from 1 to [`MAX_THREADS`]; what [`thread_count`]
/// checks of a given value.
pub fn check_io_threads(n: usize) -> Result<usize> {
    in_range("io_threads", n as u64, MAX_THREADS, THREADS)
}

/// A `prefetch` depth a config holds: from 1 to [`MAX_PREFETCH`]; what [`prefetch`] checks of
/// a given value.
pub fn check_prefetch(n: usize) -> Result<usize> {
    in_range("prefetch", n as u64, MAX_PREFETCH, BATCHES_OR_AUTO)
}

/// A thread count: `auto` (`None`: the process's CPU allowance) or an integer from 1 to
/// [`MAX_THREADS`].
pub fn threads(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "auto" => Ok(None),
        _ => match v.as_u64() {
            Some(n) => in_range(arg, n, MAX_THREADS, THREADS_OR_AUTO).map(Some),
            None => Err(Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
        },
    }
}

/// A fixed thread count (`io_threads`): an integer from 1 to [`MAX_THREADS`].
pub fn thread_count(arg: &str, v: &Value) -> Result<usize> {
    bounded(arg, v, MAX_THREADS, THREADS)
}

/// A prefetch depth: an integer from 1 to [`MAX_PREFETCH`], or `auto` (`None`: tuned, see
/// [`crate::observe::tune`]).
pub fn prefetch(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::String(s) if s == "auto" => Ok(None),
        _ => match v.as_u64() {
            Some(n) => in_range(arg, n, MAX_PREFETCH, BATCHES_OR_AUTO).map(Some),
            None => Err(Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
        },
    }
}

/// A CPU budget in cores: a positive number (`2`, `1.5`), at most [`MAX_THREADS`] (an
/// autotuned loader starts a decode thread per whole core of it).
pub fn cpu_budget(arg: &str, v: &Value) -> Result<f64> {
    match v.as_f64() {
        Some(c) if c.is_finite() && c > 0.0 && c <= MAX_THREADS as f64 => Ok(c),
        _ => {
            Err(Error::config(arg, format!("expected a number of cores in (0, {MAX_THREADS}], got {}", shown_typed(v))))
        }
    }
}

/// Bytes of one batch buffer of `batch_size` samples of `sample_bytes` each, with the slot's
/// bookkeeping ([`SLOT_BYTES_PER_SAMPLE`]): an error naming `batch_size` when the size does not
/// fit in 64 bits or exceeds [`MAX_BATCH_BYTES`]. Every caller that sizes a buffer from a batch
/// size checks it here first, so its own multiplications cannot overflow.
pub fn batch_bytes(batch_size: usize, sample_bytes: u64) -> Result<u64> {
    let per = sample_bytes.checked_add(SLOT_BYTES_PER_SAMPLE);
    match per.and_then(|p| p.checked_mul(batch_size as u64)) {
        Some(b) if b <= MAX_BATCH_BYTES => Ok(b),
        Some(b) => Err(Error::config(
            "batch_size",
            format!(
                "{batch_size} samples need a batch buffer of at least {b} bytes ({:.0} TiB), more than any machine \
                 can hold (at most {} TiB); lower batch_size",
                b as f64 / (1u64 << 40) as f64,
                MAX_BATCH_BYTES >> 40
            ),
        )),
        None => Err(Error::config(
            "batch_size",
            format!("{batch_size} samples need a batch buffer whose size in bytes does not fit in 64 bits; lower batch_size"),
        )),
    }
}

/// The most tokens per row (`seq_len`).
pub const MAX_SEQ_LEN: usize = 1 << 24;
/// The most tokens of a batch (`batch_size x seq_len`): one int32 tensor of it (`input_ids`,
/// `labels`, `position_ids`, 4 bytes a token) stays under 2^31 bytes, and its token count and
/// `cu_seqlens` fit in an int32.
pub const MAX_BATCH_TOKENS: usize = (1 << 29) - 1;

/// The tokens of one batch, `batch_size x seq_len`, checked: `batch_size` at least 1,
/// `seq_len` from 1 to [`MAX_SEQ_LEN`], and their product at most [`MAX_BATCH_TOKENS`] (an
/// error naming `batch_size`). [`super::token_config`] checks given values with it, and the token
/// loader a config made by hand, so the bound is one bound.
pub fn token_values(batch_size: usize, seq_len: usize) -> Result<usize> {
    if batch_size == 0 {
        return Err(Error::config("batch_size", "must be at least 1, got 0"));
    }
    in_range("seq_len", seq_len as u64, MAX_SEQ_LEN, "tokens")?;
    batch_size.checked_mul(seq_len).filter(|&t| t <= MAX_BATCH_TOKENS).ok_or_else(|| {
        Error::config(
            "batch_size",
            format!(
                "batch_size x seq_len = {batch_size} x {seq_len}: at most {MAX_BATCH_TOKENS} (2^29 - 1) tokens a batch"
            ),
        )
    })
}

/// A byte count: a positive integer, or text such as `2GiB`, `512MB`, `1.5G`, `1000000`
/// (units B, KB, KiB, MB, MiB, GB, GiB, TB, TiB; decimal ones are powers of 1000).
pub fn bytes(arg: &str, v: &Value) -> Result<u64> {
    match v {
        Value::String(s) => parse_bytes(arg, s),
        Value::Number(n) => match n.as_u64() {
            Some(0) => Err(Error::config(arg, "must be positive, got 0")),
            Some(b) => Ok(b),
            None => Err(Error::config(arg, format!("expected a positive number of bytes, got {n}"))),
        },
        _ => Err(Error::config(arg, format!("expected bytes (an integer) or a size like '2GiB', got {}", shown(v)))),
    }
}

/// [`bytes`] for text.
pub fn parse_bytes(arg: &str, s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| Error::config(arg, format!("cannot read {s:?}; use bytes or a size like '2GiB', '512MB'")))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" => 1e12,
        "tib" => 1024f64.powi(4),
        u => {
            return Err(Error::config(
                arg,
                format!("unknown unit {u:?} in {s:?}; use B, KB, KiB, MB, MiB, GB, GiB, TB or TiB"),
            ))
        }
    };
    let b = n * mult;
    if b.is_nan() || b < 1.0 {
        return Err(Error::config(arg, format!("must be positive, got {s:?}")));
    }
    if b > u64::MAX as f64 {
        return Err(Error::config(arg, format!("{s:?} is too large")));
    }
    Ok(b as u64)
}

/// Where batches go, as the user asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// Host memory.
    Cpu,
    /// A GPU: `cuda:N` (`Some(N)`, CUDA's ordinal N) or `cuda` (`None`: the caller's current
    /// device).
    Cuda(Option<u32>),
    /// A GPU when one is usable, else host memory.
    Auto,
}

impl DeviceSpec {
    /// Parses `cpu`, `cuda`, `cuda:N` or `auto`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || Error::config("device", format!("expected 'cpu', 'cuda', 'cuda:N' or 'auto', got {s:?}"));
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            "auto" => Ok(DeviceSpec::Auto),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse::<u32>().map(|n| DeviceSpec::Cuda(Some(n))).map_err(|_| bad())
            }
        }
    }

    /// [`DeviceSpec::parse`] of a JSON value (a Python keyword).
    pub fn from_value(v: &Value) -> Result<Self> {
        Self::parse(text("device", v, "'cpu', 'cuda', 'cuda:N' or 'auto'")?)
    }

    /// Whether batches may go to a GPU.
    pub fn wants_gpu(self) -> bool {
        !matches!(self, DeviceSpec::Cpu)
    }
}

/// A duration given as text for `arg` (`--older-than`): seconds, or a number with `s`, `m`,
/// `h` or `d` (`90m`, `12h`, `7d`).
pub fn duration(arg: &str, v: &str) -> Result<Duration> {
    match parse_ttl(v) {
        Some(Ttl::After(d)) => Ok(d),
        _ => {
            Err(Error::config(arg, format!("{v:?} is not a duration: expected seconds or a number with s, m, h or d")))
        }
    }
}

/// A time to live: `never`, or seconds with an optional unit (`s`, `m`, `h`, `d`).
pub(super) fn parse_ttl(v: &str) -> Option<Ttl> {
    let v = v.trim().to_ascii_lowercase();
    if v == "never" {
        return Some(Ttl::Never);
    }
    let (num, unit) = match v.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((k, _)) => (&v[..k], &v[k..]),
        None => (&v[..], "s"),
    };
    let scale = match unit.trim() {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return None,
    };
    let n: f64 = num.trim().parse().ok()?;
    let secs = n * scale;
    (n.is_finite() && n >= 0.0 && secs <= 3.2e9).then(|| Ttl::After(Duration::from_secs_f64(secs)))
}

/// The longest caption row: 65,536 ids (CLIP's is 77; long-caption models use a few hundred).
pub const MAX_CONTEXT_LENGTH: usize = 1 << 16;

/// The limits of a caption row: `context_length` from 2 (the start and end of text) to
/// [`MAX_CONTEXT_LENGTH`], `pad_id` an `i32` (the rows' type) and, with the tokenizer's
/// `vocab_size`, one of its ids.
pub fn check_caption_values(context_length: usize, pad_id: u32, vocab_size: Option<usize>) -> Result<()> {
    if !(2..=MAX_CONTEXT_LENGTH).contains(&context_length) {
        return Err(Error::config(
            "context_length",
            format!("must be from 2 (the start and end of text) to {MAX_CONTEXT_LENGTH} ids, got {context_length}"),
        ));
    }
    let limit = vocab_size.map_or(i32::MAX as u64, |v| v as u64 - 1).min(i32::MAX as u64);
    if u64::from(pad_id) > limit {
        let what = if vocab_size.is_some() { "the tokenizer's ids" } else { "token ids" };
        return Err(Error::config("pad_id", format!("must be one of {what}, from 0 to {limit}, got {pad_id}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{args, array_config, loader_config};
    use serde_json::json;

    #[test]
    fn cache_times_to_live_parse_with_units() {
        assert_eq!(parse_ttl("0"), Some(Ttl::After(Duration::ZERO)));
        assert_eq!(parse_ttl("90m"), Some(Ttl::After(Duration::from_secs(5400))));
        assert_eq!(parse_ttl(" 1.5h "), Some(Ttl::After(Duration::from_secs(5400))));
        assert_eq!(parse_ttl("7d"), Some(Ttl::After(Duration::from_secs(7 * 86_400))));
        assert_eq!(parse_ttl("Never"), Some(Ttl::Never));
        for bad in ["", "soon", "-1", "1e400", "3w", "nan", "inf"] {
            assert_eq!(parse_ttl(bad), None, "{bad}");
        }
        assert!(duration("--older-than", "never").is_err());
    }
    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("m", "2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_bytes("m", "512MB").unwrap(), 512_000_000);
        assert_eq!(parse_bytes("m", " 1.5 G ").unwrap(), 1_500_000_000);
        assert_eq!(bytes("m", &json!(1000)).unwrap(), 1000);
        assert_eq!(bytes("m", &json!("1000")).unwrap(), 1000);
        let e = parse_bytes("memory_limit", "12parsecs").unwrap_err().to_string();
        assert!(e.contains("`memory_limit`") && e.contains("unknown unit"), "{e}");
        for bad in [json!(-5), json!("-5"), json!(0), json!("0.0001B"), json!(true), json!(1.5), json!("")] {
            assert!(bytes("m", &bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn integers_and_booleans_are_strict() {
        assert_eq!(positive("b", &json!(3)).unwrap(), 3);
        assert_eq!(positive("b", &text_value("3")).unwrap(), 3);
        for bad in [json!(0), json!(-1), json!(true), json!(2.0), json!("x"), json!("3"), json!(null)] {
            let e = positive("batch_size", &bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid argument `batch_size`"), "{e}");
        }
        assert!(positive("b", &json!("128")).unwrap_err().to_string().contains("\"128\" (a str)"));
        assert!(positive("b", &json!(1.5)).unwrap_err().to_string().contains("1.5 (a float)"));
        assert!(positive("b", &json!(true)).unwrap_err().to_string().contains("True (a bool)"));
        assert!(boolean("d", &json!(1)).is_err());
        assert!(boolean("d", &json!("true")).is_err());
        assert!(boolean("d", &text_value("true")).unwrap());
        assert!(cpu_budget("c", &json!("1.5")).is_err());
        assert_eq!(cpu_budget("c", &text_value("1.5")).unwrap(), 1.5);
        assert_eq!(text_value("2GiB"), json!("2GiB"));
        assert_eq!(text_value("auto"), json!("auto"));
        assert_eq!(text_value("5%"), json!("5%"));
        assert_eq!(threads("t", &json!("auto")).unwrap(), None);
        assert_eq!(threads("t", &json!(4)).unwrap(), Some(4));
        assert!(threads("t", &json!(0)).unwrap_err().to_string().contains("'auto'"));
    }

    #[test]
    fn devices() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("cuda").unwrap(), DeviceSpec::Cuda(None));
        assert_eq!(DeviceSpec::parse("cuda:3").unwrap(), DeviceSpec::Cuda(Some(3)));
        assert_eq!(DeviceSpec::parse("auto").unwrap(), DeviceSpec::Auto);
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "CUDA", "cuda:99999999999"] {
            let e = DeviceSpec::parse(bad).unwrap_err().to_string();
            assert!(e.contains("`device`") && e.contains("'cuda:N'"), "{e}");
        }
        assert!(DeviceSpec::from_value(&json!(0)).is_err());
    }

    #[test]
    fn thread_counts_are_bounded() {
        assert_eq!(threads("threads", &json!(1024)).unwrap(), Some(1024));
        let e = threads("threads", &json!(100000)).unwrap_err().to_string();
        assert!(e.contains("`threads`") && e.contains("from 1 to 1024"), "{e}");
        assert!(threads("threads", &json!("abc")).unwrap_err().to_string().contains("'auto'"));
        let e = thread_count("io_threads", &json!(5000)).unwrap_err().to_string();
        assert!(e.contains("`io_threads`") && e.contains("from 1 to 1024"), "{e}");
        assert_eq!(thread_count("io_threads", &text_value("8")).unwrap(), 8);
        let e = prefetch("prefetch", &json!(u64::MAX)).unwrap_err().to_string();
        assert!(e.contains("`prefetch`") && e.contains("from 1 to 1024"), "{e}");
        assert!(cpu_budget("cpu_budget", &json!(4096)).unwrap_err().to_string().contains("(0, 1024]"));
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        assert!(err(json!({"preset": "imagenet-val", "io_threads": 100000})).contains("`io_threads`"));
        assert!(err(json!({"preset": "imagenet-val", "threads": 100000})).contains("`threads`"));
    }

    #[test]
    fn batch_buffers_must_fit_in_memory() {
        // 224x224 RGB float32 (imagenet-val) + 13 bytes of bookkeeping per sample.
        let per = 224 * 224 * 3 * 4 + SLOT_BYTES_PER_SAMPLE;
        assert_eq!(batch_bytes(256, 224 * 224 * 3 * 4).unwrap(), 256 * per);
        let e = batch_bytes(1 << 62, 1).unwrap_err().to_string();
        assert!(e.contains("`batch_size`") && e.contains("does not fit in 64 bits"), "{e}");
        let e = batch_bytes(1 << 40, 600_000).unwrap_err().to_string();
        assert!(e.contains("`batch_size`") && e.contains("more than any machine can hold"), "{e}");
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        for bs in [json!(1u64 << 62), json!(u64::MAX), json!(1u64 << 40)] {
            let e = err(json!({"preset": "imagenet-val", "batch_size": bs}));
            assert!(e.starts_with("invalid argument `batch_size`"), "{e}");
        }
        // The largest batch that fits the bound is accepted (nothing is allocated here).
        let max = (MAX_BATCH_BYTES / per) as usize;
        assert_eq!(
            loader_config(args(json!({"preset": "imagenet-val", "batch_size": max}))).unwrap().sampler.batch_size,
            max
        );
        assert!(err(json!({"preset": "imagenet-val", "batch_size": max + 1})).contains("`batch_size`"));
        // An output size whose sample overflows.
        let ops = json!([{"op": "Resize", "size": [1u64 << 40, 1u64 << 40]}]);
        let e = loader_config(args(json!({"ops": ops, "batch_size": 1}))).unwrap_err().to_string();
        assert!(e.contains("`transforms`"), "{e}");
        // Arrays: the row size comes later, but no batch size can overflow the bookkeeping.
        let e = array_config(args(json!({"batch_size": 1u64 << 62}))).unwrap_err().to_string();
        assert!(e.contains("`batch_size`"), "{e}");
    }

    #[test]
    fn a_config_s_counts_are_checked_by_the_rules_of_given_values() {
        // One rule, one wording: a count in a config made by hand reads as the same count given.
        let given = |f: fn(&str, &Value) -> Result<Option<usize>>, arg: &str, n: u64| {
            f(arg, &json!(n)).map_err(|e| e.to_string())
        };
        for n in [0usize, 1, MAX_THREADS, MAX_THREADS + 1] {
            let held = check_threads(n).map(Some).map_err(|e| e.to_string());
            assert_eq!(held, given(threads, "threads", n as u64), "threads={n}");
            let held = check_io_threads(n).map_err(|e| e.to_string());
            assert_eq!(held, thread_count("io_threads", &json!(n)).map_err(|e| e.to_string()), "io_threads={n}");
            let held = check_prefetch(n).map(Some).map_err(|e| e.to_string());
            assert_eq!(held, given(prefetch, "prefetch", n as u64), "prefetch={n}");
        }
        let e = check_threads(0).unwrap_err().to_string();
        assert!(e.contains("`threads`") && e.contains("from 1 to 1024"), "{e}");
        assert!(check_io_threads(5000).unwrap_err().to_string().contains("`io_threads`"));
        assert!(check_prefetch(0).unwrap_err().to_string().contains("`prefetch`"));
    }
}
