//! The array loader's rule book: its arguments ([`array_config`]).

use super::env::{apply_env, Env};
use super::shared::{common, sampler};
use super::{Args, Taker};
use crate::arrays::ArrayConfig;
use crate::error::{Error, Result};

/// An [`ArrayConfig`] from named arguments: `batch_size`, `shuffle` (`False`, `True`), `seed`,
/// `drop_last`, `rank`, `world_size`, `threads` (`STOKER_NUM_THREADS` when not given),
/// `prefetch`, `memory_limit`, `mixture` (see `args::mixture`). The row size is not known here: the array loader checks its
/// batch buffer with [`super::batch_bytes`].
pub fn array_config(args: Args) -> Result<ArrayConfig> {
    array_config_in(args, &apply_env()?)
}

/// [`array_config`] with the environment `env`.
pub(super) fn array_config_in(args: Args, env: &Env) -> Result<ArrayConfig> {
    let mut a = Taker::new(args);
    let sampler = sampler(&mut a, false, env)?;
    let (threads, prefetch, memory_limit) = common(&mut a, env)?;
    let prefetch =
        prefetch.ok_or_else(|| Error::config("prefetch", "'auto' is for image loaders; give ArrayLoader a number"))?;
    let mut sampler = sampler;
    if let Some(v) = a.take("mixture") {
        // A source's arrays arrive beside the arguments; it has no field of its own here.
        let (spec, sources) = super::mixture::mixture(&v)?;
        for s in sources {
            s.finish()?;
        }
        sampler.mixture = Some(spec);
    }
    a.finish()?;
    Ok(ArrayConfig { sampler, threads, prefetch, memory_limit })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::args;
    use serde_json::json;

    #[test]
    fn array_arguments() {
        let c = array_config(args(json!({"batch_size": 4, "shuffle": true, "prefetch": 3, "threads": 2}))).unwrap();
        assert_eq!((c.sampler.batch_size, c.sampler.shuffle, c.prefetch, c.threads), (4, true, 3, Some(2)));
        assert!(array_config(args(json!({"shuffle": "shards"}))).unwrap_err().to_string().contains("False or True"));
        assert!(array_config(args(json!({"prefetch": "auto"}))).unwrap_err().to_string().contains("`prefetch`"));
        let e = array_config(args(json!({"preset": "imagenet-val"}))).unwrap_err().to_string();
        assert!(e.contains("`preset`: unknown argument"), "{e}");
    }
}
