//! Globs in the last component of a path or URL (`shards/train-*.tar`, `s3://b/x/part-?.tar`):
//! `*` and `?` only, matched against names, in name order.
//!
//! Owns: matching names. May not touch: opening what they name.

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Expands `*` and `?` in the last component of `pattern` (sorted); a plain path is returned
/// as is.
pub fn expand_glob(pattern: &Path) -> Result<Vec<PathBuf>> {
    let name = pattern.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if !name.contains(['*', '?']) {
        return Ok(vec![pattern.to_path_buf()]);
    }
    let dir = pattern.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut out = vec![];
    let rd = std::fs::read_dir(dir).map_err(|e| Error::Dataset(format!("{}: cannot list: {e}", dir.display())))?;
    for e in rd.flatten() {
        if glob_match(&name, &e.file_name().to_string_lossy()) {
            out.push(e.path());
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(Error::Dataset(format!("no file matches {}", pattern.display())));
    }
    Ok(out)
}

/// `*` and `?` matching of one name.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn m(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], s) || (!s.is_empty() && m(p, &s[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &s[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), name.as_bytes())
}
