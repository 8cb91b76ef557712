//! What the consumer holds: a batch in device memory and a detached region of one.

use super::pool::{DeviceSlot, SideBuf, SideList, Views};
use crate::driver::{DeviceMem, Gpu};
use std::sync::Arc;
use stoker::shell::grow::Lease;
use stoker::Result;

/// One region of a batch in a device buffer of its own (an image batch's labels): it keeps
/// only that small buffer alive, not the batch's slot. Same stream rules as [`DeviceBatch`].
pub struct DeviceRegion {
    pub(super) buf: Option<SideBuf>,
    pub(super) region: usize,
    pub(super) len: usize,
    pub(super) views: Views,
    pub(super) side: Arc<SideList>,
    pub(super) gpu: Arc<Gpu>,
}

impl std::fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRegion").field("region", &self.region).field("len", &self.len).finish()
    }
}

impl DeviceRegion {
    fn mem(&self) -> &DeviceMem {
        &self.buf.as_ref().expect("live region has a buffer").mem
    }

    /// Device address of the bytes.
    pub fn ptr(&self) -> u64 {
        self.mem().ptr()
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// CUDA ordinal of the device holding it.
    pub fn ordinal(&self) -> u32 {
        self.gpu.ordinal()
    }

    /// As [`DeviceBatch::sync_stream`].
    pub fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
        self.views.sync_stream(stream)
    }

    /// Blocks the calling thread until the copy has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.views.ready.synchronize()
    }

    /// Reads the bytes back (waits for the copy first): for checks, never on a training path.
    pub fn read(&self, out: &mut Vec<u8>) -> Result<()> {
        self.synchronize()?;
        out.resize(self.len, 0);
        self.mem().read_into(out)
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        let Some(mut buf) = self.buf.take() else { return };
        buf.release.record(self.views.take());
        self.side.put(self.region, buf);
    }
}

/// A batch in device memory. Its bytes are valid on a stream only after
/// [`DeviceBatch::sync_stream`] (or on the host after [`DeviceBatch::synchronize`]); dropping
/// it records release events on those streams and returns the memory to stoker's device pool.
pub struct DeviceBatch<M> {
    pub(super) slot: Lease<DeviceSlot>,
    pub(super) lens: Vec<usize>,
    pub(super) meta: M,
    /// Regions copied into buffers of their own, by region index.
    pub(super) detached: Vec<Option<Arc<DeviceRegion>>>,
    pub(super) views: Views,
    pub(super) gpu: Arc<Gpu>,
}

impl<M> std::fmt::Debug for DeviceBatch<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBatch").field("lens", &self.lens).finish()
    }
}

impl<M> DeviceBatch<M> {
    fn slot(&self) -> &DeviceSlot {
        &self.slot
    }

    /// The batch's description.
    pub fn meta(&self) -> &M {
        &self.meta
    }

    /// CUDA ordinal of the device holding the batch.
    pub fn ordinal(&self) -> u32 {
        self.gpu.ordinal()
    }

    /// Device address of region `i` (images = 0, labels = 1; or array columns in order).
    pub fn region_ptr(&self, i: usize) -> u64 {
        match self.detached.get(i) {
            Some(Some(r)) => r.ptr(),
            _ => self.slot().regions[i].ptr(),
        }
    }

    /// Region `i` when it lives in a buffer of its own ([`DeviceStage::with_detached`]): a view
    /// of it that keeps only that buffer alive, not this batch's slot.
    ///
    /// [`DeviceStage::with_detached`]: super::DeviceStage::with_detached
    pub fn detached(&self, i: usize) -> Option<&Arc<DeviceRegion>> {
        self.detached.get(i).and_then(|r| r.as_ref())
    }

    /// Bytes of region `i` in this batch.
    pub fn region_len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// Number of regions.
    pub fn regions(&self) -> usize {
        self.lens.len()
    }

    /// Makes `stream` (a raw `CUstream` handle; `0`/`1` the legacy default stream, `2` the
    /// per-thread one) wait on the GPU for the copy, and remembers it for the release. `None`:
    /// the caller synchronises by other means; the memory is then reused only after the whole
    /// device has gone idle past the release.
    pub fn sync_stream(&self, stream: Option<usize>) -> Result<()> {
        self.views.sync_stream(stream)
    }

    /// Blocks the calling thread until the copy has completed (for host-side readers).
    pub fn synchronize(&self) -> Result<()> {
        self.views.ready.synchronize()
    }

    /// Reads region `i` back from the GPU into `out` (waits for the copy first): for checks and
    /// digests, never on a training path.
    pub fn read_region(&self, i: usize, out: &mut Vec<u8>) -> Result<()> {
        if let Some(r) = self.detached(i) {
            return r.read(out);
        }
        self.synchronize()?;
        out.resize(self.lens[i], 0);
        self.slot().regions[i].read_into(out)
    }
}

impl<M> Drop for DeviceBatch<M> {
    fn drop(&mut self) {
        // The slot's lease then returns it to the pool (a grown slot is freed: its drop waits
        // for the consumer's queued work on it).
        self.slot.release.record(self.views.take());
    }
}
