//! Every environment variable stoker reads, read here and nowhere else, each checked once: a bad
//! value is an [`Error::Config`] naming the variable and what it may be, never ignored.
//!
//! | variable | what it sets |
//! |---|---|
//! | `STOKER_NUM_THREADS` | a fixed decode/tokenizer thread count, as if given as `threads=` |
//! | `STOKER_OBJECT_TIMEOUT` | the time bound of an object-store request, in seconds |
//! | `STOKER_SHARED_BUDGET`, `STOKER_BUDGET_FILE` | the host-wide CPU registry ([`crate::observe::budget`]) |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK` | torchrun's ranks (`LOCAL_RANK`: this process's GPU) |
//! | `STOKER_INDEX_DIR`, `XDG_CACHE_HOME`, `HOME` | where document indexes are stored |
//! | `STOKER_CACHE_TTL` | how long an idle cache group is kept |
//!
//! [`Env`] is all of them at once, read and checked together: the config builders of this
//! folder read one snapshot per config, take what they need from it and [`Env::apply`] hands
//! the lower modules their settings as plain values (the object store's request bound goes to
//! [`crate::source::set_object_timeout`]); no module below `args` reads the environment. The
//! functions of one variable ([`env_threads`], [`local_rank`], [`index_dir`], ...) serve the
//! CLI and the Python front, which ask for one of them on its own.
//!
//! Object-store credentials and endpoints (`AWS_*`, `GOOGLE_*`, `AZURE_*`) are read by the
//! `object_store` crate's builders, which are given them by name; stoker reads none of them.

use crate::error::{Error, Result};
use crate::shell::store::Ttl;
use crate::values::{parse_ttl, MAX_THREADS};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where environment variables are read: the process's environment ([`process_var`]), or in
/// tests a table of their own (tests that changed the process's environment would race with
/// every other test of the binary that reads it).
pub(super) type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The process's environment: the one read of it in the crate.
fn process_var(name: &str) -> Option<OsString> {
    std::env::var_os(name)
}

/// The environment variable that fixes the decode thread count.
pub const THREADS_VAR: &str = "STOKER_NUM_THREADS";
/// The environment variable that bounds each object-store request, in seconds.
pub const OBJECT_TIMEOUT_VAR: &str = "STOKER_OBJECT_TIMEOUT";
/// The environment variable naming where document indexes are stored (`off`: nowhere).
pub const INDEX_DIR_VAR: &str = "STOKER_INDEX_DIR";
/// The environment variable that sets how long an idle decoded-pixel cache group is kept.
pub const CACHE_TTL_VAR: &str = "STOKER_CACHE_TTL";
/// The environment variable that turns the host-wide CPU registry off.
const SHARED_VAR: &str = "STOKER_SHARED_BUDGET";
/// The environment variable naming the host-wide CPU registry's file.
const BUDGET_FILE_VAR: &str = "STOKER_BUDGET_FILE";

/// Every environment variable stoker reads, checked: what a config takes from the
/// environment. Read with [`Env::read`] (or [`apply_env`], which also hands the lower modules
/// their settings).
#[derive(Debug, Clone, PartialEq)]
pub struct Env {
    /// `STOKER_NUM_THREADS`: a fixed thread count from 1 to [`MAX_THREADS`]; `None` when unset.
    pub threads: Option<usize>,
    /// `STOKER_OBJECT_TIMEOUT`: an object-store request's bound; `None` (the default) when unset.
    pub object_timeout: Option<Duration>,
    /// `STOKER_SHARED_BUDGET` and `STOKER_BUDGET_FILE`: where the host's loaders share its CPU.
    pub budget: BudgetEnv,
    /// torchrun's `RANK`, when set.
    pub rank: Option<usize>,
    /// torchrun's `WORLD_SIZE` (at least 1), when set.
    pub world_size: Option<usize>,
    /// torchrun's `LOCAL_RANK`: this process's GPU index on its node, 0 when unset.
    pub local_rank: u32,
    /// Where document indexes are stored by default (see [`index_dir`]); `None`: nowhere.
    pub index_dir: Option<PathBuf>,
    /// `STOKER_CACHE_TTL`: how long an idle cache group is kept; `None`: the location's default.
    pub cache_ttl: Option<Ttl>,
}

impl Env {
    /// Reads and checks every variable of the process's environment; the first bad one is an
    /// error naming it. Changes nothing: see [`Env::apply`].
    pub fn read() -> Result<Env> {
        Env::read_in(&process_var)
    }

    /// [`Env::read`] from `env`.
    pub(super) fn read_in(env: Lookup<'_>) -> Result<Env> {
        let world_size = match usize_in(env, "WORLD_SIZE")? {
            Some(0) => {
                return Err(Error::config("WORLD_SIZE", "environment variable WORLD_SIZE=0: must be at least 1"));
            }
            w => w,
        };
        Ok(Env {
            threads: threads_in(env)?,
            object_timeout: timeout_in(env)?,
            budget: budget_in(env)?,
            rank: usize_in(env, "RANK")?,
            world_size,
            local_rank: local_rank_in(env)?.unwrap_or(0),
            index_dir: index_dir_in(env)?,
            cache_ttl: cache_ttl_in(env)?,
        })
    }

    /// Hands the modules below `args` the settings of this environment, as plain values: the
    /// object store's request bound ([`crate::source::set_object_timeout`]). The config
    /// builders of `args` call it each time they read the environment, so a loader's sources,
    /// opened after its config is built, use the environment of that moment.
    pub fn apply(&self) {
        crate::source::set_object_timeout(self.object_timeout);
    }
}

/// Reads and checks every variable ([`Env::read`]) and applies it ([`Env::apply`]): what each
/// config builder of `args` does first, and what a program does before it opens object-store
/// data without building a loader config (`stoker pack` of shards in a bucket).
pub fn apply_env() -> Result<Env> {
    let env = Env::read()?;
    env.apply();
    Ok(env)
}

/// The text of environment variable `name` in `env`, trimmed; unset or blank is `None`. A
/// value that is not UTF-8 is an error naming the variable (`allowed` says what it may be).
fn text_in(env: Lookup<'_>, name: &str, allowed: &str) -> Result<Option<String>> {
    match env(name).map(|v| v.into_string()) {
        None => Ok(None),
        Some(Ok(v)) if v.trim().is_empty() => Ok(None),
        Some(Ok(v)) => Ok(Some(v.trim().to_string())),
        Some(Err(v)) => Err(Error::config(name, format!("environment variable {name}={v:?} is not text: {allowed}"))),
    }
}

/// An integer from `env` (torchrun's `RANK`, `WORLD_SIZE`, `LOCAL_RANK`); unset or empty is
/// `None`.
fn usize_in(env: Lookup<'_>, name: &str) -> Result<Option<usize>> {
    let allowed = "expected a non-negative integer";
    let Some(v) = text_in(env, name, allowed)? else { return Ok(None) };
    v.parse::<usize>()
        .map(Some)
        .map_err(|_| Error::config(name, format!("environment variable {name}={v:?}: {allowed}")))
}

/// This process's GPU index on its node: torchrun's `LOCAL_RANK`, 0 when unset (the CUDA
/// ordinal that `device="cuda"` means when no framework has chosen a current device).
pub fn local_rank() -> Result<u32> {
    Ok(local_rank_given()?.unwrap_or(0))
}

/// torchrun's `LOCAL_RANK` as given: `None` when unset (then `device="cuda"` may fall back to
/// the rank in the process group, modulo the visible GPUs).
pub fn local_rank_given() -> Result<Option<u32>> {
    local_rank_in(&process_var)
}

fn local_rank_in(env: Lookup<'_>) -> Result<Option<u32>> {
    let Some(r) = usize_in(env, "LOCAL_RANK")? else { return Ok(None) };
    u32::try_from(r).map(Some).map_err(|_| Error::config("LOCAL_RANK", format!("{r} is not a GPU index")))
}

/// `STOKER_NUM_THREADS`: a fixed decode thread count from 1 to [`MAX_THREADS`], as if given as
/// `threads=`; unset or empty is `None`. Anything else (`abc`, `1e9`, `0`, `100000`) is an
/// error naming the variable.
pub fn env_threads() -> Result<Option<usize>> {
    threads_in(&process_var)
}

fn threads_in(env: Lookup<'_>) -> Result<Option<usize>> {
    let allowed = format!("expected a whole number of threads from 1 to {MAX_THREADS}, or unset it");
    let Some(v) = text_in(env, THREADS_VAR, &allowed)? else { return Ok(None) };
    match v.parse::<u64>() {
        Ok(n) if n >= 1 && n <= MAX_THREADS as u64 => Ok(Some(n as usize)),
        _ => Err(Error::config(THREADS_VAR, format!("environment variable {THREADS_VAR}={v:?}: {allowed}"))),
    }
}

/// `STOKER_OBJECT_TIMEOUT`: an object-store request's time bound, a positive number of seconds
/// up to a day (`5`, `0.5`); unset or empty is `None` (the default).
pub fn object_timeout() -> Result<Option<Duration>> {
    timeout_in(&process_var)
}

fn timeout_in(env: Lookup<'_>) -> Result<Option<Duration>> {
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

/// The CPU registry file the environment names: `STOKER_BUDGET_FILE`, else
/// [`crate::observe::budget::default_path`]; `None` when `STOKER_SHARED_BUDGET=0` turns
/// sharing off. The config builders put it into the loaders' configs (`cpu_registry`).
pub fn budget_registry_path(budget: &BudgetEnv) -> Option<PathBuf> {
    match budget {
        BudgetEnv::Off => None,
        BudgetEnv::File(p) => Some(p.clone()),
        BudgetEnv::Default => Some(crate::observe::budget::default_path()),
    }
}

/// `STOKER_SHARED_BUDGET` (sharing on by default; `0`, `false`, `off`, `no` turn it off, `1`,
/// `true`, `on`, `yes` keep it on) and `STOKER_BUDGET_FILE` (the registry file, when sharing is
/// on: a file path whose folder exists, not a folder itself). Anything else is an error naming
/// the variable.
fn budget_in(env: Lookup<'_>) -> Result<BudgetEnv> {
    let allowed = "expected 0, false, off or no (no sharing) or 1, true, on or yes (sharing, the default)";
    if let Some(v) = text_in(env, SHARED_VAR, allowed)? {
        match v.to_ascii_lowercase().as_str() {
            "0" | "false" | "off" | "no" => return Ok(BudgetEnv::Off),
            "1" | "true" | "on" | "yes" => {}
            _ => return Err(Error::config(SHARED_VAR, format!("environment variable {SHARED_VAR}={v:?}: {allowed}"))),
        }
    }
    let Some(path) = env(BUDGET_FILE_VAR).filter(|p| !p.is_empty()).map(PathBuf::from) else {
        return Ok(BudgetEnv::Default);
    };
    let bad =
        |why: &str| Error::config(BUDGET_FILE_VAR, format!("environment variable {BUDGET_FILE_VAR}={path:?}: {why}"));
    if path.is_dir() {
        return Err(bad("is a folder; name a file (it is created when missing)"));
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !parent.is_dir() {
        return Err(bad("its folder does not exist"));
    }
    Ok(BudgetEnv::File(path))
}

/// Where document indexes are stored by default: `STOKER_INDEX_DIR` (an absolute directory, or
/// `off`), else `$XDG_CACHE_HOME/stoker/doc-index`, else `$HOME/.cache/stoker/doc-index`
/// (`None` where neither is set).
pub fn index_dir() -> Result<Option<PathBuf>> {
    index_dir_in(&process_var)
}

fn index_dir_in(env: Lookup<'_>) -> Result<Option<PathBuf>> {
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

/// `STOKER_CACHE_TTL`: how long a cache group that no process uses is kept before any stoker
/// process opening a cache under the same root removes it: `0` (the last process to leave a
/// group removes it), a number of seconds, or a number with `s`, `m`, `h` or `d`; `never`
/// keeps groups until `stoker cache clear`. Unset or empty is `None` (the location's default).
pub fn env_cache_ttl() -> Result<Option<Ttl>> {
    cache_ttl_in(&process_var)
}

fn cache_ttl_in(env: Lookup<'_>) -> Result<Option<Ttl>> {
    let allowed = "expected 0, a duration such as 3600, 90m, 12h or 7d, or never";
    let Some(v) = text_in(env, CACHE_TTL_VAR, allowed)? else { return Ok(None) };
    parse_ttl(&v)
        .map(Some)
        .ok_or_else(|| Error::config(CACHE_TTL_VAR, format!("environment variable {CACHE_TTL_VAR}={v:?}: {allowed}")))
}

/// An environment of its own for a test: `vars`, nothing else (the process's environment is
/// never changed: other tests of this binary read it).
#[cfg(test)]
pub(super) fn with_env<T>(vars: &[(&str, Option<&str>)], f: impl FnOnce(Lookup<'_>) -> T) -> T {
    let table: std::collections::HashMap<String, OsString> =
        vars.iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), v.into()))).collect();
    f(&move |name: &str| table.get(name).cloned())
}

/// The checked environment of `vars` alone, for a test.
#[cfg(test)]
pub(super) fn env_of(vars: &[(&str, Option<&str>)]) -> Result<Env> {
    with_env(vars, Env::read_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::args;
    use crate::args::arrays::array_config_in;
    use crate::args::image::loader_config_in;
    use serde_json::json;

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
        // The loaders take it when threads are not given; a bad one is refused with the
        // environment, whatever the arguments.
        let three = env_of(&[(THREADS_VAR, Some("3"))]).unwrap();
        assert_eq!(loader_config_in(args(json!({"preset": "imagenet-val"})), &three).unwrap().threads, Some(3));
        assert_eq!(array_config_in(args(json!({"threads": 2})), &three).unwrap().threads, Some(2));
        let e = env_of(&[(THREADS_VAR, Some("lots"))]).unwrap_err().to_string();
        assert!(e.contains("STOKER_NUM_THREADS"), "{e}");
        // Not UTF-8.
        use std::os::unix::ffi::OsStringExt;
        let bytes = OsString::from_vec(b"\xff".to_vec());
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
        let e = env_of(&[("WORLD_SIZE", Some("0"))]).unwrap_err().to_string();
        assert!(e.contains("`WORLD_SIZE`") && e.contains("environment variable"), "{e}");
        let env = env_of(&[("WORLD_SIZE", Some("4")), ("RANK", Some("3"))]).unwrap();
        assert_eq!((env.rank, env.world_size), (Some(3), Some(4)));
        let e = with_env(&[("LOCAL_RANK", Some("99999999999"))], local_rank_in);
        assert!(e.unwrap_err().to_string().contains("`LOCAL_RANK`"));
        assert_eq!(with_env(&[("LOCAL_RANK", Some("2"))], local_rank_in).unwrap(), Some(2));
        assert_eq!(with_env(&[], local_rank_in).unwrap(), None);
        assert_eq!(env_of(&[]).unwrap().local_rank, 0);
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
        let b = |shared: Option<&str>, file: Option<&Path>| {
            with_env(&[(SHARED_VAR, shared), (BUDGET_FILE_VAR, file.map(|f| f.to_str().unwrap()))], budget_in)
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
        assert!(env_of(&[(SHARED_VAR, Some("2"))]).unwrap_err().to_string().contains("`STOKER_SHARED_BUDGET`"));
    }

    #[test]
    fn every_variable_is_read_and_checked_at_once() {
        let env = env_of(&[
            (THREADS_VAR, Some("4")),
            (OBJECT_TIMEOUT_VAR, Some("2.5")),
            (SHARED_VAR, Some("off")),
            ("RANK", Some("1")),
            ("WORLD_SIZE", Some("2")),
            ("LOCAL_RANK", Some("1")),
            (INDEX_DIR_VAR, Some("/idx")),
            (CACHE_TTL_VAR, Some("90m")),
        ])
        .unwrap();
        assert_eq!(
            env,
            Env {
                threads: Some(4),
                object_timeout: Some(Duration::from_millis(2500)),
                budget: BudgetEnv::Off,
                rank: Some(1),
                world_size: Some(2),
                local_rank: 1,
                index_dir: Some(PathBuf::from("/idx")),
                cache_ttl: Some(Ttl::After(Duration::from_secs(5400))),
            }
        );
        // A bad variable is refused whatever a config would take from the environment: an
        // array loader's config with a bad cache time to live or object-store bound.
        for (var, bad) in [(CACHE_TTL_VAR, "soon"), (OBJECT_TIMEOUT_VAR, "0"), (INDEX_DIR_VAR, "rel")] {
            let e = env_of(&[(var, Some(bad))]).unwrap_err().to_string();
            assert!(e.contains(&format!("`{var}`")) && e.contains("environment variable"), "{e}");
        }
    }
}
