//! Pre-tokenized files: a flat little-endian array of token ids, a 1-D `.npy`, or Megatron's
//! `.bin` + `.idx`.

use super::{read_error, Compression, DocEntry, DocFile, Format, SCAN_CHUNK};
use crate::error::{Error, Result};
use std::path::Path;

/// The first 9 bytes of a Megatron `.idx` file.
pub(super) const MEGATRON_MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

impl DocFile {
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
    pub(super) fn open_tokens(path: &Path, format: Format, eos: Option<u32>) -> Result<Self> {
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
}
