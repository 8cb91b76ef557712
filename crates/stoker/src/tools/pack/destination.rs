//! Where a pack is written: a local folder, or a prefix in object storage
//! (`s3://bucket/prefix`, `gs://...`, `az://...`). One set of operations for both, by name
//! relative to the destination (`shard-000000.tar`, `.stoker-ray/plan.json`), so that
//! [`super::pack`] and a pack made in pieces write the same bytes to either: a file is written
//! under a temporary name and renamed into place, an object is put whole (in one request, or
//! a multipart upload completed at its end). Either way a name holds a whole file or nothing.

use crate::error::{Error, Result};
use crate::source::shards::{index_path, write_atomic};
use std::path::{Path, PathBuf};

/// The destination of a pack (made from the user's text by [`crate::args::pack_destination`]).
#[derive(Debug)]
pub enum Destination {
    /// A local folder (created if missing).
    Folder(PathBuf),
    /// A prefix in an object store.
    #[cfg(feature = "remote")]
    Store(crate::source::ObjectFolder),
}

impl From<&Path> for Destination {
    fn from(p: &Path) -> Self {
        Destination::Folder(p.to_path_buf())
    }
}

impl From<&PathBuf> for Destination {
    fn from(p: &PathBuf) -> Self {
        Destination::Folder(p.clone())
    }
}

impl From<PathBuf> for Destination {
    fn from(p: PathBuf) -> Self {
        Destination::Folder(p)
    }
}

/// Whether `text` names an object-store location (`SCHEME://...`) rather than a folder.
pub fn is_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(s, _)| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
}

impl Destination {
    /// The destination `text` names, for argument `arg`: an object-store URL (its scheme,
    /// bucket and prefix checked; no request is made) or a folder. Only
    /// [`crate::args::pack_destination`] calls it.
    pub(crate) fn parse(arg: &str, text: &str) -> Result<Self> {
        if text.is_empty() {
            return Err(Error::config(
                arg,
                "must be a folder or an object-store URL (s3://BUCKET/PREFIX), got nothing",
            ));
        }
        if !is_url(text) {
            return Ok(Destination::Folder(PathBuf::from(text)));
        }
        #[cfg(feature = "remote")]
        return Ok(Destination::Store(crate::source::ObjectFolder::open(arg, text)?));
        #[cfg(not(feature = "remote"))]
        return Err(Error::config(
            arg,
            format!("{text}: object storage support is not compiled in (feature `remote`)"),
        ));
    }

    /// The same destination with a folder made absolute (for tasks that run elsewhere).
    pub fn absolute(self) -> Result<Self> {
        match self {
            Destination::Folder(p) => Ok(Destination::Folder(std::path::absolute(&p).map_err(|e| Error::io(&p, &e))?)),
            #[cfg(feature = "remote")]
            other => Ok(other),
        }
    }

    /// The folder's path or the prefix's URL, as the user reads it.
    pub fn describe(&self) -> String {
        match self {
            Destination::Folder(p) => p.display().to_string(),
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.url(),
        }
    }

    /// Whether it is in object storage.
    pub fn is_remote(&self) -> bool {
        !matches!(self, Destination::Folder(_))
    }

    /// Where `name` is: its path in the folder, or its URL (as a path, for summaries).
    pub fn locate(&self, name: &str) -> PathBuf {
        match self {
            Destination::Folder(p) => p.join(name),
            #[cfg(feature = "remote")]
            Destination::Store(s) => PathBuf::from(s.url_of(name)),
        }
    }

    /// The names of the files directly in it (not in sub-folders), sorted; none when the
    /// folder does not exist.
    pub fn list(&self) -> Result<Vec<String>> {
        match self {
            Destination::Folder(dst) => {
                let rd = match std::fs::read_dir(dst) {
                    Ok(rd) => rd,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
                    Err(e) => return Err(Error::io(dst, &e)),
                };
                let mut out = vec![];
                for entry in rd {
                    let entry = entry.map_err(|e| Error::io(dst, &e))?;
                    if !entry.file_type().map_err(|e| Error::io(entry.path(), &e))?.is_dir() {
                        out.push(entry.file_name().to_string_lossy().into_owned());
                    }
                }
                out.sort();
                Ok(out)
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => Ok(s.list()?.into_iter().map(|(name, _)| name).collect()),
        }
    }

    /// Makes it ready to be written into (creates the folder; a prefix needs nothing).
    pub fn create(&self) -> Result<()> {
        match self {
            Destination::Folder(dst) => std::fs::create_dir_all(dst).map_err(|e| Error::io(dst, &e)),
            #[cfg(feature = "remote")]
            Destination::Store(_) => Ok(()),
        }
    }

    /// The bytes of `name`, `None` when it is not there.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                match std::fs::read(&path) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(&path, &e)),
                }
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.get(name),
        }
    }

    /// The size of `name`, `None` when it is not there.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_file() => Ok(Some(m.len())),
                    Ok(_) => Ok(None),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(Error::io(&path, &e)),
                }
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.size(name),
        }
    }

    /// Bytes `range` of `name` (all of them, or an error naming it).
    pub fn read_range(&self, name: &str, range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        if range.start > range.end {
            return Err(Error::Internal(format!("{name}: a read of bytes {}..{}", range.start, range.end)));
        }
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                let f = std::fs::File::open(&path).map_err(|e| Error::io(&path, &e))?;
                let mut out = vec![0; (range.end - range.start) as usize];
                std::os::unix::fs::FileExt::read_exact_at(&f, &mut out, range.start)
                    .map_err(|e| Error::io(&path, &e))?;
                Ok(out)
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.read_range(name, range),
        }
    }

    /// Writes `name` (its folder created), whole or not at all.
    pub fn write(&self, name: &str, bytes: &[u8]) -> Result<()> {
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, &e))?;
                }
                write_atomic(&path, bytes)
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.put(name, bytes),
        }
    }

    /// Removes `name` (one that is not there is no error).
    pub fn remove(&self, name: &str) -> Result<()> {
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(Error::io(&path, &e)),
                }
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => s.delete(name),
        }
    }

    /// A local folder for the shards being written: the destination folder itself (a shard
    /// is renamed into place from there), or for object storage a new temporary folder (a
    /// shard is uploaded from there), removed when the returned guard is dropped. Its name
    /// holds this process's id: the folders of packs that were killed (their process gone)
    /// are removed first.
    pub(super) fn scratch(&self) -> Result<Option<tempfile::TempDir>> {
        match self {
            Destination::Folder(_) => Ok(None),
            #[cfg(feature = "remote")]
            Destination::Store(s) => {
                remove_killed_scratch(&std::env::temp_dir());
                let prefix = format!("{SCRATCH_PREFIX}{}-", std::process::id());
                tempfile::Builder::new().prefix(&prefix).tempdir().map(Some).map_err(|e| Error::Io {
                    path: std::env::temp_dir(),
                    reason: format!("cannot make a temporary folder for the shards bound for {}: {e}", s.url()),
                })
            }
        }
    }

    /// Puts the finished shard `tmp` (a local file: in the destination folder, or in its
    /// [`Destination::scratch`] folder) in place as `name`, its index `index` first, so that
    /// no shard is ever there without its index. On an error neither is left.
    pub(super) fn place_shard(&self, name: &str, index: &[u8], tmp: &Path) -> Result<()> {
        match self {
            Destination::Folder(dst) => {
                let path = dst.join(name);
                write_atomic(&index_path(&path), index)?;
                if let Err(e) = std::fs::rename(tmp, &path) {
                    let _ = std::fs::remove_file(index_path(&path));
                    return Err(super::write_error(&path, &e));
                }
                Ok(())
            }
            #[cfg(feature = "remote")]
            Destination::Store(s) => {
                let idx = format!("{name}.idx");
                s.put(&idx, index)?;
                if let Err(e) = s.put_file(name, tmp) {
                    let _ = s.delete(&idx);
                    return Err(e);
                }
                Ok(())
            }
        }
    }
}

/// The start of a scratch folder's name; the packing process's id follows, then `-`.
#[cfg(feature = "remote")]
const SCRATCH_PREFIX: &str = "stoker-pack-";

/// Removes the scratch folders in `tmp` of packs whose process is gone (killed before its
/// folder's guard could remove it).
#[cfg(feature = "remote")]
fn remove_killed_scratch(tmp: &Path) {
    let Ok(rd) = std::fs::read_dir(tmp) else { return };
    for e in rd.flatten() {
        let name = e.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| !crate::shell::store::process_alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
