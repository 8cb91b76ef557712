//! The transfer stage: finished host batches (in pinned memory) are copied to the GPU on
//! stoker's own stream, and the consumer's stream waits on an event instead of the host.
//!
//! ```text
//! host iterator ──► transfer thread ──(cuMemcpyHtoDAsync on stoker's stream, event `ready`)──► consumer
//!                    │ waits for `ready`, then returns the host buffer to its pool
//!                    └ takes a device slot only after its release events have passed
//! consumer: stream.wait(ready) … uses the tensors … drops them → release event recorded on
//!           that stream → the slot goes back to the device pool
//! ```
//!
//! A device slot is written again only after the consumer released the batch *and* every
//! stream it was used on has passed the release point, so a batch still being read by queued
//! kernels is never overwritten (the race PyTorch's caching allocator leaves open for
//! side-stream copies). The host buffer returns to its pool as soon as its copy has completed.
//! No call on the consumer's thread waits for the GPU.
//!
//! The thread, the queue of copied slots, cancellation and shutdown are the engine's shared
//! ordered [`Run`] (the one under the image pipeline and `ArrayLoader`): the transfer thread is
//! started by [`Run::spawn`] (a panic becomes the consumer's error, never a wait), a consumer
//! holding every device slot gets an error instead of a hang, shutting a run down returns every
//! undelivered slot to the device pool, and a run replaced by a newer [`DeviceStage::run`] is
//! stale (its iterator says so).
//!
//! Regions named by [`DeviceStage::with_detached`] (an image loader's labels) are copied into
//! small buffers of their own instead of the slot, handed out as [`DeviceRegion`]s: a consumer
//! that keeps the labels of every batch (metrics, logging) does not keep the batch's images
//! buffer, so the slot goes back to the pool when the images are dropped. Those small buffers
//! follow the same release rule (written again only after their consumer streams passed the
//!
//! Files by job: `pool` (the device slots, their release points and the detached regions'
//! buffers), `batch` (what the consumer holds: [`DeviceBatch`], [`DeviceRegion`]), `stage` (a
//! loader's GPU side and how a run starts), `copy` (the transfer thread, GPU decode included),
//! `iter` (the consumer's in-order iterator).
//!
//! [`Run`]: stoker::shell::ordered::Run
//! [`Run::spawn`]: stoker::shell::ordered::Run::spawn

mod batch;
mod copy;
mod iter;
mod pool;
mod stage;

pub use batch::{DeviceBatch, DeviceRegion};
pub use copy::{GpuDecode, GpuDecodeStats};
pub use iter::DeviceIter;
pub use stage::DeviceStage;
