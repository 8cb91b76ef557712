//! The one place where what users give is checked: every argument of a loader, a byte size, a
//! thread count, a device string, however it arrives: a command-line flag (text) or a Python
//! keyword (a JSON value). The CLI and the Python package pass values through untouched and map
//! the [`Error::Config`] that comes back (it names the argument in its
//! Python spelling, `memory_limit`; the CLI shows it as `--memory-limit`).
//!
//! A value is a [`serde_json::Value`]: Python sends its keywords as JSON, the CLI sends flag
//! text as JSON strings. So `batch_size` may be `256` (Python) or `"256"` (CLI); `True` is not
//! a number, `"2GiB"` and `2147483648` are both sizes.
//!
//! The same holds for what comes from elsewhere: every environment variable stoker reads
//! ([`Env`]) and a state dict a user hands back ([`saved_state`], [`token_state`]) are checked
//! here, field by field, and a bad value is an [`Error::Config`] naming
//! it and what is allowed, never ignored, never a panic or an OS failure further in. Sizes are
//! bounded where they meet memory: a batch buffer whose size overflows or exceeds
//! [`MAX_BATCH_BYTES`], more than [`MAX_THREADS`] threads or [`MAX_PREFETCH`] prefetched
//! batches are refused here, so the engine's own arithmetic on them cannot overflow. A loader
//! given a config made by hand checks it with the same rules ([`check_threads`],
//! [`check_io_threads`], [`check_prefetch`], [`batch_bytes`], [`token_values`]).
//!
//! The rule books, one job each:
//! - `mod.rs`: taking named arguments one by one ([`Args`], [`from_text`]), and the paths
//!   every caller uses (`stoker::args::loader_config`, ...);
//! - [`crate::values`] (beside `error.rs`, below every room, so the loaders reach it without
//!   importing back up): the rules for one value (integers, booleans, sizes, thread counts,
//!   prefetch, CPU budgets, batch buffers, devices, durations), each limit written once;
//! - `env.rs`: every environment variable stoker reads, read there and nowhere else ([`Env`]);
//!   it hands the modules below `args` their settings as plain values ([`Env::apply`]);
//! - `shared.rs`: the argument groups of more than one kind (sampler and ranks,
//!   threads/prefetch/memory, cache, trace);
//! - `mixture.rs`: the `mixture` argument (sources, weights, exhaustion, epoch length), each
//!   source's own fields handed back to its kind;
//! - `image.rs`, `arrays.rs`, `tokens.rs`: each kind's config ([`loader_config`] and
//!   [`image_config`], [`array_config`], [`token_config`] and [`token_state`]);
//! - `pack.rs`: `stoker pack`'s options ([`pack_options`], the CLI's and `stoker.ray.pack`'s) and
//!   the Ray address of `--ray` ([`ray_address`]);
//! - `tokenizer.rs`: the `Tokenizer` class's token names ([`tokenizer_names`]) and the options
//!   of a call to encode ([`encode_options`]);
//! - [`augment`] (in [`crate::values`], below the rooms, as compiling a transform calls it):
//!   the augmentation ops' arguments ([`policy`], [`jitter_ranges`], [`timm_rand_augment`],
//!   [`erasing`], ...);
//! - `captions.rs`: the caption encoder's options ([`caption_options`]; their limits are
//!   [`crate::values::check_caption_values`]) and a pair loader's captions ([`captions`]);
//! - `state.rs`: the saved states of image and array loaders ([`saved_state`],
//!   [`saved_states`]).
//!
//! Owns: every check of a value from a user, a file or the environment. May not touch: any
//! work. It builds plain configs, and the rooms below take them; they call back here only for
//! the checks of a config made by hand (`check_*`, [`batch_bytes`], [`token_values`]) and, until
//! a config carries it, for the CPU registry the environment names ([`budget_registry_path`]).

mod arrays;
mod captions;
mod env;
mod image;
mod mixture;
mod pack;
mod shared;
mod state;
mod tokenizer;
mod tokens;

pub use crate::values::augment;
pub use crate::values::{
    batch_bytes, boolean, bytes, check_caption_values, check_io_threads, check_positive, check_prefetch, check_threads,
    cpu_budget, duration, non_negative, parse_bytes, positive, prefetch, text_value, thread_count, threads,
    token_values, DeviceSpec, MAX_BATCH_BYTES, MAX_BATCH_TOKENS, MAX_CONTEXT_LENGTH, MAX_PREFETCH, MAX_SEQ_LEN,
    MAX_THREADS, SLOT_BYTES_PER_SAMPLE,
};
pub use arrays::array_config;
pub use augment::{
    auto_augment_policy, erasing, fill_bytes, jitter_ranges, policy, probability, rand_augment, timm_rand_augment,
    TimmConfig, MAX_MAGNITUDE_BINS, MAX_RAND_AUGMENT_OPS,
};
pub use captions::{caption_options, captions};
pub use env::{
    apply_env, budget_registry_path, env_cache_ttl, env_threads, index_dir, local_rank, local_rank_given,
    object_timeout, BudgetEnv, Env, CACHE_TTL_VAR, INDEX_DIR_VAR, OBJECT_TIMEOUT_VAR, THREADS_VAR,
};
pub use image::{decode_where, image_config, loader_config, max_failures};
pub use pack::{pack_destination, pack_options, ray_address};
pub use shared::DEFAULT_SHARD_WINDOW;
pub use state::{
    check_fingerprint, load_state_dict, load_state_dicts, read_state, read_states, ReadState, Saved, SavedBy,
};
pub use tokenizer::{encode_options, tokenizer_names};
pub use tokens::{token_config, MAX_PACK_WINDOW};

pub use crate::shell::store::Ttl;

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// Arguments by name (Python spelling: `batch_size`, `memory_limit`).
pub type Args = Map<String, Value>;

/// The key [`from_text`] adds to arguments that are a command line's text.
const FROM_TEXT: &str = "\u{0}from_text";

/// Named arguments from `name=value` pairs of flag text (what the CLI has).
pub fn from_text<'a>(pairs: impl IntoIterator<Item = (&'a str, Option<String>)>) -> Args {
    let mut args: Args = pairs.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), Value::String(v)))).collect();
    args.insert(FROM_TEXT.into(), Value::Bool(true));
    args
}

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

/// Arguments from a JSON object, for tests.
#[cfg(test)]
pub(crate) fn args(v: Value) -> Args {
    v.as_object().unwrap().clone()
}
