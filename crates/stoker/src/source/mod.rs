//! Sources know *what* samples exist and read one sample's bytes on demand; they never hold the
//! bytes of the dataset. Only an index lives in memory (a few bytes per sample).
//!
//! Owns: formats on disk and in object storage (ImageFolder trees, tar and its index, pack
//! folders, `classes.json`, the `.npy` header: [`npy`]), names as bytes, reads with their limits. May not touch: pixels,
//! order or batches (a source answers "how many", "which label", "these bytes").

mod blocks;
pub(crate) mod fetch;
mod glob;
mod image_folder;
pub mod mix;
pub mod npy;
pub mod readahead;
#[cfg(feature = "remote")]
mod remote;
pub mod shard_cache;
mod shard_index;
mod shard_storage;
pub mod shards;
pub mod storage_stats;
pub mod tar;

pub use image_folder::{ImageFolder, IMG_EXTENSIONS};
#[cfg(feature = "remote")]
pub use remote::ObjectFolder;
pub use shards::ShardSource;
pub use storage_stats::StorageReport;

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A random-access collection of encoded samples with integer labels.
pub trait Source: Send + Sync + 'static {
    /// Number of samples.
    fn len(&self) -> usize;
    /// Whether there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The label of sample `i`.
    fn label(&self, i: usize) -> i64;
    /// Reads the encoded bytes of sample `i` into `buf` (cleared first; its capacity is reused).
    /// A sample larger than `max_bytes` is that sample's error, found from metadata (file size,
    /// index entry) before anything is read or allocated.
    fn read(&self, i: usize, buf: &mut Vec<u8>, max_bytes: u64) -> Result<()>;
    /// Where sample `i` lives, for error messages and skip reports.
    fn describe(&self, i: usize) -> PathBuf;
    /// Sizes of the consecutive shards the samples are stored in, when the source is sharded
    /// (enables shard-aware shuffling).
    fn groups(&self) -> Option<Vec<usize>> {
        None
    }
    /// Sizes of the consecutive sources the samples come from, when the source is a mixture's
    /// ([`mix::MixSource`]): the sampler then orders them as the mixture says.
    fn parts(&self) -> Option<Vec<usize>> {
        None
    }
    /// Reads sample `i`'s `kind` text member (an image-text pair's `KEY.txt` or `KEY.json`) into
    /// `buf` (cleared first). An error naming the sample when it has none: only indexed shards
    /// hold text members.
    fn read_text(&self, i: usize, kind: TextKind, buf: &mut Vec<u8>) -> Result<()> {
        let _ = buf;
        let why = format!("no {}: only tar shards hold KEY.{} members", kind.what(), kind.extension());
        Err(Error::decode(self.describe(i), why))
    }
    /// Reads sample `i`'s bytes into `buf` and its `kind` text member into `text`: what
    /// [`Source::read`] and [`Source::read_text`] read, in one request where the storage makes
    /// that worth it (shards in an object store).
    fn read_pair(&self, i: usize, kind: TextKind, buf: &mut Vec<u8>, text: &mut Vec<u8>, max_bytes: u64) -> Result<()> {
        self.read(i, buf, max_bytes)?;
        self.read_text(i, kind, text)
    }
    /// The key of sample `i`: WebDataset's key (the member name up to its first '.') for
    /// shards, the path without its extension otherwise.
    fn key(&self, i: usize) -> String {
        self.describe(i).with_extension("").to_string_lossy().into_owned()
    }
    /// Gives up the reads in flight now (called when an iteration stops, before its threads
    /// are joined): a read from a store that does not answer returns an error at once instead
    /// of waiting for its time-out, so Ctrl-C and drop stay prompt. Local files need nothing.
    fn abandon_reads(&self) {}
    /// Tells the source the order a pass will read samples in (this rank's, from the pass's
    /// first sample): shards in object storage then fetch the parts those samples lie in ahead
    /// of the reads, in that order, holding at most `budget` bytes of them
    /// ([`readahead`]); `lag` is how far reads may run out of order. Until the next call or
    /// [`Source::abandon_reads`]. Local data needs nothing.
    fn plan_reads(&self, order: &[u32], budget: u64, lag: usize) {
        let _ = (order, budget, lag);
    }
    /// What reading from object storage cost so far (requests, bytes, latency, throttling),
    /// when the samples are there.
    fn storage_report(&self) -> Option<StorageReport> {
        None
    }
    /// Keeps the parts of shards fetched from object storage in the local shard cache `spec`
    /// (a group of its own: [`shard_cache`]), from the next pass on. A [`Error::Config`]
    /// naming `shard_cache` for data that is not in object storage.
    fn use_shard_cache(&self, spec: &crate::shell::store::StoreSpec) -> Result<()> {
        let _ = spec;
        Err(Error::config("shard_cache", "keeps parts of tar shards in object storage; this dataset is not one"))
    }
    /// Whether reading a sample costs a request to a remote store (object storage): such a
    /// source is read best in a shard-window order.
    fn is_remote(&self) -> bool {
        false
    }
}

/// A text member beside a sample's image in a shard: what an image-text pair's caption is
/// read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TextKind {
    /// `KEY.txt`: the caption.
    Txt = 0,
    /// `KEY.json`: metadata (img2dataset writes the caption there too).
    Json = 1,
}

impl TextKind {
    /// The kind of a member with extension `ext` (lowercase), if it is a text member.
    pub fn of_extension(ext: &str) -> Option<TextKind> {
        match ext {
            "txt" => Some(TextKind::Txt),
            "json" => Some(TextKind::Json),
            _ => None,
        }
    }

    /// The extension, lowercase.
    pub fn extension(self) -> &'static str {
        match self {
            TextKind::Txt => "txt",
            TextKind::Json => "json",
        }
    }

    /// What the member holds, for messages.
    pub fn what(self) -> &'static str {
        match self {
            TextKind::Txt => "caption",
            TextKind::Json => "metadata",
        }
    }
}

/// What kind of dataset a root names (see [`detect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatasetKind {
    /// An ImageFolder tree (`ROOT/CLASS/IMAGE`).
    Folder(PathBuf),
    /// Indexed tar shards: local paths or globs, or object-store URLs (with globs).
    Shards(Vec<String>),
    /// A weighted mixture's sources ([`mix::open_mixture`]), each what [`detect`] made of it.
    Mixture(Vec<DatasetKind>),
}

/// The file name ending of a tar shard.
const TAR: &str = ".tar";

fn has_glob(name: &str) -> bool {
    name.contains(['*', '?'])
}

/// The shards of a pack folder (what `stoker pack` writes: `*.tar` shards, their `.idx`
/// indexes and `classes.json`), in name order; `None` when `dir` is not one. A folder is a
/// pack folder when it holds `*.tar` files directly and either a `classes.json` or no
/// subfolder (an ImageFolder root holds class subfolders).
fn pack_folder_shards(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    let rd = std::fs::read_dir(dir).map_err(|e| Error::io(dir, &e))?;
    let (mut shards, mut subdirs) = (vec![], false);
    for entry in rd.flatten() {
        let name = entry.file_name();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        if is_dir {
            subdirs = true;
        } else if name.to_string_lossy().ends_with(TAR) {
            shards.push(entry.path());
        }
    }
    if shards.is_empty() || (subdirs && !dir.join("classes.json").is_file()) {
        return Ok(None);
    }
    shards.sort();
    Ok(Some(shards))
}

/// Decides what kind of dataset `roots` names, the one rule every front end uses:
/// - several entries: shards (each a path, a glob or a URL);
/// - a URL (`s3://`, `gs://`, `az://`, `http(s)://`): shards; a URL whose last part is neither a
///   glob nor a `.tar` is a prefix, read as a pack folder (`PREFIX/*.tar` + `classes.json`);
/// - a local folder: a pack folder when it holds `*.tar` shards (with a `classes.json`, or no
///   subfolders), else an ImageFolder root;
/// - a glob (`*`, `?` in the file name) or a `.tar` file: shards.
///
/// Shard lists from folders and globs are in name order.
pub fn detect(roots: &[String]) -> Result<DatasetKind> {
    match roots {
        [] => Err(Error::config("root", "the list of shards is empty")),
        [one] => detect_one(one),
        many => Ok(DatasetKind::Shards(many.to_vec())),
    }
}

fn detect_one(root: &str) -> Result<DatasetKind> {
    if root.is_empty() {
        return Err(Error::config("root", "empty path"));
    }
    if let Some((_, rest)) = root.split_once("://") {
        let last = rest.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        if has_glob(last) || last.ends_with(TAR) {
            return Ok(DatasetKind::Shards(vec![root.to_string()]));
        }
        return Ok(DatasetKind::Shards(vec![format!("{}/*{TAR}", root.trim_end_matches('/'))]));
    }
    let path = Path::new(root);
    if path.is_dir() {
        return Ok(match pack_folder_shards(path)? {
            Some(shards) => DatasetKind::Shards(shards.iter().map(|p| p.to_string_lossy().into_owned()).collect()),
            None => DatasetKind::Folder(path.to_path_buf()),
        });
    }
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    if has_glob(&name) || name.ends_with(TAR) {
        return Ok(DatasetKind::Shards(vec![root.to_string()]));
    }
    if path.exists() {
        return Err(Error::Dataset(format!(
            "{root}: not a dataset: expected an ImageFolder root, a folder of shards (stoker pack), a .tar shard, a glob or a URL"
        )));
    }
    Err(Error::Dataset(format!("{root}: no such file or folder")))
}

/// An opened dataset: the source and its class names.
pub struct Dataset {
    /// The samples.
    pub source: std::sync::Arc<dyn Source>,
    /// Class names in label order, exactly as named (a folder name need not be UTF-8; Python
    /// shows it as `os.listdir` does); empty for shards without a `classes.json`.
    pub classes: Vec<OsString>,
    /// What [`detect`] made of the root.
    pub kind: DatasetKind,
    /// Entries found while indexing that are not samples (FIFOs, devices, sockets, repeated or
    /// looping folder links), with the reason: reported, never opened.
    pub not_samples: Vec<(PathBuf, String)>,
}

impl std::fmt::Debug for Dataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataset").field("samples", &self.source.len()).field("kind", &self.kind).finish()
    }
}

/// Opens whatever `roots` names (see [`detect`]): an ImageFolder root, a pack folder, shard
/// paths, globs or URLs.
pub fn open(roots: &[String]) -> Result<Dataset> {
    let kind = detect(roots)?;
    let mut not_samples = vec![];
    let (source, classes): (std::sync::Arc<dyn Source>, Vec<OsString>) = match &kind {
        DatasetKind::Folder(root) => {
            let f = ImageFolder::new(root)?;
            let classes = f.class_names().to_vec();
            not_samples = f.not_samples().to_vec();
            (std::sync::Arc::new(f), classes)
        }
        DatasetKind::Shards(specs) => {
            let s = open_shards(specs)?;
            let classes = s.classes().to_vec();
            not_samples = s.not_samples().to_vec();
            (std::sync::Arc::new(s), classes)
        }
        DatasetKind::Mixture(_) => return Err(Error::Internal("a root list never names a mixture".into())),
    };
    Ok(Dataset { source, classes, kind, not_samples })
}

/// Opens image-text pairs: what `roots` names must be shards ([`detect`]), and only their
/// samples with a `text` member (the caption) are samples; the others are listed as not
/// samples, with the reason ([`ShardSource::require_text`]).
pub fn open_pairs(roots: &[String], text: TextKind) -> Result<Dataset> {
    let kind = detect(roots)?;
    let DatasetKind::Shards(specs) = &kind else {
        return Err(Error::config(
            "root",
            format!(
                "image-text pairs are read from WebDataset tar shards (KEY.jpg beside KEY.{}), not from a folder of images",
                text.extension()
            ),
        ));
    };
    let s = open_shards_keeping(specs, Some(text))?.require_text(text)?;
    let classes = s.classes().to_vec();
    let not_samples = s.not_samples().to_vec();
    Ok(Dataset { source: std::sync::Arc::new(s), classes, kind, not_samples })
}

/// Opens shards given as paths, globs (`*`, `?` in the file name) or object-store URLs
/// (`s3://`, `gs://`, `az://`, `http(s)://`, with the same globs). Here, above both, so that
/// `shards` (the format) and `remote` (object storage, which uses it) do not import each other.
pub fn open_shards(specs: &[String]) -> Result<ShardSource> {
    open_shards_keeping(specs, None)
}

/// [`open_shards`], keeping where each sample's `text` member is (a pair loader's captions).
fn open_shards_keeping(specs: &[String], text: Option<TextKind>) -> Result<ShardSource> {
    if specs.iter().any(|s| s.contains("://")) {
        #[cfg(feature = "remote")]
        return remote::open(specs, text);
        #[cfg(not(feature = "remote"))]
        return Err(Error::config("root", "object storage support is not compiled in (feature `remote`)"));
    }
    let mut paths = vec![];
    for s in specs {
        paths.extend(shards::expand_glob(Path::new(s))?);
    }
    ShardSource::open_keeping(&paths, text)
}

/// Whether a data path is an object-store URL (`s3://`, `gs://`, `az://`, `http(s)://`).
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.contains("://"))
}

/// The object URLs a spec names (globs matched against a listing); see `remote::expand_url`.
pub fn expand_urls(spec: &str) -> Result<Vec<String>> {
    #[cfg(feature = "remote")]
    return remote::expand_url(spec);
    #[cfg(not(feature = "remote"))]
    return Err(Error::config("data", format!("{spec}: object storage support is not compiled in (feature `remote`)")));
}

/// Sets the time bound of every object-store request made by the stores opened from now on
/// (`None`: the default, 30 s; see `remote`'s module doc for the retries and the circuit
/// breaker it also bounds). Set by `stoker::args` ([`crate::args::Env::apply`]) each time it
/// reads the environment, from `STOKER_OBJECT_TIMEOUT`: sources read no environment variable.
pub fn set_object_timeout(timeout: Option<std::time::Duration>) {
    #[cfg(feature = "remote")]
    remote::set_request_timeout(timeout);
    #[cfg(not(feature = "remote"))]
    let _ = timeout;
}

/// Runs `f` with `stop` as the stop flag of the object reads it opens on this thread (see
/// `remote::with_stop`): a loader's reader thread runs under its cancel flag, so dropping the
/// loader never waits for a request in flight.
pub fn with_stop<T>(stop: std::sync::Arc<std::sync::atomic::AtomicBool>, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "remote")]
    return remote::with_stop(stop, f);
    #[cfg(not(feature = "remote"))]
    {
        let _ = stop;
        f()
    }
}

/// The error a failed read of an object is, when it says that its store is not answering
/// (`remote::unavailable`): [`Error::Unavailable`], which ends a pass. `None` for any other
/// I/O error.
pub fn unavailable(e: &std::io::Error) -> Option<Error> {
    #[cfg(feature = "remote")]
    return remote::unavailable(e).map(Error::Unavailable);
    #[cfg(not(feature = "remote"))]
    {
        let _ = e;
        None
    }
}

/// Bytes read at positions: a local file, or an object in a store (token files, whose
/// documents are read where the index places them).
pub trait PositionedRead: Send + Sync {
    /// Bytes in all.
    fn size(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()>;
}

/// A local file and its length when opened.
struct LocalPositioned(std::fs::File, u64);

impl PositionedRead for LocalPositioned {
    fn size(&self) -> u64 {
        self.1
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, offset)
    }
}

impl<R: blocks::Ranged> PositionedRead for blocks::BlockReader<R> {
    fn size(&self) -> u64 {
        blocks::BlockReader::size(self)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        blocks::BlockReader::read_exact_at(self, buf, offset)
    }
}

/// Opens `path` (a local file, or an object-store URL: see [`is_url`]) for reads at positions.
/// An object is read in cached blocks of 8 MiB with a read-ahead (`blocks::BlockReader`): about
/// one ranged request per block a pass goes through, not one per read.
pub fn open_positioned(path: &Path) -> Result<Box<dyn PositionedRead>> {
    if is_url(path) {
        #[cfg(feature = "remote")]
        return Ok(Box::new(blocks::BlockReader::new(remote::ObjectReader::open(&path.to_string_lossy())?)));
        #[cfg(not(feature = "remote"))]
        return Err(Error::config(
            "data",
            format!("{}: object storage support is not compiled in (feature `remote`)", path.display()),
        ));
    }
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let len = f.metadata().map_err(|e| Error::io(path, &e))?.len();
    Ok(Box::new(LocalPositioned(f, len)))
}

/// Whether `path` (a local path or an object-store URL) names an existing file or object.
pub fn exists(path: &Path) -> Result<bool> {
    if is_url(path) {
        #[cfg(feature = "remote")]
        return remote::exists(&path.to_string_lossy());
        #[cfg(not(feature = "remote"))]
        return Ok(false);
    }
    Ok(path.is_file())
}

/// The object at `url`, read from start to end, and its size; see `remote::ObjectReader`.
pub fn read_object(url: &str) -> Result<(Box<dyn std::io::Read + Send>, u64)> {
    #[cfg(feature = "remote")]
    {
        let r = remote::ObjectReader::open(url)?;
        let size = r.size();
        Ok((Box::new(r), size))
    }
    #[cfg(not(feature = "remote"))]
    Err(Error::config("data", format!("{url}: object storage support is not compiled in (feature `remote`)")))
}

/// Class names as the JSON array `classes.json` holds, in Python's spelling of file names: a
/// byte of a name that is not UTF-8 is the escape `\udcXX` (XX = the byte), as
/// `json.dumps(os.listdir(...))` writes it, so a name survives the round trip exactly
/// ([`classes_from_json`]).
pub fn classes_to_json(names: &[OsString]) -> String {
    let mut out = String::from("[");
    for (k, name) in names.iter().enumerate() {
        if k > 0 {
            out.push(',');
        }
        out.push('"');
        for chunk in name.as_bytes().utf8_chunks() {
            let quoted = serde_json::to_string(chunk.valid()).unwrap_or_else(|_| "\"\"".into());
            out.push_str(&quoted[1..quoted.len() - 1]);
            for &b in chunk.invalid() {
                out.push_str(&format!("\\u{:04x}", 0xDC00 + b as u32));
            }
        }
        out.push('"');
    }
    out.push(']');
    out
}

/// The class names of a `classes.json` (a JSON array of strings), exactly: the escapes
/// `\udc80`..`\udcff` that Python writes for the bytes of a name that is not UTF-8 become those
/// bytes again (see [`classes_to_json`]). Any other unpaired surrogate is not a file name: an
/// error naming it.
pub fn classes_from_json(text: &str) -> Result<Vec<OsString>> {
    /// A JSON string read as bytes (WTF-8: serde_json keeps unpaired surrogates there).
    struct Wtf8(Vec<u8>);
    impl<'de> serde::Deserialize<'de> for Wtf8 {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Wtf8;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a class name (a string)")
                }
                fn visit_str<E>(self, v: &str) -> std::result::Result<Wtf8, E> {
                    Ok(Wtf8(v.as_bytes().to_vec()))
                }
                fn visit_bytes<E>(self, v: &[u8]) -> std::result::Result<Wtf8, E> {
                    Ok(Wtf8(v.to_vec()))
                }
            }
            d.deserialize_bytes(V)
        }
    }
    let names: Vec<Wtf8> =
        serde_json::from_str(text).map_err(|e| Error::Dataset(format!("not a list of names: {e}")))?;
    names
        .into_iter()
        .map(|Wtf8(w)| {
            let mut out = Vec::with_capacity(w.len());
            let mut i = 0;
            while i < w.len() {
                // A surrogate in WTF-8: ED A0..BF xx.
                if w[i] == 0xED && i + 2 < w.len() && w[i + 1] >= 0xA0 {
                    let cp = 0xD000 | ((w[i + 1] as u32 & 0x3F) << 6) | (w[i + 2] as u32 & 0x3F);
                    if !(0xDC80..=0xDCFF).contains(&cp) {
                        return Err(Error::Dataset(format!(
                            "class name {:?} holds U+{cp:04X}, which is not a byte of a file name",
                            String::from_utf8_lossy(&w)
                        )));
                    }
                    out.push((cp - 0xDC00) as u8);
                    i += 3;
                } else {
                    out.push(w[i]);
                    i += 1;
                }
            }
            Ok(OsString::from_vec(out))
        })
        .collect()
}

/// [`open`] of one path.
pub fn open_path(root: impl AsRef<Path>) -> Result<Dataset> {
    open(&[root.as_ref().to_string_lossy().into_owned()])
}

#[cfg(test)]
mod detect_tests {
    use super::*;

    #[test]
    fn class_names_survive_classes_json() {
        let names: Vec<OsString> = [b"caf\xe9".as_slice(), "caf\u{e9} \"q\"".as_bytes(), b"x\\y", b"\x80\xff"]
            .iter()
            .map(|b| OsString::from_vec(b.to_vec()))
            .collect();
        let json = classes_to_json(&names);
        // What Python's json.dumps(os.listdir(...), ensure_ascii=False) writes for these names.
        assert_eq!(json, "[\"caf\\udce9\",\"caf\u{e9} \\\"q\\\"\",\"x\\\\y\",\"\\udc80\\udcff\"]");
        assert_eq!(classes_from_json(&json).unwrap(), names);
        // Python's default (ensure_ascii=True) spelling, and a pair of surrogates (one character).
        let ascii = r#"["caf\u00e9", "caf\udce9", "\ud83d\ude00"]"#;
        let read = classes_from_json(ascii).unwrap();
        assert_eq!(read[0].as_bytes(), "caf\u{e9}".as_bytes());
        assert_eq!(read[1].as_bytes(), b"caf\xe9");
        assert_eq!(read[2].as_bytes(), "\u{1f600}".as_bytes());
        let e = classes_from_json(r#"["\udc00"]"#).unwrap_err().to_string();
        assert!(e.contains("U+DC00"), "{e}");
        assert!(classes_from_json("{}").is_err());
    }

    #[test]
    fn what_a_root_names() {
        let d = tempfile::tempdir().unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let root = d.path().join("folder");
        std::fs::create_dir_all(root.join("cat")).unwrap();
        assert_eq!(detect(&[s(&root)]).unwrap(), DatasetKind::Folder(root.clone()));
        // A stray tar beside class folders, without classes.json: still an ImageFolder.
        std::fs::write(root.join("x.tar"), b"").unwrap();
        assert_eq!(detect(&[s(&root)]).unwrap(), DatasetKind::Folder(root.clone()));
        let packed = d.path().join("packed");
        std::fs::create_dir_all(&packed).unwrap();
        for n in ["b-1.tar", "a-0.tar", "a-0.tar.idx", "notes.txt"] {
            std::fs::write(packed.join(n), b"").unwrap();
        }
        let want = |names: &[&str]| DatasetKind::Shards(names.iter().map(|n| s(&packed.join(n))).collect());
        assert_eq!(detect(&[s(&packed)]).unwrap(), want(&["a-0.tar", "b-1.tar"]));
        std::fs::create_dir_all(packed.join("sub")).unwrap();
        std::fs::write(packed.join("classes.json"), b"[]").unwrap();
        assert_eq!(detect(&[s(&packed)]).unwrap(), want(&["a-0.tar", "b-1.tar"]));
        let glob = s(&packed.join("*.tar"));
        assert_eq!(detect(std::slice::from_ref(&glob)).unwrap(), DatasetKind::Shards(vec![glob]));
        let url = |u: &str| detect(&[u.to_string()]).unwrap();
        assert_eq!(url("s3://b/train/"), DatasetKind::Shards(vec!["s3://b/train/*.tar".into()]));
        assert_eq!(url("s3://b/train"), DatasetKind::Shards(vec!["s3://b/train/*.tar".into()]));
        assert_eq!(url("s3://b/t/s-*.tar"), DatasetKind::Shards(vec!["s3://b/t/s-*.tar".into()]));
        assert!(detect(&[]).unwrap_err().to_string().contains("`root`"));
        assert!(detect(&[s(&d.path().join("missing"))]).unwrap_err().to_string().contains("no such file"));
        assert!(detect(&[s(&packed.join("notes.txt"))]).unwrap_err().to_string().contains("not a dataset"));
    }
}
