//! The `ArrayLoader` classes: rows of NumPy arrays or memory-mapped `.npy` files, batched.

use crate::device::{self, Location};
use crate::dlpack::{DLDataType, View};
use crate::errors::{self, IntoPy};
use crate::loader::next_polling;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoker::arrays::{descr_itemsize, ArrayBatch, ArrayIter, ArrayLoader, Column};
use stoker::SamplerState;
use stoker_cuda::DeviceStage;

/// dtype string and the shape of one row, per column.
#[derive(Clone)]
struct ColumnSpec {
    descr: String,
    row_shape: Vec<usize>,
}

fn dl_type(descr: &str) -> Option<DLDataType> {
    let bits = (descr_itemsize(descr)? * 8) as u8;
    let code = match descr.as_bytes().get(1)? {
        b'f' => 2,
        b'i' => 0,
        b'u' => 1,
        b'b' => 6,
        _ => return None,
    };
    Some(DLDataType::new(code, bits))
}

/// A loader over equally long arrays. Each column is a `.npy` path (memory-mapped) or an object
/// exporting a C-contiguous buffer (a NumPy array, `bytes`, `bytearray`, ...), read in place
/// through the buffer protocol while the loader holds the export.
#[pyclass(frozen, name = "ArrayLoader", module = "stoker._stoker")]
pub struct PyArrayLoader {
    loader: ArrayLoader,
    specs: Arc<Vec<ColumnSpec>>,
    stage: Option<DeviceStage>,
    device: String,
    device_report: stoker::telemetry::DeviceReport,
    sampler: stoker::SamplerSpec,
}

impl PyArrayLoader {
    fn open(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        config_json: &str,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        let config = stoker::args::array_config(crate::loader::args_of(config_json)?).py_err()?;
        let (placement, report) = py.detach(|| stoker_cuda::place(device, ordinal)).py_err()?;
        let mut cols = vec![];
        let mut specs = vec![];
        for (k, c) in columns.into_iter().enumerate() {
            if let Ok(path) = c.extract::<PathBuf>() {
                let (col, h) = py.detach(|| Column::from_npy(&path)).py_err()?;
                specs.push(ColumnSpec { descr: h.descr, row_shape: h.shape[1..].to_vec() });
                cols.push(col);
            } else {
                let (held, ptr, layout) = crate::buffer::hold(&c, k)?;
                let owner: Arc<dyn Send + Sync> = Arc::new(held);
                // SAFETY: `ptr` is the first byte of a held C-contiguous export of
                // `rows * row_bytes` bytes (checked by `hold`); `owner` holds the export, so
                // the memory stays valid and in place while the column lives.
                let col = unsafe { Column::from_raw(ptr, layout.rows, layout.row_bytes, owner) };
                specs.push(ColumnSpec { descr: layout.descr, row_shape: layout.row_shape });
                cols.push(col);
            }
        }
        let bs = config.sampler.batch_size;
        let sampler = config.sampler.clone();
        let (prefetch, limit) = (config.prefetch, config.memory_limit);
        let capacities: Vec<usize> = cols.iter().map(|c| c.row_bytes() * bs).collect();
        let (loader, stage) = py
            .detach(|| -> stoker::Result<_> {
                let loader = ArrayLoader::new_in(cols, config, placement.allocator().as_ref())?;
                Ok((loader, placement.stage(capacities, prefetch, limit)?))
            })
            .py_err()?;
        Ok(PyArrayLoader {
            loader,
            specs: Arc::new(specs),
            stage,
            device: report.used.clone(),
            device_report: report,
            sampler,
        })
    }
}

#[pymethods]
impl PyArrayLoader {
    #[new]
    #[pyo3(signature = (columns, config_json, device="cpu", ordinal=0))]
    fn new(
        py: Python<'_>,
        columns: Vec<Bound<'_, PyAny>>,
        config_json: &str,
        device: &str,
        ordinal: u32,
    ) -> PyResult<Self> {
        errors::contain(|| Self::open(py, columns, config_json, device, ordinal))
    }

    /// Where batches are delivered: `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    /// Rows per batch.
    #[getter]
    fn batch_size(&self) -> usize {
        self.sampler.batch_size
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.sampler.rank
    }

    /// Ranks sharing the rows.
    #[getter]
    fn world_size(&self) -> usize {
        self.sampler.world_size
    }

    /// `{requested, used, note}` of the `device=` argument, as JSON.
    fn device_report_json(&self) -> String {
        serde_json::to_string(&self.device_report).unwrap_or_default()
    }

    fn __len__(&self) -> usize {
        self.loader.len()
    }

    /// Copy threads.
    #[getter]
    fn threads(&self) -> usize {
        self.loader.threads()
    }

    /// Batches currently held by Python.
    #[getter]
    fn held(&self) -> usize {
        self.loader.held()
    }

    /// `(descr, row_shape)` per column.
    fn columns(&self) -> Vec<(String, Vec<usize>)> {
        self.specs.iter().map(|s| (s.descr.clone(), s.row_shape.clone())).collect()
    }

    /// Selects the epoch; the engine checks the value (a non-negative integer).
    fn set_epoch(&self, epoch: &Bound<'_, PyAny>) -> PyResult<()> {
        self.loader.set_epoch(crate::loader::epoch_of(epoch)?);
        Ok(())
    }

    fn state(&self) -> (u64, u64, usize) {
        let s = self.loader.state();
        (s.seed, s.epoch, s.next_batch)
    }

    /// Restores a position; `resume=False` keeps it only as the position (a fork child
    /// continuing its parent's loader), not as a point the next iteration resumes from.
    #[pyo3(signature = (seed, epoch, next_batch, resume=true))]
    fn load_state(&self, seed: u64, epoch: u64, next_batch: usize, resume: bool) -> PyResult<()> {
        errors::contain(|| self.loader.adopt_state(SamplerState { seed, epoch, next_batch }, resume).py_err())
    }

    /// Whether a loaded state waits for the next iteration.
    #[getter]
    fn resume_pending(&self) -> bool {
        self.loader.resume_pending()
    }

    /// What a saved state is valid for, as JSON.
    fn fingerprint_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.loader.fingerprint())
            .map_err(|e| errors::to_py(stoker::Error::Internal(e.to_string())))
    }

    /// Restores a state dict given as JSON (`load_state_dict`): checked field by field and
    /// against this loader's fingerprint, each error naming the field.
    fn load_state_json(&self, state_json: &str) -> PyResult<()> {
        errors::contain(|| {
            crate::loader::load_state_json(state_json, &self.loader.fingerprint(), |st| self.loader.load_state(st))
        })
    }

    fn iter(&self, py: Python<'_>) -> PyResult<PyArrayIter> {
        errors::contain(|| {
            let it = py.detach(|| ArrIter::start(self.loader.iter()?, self.stage.as_ref(), None)).py_err()?;
            let it = crate::loader::raise_pending_signal(py, it)?;
            Ok(PyArrayIter { inner: Mutex::new(Some(it)), specs: self.specs.clone(), pid: std::process::id() })
        })
    }
}

type ArrIter = device::Iter<ArrayIter>;
type ArrHeld = device::Held<ArrayBatch>;

/// An iteration over array batches (GIL released while waiting; Ctrl-C honoured).
#[pyclass(frozen, name = "ArrayIterator", module = "stoker._stoker")]
pub struct PyArrayIter {
    inner: Mutex<Option<ArrIter>>,
    specs: Arc<Vec<ColumnSpec>>,
    pid: u32,
}

#[pymethods]
impl PyArrayIter {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyArrayBatch>> {
        errors::contain(|| {
            Ok(next_polling(py, &self.inner, self.pid, |it| it.next_timeout(Duration::from_millis(50)))?
                .map(|inner| PyArrayBatch { inner, specs: self.specs.clone() }))
        })
    }

    /// Stops the iteration now (joins every thread, GIL released); in a fork child the
    /// inherited iteration is let go untouched.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        crate::loader::release(py, &self.inner, self.pid);
        py.check_signals()
    }
}

impl Drop for PyArrayIter {
    fn drop(&mut self) {
        crate::loader::forget_if_inherited(&mut self.inner, self.pid);
    }
}

/// One batch of rows: one DLPack tensor per column.
#[pyclass(frozen, name = "ArrayBatch", module = "stoker._stoker")]
pub struct PyArrayBatch {
    inner: ArrHeld,
    specs: Arc<Vec<ColumnSpec>>,
}

#[pymethods]
impl PyArrayBatch {
    fn __len__(&self) -> usize {
        match &self.inner {
            ArrHeld::Host(b) => b.len(),
            ArrHeld::Device(b) => b.meta().len,
        }
    }

    /// Batch number within the epoch.
    #[getter]
    fn index(&self) -> usize {
        match &self.inner {
            ArrHeld::Host(b) => b.index(),
            ArrHeld::Device(b) => b.meta().index,
        }
    }

    /// Dataset indices of the rows.
    #[getter]
    fn indices(&self) -> Vec<u32> {
        match &self.inner {
            ArrHeld::Host(b) => b.indices(),
            ArrHeld::Device(b) => b.meta().indices.clone(),
        }
    }

    /// Column `c` as a DLPack-exporting tensor view.
    fn column(&self, c: usize) -> PyResult<PyArrayTensor> {
        if c >= self.specs.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("column {c} of {}", self.specs.len())));
        }
        Ok(PyArrayTensor { batch: self.inner.clone(), column: c, spec: self.specs[c].clone() })
    }
}

/// A column of an array batch (host or device memory), exported with `__dlpack__`.
#[pyclass(frozen, name = "ArrayTensor", module = "stoker._stoker")]
pub struct PyArrayTensor {
    batch: ArrHeld,
    column: usize,
    spec: ColumnSpec,
}

impl PyArrayTensor {
    fn ptr_loc(&self) -> (*const u8, usize, Location, Arc<dyn Send + Sync>) {
        match &self.batch {
            ArrHeld::Host(b) => (b.column_ptr(self.column), b.len(), Location::Cpu, b.clone()),
            ArrHeld::Device(b) => (
                b.region_ptr(self.column) as *const u8,
                b.meta().len,
                Location::Cuda { batch: b.clone(), ordinal: b.ordinal() },
                b.clone(),
            ),
        }
    }
}

#[pymethods]
impl PyArrayTensor {
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = max_version;
        let dtype = dl_type(&self.spec.descr).ok_or_else(|| errors::config("arrays", "unsupported dtype"))?;
        let (data, rows, loc, owner) = self.ptr_loc();
        let mut shape = vec![rows as i64];
        shape.extend(self.spec.row_shape.iter().map(|&d| d as i64));
        device::export(py, &loc, View { data, shape, dtype, owner }, stream, dl_device, copy)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.ptr_loc().2.dlpack_device()
    }

    /// Address of the first element (host or device).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.ptr_loc().0 as usize
    }
}
