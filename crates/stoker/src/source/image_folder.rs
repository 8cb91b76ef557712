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
//! The index is compact: all relative paths live in one string with offsets, so a
//! million-image dataset costs tens of megabytes, not a `PathBuf` per file.

use super::Source;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::FileType;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// torchvision's `IMG_EXTENSIONS`.
pub const IMG_EXTENSIONS: &[&str] = &["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// An indexed ImageFolder tree.
#[derive(Debug)]
pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    names: String,
    ends: Vec<u64>,
    labels: Vec<u32>,
    not_samples: Vec<(PathBuf, String)>,
}

fn is_hidden(name: &str) -> bool {
    name.starts_with('.')
}

fn has_image_extension(name: &str) -> bool {
    match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => IMG_EXTENSIONS.iter().any(|e| e.eq_ignore_ascii_case(ext)),
        _ => false,
    }
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
        let mut classes = vec![];
        for (name, path, t) in read_dir(&root)? {
            if !is_hidden(&name) && matches!(classify(&path, t), Entry::Dir) {
                classes.push(name);
            }
        }
        classes.sort();
        if classes.is_empty() {
            return Err(Error::Dataset(format!(
                "{}: no class folders found (expected ROOT/CLASS/IMAGE files)",
                root.display()
            )));
        }
        let mut names = String::new();
        let mut ends = vec![];
        let mut labels = vec![];
        let mut empty = vec![];
        let mut not_samples = vec![];
        // The root and every class folder: a link to one of them from inside a class is never
        // followed, whichever class is walked first.
        let mut fixed = HashMap::from([(dir_id(&root)?, String::new())]);
        for class in &classes {
            fixed.entry(dir_id(&root.join(class))?).or_insert_with(|| class.clone());
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
            dirs.sort_by(|a, b| a.0.cmp(&b.0));
            for (dir, mut files) in dirs {
                files.sort();
                for f in files {
                    names.push_str(&dir);
                    names.push('/');
                    names.push_str(&f);
                    ends.push(names.len() as u64);
                    labels.push(label as u32);
                }
            }
            if labels.len() == before {
                empty.push(class.clone());
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
        Ok(ImageFolder { root, classes, names, ends, labels, not_samples })
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

    /// The class names, in label order.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of sample `i` relative to the root.
    pub fn relative_path(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.names[start..self.ends[i] as usize]
    }

    /// Bytes of memory the index uses (paths, offsets, labels).
    pub fn index_bytes(&self) -> usize {
        self.names.capacity() + self.ends.capacity() * 8 + self.labels.capacity() * 4
    }
}

/// `(name, path, listed type)` of the entries of `dir` (the type from the listing, no `stat`
/// where the file system reports it).
fn read_dir(dir: &Path) -> Result<Vec<(String, PathBuf, FileType)>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
    let mut out = vec![];
    for entry in rd {
        let entry = entry.map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
        let t = entry.file_type().map_err(|e| Error::Dataset(format!("{}: {e}", entry.path().display())))?;
        match entry.file_name().into_string() {
            Ok(name) => out.push((name, entry.path(), t)),
            Err(name) => {
                return Err(Error::Dataset(format!("{}: file name is not valid UTF-8: {name:?}", dir.display())))
            }
        }
    }
    Ok(out)
}

/// The walk of one class folder: real subfolders first (depth first), then folder symlinks,
/// the one whose path sorts first each time, so a real folder is always indexed under its own
/// path, and which of two links to one folder is followed does not depend on listing order.
struct Walk<'a> {
    root: &'a Path,
    /// `(relative dir, image file names)` per folder walked.
    dirs: Vec<(String, Vec<String>)>,
    /// Folders walked, by identity, with their path relative to the root.
    seen: HashMap<DirId, String>,
    /// Folder symlinks not followed yet (paths relative to the root).
    links: Vec<String>,
    not_samples: Vec<(PathBuf, String)>,
}

impl Walk<'_> {
    /// Walks class folder `class` and everything reachable from it, each folder once.
    fn class(&mut self, class: &str) -> Result<()> {
        self.walk(class.to_string(), dir_id(&self.root.join(class))?)?;
        while !self.links.is_empty() {
            self.links.sort_by(|a, b| b.cmp(a));
            let link = self.links.pop().expect("not empty");
            let path = self.root.join(&link);
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
    fn enter(&mut self, rel: String, id: DirId) -> Result<()> {
        let Some(first) = self.seen.get(&id) else {
            return self.walk(rel, id);
        };
        let why = if first.is_empty() {
            "folder symlink loop: the dataset root, not walked".to_string()
        } else if rel.strip_prefix(first.as_str()).is_some_and(|rest| rest.starts_with('/')) {
            format!("folder symlink loop: the same folder as its ancestor {first}, not walked again")
        } else if !first.contains('/') {
            format!("the class folder {first}: not walked (its images are class {first})")
        } else {
            format!("repeated folder: the same folder as {first}, already indexed there")
        };
        self.not_samples.push((self.root.join(rel), why));
        Ok(())
    }

    /// Collects folder `rel` (identity `id`) and its real subfolders; queues folder symlinks.
    fn walk(&mut self, rel: String, id: DirId) -> Result<()> {
        self.seen.insert(id, rel.clone());
        let dir = self.root.join(&rel);
        let mut files = vec![];
        let mut subdirs = vec![];
        for (name, path, t) in read_dir(&dir)? {
            if is_hidden(&name) {
                continue;
            }
            match classify(&path, t) {
                Entry::Dir if t.is_symlink() => self.links.push(format!("{rel}/{name}")),
                Entry::Dir => subdirs.push(name),
                Entry::File if has_image_extension(&name) => files.push(name),
                Entry::Special(why) if has_image_extension(&name) => {
                    self.not_samples.push((self.root.join(format!("{rel}/{name}")), why))
                }
                _ => {}
            }
        }
        self.dirs.push((rel.clone(), files));
        subdirs.sort();
        for sub in subdirs {
            let sub_id = dir_id(&dir.join(&sub))?;
            self.enter(format!("{rel}/{sub}"), sub_id)?;
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
            path.push(self.relative_path(i));
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
        self.root.join(self.relative_path(i))
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
