//! `stoker pack`'s rule book ([`pack_options`]), the same for the command line and for
//! `stoker.ray.pack`, its destination ([`pack_destination`]) and the Ray address of `--ray`
//! ([`ray_address`]).

use super::env::env_threads;
use super::{Args, Taker};
use crate::error::{Error, Result};
use crate::pack::{Destination, PackOptions};
use crate::values::{boolean, bytes, non_negative, positive, text, threads};
use serde_json::Value;

/// The options of a pack: `shard_size` (a size, default 256 MiB), `max_side`, `quality`
/// (1 to 100, default 90), `threads` (a number or `auto`: `STOKER_NUM_THREADS`, else the CPU
/// allowance), `prefix` (default `shard`), `overwrite`, `random_access`, `shuffle` and its
/// `seed` (default 0). Unknown arguments are refused.
pub fn pack_options(args: Args) -> Result<PackOptions> {
    let mut a = Taker::new(args);
    let d = PackOptions::default();
    let flag = |a: &mut Taker, k: &str| a.typed(k).map(|v| boolean(k, &v)).transpose().map(Option::unwrap_or_default);
    let (overwrite, random_access, shuffle) =
        (flag(&mut a, "overwrite")?, flag(&mut a, "random_access")?, flag(&mut a, "shuffle")?);
    let shard_size = a.typed("shard_size").map(|v| bytes("shard_size", &v)).transpose()?.unwrap_or(d.shard_size);
    let max_side = a.typed("max_side").map(|v| positive("max_side", &v)).transpose()?;
    let quality = match a.typed("quality") {
        None => d.quality,
        Some(v) => match non_negative("quality", &v)? {
            q @ 1..=100 => q as i32,
            q => return Err(Error::config("quality", format!("must be in 1..=100, got {q}"))),
        },
    };
    let threads = match a.typed("threads").map(|v| threads("threads", &v)).transpose()?.flatten() {
        Some(n) => n,
        None => env_threads()?.unwrap_or_else(crate::cpu::default_threads),
    };
    let prefix = match a.take("prefix") {
        None => d.prefix,
        Some(v) => text("prefix", &v, "a file name")?.to_string(),
    };
    let seed = a.typed("seed").map(|v| non_negative("seed", &v)).transpose()?.unwrap_or(0);
    a.finish()?;
    Ok(PackOptions {
        shard_size,
        max_side,
        quality,
        threads,
        prefix,
        overwrite,
        random_access,
        shuffle: shuffle.then_some(seed),
    })
}

/// The destination of a pack, `arg`: a folder, or a prefix in object storage
/// (`s3://BUCKET/PREFIX`, `gs://...`, `az://...`; its scheme, bucket and prefix checked, the
/// store's client built from the environment, no request made). `http(s)://` is read only.
pub fn pack_destination(arg: &str, v: &Value) -> Result<Destination> {
    Destination::parse(arg, text(arg, v, "a folder or s3://BUCKET/PREFIX")?)
}

/// The cluster `--ray` names: `auto` (the cluster `ray start` made on this machine, or
/// `RAY_ADDRESS`), `local` (a new one-machine cluster), `HOST:PORT` or `ray://HOST:PORT`.
pub fn ray_address(arg: &str, v: &Value) -> Result<String> {
    let s = text(arg, v, "auto, local, HOST:PORT or ray://HOST:PORT")?;
    if s == "auto" || s == "local" {
        return Ok(s.to_string());
    }
    let hostport = s.strip_prefix("ray://").unwrap_or(s);
    let ok = match hostport.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && !host.contains('/')
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p > 0)
        }
        None => false,
    };
    if !ok {
        return Err(Error::config(arg, format!("expected auto, local, HOST:PORT or ray://HOST:PORT, got {s:?}")));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use super::super::args;
    use super::*;
    use serde_json::json;

    #[test]
    fn options_are_checked() {
        let o = pack_options(args(json!({"shard_size": "1MiB", "max_side": 256, "threads": 2}))).unwrap();
        assert_eq!((o.shard_size, o.max_side, o.threads, o.quality), (1 << 20, Some(256), 2, 90));
        let o = pack_options(args(json!({"shuffle": true, "seed": 7}))).unwrap();
        assert_eq!(o.shuffle, Some(7));
        for (bad, arg) in [
            (json!({"quality": 0}), "`quality`"),
            (json!({"quality": 101}), "`quality`"),
            (json!({"max_side": 0}), "`max_side`"),
            (json!({"shard_size": "lots"}), "`shard_size`"),
            (json!({"random_access": 1}), "`random_access`"),
            (json!({"shard": 1}), "`shard`"),
        ] {
            let e = pack_options(args(bad.clone())).unwrap_err().to_string();
            assert!(e.contains(arg), "{bad}: {e}");
        }
    }

    #[test]
    fn destinations_are_checked() {
        assert!(
            matches!(pack_destination("dst", &json!("out/a")).unwrap(), Destination::Folder(p) if p == std::path::Path::new("out/a"))
        );
        let d = pack_destination("dst", &json!("s3://bucket/some/prefix/")).unwrap();
        assert!(d.is_remote() && d.describe() == "s3://bucket/some/prefix");
        assert_eq!(d.locate("x.tar"), std::path::Path::new("s3://bucket/some/prefix/x.tar"));
        for (bad, words) in [
            (json!(""), "got nothing"),
            (json!(3), "`dst`"),
            (json!("https://host/x"), "cannot write to https://"),
            (json!("s3://"), "not an object-store URL"),
            (json!("s3://b/x*"), "plain prefix"),
        ] {
            let e = pack_destination("dst", &bad).unwrap_err().to_string();
            assert!(e.contains("`dst`") && e.contains(words), "{bad}: {e}");
        }
    }

    #[test]
    fn ray_addresses() {
        for ok in ["auto", "local", "10.0.0.1:6379", "ray://head:10001", "[::1]:6379"] {
            assert_eq!(ray_address("ray", &json!(ok)).unwrap(), ok);
        }
        for bad in ["", "head", "head:0", "head:99999", "http://x/y:1", ":6379", "a b:1"] {
            assert!(ray_address("ray", &json!(bad)).unwrap_err().to_string().contains("`ray`"), "{bad}");
        }
        assert!(ray_address("ray", &json!(3)).is_err());
    }
}
