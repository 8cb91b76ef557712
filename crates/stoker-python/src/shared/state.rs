//! The state dict of the loaders whose position is the sampler's (images, arrays), built and
//! restored once for both: what their [`super::loader::LoaderClass`] state methods call. The
//! token kinds write their own (their states have other fields); the Python methods over all
//! of them (`state_json`, `load_state_json`, `load_states_json`) are `loader_class!`'s.

use crate::errors::IntoPy;
use pyo3::prelude::*;
use serde_json::{json, Value};
use stoker::shell::kind::{Loader, SamplerKind};
use stoker::Fingerprint;

fn internal(e: serde_json::Error) -> PyErr {
    crate::errors::to_py(stoker::Error::Internal(e.to_string()))
}

/// The state dict (`version` 2, or 3 in an epoch continued from other ranks' states, with
/// its `elastic` base): `{version, seed, epoch, next_batch, batches_per_epoch, rank,
/// world_size, fingerprint[, elastic]}`.
pub(crate) fn state_value<K: SamplerKind>(
    loader: &Loader<K>,
    fingerprint: &Fingerprint,
    (rank, world_size): (usize, usize),
) -> PyResult<Value> {
    let s = loader.state();
    let elastic = loader.elastic();
    let mut v = json!({
        "version": if elastic.is_some() { 3 } else { 2 }, "seed": s.seed, "epoch": s.epoch,
        "next_batch": s.next_batch, "batches_per_epoch": loader.len(), "rank": rank, "world_size": world_size,
        "fingerprint": serde_json::to_value(fingerprint).map_err(internal)?,
    });
    if let Some(e) = elastic {
        v["elastic"] = serde_json::to_value(e).map_err(internal)?;
    }
    Ok(v)
}

/// Restores one state dict, checked field by field and against `mine` (the loader's
/// fingerprint); an elastic epoch's order is computed on loading, without the GIL.
pub(crate) fn load_state<K: SamplerKind>(
    py: Python<'_>,
    loader: &Loader<K>,
    mine: &Fingerprint,
    state: &Value,
) -> PyResult<()> {
    let st = stoker::args::saved_state(state, mine).py_err()?;
    py.detach(|| match st.elastic {
        Some(e) => loader.load_elastic(st.state, e),
        None => loader.load_state(st.state),
    })
    .py_err()
}

/// Continues a run saved by several ranks (the list of every rank's state dict) on this
/// loader's ranks.
pub(crate) fn load_states<K: SamplerKind>(
    py: Python<'_>,
    loader: &Loader<K>,
    mine: &Fingerprint,
    states: &Value,
) -> PyResult<()> {
    let st = stoker::args::saved_states(states, mine).py_err()?;
    py.detach(|| loader.load_elastic(st.state, st.elastic.unwrap_or_default())).py_err()
}
