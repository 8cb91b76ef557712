//! Compressed files (and objects in a store), read from start to end: the decompressing
//! reader and the cursor that reads documents in file order.

use super::{too_long, Compression, DocEntry, DocFile};
use crate::error::{Error, Result};
use std::io::Read;
use std::path::Path;

/// A decompressing reader over `path`.
pub fn open_stream(path: &Path, compression: Compression) -> Result<Box<dyn Read + Send>> {
    let f: Box<dyn Read + Send> = if crate::source::is_url(path) {
        crate::source::read_object(&path.to_string_lossy())?.0
    } else {
        Box::new(std::fs::File::open(path).map_err(|e| Error::io(path, &e))?)
    };
    let f = std::io::BufReader::with_capacity(1 << 20, f);
    Ok(match compression {
        Compression::None | Compression::Parquet => Box::new(f),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(f)),
        Compression::Zstd => {
            Box::new(zstd::stream::read::Decoder::with_buffer(f).map_err(|e| Error::decode(path, e.to_string()))?)
        }
    })
}

/// Reads as much of `buf` as `r` gives; a decompression error names the file.
pub(super) fn read_some(r: &mut dyn Read, buf: &mut [u8], path: &Path, at: u64) -> Result<usize> {
    loop {
        match r.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if let Some(down) = crate::source::unavailable(&e) {
                    return Err(down);
                }
                return Err(Error::decode(path, format!("cannot read past byte {at} (truncated or corrupt?): {e}")));
            }
        }
    }
}

/// A decompressing reader positioned in a file, for documents read in file order.
pub struct StreamCursor {
    reader: Box<dyn Read + Send>,
    pos: u64,
    scratch: Vec<u8>,
}

impl StreamCursor {
    /// A cursor at the start of `f`.
    pub fn new(f: &DocFile) -> Result<Self> {
        Ok(StreamCursor { reader: open_stream(&f.path, f.compression)?, pos: 0, scratch: vec![0u8; 1 << 16] })
    }

    /// The byte position in the decompressed stream.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Skips to `offset` (at or after the cursor).
    fn skip_to(&mut self, offset: u64, path: &Path) -> Result<()> {
        while self.pos < offset {
            let n = ((offset - self.pos) as usize).min(self.scratch.len());
            let k = read_some(&mut *self.reader, &mut self.scratch[..n], path, self.pos)?;
            if k == 0 {
                return Err(Error::decode(path, format!("ends at byte {} before its index says", self.pos)));
            }
            self.pos += k as u64;
        }
        Ok(())
    }

    /// Reads document `d` (at or after the cursor) into `buf`; one larger than `max` bytes is
    /// skipped without being held, and is its error.
    pub fn read(&mut self, f: &DocFile, d: &DocEntry, max: u64, buf: &mut Vec<u8>) -> Result<()> {
        self.skip_to(d.offset, &f.path)?;
        if d.len > max {
            self.skip_to(d.offset + d.len, &f.path)?;
            return Err(too_long(f, d, max));
        }
        buf.clear();
        buf.resize(d.len as usize, 0);
        let mut got = 0;
        while got < buf.len() {
            let k = read_some(&mut *self.reader, &mut buf[got..], &f.path, self.pos)?;
            if k == 0 {
                return Err(Error::decode(&f.path, format!("ends at byte {} before its index says", self.pos)));
            }
            got += k;
            self.pos += k as u64;
        }
        Ok(())
    }
}
