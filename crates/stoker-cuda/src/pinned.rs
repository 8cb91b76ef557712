//! The pinned allocator: batch buffers in page-locked host memory, so the GPU's copy engine
//! reads them directly and `cuMemcpyHtoDAsync` is truly asynchronous. Allocated once when a
//! loader is made, freed when its pool is dropped; the pool's memory cap counts these bytes.

use crate::driver::{Gpu, PinnedMem};
use std::sync::Arc;
use stoker::buffer::{HostAllocator, HostMemory};

/// Page-locked host memory of one GPU's context (portable to every context of the process).
#[derive(Debug, Clone)]
pub struct PinnedAllocator {
    gpu: Arc<Gpu>,
}

impl PinnedAllocator {
    /// An allocator for buffers that will be copied to `gpu`.
    pub fn new(gpu: Arc<Gpu>) -> Self {
        PinnedAllocator { gpu }
    }
}

impl HostAllocator for PinnedAllocator {
    fn allocate(&self, len: usize) -> stoker::Result<Box<dyn HostMemory>> {
        Ok(Box::new(PinnedMem::new(&self.gpu, len)?))
    }

    fn kind(&self) -> &'static str {
        "pinned"
    }
}
