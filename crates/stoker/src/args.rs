//! The one place where what users give is checked: every argument of a loader, a byte size, a
//! thread count, a device string, however it arrives: a command-line flag (text) or a Python
//! keyword (a JSON value). The CLI and the Python package pass values through untouched and map
//! the [`Error::Config`] that comes back (it names the argument in its Python spelling,
//! `memory_limit`; the CLI shows it as `--memory-limit`).
//!
//! A value is a [`serde_json::Value`]: Python sends its keywords as JSON, the CLI sends flag
//! text as JSON strings. So `batch_size` may be `256` (Python) or `"256"` (CLI); `True` is not
//! a number, `"2GiB"` and `2147483648` are both sizes.

use crate::arrays::ArrayConfig;
use crate::cache::{CacheLocation, CacheSpec};
use crate::error::{Error, Result};
use crate::ops::{DType, Layout, OpSpec, TransformSpec};
use crate::pipeline::{ErrorPolicy, LoaderConfig};
use crate::sampler::SamplerSpec;
use serde_json::{Map, Value};

/// Arguments by name (Python spelling: `batch_size`, `memory_limit`).
pub type Args = Map<String, Value>;

/// The shard window `shuffle="shards"` uses when none is given.
pub const DEFAULT_SHARD_WINDOW: usize = 4;

fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

/// An unsigned integer: a JSON integer, or decimal digits as text. Booleans and floats are not
/// integers.
fn unsigned(arg: &str, v: &Value, what: &str) -> Result<u64> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    n.ok_or_else(|| Error::config(arg, format!("expected {what}, got {}", shown(v))))
}

/// A positive integer (≥ 1).
pub fn positive(arg: &str, v: &Value) -> Result<usize> {
    let n = unsigned(arg, v, "a positive integer")?;
    if n == 0 {
        return Err(Error::config(arg, "must be at least 1, got 0"));
    }
    usize::try_from(n).map_err(|_| Error::config(arg, format!("{n} is too large")))
}

/// A non-negative integer.
pub fn non_negative(arg: &str, v: &Value) -> Result<u64> {
    unsigned(arg, v, "a non-negative integer")
}

/// A boolean: JSON `true`/`false`, or the text `true`/`false`.
pub fn boolean(arg: &str, v: &Value) -> Result<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        Value::String(s) if s == "true" => Ok(true),
        Value::String(s) if s == "false" => Ok(false),
        _ => Err(Error::config(arg, format!("expected True or False, got {}", shown(v)))),
    }
}

fn text<'a>(arg: &str, v: &'a Value, allowed: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| Error::config(arg, format!("expected a string ({allowed}), got {}", shown(v))))
}

/// A thread count: `auto` (`None`: the process's CPU allowance) or a positive integer.
pub fn threads(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "auto" => Ok(None),
        _ => positive(arg, v)
            .map(Some)
            .map_err(|_| Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
    }
}

/// A prefetch depth: a positive integer, or `auto` (`None`: tuned, see [`crate::tune`]).
pub fn prefetch(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::String(s) if s == "auto" => Ok(None),
        _ => positive(arg, v)
            .map(Some)
            .map_err(|_| Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
    }
}

/// A CPU budget in cores: a positive number (`2`, `1.5`, `"1.5"`), at most 4096.
pub fn cpu_budget(arg: &str, v: &Value) -> Result<f64> {
    let n = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match n {
        Some(c) if c.is_finite() && c > 0.0 && c <= 4096.0 => Ok(c),
        _ => Err(Error::config(arg, format!("expected a number of cores in (0, 4096], got {}", shown(v)))),
    }
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

/// A failure budget: a count (`100`) or a fraction of the pass's samples (`0.05`, `"5%"`).
pub fn max_failures(v: &Value) -> Result<crate::pipeline::MaxFailures> {
    use crate::pipeline::MaxFailures;
    let bad = || {
        Error::config(
            "max_failures",
            format!(
                "expected a count (an integer >= 0) or a fraction in (0, 1] such as 0.05 or '5%', got {}",
                shown(v)
            ),
        )
    };
    let fraction = |f: f64| if f > 0.0 && f <= 1.0 { Ok(MaxFailures::Fraction(f)) } else { Err(bad()) };
    match v {
        Value::Number(n) if n.is_u64() => Ok(MaxFailures::Count(n.as_u64().unwrap_or(0))),
        Value::Number(n) => fraction(n.as_f64().ok_or_else(bad)?),
        Value::String(s) => {
            let t = s.trim();
            if let Some(p) = t.strip_suffix('%') {
                fraction(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0)
            } else if let Ok(n) = t.parse::<u64>() {
                Ok(MaxFailures::Count(n))
            } else {
                fraction(t.parse::<f64>().map_err(|_| bad())?)
            }
        }
        _ => Err(bad()),
    }
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

/// This process's GPU index on its node: torchrun's `LOCAL_RANK`, 0 when unset (the CUDA
/// ordinal that `device="cuda"` means when no framework has chosen a current device).
pub fn local_rank() -> Result<u32> {
    let r = env_usize("LOCAL_RANK")?.unwrap_or(0);
    u32::try_from(r).map_err(|_| Error::config("LOCAL_RANK", format!("{r} is not a GPU index")))
}

/// An integer from the environment (torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`); unset or
/// empty is `None`.
pub fn env_usize(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => v.trim().parse::<usize>().map(Some).map_err(|_| {
            Error::config(name, format!("environment variable {name}={v:?}: expected a non-negative integer"))
        }),
        Err(_) => Ok(None),
    }
}

/// Takes the arguments one by one; what is left at the end is an unknown argument.
struct Taker(Args);

impl Taker {
    fn take(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name).filter(|v| !v.is_null())
    }

    fn finish(self) -> Result<()> {
        match self.0.keys().next() {
            Some(k) => Err(Error::config(k.as_str(), "unknown argument")),
            None => Ok(()),
        }
    }
}

/// Rank and world size: given, else torchrun's `RANK` / `WORLD_SIZE`, else 0 of 1.
fn ranks(a: &mut Taker) -> Result<(usize, usize)> {
    let world_size = match a.take("world_size") {
        Some(v) => positive("world_size", &v)?,
        None => match env_usize("WORLD_SIZE")? {
            Some(0) => {
                return Err(Error::config("WORLD_SIZE", "environment variable WORLD_SIZE=0: must be at least 1"))
            }
            Some(n) => n,
            None => 1,
        },
    };
    let rank = match a.take("rank") {
        Some(v) => non_negative("rank", &v)? as usize,
        None => env_usize("RANK")?.unwrap_or(0),
    };
    if rank >= world_size {
        return Err(Error::config(
            "rank",
            format!("must be in 0..{} (world_size={world_size}), got {rank}", world_size - 1),
        ));
    }
    Ok((rank, world_size))
}

/// The sampler's arguments: `batch_size` (default 256), `shuffle`, `seed`, `drop_last`,
/// `rank`, `world_size`; `shard_window` when `shards` is allowed.
fn sampler(a: &mut Taker, shards: bool) -> Result<SamplerSpec> {
    let batch_size = a.take("batch_size").map(|v| positive("batch_size", &v)).transpose()?.unwrap_or(256);
    let allowed = if shards { "False, True, 'global' or 'shards'" } else { "False or True" };
    let (shuffle, by_shards) = match a.take("shuffle") {
        None => (false, false),
        Some(Value::String(s)) if s == "global" => (true, false),
        Some(Value::String(s)) if s == "shards" && shards => (true, true),
        Some(v) => (
            boolean("shuffle", &v)
                .map_err(|_| Error::config("shuffle", format!("expected {allowed}, got {}", shown(&v))))?,
            false,
        ),
    };
    let window = a.take("shard_window").map(|v| positive("shard_window", &v)).transpose()?;
    let seed = a.take("seed").map(|v| non_negative("seed", &v)).transpose()?.unwrap_or(0);
    let drop_last = a.take("drop_last").map(|v| boolean("drop_last", &v)).transpose()?.unwrap_or(false);
    let (rank, world_size) = ranks(a)?;
    Ok(SamplerSpec {
        batch_size,
        shuffle,
        seed,
        drop_last,
        rank,
        world_size,
        shard_window: by_shards.then(|| window.unwrap_or(DEFAULT_SHARD_WINDOW)),
    })
}

/// Threads, prefetch (`None`: `auto`) and the memory cap.
fn common(a: &mut Taker) -> Result<(Option<usize>, Option<usize>, Option<u64>)> {
    let threads = a.take("threads").map(|v| threads("threads", &v)).transpose()?.flatten();
    let prefetch = a.take("prefetch").map(|v| prefetch("prefetch", &v)).transpose()?.unwrap_or(Some(2));
    let memory_limit = a.take("memory_limit").map(|v| bytes("memory_limit", &v)).transpose()?;
    Ok((threads, prefetch, memory_limit))
}

/// The transform: `preset` (`imagenet-train`, `imagenet-val`) or `ops` (a list of op specs,
/// what `stoker.transforms` compiles to), then `dtype`, `layout`, `apply_exif`.
fn transform(a: &mut Taker) -> Result<TransformSpec> {
    let mut spec = match (a.take("preset"), a.take("ops")) {
        (Some(_), Some(_)) => {
            return Err(Error::config("preset", "give a preset or an explicit transforms list, not both"))
        }
        (Some(p), None) => TransformSpec::preset(text("preset", &p, "imagenet-train or imagenet-val")?)?,
        (None, Some(ops)) => {
            let ops: Vec<OpSpec> = serde_json::from_value(ops)
                .map_err(|e| Error::config("transforms", format!("not a list of transforms: {e}")))?;
            // Explicit transforms without ToTensor/ToDtype give raw uint8 pixels.
            TransformSpec { ops, dtype: DType::Uint8, layout: Layout::NCHW, apply_exif: true }
        }
        (None, None) => {
            return Err(Error::config(
                "preset",
                "give preset='imagenet-train' or 'imagenet-val', or an explicit transforms list",
            ))
        }
    };
    if let Some(d) = a.take("dtype") {
        let dtype = DType::parse(text("dtype", &d, "uint8, float16 or float32")?)?;
        spec = spec.with_dtype(dtype);
    }
    if let Some(l) = a.take("layout") {
        spec.layout = Layout::parse(text("layout", &l, "NCHW or NHWC")?)?;
    }
    if let Some(e) = a.take("apply_exif") {
        spec.apply_exif = boolean("apply_exif", &e)?;
    }
    Ok(spec)
}

/// A [`LoaderConfig`] from named arguments: `batch_size`, `preset` or `ops`, `dtype`,
/// `layout`, `apply_exif`, `shuffle` (`False`, `True`, `global`, `shards`), `shard_window`,
/// `seed`, `drop_last`, `rank`, `world_size` (torchrun's environment by default), `threads`,
/// `io_threads`, `prefetch` (a number or `auto`), `cpu_budget`, `memory_limit`, `on_error` (`skip`, `raise`), `dct_scaling`,
/// `roi`, `max_pixels`, `max_file_bytes`, `max_failures`, `cache`, `cache_bytes`,
/// `cache_max_side`, `trace`, `trace_events`. An unknown name is an error.
pub fn loader_config(args: Args) -> Result<LoaderConfig> {
    let mut a = Taker(args);
    let transform = transform(&mut a)?;
    let sampler = sampler(&mut a, true)?;
    let mut c = LoaderConfig::new(sampler.batch_size, transform);
    c.sampler = sampler;
    let prefetch;
    (c.threads, prefetch, c.memory_limit) = common(&mut a)?;
    match prefetch {
        Some(n) => c.prefetch = n,
        None => c.prefetch_auto = true,
    }
    c.cpu_budget = a.take("cpu_budget").map(|v| cpu_budget("cpu_budget", &v)).transpose()?;
    c.io_threads = a.take("io_threads").map(|v| positive("io_threads", &v)).transpose()?;
    if let Some(p) = a.take("on_error") {
        c.on_error = ErrorPolicy::parse(text("on_error", &p, "skip or raise")?)?;
    }
    if let Some(v) = a.take("dct_scaling") {
        c.dct_scaling = boolean("dct_scaling", &v)?;
    }
    if let Some(v) = a.take("roi") {
        c.roi = boolean("roi", &v)?;
    }
    if let Some(v) = a.take("max_pixels") {
        c.max_pixels = positive("max_pixels", &v)? as u64;
    }
    if let Some(v) = a.take("max_file_bytes") {
        c.max_file_bytes = bytes("max_file_bytes", &v)?;
    }
    if let Some(v) = a.take("max_failures") {
        c.max_failures = max_failures(&v)?;
    }
    c.cache = cache(&mut a)?;
    c.trace = trace(&mut a)?;
    a.finish()?;
    Ok(c)
}

/// The decoded-pixel cache: `cache` (`"ram"` or a directory), `cache_bytes` (a byte size) and
/// `cache_max_side` (pixels). Whether the directory can be written is checked when the loader
/// opens it.
fn cache(a: &mut Taker) -> Result<Option<CacheSpec>> {
    let bytes = a.take("cache_bytes").map(|v| bytes("cache_bytes", &v)).transpose()?;
    let max_side = a.take("cache_max_side").map(|v| positive("cache_max_side", &v)).transpose()?;
    let location = match a.take("cache") {
        None => None,
        Some(Value::String(s)) if s == "ram" => Some(CacheLocation::Ram),
        Some(Value::String(s)) if !s.trim().is_empty() => Some(CacheLocation::Dir(s.into())),
        Some(v) => {
            return Err(Error::config("cache", format!("expected None, 'ram' or a directory, got {}", shown(&v))))
        }
    };
    match location {
        Some(location) => Ok(Some(CacheSpec { location, bytes, max_side })),
        None if bytes.is_some() => Err(Error::config("cache_bytes", "needs cache='ram' or a cache directory")),
        None if max_side.is_some() => Err(Error::config("cache_max_side", "needs cache='ram' or a cache directory")),
        None => Ok(None),
    }
}

/// The trace: `trace` (the file) and `trace_events` (the ring's size, default
/// [`crate::trace::DEFAULT_MAX_EVENTS`]). Whether the file's folder exists is checked when the
/// loader is made.
fn trace(a: &mut Taker) -> Result<Option<crate::trace::TraceSpec>> {
    let max_events = a.take("trace_events").map(|v| positive("trace_events", &v)).transpose()?;
    match a.take("trace") {
        None if max_events.is_some() => Err(Error::config("trace_events", "needs trace=PATH (the trace file)")),
        None => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(crate::trace::TraceSpec {
            path: s.into(),
            max_events: max_events.unwrap_or(crate::trace::DEFAULT_MAX_EVENTS),
        })),
        Some(v) => Err(Error::config("trace", format!("expected None or a file path, got {}", shown(&v)))),
    }
}

/// An [`ArrayConfig`] from named arguments: `batch_size`, `shuffle` (`False`, `True`), `seed`,
/// `drop_last`, `rank`, `world_size`, `threads`, `prefetch`, `memory_limit`.
pub fn array_config(args: Args) -> Result<ArrayConfig> {
    let mut a = Taker(args);
    let sampler = sampler(&mut a, false)?;
    let (threads, prefetch, memory_limit) = common(&mut a)?;
    let prefetch =
        prefetch.ok_or_else(|| Error::config("prefetch", "'auto' is for image loaders; give ArrayLoader a number"))?;
    a.finish()?;
    Ok(ArrayConfig { sampler, threads, prefetch, memory_limit })
}

/// Named arguments from `name=value` pairs of flag text (what the CLI has).
pub fn from_text<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<String>)>) -> Args {
    pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), Value::String(v)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(v: Value) -> Args {
        v.as_object().unwrap().clone()
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
        assert_eq!(positive("b", &json!("3")).unwrap(), 3);
        for bad in [json!(0), json!(-1), json!(true), json!(2.0), json!("x"), json!(null)] {
            let e = positive("batch_size", &bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid argument `batch_size`"), "{e}");
        }
        assert!(boolean("d", &json!(1)).is_err());
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
    fn loader_arguments() {
        let c = loader_config(args(json!({"batch_size": 8, "preset": "imagenet-val", "shuffle": "shards",
            "memory_limit": "1MiB", "threads": "auto", "rank": 1, "world_size": 2, "dtype": "uint8"})))
        .unwrap();
        assert_eq!(c.sampler.batch_size, 8);
        assert_eq!(c.sampler.shard_window, Some(DEFAULT_SHARD_WINDOW));
        assert_eq!(c.memory_limit, Some(1 << 20));
        assert_eq!((c.sampler.rank, c.sampler.world_size), (1, 2));
        assert_eq!(c.transform.dtype, DType::Uint8);
        // The same from flag text.
        let t = loader_config(from_text([
            ("batch_size", Some("8".to_string())),
            ("preset", Some("imagenet-val".into())),
            ("shuffle", Some("true".into())),
            ("world_size", Some("1".into())),
        ]))
        .unwrap();
        assert!(t.sampler.shuffle && t.sampler.shard_window.is_none());
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        assert!(err(json!({"preset": "imagenet-val", "rank": 2, "world_size": 2})).contains("`rank`"));
        assert!(err(json!({"preset": "imagenet-val", "batch_sise": 2})).contains("`batch_sise`: unknown argument"));
        assert!(err(json!({"preset": "nope"})).contains("imagenet-train"));
        assert!(err(json!({})).contains("`preset`"));
        assert!(err(json!({"preset": "imagenet-val", "shuffle": "yes"})).contains("'shards'"));
        assert!(err(json!({"preset": "imagenet-val", "on_error": "ignore"})).contains("skip, raise"));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "ram", "cache_bytes": "8GiB"}))).unwrap();
        assert_eq!(c.cache, Some(CacheSpec { location: CacheLocation::Ram, bytes: Some(8 << 30), max_side: None }));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "/tmp/c"}))).unwrap();
        assert_eq!(
            c.cache,
            Some(CacheSpec { location: CacheLocation::Dir("/tmp/c".into()), bytes: None, max_side: None })
        );
        assert!(err(json!({"preset": "imagenet-val", "cache": "ram", "cache_bytes": "8 parsecs"}))
            .contains("`cache_bytes`"));
        assert!(err(json!({"preset": "imagenet-val", "cache_bytes": "1GiB"})).contains("`cache_bytes`: needs cache"));
        assert!(err(json!({"preset": "imagenet-val", "cache": 3})).contains("`cache`: expected None, 'ram'"));
        assert!(err(json!({"preset": "imagenet-val", "cache": ""})).contains("`cache`"));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "ram", "cache_max_side": 320}))).unwrap();
        assert_eq!(c.cache.unwrap().max_side, Some(320));
        assert!(err(json!({"preset": "imagenet-val", "cache_max_side": 320})).contains("`cache_max_side`: needs cache"));
        assert!(err(json!({"preset": "imagenet-val", "cache": "ram", "cache_max_side": 0})).contains("at least 1"));
        assert!(array_config(args(json!({"shuffle": "shards"}))).unwrap_err().to_string().contains("False or True"));
    }

    #[test]
    fn trace_arguments() {
        let c = loader_config(args(json!({"preset": "imagenet-val", "trace": "/tmp/t.json", "trace_events": "50"})))
            .unwrap();
        let t = c.trace.unwrap();
        assert_eq!((t.path.to_str(), t.max_events), (Some("/tmp/t.json"), 50));
        let c = loader_config(args(json!({"preset": "imagenet-val", "trace": "t.json"}))).unwrap();
        assert_eq!(c.trace.unwrap().max_events, crate::trace::DEFAULT_MAX_EVENTS);
        assert!(loader_config(args(json!({"preset": "imagenet-val"}))).unwrap().trace.is_none());
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        let e = err(json!({"preset": "imagenet-val", "trace": "t.json", "trace_events": 0}));
        assert!(e.contains("`trace_events`") && e.contains("at least 1"), "{e}");
        assert!(
            err(json!({"preset": "imagenet-val", "trace": "t.json", "trace_events": -3})).contains("`trace_events`")
        );
        assert!(err(json!({"preset": "imagenet-val", "trace_events": 10})).contains("`trace_events`: needs trace"));
        assert!(err(json!({"preset": "imagenet-val", "trace": 5})).contains("`trace`: expected None or a file path"));
        assert!(err(json!({"preset": "imagenet-val", "trace": " "})).contains("`trace`"));
    }

    #[test]
    fn autotune_arguments() {
        let c = loader_config(args(json!({"preset": "imagenet-val", "prefetch": "auto", "cpu_budget": 1.5}))).unwrap();
        assert!(c.prefetch_auto);
        assert_eq!(c.cpu_budget, Some(1.5));
        let c = loader_config(from_text([
            ("preset", Some("imagenet-val".to_string())),
            ("cpu_budget", Some("3".into())),
            ("prefetch", Some("4".into())),
        ]))
        .unwrap();
        assert_eq!((c.cpu_budget, c.prefetch, c.prefetch_auto), (Some(3.0), 4, false));
        let err = |v: Value| loader_config(args(v)).unwrap_err().to_string();
        for bad in [json!(0), json!(-1), json!("lots"), json!(true), json!(1e9)] {
            let e = err(json!({"preset": "imagenet-val", "cpu_budget": bad}));
            assert!(e.contains("`cpu_budget`") && e.contains("number of cores"), "{e}");
        }
        assert!(err(json!({"preset": "imagenet-val", "prefetch": "soon"})).contains("`prefetch`"));
        assert!(array_config(args(json!({"prefetch": "auto"}))).unwrap_err().to_string().contains("`prefetch`"));
    }
}
