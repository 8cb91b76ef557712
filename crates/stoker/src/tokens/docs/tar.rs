//! WebDataset tar shards of text: a document per `.txt` member, or per `.json` member.

use super::stream::open_stream;
use super::{Compression, DocEntry, DocFile, TarText};
use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// A decompressing stream as the tar reader's input: seeks forward by reading (a compressed
/// shard is listed from start to end; a seek backwards is an error).
struct Forward {
    inner: Box<dyn Read + Send>,
    pos: u64,
}

impl Read for Forward {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl std::io::Seek for Forward {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        match to {
            std::io::SeekFrom::Start(n) if n >= self.pos => {
                let want = n - self.pos;
                let got = std::io::copy(&mut (&mut self.inner).take(want), &mut std::io::sink())?;
                self.pos += got;
                if got < want {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                Ok(n)
            }
            std::io::SeekFrom::Current(0) => Ok(self.pos),
            _ => Err(std::io::Error::other("a compressed shard is read from start to end only")),
        }
    }
}

impl DocFile {
    /// Indexes a tar shard's members: the `.txt` ones, or the `.json` ones where there is no
    /// `.txt` (a hard link to an earlier member is that member again: not a second document).
    pub(super) fn open_tar(path: &Path, compression: Compression, len: u64) -> Result<Self> {
        use crate::source::tar::Reader;
        let bad = |e: String| Error::decode(path, format!("not a readable tar shard: {e}"));
        // (data offset, size, member ordinal, is .txt) of the .txt and .json members.
        let mut found: Vec<(u64, u64, u64, bool)> = Vec::new();
        let mut end = 0u64;
        let mut note = |m: crate::source::tar::Member, k: u64| {
            end = end.max(m.offset + m.size);
            let txt = m.name.ends_with(".txt");
            if txt || m.name.ends_with(".json") {
                found.push((m.offset, m.size, k, txt));
            }
        };
        if compression == Compression::None && !crate::source::is_url(path) {
            let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
            let mut r = Reader::new(std::io::BufReader::with_capacity(1 << 16, f), len);
            let mut k = 0;
            while let Some(m) = r.next_member().map_err(bad)? {
                k += 1;
                note(m, k);
            }
        } else {
            let mut r = Reader::new(Forward { inner: open_stream(path, compression)?, pos: 0 }, u64::MAX);
            let mut k = 0;
            while let Some(m) = r.next_member().map_err(bad)? {
                k += 1;
                note(m, k);
            }
        }
        let kind = if found.iter().any(|m| m.3) { TarText::Txt } else { TarText::Json };
        let mut docs = Vec::new();
        let mut last = None;
        for (offset, size, k, txt) in found {
            if txt != (kind == TarText::Txt) || size == 0 || last.is_some_and(|l| offset <= l) {
                continue;
            }
            last = Some(offset);
            docs.push(DocEntry { offset, len: size, line: k });
        }
        let bytes = if compression == Compression::None && !crate::source::is_url(path) { len } else { end };
        Ok(DocFile { path: path.to_path_buf(), compression, docs, bytes, width: 0, tar: Some(kind) })
    }
}
