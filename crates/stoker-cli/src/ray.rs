//! `--ray ADDRESS` of `stoker pack` and `stoker tokenize`: the same work on a Ray cluster, done
//! by the Python package (`python -m stoker.ray`, the `stoker[ray]` extra). The flags are
//! checked here, by the same rules as without `--ray` (`stoker::args`), and handed over as one
//! JSON object of checked values; the Python side reads them and checks nothing twice.
//!
//! The Python that runs it: `STOKER_PYTHON` (the `stoker` command installed by pip sets it to
//! its own interpreter), else `python3` on the `PATH`.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The variable naming the Python interpreter that runs `stoker.ray`.
pub const PYTHON_VAR: &str = "STOKER_PYTHON";

/// Runs `python -m stoker.ray COMMAND --job JSON` with the checked `address` and `values` (the
/// command's own, typed), the `paths` given, and `json` (print one JSON object); fails when it
/// fails (its error is printed by it).
pub fn run(command: &str, address: &str, paths: &[PathBuf], values: Value, json: bool) -> Result<()> {
    let address = stoker::args::ray_address("ray", &Value::String(address.to_string()))?;
    let paths: Vec<String> = paths.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let job = json!({"address": address, "paths": paths, "values": values, "json": json});
    let python = std::env::var_os(PYTHON_VAR).unwrap_or_else(|| "python3".into());
    let status = std::process::Command::new(&python)
        .args(["-m", "stoker.ray", command, "--job"])
        .arg(job.to_string())
        .status()
        .with_context(|| format!("--ray: cannot run {} -m stoker.ray (set {PYTHON_VAR})", python.to_string_lossy()))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => anyhow::bail!("--ray: the run on the cluster failed (exit code {code}; its error is above)"),
        None => anyhow::bail!("--ray: {} -m stoker.ray was killed by a signal ({status})", python.to_string_lossy()),
    }
}
