//! Arguments from Python for the engine's argument rules ([`stoker::args`]), shared by the
//! loader classes: scalars as JSON values, argument objects and state dicts as JSON texts.

use crate::errors::{self, IntoPy};
use pyo3::prelude::*;
use stoker::ElasticBase;

/// A Python scalar as the JSON value the engine's argument rules read: bool, int, float, str
/// and None; anything else is shown by its repr (and refused by the rule).
pub fn json_of(v: &Bound<'_, PyAny>) -> serde_json::Value {
    use pyo3::types::{PyBool, PyFloat, PyInt, PyString};
    if v.is_none() {
        serde_json::Value::Null
    } else if let Ok(b) = v.cast::<PyBool>() {
        serde_json::Value::Bool(b.is_true())
    } else if v.is_instance_of::<PyInt>() {
        match (v.extract::<u64>(), v.extract::<i64>()) {
            (Ok(n), _) => n.into(),
            (_, Ok(n)) => n.into(),
            _ => serde_json::Value::String(v.to_string()),
        }
    } else if let Ok(f) = v.cast::<PyFloat>() {
        serde_json::Number::from_f64(f.value()).map_or(serde_json::Value::Null, serde_json::Value::Number)
    } else if let Ok(s) = v.cast::<PyString>() {
        serde_json::Value::String(s.to_string())
    } else {
        serde_json::Value::String(v.repr().map(|r| r.to_string()).unwrap_or_default())
    }
}

/// The JSON text of `load_state_dict`'s argument (a state dict, or a list of several ranks')
/// as a value; not JSON is a `ConfigError` naming `state` and what was `expected`.
pub fn state_value(json: &str, expected: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(json).map_err(|e| errors::config("state", format!("expected {expected}, not JSON: {e}")))
}

/// An elastic base as JSON (what `elastic_json()` gives, for a fork child's rebuilt loader).
pub fn elastic_of(json: Option<&str>) -> PyResult<Option<ElasticBase>> {
    json.map(|j| {
        serde_json::from_str(j).map_err(|e| errors::config("elastic_json", format!("not an elastic base: {e}")))
    })
    .transpose()
}

/// An elastic base (or `None`) as JSON.
pub fn elastic_json(base: Option<ElasticBase>) -> PyResult<Option<String>> {
    base.map(|b| serde_json::to_string(&b).map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string()))))
        .transpose()
}

/// An `epoch` argument, checked by the engine.
pub fn epoch_of(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    stoker::args::non_negative("epoch", &json_of(v)).py_err()
}

/// The arguments object of a JSON text.
pub fn args_of(json: &str) -> PyResult<stoker::args::Args> {
    serde_json::from_str(json).map_err(|e| errors::config("arguments", format!("not a JSON object: {e}")))
}
