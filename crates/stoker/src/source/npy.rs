//! The `.npy` format: the header (`descr`, `fortran_order`, `shape`), parsed from untrusted
//! bytes without panicking (fuzzed), and the layout of a file's rows, every size checked.

use crate::error::{Error, Result};
use std::path::Path;

/// The header of a `.npy` file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NpyHeader {
    /// NumPy type string, e.g. `<f4`.
    pub descr: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte offset of the data.
    pub data_offset: usize,
}

/// The start of a `.npy` file (version 1.0) of a C-order array of `descr` (`<u4`, `<f4`, ...)
/// and `shape`: the magic, the header's length and the header, padded with spaces so that the
/// data starts at a multiple of 64 bytes, as NumPy's `np.save` writes it.
pub fn npy_header(descr: &str, shape: &[usize]) -> Vec<u8> {
    let shape = match shape {
        [n] => format!("({n},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}").into_bytes();
    h.resize(h.len() + (64 - (10 + h.len() + 1) % 64) % 64, b' ');
    h.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(&h);
    out
}

/// Parses the header of a `.npy` file (versions 1-3, C order only).
pub fn parse_npy_header(b: &[u8], path: &Path) -> Result<NpyHeader> {
    let bad = |why: String| Error::decode(path, format!("invalid .npy file: {why}"));
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err(bad("missing the \\x93NUMPY magic".into()));
    }
    let (hlen, start) = match b[6] {
        1 => (u16::from_le_bytes([b[8], b[9]]) as usize, 10),
        2 | 3 if b.len() >= 12 => (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12),
        v => return Err(bad(format!("unsupported version {v}"))),
    };
    let text = b.get(start..start + hlen).ok_or_else(|| bad("truncated header".into()))?;
    let text = std::str::from_utf8(text).map_err(|_| bad("header is not text".into()))?;
    let field = |name: &str| -> Option<&str> {
        let i = text.find(&format!("'{name}'"))?;
        Some(text[i + name.len() + 2..].trim_start().trim_start_matches(':').trim_start())
    };
    let descr = field("descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr".into()))?
        .to_string();
    let fortran = field("fortran_order").ok_or_else(|| bad("no fortran_order".into()))?;
    if fortran.starts_with("True") {
        return Err(bad("Fortran-ordered arrays are not supported (save a C-contiguous array)".into()));
    }
    let shape_s = field("shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape".into()))?;
    let shape = shape_s
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad(format!("bad shape {shape_s:?}"))))
        .collect::<Result<Vec<_>>>()?;
    if shape.is_empty() {
        return Err(bad("a 0-d array has no rows".into()));
    }
    Ok(NpyHeader { descr, shape, data_offset: start + hlen })
}

/// The most header bytes read before parsing (version 2/3 headers may be longer than version
/// 1's 64 KiB; NumPy itself writes far less).
pub const NPY_HEADER_MAX: usize = 65536 + 12;

/// Where the rows of a `.npy` file lie, checked against the file's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyLayout {
    /// The parsed header.
    pub header: NpyHeader,
    /// Rows (the first dimension).
    pub rows: usize,
    /// Bytes per row.
    pub row_bytes: usize,
}

/// Bytes of one row of `row_shape` elements of `itemsize` bytes; `None` when that overflows.
pub fn row_bytes_of(itemsize: usize, row_shape: &[usize]) -> Option<usize> {
    row_shape.iter().try_fold(itemsize, |acc, &d| acc.checked_mul(d))
}

/// Parses the header at the start of a `.npy` file of `file_len` bytes (`head`: its first
/// bytes) and checks that every row the header promises lies inside the file. All arithmetic
/// on the header's numbers is checked: a shape whose size overflows is an error, never a
/// wrapped length.
pub fn npy_layout(head: &[u8], file_len: usize, path: &Path) -> Result<NpyLayout> {
    let header = parse_npy_header(head, path)?;
    let item = descr_itemsize(&header.descr).ok_or_else(|| {
        Error::decode(path, format!("unsupported dtype {:?} (little-endian bool/int/uint/float only)", header.descr))
    })?;
    let too_big = || Error::decode(path, format!("invalid .npy file: shape {:?} is too large", header.shape));
    let rows = header.shape[0];
    let row_bytes = row_bytes_of(item, &header.shape[1..]).ok_or_else(too_big)?;
    let need = rows.checked_mul(row_bytes).and_then(|d| d.checked_add(header.data_offset)).ok_or_else(too_big)?;
    if file_len < need {
        return Err(Error::decode(path, format!("truncated .npy: {file_len} bytes, the header promises {need}")));
    }
    Ok(NpyLayout { header, rows, row_bytes })
}

/// Bytes per element of a NumPy type string (`<f4` → 4), for the types stoker exports.
pub fn descr_itemsize(descr: &str) -> Option<usize> {
    let (order, kind) = (descr.chars().next()?, descr.get(1..)?);
    if order == '>' {
        return None; // big-endian data would need byte swaps
    }
    match kind {
        "f2" | "i2" | "u2" => Some(2),
        "f4" | "i4" | "u4" => Some(4),
        "f8" | "i8" | "u8" => Some(8),
        "i1" | "u1" | "b1" => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_header_reads_back_with_its_data_64_byte_aligned() {
        for shape in [vec![7], vec![3, 4], vec![2, 3, 224, 224]] {
            let h = npy_header("<f4", &shape);
            assert_eq!(h.len() % 64, 0, "{shape:?}");
            let p = parse_npy_header(&h, Path::new("x.npy")).unwrap();
            assert_eq!((p.descr.as_str(), p.shape, p.data_offset), ("<f4", shape, h.len()));
        }
        // NumPy's own bytes for np.save of np.zeros(7, '<f4'): "(7,)" for one dimension.
        let want = "{'descr': '<f4', 'fortran_order': False, 'shape': (7,), }";
        assert_eq!(&npy_header("<f4", &[7])[10..10 + want.len()], want.as_bytes());
    }
}
