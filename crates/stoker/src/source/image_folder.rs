//! `ImageFolder`: a root with one subfolder per class, indexed like torchvision's `ImageFolder`.
//!
//! Classes are the sorted names of the root's subfolders (hidden ones, starting with `.`, are
//! ignored, unlike torchvision, so `.ipynb_checkpoints` never becomes a class). Inside each class
//! folder the walk mirrors `sorted(os.walk(..., followlinks=True))` with sorted file names, so
//! sample `i` here is sample `i` there. Files are kept when their extension is one of
//! torchvision's image extensions (case-insensitive) and they are not hidden.
//!
//! Only real files are samples. Indexing lists folders and never opens a file: the entry type
//! from the folder listing decides, and only symlinks are resolved (`stat`). What resolves to a
//! regular file is a sample; a FIFO, a character or block device or a socket with an image
//! name (directly or through a symlink, e.g. `x.jpg -> /dev/zero`) is not, and is listed by
//! [`ImageFolder::not_samples`] with the reason. A dangling symlink stays a sample (as in
//! torchvision) and fails when read, naming the file. Folder symlinks are followed, each
//! folder once per class (real folders before links, so a folder is indexed under its own
//! path): a link back to an ancestor (`ln -s . loop`) or to a folder the class already holds is
//! detected by device and inode, not walked, and listed too (where torchvision's `os.walk`
//! would index the same files again). A link to the root or to another class folder is not
//! followed either (its images are that class's). Two class folders may still be one folder, and
//! two classes may link the same subfolder, as in torchvision.
//!
//! Reads open with `O_NONBLOCK` and check the descriptor (`fstat`): a file that became a FIFO
//! or a device after indexing is that sample's error, not a hang or an endless read; one that
//! was deleted is an error naming the path.
//!
//! Names are bytes, as Linux has them: a file or class folder whose name is not UTF-8 (common
//! in scraped datasets) is indexed like any other, never a reason to refuse the dataset. Names
//! are ordered as Python orders what `os.listdir` gives (UTF-8 decoded with `surrogateescape`:
//! each byte of an invalid sequence becomes U+DC80..U+DCFF), so labels and sample indices
//! match torchvision's for such names too. The exact names are [`ImageFolder::class_names`]
//! and [`ImageFolder::relative_os`]; messages and the `&str` accessors show them lossily
//! (U+FFFD for an undecodable byte).
//!
//! The index is compact: all relative paths live in one byte string with offsets, so a
//! million-image dataset costs tens of megabytes, not a `PathBuf` per file.

use super::Source;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fs::FileType;
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// torchvision's `IMG_EXTENSIONS`.
pub const IMG_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// An indexed ImageFolder tree.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    /// Class names as text (lossy where a name is not UTF-8).
    classes: Vec<String>,
    /// Class names exactly as the folders are named.
    class_names: Vec<OsString>,
    /// Every sample's path relative to the root, concatenated.
    names: Vec<u8>,
    ends: Vec<u64>,
    labels: Vec<u32>,
    /// The text form of the few relative paths that are not UTF-8, by sample index (U+FFFD for
    /// an undecodable byte), for [`ImageFolder::relative_path`].
    lossy: HashMap<usize, String>,
    not_samples: Vec<(PathBuf, String)>,
}

fn is_hidden(name: &[u8]) -> bool {
    name.first() == Some(&b'.')
}

fn has_image_extension(name: &[u8]) -> bool {
    match name.iter().rposition(|&b| b == b'.') {
        Some(dot) if dot > 0 => IMG_EXTENSIONS.iter().any(|e| e.as_bytes().eq_ignore_ascii_case(&name[dot + 1..])),
        _ => false,
    }
}

/// A name as text, for messages (U+FFFD for an undecodable byte).
fn shown(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// `name`'s code points as Python has them (UTF-8 decoded with `surrogateescape`, as
/// `os.listdir` and `os.walk` give names), encoded back as generalized UTF-8: comparing two
/// keys byte by byte compares the Python strings. A valid UTF-8 name is its own key.
fn python_key(name: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 8);
    for chunk in name.utf8_chunks() {
        key.extend_from_slice(chunk.valid().as_bytes());
        for &b in chunk.invalid() {
            // U+DC00 + b (b >= 0x80: U+DC80..U+DCFF) as three UTF-8-style bytes.
            let cp = 0xDC00 + b as u32;
            key.extend_from_slice(&[
                0xE0 | (cp >> 12) as u8,
                0x80 | ((cp >> 6) & 0x3F) as u8,
                0x80 | (cp & 0x3F) as u8,
            ]);
        }
    }
    key
}

/// Sorts `items` by the name `key` gives, in Python's order (what `sorted(os.listdir(...))`
/// gives); a plain byte sort when every name is UTF-8.
fn sort_python<T>(items: &mut [T], key: impl Fn(&T) -> &[u8]) {
    if items.iter().all(|t| std::str::from_utf8(key(t)).is_ok()) {
        items.sort_by(|a, b| key(a).cmp(key(b)));
    } else {
        items.sort_by_cached_key(|t| python_key(key(t)));
    }
}

/// `a` and `b` joined by `/`.
fn join(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(a.len() + 1 + b.len());
    v.extend_from_slice(a);
    v.push(b'/');
    v.extend_from_slice(b);
    v
}

/// `root` joined with the relative path `rel` (bytes).
fn under(root: &Path, rel: &[u8]) -> PathBuf {
    root.join(OsStr::from_bytes(rel))
}

/// What a folder entry is, after resolving a symlink.
enum Entry {
    /// A folder (or a symlink to one).
    Dir,
    /// A regular file (or a symlink to one), or a dangling symlink (fails when read).
    File,
    /// Anything else: not a sample, with what it is in words.
    Special(String),
}

/// What a non-regular, non-folder file type is, in words.
fn special_kind(t: &FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

/// Classifies a folder entry from its listed type; only a symlink costs a `stat` (of its
/// target; nothing is opened).
fn classify(path: &Path, t: FileType) -> Entry {
    if t.is_dir() {
        return Entry::Dir;
    }
    if t.is_file() {
        return Entry::File;
    }
    if !t.is_symlink() {
        return Entry::Special(format!("not a regular file: {}", special_kind(&t)));
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Entry::Dir,
        Ok(m) if m.is_file() => Entry::File,
        Ok(m) => {
            let target = std::fs::read_link(path).map(|t| format!(" ({})", t.display())).unwrap_or_default();
            Entry::Special(format!("not a regular file: a symlink to {}{target}", special_kind(&m.file_type())))
        }
        // Dangling (or unreadable) link: a sample that fails when read, as in torchvision.
        Err(_) => Entry::File,
    }
}

/// A folder's identity: device and inode, the same whichever path or link reaches it.
type DirId = (u64, u64);

fn dir_id(dir: &Path) -> Result<DirId> {
    let m =
        std::fs::metadata(dir).map_err(|e| Error::Dataset(format!("{}: cannot open folder: {e}", dir.display())))?;
    Ok((m.dev(), m.ino()))
}

impl ImageFolder {
    /// Indexes the tree under `root`.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let meta = std::fs::metadata(&root)
            .map_err(|e| Error::Dataset(format!("{}: cannot open dataset root: {e}", root.display())))?;
        if !meta.is_dir() {
            return Err(Error::Dataset(format!("{}: dataset root is not a directory", root.display())));
        }
        let mut classes: Vec<Vec<u8>> = vec![];
        for (name, path, t) in read_dir(&root)? {
            if !is_hidden(&name) && matches!(classify(&path, t), Entry::Dir) {
                classes.push(name);
            }
        }
        sort_python(&mut classes, |c| c);
        if classes.is_empty() {
            return Err(Error::Dataset(format!(
                "{}: no class folders found (expected ROOT/CLASS/IMAGE files)",
                root.display()
            )));
        }
        let mut names = vec![];
        let mut ends = vec![];
        let mut labels = vec![];
        let mut lossy = HashMap::new();
        let mut empty = vec![];
        let mut not_samples = vec![];
        // The root and every class folder: a link to one of them from inside a class is never
        // followed, whichever class is walked first.
        let mut fixed = HashMap::from([(dir_id(&root)?, vec![])]);
        for class in &classes {
            fixed.entry(dir_id(&under(&root, class))?).or_insert_with(|| class.clone());
        }
        for (label, class) in classes.iter().enumerate() {
            let before = labels.len();
            let left_before = not_samples.len();
            let mut walk = Walk { root: &root, dirs: vec![], seen: fixed.clone(), links: vec![], not_samples };
            walk.class(class)?;
            let Walk { mut dirs, not_samples: left, .. } = walk;
            not_samples = left;
            // sorted(os.walk(...)) sorts by the full path string; we hold paths relative to the
            // class folder's parent, which sort the same way.
            sort_python(&mut dirs, |d| &d.0);
            for (dir, mut files) in dirs {
                sort_python(&mut files, |f| f);
                for f in files {
                    let start = names.len();
                    names.extend_from_slice(&dir);
                    names.push(b'/');
                    names.extend_from_slice(&f);
                    if std::str::from_utf8(&names[start..]).is_err() {
                        lossy.insert(ends.len(), shown(&names[start..]));
                    }
                    ends.push(names.len() as u64);
                    labels.push(label as u32);
                }
            }
            if labels.len() == before {
                empty.push(shown(class));
                if not_samples.len() > left_before {
                    let (path, why) = &not_samples[left_before];
                    empty.last_mut().expect("just pushed").push_str(&format!(" ({}: {why})", path.display()));
                }
            }
        }
        if !empty.is_empty() {
            return Err(Error::Dataset(format!(
                "{}: no image files in class folder(s) {} (image extensions: {})",
                root.display(),
                empty.join(", "),
                IMG_EXTENSIONS.join(", ")
            )));
        }
        let class_names: Vec<OsString> = classes.into_iter().map(OsString::from_vec).collect();
        let classes = class_names.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        Ok(ImageFolder { root, classes, class_names, names, ends, labels, lossy, not_samples })
    }

    /// What indexing left out although it is named like an image or is a folder to walk, as
    /// `(path, reason)` in walk order: FIFOs, devices and sockets (directly or through a
    /// symlink), and folder symlinks that loop back to an ancestor or the root, lead to another
    /// class folder or repeat a folder the class already holds. Hidden entries and files without
    /// an image extension are not listed. Reading one of these would hang or never end (a FIFO,
    /// `/dev/zero`) or index files twice; they are reported here, not as failed samples.
    pub fn not_samples(&self) -> &[(PathBuf, String)] {
        &self.not_samples
    }

    /// The class names as text, in label order (a byte that is not UTF-8 shows as U+FFFD; see
    /// [`ImageFolder::class_names`] for the exact names).
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The class names exactly as the folders are named, in label order.
    pub fn class_names(&self) -> &[OsString] {
        &self.class_names
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of sample `i` relative to the root, exactly.
    pub fn relative_os(&self, i: usize) -> &OsStr {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        OsStr::from_bytes(&self.names[start..self.ends[i] as usize])
    }

    /// The path of sample `i` relative to the root, as text: exact when it is UTF-8, else with
    /// U+FFFD for each undecodable byte (see [`ImageFolder::relative_os`]).
    pub fn relative_path(&self, i: usize) -> &str {
        match std::str::from_utf8(self.relative_os(i).as_bytes()) {
            Ok(s) => s,
            Err(_) => self.lossy.get(&i).map_or("", String::as_str),
        }
    }

    /// Bytes of memory the index uses (paths, offsets, labels).
    pub fn index_bytes(&self) -> usize {
        self.names.capacity()
            + self.ends.capacity() * 8
            + self.labels.capacity() * 4
            + self.lossy.values().map(|s| s.capacity() + 16).sum::<usize>()
    }
}

/// `(name, path, listed type)` of the entries of `dir` (the type from the listing, no `stat`
/// where the file system reports it). Names are bytes: any name Linux allows is listed.
fn read_dir(dir: &Path) -> Result<Vec<(Vec<u8>, PathBuf, FileType)>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
    let mut out = vec![];
    for entry in rd {
        let entry = entry.map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
        let t = entry.file_type().map_err(|e| Error::Dataset(format!("{}: {e}", entry.path().display())))?;
        out.push((entry.file_name().into_vec(), entry.path(), t));
    }
    Ok(out)
}

/// The walk of one class folder: real subfolders first (depth first), then folder symlinks,
/// the one whose path sorts first each time, so a real folder is always indexed under its own
/// path, and which of two links to one folder is followed does not depend on listing order.
struct Walk<'a> {
    root: &'a Path,
    /// `(relative dir, image file names)` per folder walked.
    dirs: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
    /// Folders walked, by identity, with their path relative to the root.
    seen: HashMap<DirId, Vec<u8>>,
    /// Folder symlinks not followed yet (paths relative to the root).
    links: Vec<Vec<u8>>,
    not_samples: Vec<(PathBuf, String)>,
}

impl Walk<'_> {
    /// Walks class folder `class` and everything reachable from it, each folder once.
    fn class(&mut self, class: &[u8]) -> Result<()> {
        self.walk(class.to_vec(), dir_id(&under(self.root, class))?)?;
        while !self.links.is_empty() {
            // The link whose path sorts first is followed next.
            sort_python(&mut self.links, |l| l);
            let link = self.links.remove(0);
            let path = under(self.root, &link);
            match std::fs::metadata(&path) {
                Ok(m) => self.enter(link, (m.dev(), m.ino()))?,
                // Changed since it was listed: not a folder any more.
                Err(e) => self.not_samples.push((path, format!("cannot open folder: {e}"))),
            }
        }
        Ok(())
    }

    /// Walks folder `rel` (identity `id`) unless it was walked already or is the root or a
    /// class folder, which is reported: as a loop when `rel` lies inside that folder.
    fn enter(&mut self, rel: Vec<u8>, id: DirId) -> Result<()> {
        let Some(first) = self.seen.get(&id) else {
            return self.walk(rel, id);
        };
        let name = shown(first);
        let why = if first.is_empty() {
            "folder symlink loop: the dataset root, not walked".to_string()
        } else if rel.strip_prefix(first.as_slice()).is_some_and(|rest| rest.first() == Some(&b'/')) {
            format!("folder symlink loop: the same folder as its ancestor {name}, not walked again")
        } else if !first.contains(&b'/') {
            format!("the class folder {name}: not walked (its images are class {name})")
        } else {
            format!("repeated folder: the same folder as {name}, already indexed there")
        };
        self.not_samples.push((under(self.root, &rel), why));
        Ok(())
    }

    /// Collects folder `rel` (identity `id`) and its real subfolders; queues folder symlinks.
    fn walk(&mut self, rel: Vec<u8>, id: DirId) -> Result<()> {
        self.seen.insert(id, rel.clone());
        let dir = under(self.root, &rel);
        let mut files = vec![];
        let mut subdirs = vec![];
        for (name, path, t) in read_dir(&dir)? {
            if is_hidden(&name) {
                continue;
            }
            match classify(&path, t) {
                Entry::Dir if t.is_symlink() => self.links.push(join(&rel, &name)),
                Entry::Dir => subdirs.push(name),
                Entry::File if has_image_extension(&name) => files.push(name),
                Entry::Special(why) if has_image_extension(&name) => self.not_samples.push((path, why)),
                _ => {}
            }
        }
        self.dirs.push((rel.clone(), files));
        sort_python(&mut subdirs, |s| s);
        for sub in subdirs {
            let sub_id = dir_id(&dir.join(OsStr::from_bytes(&sub)))?;
            self.enter(join(&rel, &sub), sub_id)?;
        }
        Ok(())
    }
}

impl Source for ImageFolder {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.labels[i] as i64
    }

    fn read(&self, i: usize, buf: &mut Vec<u8>, max_bytes: u64) -> Result<()> {
        buf.clear();
        // A per-thread path buffer: joining root and name allocates nothing once warm.
        thread_local! {
            static PATH: std::cell::RefCell<PathBuf> = std::cell::RefCell::new(PathBuf::with_capacity(512));
        }
        PATH.with_borrow_mut(|path| {
            path.clear();
            path.push(&self.root);
            path.push(self.relative_os(i));
            // Non-blocking, so opening a file that became a FIFO after indexing cannot hang; the
            // descriptor's own type (fstat) then decides, not the path's (no race).
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(&*path)
                .map_err(|e| Error::io(&*path, &e))?;
            let meta = f.metadata().map_err(|e| Error::io(&*path, &e))?;
            if !meta.is_file() {
                return Err(Error::Io {
                    path: path.clone(),
                    reason: format!("not a regular file: {}", special_kind(&meta.file_type())),
                });
            }
            let size = meta.len();
            if size > max_bytes {
                return Err(Error::decode(
                    &*path,
                    format!("file too large: {size} bytes > max_file_bytes ({max_bytes})"),
                ));
            }
            let size = size as usize;
            if buf.capacity() < size + 1 {
                // Room for the whole file plus the read that detects its end; a failed
                // allocation is this sample's error.
                let want = (size + 1).checked_next_power_of_two().unwrap_or(size + 1);
                if buf.try_reserve_exact(want).is_err() {
                    buf.try_reserve_exact(size + 1).map_err(|e| Error::Io {
                        path: path.clone(),
                        reason: format!("cannot allocate {size} bytes to read it: {e}"),
                    })?;
                }
            }
            // Never more than the limit, even if the file grows while it is read.
            (&mut f).take(max_bytes.saturating_add(1)).read_to_end(buf).map_err(|e| Error::io(&*path, &e))?;
            if buf.len() as u64 > max_bytes {
                return Err(Error::decode(&*path, format!("file too large: more than max_file_bytes ({max_bytes})")));
            }
            Ok(())
        })
    }

    fn describe(&self, i: usize) -> PathBuf {
        self.root.join(self.relative_os(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }

    #[test]
    fn indexes_like_torchvision() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        touch(&r.join("dog/b.JPG"));
        touch(&r.join("dog/a.png"));
        touch(&r.join("dog/notes.txt"));
        touch(&r.join("dog/.hidden.jpg"));
        touch(&r.join("dog/sub/c.jpeg"));
        touch(&r.join("cat/z.webp"));
        touch(&r.join(".ipynb_checkpoints/x.jpg"));
        touch(&r.join("README.md"));
        let f = ImageFolder::new(r).unwrap();
        assert_eq!(f.classes(), &["cat".to_string(), "dog".to_string()]);
        let paths: Vec<_> = (0..f.len()).map(|i| (f.relative_path(i).to_string(), f.label(i))).collect();
        assert_eq!(
            paths,
            vec![
                ("cat/z.webp".into(), 0),
                ("dog/a.png".into(), 1),
                ("dog/b.JPG".into(), 1),
                ("dog/sub/c.jpeg".into(), 1)
            ]
        );
    }

    /// Python's `sorted()` of the names `os.listdir` gives for these bytes, worked out by hand:
    /// an undecodable byte is U+DC80..U+DCFF, between U+D7FF and U+E000.
    #[test]
    fn names_sort_as_python_sorts_them() {
        let mut names: Vec<&[u8]> = vec![
            b"a\xff",             // 'a\udcff'
            "a\u{e9}".as_bytes(), // 'aé'
            "a\u{10000}".as_bytes(),
            "a\u{e000}".as_bytes(),
            b"a\xc3", // a truncated 'é': 'a\udcc3'
            b"a",
            b"b",
        ];
        sort_python(&mut names, |n| n);
        let want: Vec<&[u8]> =
            vec![b"a", "a\u{e9}".as_bytes(), b"a\xc3", b"a\xff", "a\u{e000}".as_bytes(), "a\u{10000}".as_bytes(), b"b"];
        assert_eq!(names, want);
        // Valid UTF-8 is its own key.
        assert_eq!(python_key("caf\u{e9}".as_bytes()), "caf\u{e9}".as_bytes());
        assert_eq!(python_key(b"\xe9"), [0xED, 0xB3, 0xA9]);
    }

    #[test]
    fn names_that_are_not_utf8_are_indexed() {
        use std::os::unix::ffi::OsStrExt;
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        let p = |b: &[u8]| r.join(OsStr::from_bytes(b));
        touch(&p(b"caf\xe9/x\xff.jpg"));
        touch(&p(b"caf\xe9/a.jpg"));
        touch(&p(b"caf\xe9/sub\x80/b.png"));
        touch(&p("caf\u{e9}/z.jpg".as_bytes()));
        let f = ImageFolder::new(r).unwrap();
        // 'café' < 'caf\udce9'
        assert_eq!(
            f.class_names().iter().map(|c| c.as_bytes()).collect::<Vec<_>>(),
            [b"caf\xc3\xa9".as_slice(), b"caf\xe9"]
        );
        assert_eq!(f.classes(), ["caf\u{e9}", "caf\u{fffd}"]);
        let rel: Vec<_> = (0..f.len()).map(|i| (f.relative_os(i).as_bytes().to_vec(), f.label(i))).collect();
        assert_eq!(
            rel,
            [
                (b"caf\xc3\xa9/z.jpg".to_vec(), 0),
                (b"caf\xe9/a.jpg".to_vec(), 1),
                (b"caf\xe9/x\xff.jpg".to_vec(), 1),
                (b"caf\xe9/sub\x80/b.png".to_vec(), 1)
            ]
        );
        assert_eq!(f.relative_path(2), "caf\u{fffd}/x\u{fffd}.jpg");
        assert_eq!(f.describe(2), p(b"caf\xe9/x\xff.jpg"));
        let mut buf = vec![];
        f.read(2, &mut buf, 100).unwrap();
        assert_eq!(buf, b"x");
    }

    #[test]
    fn clear_errors_for_bad_roots() {
        let d = tempfile::tempdir().unwrap();
        let e = ImageFolder::new(d.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("cannot open dataset root"), "{e}");
        let e = ImageFolder::new(d.path()).unwrap_err();
        assert!(e.to_string().contains("no class folders"), "{e}");
        std::fs::create_dir(d.path().join("empty")).unwrap();
        let e = ImageFolder::new(d.path()).unwrap_err();
        assert!(e.to_string().contains("no image files in class folder(s) empty"), "{e}");
    }
}
