//! The one place where what users give is checked: every argument of a loader, a byte size, a
//! thread count, a device string, however it arrives: a command-line flag (text) or a Python
//! keyword (a JSON value). The CLI and the Python package pass values through untouched and map
//! the [`Error::Config`] that comes back (it names the argument in its Python spelling,
//! `memory_limit`; the CLI shows it as `--memory-limit`).
//!
//! A value is a [`serde_json::Value`]: Python sends its keywords as JSON, the CLI sends flag
//! text as JSON strings. So `batch_size` may be `256` (Python) or `"256"` (CLI); `True` is not
//! a number, `"2GiB"` and `2147483648` are both sizes.
//!
//! The same holds for what comes from elsewhere: every environment variable stoker reads
//! ([`env_threads`], [`env_usize`], [`object_timeout`], [`budget_env`]) and a state dict a user
//! hands back ([`saved_state`]) are checked here, field by field, and a bad value is an
//! [`Error::Config`] naming it and what is allowed, never ignored, never a panic or an OS
//! failure further in. Sizes are bounded where they meet memory: a batch buffer whose size
//! overflows or exceeds [`MAX_BATCH_BYTES`], more than [`MAX_THREADS`] threads or
//! [`MAX_PREFETCH`] prefetched batches are refused here, so the engine's own arithmetic on
//! them cannot overflow.

use crate::arrays::ArrayConfig;
use crate::error::{Error, Result};
use crate::image::cache::{CacheLocation, CacheSpec};
use crate::image::ops::{DType, Layout, OpSpec, TransformSpec};
use crate::image::pipeline::{ErrorPolicy, LoaderConfig};
use crate::shell::sampler::{ElasticBase, ElasticStep, Fingerprint, SamplerSpec, SamplerState};
use crate::tokens::{PackMode, TokenConfig, TokenFingerprint, TokenState};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Arguments by name (Python spelling: `batch_size`, `memory_limit`).
pub type Args = Map<String, Value>;

/// The shard window `shuffle="shards"` uses when none is given.
pub const DEFAULT_SHARD_WINDOW: usize = 4;

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

fn shown(v: &Value) -> String {
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
fn unsigned(arg: &str, v: &Value, what: &str) -> Result<u64> {
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
/// through it (in [`from_text`] arguments, every argument that is not text by nature), so the
/// rules below see one kind of value per argument, whoever gave it: Python's `"128"` for a
/// number stays text and is refused.
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
    if n == 0 {
        return Err(Error::config(arg, "must be at least 1, got 0"));
    }
    usize::try_from(n).map_err(|_| Error::config(arg, format!("{n} is too large")))
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

fn text<'a>(arg: &str, v: &'a Value, allowed: &str) -> Result<&'a str> {
    v.as_str().ok_or_else(|| Error::config(arg, format!("expected a string ({allowed}), got {}", shown(v))))
}

/// A positive integer of at most `max` (`what` names the unit in the message: "threads").
fn bounded(arg: &str, v: &Value, max: usize, what: &str) -> Result<usize> {
    let n = unsigned(arg, v, "a positive integer")?;
    if n == 0 || n > max as u64 {
        return Err(Error::config(arg, format!("must be from 1 to {max} {what}, got {n}")));
    }
    Ok(n as usize)
}

/// A thread count: `auto` (`None`: the process's CPU allowance) or an integer from 1 to
/// [`MAX_THREADS`].
pub fn threads(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) if s == "auto" => Ok(None),
        _ => match unsigned(arg, v, "") {
            Ok(_) => bounded(arg, v, MAX_THREADS, "threads (or 'auto')").map(Some),
            Err(_) => Err(Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
        },
    }
}

/// A fixed thread count (`io_threads`): an integer from 1 to [`MAX_THREADS`].
pub fn thread_count(arg: &str, v: &Value) -> Result<usize> {
    bounded(arg, v, MAX_THREADS, "threads")
}

/// A prefetch depth: an integer from 1 to [`MAX_PREFETCH`], or `auto` (`None`: tuned, see
/// [`crate::observe::tune`]).
pub fn prefetch(arg: &str, v: &Value) -> Result<Option<usize>> {
    match v {
        Value::String(s) if s == "auto" => Ok(None),
        _ => match unsigned(arg, v, "") {
            Ok(_) => bounded(arg, v, MAX_PREFETCH, "batches (or 'auto')").map(Some),
            Err(_) => Err(Error::config(arg, format!("expected a positive integer or 'auto', got {}", shown(v)))),
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
pub fn max_failures(v: &Value) -> Result<crate::image::pipeline::MaxFailures> {
    use crate::image::pipeline::MaxFailures;
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
        Value::String(s) => match s.trim().strip_suffix('%') {
            Some(p) => fraction(p.trim().parse::<f64>().map_err(|_| bad())? / 100.0),
            None => Err(bad()),
        },
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
    local_rank_in(&process_env)
}

fn local_rank_in(env: Env<'_>) -> Result<u32> {
    let r = usize_in(env, "LOCAL_RANK")?.unwrap_or(0);
    u32::try_from(r).map_err(|_| Error::config("LOCAL_RANK", format!("{r} is not a GPU index")))
}

/// Where environment variables are read: the process's environment ([`process_env`]), or in
/// tests a table of their own (tests that changed the process's environment would race with
/// every other test of the binary that reads it).
type Env<'a> = &'a dyn Fn(&str) -> Option<std::ffi::OsString>;

/// The process's environment.
fn process_env(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name)
}

/// The text of environment variable `name`, trimmed; unset or blank is `None`. A value that is
/// not UTF-8 is an error naming the variable (`allowed` says what it may be).
pub fn env_text(name: &str, allowed: &str) -> Result<Option<String>> {
    text_in(&process_env, name, allowed)
}

fn text_in(env: Env<'_>, name: &str, allowed: &str) -> Result<Option<String>> {
    match env(name).map(|v| v.into_string()) {
        None => Ok(None),
        Some(Ok(v)) if v.trim().is_empty() => Ok(None),
        Some(Ok(v)) => Ok(Some(v.trim().to_string())),
        Some(Err(v)) => Err(Error::config(name, format!("environment variable {name}={v:?} is not text: {allowed}"))),
    }
}

/// An integer from the environment (torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`); unset or
/// empty is `None`.
pub fn env_usize(name: &str) -> Result<Option<usize>> {
    usize_in(&process_env, name)
}

fn usize_in(env: Env<'_>, name: &str) -> Result<Option<usize>> {
    let allowed = "expected a non-negative integer";
    let Some(v) = text_in(env, name, allowed)? else { return Ok(None) };
    v.parse::<usize>()
        .map(Some)
        .map_err(|_| Error::config(name, format!("environment variable {name}={v:?}: {allowed}")))
}

/// The environment variable that fixes the decode thread count.
pub const THREADS_VAR: &str = "STOKER_NUM_THREADS";

/// `STOKER_NUM_THREADS`: a fixed decode thread count from 1 to [`MAX_THREADS`], as if given as
/// `threads=`; unset or empty is `None`. Anything else (`abc`, `1e9`, `0`, `100000`) is an
/// error naming the variable.
pub fn env_threads() -> Result<Option<usize>> {
    threads_in(&process_env)
}

fn threads_in(env: Env<'_>) -> Result<Option<usize>> {
    let allowed = format!("expected a whole number of threads from 1 to {MAX_THREADS}, or unset it");
    let Some(v) = text_in(env, THREADS_VAR, &allowed)? else { return Ok(None) };
    match v.parse::<u64>() {
        Ok(n) if n >= 1 && n <= MAX_THREADS as u64 => Ok(Some(n as usize)),
        _ => Err(Error::config(THREADS_VAR, format!("environment variable {THREADS_VAR}={v:?}: {allowed}"))),
    }
}

/// The environment variable that bounds each object-store request, in seconds.
pub const OBJECT_TIMEOUT_VAR: &str = "STOKER_OBJECT_TIMEOUT";

/// `STOKER_OBJECT_TIMEOUT`: an object-store request's time bound, a positive number of seconds
/// up to a day (`5`, `0.5`); unset or empty is `None` (the default).
pub fn object_timeout() -> Result<Option<Duration>> {
    timeout_in(&process_env)
}

fn timeout_in(env: Env<'_>) -> Result<Option<Duration>> {
    let allowed = "must be a positive number of seconds, at most 86400 (a day)";
    let Some(v) = text_in(env, OBJECT_TIMEOUT_VAR, allowed)? else { return Ok(None) };
    match v.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(Error::config(
            OBJECT_TIMEOUT_VAR,
            format!("environment variable {OBJECT_TIMEOUT_VAR}={v:?}: {allowed}"),
        )),
    }
}

/// Where the loaders of a host share its CPU (see [`crate::observe::budget`]), from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetEnv {
    /// `STOKER_SHARED_BUDGET` turns sharing off.
    Off,
    /// The default registry file.
    Default,
    /// `STOKER_BUDGET_FILE`: this registry file.
    File(PathBuf),
}

/// The CPU registry the environment names: `STOKER_BUDGET_FILE`, else
/// [`crate::observe::budget::DEFAULT_FILE`] (or the temp dir without `/dev/shm`); `None` when
/// `STOKER_SHARED_BUDGET=0` turns sharing off. A bad value was refused by `loader_config`
/// ([`budget_env`]); a loader configured without it gets the default.
pub fn budget_registry() -> Option<crate::observe::budget::Registry> {
    use crate::observe::budget::{Registry, DEFAULT_FILE};
    match budget_env() {
        Ok(BudgetEnv::Off) => return None,
        Ok(BudgetEnv::File(p)) => return Some(Registry::at(p)),
        Ok(BudgetEnv::Default) | Err(_) => {}
    }
    if std::path::Path::new("/dev/shm").is_dir() {
        Some(Registry::at(DEFAULT_FILE))
    } else {
        Some(Registry::at(std::env::temp_dir().join("stoker-cpu-budget")))
    }
}

/// `STOKER_SHARED_BUDGET` (sharing on by default; `0`, `false`, `off`, `no` turn it off, `1`,
/// `true`, `on`, `yes` keep it on) and `STOKER_BUDGET_FILE` (the registry file, when sharing is
/// on: a file path whose folder exists, not a folder itself). Anything else is an error naming
/// the variable.
pub fn budget_env() -> Result<BudgetEnv> {
    budget_in(&process_env)
}

fn budget_in(env: Env<'_>) -> Result<BudgetEnv> {
    const SHARED: &str = "STOKER_SHARED_BUDGET";
    const FILE: &str = "STOKER_BUDGET_FILE";
    let allowed = "expected 0, false, off or no (no sharing) or 1, true, on or yes (sharing, the default)";
    if let Some(v) = text_in(env, SHARED, allowed)? {
        match v.to_ascii_lowercase().as_str() {
            "0" | "false" | "off" | "no" => return Ok(BudgetEnv::Off),
            "1" | "true" | "on" | "yes" => {}
            _ => return Err(Error::config(SHARED, format!("environment variable {SHARED}={v:?}: {allowed}"))),
        }
    }
    let Some(path) = env(FILE).filter(|p| !p.is_empty()).map(PathBuf::from) else {
        return Ok(BudgetEnv::Default);
    };
    let bad = |why: &str| Error::config(FILE, format!("environment variable {FILE}={path:?}: {why}"));
    if path.is_dir() {
        return Err(bad("is a folder; name a file (it is created when missing)"));
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return Err(bad("its folder does not exist"));
    }
    Ok(BudgetEnv::File(path))
}

/// The key [`from_text`] adds to arguments that are a command line's text.
const FROM_TEXT: &str = "\u{0}from_text";

/// Takes the arguments one by one; what is left at the end is an unknown argument.
struct Taker {
    args: Args,
    /// The arguments are a command line's text ([`from_text`]): numbers and booleans are
    /// read from it by [`text_value`].
    text: bool,
}

impl Taker {
    fn new(mut args: Args) -> Self {
        let text = args.remove(FROM_TEXT).is_some();
        Taker { args, text }
    }

    /// An argument that is text by nature (a path, a name, a choice): as given.
    fn take(&mut self, name: &str) -> Option<Value> {
        self.args.remove(name).filter(|v| !v.is_null())
    }

    /// Any other argument (a number, a boolean, or one of a few words such as `auto`): as
    /// given from Python, through [`text_value`] from a command line.
    fn typed(&mut self, name: &str) -> Option<Value> {
        match self.take(name) {
            Some(Value::String(s)) if self.text => Some(text_value(&s)),
            v => v,
        }
    }

    fn finish(self) -> Result<()> {
        match self.args.keys().next() {
            Some(k) => Err(Error::config(k.as_str(), "unknown argument")),
            None => Ok(()),
        }
    }
}

/// Rank and world size: given (`rank`, `world_size`), else those of the initialised
/// `torch.distributed` default group (`group_rank`, `group_world_size`: the Python front
/// passes them when there is one), else torchrun's `RANK` / `WORLD_SIZE`, else 0 of 1. Where
/// both the group and torchrun's variables are there they must agree: a disagreement is an
/// error naming both, never a silent choice (duplicated or missing data on some rank).
fn ranks(a: &mut Taker, env: Env<'_>) -> Result<(usize, usize)> {
    let given_world = a.typed("world_size").map(|v| positive("world_size", &v)).transpose()?;
    let given_rank = a.typed("rank").map(|v| non_negative("rank", &v)).transpose()?.map(|r| r as usize);
    let group_world = a.typed("group_world_size").map(|v| positive("group_world_size", &v)).transpose()?;
    let group_rank = a.typed("group_rank").map(|v| non_negative("group_rank", &v)).transpose()?.map(|r| r as usize);
    let env_world = match usize_in(env, "WORLD_SIZE")? {
        Some(0) => {
            return Err(Error::config("WORLD_SIZE", "environment variable WORLD_SIZE=0: must be at least 1"));
        }
        w => w,
    };
    let env_rank = usize_in(env, "RANK")?;
    let group = match (group_rank, group_world) {
        (Some(r), Some(w)) => Some((r, w)),
        (None, None) => None,
        _ => return Err(Error::config("group_rank", "group_rank and group_world_size come together")),
    };
    if let Some((gr, gw)) = group {
        let disagree = |name: &str, group: usize, var: usize| {
            Error::config(
                name,
                format!(
                    "torch.distributed's default group says {name} {group}, but the environment variable {} says \
                     {var}; launch so that they agree, or pass rank= and world_size= explicitly",
                    name.to_ascii_uppercase()
                ),
            )
        };
        if let Some(ew) = env_world.filter(|&ew| ew != gw) {
            return Err(disagree("world_size", gw, ew));
        }
        if let Some(er) = env_rank.filter(|&er| er != gr) {
            return Err(disagree("rank", gr, er));
        }
    }
    let world_size = given_world.or(group.map(|g| g.1)).or(env_world).unwrap_or(1);
    let rank = given_rank.or(group.map(|g| g.0)).or(env_rank).unwrap_or(0);
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
fn sampler(a: &mut Taker, shards: bool, env: Env<'_>) -> Result<SamplerSpec> {
    let batch_size = a.typed("batch_size").map(|v| positive("batch_size", &v)).transpose()?.unwrap_or(256);
    // Whatever a sample holds, its slot keeps at least a byte and the bookkeeping; the exact
    // bound, with the sample's size, is checked by the kind of loader.
    batch_bytes(batch_size, 1)?;
    let allowed = if shards { "False, True, 'global' or 'shards'" } else { "False or True" };
    let (shuffle, by_shards) = match a.typed("shuffle") {
        None => (false, false),
        Some(Value::String(s)) if s == "global" => (true, false),
        Some(Value::String(s)) if s == "shards" && shards => (true, true),
        Some(v) => (
            boolean("shuffle", &v)
                .map_err(|_| Error::config("shuffle", format!("expected {allowed}, got {}", shown(&v))))?,
            false,
        ),
    };
    let window = a.typed("shard_window").map(|v| positive("shard_window", &v)).transpose()?;
    let seed = a.typed("seed").map(|v| non_negative("seed", &v)).transpose()?.unwrap_or(0);
    let drop_last = a.typed("drop_last").map(|v| boolean("drop_last", &v)).transpose()?.unwrap_or(false);
    let (rank, world_size) = ranks(a, env)?;
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

/// Threads (`None`: `auto`; `STOKER_NUM_THREADS` when not given), prefetch (`None`: `auto`)
/// and the memory cap.
fn common(a: &mut Taker, env: Env<'_>) -> Result<(Option<usize>, Option<usize>, Option<u64>)> {
    let given = a.typed("threads").map(|v| threads("threads", &v)).transpose()?.flatten();
    // Checked even when `threads` is given: a bad value in the environment is never ignored.
    let from_env = threads_in(env)?;
    let threads = given.or(from_env);
    let prefetch = a.typed("prefetch").map(|v| prefetch("prefetch", &v)).transpose()?.unwrap_or(Some(2));
    let memory_limit = a.typed("memory_limit").map(|v| bytes("memory_limit", &v)).transpose()?;
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
    if let Some(e) = a.typed("apply_exif") {
        spec.apply_exif = boolean("apply_exif", &e)?;
    }
    Ok(spec)
}

/// The config of an image loader whose batches go to a GPU (`on_gpu`) or stay on the host, and
/// how the GPU side normalises them: the one place where that is decided. On a GPU, images
/// cross the bus as uint8 and are normalised there into the asked `dtype` (`float32` by
/// default for the presets, `float16`, `bfloat16`; `uint8` for none); `bfloat16` is made only
/// there, so on the host it is an error naming `dtype`. Otherwise as [`loader_config`].
pub fn image_config(
    mut args: Args,
    on_gpu: bool,
) -> Result<(LoaderConfig, Option<crate::image::ops::DeviceNormalize>)> {
    let bf16 = args.get("dtype").and_then(Value::as_str).is_some_and(|d| d.eq_ignore_ascii_case("bfloat16"));
    if bf16 {
        if !on_gpu {
            return Err(Error::config(
                "dtype",
                "bfloat16 is produced on the GPU; use device='cuda' (or float16/float32 on the CPU)",
            ));
        }
        args.insert("dtype".into(), Value::String("float32".into()));
    }
    let mut config = loader_config(args)?;
    if !on_gpu || config.transform.dtype == DType::Uint8 {
        return Ok((config, None));
    }
    let dtype = if bf16 { "bfloat16" } else { config.transform.dtype.name() };
    let normalize = config.transform.split_for_device(dtype);
    Ok((config, Some(normalize)))
}

/// A [`LoaderConfig`] from named arguments: `batch_size`, `preset` or `ops`, `dtype`,
/// `layout`, `apply_exif`, `shuffle` (`False`, `True`, `global`, `shards`), `shard_window`,
/// `seed`, `drop_last`, `rank`, `world_size` (torchrun's environment by default), `threads`,
/// `io_threads`, `prefetch` (a number or `auto`), `cpu_budget`, `memory_limit`, `on_error` (`skip`, `raise`), `dct_scaling`,
/// `roi`, `max_pixels`, `max_file_bytes`, `max_failures`, `cache`, `cache_bytes`,
/// `cache_max_side`, `trace`, `trace_events`. An unknown name is an error.
pub fn loader_config(args: Args) -> Result<LoaderConfig> {
    loader_config_in(args, &process_env)
}

fn loader_config_in(args: Args, env: Env<'_>) -> Result<LoaderConfig> {
    let mut a = Taker::new(args);
    let transform = transform(&mut a)?;
    let sampler = sampler(&mut a, true, env)?;
    let mut c = LoaderConfig::new(sampler.batch_size, transform);
    c.sampler = sampler;
    let prefetch;
    (c.threads, prefetch, c.memory_limit) = common(&mut a, env)?;
    match prefetch {
        Some(n) => c.prefetch = n,
        None => c.prefetch_auto = true,
    }
    c.cpu_budget = a.typed("cpu_budget").map(|v| cpu_budget("cpu_budget", &v)).transpose()?;
    c.io_threads = a.typed("io_threads").map(|v| thread_count("io_threads", &v)).transpose()?;
    if let Some(p) = a.take("on_error") {
        c.on_error = ErrorPolicy::parse(text("on_error", &p, "skip or raise")?)?;
    }
    if let Some(v) = a.typed("dct_scaling") {
        c.dct_scaling = boolean("dct_scaling", &v)?;
    }
    if let Some(v) = a.typed("roi") {
        c.roi = boolean("roi", &v)?;
    }
    if let Some(v) = a.typed("max_pixels") {
        c.max_pixels = positive("max_pixels", &v)? as u64;
    }
    if let Some(v) = a.typed("max_file_bytes") {
        c.max_file_bytes = bytes("max_file_bytes", &v)?;
    }
    if let Some(v) = a.typed("max_failures") {
        c.max_failures = max_failures(&v)?;
    }
    c.cache = cache(&mut a)?;
    c.trace = trace(&mut a)?;
    a.finish()?;
    batch_bytes(c.sampler.batch_size, sample_bytes(&c.transform)?)?;
    // Read when the loader is made (the host-wide CPU registry): checked here, once.
    budget_in(env)?;
    Ok(c)
}

/// Bytes of one output sample of `spec` (compiling it, which checks the ops), or an error when
/// the output size does not fit in 64 bits.
fn sample_bytes(spec: &TransformSpec) -> Result<u64> {
    let plan = crate::image::ops::TransformPlan::compile(spec)?;
    let (h, w) = plan.output_size();
    (h as u64)
        .checked_mul(w as u64)
        .and_then(|p| p.checked_mul(3 * spec.dtype.size() as u64))
        .ok_or_else(|| Error::config("transforms", format!("an output of {h}x{w} pixels does not fit in memory")))
}

/// The decoded-pixel cache: `cache` (`"ram"` or a directory), `cache_bytes` (a byte size) and
/// `cache_max_side` (pixels). Whether the directory can be written is checked when the loader
/// opens it.
fn cache(a: &mut Taker) -> Result<Option<CacheSpec>> {
    let bytes = a.typed("cache_bytes").map(|v| bytes("cache_bytes", &v)).transpose()?;
    let max_side = a.typed("cache_max_side").map(|v| positive("cache_max_side", &v)).transpose()?;
    let location = match a.take("cache") {
        None => None,
        Some(Value::String(s)) if s == "ram" => Some(CacheLocation::Ram),
        Some(Value::String(s)) if !s.trim().is_empty() => Some(CacheLocation::Dir(s.into())),
        Some(v) => {
            return Err(Error::config("cache", format!("expected None, 'ram' or a directory, got {}", shown(&v))))
        }
    };
    match location {
        Some(location) => Ok(Some(CacheSpec { location, bytes, max_side, ttl: env_cache_ttl()? })),
        None if bytes.is_some() => Err(Error::config("cache_bytes", "needs cache='ram' or a cache directory")),
        None if max_side.is_some() => Err(Error::config("cache_max_side", "needs cache='ram' or a cache directory")),
        None => Ok(None),
    }
}

/// The trace: `trace` (the file) and `trace_events` (the ring's size, default
/// [`crate::observe::trace::DEFAULT_MAX_EVENTS`]). Whether the file's folder exists is checked when the
/// loader is made.
fn trace(a: &mut Taker) -> Result<Option<crate::observe::trace::TraceSpec>> {
    let max_events = a.typed("trace_events").map(|v| positive("trace_events", &v)).transpose()?;
    match a.take("trace") {
        None if max_events.is_some() => Err(Error::config("trace_events", "needs trace=PATH (the trace file)")),
        None => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(crate::observe::trace::TraceSpec {
            path: s.into(),
            max_events: max_events.unwrap_or(crate::observe::trace::DEFAULT_MAX_EVENTS),
        })),
        Some(v) => Err(Error::config("trace", format!("expected None or a file path, got {}", shown(&v)))),
    }
}

/// An [`ArrayConfig`] from named arguments: `batch_size`, `shuffle` (`False`, `True`), `seed`,
/// `drop_last`, `rank`, `world_size`, `threads` (`STOKER_NUM_THREADS` when not given),
/// `prefetch`, `memory_limit`. The row size is not known here: the array loader checks its
/// batch buffer with [`batch_bytes`].
pub fn array_config(args: Args) -> Result<ArrayConfig> {
    array_config_in(args, &process_env)
}

fn array_config_in(args: Args, env: Env<'_>) -> Result<ArrayConfig> {
    let mut a = Taker::new(args);
    let sampler = sampler(&mut a, false, env)?;
    let (threads, prefetch, memory_limit) = common(&mut a, env)?;
    let prefetch =
        prefetch.ok_or_else(|| Error::config("prefetch", "'auto' is for image loaders; give ArrayLoader a number"))?;
    a.finish()?;
    Ok(ArrayConfig { sampler, threads, prefetch, memory_limit })
}

/// The most tokens per row (`seq_len`).
pub const MAX_SEQ_LEN: usize = 1 << 24;
/// The most documents a best-fit block may hold (its plan is quadratic in the worst case).
pub const MAX_PACK_WINDOW: usize = 1 << 16;

/// A [`TokenConfig`] and the tokenizer file from named arguments: `tokenizer` (a path; none
/// for token files), `seq_len` (default 2048), `batch_size` (default 8), `pack` (`concat`,
/// `best_fit`), `pack_window`, `shuffle`, `seed`, `drop_last`, `rank`, `world_size`,
/// `infinite`, `shuffle_window`, `threads` (a number, or `auto`: autotuned within `cpu_budget`
/// cores), `cpu_budget`, `prefetch`, `memory_limit`,
/// `max_document_bytes`, `text_key`, `document` (`file`, `line`: plain text), `token_bytes`
/// (2, 4: `.bin` files), `add_bos`, `add_eos`, `bos_token`, `eos_token`, `eos_id`, `pad_id`,
/// `on_bad_document` (`skip`, `raise`), `max_failures` (a count), `index_cache` (a directory,
/// or `False`; default [`index_dir`]), `cache` (`"ram"` or a directory: the automatic token
/// cache) and `cache_bytes` (its byte budget), as for images.
pub fn token_config(args: Args) -> Result<(TokenConfig, Option<PathBuf>)> {
    token_config_in(args, &process_env)
}

fn token_config_in(args: Args, env: Env<'_>) -> Result<(TokenConfig, Option<PathBuf>)> {
    let mut a = Taker::new(args);
    let tokenizer = match a.take("tokenizer") {
        None | Some(Value::Null) => None,
        Some(v) => Some(PathBuf::from(text("tokenizer", &v, "the path of a tokenizer.json")?)),
    };
    let seq_len =
        a.typed("seq_len").map(|v| bounded("seq_len", &v, MAX_SEQ_LEN, "tokens")).transpose()?.unwrap_or(2048);
    let batch_size = a.typed("batch_size").map(|v| positive("batch_size", &v)).transpose()?.unwrap_or(8);
    if batch_size.checked_mul(seq_len).is_none_or(|t| t > i32::MAX as usize / 4) {
        return Err(Error::config(
            "batch_size",
            format!("batch_size x seq_len = {batch_size} x {seq_len}: at most 2^29 tokens a batch"),
        ));
    }
    let mut c = TokenConfig::new(batch_size, seq_len);
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
    c.cache = cache(&mut a)?;
    if c.cache.as_ref().is_some_and(|s| s.max_side.is_some()) {
        return Err(Error::config("cache_max_side", "is for decoded images: a token cache stores whole documents"));
    }
    c.index_dir = match a.take("index_cache") {
        None | Some(Value::Null) => index_dir_in(env)?,
        Some(Value::Bool(false)) => None,
        Some(v) => match text("index_cache", &v, "a directory, or False")? {
            "off" | "false" | "False" => None,
            d => Some(absolute(PathBuf::from(d))),
        },
    };
    a.finish()?;
    Ok((c, tokenizer))
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

/// The environment variable naming where document indexes are stored (`off`: nowhere).
pub const INDEX_DIR_VAR: &str = "STOKER_INDEX_DIR";

/// Where document indexes are stored by default: `STOKER_INDEX_DIR` (an absolute directory, or
/// `off`), else `$XDG_CACHE_HOME/stoker/doc-index`, else `$HOME/.cache/stoker/doc-index`
/// (`None` where neither is set).
pub fn index_dir() -> Result<Option<PathBuf>> {
    index_dir_in(&process_env)
}

fn index_dir_in(env: Env<'_>) -> Result<Option<PathBuf>> {
    let allowed = "expected an absolute directory or off";
    if let Some(v) = text_in(env, INDEX_DIR_VAR, allowed)? {
        if v == "off" {
            return Ok(None);
        }
        let p = PathBuf::from(&v);
        if !p.is_absolute() {
            return Err(Error::config(INDEX_DIR_VAR, format!("environment variable {INDEX_DIR_VAR}={v:?}: {allowed}")));
        }
        return Ok(Some(p));
    }
    let home = |k: &str| env(k).map(PathBuf::from).filter(|p| p.is_absolute());
    Ok(home("XDG_CACHE_HOME")
        .or_else(|| home("HOME").map(|h| h.join(".cache")))
        .map(|c| c.join("stoker").join("doc-index")))
}

/// `p` made absolute against the current directory (kept as given where that is unknown).
fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        return p;
    }
    std::env::current_dir().map(|c| c.join(&p)).unwrap_or(p)
}

/// A token loader's saved state (the JSON of `TokenLoader.state_dict()`), checked field by
/// field and against `mine`: `seed`, `epoch`, `next_batch`, `cursor_epoch`, `cursor`,
/// `offset` (non-negative integers), `elastic` (absent, or the saved run an elastic resume
/// continues), `version` (1) and `fingerprint` (equal to `mine`, the first difference named;
/// with `ranks_may_differ`, `rank` and `world_size` are not compared: a state of another
/// number of ranks, for [`crate::tokens::TokenLoader::load_states`]).
pub fn token_state(state: &Value, mine: &TokenFingerprint, ranks_may_differ: bool) -> Result<TokenState> {
    let fields = state
        .as_object()
        .ok_or_else(|| Error::config("state", format!("expected a dict from state_dict(), got {}", shown(state))))?;
    let s = Saved { fields, prefix: "state" };
    let int = |k: &str| s.integer(k, true, 0).map(|v| v.unwrap_or_default());
    if let Some(v) = s.integer("version", false, 0)?.filter(|&v| v != 1) {
        return Err(Error::config(s.name("version"), format!("expected 1 (a TokenLoader state), got {v}")));
    }
    let st = TokenState {
        seed: int("seed")?,
        epoch: int("epoch")?,
        next_batch: int("next_batch")?,
        at: crate::tokens::pack::Resume { epoch: int("cursor_epoch")?, cursor: int("cursor")?, offset: int("offset")? },
        elastic: match fields.get("elastic") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let e: crate::tokens::Elastic = serde_json::from_value(v.clone()).map_err(|e| {
                    Error::config(s.name("elastic"), format!("expected the dict state_dict() gives: {e}"))
                })?;
                check_elastic(&e, 0).map_err(|why| Error::config(s.name("elastic"), why))?;
                Some(e)
            }
        },
    };
    let fp = fields
        .get("fingerprint")
        .ok_or_else(|| Error::config("state", "has no 'fingerprint': expected a dict from TokenLoader.state_dict()"))?;
    let theirs: TokenFingerprint = serde_json::from_value(fp.clone())
        .map_err(|e| Error::config(s.name("fingerprint"), format!("not a TokenLoader fingerprint: {e}")))?;
    let (a, b) = (serde_json::to_value(&theirs).unwrap_or_default(), serde_json::to_value(mine).unwrap_or_default());
    if let (Some(a), Some(b)) = (a.as_object(), b.as_object()) {
        for (k, v) in b {
            if ranks_may_differ && (k == "rank" || k == "world_size") {
                continue;
            }
            if a.get(k) != Some(v) {
                return Err(Error::config(
                    format!("state['fingerprint']['{k}']"),
                    format!(
                        "the state was saved with {}, this loader has {}: it is for another dataset, tokenizer, packing or sharding",
                        a.get(k).map_or("nothing".into(), shown),
                        shown(v)
                    ),
                ));
            }
        }
    }
    Ok(st)
}

/// The fields of a saved state (`state_dict()`), for their checks.
struct Saved<'a> {
    fields: &'a Map<String, Value>,
    /// How the fields are named in errors: `state['...']`, `state['fingerprint']['...']`,
    /// `state[2]['...']` (a list's third state).
    prefix: &'a str,
}

impl Saved<'_> {
    fn name(&self, key: &str) -> String {
        format!("{}['{key}']", self.prefix)
    }

    fn get(&self, key: &str, required: bool) -> Result<Option<&Value>> {
        match self.fields.get(key) {
            None if required => Err(Error::config(
                self.prefix,
                format!("has no '{key}': expected a dict from state_dict() of this kind of loader"),
            )),
            v => Ok(v),
        }
    }

    /// An integer of at least `min` (JSON integers only: not a bool, a float or text).
    fn integer(&self, key: &str, required: bool, min: u64) -> Result<Option<u64>> {
        let Some(v) = self.get(key, required)? else { return Ok(None) };
        match v.as_u64() {
            Some(n) if n >= min => Ok(Some(n)),
            _ => {
                let what = if min == 0 { "a non-negative integer".to_string() } else { format!("an integer >= {min}") };
                Err(Error::config(self.name(key), format!("expected {what}, got {}", shown(v))))
            }
        }
    }

    fn text(&self, key: &str) -> Result<()> {
        match self.get(key, true)? {
            Some(Value::String(_)) => Ok(()),
            Some(v) => Err(Error::config(self.name(key), format!("expected a string, got {}", shown(v)))),
            None => Ok(()),
        }
    }

    fn boolean(&self, key: &str) -> Result<()> {
        match self.get(key, true)? {
            Some(Value::Bool(_)) => Ok(()),
            Some(v) => Err(Error::config(self.name(key), format!("expected True or False, got {}", shown(v)))),
            None => Ok(()),
        }
    }
}

/// A checked saved state of an image or array loader: the position and, when its epoch
/// continues saved runs on another number of ranks, their elastic base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedState {
    /// Seed, epoch and the next batch (of the elastic epoch's order, with `elastic`).
    pub state: SamplerState,
    /// The saved runs the epoch continues (`state_dict()['elastic']`), if any.
    pub elastic: Option<ElasticBase>,
}

/// A position a user hands back (`load_state_dict(state)`, the JSON of a `state_dict()`),
/// checked field by field for the loader whose fingerprint is `mine`:
/// - `seed`, `epoch`, `next_batch`: non-negative integers (required); whether `seed` is the
///   loader's and `next_batch` within the epoch is the sampler's check when it is loaded;
/// - `version`: 1, 2 or 3 when present (1: states without a fingerprint, from older releases;
///   3: states of an elastic epoch, which have `elastic`);
/// - `elastic` (version 3 only): a non-empty list of `{world_size, next_batch}` (an integer
///   >= 1, and that many non-negative integers): the saved runs the epoch continues;
/// - `fingerprint` (required by versions 2 and 3): an object whose fields have their types
///   (`samples`, `batch_size`, `world_size`, `rank` integers, `drop_last` a bool, the rest
///   strings), then compared with `mine`, the first difference named;
/// - `batches_per_epoch`, `rank`, `world_size`: integers when present; without a fingerprint,
///   `world_size` must be the loader's.
///
/// Other keys are left alone. Each error names its field (`state['next_batch']`).
pub fn saved_state(state: &Value, mine: &Fingerprint) -> Result<SavedState> {
    Ok(checked_state(state, mine, "state", false)?.0)
}

/// The states of every rank of a saved run (`load_state_dict([...])`, e.g. gathered with
/// `dist.all_gather_object`), checked for continuing its epoch on the loader whose fingerprint
/// is `mine`, which may have another number of ranks: each state as by [`saved_state`]
/// (a fingerprint required; its `rank` and `world_size` may differ from `mine`'s, the rest may
/// not), all of one seed, epoch, world size and elastic base, and every rank `0..world_size`
/// exactly once, in any order. Returns the start of the continued epoch: batch 0 of an
/// elastic base that is the states' own base plus one step, what each saved rank had
/// delivered. Errors name the list element and field (`state[2]['epoch']`).
pub fn saved_states(states: &Value, mine: &Fingerprint) -> Result<SavedState> {
    let list = states.as_array().ok_or_else(|| {
        Error::config("state", format!("expected a list of every rank's state_dict(), got {}", shown(states)))
    })?;
    if list.is_empty() {
        return Err(Error::config("state", "an empty list: give the state_dict() of every rank of the saved run"));
    }
    let mut first: Option<(SavedState, usize)> = None;
    let mut at: Vec<Option<(usize, usize)>> = Vec::new(); // per saved rank: (list index, next_batch)
    for (k, one) in list.iter().enumerate() {
        let prefix = format!("state[{k}]");
        let (saved, ranks) = checked_state(one, mine, &prefix, true)?;
        let (rank, world) = ranks.ok_or_else(|| {
            Error::config(
                prefix.as_str(),
                "has no 'fingerprint': a list of states needs state_dict()s of version 2 or later",
            )
        })?;
        let (f, w) = first.get_or_insert_with(|| (saved.clone(), world));
        let differs = |field: &str, theirs: String, ours: String| {
            Error::config(
                format!("{prefix}[{field}]"),
                format!("is {theirs}, state[0] has {ours}: give the states of one run, saved at one time"),
            )
        };
        if saved.state.seed != f.state.seed {
            return Err(differs("'seed'", saved.state.seed.to_string(), f.state.seed.to_string()));
        }
        if saved.state.epoch != f.state.epoch {
            return Err(differs("'epoch'", saved.state.epoch.to_string(), f.state.epoch.to_string()));
        }
        if world != *w {
            return Err(differs("'fingerprint']['world_size'", world.to_string(), w.to_string()));
        }
        if saved.elastic != f.elastic {
            let show = |e: &Option<ElasticBase>| {
                e.as_ref().map_or("None".into(), |e| serde_json::to_string(e).unwrap_or_default())
            };
            return Err(differs("'elastic'", show(&saved.elastic), show(&f.elastic)));
        }
        if rank >= world {
            return Err(Error::config(
                format!("{prefix}['fingerprint']['rank']"),
                format!("rank {rank} is not in 0..{world} (world_size)"),
            ));
        }
        at.resize(world, None);
        if let Some((j, _)) = at[rank].replace((k, saved.state.next_batch)) {
            return Err(Error::config(
                format!("{prefix}['fingerprint']['rank']"),
                format!(
                    "rank {rank} appears twice in the list (state[{j}] and state[{k}]): give each rank's state once"
                ),
            ));
        }
    }
    let (f, world) = first.expect("a non-empty list");
    let next_batch = at
        .into_iter()
        .enumerate()
        .map(|(r, a)| {
            a.map(|(_, n)| n).ok_or_else(|| {
                Error::config(
                    "state",
                    format!(
                        "has no state of rank {r} of the saved run's {world} ranks: give every rank's state_dict() \
                         (e.g. gathered with dist.all_gather_object)"
                    ),
                )
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut base = f.elastic.unwrap_or_default();
    base.0.push(ElasticStep { world_size: world, next_batch });
    Ok(SavedState { state: SamplerState { next_batch: 0, ..f.state }, elastic: Some(base) })
}

/// [`saved_state`] with its errors named under `prefix`; with `ranks_may_differ` the
/// fingerprint's `rank` and `world_size` are not compared. Also returns `(rank, world_size)`
/// from the fingerprint, when there is one.
fn checked_state(
    state: &Value,
    mine: &Fingerprint,
    prefix: &str,
    ranks_may_differ: bool,
) -> Result<(SavedState, Option<(usize, usize)>)> {
    let fields = state
        .as_object()
        .ok_or_else(|| Error::config(prefix, format!("expected a dict from state_dict(), got {}", shown(state))))?;
    let s = Saved { fields, prefix };
    let seed = s.integer("seed", true, 0)?.unwrap_or_default();
    let epoch = s.integer("epoch", true, 0)?.unwrap_or_default();
    let next_batch = s.integer("next_batch", true, 0)?.unwrap_or_default();
    let next_batch = usize::try_from(next_batch)
        .map_err(|_| Error::config(s.name("next_batch"), format!("{next_batch} is too large")))?;
    let version = s.integer("version", false, 0)?;
    if let Some(v) = version.filter(|v| !matches!(v, 1..=3)) {
        return Err(Error::config(
            s.name("version"),
            format!("expected 1, 2 or 3 (a state from state_dict() of this or an older release), got {v}"),
        ));
    }
    let elastic = match fields.get("elastic") {
        None | Some(Value::Null) => None,
        Some(v) => Some(elastic_base(v, &s.name("elastic"))?),
    };
    match (version, &elastic) {
        (Some(3), None) => {
            return Err(Error::config(
                prefix,
                "has no 'elastic', which a version 3 state always has: expected a dict from state_dict()",
            ))
        }
        (v, Some(_)) if v != Some(3) => {
            return Err(Error::config(
                s.name("version"),
                format!(
                    "a state with 'elastic' is version 3, got {}",
                    v.map_or("no version".to_string(), |v| v.to_string())
                ),
            ))
        }
        _ => {}
    }
    s.integer("batches_per_epoch", false, 0)?;
    s.integer("rank", false, 0)?;
    let world_size = s.integer("world_size", false, 1)?;
    let mut ranks = None;
    match fields.get("fingerprint") {
        Some(Value::Object(fp)) => {
            let fp_prefix = s.name("fingerprint");
            let f = Saved { fields: fp, prefix: &fp_prefix };
            for key in ["samples", "rank"] {
                f.integer(key, true, 0)?;
            }
            for key in ["batch_size", "world_size"] {
                f.integer(key, true, 1)?;
            }
            for key in ["sample_hash", "shuffle", "transform"] {
                f.text(key)?;
            }
            f.boolean("drop_last")?;
            mine.check_as(&Value::Object(fp.clone()), prefix, ranks_may_differ)?;
            let int = |k: &str| fp.get(k).and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok());
            ranks = int("rank").zip(int("world_size"));
        }
        Some(v) => {
            return Err(Error::config(
                s.name("fingerprint"),
                format!("expected the dict state_dict() gives, got {}", shown(v)),
            ))
        }
        None if version.is_some_and(|v| v >= 2) => {
            return Err(Error::config(
                prefix,
                format!(
                    "has no 'fingerprint', which a version {} state always has: expected a dict from state_dict()",
                    version.unwrap_or_default()
                ),
            ))
        }
        None => {
            if let Some(w) = world_size.filter(|&w| !ranks_may_differ && w != mine.world_size as u64) {
                return Err(Error::config(
                    prefix,
                    format!("saved with world_size={w}, this loader has world_size={}", mine.world_size),
                ));
            }
        }
    }
    Ok((SavedState { state: SamplerState { seed, epoch, next_batch }, elastic }, ranks))
}

/// A state's `elastic` (named `name` in errors): a non-empty list of `{world_size, next_batch}`
/// with `world_size` >= 1 and that many non-negative `next_batch` integers. Whether the batch
/// counts fit the loader is the sampler's check when it is loaded.
fn elastic_base(v: &Value, name: &str) -> Result<ElasticBase> {
    let steps = v.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
        Error::config(name, format!("expected the non-empty list state_dict() gives, got {}", shown(v)))
    })?;
    let mut base = Vec::with_capacity(steps.len());
    for (k, step) in steps.iter().enumerate() {
        let step_name = format!("{name}[{k}]");
        let fields = step.as_object().ok_or_else(|| {
            Error::config(
                step_name.as_str(),
                format!("expected a dict {{world_size, next_batch}}, got {}", shown(step)),
            )
        })?;
        let s = Saved { fields, prefix: &step_name };
        let world = s.integer("world_size", true, 1)?.unwrap_or(1);
        let world =
            usize::try_from(world).map_err(|_| Error::config(s.name("world_size"), format!("{world} is too large")))?;
        let next = s.get("next_batch", true)?.and_then(Value::as_array).ok_or_else(|| {
            Error::config(s.name("next_batch"), format!("expected a list of {world} non-negative integers"))
        })?;
        if next.len() != world {
            return Err(Error::config(
                s.name("next_batch"),
                format!("has {} values for world_size={world}: expected one per rank", next.len()),
            ));
        }
        let next_batch = next
            .iter()
            .enumerate()
            .map(|(r, n)| {
                n.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
                    Error::config(
                        format!("{}[{r}]", s.name("next_batch")),
                        format!("expected a non-negative integer, got {}", shown(n)),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        base.push(ElasticStep { world_size: world, next_batch });
    }
    Ok(ElasticBase(base))
}

/// Named arguments from `name=value` pairs of flag text (what the CLI has).
pub fn from_text<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<String>)>) -> Args {
    let mut args: Args = pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), Value::String(v)))).collect();
    args.insert(FROM_TEXT.into(), Value::Bool(true));
    args
}

/// The environment variable that sets how long an idle decoded-pixel cache group is kept.
pub const CACHE_TTL_VAR: &str = "STOKER_CACHE_TTL";

pub use crate::image::cache::Ttl;

/// `STOKER_CACHE_TTL`: how long a cache group that no process uses is kept before any stoker
/// process opening a cache under the same root removes it: `0` (the last process to leave a
/// group removes it), a number of seconds, or a number with `s`, `m`, `h` or `d`; `never`
/// keeps groups until `stoker cache clear`. Unset or empty is `None` (the location's default).
pub fn env_cache_ttl() -> Result<Option<Ttl>> {
    let allowed = "expected 0, a duration such as 3600, 90m, 12h or 7d, or never";
    let Some(v) = env_text(CACHE_TTL_VAR, allowed)? else { return Ok(None) };
    parse_ttl(&v)
        .map(Some)
        .ok_or_else(|| Error::config(CACHE_TTL_VAR, format!("environment variable {CACHE_TTL_VAR}={v:?}: {allowed}")))
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
fn parse_ttl(v: &str) -> Option<Ttl> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
    use serde_json::json;

    fn args(v: Value) -> Args {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_gpu_normalises_what_the_host_would() {
        use crate::image::ops::{OpSpec, IMAGENET_MEAN, IMAGENET_STD};
        let a = |v: Value| {
            let mut m = args(v);
            m.insert("batch_size".into(), json!(8));
            m
        };
        let norm_ops =
            |c: &LoaderConfig| c.transform.ops.iter().filter(|o| matches!(o, OpSpec::Normalize { .. })).count();
        // On the host: the transform as asked, nothing for a GPU; bfloat16 is refused there.
        let (host, n) = image_config(a(json!({"preset": "imagenet-train"})), false).unwrap();
        assert!(n.is_none() && host.transform.dtype == DType::Float32 && norm_ops(&host) == 1);
        let e = image_config(a(json!({"preset": "imagenet-val", "dtype": "bfloat16"})), false).unwrap_err();
        assert!(matches!(&e, Error::Config { .. }) && e.to_string().contains("bfloat16"), "{e}");
        // On a GPU: uint8 over the bus, Normalize's mean and std (and the dtype) for the GPU side.
        for (dtype, want) in [(None, "float32"), (Some("float16"), "float16"), (Some("bfloat16"), "bfloat16")] {
            let mut v = json!({"preset": "imagenet-train", "layout": "NHWC"});
            if let Some(d) = dtype {
                v["dtype"] = d.into();
            }
            let (gpu, n) = image_config(a(v), true).unwrap();
            let n = n.expect("normalised on the GPU");
            assert_eq!((n.mean, n.std, n.dtype.as_str(), n.channels_last), (IMAGENET_MEAN, IMAGENET_STD, want, true));
            assert!(gpu.transform.dtype == DType::Uint8 && norm_ops(&gpu) == 0, "{:?}", gpu.transform);
            let host = image_config(a(json!({"preset": "imagenet-train"})), false).unwrap().0;
            assert_eq!(gpu.transform.ops.len(), host.transform.ops.len() - 1, "only Normalize is dropped");
        }
        // uint8 asked: nothing to normalise anywhere.
        let (gpu, n) = image_config(a(json!({"preset": "imagenet-val", "dtype": "uint8"})), true).unwrap();
        assert!(n.is_none() && gpu.transform.dtype == DType::Uint8);
        // Transforms to [0, 1] floats without Normalize: mean 0, std 1 on the GPU.
        let ops = json!([{"op": "CenterCrop", "size": [8, 8]}]);
        let (_, n) = image_config(a(json!({"ops": ops, "dtype": "float32"})), true).unwrap();
        let n = n.unwrap();
        assert_eq!((n.mean, n.std, n.channels_last), ([0.0; 3], [1.0; 3], false));
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
        assert!(max_failures(&json!("100")).is_err());
        assert!(max_failures(&json!("5%")).is_ok());
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
        // Python's text, floats and booleans for numbers are refused, naming the argument;
        // a flag's text for a text argument stays text even when it looks like a number.
        for (k, v) in [("batch_size", json!("8")), ("seed", json!(1.0)), ("prefetch", json!(true))] {
            let e = err(json!({"preset": "imagenet-val", k: v}));
            assert!(e.starts_with(&format!("invalid argument `{k}`")), "{e}");
        }
        let e = token_config(args(json!({"seq_len": "128"}))).unwrap_err().to_string();
        assert!(e.contains("`seq_len`") && e.contains("(a str)"), "{e}");
        let (t, _) =
            token_config(from_text([("text_key", Some("123".into())), ("seq_len", Some("64".into()))])).unwrap();
        assert_eq!((t.text_key.as_str(), t.seq_len), ("123", 64));
        assert!(err(json!({"preset": "imagenet-val", "on_error": "ignore"})).contains("skip, raise"));
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "ram", "cache_bytes": "8GiB"}))).unwrap();
        assert_eq!(
            c.cache,
            Some(CacheSpec { location: CacheLocation::Ram, bytes: Some(8 << 30), max_side: None, ttl: None })
        );
        let c = loader_config(args(json!({"preset": "imagenet-val", "cache": "/tmp/c"}))).unwrap();
        assert_eq!(
            c.cache,
            Some(CacheSpec { location: CacheLocation::Dir("/tmp/c".into()), bytes: None, max_side: None, ttl: None })
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
        let c =
            loader_config(args(json!({"preset": "imagenet-val", "trace": "/tmp/t.json", "trace_events": 50}))).unwrap();
        let t = c.trace.unwrap();
        assert_eq!((t.path.to_str(), t.max_events), (Some("/tmp/t.json"), 50));
        let c = loader_config(args(json!({"preset": "imagenet-val", "trace": "t.json"}))).unwrap();
        assert_eq!(c.trace.unwrap().max_events, crate::observe::trace::DEFAULT_MAX_EVENTS);
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

    /// An environment of its own: `vars`, nothing else (the process's environment is never
    /// changed: other tests of this binary read it).
    fn with_env<T>(vars: &[(&str, Option<&str>)], f: impl FnOnce(Env<'_>) -> T) -> T {
        let table: std::collections::HashMap<String, std::ffi::OsString> =
            vars.iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), v.into()))).collect();
        f(&move |name: &str| table.get(name).cloned())
    }

    #[test]
    fn the_document_index_directory_comes_from_the_argument_or_the_environment() {
        let dir = |vars: &[(&str, Option<&str>)], a: Value| {
            with_env(vars, |e| token_config_in(args(a), e).map(|(c, _)| c.index_dir))
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
    fn stoker_num_threads() {
        let t = |v: Option<&str>| with_env(&[(THREADS_VAR, v)], threads_in);
        assert_eq!(t(None).unwrap(), None);
        assert_eq!(t(Some("")).unwrap(), None);
        assert_eq!(t(Some(" 8 ")).unwrap(), Some(8));
        assert_eq!(t(Some("1024")).unwrap(), Some(1024));
        for bad in ["abc", "1e9", "0", "-3", "100000", "2.5", "auto"] {
            let e = t(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("`STOKER_NUM_THREADS`") && e.contains(&format!("{bad:?}")) && e.contains("from 1 to 1024"),
                "{e}"
            );
        }
        // The loaders read it when threads are not given, and refuse a bad one even when they are.
        let images = |e: Env<'_>| loader_config_in(args(json!({"preset": "imagenet-val"})), e);
        assert_eq!(with_env(&[(THREADS_VAR, Some("3"))], images).unwrap().threads, Some(3));
        let arrays = |e: Env<'_>| array_config_in(args(json!({"threads": 2})), e);
        assert_eq!(with_env(&[(THREADS_VAR, Some("3"))], arrays).unwrap().threads, Some(2));
        let e = with_env(&[(THREADS_VAR, Some("lots"))], arrays).unwrap_err().to_string();
        assert!(e.contains("STOKER_NUM_THREADS"), "{e}");
        // Not UTF-8.
        use std::os::unix::ffi::OsStringExt;
        let bytes = std::ffi::OsString::from_vec(b"\xff".to_vec());
        let e = threads_in(&move |_: &str| Some(bytes.clone())).unwrap_err().to_string();
        assert!(e.contains("`STOKER_NUM_THREADS`") && e.contains("not text"), "{e}");
    }

    #[test]
    fn torchrun_variables() {
        let r = |v: Option<&str>| with_env(&[("RANK", v)], |e| usize_in(e, "RANK"));
        assert_eq!(r(None).unwrap(), None);
        assert_eq!(r(Some("3")).unwrap(), Some(3));
        for bad in ["-1", "x", "1.0"] {
            let e = r(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("`RANK`") && e.contains("non-negative integer"), "{e}");
        }
        let config = |vars: &[(&str, Option<&str>)]| {
            with_env(vars, |e| loader_config_in(args(json!({"preset": "imagenet-val"})), e))
        };
        assert!(config(&[("WORLD_SIZE", Some("0"))]).unwrap_err().to_string().contains("`WORLD_SIZE`"));
        assert!(config(&[("WORLD_SIZE", Some("4")), ("RANK", Some("4"))]).unwrap_err().to_string().contains("`rank`"));
        let c = config(&[("WORLD_SIZE", Some("4")), ("RANK", Some("3"))]).unwrap();
        assert_eq!((c.sampler.rank, c.sampler.world_size), (3, 4));
        // An initialised torch.distributed group (what the Python front passes): used when
        // nothing else is, checked against torchrun's variables when both are there.
        let grouped = |extra: Value, vars: &[(&str, Option<&str>)]| {
            let mut a = json!({"preset": "imagenet-val", "group_rank": 2, "group_world_size": 4});
            a.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            with_env(vars, |e| loader_config_in(args(a), e)).map(|c| (c.sampler.rank, c.sampler.world_size))
        };
        let unset = [("WORLD_SIZE", None), ("RANK", None)];
        assert_eq!(grouped(json!({}), &unset).unwrap(), (2, 4));
        assert_eq!(grouped(json!({}), &[("WORLD_SIZE", Some("4")), ("RANK", Some("2"))]).unwrap(), (2, 4));
        let e = grouped(json!({}), &[("WORLD_SIZE", Some("2")), ("RANK", Some("0"))]).unwrap_err().to_string();
        assert!(e.contains("`world_size`") && e.contains("group says world_size 4") && e.contains("WORLD_SIZE says 2"));
        let e = grouped(json!({}), &[("WORLD_SIZE", Some("4")), ("RANK", Some("1"))]).unwrap_err().to_string();
        assert!(e.contains("`rank`") && e.contains("says rank 2") && e.contains("RANK says 1"), "{e}");
        // Explicit arguments are the user's choice: they win over the group.
        assert_eq!(grouped(json!({"rank": 0, "world_size": 1}), &unset).unwrap(), (0, 1));
        assert!(grouped(json!({"group_rank": null}), &unset).unwrap_err().to_string().contains("come together"));
        let e = with_env(&[("LOCAL_RANK", Some("99999999999"))], local_rank_in);
        assert!(e.unwrap_err().to_string().contains("`LOCAL_RANK`"));
        assert_eq!(with_env(&[("LOCAL_RANK", Some("2"))], local_rank_in).unwrap(), 2);
    }

    #[test]
    fn object_store_timeout() {
        let t = |v: Option<&str>| with_env(&[(OBJECT_TIMEOUT_VAR, v)], timeout_in);
        assert_eq!(t(None).unwrap(), None);
        assert_eq!(t(Some("0.5")).unwrap(), Some(Duration::from_millis(500)));
        for bad in ["0", "-1", "nan", "inf", "1e9", "soon"] {
            let e = t(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("`STOKER_OBJECT_TIMEOUT`") && e.contains("positive number of seconds"), "{e}");
        }
    }

    #[test]
    fn cpu_registry_variables() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("budget");
        let b = |shared: Option<&str>, file: Option<&std::path::Path>| {
            with_env(
                &[("STOKER_SHARED_BUDGET", shared), ("STOKER_BUDGET_FILE", file.map(|f| f.to_str().unwrap()))],
                budget_in,
            )
        };
        assert_eq!(b(None, None).unwrap(), BudgetEnv::Default);
        assert_eq!(b(Some("OFF"), None).unwrap(), BudgetEnv::Off);
        assert_eq!(b(Some("0"), Some(&file)).unwrap(), BudgetEnv::Off);
        assert_eq!(b(Some("yes"), Some(&file)).unwrap(), BudgetEnv::File(file.clone()));
        let e = b(Some("maybe"), None).unwrap_err().to_string();
        assert!(e.contains("`STOKER_SHARED_BUDGET`") && e.contains("\"maybe\"") && e.contains("0, false"), "{e}");
        let e = b(None, Some(dir.path())).unwrap_err().to_string();
        assert!(e.contains("`STOKER_BUDGET_FILE`") && e.contains("is a folder"), "{e}");
        let e = b(None, Some(&dir.path().join("missing/budget"))).unwrap_err().to_string();
        assert!(e.contains("`STOKER_BUDGET_FILE`") && e.contains("folder does not exist"), "{e}");
        let e = with_env(&[("STOKER_SHARED_BUDGET", Some("2"))], |e| {
            loader_config_in(args(json!({"preset": "imagenet-val"})), e)
        });
        assert!(e.unwrap_err().to_string().contains("`STOKER_SHARED_BUDGET`"));
    }

    fn fingerprint() -> Fingerprint {
        let spec = SamplerSpec {
            batch_size: 8,
            shuffle: true,
            seed: 3,
            drop_last: false,
            rank: 0,
            world_size: 1,
            shard_window: None,
        };
        Fingerprint::new(&spec, 96, 0xabc, "t".into())
    }

    fn state() -> Value {
        json!({"version": 2, "seed": 3, "epoch": 2, "next_batch": 5, "batches_per_epoch": 12, "rank": 0,
               "world_size": 1, "fingerprint": serde_json::to_value(fingerprint()).unwrap()})
    }

    #[test]
    fn saved_states_are_checked_field_by_field() {
        let fp = fingerprint();
        assert_eq!(saved_state(&state(), &fp).unwrap().state, SamplerState { seed: 3, epoch: 2, next_batch: 5 });
        // An old state without version or fingerprint.
        let old = json!({"seed": 3, "epoch": 0, "next_batch": 1, "world_size": 1});
        assert_eq!(saved_state(&old, &fp).unwrap().state.next_batch, 1);
        let e = saved_state(&json!({"seed": 3, "epoch": 0, "next_batch": 1, "world_size": 2}), &fp).unwrap_err();
        assert!(e.to_string().contains("saved with world_size=2"), "{e}");
        let edit = |path: &[&str], v: Value| {
            let mut s = state();
            let mut at = &mut s;
            for k in &path[..path.len() - 1] {
                at = at.get_mut(*k).unwrap();
            }
            at.as_object_mut().unwrap().insert(path[path.len() - 1].to_string(), v);
            saved_state(&s, &fp).unwrap_err().to_string()
        };
        for (field, bad) in [
            ("next_batch", json!(-1)),
            ("next_batch", json!(1.5)),
            ("next_batch", json!("3")),
            ("seed", json!(-5)),
            ("seed", json!(true)),
            ("epoch", json!(null)),
            ("epoch", json!(1e30)),
            ("batches_per_epoch", json!(-2)),
            ("world_size", json!(0)),
        ] {
            let e = edit(&[field], bad.clone());
            assert!(e.starts_with(&format!("invalid argument `state['{field}']`")), "{field}={bad}: {e}");
        }
        let e = edit(&["version"], json!(7));
        assert!(e.contains("`state['version']`") && e.contains("expected 1, 2 or 3"), "{e}");
        let e = edit(&["fingerprint"], json!("abc"));
        assert!(e.contains("`state['fingerprint']`"), "{e}");
        for (field, bad) in
            [("samples", json!(-1)), ("batch_size", json!(0)), ("drop_last", json!(0)), ("shuffle", json!(1))]
        {
            let e = edit(&["fingerprint", field], bad);
            assert!(e.starts_with(&format!("invalid argument `state['fingerprint']['{field}']`")), "{e}");
        }
        let e = edit(&["fingerprint", "samples"], json!(95));
        assert!(e.contains("saved with samples=95"), "{e}");
        let mut s = state();
        s.as_object_mut().unwrap().remove("next_batch");
        let e = saved_state(&s, &fp).unwrap_err().to_string();
        assert!(e.contains("`state`") && e.contains("no 'next_batch'"), "{e}");
        let mut s = state();
        s.as_object_mut().unwrap().remove("fingerprint");
        assert!(saved_state(&s, &fp).unwrap_err().to_string().contains("no 'fingerprint'"));
        assert!(saved_state(&json!([1, 2]), &fp).unwrap_err().to_string().contains("expected a dict"));
    }

    #[test]
    fn lists_of_states_continue_elastically() {
        let fp = fingerprint(); // rank 0 of 1: the loader that continues
        let of = |rank: u64, world: u64, next: u64| {
            let mut s = state();
            s["next_batch"] = json!(next);
            s["rank"] = json!(rank);
            s["world_size"] = json!(world);
            s["fingerprint"]["rank"] = json!(rank);
            s["fingerprint"]["world_size"] = json!(world);
            s
        };
        let got = saved_states(&json!([of(2, 3, 4), of(0, 3, 5), of(1, 3, 5)]), &fp).unwrap();
        assert_eq!(got.state, SamplerState { seed: 3, epoch: 2, next_batch: 0 });
        assert_eq!(got.elastic, Some(ElasticBase(vec![ElasticStep { world_size: 3, next_batch: vec![5, 5, 4] }])));
        // States of an elastic epoch add a step to their base.
        let mut a = of(0, 2, 1);
        let mut b = of(1, 2, 2);
        for s in [&mut a, &mut b] {
            s["version"] = json!(3);
            s["elastic"] = json!([{"world_size": 3, "next_batch": [5, 5, 4]}]);
        }
        assert_eq!(
            saved_state(&a, &{
                let mut f = fp.clone();
                f.world_size = 2;
                f
            })
            .unwrap()
            .elastic,
            got.elastic
        );
        let chained = saved_states(&json!([a.clone(), b.clone()]), &fp).unwrap().elastic.unwrap();
        assert_eq!(chained.0.len(), 2);
        assert_eq!(chained.0[1], ElasticStep { world_size: 2, next_batch: vec![1, 2] });

        let err = |v: Value| saved_states(&v, &fp).unwrap_err().to_string();
        assert!(err(json!([])).contains("empty list"));
        assert!(err(json!({"seed": 1})).contains("expected a list"));
        let e = err(json!([of(0, 2, 1), of(0, 2, 1)]));
        assert!(e.contains("`state[1]['fingerprint']['rank']`") && e.contains("appears twice"), "{e}");
        let e = err(json!([of(0, 3, 1), of(2, 3, 1)]));
        assert!(e.contains("no state of rank 1 of the saved run's 3 ranks"), "{e}");
        let e = err(json!([of(0, 2, 1), of(1, 3, 1)]));
        assert!(e.contains("`state[1]['fingerprint']['world_size']`"), "{e}");
        let mut other = of(1, 2, 1);
        other["epoch"] = json!(7);
        let e = err(json!([of(0, 2, 1), other]));
        assert!(e.contains("`state[1]['epoch']`") && e.contains("is 7, state[0] has 2"), "{e}");
        let mut other = of(1, 2, 1);
        other["fingerprint"]["samples"] = json!(95);
        let e = err(json!([of(0, 2, 1), other]));
        assert!(e.contains("`state[1]`") && e.contains("saved with samples=95"), "{e}");
        let e = err(json!([a.clone(), of(1, 2, 1)]));
        assert!(e.contains("`state[1]['elastic']`"), "{e}");
        let mut rank_out = of(1, 2, 1);
        rank_out["fingerprint"]["rank"] = json!(5);
        assert!(err(json!([of(0, 2, 1), rank_out])).contains("rank 5 is not in 0..2"));
        let mut old = of(1, 2, 1);
        old.as_object_mut().unwrap().remove("fingerprint");
        old.as_object_mut().unwrap().remove("version");
        assert!(err(json!([of(0, 2, 1), old])).contains("`state[1]`: has no 'fingerprint'"));
        let mut negative = of(1, 2, 1);
        negative["next_batch"] = json!(-1);
        let e = err(json!([of(0, 2, 1), negative]));
        assert!(e.contains("`state[1]['next_batch']`"), "{e}");

        // The elastic field of one state, checked.
        let one = |elastic: Value, version: Value| {
            let mut s = state();
            s["elastic"] = elastic;
            s["version"] = version;
            saved_state(&s, &fp).map(|s| s.elastic)
        };
        let e = one(json!([{"world_size": 2, "next_batch": [1]}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['next_batch']`") && e.contains("1 values for world_size=2"), "{e}");
        let e = one(json!([{"world_size": 2, "next_batch": [1, -1]}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['next_batch'][1]`"), "{e}");
        let e = one(json!([{"world_size": 0, "next_batch": []}]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic'][0]['world_size']`"), "{e}");
        let e = one(json!([]), json!(3)).unwrap_err().to_string();
        assert!(e.contains("`state['elastic']`"), "{e}");
        let e = one(json!([{"world_size": 1, "next_batch": [1]}]), json!(2)).unwrap_err().to_string();
        assert!(e.contains("`state['version']`") && e.contains("version 3"), "{e}");
        let e = one(Value::Null, json!(3)).unwrap_err().to_string();
        assert!(e.contains("has no 'elastic'"), "{e}");
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
