//! `ImageFolder`: a root with one subfolder per class, indexed like torchvision's `ImageFolder`.
//!
//! Classes are the sorted names of the root's subfolders (hidden ones, starting with `.`, are
//! ignored, unlike torchvision, so `.ipynb_checkpoints` never becomes a class). Inside each class
//! folder the walk mirrors `sorted(os.walk(..., followlinks=True))` with sorted file names, so
//! sample `i` here is sample `i` there. Files are kept when their extension is one of
//! torchvision's image extensions (case-insensitive) and they are not hidden.
//!
//! The index is compact: all relative paths live in one string with offsets, so a
//! million-image dataset costs tens of megabytes, not a `PathBuf` per file.

use super::Source;
use crate::error::{Error, Result};
use std::io::Read;
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
        for entry in read_dir(&root)? {
            let (name, path) = entry;
            if !is_hidden(&name) && path.is_dir() {
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
        for (label, class) in classes.iter().enumerate() {
            let before = labels.len();
            let mut dirs = vec![];
            walk(&root.join(class), class.clone(), &mut dirs)?;
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
        Ok(ImageFolder { root, classes, names, ends, labels })
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

fn read_dir(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let rd =
        std::fs::read_dir(dir).map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
    let mut out = vec![];
    for entry in rd {
        let entry = entry.map_err(|e| Error::Dataset(format!("{}: cannot list folder: {e}", dir.display())))?;
        match entry.file_name().into_string() {
            Ok(name) => out.push((name, entry.path())),
            Err(name) => {
                return Err(Error::Dataset(format!("{}: file name is not valid UTF-8: {name:?}", dir.display())))
            }
        }
    }
    Ok(out)
}

/// Collects `(relative dir, image file names)` for `dir` and its subfolders (following links).
fn walk(dir: &Path, rel: String, out: &mut Vec<(String, Vec<String>)>) -> Result<()> {
    let mut files = vec![];
    let mut subdirs = vec![];
    for (name, path) in read_dir(dir)? {
        if is_hidden(&name) {
            continue;
        }
        if path.is_dir() {
            subdirs.push(name);
        } else if has_image_extension(&name) {
            files.push(name);
        }
    }
    out.push((rel.clone(), files));
    for sub in subdirs {
        walk(&dir.join(&sub), format!("{rel}/{sub}"), out)?;
    }
    Ok(())
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
            let mut f = std::fs::File::open(&*path).map_err(|e| Error::io(&*path, &e))?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(0);
            if size > max_bytes {
                return Err(Error::decode(
                    &*path,
                    format!("file too large: {size} bytes > max_file_bytes ({max_bytes})"),
                ));
            }
            let size = size as usize;
            if buf.capacity() < size + 1 {
                // Room for the whole file plus the read that detects its end.
                buf.reserve_exact((size + 1).next_power_of_two());
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
