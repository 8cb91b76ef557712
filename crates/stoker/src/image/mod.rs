//! Image work: what the loader does to one image, and the image loader that runs it.
//!
//! - [`decode`]: libjpeg-turbo (DCT-scaled, region decoding), PNG, EXIF orientation, limits
//!   checked before any pixel buffer is sized.
//! - [`ops`]: torchvision's transforms (RandomResizedCrop, Resize, CenterCrop, flip, normalise,
//!   dtype, layout), planned once and fused into one resample and one write per sample.
//! - [`gpu_job`]: which samples of a batch are left to GPU decode, and their record in the slot.
//! - [`cache`]: the decoded-pixel cache (groups per dataset, shared budget, checksums).
//! - [`pipeline`]: the image loader: configuration, the loader, the threads of a pass
//!   (dispatch, I/O, decode), the per-sample work, ordered delivery and the batch.
//!
//! Owns: pixels. May not touch: sources' formats (it reads bytes through
//! [`crate::source::Source`]), CUDA (the `stoker-cuda` crate), Python.

pub mod cache;
pub mod decode;
pub mod gpu_job;
pub mod ops;
pub mod pipeline;
