//! The one error type of the engine: categorical variants that carry the file or argument at fault.
//!
//! Every error a user can see names *what* went wrong and *where* (a path, a sample index, a flag),
//! so a skipped-sample report or an exception message is actionable on its own.

use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in stoker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read (missing, unreadable, a directory, ...).
    #[error("{path}: {reason}")]
    Io {
        /// The file that failed.
        path: PathBuf,
        /// Why, in words (the OS error).
        reason: String,
    },
    /// A file was read but is not a valid image (corrupt, truncated, empty, unknown format).
    #[error("{path}: {reason}")]
    Decode {
        /// The file that failed.
        path: PathBuf,
        /// Why, in words.
        reason: String,
    },
    /// The dataset itself is unusable: missing root, no classes, no images.
    #[error("dataset error: {0}")]
    Dataset(String),
    /// The storage a pass reads is not answering (an object store whose circuit is open):
    /// not one bad sample or document, so it ends the pass whatever the failure policy.
    #[error("storage not answering: {0}")]
    Unavailable(String),
    /// A bad argument: names the argument and what is allowed.
    #[error("invalid argument `{arg}`: {reason}")]
    Config {
        /// The argument (flag, keyword) at fault.
        arg: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The memory limit cannot hold what was asked for.
    #[error("memory limit: {0}")]
    Memory(String),
    /// The GPU asked for is unusable (no driver, no such device) or a CUDA call failed.
    #[error("device error: {0}")]
    Device(String),
    /// An iterator that may no longer be used: a newer `iter()`, `set_epoch` or
    /// `load_state_dict` replaced it. Says which.
    #[error("stale iterator: {0}; start a new iteration with iter(loader)")]
    Stale(String),
    /// The pipeline was stopped (dropped or cancelled) while waiting.
    #[error("the loader was stopped")]
    Cancelled,
    /// A worker thread died unexpectedly (a bug: please report it).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// A [`Error::Config`] for argument `arg`.
    pub fn config(arg: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config { arg: arg.into(), reason: reason.into() }
    }

    /// A [`Error::Decode`] for file `path`.
    pub fn decode(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Decode { path: path.into(), reason: reason.into() }
    }

    /// A [`Error::Io`] for file `path`.
    pub fn io(path: impl Into<PathBuf>, err: &std::io::Error) -> Self {
        Error::Io { path: path.into(), reason: err.to_string() }
    }

    /// The path this error is about, if it is about a file.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Error::Io { path, .. } | Error::Decode { path, .. } => Some(path),
            _ => None,
        }
    }

    /// The reason without the path prefix (for skip reports that list path and reason apart).
    pub fn reason(&self) -> String {
        match self {
            Error::Io { reason, .. } | Error::Decode { reason, .. } => reason.clone(),
            other => other.to_string(),
        }
    }
}
