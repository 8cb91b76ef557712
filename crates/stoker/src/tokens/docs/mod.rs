//! Documents on disk: JSON Lines (plain, `.gz`, `.zst`), plain text (a document per line or per
//! file), Parquet, WebDataset tar shards (`.txt` or `.json` members) and pre-tokenized token
//! files (a flat little-endian `uint16`/`uint32` array, nanoGPT's `.bin`, a 1-D `.npy`, or
//! Megatron's `.bin` + `.idx`). Only an index lives in memory: per document its byte offset, its
//! length and its line, 24 bytes (built by one pass over each file when the loader opens it).
//!
//! Plain files are read with positional reads (any order: a global permutation per epoch);
//! compressed ones are decompressed as a stream, in file order, so their order is "files
//! permuted, documents shuffled within windows" ([`super::corpus::DocSource::random_access`]).
//!
//! A file per format: `text` (JSON Lines, a document per line or per file), `tar` (WebDataset
//! text shards), `tokens` (flat token arrays, `.npy`, Megatron), `parquet`; `stream` reads a
//! compressed file in order. This file holds what they share: the types, the dispatch by
//! format and the positional read.

mod parquet;
mod stream;
mod tar;
mod text;
mod tokens;

pub use parquet::ParquetCursor;
pub use stream::{open_stream, StreamCursor};
pub use text::json_text;

use crate::error::{Error, Result};
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

/// Bytes of one read while an index is built.
const SCAN_CHUNK: usize = 4 << 20;

/// A failed read of `path` at a position: [`Error::Unavailable`] when its store does not
/// answer, else an [`Error::Io`] naming it.
fn read_error(path: &Path, e: &std::io::Error) -> Error {
    crate::source::unavailable(e).unwrap_or_else(|| Error::io(path, e))
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
            return Self::open_parquet(path, meta.len());
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

/// The error of a document longer than `max_document_bytes`.
pub fn too_long(f: &DocFile, d: &DocEntry, max: u64) -> Error {
    Error::decode(
        &f.path,
        format!("{}: a document of {} bytes, more than max_document_bytes ({max}): skipped", f.place(d), d.len),
    )
}

#[cfg(test)]
mod tests {
    use super::tokens::MEGATRON_MAGIC;
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
