//! Parquet files: the text in a string column, read a row group at a time.

use super::{Compression, DocEntry, DocFile};
use crate::error::{Error, Result};
use std::path::Path;

impl DocFile {
    /// Indexes a Parquet file of `bytes` bytes: a document per row, by row group.
    pub(super) fn open_parquet(path: &Path, bytes: u64) -> Result<Self> {
        let (rows, _) = parquet_rows(path)?;
        let mut docs = Vec::new();
        let mut line = 1u64;
        for (g, n) in rows.iter().enumerate() {
            for r in 0..*n {
                docs.push(DocEntry { offset: g as u64, len: r, line });
                line += 1;
            }
        }
        Ok(DocFile { path: path.to_path_buf(), compression: Compression::Parquet, docs, bytes, width: 0, tar: None })
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
