//! Text files: JSON Lines (a document per non-blank line, its text under a key), plain lines,
//! or a whole file one document.

use super::stream::{open_stream, read_some};
use super::{Compression, DocEntry, DocFile, Format, SCAN_CHUNK};
use crate::error::{Error, Result};
use std::path::Path;

impl DocFile {
    /// Indexes a text file (JSON Lines, lines, or a document per file) by reading it through.
    pub(super) fn scan(path: &Path, compression: Compression, format: Format) -> Result<Self> {
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
