//! Ops: the transforms between decoded pixels and a batch slot, described as plain data
//! ([`TransformSpec`], serde) and compiled into a [`TransformPlan`].
//!
//! Two-phase contract: the plan states the output shape and dtype first (so batch buffers are
//! sized once), then fills one sample's slot in place. The geometric ops are fused: whatever the
//! op list (`RandomResizedCrop`, or `Resize` + `CenterCrop`), they reduce to one source box that
//! is resampled once with the op's filter (antialiased bilinear or bicubic, or nearest: PIL's /
//! torchvision's `antialias=True` PIL path, [`Interpolation`]), and a final pass applies flip, normalisation, dtype and layout while writing
//! the slot.
//!
//! | file | role |
//! |---|---|
//! | `spec.rs` | the transform as plain data: ops, dtype, layout, `TransformSpec` |
//! | `geometry.rs` | torchvision's crop sampling, resize sizes, center-crop rounding |
//! | `resample.rs` | Pillow-compatible box resampling (bilinear, bicubic, nearest), SIMD, allocation-free |
//! | `write.rs` | vector kernels of the final write (flip, deinterleave, normalise, dtype) |
//! | `mix.rs` | batch mixing (MixUp, CutMix) and soft labels on a finished host batch |
//! | `color.rs` | photometric kernels on the uint8 crop, torchvision's tensor arithmetic |
//! | `affine.rs` | rotate / shear / translate with nearest sampling, torchvision's grid maths |
//! | `augment.rs` | ColorJitter, RandomGrayscale and the auto-augment policies, and their draws |
//! | `erase.rs` | RandomErasing on the finished sample in its slot |
//!
//! With augmentations (`ColorJitter`, `RandomGrayscale`, `TrivialAugmentWide`, `RandAugment`,
//! `AutoAugment`) the resampled crop is kept in the worker's uint8 scratch, flipped there when
//! the flip was drawn, augmented in place, then written; `RandomErasing` runs last, on the slot.
//! Without them nothing changes: one resample, one write.
//!
//! Owns: one decoded image to one sample in its slot (geometry, resampling, the fused write),
//! and the transform's description (`TransformSpec`, what the GPU side normalises). May not
//! touch: decoding, batches, threads, where the sample goes next.

pub mod affine;
pub mod augment;
pub mod color;
pub mod erase;
pub mod geometry;
pub mod mix;
pub mod resample;
mod spec;
mod write;

use crate::error::{Error, Result};
use crate::shell::rng::Rng;
use crate::values::augment as rules;
use augment::{AugmentPlan, Step};
use erase::{Erase, EraseValue};
use geometry::{center_crop_axis, resize_shorter, rrc_params};
use resample::BoxResampler;
pub use resample::{Filter, Interpolation};
use spec::op_name;
pub use spec::{DType, DeviceNormalize, Layout, OpSpec, ResizeSize, TransformSpec, IMAGENET_MEAN, IMAGENET_STD};

#[derive(Debug, Clone)]
enum Geo {
    Rrc { scale: [f64; 2], ratio: [f64; 2] },
    ResizeCrop { resize: Option<ResizeSize>, crop: Option<[usize; 2]> },
}

/// Where one sample's output comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    /// Source box `(left, top, width, height)` in image pixels.
    pub bbox: [f64; 4],
    /// Whether the box is a hard boundary (a crop *then* resize: the filter does not read
    /// outside it) or a window into a resize of the whole image.
    pub hard: bool,
    /// The rectangle of the output the box maps to `(x, y, w, h)`; the rest is zero padding.
    pub dst: [usize; 4],
    /// Mirror horizontally.
    pub flip: bool,
    /// The resampling filter and its pass order.
    pub filter: Filter,
}

/// The normalisation of every byte value, per channel: `(v / 255 - mean) / std` in float32
/// with true division. The one definition of stoker's normalisation: the CPU path writes
/// these values, and the GPU path (which receives uint8) looks bytes up in the same table, so
/// both give the same bits.
pub fn normalize_table(mean: [f32; 3], std: [f32; 3]) -> Box<[[f32; 256]; 3]> {
    let mut t = Box::new([[0f32; 256]; 3]);
    for c in 0..3 {
        for v in 0..256 {
            t[c][v] = (v as f32 / 255.0 - mean[c]) / std[c];
        }
    }
    t
}

/// A compiled, validated transform.
#[derive(Debug, Clone)]
pub struct TransformPlan {
    spec: TransformSpec,
    geo: Geo,
    out_h: usize,
    out_w: usize,
    flip_p: f64,
    filter: Interpolation,
    /// Per channel, value (0..=255) → output element bits (f32 or f16 bits in the low half).
    lut: Option<Box<[[f32; 256]; 3]>>,
    /// The normalisation `lut` tabulates, for the vector kernel.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    norm: write::Norm,
    /// The AVX2 kernel's arithmetic, when `write` uses it: the CPU has AVX2, F16C and FMA
    /// and that arithmetic was checked to give exactly `lut`'s values.
    simd: Option<write::Arith>,
    /// The augmentations of the uint8 crop (`None`: none, the crop goes straight to the write).
    augment: Option<AugmentPlan>,
    /// `RandomErasing`, on the written sample.
    erase: Option<Erase>,
}

thread_local! {
    /// A decode thread's scratch for the augmentations: a copy of the crop for the ops that read
    /// neighbours, and the sample's draws (no allocation per sample once warm).
    static AUG_SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<augment::Drawn>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl TransformPlan {
    /// Validates `spec` and prepares it.
    pub fn compile(spec: &TransformSpec) -> Result<Self> {
        let mut geo: Option<Geo> = None;
        let mut out: Option<[usize; 2]> = None;
        let mut flip_p = 0.0;
        let mut normalize = None;
        let mut stage = 0; // 0 geometry, 1 flip seen, 2 normalize seen
        let bad = |msg: String| Error::config("transforms", msg);
        let mut steps = vec![];
        let mut erase_at: Option<(usize, &OpSpec)> = None;
        for (k, op) in spec.ops.iter().enumerate() {
            if (op.is_augmentation() || matches!(op, OpSpec::RandomErasing { .. })) && geo.is_none() {
                return Err(bad(format!(
                    "{} runs on the crop: put it after RandomResizedCrop, Resize or CenterCrop",
                    op_name(op)
                )));
            }
            if op.is_augmentation() && stage > 1 {
                return Err(bad(format!("{} must precede Normalize (it works on uint8 pixels)", op_name(op))));
            }
            match op {
                OpSpec::ColorJitter { brightness, contrast, saturation, hue } => {
                    let ranges = [*brightness, *contrast, *saturation, *hue];
                    rules::jitter_ranges(ranges)?;
                    steps.push(Step::ColorJitter(ranges));
                    continue;
                }
                OpSpec::RandomGrayscale { p } => {
                    rules::probability("RandomGrayscale.p", *p)?;
                    steps.push(Step::Grayscale(*p));
                    continue;
                }
                OpSpec::TrivialAugmentWide { num_magnitude_bins, interpolation, fill } => {
                    let fill =
                        rules::policy("TrivialAugmentWide", Some(*num_magnitude_bins), interpolation, fill.as_deref())?;
                    steps.push(Step::TrivialAugmentWide { bins: *num_magnitude_bins, fill });
                    continue;
                }
                OpSpec::RandAugment { num_ops, magnitude, num_magnitude_bins, interpolation, fill } => {
                    let fill = rules::policy("RandAugment", Some(*num_magnitude_bins), interpolation, fill.as_deref())?;
                    rules::rand_augment(*num_ops, *magnitude, *num_magnitude_bins)?;
                    steps.push(Step::RandAugment {
                        num_ops: *num_ops,
                        magnitude: *magnitude,
                        bins: *num_magnitude_bins,
                        fill,
                    });
                    continue;
                }
                OpSpec::AutoAugment { policy, interpolation, fill } => {
                    rules::auto_augment_policy(policy)?;
                    let fill = rules::policy("AutoAugment", None, interpolation, fill.as_deref())?;
                    steps.push(Step::AutoAugment { fill });
                    continue;
                }
                OpSpec::TimmRandAugment { config, fill } => {
                    let c = rules::timm_rand_augment(config)?;
                    // timm's factory fills with the ImageNet mean in bytes.
                    let fill = match fill {
                        None => [124, 116, 104],
                        Some(f) => rules::fill_bytes("TimmRandAugment", Some(f))?,
                    };
                    steps.push(Step::TimmRandAugment(augment::TimmRandAugment::new(c, fill)));
                    continue;
                }
                OpSpec::RandomErasing { p, scale, ratio, value } => {
                    rules::erasing(*p, *scale, *ratio, value.as_deref())?;
                    if erase_at.is_some() {
                        return Err(bad("RandomErasing may appear once".into()));
                    }
                    erase_at = Some((k, op));
                    continue;
                }
                _ => {}
            }
            match op {
                OpSpec::RandomResizedCrop { size, scale, ratio, .. } => {
                    if geo.is_some() || stage > 0 {
                        return Err(bad("RandomResizedCrop must be the first and only geometric op".into()));
                    }
                    if size[0] == 0 || size[1] == 0 {
                        return Err(bad(format!("RandomResizedCrop size must be positive, got {size:?}")));
                    }
                    if !(scale[0] > 0.0 && scale[0] <= scale[1] && ratio[0] > 0.0 && ratio[0] <= ratio[1]) {
                        return Err(bad(format!(
                            "RandomResizedCrop needs 0 < scale[0] <= scale[1] and 0 < ratio[0] <= ratio[1], got scale={scale:?} ratio={ratio:?}"
                        )));
                    }
                    geo = Some(Geo::Rrc { scale: *scale, ratio: *ratio });
                    out = Some(*size);
                }
                OpSpec::Resize { size, .. } => {
                    if stage > 0
                        || matches!(
                            geo,
                            Some(Geo::Rrc { .. })
                                | Some(Geo::ResizeCrop { resize: Some(_), .. })
                                | Some(Geo::ResizeCrop { crop: Some(_), .. })
                        )
                    {
                        return Err(
                            bad("Resize must come first (before CenterCrop, flips and Normalize), once".into()),
                        );
                    }
                    match size {
                        ResizeSize::Shorter(0) => return Err(bad("Resize size must be positive".into())),
                        ResizeSize::Exact([h, w]) if *h == 0 || *w == 0 => {
                            return Err(bad("Resize size must be positive".into()))
                        }
                        ResizeSize::Exact(s) => out = Some(*s),
                        _ => {}
                    }
                    geo = Some(Geo::ResizeCrop { resize: Some(*size), crop: None });
                }
                OpSpec::CenterCrop { size } => {
                    if stage > 0 || matches!(geo, Some(Geo::Rrc { .. }) | Some(Geo::ResizeCrop { crop: Some(_), .. })) {
                        return Err(bad(
                            "CenterCrop must follow Resize (or stand alone) and precede flips/Normalize".into()
                        ));
                    }
                    if size[0] == 0 || size[1] == 0 {
                        return Err(bad("CenterCrop size must be positive".into()));
                    }
                    let resize = match geo {
                        Some(Geo::ResizeCrop { resize, .. }) => resize,
                        _ => None,
                    };
                    geo = Some(Geo::ResizeCrop { resize, crop: Some(*size) });
                    out = Some(*size);
                }
                OpSpec::RandomHorizontalFlip { p } => {
                    if !steps.is_empty() {
                        return Err(bad(
                            "RandomHorizontalFlip must precede the augmentations (as in torchvision's recipes)".into(),
                        ));
                    }
                    if stage > 1 {
                        return Err(bad("RandomHorizontalFlip must precede Normalize".into()));
                    }
                    if !(0.0..=1.0).contains(p) {
                        return Err(bad(format!("RandomHorizontalFlip p must be in [0, 1], got {p}")));
                    }
                    flip_p = *p;
                    stage = 1;
                }
                OpSpec::Normalize { mean, std } => {
                    if stage > 1 {
                        return Err(bad("Normalize may appear once, last".into()));
                    }
                    if std.iter().any(|s| *s == 0.0 || !s.is_finite()) {
                        return Err(bad(format!("Normalize std must be non-zero, got {std:?}")));
                    }
                    normalize = Some((*mean, *std));
                    stage = 2;
                }
                _ => unreachable!("augmentations are handled above"),
            }
        }
        let geo = geo.ok_or_else(|| {
            bad("no geometric op: add RandomResizedCrop, Resize((h, w)) or CenterCrop so every batch has one shape"
                .into())
        })?;
        let [out_h, out_w] = out.ok_or_else(|| {
            bad("Resize(int) alone gives a different size per image: add CenterCrop or use Resize((h, w))".into())
        })?;
        if normalize.is_some() && spec.dtype == DType::Uint8 {
            return Err(Error::config("dtype", "Normalize needs a float dtype (float16/float32), not uint8"));
        }
        let (mean, std) = normalize.unwrap_or(([0.0; 3], [1.0; 3]));
        let norm = write::Norm { mean, std };
        let table = normalize_table(mean, std);
        // The vector kernel is used only where it was checked to reproduce the table bit for bit
        // (for uint8 the check just says whether the CPU has the instructions).
        let simd = write::simd_arith(&table, &norm);
        let lut = if spec.dtype == DType::Uint8 { None } else { Some(table) };
        let erase = match erase_at {
            None => None,
            Some((k, OpSpec::RandomErasing { p, scale, ratio, value })) => {
                if spec.dtype == DType::Uint8 {
                    return Err(Error::config(
                        "dtype",
                        "RandomErasing erases the normalised float sample, as torchvision does: use a float dtype \
                         (float16/float32; on a GPU, batches normalised on the host)",
                    ));
                }
                // Before Normalize, the erase writes `[0, 1]` values that are then normalised.
                let normalize_after = spec.ops[k..].iter().find_map(|o| match o {
                    OpSpec::Normalize { mean, std } => Some((*mean, *std)),
                    _ => None,
                });
                let value = match value.as_deref() {
                    None => EraseValue::Random,
                    Some([v]) => EraseValue::Const([*v as f32; 3]),
                    Some([r, g, b]) => EraseValue::Const([*r as f32, *g as f32, *b as f32]),
                    Some(_) => unreachable!("checked by args"),
                };
                Some(Erase { p: *p, scale: *scale, ratio: *ratio, value, normalize: normalize_after })
            }
            Some(_) => unreachable!("only RandomErasing is kept"),
        };
        let augment = if steps.is_empty() { None } else { Some(AugmentPlan::new(steps)) };
        let filter = spec.interpolation();
        Ok(TransformPlan { spec: spec.clone(), geo, out_h, out_w, flip_p, filter, lut, norm, simd, augment, erase })
    }

    /// The spec this plan was compiled from.
    pub fn spec(&self) -> &TransformSpec {
        &self.spec
    }

    /// Whether the plan augments the crop or erases the sample (a sample then takes the
    /// augmentation path: scratch crop, ops, write, erase).
    pub fn augments(&self) -> bool {
        self.augment.is_some() || self.erase.is_some()
    }

    /// Runs the augmentations on `hwc` (the resampled crop, `out_h * out_w * 3` RGB8) in place,
    /// drawing from `rng`; the flip (drawn with the geometry) is applied to the crop first, as
    /// torchvision flips before it augments; `timed` hears each op's kind
    /// ([`augment::KINDS`]) and time. Returns the flip the write still has to apply.
    pub fn augment(
        &self,
        hwc: &mut [u8],
        flip: bool,
        rng: &mut Rng,
        timed: &mut dyn FnMut(usize, std::time::Duration),
    ) -> bool {
        let Some(a) = &self.augment else { return flip };
        let (h, w) = (self.out_h, self.out_w);
        if flip {
            for row in hwc.chunks_exact_mut(w * 3) {
                let (mut l, mut r) = (0, w - 1);
                while l < r {
                    for c in 0..3 {
                        row.swap(l * 3 + c, r * 3 + c);
                    }
                    l += 1;
                    r -= 1;
                }
            }
        }
        AUG_SCRATCH.with_borrow_mut(|(scratch, drawn)| {
            a.draw(w, h, rng, drawn);
            a.apply(drawn, hwc, w, h, scratch, timed);
        });
        false
    }

    /// `RandomErasing` on one written sample `out`, drawing from `rng` (after
    /// [`augment`](Self::augment)'s draws); `timed` hears its time when it erases.
    pub fn erase(&self, out: &mut [u8], rng: &mut Rng, timed: &mut dyn FnMut(usize, std::time::Duration)) {
        let Some(e) = &self.erase else { return };
        let (h, w) = (self.out_h, self.out_w);
        if let Some(bx) = e.draw(h, w, rng) {
            let t0 = std::time::Instant::now();
            e.apply(bx, out, h, w, self.spec.dtype, self.spec.layout, rng);
            timed(augment::KIND_ERASE, t0.elapsed());
        }
    }

    /// Output `(height, width)`.
    pub fn output_size(&self) -> (usize, usize) {
        (self.out_h, self.out_w)
    }

    /// One sample's shape: `[3, H, W]` (NCHW) or `[H, W, 3]` (NHWC).
    pub fn sample_shape(&self) -> [usize; 3] {
        match self.spec.layout {
            Layout::NCHW => [3, self.out_h, self.out_w],
            Layout::NHWC => [self.out_h, self.out_w, 3],
        }
    }

    /// Bytes of one sample in the batch buffer.
    pub fn sample_bytes(&self) -> usize {
        self.out_h * self.out_w * 3 * self.spec.dtype.size()
    }

    /// Decides where sample output comes from for an image of `width` x `height`, drawing
    /// random choices from `rng` (seeded by seed, epoch and sample index).
    pub fn geometry(&self, width: usize, height: usize, rng: &mut Rng) -> Geometry {
        let (ow, oh) = (self.out_w, self.out_h);
        let mut g = match &self.geo {
            Geo::Rrc { scale, ratio } => {
                let b = rrc_params(width, height, *scale, *ratio, rng);
                Geometry {
                    bbox: [b.j as f64, b.i as f64, b.w as f64, b.h as f64],
                    hard: true,
                    dst: [0, 0, ow, oh],
                    flip: false,
                    filter: Filter::pillow(self.filter, (b.w, b.h), (ow, oh)),
                }
            }
            Geo::ResizeCrop { resize, crop } => {
                let (rw, rh) = match resize {
                    None => (width, height),
                    Some(ResizeSize::Shorter(s)) => resize_shorter(width, height, *s),
                    Some(ResizeSize::Exact([h, w])) => (*w, *h),
                };
                let (sx, sy) = (width as f64 / rw as f64, height as f64 / rh as f64);
                let filter = match resize {
                    Some(_) => Filter::pillow(self.filter, (width, height), (rw, rh)),
                    None => Filter { interpolation: self.filter, vertical_first: false },
                };
                match crop {
                    None => Geometry {
                        bbox: [0.0, 0.0, width as f64, height as f64],
                        hard: false,
                        dst: [0, 0, ow, oh],
                        flip: false,
                        filter,
                    },
                    Some([ch, cw]) => {
                        let (left, dx, dw) = center_crop_axis(rw, *cw);
                        let (top, dy, dh) = center_crop_axis(rh, *ch);
                        Geometry {
                            bbox: [left as f64 * sx, top as f64 * sy, dw as f64 * sx, dh as f64 * sy],
                            hard: false,
                            dst: [dx, dy, dw, dh],
                            flip: false,
                            filter,
                        }
                    }
                }
            }
        };
        if self.flip_p > 0.0 {
            g.flip = rng.next_f64() < self.flip_p;
        }
        g
    }

    /// Writes `hwc` (`out_h * out_w * 3` RGB8) into one sample's slot `out` with flip,
    /// normalisation, dtype and layout applied.
    pub fn write(&self, hwc: &[u8], flip: bool, out: &mut [u8]) {
        self.write_with(hwc, flip, out, self.simd)
    }

    /// [`write`](Self::write) with the vector kernel and arithmetic `simd` (only honoured where
    /// the plan found the kernel usable; exact only where [`write::simd_exact`] holds for it) or,
    /// for `None`, the portable path.
    fn write_with(&self, hwc: &[u8], flip: bool, out: &mut [u8], simd: Option<write::Arith>) {
        let (h, w) = (self.out_h, self.out_w);
        debug_assert_eq!(hwc.len(), h * w * 3);
        debug_assert_eq!(out.len(), self.sample_bytes());
        // A plain copy (uint8, NHWC, no flip) needs no kernel.
        let copy = self.spec.dtype == DType::Uint8 && self.spec.layout == Layout::NHWC && !flip;
        #[cfg(target_arch = "x86_64")]
        if let (Some(arith), Some(_), false) = (simd, self.simd, copy) {
            let (lut, layout, norm) = (self.lut.as_deref(), self.spec.layout, &self.norm);
            // SAFETY: `self.simd` is set only when the CPU has AVX2, F16C and FMA (checked in
            // `compile`); exactness is the caller's (`write` passes the checked arithmetic).
            unsafe {
                match self.spec.dtype {
                    DType::Uint8 => {
                        write::write_avx2::<{ write::OUT_U8 }>(hwc, h, w, flip, layout, norm, arith, lut, out)
                    }
                    DType::Float16 => {
                        write::write_avx2::<{ write::OUT_F16 }>(hwc, h, w, flip, layout, norm, arith, lut, out)
                    }
                    DType::Float32 => {
                        write::write_avx2::<{ write::OUT_F32 }>(hwc, h, w, flip, layout, norm, arith, lut, out)
                    }
                }
            }
            return;
        }
        let _ = (simd, copy);
        let src_x = |x: usize| if flip { w - 1 - x } else { x };
        match (self.spec.dtype, self.spec.layout) {
            (DType::Uint8, Layout::NHWC) => {
                if !flip {
                    out.copy_from_slice(hwc);
                } else {
                    for y in 0..h {
                        let row = &hwc[y * w * 3..(y + 1) * w * 3];
                        let dst = &mut out[y * w * 3..(y + 1) * w * 3];
                        for (x, d) in dst.chunks_exact_mut(3).enumerate() {
                            let s = src_x(x) * 3;
                            d.copy_from_slice(&row[s..s + 3]);
                        }
                    }
                }
            }
            (DType::Uint8, Layout::NCHW) => {
                let plane = h * w;
                for y in 0..h {
                    let row = &hwc[y * w * 3..(y + 1) * w * 3];
                    for x in 0..w {
                        let s = src_x(x) * 3;
                        let d = y * w + x;
                        out[d] = row[s];
                        out[plane + d] = row[s + 1];
                        out[2 * plane + d] = row[s + 2];
                    }
                }
            }
            (DType::Float32, layout) => {
                let lut = self.lut.as_ref().expect("float plan has a LUT");
                let out = as_f32_mut(out);
                write_float(hwc, h, w, flip, layout, out, |c, v| lut[c][v as usize]);
            }
            (DType::Float16, layout) => {
                let lut = self.lut.as_ref().expect("float plan has a LUT");
                let out = as_u16_mut(out);
                write_float(hwc, h, w, flip, layout, out, |c, v| half::f16::from_f32(lut[c][v as usize]).to_bits());
            }
        }
    }
}

#[inline]
fn write_float<T: Copy>(
    hwc: &[u8],
    h: usize,
    w: usize,
    flip: bool,
    layout: Layout,
    out: &mut [T],
    f: impl Fn(usize, u8) -> T,
) {
    let plane = h * w;
    for y in 0..h {
        let row = &hwc[y * w * 3..(y + 1) * w * 3];
        for x in 0..w {
            let sx = if flip { w - 1 - x } else { x };
            let s = &row[sx * 3..sx * 3 + 3];
            match layout {
                Layout::NCHW => {
                    let d = y * w + x;
                    out[d] = f(0, s[0]);
                    out[plane + d] = f(1, s[1]);
                    out[2 * plane + d] = f(2, s[2]);
                }
                Layout::NHWC => {
                    let d = (y * w + x) * 3;
                    out[d] = f(0, s[0]);
                    out[d + 1] = f(1, s[1]);
                    out[d + 2] = f(2, s[2]);
                }
            }
        }
    }
}

fn as_f32_mut(b: &mut [u8]) -> &mut [f32] {
    assert!(
        b.len().is_multiple_of(4) && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()),
        "misaligned f32 slot"
    );
    // SAFETY: length and alignment were checked above; every bit pattern is a valid f32, and the
    // returned slice borrows `b` mutably for its whole life.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<f32>(), b.len() / 4) }
}

fn as_u16_mut(b: &mut [u8]) -> &mut [u16] {
    assert!(
        b.len().is_multiple_of(2) && (b.as_ptr() as usize).is_multiple_of(std::mem::align_of::<u16>()),
        "misaligned f16 slot"
    );
    // SAFETY: as in `as_f32_mut`, for u16.
    unsafe { std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u16>(), b.len() / 2) }
}

/// Per-worker resampler with a reusable output scratch (no allocation once warm).
#[derive(Debug, Default)]
pub struct Resampler {
    inner: BoxResampler,
    hwc: Vec<u8>,
}

impl Resampler {
    /// A new resampler (SIMD chosen at run time).
    pub fn new() -> Self {
        Resampler { inner: BoxResampler::new(), hwc: vec![] }
    }

    /// Resamples with `filter` `bbox` of `src` (`sw` x `sh` RGB8) into the `dst` rectangle of
    /// an `ow` x `oh` RGB8 image (zero outside it) and returns that image. `hard` keeps the
    /// filter inside the box (crop, then resize); otherwise it may read the whole image
    /// (resize, then crop).
    #[allow(clippy::too_many_arguments)]
    pub fn resample(
        &mut self,
        filter: Filter,
        src: &[u8],
        sw: usize,
        sh: usize,
        bbox: [f64; 4],
        hard: bool,
        dst: [usize; 4],
        ow: usize,
        oh: usize,
    ) -> Result<&[u8]> {
        self.resample_clipped(filter, src, sw, sh, bbox, clip_window(bbox, hard, sw, sh), dst, ow, oh)
    }

    /// [`Resampler::resample`] with the filter's window `clip` (`[x0, y0, x1, y1)`, what
    /// [`clip_window`] gives) instead of `hard`.
    #[allow(clippy::too_many_arguments)]
    pub fn resample_clipped(
        &mut self,
        filter: Filter,
        src: &[u8],
        sw: usize,
        sh: usize,
        bbox: [f64; 4],
        clip: [usize; 4],
        dst: [usize; 4],
        ow: usize,
        oh: usize,
    ) -> Result<&[u8]> {
        let n = ow * oh * 3;
        if src.len() < sw * sh * 3 {
            return Err(Error::Internal(format!("resample: {} bytes for a {sw}x{sh} image", src.len())));
        }
        if self.hwc.len() != n {
            resample::grow(&mut self.hwc, n, 0);
        }
        let [dx, dy, dw, dh] = dst;
        if dx + dw > ow || dy + dh > oh {
            return Err(Error::Internal(format!("resample: rectangle {dst:?} outside {ow}x{oh}")));
        }
        if !(dx == 0 && dy == 0 && dw == ow && dh == oh) {
            self.hwc.fill(0);
        }
        let [x0, y0, x1, y1] = clip;
        if !(x0 < x1 && x1 <= sw && y0 < y1 && y1 <= sh) {
            return Err(Error::Internal(format!("resample: window {clip:?} outside {sw}x{sh}")));
        }
        self.inner.resample_into(filter, src, sw, bbox, clip, dw, dh, &mut self.hwc, dx, dy, ow * 3);
        Ok(&self.hwc)
    }

    /// The image the last resample produced, to change in place (the augmentations).
    pub fn output_mut(&mut self) -> &mut [u8] {
        &mut self.hwc
    }
}

/// The pixels of a `sw` x `sh` image the filter may read for source box `bbox`, `[x0, y0, x1,
/// y1)`: a hard box's integer hull (crop first, so the filter cannot read outside it), else the
/// whole image. The GPU resampler is given the same window.
pub fn clip_window(bbox: [f64; 4], hard: bool, sw: usize, sh: usize) -> [usize; 4] {
    let [bx, by, bw, bh] = bbox;
    if hard {
        let l = ((bx + 1e-6).floor().max(0.0) as usize).min(sw - 1);
        let t = ((by + 1e-6).floor().max(0.0) as usize).min(sh - 1);
        let r = ((bx + bw - 1e-6).ceil() as usize).clamp(l + 1, sw);
        let b = ((by + bh - 1e-6).ceil() as usize).clamp(t + 1, sh);
        [l, t, r, b]
    } else {
        [0, 0, sw, sh]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_compile_with_expected_shapes() {
        for name in ["imagenet-train", "imagenet-val"] {
            let p = TransformPlan::compile(&TransformSpec::preset(name).unwrap()).unwrap();
            assert_eq!(p.sample_shape(), [3, 224, 224]);
            assert_eq!(p.sample_bytes(), 3 * 224 * 224 * 4);
        }
        let e = TransformSpec::preset("nope").unwrap_err();
        assert!(e.to_string().contains("imagenet-train, imagenet-val"), "{e}");
    }

    #[test]
    fn invalid_specs_say_why() {
        let mk = |ops: Vec<OpSpec>, dtype| TransformSpec { ops, dtype, layout: Layout::NCHW, apply_exif: true };
        let resize = OpSpec::Resize { size: ResizeSize::Shorter(256), interpolation: Interpolation::Bilinear };
        let e = TransformPlan::compile(&mk(vec![resize], DType::Uint8)).unwrap_err();
        assert!(e.to_string().contains("add CenterCrop"), "{e}");
        let e = TransformPlan::compile(&mk(
            vec![OpSpec::CenterCrop { size: [4, 4] }, OpSpec::Normalize { mean: [0.0; 3], std: [1.0; 3] }],
            DType::Uint8,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("float dtype"), "{e}");
        let e = TransformPlan::compile(&mk(vec![OpSpec::RandomHorizontalFlip { p: 2.0 }], DType::Uint8)).unwrap_err();
        assert!(e.to_string().contains("[0, 1]"), "{e}");
    }

    #[test]
    fn write_applies_flip_normalize_and_layout() {
        let spec = TransformSpec {
            ops: vec![
                OpSpec::CenterCrop { size: [1, 2] },
                OpSpec::Normalize { mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5] },
            ],
            dtype: DType::Float32,
            layout: Layout::NCHW,
            apply_exif: true,
        };
        let p = TransformPlan::compile(&spec).unwrap();
        let hwc = [0u8, 255, 0, 255, 0, 255];
        let mut out = vec![0f32; 6];
        // SAFETY: (test) viewing an f32 vector as bytes of the same length.
        let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), 24) };
        p.write(&hwc, true, bytes);
        // flipped: pixel 0 is (255, 0, 255), pixel 1 is (0, 255, 0); planes R, G, B.
        assert_eq!(out, vec![1.0, -1.0, -1.0, 1.0, 1.0, -1.0]);
    }

    /// Deterministic pseudo-random bytes.
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn simd_write_equals_the_portable_write() {
        let sizes = [(1, 1), (1, 7), (2, 8), (3, 9), (5, 16), (4, 17), (7, 31), (6, 33), (224, 224), (9, 250)];
        let norms = [None, Some((IMAGENET_MEAN, IMAGENET_STD)), Some(([0.5, 0.25, 0.0], [0.5, 0.3, 2.0]))];
        let mut checked = 0;
        for dtype in [DType::Uint8, DType::Float16, DType::Float32] {
            for layout in [Layout::NCHW, Layout::NHWC] {
                for norm in norms {
                    if dtype == DType::Uint8 && norm.is_some() {
                        continue;
                    }
                    for (i, &(h, w)) in sizes.iter().enumerate() {
                        let mut ops = vec![OpSpec::CenterCrop { size: [h, w] }];
                        if let Some((mean, std)) = norm {
                            ops.push(OpSpec::Normalize { mean, std });
                        }
                        let p =
                            TransformPlan::compile(&TransformSpec { ops, dtype, layout, apply_exif: true }).unwrap();
                        if p.simd.is_none() {
                            eprintln!("no AVX2/F16C/FMA (or the check failed): SIMD write not tested");
                            return;
                        }
                        // Both arithmetics where they are exact for this norm (the multiply-add
                        // one is for these three, so the plan picks it).
                        let lut = normalize_table(p.norm.mean, p.norm.std);
                        assert_eq!(p.simd, Some(write::Arith::MulAdd), "{norm:?}");
                        assert!(write::simd_exact(&lut, &p.norm, write::Arith::MulAdd));
                        assert!(write::simd_exact(&lut, &p.norm, write::Arith::Divide));
                        let hwc = noise(h * w * 3, i as u64);
                        let cases = [write::Arith::MulAdd, write::Arith::Divide]
                            .into_iter()
                            .flat_map(|arith| [false, true].map(|flip| (flip, arith)));
                        for (flip, arith) in cases {
                            // f32 storage for alignment, viewed from a 32-byte aligned start (the
                            // kernel's non-temporal stores) and 4 bytes after it; compared as bytes.
                            let n = p.sample_bytes();
                            let mut a = vec![0f32; n.div_ceil(4) + 9];
                            let mut b = vec![0f32; n.div_ceil(4)];
                            let aligned = (32 - a.as_ptr() as usize % 32) % 32 / 4;
                            // SAFETY: (test) viewing f32 vectors as their bytes.
                            let bb = unsafe {
                                &mut std::slice::from_raw_parts_mut(b.as_mut_ptr().cast::<u8>(), b.len() * 4)[..n]
                            };
                            p.write_with(&hwc, flip, bb, None);
                            for start in [aligned, aligned + 1] {
                                // SAFETY: (test) as above; start + n / 4 elements fit in `a`.
                                let ab = unsafe {
                                    std::slice::from_raw_parts_mut(a.as_mut_ptr().add(start).cast::<u8>(), n)
                                };
                                ab.fill(0);
                                p.write_with(&hwc, flip, ab, Some(arith));
                                assert!(
                                    ab == bb,
                                    "{dtype:?} {layout:?} {norm:?} {h}x{w} flip={flip} {arith:?} {start}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 8 * 2 * 10 * (1 + 3 + 3));
    }

    #[test]
    fn interpolation_is_optional_and_bilinear_serialises_as_before() {
        // Specs (and so fingerprints) written before the filter was a choice read as bilinear,
        // and a bilinear spec serialises exactly as they did.
        for old in [
            r#"{"op":"Resize","size":256}"#,
            r#"{"op":"RandomResizedCrop","size":[224,224],"scale":[0.08,1.0],"ratio":[0.75,1.3333333333333333]}"#,
        ] {
            let op: OpSpec = serde_json::from_str(old).unwrap();
            assert_eq!(
                TransformSpec { ops: vec![op.clone()], ..TransformSpec::preset("imagenet-val").unwrap() }
                    .interpolation(),
                Interpolation::Bilinear
            );
            assert_eq!(serde_json::to_string(&op).unwrap(), old);
        }
        for (name, want) in [
            ("bilinear", Interpolation::Bilinear),
            ("bicubic", Interpolation::Bicubic),
            ("nearest", Interpolation::Nearest),
            ("nearest-exact", Interpolation::Nearest),
        ] {
            let op: OpSpec =
                serde_json::from_str(&format!(r#"{{"op":"Resize","size":[8,8],"interpolation":"{name}"}}"#)).unwrap();
            assert_eq!(op, OpSpec::Resize { size: ResizeSize::Exact([8, 8]), interpolation: want });
            let json = serde_json::to_string(&op).unwrap();
            assert_eq!(json.contains("interpolation"), want != Interpolation::Bilinear, "{json}");
            let p = TransformPlan::compile(&TransformSpec {
                ops: vec![op],
                dtype: DType::Uint8,
                layout: Layout::NHWC,
                apply_exif: true,
            })
            .unwrap();
            assert_eq!(p.geometry(20, 10, &mut Rng::new(0, 0, 0)).filter.interpolation, want);
        }
        for bad in [r#""lanczos""#, "7", "null"] {
            let json = format!(r#"{{"op":"Resize","size":8,"interpolation":{bad}}}"#);
            let e = serde_json::from_str::<OpSpec>(&json).unwrap_err().to_string();
            assert!(e.contains("interpolation") && e.contains("bilinear, bicubic"), "{e}");
        }
    }

    #[test]
    fn center_crop_pads_small_images() {
        let spec = TransformSpec {
            ops: vec![OpSpec::CenterCrop { size: [4, 4] }],
            dtype: DType::Uint8,
            layout: Layout::NHWC,
            apply_exif: true,
        };
        let p = TransformPlan::compile(&spec).unwrap();
        let g = p.geometry(2, 2, &mut Rng::new(0, 0, 0));
        assert_eq!(g.dst, [1, 1, 2, 2]);
        let src = [10u8; 12];
        let mut r = Resampler::new();
        let out = r.resample(g.filter, &src, 2, 2, g.bbox, g.hard, g.dst, 4, 4).unwrap();
        assert_eq!(&out[..3], &[0, 0, 0]);
        assert_eq!(&out[(4 + 1) * 3..(4 + 1) * 3 + 3], &[10, 10, 10]);
    }
}
