//! [`Column`]: an array's rows, in memory or in a `.npy` file, copied by index into a batch.
//!
//! This is the cure for `TensorDataset` + `DataLoader`: no per-item Python indexing, no
//! collation, no whole dataset copied into RAM (only the rows a batch needs are read from a
//! `.npy` file). Same sampler, resume state and sharding as the image loaders.
//!
//! `.npy` rows are read with positional reads (`pread`) straight into the batch buffer, one
//! read per run of consecutive rows, not through a memory mapping: a file that shrinks while it
//! is read (truncated by another process) is then a short read, which is that batch's
//! [`Error::Io`] naming the file, where a mapping would kill the process with `SIGBUS`. A read
//! costs a system call per row (about 1 µs, where a copy from a warm mapping costs a page
//! fault at most), so a file whose rows take at most [`READ_WHOLE_MAX`] bytes (labels, small
//! features) is read whole when it is opened and copied from memory.

use crate::error::{Error, Result};
use crate::source::npy::{npy_layout, NpyHeader, NpyLayout, NPY_HEADER_MAX};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A C-contiguous array viewed as rows of bytes: memory kept alive by its owner, or the rows
/// of a `.npy` file.
pub struct Column {
    rows: usize,
    row_bytes: usize,
    data: Data,
}

/// Where a column's rows are.
enum Data {
    /// In memory that `_owner` keeps alive and unchanged.
    Memory { ptr: *const u8, _owner: Arc<dyn Send + Sync> },
    /// In a file, from byte `offset` on, read with positional reads.
    File { file: std::fs::File, path: PathBuf, offset: u64 },
    /// In the columns of a mixture's sources, one after another (`starts`: each one's first row).
    Parts { parts: Vec<Column>, starts: Vec<usize> },
}

// SAFETY: a Column only reads its rows; the owner keeps the memory alive and unchanged for the
// Column's life (the caller of `from_raw` promises it); a file is only read with `pread`, which
// needs no exclusive access.
unsafe impl Send for Column {}
// SAFETY: see above; shared access is read-only.
unsafe impl Sync for Column {}

impl std::fmt::Debug for Column {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Column").field("rows", &self.rows).field("row_bytes", &self.row_bytes).finish()
    }
}

/// `.npy` files whose rows take at most this many bytes are read whole when opened (see the
/// module doc); larger ones row by row.
pub const READ_WHOLE_MAX: usize = 32 << 20;

impl Column {
    /// Opens a `.npy` file: its header is read and checked against the file's length now, its
    /// rows when a batch needs them (or all of them now, when they take at most
    /// [`READ_WHOLE_MAX`] bytes). Returns the column and its header.
    pub fn from_npy(path: &Path) -> Result<(Self, NpyHeader)> {
        Self::open_npy(path, READ_WHOLE_MAX)
    }

    /// [`Column::from_npy`], reading the rows whole when they take at most `whole_max` bytes.
    fn open_npy(path: &Path, whole_max: usize) -> Result<(Self, NpyHeader)> {
        let f = std::fs::File::open(path).map_err(|e| Error::io(path, &e))?;
        let meta = f.metadata().map_err(|e| Error::io(path, &e))?;
        if !meta.is_file() {
            return Err(Error::decode(path, "not a regular file"));
        }
        let len = usize::try_from(meta.len()).map_err(|_| Error::decode(path, "file too large"))?;
        let mut head = vec![0u8; len.min(NPY_HEADER_MAX)];
        f.read_exact_at(&mut head, 0).map_err(|e| Error::io(path, &e))?;
        let NpyLayout { header: h, rows, row_bytes } = npy_layout(&head, len, path)?;
        let bytes = rows * row_bytes; // within the file's length, checked by npy_layout
        let data = if bytes <= whole_max {
            let mut all = vec![0u8; bytes];
            f.read_exact_at(&mut all, h.data_offset as u64).map_err(|e| Error::io(path, &e))?;
            let all = Arc::new(all);
            Data::Memory { ptr: all.as_ptr(), _owner: all }
        } else {
            Data::File { file: f, path: path.to_path_buf(), offset: h.data_offset as u64 }
        };
        Ok((Column { rows, row_bytes, data }, h))
    }

    /// A column over memory owned by someone else.
    ///
    /// # Safety
    /// `ptr` must point to `rows * row_bytes` readable bytes that stay valid and unchanged while
    /// `owner` (or any clone of it) is alive.
    pub unsafe fn from_raw(ptr: *const u8, rows: usize, row_bytes: usize, owner: Arc<dyn Send + Sync>) -> Self {
        Column { rows, row_bytes, data: Data::Memory { ptr, _owner: owner } }
    }

    /// Column `k` of a mixture: the sources' columns `parts` one after another. An error when
    /// their rows differ in size (another element type or row shape), naming the source.
    pub fn concat(parts: Vec<Column>, k: usize) -> Result<Self> {
        let row_bytes = parts.first().map_or(0, |c| c.row_bytes);
        let mut starts = Vec::with_capacity(parts.len());
        let mut rows = 0usize;
        for (d, c) in parts.iter().enumerate() {
            if c.row_bytes != row_bytes {
                return Err(Error::config(
                    "mixture",
                    format!("source {d}: array {k} has rows of {} bytes, source 0's has {row_bytes}", c.row_bytes),
                ));
            }
            starts.push(rows);
            rows += c.rows;
        }
        if rows > u32::MAX as usize {
            return Err(Error::Dataset(format!("the mixture's sources hold over {} rows together", u32::MAX)));
        }
        Ok(Column { rows, row_bytes, data: Data::Parts { parts, starts } })
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Copies rows `idx` (each `< rows`) back to back into `dst` (`idx.len() * row_bytes`
    /// bytes). From a file, each run of consecutive rows is one positional read; a file that
    /// has become shorter than its header promised is an [`Error::Io`] naming it.
    pub fn copy_rows(&self, idx: &[u32], dst: &mut [u8]) -> Result<()> {
        let rb = self.row_bytes;
        assert_eq!(dst.len(), idx.len() * rb, "destination size");
        assert!(idx.iter().all(|&i| (i as usize) < self.rows), "row out of range");
        match &self.data {
            Data::Memory { ptr, .. } => {
                for (d, &i) in dst.chunks_exact_mut(rb).zip(idx) {
                    // SAFETY: i < rows (checked above) and the memory holds rows * row_bytes
                    // bytes that stay valid while the owner lives (`from_raw`'s contract).
                    let row = unsafe { std::slice::from_raw_parts(ptr.add(i as usize * rb), rb) };
                    d.copy_from_slice(row);
                }
                Ok(())
            }
            Data::File { file, path, offset } => {
                let mut k = 0;
                while k < idx.len() {
                    let mut end = k + 1;
                    while end < idx.len() && idx[end] == idx[end - 1].wrapping_add(1) {
                        end += 1;
                    }
                    // rows * row_bytes + offset fits the file's length, checked at open.
                    let at = offset + idx[k] as u64 * rb as u64;
                    file.read_exact_at(&mut dst[k * rb..end * rb], at).map_err(|e| {
                        let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                            let now = file.metadata().map(|m| format!("{} bytes now", m.len()));
                            format!(
                                "the file became shorter while it was read (truncated or rewritten?): rows {}..{} \
                                 (bytes {at}..{}) are past its end ({}); the header promised {} bytes",
                                idx[k],
                                idx[end - 1] as u64 + 1,
                                at + ((end - k) * rb) as u64,
                                now.unwrap_or_else(|e| e.to_string()),
                                offset + self.rows as u64 * rb as u64
                            )
                        } else {
                            format!("cannot read rows {}..{}: {e}", idx[k], idx[end - 1] as u64 + 1)
                        };
                        Error::Io { path: path.clone(), reason: why }
                    })?;
                    k = end;
                }
                Ok(())
            }
            Data::Parts { parts, starts } => {
                // Each run of rows from one source is copied by that source's column.
                let mut local = Vec::with_capacity(idx.len());
                let mut k = 0;
                while k < idx.len() {
                    let d = starts.partition_point(|&s| s <= idx[k] as usize) - 1;
                    let (lo, hi) = (starts[d], starts[d] + parts[d].rows);
                    let mut end = k;
                    local.clear();
                    while end < idx.len() && (lo..hi).contains(&(idx[end] as usize)) {
                        local.push((idx[end] as usize - lo) as u32);
                        end += 1;
                    }
                    parts[d].copy_rows(&local, &mut dst[k * rb..end * rb])?;
                    k = end;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::npy::parse_npy_header;

    #[test]
    fn npy_headers() {
        let h = b"\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }          \n";
        let p = parse_npy_header(h, Path::new("x.npy")).unwrap();
        assert_eq!((p.descr.as_str(), p.shape.clone()), ("<f4", vec![3, 4]));
        assert!(parse_npy_header(b"garbage", Path::new("x.npy")).is_err());
        let f = b"\x93NUMPY\x01\x00\x46\x00{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }           \n";
        assert!(parse_npy_header(f, Path::new("x.npy")).unwrap_err().to_string().contains("Fortran"));
    }

    /// A `.npy` file of `rows` x `width` little-endian u32 counting up from 0.
    fn npy_file(dir: &Path, rows: usize, width: usize) -> PathBuf {
        let mut b = crate::source::npy::npy_header("<u4", &[rows, width]);
        for v in 0..(rows * width) as u32 {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let path = dir.join("x.npy");
        std::fs::write(&path, b).unwrap();
        path
    }

    #[test]
    fn file_rows_are_read_in_runs_and_a_shrunk_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let path = npy_file(d.path(), 100, 3);
        // Small: read whole when opened, the same rows.
        let (small, _) = Column::from_npy(&path).unwrap();
        assert!(matches!(small.data, Data::Memory { .. }));
        let (col, h) = Column::open_npy(&path, 0).unwrap();
        assert!(matches!(col.data, Data::File { .. }));
        assert_eq!((col.rows(), col.row_bytes(), h.shape), (100, 12, vec![100, 3]));
        let idx = [5u32, 6, 7, 99, 0, 1, 42];
        let mut dst = vec![0u8; idx.len() * 12];
        col.copy_rows(&idx, &mut dst).unwrap();
        let got: Vec<u32> = dst.chunks(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
        let want: Vec<u32> = idx.iter().flat_map(|&i| (0..3).map(move |k| i * 3 + k)).collect();
        assert_eq!(got, want);
        let mut same = vec![0u8; dst.len()];
        small.copy_rows(&idx, &mut same).unwrap();
        assert_eq!(same, dst);
        // Another process truncates the file: the rows past its new end are an error naming it.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(h.data_offset as u64 + 50 * 12).unwrap();
        col.copy_rows(&[10, 11], &mut dst[..24]).unwrap();
        let err = col.copy_rows(&[49, 50, 51], &mut dst[..36]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()) && text.contains("rows 49..52"), "{text}");
        assert!(text.contains("became shorter"), "{text}");
    }
}
