//! What the loader classes share for GPU batches: resolving `device=`, building the pinned
//! pool and the transfer stage, and exporting CUDA tensors through DLPack with the protocol's
//! stream semantics (the consumer's stream waits on the copy's event; no host sync).

use crate::dlpack::{self, View};
use crate::errors::IntoPy;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Arc;
use stoker::buffer::{HeapAllocator, HostAllocator};
use stoker::telemetry::DeviceReport;
use stoker_cuda::{DeviceBatch, DeviceStage, Gpu, PinnedAllocator, Placement};

/// `kDLCPU` and `kDLCUDA` (dlpack.h).
pub(crate) const DL_CPU: i32 = 1;
pub(crate) const DL_CUDA: i32 = 2;

/// A resolved `device=` argument: the host allocator for the batch pool and, for a GPU, the
/// device to build the transfer stage on.
pub(crate) struct Placed {
    pub gpu: Option<Arc<Gpu>>,
    pub alloc: Box<dyn HostAllocator>,
    pub report: DeviceReport,
}

pub(crate) fn place(device: &str, default_ordinal: u32) -> PyResult<Placed> {
    let (placement, report) = stoker_cuda::place(device, default_ordinal).py_err()?;
    Ok(match placement {
        Placement::Cpu => Placed { gpu: None, alloc: Box::new(HeapAllocator), report },
        Placement::Cuda(gpu) => Placed { alloc: Box::new(PinnedAllocator::new(gpu.clone())), gpu: Some(gpu), report },
    })
}

/// Builds the transfer stage: `slots` device slots with buffers of `capacities` bytes.
pub(crate) fn stage(
    gpu: Option<Arc<Gpu>>,
    capacities: Vec<usize>,
    slots: usize,
) -> stoker::Result<Option<DeviceStage>> {
    gpu.map(|g| DeviceStage::new(g, capacities, slots)).transpose()
}

/// A GPU batch as the tensor views see it.
pub(crate) trait StreamSync: Send + Sync {
    fn sync_stream(&self, stream: Option<usize>) -> stoker::Result<()>;
}

impl<M: Send + Sync + 'static> StreamSync for DeviceBatch<M> {
    fn sync_stream(&self, stream: Option<usize>) -> stoker::Result<()> {
        DeviceBatch::sync_stream(self, stream)
    }
}

/// Where a tensor view's memory is.
pub(crate) enum Location {
    Cpu,
    Cuda { batch: Arc<dyn StreamSync>, ordinal: u32 },
}

impl Location {
    pub(crate) fn dlpack_device(&self) -> (i32, i32) {
        match self {
            Location::Cpu => (DL_CPU, 0),
            Location::Cuda { ordinal, .. } => (DL_CUDA, *ordinal as i32),
        }
    }
}

/// `__dlpack__` for a view at `loc`: checks the protocol's arguments, makes a CUDA consumer's
/// stream wait for the copy, and exports zero-copy.
pub(crate) fn export<'py>(
    py: Python<'py>,
    loc: &Location,
    view: View,
    stream: Option<Bound<'py, PyAny>>,
    dl_device: Option<(i32, i32)>,
    copy: Option<bool>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let here = loc.dlpack_device();
    if let Some(d) = dl_device {
        if d != here {
            return Err(PyBufferError::new_err(format!("stoker batch is on device {here:?}, cannot export to {d:?}")));
        }
    }
    if copy == Some(true) {
        return Err(PyBufferError::new_err("stoker exports batches zero-copy only; copy the result instead"));
    }
    let stream = stream.filter(|s| !s.is_none());
    match loc {
        Location::Cpu => {
            if stream.is_some() {
                return Err(PyBufferError::new_err("stoker CPU batches take no stream (stream must be None)"));
            }
        }
        Location::Cuda { batch, .. } => {
            // The array API's rule for CUDA: None = the legacy default stream, -1 = no
            // synchronisation (the consumer takes care), 1 = legacy default, 2 = per-thread
            // default, any other positive integer = a cudaStream_t.
            let target = match stream {
                None => Some(stoker_cuda::STREAM_LEGACY),
                Some(s) => {
                    let v: i64 =
                        s.extract().map_err(|_| PyBufferError::new_err("stream must be an integer or None"))?;
                    match v {
                        -1 => None,
                        0 => Some(0),
                        v if v > 0 => Some(v as usize),
                        v => return Err(PyBufferError::new_err(format!("invalid CUDA stream {v}"))),
                    }
                }
            };
            batch.sync_stream(target).py_err()?;
        }
    }
    dlpack::export(py, view, here)
}
