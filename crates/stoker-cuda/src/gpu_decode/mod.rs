//! GPU decode, the device's half (`decode="gpu"` or `"auto"`): the samples a batch's decode
//! threads left to the GPU ([`stoker::image::gpu_job`]) crossed the bus as records holding
//! their JPEGs; after the batch's copy, on stoker's stream, nvJPEG decodes them into scratch
//! memory and stoker's resampler (`kernels/resize.cu`, the CPU path's arithmetic: bilinear,
//! bicubic or nearest, in the CPU's pass order) writes each crop into its place in the device
//! batch, before the batch's `ready` event.
//!
//! With `auto`, [`Split`] moves the share of each batch left to the GPU by what the consumer
//! gets: none while the CPU keeps up, more only while more gives it batches sooner.
//!
//! Pixels: nvJPEG's IDCT and upsampling round differently from libjpeg-turbo's, so GPU-decoded
//! samples differ from the CPU's by a few levels (`benches/gpu_decode_diff.py` measures it on
//! real photos); the resampling, crop, flip and layout are the CPU's exactly. The CPU path stays
//! the exact default.

mod nvjpeg;
mod split;

pub use nvjpeg::{add_candidates, describe};
pub use split::{Consumer, Split};

use crate::driver::{copy_to_device, DeviceMem, Gpu, Kernel, PinnedMem, Stream};
use std::ffi::CStr;
use std::ops::Range;
use std::sync::Arc;
use stoker::image::gpu_job::GpuJob;
use stoker::{Error, Result};

/// The resampler's PTX (made by `scripts/gen-ptx` from `kernels/resize.cu`).
const RESIZE_PTX: &str = concat!(include_str!("../../kernels/resize.ptx"), "\0");

/// `StokerResize` of `kernels/resize.cu`, field for field (doubles first: no padding).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ResizeParams {
    bbox: [f64; 4],
    src: u64,
    dst: u64,
    pitch: u32,
    clip: [u32; 4],
    rect: [u32; 4],
    out_w: u32,
    out_h: u32,
    flip: u32,
    nhwc: u32,
    filter: u32,
    vfirst: u32,
}

const BLOCK: [u32; 2] = [16, 16];
/// Alignment of each decoded image in the scratch memory.
const ALIGN: usize = 256;
/// The scratch memory for decoded images is at most this (or one image, when larger): a batch
/// whose images need more is decoded in parts.
const SCRATCH_BYTES: usize = 256 << 20;

/// Bytes of a record's decoded image (RGB8).
fn decoded_bytes(job: &GpuJob) -> usize {
    job.size[0] as usize * 3 * job.size[1] as usize
}

/// nvJPEG and the resampler on one GPU, with scratch memory for one batch's decoded images,
/// and the CPU fallback for JPEGs nvJPEG refuses.
pub struct GpuDecoder {
    gpu: Arc<Gpu>,
    nv: nvjpeg::NvJpeg,
    kernel: Kernel,
    scratch: Option<DeviceMem>,
    /// The fallback: a decoder, a resampler and page-locked staging for its samples.
    cpu: Option<(stoker::image::decode::Decoder, stoker::image::ops::Resampler)>,
    staging: Option<PinnedMem>,
}

impl std::fmt::Debug for GpuDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoder").field("backend", &self.nv.backend()).finish()
    }
}

/// One record of a batch: its bytes in the region, and what it says.
type Job<'a> = (Range<usize>, (GpuJob, &'a [u8]));

/// What a batch's GPU decode did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Decoded {
    /// Samples decoded by nvJPEG.
    pub gpu: usize,
    /// Samples nvJPEG refused, made on the CPU instead.
    pub fallback: usize,
}

impl GpuDecoder {
    /// Loads nvJPEG and the resampler on `gpu`; the error says why GPU decode is not possible
    /// here (no libnvjpeg, or a driver that cannot compile the kernel).
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        let _g = gpu.bind()?;
        let nv = nvjpeg::NvJpeg::new().map_err(|e| Error::Device(format!("GPU decode is not available: {e}")))?;
        let ptx = CStr::from_bytes_with_nul(RESIZE_PTX.as_bytes()).map_err(|e| Error::Internal(e.to_string()))?;
        let kernel = Kernel::load(gpu, ptx, c"stoker_resize")
            .map_err(|e| Error::Device(format!("GPU decode is not available: its resampler did not load: {e}")))?;
        Ok(GpuDecoder { gpu: gpu.clone(), nv, kernel, scratch: None, cpu: None, staging: None })
    }

    /// nvJPEG's backend for batches: `hardware` (JPEG engines) or `default`.
    pub fn backend(&self) -> &'static str {
        self.nv.backend()
    }

    /// Decodes the records in `ranges` of the images region `host` into the same ranges of
    /// the device region at `dst`, on `stream`, after the work already queued there (the
    /// region's copy). A JPEG nvJPEG refuses is decoded on the CPU here and copied into place,
    /// so no sample is lost; one the CPU cannot decode either is the batch's error.
    ///
    /// # Safety
    /// `host` must stay valid and unmodified until the stream has passed this work (the caller
    /// waits on an event recorded after it); `dst` must address at least `host.len()` bytes of
    /// device memory, valid as long; no earlier work on `stream` may still use the scratch or
    /// staging memory (the caller waited for the previous batch's event).
    pub(crate) unsafe fn run(
        &mut self,
        host: &[u8],
        ranges: &[Range<usize>],
        dst: u64,
        stream: &Stream,
    ) -> Result<Decoded> {
        let mut jobs = Vec::with_capacity(ranges.len());
        for r in ranges {
            let slot = host.get(r.clone()).ok_or_else(|| Error::Internal("a GPU record outside the batch".into()))?;
            jobs.push((r.clone(), GpuJob::read(slot)?));
        }
        // Chunks of images whose decoded pixels fit the scratch memory together (at most
        // SCRATCH_BYTES, or one image): the chunks run one after another on the stream, so a
        // chunk's decode writes the scratch only after the previous chunk's kernels read it.
        let mut done = Decoded::default();
        let mut first = 0;
        while first < jobs.len() {
            let mut end = first;
            let mut total = 0usize;
            while end < jobs.len() {
                let bytes = decoded_bytes(&jobs[end].1 .0).div_ceil(ALIGN) * ALIGN;
                if end > first && total + bytes > SCRATCH_BYTES {
                    break;
                }
                total += bytes;
                end += 1;
            }
            // SAFETY: as the caller's contract says, for a part of the batch's records.
            let d = unsafe { self.run_chunk(&jobs[first..end], total, dst, stream)? };
            done.gpu += d.gpu;
            done.fallback += d.fallback;
            first = end;
        }
        Ok(done)
    }

    /// [`GpuDecoder::run`] for `jobs` whose decoded images take `total` bytes of scratch.
    ///
    /// # Safety
    /// As [`GpuDecoder::run`].
    unsafe fn run_chunk(&mut self, jobs: &[Job<'_>], total: usize, dst: u64, stream: &Stream) -> Result<Decoded> {
        if total > self.scratch.as_ref().map_or(0, DeviceMem::len) {
            // Grown to the next power of two (within the cap): a few reallocations over a run,
            // never per batch. Work queued before may still read the old memory: wait for it.
            stream.synchronize()?;
            let len = total.next_power_of_two().min(SCRATCH_BYTES).max(total);
            self.scratch = None;
            self.scratch = Some(DeviceMem::new(&self.gpu, len)?);
        }
        let Some(scratch) = &self.scratch else { return Ok(Decoded::default()) };
        let base = scratch.ptr();
        let _g = self.gpu.bind()?;
        let mut offsets = Vec::with_capacity(jobs.len());
        let mut at = 0usize;
        for (_, (job, _)) in jobs {
            offsets.push(at);
            at += decoded_bytes(job).div_ceil(ALIGN) * ALIGN;
        }
        let jpegs: Vec<&[u8]> = jobs.iter().map(|(_, (_, j))| *j).collect();
        let mut images: Vec<nvjpeg::Image> = jobs
            .iter()
            .zip(&offsets)
            .map(|((_, (job, _)), &off)| nvjpeg::Image::rgbi(base + off as u64, job.size[0] as usize * 3))
            .collect();
        // SAFETY: each image addresses `3 * width * height` bytes of the scratch memory (the
        // offsets add up to at most its length), which no earlier work still uses: earlier
        // kernels on this stream run before this decode writes it, and a new allocation waited
        // for them; the stream is stoker's; the JPEGs live in `host` for the call.
        let refused = unsafe { self.nv.decode(&jpegs, &mut images, stream.raw().cast()) };
        let refused: Vec<usize> = refused.into_iter().map(|(i, _)| i).collect();
        if !refused.is_empty() {
            // SAFETY: `dst` as the caller's contract says; the staging memory is not in use.
            unsafe { self.fallback(jobs, &refused, dst, stream)? };
        }
        for (k, ((range, (job, _)), off)) in jobs.iter().zip(&offsets).enumerate() {
            if refused.contains(&k) {
                continue;
            }
            let p = ResizeParams {
                bbox: job.bbox,
                src: base + *off as u64,
                dst: dst + range.start as u64,
                pitch: job.size[0] * 3,
                clip: job.clip,
                rect: job.dst,
                out_w: job.out[0],
                out_h: job.out[1],
                flip: u32::from(job.flip),
                nhwc: u32::from(job.nhwc),
                filter: stoker::image::gpu_job::filter_code(job.filter.interpolation),
                vfirst: u32::from(job.filter.vertical_first),
            };
            let grid = [job.out[0].div_ceil(BLOCK[0]), job.out[1].div_ceil(BLOCK[1])];
            // SAFETY: `ResizeParams` mirrors `StokerResize`; `src` addresses the decoded image
            // (in the scratch memory, alive in `self`), `dst` the sample's bytes within the
            // region (the caller's contract; `GpuJob::read` checked that the output fits in
            // the sample's range).
            unsafe { self.kernel.launch(grid, BLOCK, &p, stream)? };
        }
        Ok(Decoded { gpu: jobs.len() - refused.len(), fallback: refused.len() })
    }

    /// Makes the samples `refused` of `jobs` on the CPU into page-locked staging memory and
    /// queues their copies into place.
    ///
    /// # Safety
    /// As [`GpuDecoder::run`].
    unsafe fn fallback(&mut self, jobs: &[Job<'_>], refused: &[usize], dst: u64, stream: &Stream) -> Result<()> {
        let need: usize = refused.iter().map(|&k| jobs[k].0.len()).sum();
        if need > self.staging.as_ref().map_or(0, stoker::buffer::HostMemory::len) {
            let len = need.next_power_of_two();
            self.staging = None;
            self.staging = Some(PinnedMem::new(&self.gpu, len)?);
        }
        let Some(staging) = &self.staging else { return Ok(()) };
        if self.cpu.is_none() {
            self.cpu = Some((stoker::image::gpu_job::fallback_decoder()?, stoker::image::ops::Resampler::new()));
        }
        let Some((dec, rs)) = &mut self.cpu else { return Ok(()) };
        let mut at = 0;
        for &k in refused {
            let (range, (job, jpeg)) = &jobs[k];
            // SAFETY: `at..at + range.len()` lies in the staging memory (sized above), which no
            // queued work uses (the caller's contract) and nothing else refers to.
            let out = unsafe { std::slice::from_raw_parts_mut(staging.as_ptr().add(at), range.len()) };
            job.decode_here(jpeg, dec, rs, out).map_err(|e| {
                Error::Device(format!(
                    "sample {} of the batch: nvJPEG refused its JPEG and the CPU could not decode it: {e}",
                    range.start / range.len()
                ))
            })?;
            // SAFETY: the staging bytes stay untouched until the stream has passed the copy
            // (the caller waits for the batch's event before the next batch); `dst + start`
            // addresses the sample's bytes in the device region (the caller's contract).
            unsafe { copy_to_device(dst + range.start as u64, out.as_ptr(), range.len(), stream)? };
            at += range.len();
        }
        Ok(())
    }
}
