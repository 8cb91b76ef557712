//! [`DocSource`]: the documents of a loader's files (text, token files or token caches), each
//! file indexed ([`super::index`]) or opened as a cache ([`super::cache`]), numbered in file
//! order. It holds what the formats of [`super::docs`] describe; neither of those imports it.

use super::docs::{Compression, DocFile, Format};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The documents of several files, numbered in file order.
#[derive(Debug)]
pub struct DocSource {
    /// The files.
    pub files: Vec<DocFile>,
    /// How documents are delimited and what they hold (the first file's format; text formats
    /// may differ from file to file, see [`DocSource::formats`]).
    pub format: Format,
    /// Each file's format.
    pub formats: Vec<Format>,
    /// The global number of the first document of each file, and the total at the end.
    starts: Vec<u64>,
}

impl DocSource {
    /// Indexes every file (`eos`: see [`DocFile::open`]), reading and storing the indexes in
    /// `index_dir` ([`super::index`]).
    pub fn open(paths: &[PathBuf], formats: &[Format], eos: Option<u32>, index_dir: Option<&Path>) -> Result<Self> {
        if paths.is_empty() || paths.len() != formats.len() {
            return Err(Error::config("data", "no files given"));
        }
        let format = formats[0];
        let files = paths
            .iter()
            .zip(formats)
            .map(|(p, &format)| match format {
                Format::Cache(_) => super::cache::open(p).map(|(f, _)| f),
                _ => super::index::open(p, format, eos, index_dir),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut starts = Vec::with_capacity(files.len() + 1);
        let mut n = 0u64;
        for f in &files {
            starts.push(n);
            n += f.docs.len() as u64;
        }
        starts.push(n);
        if n == 0 {
            return Err(Error::Dataset(format!(
                "no documents in {} file(s), first {}",
                files.len(),
                paths[0].display()
            )));
        }
        Ok(DocSource { files, format, formats: formats.to_vec(), starts })
    }

    /// Documents in all files.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("one entry at least")
    }

    /// Whether there are no documents (never, for an opened source).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether every file is read at any position in a global order: none is compressed, and
    /// none is in object storage. An object is read at positions too (cached 8 MiB blocks, see
    /// `source::open_positioned`), but in the windowed order of compressed files, so that a
    /// pass reads each block once instead of a request per document.
    pub fn random_access(&self) -> bool {
        self.files.iter().all(|f| f.compression == Compression::None && !crate::source::is_url(&f.path))
    }

    /// Documents per file.
    pub fn counts(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.docs.len() as u64).collect()
    }

    /// `(file, ordinal in it)` of global document `g`.
    pub fn locate(&self, g: u64) -> (usize, usize) {
        let f = self.starts.partition_point(|&s| s <= g) - 1;
        (f, (g - self.starts[f]) as usize)
    }

    /// Total bytes of the files' documents (decompressed).
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }

    /// A hash of the file list and index, for the fingerprint of a saved state.
    pub fn hash(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for f in &self.files {
            h.update(f.path.as_os_str().as_encoded_bytes());
            h.update(&(f.docs.len() as u64).to_le_bytes());
            h.update(&f.bytes.to_le_bytes());
        }
        h.digest()
    }
}
