//! Stored document indexes: a file's index (offset, length and line of every document) is built
//! once and kept in a directory (`STOKER_INDEX_DIR`, else `$XDG_CACHE_HOME/stoker/doc-index`,
//! else `~/.cache/stoker/doc-index`; `index_cache=` per loader), so a later open of the same
//! unchanged file reads its index instead of scanning (and decompressing) the whole file again.
//!
//! An entry is `DIR/KEY.idx`, `KEY` a hash of the file's canonical path and of what decides the
//! index (format, EOS id, token width). It records what it describes: the path, the file's
//! length, modification time, inode and device, and an xxh3 hash of its first and last 64 KiB;
//! an entry whose file differs in any of them is stale and rebuilt (and rewritten). The entry
//! ends with an xxh3 checksum of everything before it; its document count is checked against
//! its own length before anything is allocated. Entries are written to a temporary name and
//! renamed into place, so ranks indexing the same file at once never see a partial entry and
//! take no lock. Parquet (its row counts are in its footer), a token cache (it has its own
//! index) and an uncompressed document-per-file text are not stored: opening them costs no scan.
//!
//! Lifecycle: an entry lives as long as its file is unchanged; `stoker cache indexes` lists
//! entries (file, documents, size, stale or not) and `--clear` removes them (`--stale`: only
//! those whose file is gone or changed).

use super::docs::{Compression, DocEntry, DocFile, Format, TarText};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"STKDIX01";
/// Bytes hashed at each end of a data file to recognise a rewrite that kept size and time.
const SAMPLE: u64 = 64 << 10;
/// The longest path an entry records.
const MAX_PATH: usize = 1 << 16;

/// What an entry says about its data file (compared with the file now).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime_s: i64,
    mtime_ns: i64,
    ino: u64,
    dev: u64,
    sample: u64,
}

fn stamp(path: &Path) -> Result<Stamp> {
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let m = f.metadata().map_err(|e| Error::io(path, &e))?;
    let len = m.len();
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; SAMPLE.min(len) as usize];
    f.read_exact_at(&mut buf, 0).map_err(|e| Error::io(path, &e))?;
    h.update(&buf);
    if len > SAMPLE {
        let tail = SAMPLE.min(len - SAMPLE);
        buf.truncate(tail as usize);
        f.read_exact_at(&mut buf, len - tail).map_err(|e| Error::io(path, &e))?;
        h.update(&buf);
    }
    Ok(Stamp { len, mtime_s: m.mtime(), mtime_ns: m.mtime_nsec(), ino: m.ino(), dev: m.dev(), sample: h.digest() })
}

/// A hash of what identifies `path`'s content now: its length, mtime, inode and device, and a
/// hash of its first and last 64 KiB (what a stored index is checked against).
pub fn identity(path: &Path) -> Result<u64> {
    let s = stamp(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for v in [s.len, s.mtime_s as u64, s.mtime_ns as u64, s.ino, s.dev, s.sample] {
        h.update(&v.to_le_bytes());
    }
    Ok(h.digest())
}

/// Whether an index of `format` over `path` is worth storing (opening it costs a scan).
fn stored(path: &Path, format: Format) -> bool {
    if crate::source::is_url(path) {
        return false;
    }
    match format {
        Format::Parquet | Format::Cache(_) => false,
        Format::File => Compression::of(path) != Compression::None,
        Format::Tokens(_) => !(path.extension().is_some_and(|e| e == "bin") && path.with_extension("idx").is_file()),
        Format::Jsonl | Format::Lines | Format::Tar => true,
    }
}

/// The entry file of `path` (canonical) read as `format` with `eos`.
fn entry_path(dir: &Path, canonical: &Path, format: Format, eos: Option<u32>) -> PathBuf {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(canonical.as_os_str().as_encoded_bytes());
    h.update(format!("{format:?}/{eos:?}").as_bytes());
    dir.join(format!("{:016x}.idx", h.digest()))
}

/// Opens `path` as [`DocFile::open`] does, reading its index from `dir` when an entry there
/// describes the file as it is now, else building it and storing it there. A directory that
/// cannot be written costs only the stored copy: the index is built as without one.
pub fn open(path: &Path, format: Format, eos: Option<u32>, dir: Option<&Path>) -> Result<DocFile> {
    let Some(dir) = dir.filter(|_| stored(path, format)) else {
        return DocFile::open(path, format, eos);
    };
    let canonical = std::fs::canonicalize(path).map_err(|e| Error::io(path, &e))?;
    let now = stamp(path)?;
    let entry = entry_path(dir, &canonical, format, eos);
    if let Some(mut f) = load(&entry).ok().filter(|e| e.data == canonical && e.stamp == now).map(|e| e.file) {
        f.path = path.to_path_buf();
        return Ok(f);
    }
    let f = DocFile::open(path, format, eos)?;
    // The file may have changed while it was indexed: store only what matches it still.
    if stamp(path).is_ok_and(|s| s == now) {
        let _ = save(&entry, &canonical, &now, &f);
    }
    Ok(f)
}

/// A stored entry, read back.
struct Loaded {
    data: PathBuf,
    stamp: Stamp,
    file: DocFile,
}

fn save(entry: &Path, data: &Path, s: &Stamp, f: &DocFile) -> std::io::Result<()> {
    let dir = entry.parent().expect("entries live in a directory");
    std::fs::create_dir_all(dir)?;
    let mut b = Vec::with_capacity(128 + f.docs.len() * 24);
    b.extend_from_slice(MAGIC);
    let p = data.as_os_str().as_encoded_bytes();
    b.extend((p.len() as u32).to_le_bytes());
    b.extend_from_slice(p);
    for v in [s.len, s.mtime_s as u64, s.mtime_ns as u64, s.ino, s.dev, s.sample, f.bytes] {
        b.extend(v.to_le_bytes());
    }
    let compression = match f.compression {
        Compression::None => 0u8,
        Compression::Gzip => 1,
        Compression::Zstd => 2,
        Compression::Parquet => 3,
    };
    let tar = match f.tar {
        None => 0u8,
        Some(TarText::Txt) => 1,
        Some(TarText::Json) => 2,
    };
    b.extend([f.width, compression, tar]);
    b.extend((f.docs.len() as u64).to_le_bytes());
    for d in &f.docs {
        b.extend(d.offset.to_le_bytes());
        b.extend(d.len.to_le_bytes());
        b.extend(d.line.to_le_bytes());
    }
    let sum = xxhash_rust::xxh3::xxh3_64(&b);
    b.extend(sum.to_le_bytes());
    let tmp = dir.join(format!(
        ".{}.{}.{:x}.tmp",
        entry.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        std::process::id(),
        xxhash_rust::xxh3::xxh3_64(format!("{:?}", std::thread::current().id()).as_bytes())
    ));
    let write = || -> std::io::Result<()> {
        let mut out = std::fs::File::create(&tmp)?;
        out.write_all(&b)?;
        out.sync_data()?;
        std::fs::rename(&tmp, entry)
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Reads an entry; any mismatch (magic, lengths, checksum) is an error (the entry is rebuilt).
fn load(entry: &Path) -> std::result::Result<Loaded, String> {
    let mut f = std::fs::File::open(entry).map_err(|e| e.to_string())?;
    let total = f.metadata().map_err(|e| e.to_string())?.len();
    let mut head = [0u8; 12];
    f.read_exact(&mut head).map_err(|e| e.to_string())?;
    if &head[..8] != MAGIC {
        return Err("not a stoker document index".into());
    }
    let plen = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    if plen > MAX_PATH {
        return Err(format!("a path of {plen} bytes"));
    }
    let fixed = 12 + plen as u64 + 7 * 8 + 3 + 8;
    if total < fixed + 8 {
        return Err("truncated".into());
    }
    let n = (total - fixed - 8) / 24;
    if fixed + n * 24 + 8 != total {
        return Err("its length is not that of whole entries".into());
    }
    let mut b = vec![0u8; total as usize];
    b[..12].copy_from_slice(&head);
    f.read_exact(&mut b[12..]).map_err(|e| e.to_string())?;
    let (body, sum) = b.split_at(total as usize - 8);
    if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err("checksum mismatch".into());
    }
    let u64_at = |i: usize| u64::from_le_bytes(body[i..i + 8].try_into().expect("8 bytes"));
    let data = PathBuf::from(std::ffi::OsString::from(
        String::from_utf8(body[12..12 + plen].to_vec()).map_err(|_| "a path that is not UTF-8".to_string())?,
    ));
    let mut at = 12 + plen;
    let mut next = || {
        let v = u64_at(at);
        at += 8;
        v
    };
    let stamp = Stamp {
        len: next(),
        mtime_s: next() as i64,
        mtime_ns: next() as i64,
        ino: next(),
        dev: next(),
        sample: next(),
    };
    let bytes = next();
    let (width, compression, tar) = (body[at], body[at + 1], body[at + 2]);
    at += 3;
    if u64_at(at) != n {
        return Err("its document count does not match its length".into());
    }
    at += 8;
    let docs = (0..n as usize)
        .map(|k| {
            let i = at + k * 24;
            DocEntry { offset: u64_at(i), len: u64_at(i + 8), line: u64_at(i + 16) }
        })
        .collect();
    let compression = match compression {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Zstd,
        3 => Compression::Parquet,
        c => return Err(format!("compression code {c}")),
    };
    let tar = match tar {
        0 => None,
        1 => Some(TarText::Txt),
        2 => Some(TarText::Json),
        t => return Err(format!("tar code {t}")),
    };
    let file = DocFile { path: data.clone(), compression, docs, bytes, width, tar };
    Ok(Loaded { data, stamp, file })
}

/// One stored entry, for `stoker cache indexes`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EntryInfo {
    /// The entry file.
    pub entry: PathBuf,
    /// The data file it indexes (`None`: the entry is unreadable).
    pub data: Option<PathBuf>,
    /// Documents in it.
    pub documents: u64,
    /// The entry's bytes.
    pub bytes: u64,
    /// Seconds since it was written.
    pub age_s: u64,
    /// Whether its data file is gone or changed (or the entry is unreadable): it would be
    /// rebuilt.
    pub stale: bool,
}

/// The entries in `dir`, in name order (an absent directory has none).
pub fn list(dir: &Path) -> Result<Vec<EntryInfo>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(Error::io(dir, &e)),
    };
    let mut paths: Vec<PathBuf> =
        rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "idx")).collect();
    paths.sort();
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let meta = std::fs::metadata(&p).ok();
        let bytes = meta.as_ref().map_or(0, |m| m.len());
        let age_s = meta.and_then(|m| m.modified().ok()).and_then(|t| t.elapsed().ok()).map_or(0, |d| d.as_secs());
        let (data, documents, stale) = match load(&p) {
            Ok(l) => {
                let fresh = stamp(&l.data).is_ok_and(|s| s == l.stamp);
                (Some(l.data), l.file.docs.len() as u64, !fresh)
            }
            Err(_) => (None, 0, true),
        };
        out.push(EntryInfo { entry: p, data, documents, bytes, age_s, stale });
    }
    Ok(out)
}

/// Removes the entries of `dir` (only the stale ones with `stale_only`); returns how many and
/// their bytes. Leftover temporary files of interrupted writes go too.
pub fn clear(dir: &Path, stale_only: bool) -> Result<(usize, u64)> {
    let (mut n, mut bytes) = (0, 0);
    for e in list(dir)? {
        if (!stale_only || e.stale) && std::fs::remove_file(&e.entry).is_ok() {
            n += 1;
            bytes += e.bytes;
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok((n, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_index_is_reused_while_its_file_is_unchanged_and_rebuilt_after() {
        let d = tempfile::tempdir().unwrap();
        let store = d.path().join("store");
        let data = d.path().join("x.jsonl.zst");
        let text = b"{\"text\": \"a\"}\n{\"text\": \"bb\"}\n";
        std::fs::write(&data, zstd::encode_all(&text[..], 3).unwrap()).unwrap();
        let first = open(&data, Format::Jsonl, None, Some(&store)).unwrap();
        let listed = list(&store).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].documents, listed[0].stale), (2, false));
        // Reused: tamper with the stored offsets (checksum recomputed) and see them served.
        let entry = &listed[0].entry;
        let mut l = load(entry).unwrap();
        l.file.docs[1].offset = 99;
        save(entry, &l.data, &l.stamp, &l.file).unwrap();
        let again = open(&data, Format::Jsonl, None, Some(&store)).unwrap();
        assert_eq!(again.docs[1].offset, 99, "read from the store, not rebuilt");
        assert_eq!(again.path, data);
        // Another format or EOS is another entry.
        open(&data, Format::Lines, None, Some(&store)).unwrap();
        assert_eq!(list(&store).unwrap().len(), 2);
        // A changed file (same length) makes the entry stale: rebuilt, rewritten.
        let text2 = b"{\"text\": \"c\"}\n{\"text\": \"dd\"}\n";
        std::fs::write(&data, zstd::encode_all(&text2[..], 3).unwrap()).unwrap();
        assert!(list(&store).unwrap().iter().all(|e| e.stale));
        let rebuilt = open(&data, Format::Jsonl, None, Some(&store)).unwrap();
        assert_eq!(rebuilt.docs, first.docs);
        // Flipped bytes in an entry: not trusted, rebuilt.
        let mut raw = std::fs::read(entry).unwrap();
        let k = raw.len() - 20;
        raw[k] ^= 0xff;
        std::fs::write(entry, &raw).unwrap();
        assert_eq!(open(&data, Format::Jsonl, None, Some(&store)).unwrap().docs, first.docs);
        // A truncated entry claiming many documents allocates nothing and is rebuilt.
        std::fs::write(entry, &raw[..raw.len() / 2]).unwrap();
        assert_eq!(open(&data, Format::Jsonl, None, Some(&store)).unwrap().docs, first.docs);
        // Clearing: stale only, then all.
        std::fs::remove_file(&data).unwrap();
        assert_eq!(clear(&store, true).unwrap().0, 2);
        assert!(list(&store).unwrap().is_empty());
    }

    #[test]
    fn parquet_and_plain_document_files_are_not_stored() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("a.txt");
        std::fs::write(&data, "hello").unwrap();
        open(&data, Format::File, None, Some(&d.path().join("store"))).unwrap();
        assert!(!d.path().join("store").exists());
    }
}
