//! What the loader classes share for GPU batches: host-or-device batches and iterations, and
//! exporting CUDA tensors through DLPack with the protocol's stream semantics (the consumer's
//! stream waits on the copy's event; no host sync).

use crate::errors::IntoPy;
use crate::shared::dlpack::{self, View};
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use std::sync::Arc;
use std::time::Duration;
use stoker::shell::kind::{self, HostBatch, Kind};
use stoker::Next;
use stoker_cuda::{DeviceBatch, DeviceIter, DeviceRegion, DeviceStage};

/// A host iteration the bindings poll: the engine's iteration of any kind (one impl below).
pub(crate) trait HostIter: Send + 'static {
    /// The batches it delivers.
    type Batch: HostBatch + Sync;
    /// The next batch, waiting at most `t`.
    fn poll(&mut self, t: Duration) -> Next<Self::Batch>;
    /// The iteration forwarded to the GPU by `stage` (which records the copies and the
    /// consumer's waits into the loader's report).
    fn to_device(self, stage: &DeviceStage) -> stoker::Result<DeviceIter<<Self::Batch as HostBatch>::Meta>>;
}

impl<K: Kind> HostIter for kind::Iter<K>
where
    K::Batch: Sync,
{
    type Batch = K::Batch;
    fn poll(&mut self, t: Duration) -> Next<K::Batch> {
        self.next_timeout(t)
    }
    fn to_device(self, stage: &DeviceStage) -> stoker::Result<DeviceIter<<K::Batch as HostBatch>::Meta>> {
        stage.forward(self)
    }
}

/// A batch in host or device memory.
pub(crate) enum Held<B: HostBatch> {
    Host(Arc<B>),
    Device(Arc<DeviceBatch<B::Meta>>),
}

impl<B: HostBatch> Clone for Held<B> {
    fn clone(&self) -> Self {
        match self {
            Held::Host(b) => Held::Host(b.clone()),
            Held::Device(b) => Held::Device(b.clone()),
        }
    }
}

/// A host iteration, or the transfer stage forwarding one to the GPU.
pub(crate) enum Iter<H: HostIter> {
    Host(H),
    /// Boxed: the pass it holds is a few hundred bytes, the host iteration's handle a few.
    Device(Box<DeviceIter<<H::Batch as HostBatch>::Meta>>),
}

impl<H: HostIter> Iter<H> {
    /// Iterates `host` directly, or through `stage` (which first stops its previous run, and
    /// with it the host iteration that run drove).
    pub(crate) fn start(host: H, stage: Option<&DeviceStage>) -> stoker::Result<Self> {
        match stage {
            None => Ok(Iter::Host(host)),
            Some(stage) => Ok(Iter::Device(Box::new(host.to_device(stage)?))),
        }
    }

    pub(crate) fn next_timeout(&mut self, t: Duration) -> Next<Held<H::Batch>> {
        match self {
            Iter::Host(it) => it.poll(t).map(|b| Held::Host(Arc::new(b))),
            Iter::Device(it) => it.next_timeout(t).map(|b| Held::Device(Arc::new(b))),
        }
    }
}

/// `kDLCPU` and `kDLCUDA` (dlpack.h).
pub(crate) const DL_CPU: i32 = 1;
pub(crate) const DL_CUDA: i32 = 2;

/// A GPU batch as the tensor views see it.
pub(crate) trait StreamSync: Send + Sync {
    fn sync_stream(&self, stream: Option<usize>) -> stoker::Result<()>;
}

impl<M: Send + Sync + 'static> StreamSync for DeviceBatch<M> {
    fn sync_stream(&self, stream: Option<usize>) -> stoker::Result<()> {
        DeviceBatch::sync_stream(self, stream)
    }
}

impl StreamSync for DeviceRegion {
    fn sync_stream(&self, stream: Option<usize>) -> stoker::Result<()> {
        DeviceRegion::sync_stream(self, stream)
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
