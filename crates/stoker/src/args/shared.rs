//! The argument groups more than one kind of loader takes, each read the same way for every
//! kind: the sampler and the ranks, threads/prefetch/memory cap, the cache, the trace.

use super::env::Env;
use super::Taker;
use crate::error::{Error, Result};
use crate::image::cache::CacheSpec;
use crate::shell::sampler::SamplerSpec;
use crate::shell::store::{CacheLocation, StoreSpec};
use crate::values::{batch_bytes, boolean, bytes, non_negative, positive, prefetch, shown, threads};
use serde_json::Value;

/// The shard window `shuffle="shards"` uses when none is given.
pub const DEFAULT_SHARD_WINDOW: usize = 4;

/// Rank and world size: given (`rank`, `world_size`), else those of the initialised
/// `torch.distributed` default group (`group_rank`, `group_world_size`: the Python front
/// passes them when there is one), else torchrun's `RANK` / `WORLD_SIZE` (from `env`), else 0
/// of 1. Where both the group and torchrun's variables are there they must agree: a
/// disagreement is an error naming both, never a silent choice (duplicated or missing data on
/// some rank).
pub(super) fn ranks(a: &mut Taker, env: &Env) -> Result<(usize, usize)> {
    let given_world = a.typed("world_size").map(|v| positive("world_size", &v)).transpose()?;
    let given_rank = a.typed("rank").map(|v| non_negative("rank", &v)).transpose()?.map(|r| r as usize);
    let group_world = a.typed("group_world_size").map(|v| positive("group_world_size", &v)).transpose()?;
    let group_rank = a.typed("group_rank").map(|v| non_negative("group_rank", &v)).transpose()?.map(|r| r as usize);
    let (env_rank, env_world) = (env.rank, env.world_size);
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
pub(super) fn sampler(a: &mut Taker, shards: bool, env: &Env) -> Result<SamplerSpec> {
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
        mixture: None,
    })
}

/// Threads (`None`: `auto`; `STOKER_NUM_THREADS` from `env` when not given), prefetch
/// (`None`: `auto`) and the memory cap.
pub(super) fn common(a: &mut Taker, env: &Env) -> Result<(Option<usize>, Option<usize>, Option<u64>)> {
    let given = a.typed("threads").map(|v| threads("threads", &v)).transpose()?.flatten();
    let threads = given.or(env.threads);
    let prefetch = a.typed("prefetch").map(|v| prefetch("prefetch", &v)).transpose()?.unwrap_or(Some(2));
    let memory_limit = a.typed("memory_limit").map(|v| bytes("memory_limit", &v)).transpose()?;
    Ok((threads, prefetch, memory_limit))
}

/// Where a cache lives, from argument `name`: `"ram"`, a directory, or none.
fn location(a: &mut Taker, name: &str) -> Result<Option<CacheLocation>> {
    match a.take(name) {
        None => Ok(None),
        Some(Value::String(s)) if s == "ram" => Ok(Some(CacheLocation::Ram)),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(CacheLocation::Dir(s.into()))),
        Some(v) => Err(Error::config(name, format!("expected None, 'ram' or a directory, got {}", shown(&v)))),
    }
}

/// The decoded-pixel cache: `cache` (`"ram"` or a directory), `cache_bytes` (a byte size) and
/// `cache_max_side` (pixels); its time to live is `STOKER_CACHE_TTL` (from `env`). Whether the
/// directory can be written is checked when the loader opens it.
pub(super) fn cache(a: &mut Taker, env: &Env) -> Result<Option<CacheSpec>> {
    let bytes = a.typed("cache_bytes").map(|v| bytes("cache_bytes", &v)).transpose()?;
    let max_side = a.typed("cache_max_side").map(|v| positive("cache_max_side", &v)).transpose()?;
    match location(a, "cache")? {
        Some(location) => Ok(Some(CacheSpec { location, bytes, max_side, ttl: env.cache_ttl })),
        None if bytes.is_some() => Err(Error::config("cache_bytes", "needs cache='ram' or a cache directory")),
        None if max_side.is_some() => Err(Error::config("cache_max_side", "needs cache='ram' or a cache directory")),
        None => Ok(None),
    }
}

/// The local shard cache of shards in object storage: `shard_cache` (`"ram"` or a directory)
/// and `shard_cache_bytes` (a byte size); its time to live is `STOKER_CACHE_TTL` (from `env`).
pub(super) fn shard_cache(a: &mut Taker, env: &Env) -> Result<Option<StoreSpec>> {
    let bytes = a.typed("shard_cache_bytes").map(|v| bytes("shard_cache_bytes", &v)).transpose()?;
    match location(a, "shard_cache")? {
        Some(location) => Ok(Some(StoreSpec { location, bytes, ttl: env.cache_ttl })),
        None if bytes.is_some() => Err(Error::config("shard_cache_bytes", "needs shard_cache='ram' or a directory")),
        None => Ok(None),
    }
}

/// The trace: `trace` (the file) and `trace_events` (the ring's size, default
/// [`crate::observe::trace::DEFAULT_MAX_EVENTS`]). Whether the file's folder exists is checked when the
/// loader is made.
pub(super) fn trace(a: &mut Taker) -> Result<Option<crate::observe::trace::TraceSpec>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::env::env_of;
    use crate::args::image::loader_config_in;
    use crate::args::{args, loader_config};
    use serde_json::json;

    #[test]
    fn ranks_come_from_the_arguments_the_group_or_torchrun() {
        let config = |vars: &[(&str, Option<&str>)]| {
            loader_config_in(args(json!({"preset": "imagenet-val"})), &env_of(vars).unwrap())
        };
        assert!(config(&[("WORLD_SIZE", Some("4")), ("RANK", Some("4"))]).unwrap_err().to_string().contains("`rank`"));
        let c = config(&[("WORLD_SIZE", Some("4")), ("RANK", Some("3"))]).unwrap();
        assert_eq!((c.sampler.rank, c.sampler.world_size), (3, 4));
        // An initialised torch.distributed group (what the Python front passes): used when
        // nothing else is, checked against torchrun's variables when both are there.
        let grouped = |extra: Value, vars: &[(&str, Option<&str>)]| {
            let mut a = json!({"preset": "imagenet-val", "group_rank": 2, "group_world_size": 4});
            a.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            loader_config_in(args(a), &env_of(vars).unwrap()).map(|c| (c.sampler.rank, c.sampler.world_size))
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
}
