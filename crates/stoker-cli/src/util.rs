//! What the commands share: reading the engine's errors in flag terms, process CPU time and
//! peak memory, progress bars, a temporary folder.

use anyhow::Result;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// The flag that sets engine argument `arg` (`memory_limit` → `--memory-limit`); `None` for
/// names that are not flags (environment variables, the positional root and destination).
fn flag(arg: &str) -> Option<String> {
    match arg {
        "root" | "dst" | "transforms" | "ops" => None,
        "drop_last" => Some("--keep-last".into()),
        "shuffle" => Some("--shard-window".into()),
        "apply_exif" => Some("--no-exif".into()),
        a if a.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') => Some(format!("--{}", a.replace('_', "-"))),
        _ => None,
    }
}

/// One line for an error: an engine argument error names the flag once (`--batch-size: must
/// be at least 1, got 0`); anything else is printed with its causes.
pub fn describe(e: &anyhow::Error) -> String {
    if let Some(stoker::Error::Config { arg, reason }) = e.downcast_ref::<stoker::Error>() {
        if let Some(f) = flag(arg) {
            return format!("{f}: {reason}");
        }
    }
    format!("{e:#}")
}

/// Seconds of CPU this process has used (user + system, all threads).
pub fn cpu_seconds() -> f64 {
    let ru = rusage();
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The peak resident set of this process, in bytes.
pub fn peak_rss_bytes() -> u64 {
    rusage().ru_maxrss as u64 * 1024
}

fn rusage() -> libc::rusage {
    // SAFETY: getrusage fills the zeroed struct we pass; RUSAGE_SELF is always valid.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    }
}

/// A progress bar on a terminal (hidden for `--json`).
pub fn progress(len: u64, hidden: bool, template: &str) -> ProgressBar {
    let bar = if hidden { ProgressBar::hidden() } else { ProgressBar::new(len) };
    bar.set_style(ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar
}

/// A temporary directory removed on drop (std only).
pub struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A new, empty temporary directory.
pub fn tempdir() -> Result<TempDir> {
    let base = std::env::temp_dir();
    for k in 0..1000u32 {
        let p = base.join(format!("stoker-demo-{}-{k}", std::process::id()));
        if std::fs::create_dir(&p).is_ok() {
            return Ok(TempDir(p));
        }
    }
    anyhow::bail!("cannot create a temporary folder in {}", base.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_argument_errors_name_the_flag_once() {
        let e: anyhow::Error = stoker::args::parse_bytes("memory_limit", "12parsecs").unwrap_err().into();
        let line = describe(&e);
        assert!(line.starts_with("--memory-limit: unknown unit"), "{line}");
        assert_eq!(line.matches("memory").count(), 1, "{line}");
        let e: anyhow::Error = stoker::Error::config("WORLD_SIZE", "environment variable WORLD_SIZE=x").into();
        assert!(describe(&e).starts_with("invalid argument `WORLD_SIZE`"));
    }
}
