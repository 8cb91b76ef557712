//! Documents on disk: JSON Lines (plain, `.gz`, `.zst`), plain text (a document per line or per
//! file), Parquet, WebDataset tar shards (`.txt` or `.json` members) and pre-tokenized token
//! files (a flat little-endian `uint16`/`uint32` array, nanoGPT's `.bin`, a 1-D `.npy`, or
//! Megatron's `.bin` + `.idx`). Only an index lives in memory: per document its byte offset, its
//! length and its line, 24 bytes (built by one pass over each file when the loader opens it).
//!
//! Plain files are read with positional reads (any order: a global permutation per epoch);
//! compressed ones are decompressed as a stream, in file order, so their order is "files
//! permuted, documents shuffled within windows" ([`super::corpus::DocSource::random_access`]).

use crate::error::{Error, Result};
use std::io::Read;
use std::path::{Path, PathBuf};

/// How a file holds its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Format {
    /// JSON Lines: one object per line, the text under a key.
    Jsonl,
    /// Plain UTF-8 text, a document per non-empty line.
    Lines,
    /// Plain UTF-8 text, the whole file one document.
    File,
    /// Pre-tokenized: a flat little-endian array of token ids of this many bytes each (2 or 4;
    /// a `.npy` file's own dtype wins), documents ending at each end-of-sequence token.
    Tokens(u8),
    /// Parquet: the text in a string column (named like the JSON key), read a row group at a
    /// time.
    Parquet,
    /// A token cache folder (`stoker tokenize`): documents cut by its index, tokens of this
    /// many bytes; BOS/EOS are added by the loader, as for text.
    Cache(u8),
    /// WebDataset tar shards (plain, `.gz`, `.zst`): a document per `.txt` member, or per
    /// `.json` member (the text under the key) in a shard without `.txt` members.
    Tar,
}

/// Which members of a tar shard are its documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TarText {
    /// `KEY.txt` members: UTF-8 text.
    Txt,
    /// `KEY.json` members: a JSON object, the text under `text_key`.
    Json,
}

/// How a file is compressed (from its name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Not compressed: read with positional reads.
    None,
    /// gzip (`.gz`).
    Gzip,
    /// Zstandard (`.zst`).
    Zstd,
    /// Parquet: its own compressed pages, decoded a row group (of one column) at a time.
    Parquet,
}

impl Compression {
    /// The compression a file name says.
    pub fn of(path: &Path) -> Self {
        match path.extension().and_then(|e| e.to_str()) {
            Some("parquet") => Compression::Parquet,
            Some("gz") | Some("tgz") => Compression::Gzip,
            Some("zst") | Some("zstd") => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// One document's place in its file (Parquet: `offset` is the row group, `len` the row in it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocEntry {
    /// Byte offset in the (decompressed) file.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// 1-based line (text formats) or 0-based token index (token files), for messages.
    pub line: u64,
}

/// One file of documents and its index.
#[derive(Debug)]
pub struct DocFile {
    /// The file.
    pub path: PathBuf,
    /// How it is compressed.
    pub compression: Compression,
    /// Its documents, in file order.
    pub docs: Vec<DocEntry>,
    /// The file's (decompressed) length in bytes.
    pub bytes: u64,
    /// Bytes per token of a token file (2 or 4; 0 for text).
    pub width: u8,
    /// A tar shard: which members are the documents.
    pub tar: Option<TarText>,
}

/// The first 9 bytes of a Megatron `.idx` file.
const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

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

/// Bytes of one read while an index is built.
const SCAN_CHUNK: usize = 4 << 20;

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

/// A failed read of `path` at a position: [`Error::Unavailable`] when its store does not
/// answer, else an [`Error::Io`] naming it.
fn read_error(path: &Path, e: &std::io::Error) -> Error {
    crate::source::unavailable(e).unwrap_or_else(|| Error::io(path, e))
}

/// Reads as much of `buf` as `r` gives; a decompression error names the file.
fn read_some(r: &mut dyn Read, buf: &mut [u8], path: &Path, at: u64) -> Result<usize> {
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

impl DocFile {
    /// A token cache's `tokens.bin` with its documents (see [`super::cache::open`]).
    pub fn cache(path: PathBuf, docs: Vec<DocEntry>, bytes: u64, width: u8) -> Self {
        DocFile { path, compression: Compression::None, docs, bytes, width, tar: None }
    }

    /// Where document `d` is, for messages: `line 7`, `row 7` (Parquet), `member 7` (tar),
    /// `document at token 7` (token files).
    pub fn place(&self, d: &DocEntry) -> String {
        match (self.tar, self.compression, self.width) {
            (Some(_), _, _) => format!("member {}", d.line),
            (_, Compression::Parquet, _) => format!("row {}", d.line),
            (_, _, 0) => format!("line {}", d.line),
            _ => format!("document at token {}", d.line),
        }
    }

    /// Opens `path` and indexes its documents (`format` says how they are delimited; a token
    /// file needs `eos`, the id that ends each document, or is one document).
    pub fn open(path: &Path, format: Format, eos: Option<u32>) -> Result<Self> {
        if crate::source::is_url(path) {
            return Self::open_object(path, format, eos);
        }
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, &e))?;
        if !meta.is_file() {
            return Err(Error::decode(path, "not a regular file"));
        }
        if format == Format::Parquet {
            let (rows, _) = parquet_rows(path)?;
            let mut docs = Vec::new();
            let mut line = 1u64;
            for (g, n) in rows.iter().enumerate() {
                for r in 0..*n {
                    docs.push(DocEntry { offset: g as u64, len: r, line });
                    line += 1;
                }
            }
            return Ok(DocFile {
                path: path.to_path_buf(),
                compression: Compression::Parquet,
                docs,
                bytes: meta.len(),
                width: 0,
                tar: None,
            });
        }
        let compression = Compression::of(path);
        if format == Format::Tar {
            return Self::open_tar(path, compression, meta.len());
        }
        if let (Format::Tokens(_), c) = (format, compression) {
            if c != Compression::None {
                return Err(Error::decode(path, "token files are read in place: decompress it first"));
            }
            return Self::open_tokens(path, format, eos);
        }
        Self::scan(path, compression, format)
    }

    /// Indexes a text file (JSON Lines, lines, or a document per file) by reading it through.
    fn scan(path: &Path, compression: Compression, format: Format) -> Result<Self> {
        if format == Format::File {
            // A document per file: its length is known only once decompressed.
            let bytes = if compression == Compression::None && !crate::source::is_url(path) {
                std::fs::metadata(path).map_err(|e| Error::io(path, &e))?.len()
            } else {
                let mut r = open_stream(path, compression)?;
                let mut buf = vec![0u8; SCAN_CHUNK];
                let mut n = 0u64;
                loop {
                    let k = read_some(&mut *r, &mut buf, path, n)?;
                    if k == 0 {
                        break;
                    }
                    n += k as u64;
                }
                n
            };
            let docs = vec![DocEntry { offset: 0, len: bytes, line: 1 }];
            return Ok(DocFile { path: path.to_path_buf(), compression, docs, bytes, width: 0, tar: None });
        }
        let mut r = open_stream(path, compression)?;
        let mut buf = vec![0u8; SCAN_CHUNK];
        let mut docs = Vec::new();
        let (mut pos, mut line_start, mut line) = (0u64, 0u64, 1u64);
        let mut blank = true; // the current line so far is whitespace only
        loop {
            let n = read_some(&mut *r, &mut buf, path, pos)?;
            if n == 0 {
                break;
            }
            let chunk = &buf[..n];
            let mut from = 0;
            for nl in memchr::memchr_iter(b'\n', chunk) {
                blank &= chunk[from..nl].iter().all(u8::is_ascii_whitespace);
                let end = pos + nl as u64;
                if !blank {
                    docs.push(DocEntry { offset: line_start, len: end - line_start, line });
                }
                line += 1;
                line_start = end + 1;
                blank = true;
                from = nl + 1;
            }
            blank &= chunk[from..].iter().all(u8::is_ascii_whitespace);
            pos += n as u64;
        }
        if !blank {
            docs.push(DocEntry { offset: line_start, len: pos - line_start, line });
        }
        Ok(DocFile { path: path.to_path_buf(), compression, docs, bytes: pos, width: 0, tar: None })
    }

    /// Indexes an object in object storage by reading it from start to end (JSON Lines, text
    /// and tar shards, compressed or not; its documents are then read as a stream, in order).
    fn open_object(path: &Path, format: Format, eos: Option<u32>) -> Result<Self> {
        let compression = match (format, Compression::of(path)) {
            (Format::Tokens(_), Compression::None) => return Self::open_tokens(path, format, eos),
            (Format::Tokens(_) | Format::Parquet | Format::Cache(_), _) => {
                return Err(Error::config(
                    "data",
                    format!(
                        "{}: compressed token files and Parquet in object storage are not read: copy them to a local \
                         disk (or decompress token files)",
                        path.display()
                    ),
                ))
            }
            (_, c) => c,
        };
        if format == Format::Tar {
            return Self::open_tar(path, compression, u64::MAX);
        }
        Self::scan(path, compression, format)
    }

    /// Indexes a tar shard's members: the `.txt` ones, or the `.json` ones where there is no
    /// `.txt` (a hard link to an earlier member is that member again: not a second document).
    fn open_tar(path: &Path, compression: Compression, len: u64) -> Result<Self> {
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

    /// Megatron's indexed dataset: `X.bin` (the tokens) and `X.idx` (`MMIDIDX` header,
    /// version 1, dtype code, sequence and document counts, then `int32` sequence lengths,
    /// `int64` byte offsets, `int64` document boundaries in sequences). Every count and offset is
    /// checked against the two files' lengths before anything is allocated or read.
    fn open_megatron(path: &Path, idx: &Path, bin_len: u64) -> Result<Self> {
        let f = crate::source::open_positioned(idx)?;
        let idx_len = f.size();
        let bad = |why: String| Error::decode(idx, why);
        let mut head = [0u8; 34];
        if idx_len < head.len() as u64 {
            return Err(bad(format!("{idx_len} bytes: too short for a Megatron index")));
        }
        f.read_exact_at(&mut head, 0).map_err(|e| read_error(idx, &e))?;
        let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if &head[..9] != MEGATRON_MAGIC {
            return Err(bad("not a Megatron index (no MMIDIDX header)".into()));
        }
        if u64_at(&head, 9) != 1 {
            return Err(bad(format!("Megatron index version {}: only version 1 is known", u64_at(&head, 9))));
        }
        let width: u64 = match head[17] {
            8 => 2, // uint16
            4 => 4, // int32
            c => return Err(bad(format!("token dtype code {c}: expected 8 (uint16) or 4 (int32)"))),
        };
        let (seqs, ndocs) = (u64_at(&head, 18), u64_at(&head, 26));
        let want = seqs
            .checked_mul(12)
            .and_then(|s| ndocs.checked_mul(8).and_then(|d| s.checked_add(d)))
            .and_then(|b| b.checked_add(34));
        // Multimodal indexes append one mode byte per sequence.
        if want.is_none_or(|w| idx_len != w && Some(idx_len) != w.checked_add(seqs)) {
            return Err(bad(format!(
                "{seqs} sequences and {ndocs} document boundaries do not fit its {idx_len} bytes (truncated?)"
            )));
        }
        let body_len = seqs as usize * 12 + ndocs as usize * 8;
        let mut body = vec![0u8; body_len];
        f.read_exact_at(&mut body, head.len() as u64).map_err(|e| read_error(idx, &e))?;
        let (sizes, rest) = body.split_at(seqs as usize * 4);
        let (pointers, bounds) = rest.split_at(seqs as usize * 8);
        let size = |j: usize| i32::from_le_bytes(sizes[j * 4..j * 4 + 4].try_into().expect("4 bytes"));
        let ptr = |j: usize| u64_at(pointers, j * 8);
        let bound = |i: usize| u64_at(bounds, i * 8);
        let mut docs = Vec::with_capacity(ndocs.saturating_sub(1) as usize);
        for i in 1..ndocs as usize {
            let (s, e) = (bound(i - 1), bound(i));
            if s > e || e > seqs {
                return Err(bad(format!("document {}: sequences {s}..{e} of {seqs}", i - 1)));
            }
            if s == e {
                continue;
            }
            let offset = ptr(s as usize);
            let mut at = offset;
            for j in s as usize..e as usize {
                let n = size(j);
                if n < 0 || ptr(j) != at {
                    return Err(bad(format!(
                        "sequence {j}: length {n} at byte {} (expected byte {at}: sequences of a document are contiguous)",
                        ptr(j)
                    )));
                }
                at = at.saturating_add(n as u64 * width);
            }
            if at > bin_len {
                return Err(Error::decode(
                    path,
                    format!("{bin_len} bytes, but its index places document {} up to byte {at} (truncated?)", i - 1),
                ));
            }
            if at > offset {
                docs.push(DocEntry { offset, len: at - offset, line: offset / width });
            }
        }
        Ok(DocFile {
            path: path.to_path_buf(),
            compression: Compression::None,
            docs,
            bytes: bin_len,
            width: width as u8,
            tar: None,
        })
    }

    /// A token file, local or in object storage (read at positions either way).
    fn open_tokens(path: &Path, format: Format, eos: Option<u32>) -> Result<Self> {
        let Format::Tokens(given) = format else { unreachable!("token format") };
        let f = crate::source::open_positioned(path)?;
        let len = f.size();
        let idx = path.with_extension("idx");
        if path.extension().is_some_and(|e| e == "bin") && crate::source::exists(&idx)? {
            return Self::open_megatron(path, &idx, len);
        }
        let (data_offset, width) = if path.extension().is_some_and(|e| e == "npy") {
            let mut head = vec![0u8; (len as usize).min(crate::source::npy::NPY_HEADER_MAX)];
            f.read_exact_at(&mut head, 0).map_err(|e| read_error(path, &e))?;
            let l = crate::source::npy::npy_layout(&head, len as usize, path)?;
            let width = match l.header.descr.as_str() {
                "<u2" => 2u64,
                "<u4" | "<i4" => 4,
                d => {
                    return Err(Error::decode(
                        path,
                        format!("token array of dtype {d}: expected uint16, uint32 or int32"),
                    ))
                }
            };
            if l.header.shape.len() != 1 {
                return Err(Error::decode(path, format!("token array of shape {:?}: expected 1-D", l.header.shape)));
            }
            (l.header.data_offset as u64, width)
        } else {
            (0, given as u64)
        };
        let bytes = len - data_offset;
        if !bytes.is_multiple_of(width) {
            return Err(Error::decode(path, format!("{bytes} bytes of tokens is not a multiple of {width} bytes")));
        }
        let mut docs = Vec::new();
        let mut start = 0u64; // token index where the current document starts
        if let Some(eos) = eos {
            let mut buf = vec![0u8; SCAN_CHUNK];
            let mut at = 0u64;
            while at < bytes {
                let n = ((bytes - at) as usize).min(SCAN_CHUNK);
                f.read_exact_at(&mut buf[..n], data_offset + at).map_err(|e| read_error(path, &e))?;
                for (k, t) in buf[..n].chunks_exact(width as usize).enumerate() {
                    let id = if width == 2 {
                        u16::from_le_bytes([t[0], t[1]]) as u32
                    } else {
                        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
                    };
                    if id == eos {
                        let end = at / width + k as u64 + 1;
                        docs.push(DocEntry {
                            offset: data_offset + start * width,
                            len: (end - start) * width,
                            line: start,
                        });
                        start = end;
                    }
                }
                at += n as u64;
            }
        }
        let total = bytes / width;
        if start < total {
            docs.push(DocEntry { offset: data_offset + start * width, len: (total - start) * width, line: start });
        }
        Ok(DocFile {
            path: path.to_path_buf(),
            compression: Compression::None,
            docs,
            bytes,
            width: width as u8,
            tar: None,
        })
    }

    /// Reads document `d` (token files, uncompressed local text, and uncompressed objects in a
    /// store through `source::open_positioned`'s blocks) into `buf`.
    pub fn read_at(&self, file: &dyn crate::source::PositionedRead, d: &DocEntry, buf: &mut Vec<u8>) -> Result<()> {
        buf.clear();
        buf.resize(d.len as usize, 0);
        file.read_exact_at(buf, d.offset).map_err(|e| {
            if let Some(down) = crate::source::unavailable(&e) {
                return down;
            }
            let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                format!("{}: the file became shorter while it was read (truncated or rewritten?)", self.place(d))
            } else {
                format!("{}: {e}", self.place(d))
            };
            Error::Io { path: self.path.clone(), reason: why }
        })
    }
}

/// Rows per row group of a Parquet file, and the file's reader.
fn parquet_rows(
    path: &Path,
) -> Result<(Vec<u64>, parquet::file::serialized_reader::SerializedFileReader<std::fs::File>)> {
    use parquet::file::reader::FileReader;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
    let r = parquet::file::serialized_reader::SerializedFileReader::new(f)
        .map_err(|e| Error::decode(path, format!("not a readable Parquet file: {e}")))?;
    let rows = r.metadata().row_groups().iter().map(|g| g.num_rows().max(0) as u64).collect();
    Ok((rows, r))
}

/// The string column `key` of a Parquet file, read a row group at a time; the last group read
/// is kept (a window of documents lies in one group).
pub struct ParquetCursor {
    reader: parquet::file::serialized_reader::SerializedFileReader<std::fs::File>,
    column: usize,
    group: Option<(u64, Vec<Option<parquet::data_type::ByteArray>>)>,
}

impl ParquetCursor {
    /// Opens `f`'s column `key` (a UTF-8 string column, required or optional).
    pub fn new(f: &DocFile, key: &str) -> Result<Self> {
        use parquet::file::reader::FileReader;
        let (_, reader) = parquet_rows(&f.path)?;
        let schema = reader.metadata().file_metadata().schema_descr_ptr();
        let names: Vec<String> = schema.columns().iter().map(|c| c.path().string()).collect();
        let column = names.iter().position(|n| n == key).ok_or_else(|| {
            Error::decode(&f.path, format!("no column `{key}` (text_key); columns: {}", names.join(", ")))
        })?;
        let c = schema.column(column);
        if c.physical_type() != parquet::basic::Type::BYTE_ARRAY || c.max_rep_level() > 0 {
            return Err(Error::decode(
                &f.path,
                format!("column `{key}` is not a string column ({:?})", c.physical_type()),
            ));
        }
        Ok(ParquetCursor { reader, column, group: None })
    }

    /// Reads document `d` (row `d.len` of row group `d.offset`) into `buf`.
    pub fn read(&mut self, f: &DocFile, d: &DocEntry, max: u64, buf: &mut Vec<u8>) -> Result<()> {
        use parquet::column::reader::ColumnReader;
        use parquet::file::reader::FileReader;
        if self.group.as_ref().is_none_or(|(g, _)| *g != d.offset) {
            self.group = None;
            let bad = |e: parquet::errors::ParquetError| Error::decode(&f.path, format!("row group {}: {e}", d.offset));
            let rg = self.reader.get_row_group(d.offset as usize).map_err(bad)?;
            let n = rg.metadata().num_rows().max(0) as usize;
            let max_def = rg.metadata().column(self.column).column_descr().max_def_level();
            let ColumnReader::ByteArrayColumnReader(mut r) = rg.get_column_reader(self.column).map_err(bad)? else {
                return Err(Error::decode(&f.path, "the text column is not a string column"));
            };
            let (mut values, mut defs) = (Vec::new(), Vec::new());
            let mut got = 0;
            while got < n {
                let (recs, _, _) = r.read_records(n - got, Some(&mut defs), None, &mut values).map_err(bad)?;
                if recs == 0 {
                    break;
                }
                got += recs;
            }
            let mut vals = values.into_iter();
            let rows: Vec<Option<parquet::data_type::ByteArray>> = if max_def == 0 {
                vals.map(Some).collect()
            } else {
                defs.iter().map(|&l| if l == max_def { vals.next() } else { None }).collect()
            };
            self.group = Some((d.offset, rows));
        }
        let (_, rows) = self.group.as_ref().expect("read above");
        let v = rows
            .get(d.len as usize)
            .ok_or_else(|| Error::decode(&f.path, format!("row {}: past the end of its row group", d.line)))?
            .as_ref()
            .ok_or_else(|| Error::decode(&f.path, format!("row {}: the text is null", d.line)))?;
        if v.len() as u64 > max {
            return Err(Error::decode(
                &f.path,
                format!(
                    "row {}: a document of {} bytes, more than max_document_bytes ({max}): skipped",
                    d.line,
                    v.len()
                ),
            ));
        }
        buf.clear();
        buf.extend_from_slice(v.data());
        Ok(())
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

/// The error of a document longer than `max_document_bytes`.
pub fn too_long(f: &DocFile, d: &DocEntry, max: u64) -> Error {
    Error::decode(
        &f.path,
        format!("{}: a document of {} bytes, more than max_document_bytes ({max}): skipped", f.place(d), d.len),
    )
}

/// The text of a JSON Lines record: the string under `key`, parsed without building the rest
/// of the object.
pub fn json_text<'a>(line: &'a [u8], key: &str) -> std::result::Result<std::borrow::Cow<'a, str>, String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    use std::borrow::Cow;
    struct Text<'k>(&'k str);
    impl<'de> Visitor<'de> for Text<'_> {
        type Value = Option<Cow<'de, str>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(k) = m.next_key::<Cow<'de, str>>()? {
                if k == self.0 && found.is_none() {
                    found = Some(
                        m.next_value::<Cow<'de, str>>()
                            .map_err(|e| serde::de::Error::custom(format!("`{}` is not a string ({e})", self.0)))?,
                    );
                } else {
                    m.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(line);
    let v = de.deserialize_map(Text(key)).map_err(|e| format!("not a JSON object with a string `{key}`: {e}"))?;
    de.end().map_err(|e| format!("trailing characters after the JSON object: {e}"))?;
    v.ok_or_else(|| format!("no key `{key}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_index_skips_blank_lines_and_reads_compressed_the_same() {
        let d = tempfile::tempdir().unwrap();
        let text = b"{\"text\": \"a\"}\n\n  \n{\"text\": \"bb\"}\n{\"text\": \"c\"}";
        let plain = d.path().join("x.jsonl");
        std::fs::write(&plain, text).unwrap();
        let zst = d.path().join("x.jsonl.zst");
        std::fs::write(&zst, zstd::encode_all(&text[..], 3).unwrap()).unwrap();
        let gz = d.path().join("x.jsonl.gz");
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, text).unwrap();
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        let want = vec![
            DocEntry { offset: 0, len: 13, line: 1 },
            DocEntry { offset: 18, len: 14, line: 4 },
            DocEntry { offset: 33, len: 13, line: 5 },
        ];
        for p in [&plain, &zst, &gz] {
            let f = DocFile::open(p, Format::Jsonl, None).unwrap();
            assert_eq!(f.docs, want, "{p:?}");
            let mut c = StreamCursor::new(&f).unwrap();
            let mut buf = vec![];
            c.read(&f, &f.docs[1], 100, &mut buf).unwrap();
            assert_eq!(json_text(&buf, "text").unwrap(), "bb");
            let err = c.read(&f, &f.docs[2], 5, &mut buf).unwrap_err().to_string();
            assert!(err.contains("line 5") && err.contains("max_document_bytes"), "{err}");
        }
    }

    #[test]
    fn a_truncated_zst_is_an_error_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let text: Vec<u8> = (0..2000).flat_map(|i| format!("{{\"text\": \"doc {i}\"}}\n").into_bytes()).collect();
        let z = zstd::encode_all(&text[..], 3).unwrap();
        let p = d.path().join("cut.jsonl.zst");
        std::fs::write(&p, &z[..z.len() / 2]).unwrap();
        let err = DocFile::open(&p, Format::Jsonl, None).unwrap_err().to_string();
        assert!(err.contains("cut.jsonl.zst") && err.contains("truncated or corrupt"), "{err}");
    }

    #[test]
    fn json_text_takes_one_key() {
        assert_eq!(json_text(br#"{"id": [1, {"x": 2}], "text": "h\u00e9\n"}"#, "text").unwrap(), "hé\n");
        assert!(json_text(br#"{"id": 1}"#, "text").unwrap_err().contains("no key `text`"));
        assert!(json_text(br#"{"text": 5}"#, "text").unwrap_err().contains("not a string"));
        assert!(json_text(br#"{"text": "a""#, "text").is_err());
        assert!(json_text(b"{\"text\": \"\xff\"}", "text").is_err(), "invalid UTF-8");
        assert!(json_text(br#"{"text": "a"} x"#, "text").unwrap_err().contains("trailing"));
    }

    #[test]
    fn token_files_split_at_eos() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.bin");
        let toks: [u16; 7] = [5, 6, 0, 7, 0, 8, 9];
        std::fs::write(&p, toks.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let f = DocFile::open(&p, Format::Tokens(2), Some(0)).unwrap();
        let spans: Vec<(u64, u64)> = f.docs.iter().map(|e| (e.offset / 2, e.len / 2)).collect();
        assert_eq!(spans, vec![(0, 3), (3, 2), (5, 2)]);
        let one = DocFile::open(&p, Format::Tokens(2), None).unwrap();
        assert_eq!(one.docs.len(), 1);
        assert!(DocFile::open(&p, Format::Tokens(4), None).unwrap_err().to_string().contains("multiple of 4"));
    }

    #[test]
    fn tar_shards_index_txt_members_or_else_json_members() {
        use crate::source::tar::{append_member, finish};
        let d = tempfile::tempdir().unwrap();
        let mut txt = Vec::new();
        append_member(&mut txt, "a.txt", b"alpha");
        append_member(&mut txt, "a.json", br#"{"text": "not this"}"#);
        append_member(&mut txt, "b.txt", b"");
        append_member(&mut txt, "c.txt", b"gamma!");
        finish(&mut txt);
        let mut json = Vec::new();
        append_member(&mut json, "a.json", br#"{"text": "one"}"#);
        append_member(&mut json, "a.cls", b"3");
        append_member(&mut json, "b.json", br#"{"text": "two"}"#);
        finish(&mut json);
        let plain = d.path().join("t.tar");
        std::fs::write(&plain, &txt).unwrap();
        let gz = d.path().join("t.tar.gz");
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut e, &txt).unwrap();
        std::fs::write(&gz, e.finish().unwrap()).unwrap();
        let zst = d.path().join("j.tar.zst");
        std::fs::write(&zst, zstd::encode_all(&json[..], 3).unwrap()).unwrap();
        for (p, kind, want) in [
            (&plain, TarText::Txt, vec![&b"alpha"[..], b"gamma!"]),
            (&gz, TarText::Txt, vec![&b"alpha"[..], b"gamma!"]),
            (&zst, TarText::Json, vec![&br#"{"text": "one"}"#[..], br#"{"text": "two"}"#]),
        ] {
            let f = DocFile::open(p, Format::Tar, None).unwrap();
            assert_eq!(f.tar, Some(kind), "{p:?}");
            let mut c = StreamCursor::new(&f).unwrap();
            let got: Vec<Vec<u8>> = f
                .docs
                .iter()
                .map(|e| {
                    let mut buf = vec![];
                    c.read(&f, e, 100, &mut buf).unwrap();
                    buf
                })
                .collect();
            assert_eq!(got, want, "{p:?}");
        }
        let f = DocFile::open(&plain, Format::Tar, None).unwrap();
        assert_eq!(f.docs.iter().map(|e| e.line).collect::<Vec<_>>(), vec![1, 4], "member ordinals");
        assert_eq!(f.place(&f.docs[1]), "member 4");
        // A truncated shard names the file.
        let cut = d.path().join("cut.tar");
        std::fs::write(&cut, &txt[..1200]).unwrap();
        let err = DocFile::open(&cut, Format::Tar, None).unwrap_err().to_string();
        assert!(err.contains("cut.tar") && err.contains("truncated"), "{err}");
    }

    /// Writes a Megatron index as its `_IndexWriter` does.
    fn megatron_idx(dtype: u8, sizes: &[i32], pointers: &[i64], bounds: &[i64]) -> Vec<u8> {
        let mut b = MEGATRON_MAGIC.to_vec();
        b.extend(1u64.to_le_bytes());
        b.push(dtype);
        b.extend((sizes.len() as u64).to_le_bytes());
        b.extend((bounds.len() as u64).to_le_bytes());
        sizes.iter().for_each(|x| b.extend(x.to_le_bytes()));
        pointers.iter().for_each(|x| b.extend(x.to_le_bytes()));
        bounds.iter().for_each(|x| b.extend(x.to_le_bytes()));
        b
    }

    #[test]
    fn megatron_bin_and_idx_give_its_documents() {
        let d = tempfile::tempdir().unwrap();
        let bin = d.path().join("corpus_text_document.bin");
        let toks: [u16; 7] = [5, 6, 0, 7, 0, 8, 9];
        std::fs::write(&bin, toks.iter().flat_map(|t| t.to_le_bytes()).collect::<Vec<_>>()).unwrap();
        let idx = d.path().join("corpus_text_document.idx");
        // Three sequences; documents: [seq 0, seq 1] and [seq 2].
        std::fs::write(&idx, megatron_idx(8, &[3, 2, 2], &[0, 6, 10], &[0, 2, 3])).unwrap();
        let f = DocFile::open(&bin, Format::Tokens(4), None).unwrap();
        assert_eq!(f.width, 2, "the index's dtype wins");
        let spans: Vec<(u64, u64)> = f.docs.iter().map(|e| (e.offset / 2, e.len / 2)).collect();
        assert_eq!(spans, vec![(0, 5), (5, 2)]);
        // Hostile indexes: each a clear error naming the file, nothing allocated from their counts.
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (megatron_idx(8, &[3, 2, 2], &[0, 6, 10], &[0, 2, 3])[..40].to_vec(), "do not fit"),
            (megatron_idx(5, &[3], &[0], &[0, 1]), "dtype code 5"),
            (megatron_idx(8, &[3, 2, 9], &[0, 6, 10], &[0, 2, 3]), "up to byte 28"),
            (megatron_idx(8, &[3, 2, 2], &[0, 8, 10], &[0, 2, 3]), "contiguous"),
            (megatron_idx(8, &[3, 2, 2], &[0, 6, 10], &[0, 5]), "sequences 0..5 of 3"),
            (b"MMIDIDX\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x01\x00\x00\x00\x00\x00\x00\x00".to_vec(), "do not fit"),
            (b"PK\x03\x04 something else entirely, long enough...".to_vec(), "no MMIDIDX header"),
        ];
        for (raw, want) in cases {
            std::fs::write(&idx, &raw).unwrap();
            let err = DocFile::open(&bin, Format::Tokens(2), None).unwrap_err().to_string();
            assert!(err.contains("corpus_text_document.") && err.contains(want), "{want}: {err}");
        }
    }
}
