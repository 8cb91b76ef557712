//! The `ArrayLoader` class: rows of NumPy arrays or memory-mapped `.npy` files, batched. Its
//! shared methods come from [`loader_class!`]; here is what only arrays have.

use super::batch::ColumnSpec;
use super::iter::PyArrayIter;
use crate::errors::{self, IntoPy};
use crate::shared::args::args_of;
use crate::shared::iter::Polled;
use crate::shared::loader::{loader_class, LoaderClass};
use pyo3::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;
use stoker::arrays::{ArrayIter, ArrayLoader, Column};
use stoker_cuda::{OnDevice, Target};

/// A loader over equally long arrays. Each column is a `.npy` path (memory-mapped) or an object
/// exporting a C-contiguous buffer (a NumPy array, `bytes`, `bytearray`, ...), read in place
/// through the buffer protocol while the loader holds the export.
#[pyclass(frozen, name = "ArrayLoader", module = "stoker._stoker")]
pub struct PyArrayLoader {
    /// The engine's loader, the transfer stage when batches go to a GPU, and the device used.
    on: OnDevice<ArrayLoader>,
    specs: Arc<Vec<ColumnSpec>>,
    sampler: stoker::SamplerSpec,
}

impl LoaderClass for PyArrayLoader {
    type Host = ArrayIter;
    type Iterator = PyArrayIter;
    fn sharding(&self) -> (usize, usize, usize) {
        (self.sampler.batch_size, self.sampler.rank, self.sampler.world_size)
    }
    fn iterator(&self, polled: Polled<ArrayIter>) -> PyArrayIter {
        PyArrayIter { polled, specs: self.specs.clone() }
    }
}

loader_class! { PyArrayLoader => PyArrayIter, shares [positioned device_report], {
    #[new]
    #[pyo3(signature = (columns, config_json, device="cpu", ordinal=0))]
    fn new(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        config_json: &str,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        errors::contain(|| {
            let config = stoker::args::array_config(args_of(config_json)?).py_err()?;
            let target = py.detach(|| Target::resolve(device, ordinal)).py_err()?;
            let mut cols = vec![];
            let mut specs = vec![];
            for (k, c) in columns.into_iter().enumerate() {
                if let Ok(path) = c.extract::<PathBuf>() {
                    let (col, h) = py.detach(|| Column::from_npy(&path)).py_err()?;
                    specs.push(ColumnSpec { descr: h.descr, row_shape: h.shape[1..].to_vec() });
                    cols.push(col);
                } else {
                    let (held, ptr, layout) = super::buffer::hold(&c, k)?;
                    let owner: Arc<dyn Send + Sync> = Arc::new(held);
                    // SAFETY: `ptr` is the first byte of a held C-contiguous export of
                    // `rows * row_bytes` bytes (checked by `hold`); `owner` holds the export, so
                    // the memory stays valid and in place while the column lives.
                    let col = unsafe { Column::from_raw(ptr, layout.rows, layout.row_bytes, owner) };
                    specs.push(ColumnSpec { descr: layout.descr, row_shape: layout.row_shape });
                    cols.push(col);
                }
            }
            let sampler = config.sampler.clone();
            let sources = sampler.mixture.as_ref().map_or(1, |m| m.parts.len());
            if cols.len() % sources != 0 {
                return Err(errors::config("mixture", "every source of the mixture needs the same number of arrays"));
            }
            // A mixture's sources come one after another, each with the same columns.
            let n = cols.len() / sources;
            for (k, s) in specs.iter().enumerate().skip(n) {
                let first = &specs[k % n];
                if (&s.descr, &s.row_shape) != (&first.descr, &first.row_shape) {
                    return Err(errors::config(
                        "mixture",
                        format!(
                            "source {}: array {} is {} {:?} per row, source 0's is {} {:?}",
                            k / n,
                            k % n,
                            s.descr,
                            s.row_shape,
                            first.descr,
                            first.row_shape
                        ),
                    ));
                }
            }
            specs.truncate(n);
            let on = py.detach(|| target.array_loader(cols, n, config)).py_err()?;
            Ok(PyArrayLoader { on, specs: Arc::new(specs), sampler })
        })
    }

    /// `(descr, row_shape)` per column.
    fn columns(&self) -> Vec<(String, Vec<usize>)> {
        self.specs.iter().map(|s| (s.descr.clone(), s.row_shape.clone())).collect()
    }
} }
