//! GPU decode, the host's half: which samples of a batch are left to the GPU, and the record
//! a decode thread writes into such a sample's slot instead of its pixels.
//!
//! With `decode="gpu"` (a fixed share of each batch) or `decode="auto"` (a share the transfer
//! stage tunes, [`GpuShare`]), a decode thread that draws a sample for the GPU reads the file,
//! parses its header, draws its augmentations from the sample's own random stream (the same
//! crop and flip the CPU path would draw) and writes a [`GpuJob`] record followed by the JPEG's
//! bytes into the sample's slot. The slot is page-locked and crosses the bus with the batch;
//! the transfer stage (`stoker-cuda`) reads the records, decodes the JPEGs with nvJPEG and
//! resamples each crop into its place on the device, after the copy and before the batch's
//! `ready` event. Only images nvJPEG decodes like libjpeg-turbo are left to it: baseline
//! 8-bit JPEGs, grey or YCbCr, without an EXIF rotation, whose bytes fit in the slot; every
//! other sample is decoded on the CPU as before.
//!
//! Owns: the record's format (written here, read by `stoker-cuda`) and the share's rule.
//! May not touch: CUDA.

use crate::error::{Error, Result};
use crate::image::decode::{DecodeOptions, Decoder};
use crate::image::ops::{
    DType, Filter, Interpolation, Layout, OpSpec, Resampler, ResizeSize, TransformPlan, TransformSpec,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Images of more pixels than this are decoded on the CPU: the GPU's scratch memory for one
/// decoded image stays under 100 MiB (a small JPEG can still claim a huge image).
pub const GPU_MAX_PIXELS: u64 = 32 << 20;

/// Bytes of the record before the JPEG's bytes.
pub const HEADER_BYTES: usize = 128;
const MAGIC: u32 = u32::from_le_bytes(*b"STKJ");
const VERSION: u32 = 2;

/// The record's (and the GPU resampler's) code of a filter: `kernels/resize.cu`'s
/// `STOKER_BILINEAR`, `STOKER_BICUBIC`, `STOKER_NEAREST`.
pub fn filter_code(i: Interpolation) -> u32 {
    match i {
        Interpolation::Bilinear => 0,
        Interpolation::Bicubic => 1,
        Interpolation::Nearest => 2,
    }
}

/// The largest downscale per axis the GPU resampler takes with filter `i` (its taps end at 65
/// per axis, `2 * ceil(support * scale) + 1`); a larger one is resampled on the CPU.
pub fn gpu_max_downscale(i: Interpolation) -> f64 {
    match i {
        Interpolation::Bicubic => 16.0,
        Interpolation::Bilinear | Interpolation::Nearest => 32.0,
    }
}

/// Where samples are decoded.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase", tag = "on", content = "share")]
pub enum DecodeOn {
    /// Every sample on the CPU (libjpeg-turbo): the exact default.
    #[default]
    Cpu,
    /// This share of each batch (0 < share <= 1) on the GPU, the rest on the CPU.
    Gpu(f64),
    /// A share the transfer stage tunes for the consumer's batches per second: none while the
    /// CPU keeps up, more only while more shortens the consumer's interval.
    Auto,
}

impl DecodeOn {
    /// Whether some samples may be decoded on the GPU.
    pub fn uses_gpu(self) -> bool {
        !matches!(self, DecodeOn::Cpu)
    }

    /// The share to start with, in thousandths: the fixed share, or none for `auto` (which
    /// raises it only while that gives the consumer more batches per second).
    pub fn start_permille(self) -> u32 {
        match self {
            DecodeOn::Cpu => 0,
            DecodeOn::Gpu(s) => (s * 1000.0).round().clamp(1.0, 1000.0) as u32,
            DecodeOn::Auto => 0,
        }
    }
}

/// The share of each batch left to the GPU, in thousandths: read by the decode threads for
/// every sample, set by the transfer stage's tuner (`auto`).
#[derive(Debug, Clone, Default)]
pub struct GpuShare(Arc<AtomicU32>);

impl GpuShare {
    /// A share of `permille` thousandths.
    pub fn new(permille: u32) -> Self {
        GpuShare(Arc::new(AtomicU32::new(permille.min(1000))))
    }

    /// The share now, in thousandths.
    pub fn permille(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }

    /// Sets the share (clamped to 0..=1000).
    pub fn set(&self, permille: u32) {
        self.0.store(permille.min(1000), Ordering::Relaxed);
    }

    /// Whether position `pos` of a batch goes to the GPU: the positions are spread evenly, so
    /// the first `n` positions hold `floor(n * share)` of them.
    pub fn takes(&self, pos: usize) -> bool {
        let s = u64::from(self.permille());
        let (a, b) = (pos as u64 * s / 1000, (pos as u64 + 1) * s / 1000);
        b > a
    }
}

/// What the GPU needs to turn a deferred sample into its pixels: the decoded image's size,
/// the source box and its clip window (what the CPU resampler is given), the output rectangle
/// the box maps to, the output size, the flip and the layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuJob {
    /// Bytes of the JPEG after the record.
    pub jpeg_len: u32,
    /// The image's width and height (from its header).
    pub size: [u32; 2],
    /// Source box `(left, top, width, height)`, as the CPU resampler gets it.
    pub bbox: [f64; 4],
    /// The pixels the filter may read, `[x0, y0, x1, y1)`.
    pub clip: [u32; 4],
    /// The output rectangle the box maps to `(x, y, w, h)`; the rest is zero.
    pub dst: [u32; 4],
    /// Output `(width, height)`.
    pub out: [u32; 2],
    /// Mirror horizontally.
    pub flip: bool,
    /// Channels last (`NHWC`), else planes (`NCHW`).
    pub nhwc: bool,
    /// The resampling filter and pass order (the CPU path's for this sample).
    pub filter: Filter,
}

impl GpuJob {
    /// Writes the record and `jpeg` into `slot` (a sample's bytes); `false` when they do not
    /// fit (the sample is then decoded on the CPU).
    pub fn write(&self, jpeg: &[u8], slot: &mut [u8]) -> bool {
        if HEADER_BYTES + jpeg.len() > slot.len() || jpeg.len() > u32::MAX as usize {
            return false;
        }
        let mut h = [0u8; HEADER_BYTES];
        let mut at = 0;
        let mut put = |b: &[u8]| {
            h[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        };
        let words = [MAGIC, VERSION, jpeg.len() as u32, self.size[0], self.size[1]];
        words.iter().for_each(|w| put(&w.to_le_bytes()));
        self.bbox.iter().for_each(|v| put(&v.to_le_bytes()));
        self.clip.iter().chain(&self.dst).chain(&self.out).for_each(|w| put(&w.to_le_bytes()));
        put(&u32::from(self.flip).to_le_bytes());
        put(&u32::from(self.nhwc).to_le_bytes());
        put(&filter_code(self.filter.interpolation).to_le_bytes());
        put(&u32::from(self.filter.vertical_first).to_le_bytes());
        slot[..HEADER_BYTES].copy_from_slice(&h);
        slot[HEADER_BYTES..HEADER_BYTES + jpeg.len()].copy_from_slice(jpeg);
        true
    }

    /// Reads the record at the start of `slot` and returns it with the JPEG's bytes. Every
    /// field is checked against the slot (the bytes crossed threads and may not be trusted to
    /// be a record at all): a wrong magic or version, a length past the slot, an empty image,
    /// boxes outside the image or rectangles outside the output are errors.
    pub fn read(slot: &[u8]) -> Result<(GpuJob, &[u8])> {
        let bad = |why: &str| Error::Internal(format!("a GPU decode record is invalid: {why}"));
        if slot.len() < HEADER_BYTES {
            return Err(bad("shorter than its header"));
        }
        let u = |i: usize| u32::from_le_bytes(slot[i..i + 4].try_into().expect("4 bytes"));
        let f = |i: usize| f64::from_le_bytes(slot[i..i + 8].try_into().expect("8 bytes"));
        if u(0) != MAGIC || u(4) != VERSION {
            return Err(bad("wrong magic or version"));
        }
        let bbox = [f(20), f(28), f(36), f(44)];
        let w = |k: usize| u(52 + 4 * k);
        let interpolation = match w(12) {
            0 => Interpolation::Bilinear,
            1 => Interpolation::Bicubic,
            2 => Interpolation::Nearest,
            _ => return Err(bad("an unknown filter")),
        };
        let job = GpuJob {
            jpeg_len: u(8),
            size: [u(12), u(16)],
            bbox,
            clip: [w(0), w(1), w(2), w(3)],
            dst: [w(4), w(5), w(6), w(7)],
            out: [w(8), w(9)],
            flip: w(10) != 0,
            nhwc: w(11) != 0,
            filter: Filter { interpolation, vertical_first: w(13) != 0 },
        };
        let end = HEADER_BYTES + job.jpeg_len as usize;
        if end > slot.len() {
            return Err(bad("its JPEG runs past the slot"));
        }
        let [sw, sh] = job.size;
        let [x0, y0, x1, y1] = job.clip;
        let [dx, dy, dw, dh] = job.dst.map(u64::from);
        let [ow, oh] = job.out;
        if sw == 0 || sh == 0 || ow == 0 || oh == 0 {
            return Err(bad("an empty image or output"));
        }
        if !(x0 < x1 && x1 <= sw && y0 < y1 && y1 <= sh) {
            return Err(bad("a clip window outside the image"));
        }
        if dx + dw > u64::from(ow) || dy + dh > u64::from(oh) {
            return Err(bad("an output rectangle outside the output"));
        }
        if !bbox.iter().all(|v| v.is_finite()) || bbox[2] <= 0.0 || bbox[3] <= 0.0 {
            return Err(bad("a source box that is not a box"));
        }
        if (ow as usize) * (oh as usize) * 3 > slot.len() {
            return Err(bad("an output larger than the slot"));
        }
        Ok((job, &slot[HEADER_BYTES..end]))
    }
}

impl GpuJob {
    /// This sample's pixels made on the CPU (libjpeg-turbo at full resolution, the same
    /// resampling and write as the GPU's), into `out` (the sample's bytes): for a JPEG nvJPEG
    /// refused, so the sample is not lost.
    pub fn decode_here(&self, jpeg: &[u8], dec: &mut Decoder, rs: &mut Resampler, out: &mut [u8]) -> Result<()> {
        let path = std::path::Path::new("");
        let info = dec.info(jpeg, path)?;
        let (sw, sh) = (self.size[0] as usize, self.size[1] as usize);
        if (info.width, info.height) != (sw, sh) {
            return Err(Error::Internal("a GPU decode record does not match its JPEG".into()));
        }
        let whole = [0.0, 0.0, sw as f64, sh as f64];
        let region = dec.decode(jpeg, path, &info, whole, (sw, sh))?;
        if (region.width, region.height) != (sw, sh) {
            return Err(Error::Internal("a full decode returned a part of the image".into()));
        }
        let [ow, oh] = self.out.map(|v| v as usize);
        let hwc = rs.resample_clipped(
            self.filter,
            region.pixels,
            sw,
            sh,
            self.bbox,
            self.clip.map(|v| v as usize),
            self.dst.map(|v| v as usize),
            ow,
            oh,
        )?;
        let layout = if self.nhwc { Layout::NHWC } else { Layout::NCHW };
        let spec = TransformSpec {
            ops: vec![OpSpec::Resize { size: ResizeSize::Exact([oh, ow]), interpolation: Interpolation::Bilinear }],
            dtype: DType::Uint8,
            layout,
            apply_exif: false,
        };
        let plan = TransformPlan::compile(&spec)?;
        let bytes = plan.sample_bytes();
        let out = out.get_mut(..bytes).ok_or_else(|| Error::Internal("a sample larger than its slot".into()))?;
        plan.write(hwc, self.flip, out);
        Ok(())
    }
}

/// The decoder a GPU record's CPU fallback uses: full resolution, whole images, as nvJPEG.
pub fn fallback_decoder() -> Result<Decoder> {
    Decoder::new(DecodeOptions {
        apply_exif: false,
        dct_scaling: false,
        roi: false,
        restart: true,
        max_pixels: crate::image::decode::DEFAULT_MAX_PIXELS,
    })
}

/// Whether nvJPEG decodes this JPEG as libjpeg-turbo would, so it may be left to the GPU:
/// a baseline or extended sequential Huffman JPEG (`SOF0`/`SOF1`) of 8-bit grey or YCbCr
/// samples (1 or 3 components; no Adobe marker and no `R`,`G`,`B` component ids, which
/// libjpeg-turbo reads as RGB or CMYK), shown without an EXIF rotation.
pub fn gpu_decodable(data: &[u8], orientation: u8) -> bool {
    if orientation != 1 {
        return false;
    }
    let layout = crate::image::decode::markers::jpeg_layout(data);
    matches!(layout.frame, Some((0xC0 | 0xC1, 8, 1 | 3))) && !layout.adobe && !layout.rgb_ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> GpuJob {
        GpuJob {
            jpeg_len: 0,
            size: [500, 375],
            bbox: [10.5, 20.25, 300.0, 200.0],
            clip: [10, 20, 311, 221],
            dst: [0, 0, 224, 224],
            out: [224, 224],
            flip: true,
            nhwc: false,
            filter: Filter { interpolation: Interpolation::Bicubic, vertical_first: true },
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_bad_records_are_refused() {
        let mut slot = vec![0u8; 224 * 224 * 3];
        let jpeg = [0xFF, 0xD8, 1, 2, 3, 0xFF, 0xD9];
        assert!(job().write(&jpeg, &mut slot));
        let (back, bytes) = GpuJob::read(&slot).unwrap();
        assert_eq!(back, GpuJob { jpeg_len: 7, ..job() });
        assert_eq!(bytes, jpeg);
        // Too large for the slot: not written.
        assert!(!job().write(&vec![0; slot.len()], &mut slot));
        // Each field outside its bounds is refused, naming the reason.
        let cases: [(&str, GpuJob); 4] = [
            ("clip window", GpuJob { clip: [0, 0, 501, 10], ..job() }),
            ("output rectangle", GpuJob { dst: [1, 0, 224, 224], ..job() }),
            ("source box", GpuJob { bbox: [0.0, 0.0, f64::NAN, 1.0], ..job() }),
            ("empty", GpuJob { size: [0, 375], ..job() }),
        ];
        for (why, j) in cases {
            assert!(j.write(&jpeg, &mut slot));
            let e = GpuJob::read(&slot).unwrap_err().to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
        assert!(job().write(&jpeg, &mut slot));
        slot[100..104].copy_from_slice(&7u32.to_le_bytes());
        assert!(GpuJob::read(&slot).unwrap_err().to_string().contains("unknown filter"));
        slot[..4].copy_from_slice(b"XXXX");
        assert!(GpuJob::read(&slot).unwrap_err().to_string().contains("magic"));
        let mut long = vec![0u8; 300];
        assert!(job().write(&[0; 100], &mut long));
        long.truncate(200);
        assert!(GpuJob::read(&long).unwrap_err().to_string().contains("past the slot"));
    }

    #[test]
    fn only_jpegs_nvjpeg_decodes_like_libjpeg_turbo_are_left_to_it() {
        use turbojpeg::{Compressor, Image, PixelFormat, Subsamp, Transform};
        let (w, h) = (40, 24);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
        let jpeg = |format: PixelFormat, sub: Subsamp| {
            let mut c = Compressor::new().unwrap();
            c.set_subsamp(sub).unwrap();
            let px: Vec<u8> = match format {
                PixelFormat::GRAY => rgb.iter().step_by(3).copied().collect(),
                PixelFormat::CMYK => rgb.chunks(3).flat_map(|p| [p[0], p[1], p[2], 9]).collect(),
                _ => rgb.clone(),
            };
            let pitch = w * format.size();
            c.compress_to_vec(Image { pixels: &px[..], width: w, pitch, height: h, format }).unwrap()
        };
        let baseline = jpeg(PixelFormat::RGB, Subsamp::Sub2x2);
        assert!(gpu_decodable(&baseline, 1));
        assert!(gpu_decodable(&jpeg(PixelFormat::GRAY, Subsamp::Gray), 1));
        assert!(gpu_decodable(&jpeg(PixelFormat::RGB, Subsamp::None), 1));
        // An EXIF rotation is the CPU's to apply.
        assert!(!gpu_decodable(&baseline, 6));
        // CMYK (an Adobe marker, four components) and progressive files stay on the CPU.
        assert!(!gpu_decodable(&jpeg(PixelFormat::CMYK, Subsamp::None), 1));
        let mut t = Transform::default();
        t.progressive = true;
        let progressive = turbojpeg::transform(&t, &baseline).unwrap();
        assert!(!gpu_decodable(&progressive, 1));
        // Component ids R, G, B: an RGB JPEG, which libjpeg-turbo does not convert from YCbCr.
        let layout = crate::image::decode::markers::jpeg_layout(&baseline);
        assert_eq!(layout.frame, Some((0xC0, 8, 3)));
        let mut rgb_ids = baseline.to_vec();
        let sof = rgb_ids.windows(2).position(|m| m == [0xFF, 0xC0]).unwrap();
        for (k, id) in b"RGB".iter().enumerate() {
            rgb_ids[sof + 10 + 3 * k] = *id;
        }
        assert!(!gpu_decodable(&rgb_ids, 1));
        // Not a JPEG at all.
        assert!(!gpu_decodable(b"\x89PNG\r\n", 1));
    }

    #[test]
    fn a_share_takes_its_part_of_every_prefix() {
        for permille in [0, 1, 250, 333, 500, 999, 1000] {
            let s = GpuShare::new(permille);
            let mut taken = 0u64;
            for pos in 0..256usize {
                taken += u64::from(s.takes(pos));
                assert_eq!(taken, (pos as u64 + 1) * u64::from(permille) / 1000, "{permille} at {pos}");
            }
        }
    }
}
