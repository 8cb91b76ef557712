//! Photometric kernels on an RGB8 (HWC) crop, in place, with torchvision's tensor arithmetic
//! (`transforms.v2.functional`, uint8 images) reproduced operation by operation.
//!
//! torchvision computes in float32 with PyTorch's vectorised CPU kernels, whose
//! `add(x, y, alpha)` is a fused multiply-add (`fmadd(y, alpha, x)`). Every float32 step here is
//! reproduced with the same single rounding: the products and sums involved fit exactly in a
//! float64 (8-bit pixel values times 24-bit float32 factors), so computing in float64 and
//! rounding once to float32 gives the fused result. What each kernel guarantees against
//! torchvision 0.29 on uint8 images:
//!
//! | kernel | torchvision | agreement |
//! |---|---|---|
//! | [`brightness`], [`contrast`], [`saturation`], [`grayscale`] | `adjust_*`, `rgb_to_grayscale` | bit-exact (contrast: images up to 65,793 pixels, where torch's float32 mean is exact; beyond, within 1 level) |
//! | [`posterize`], [`solarize`], [`invert`], [`autocontrast`], [`equalize`] | same names | bit-exact (integer, or a per-value table of the float arithmetic) |
//! | [`sharpness`] | `adjust_sharpness` | within 1 level (the 3x3 convolution's summation order is oneDNN's) |
//! | [`hue`] | `adjust_hue` | within 1 level (float32 RGB→HSV→RGB) |
//!
//! The bounds are checked against torchvision on real photos by
//! `python/tests/test_augment.py`.
//!
//! Speed (issue 50): the kernels are vectorised without changing a byte. The float64 steps run
//! as the same IEEE operations on vector lanes (the `multiversion!` kernels, compiled for SSE2
//! and AVX2), or are replaced where a proof, checked exhaustively by the tests, shows the same
//! values: native float32 products for the exact ones (brightness), fused multiply-adds for the
//! luma (AVX2 + FMA), an integer division for sharpness' smoothing, a threshold for solarize.
//! The scalar kernels they replaced are kept in the tests (`reference`) and compared byte for
//! byte on random images and factors, on both the vector and the portable paths;
//! `examples/aug_ops.rs` times each op and prints a digest of their outputs.
//! Owns: per-pixel colour arithmetic. May not touch: randomness, geometry, the batch slot.

/// `f32` of a value computed exactly in `f64` (one rounding, as a fused multiply-add).
#[inline(always)]
fn r32(x: f64) -> f32 {
    x as f32
}

/// Round half to even of `|x| < 2^22` without a libm call (the x86-64 baseline has no
/// `roundss`): adding and subtracting `1.5 * 2^23` rounds in the default rounding mode.
#[inline(always)]
pub fn round_even(x: f32) -> f32 {
    const M: f32 = 12_582_912.0;
    (x + M) - M
}

/// `floor(x)` for `0 <= x < 2^31` (truncation), without a libm call.
#[inline(always)]
fn floor_pos(x: f32) -> f32 {
    x as i32 as f32
}

/// `floor(x)` for `|x| < 2^31`, without a libm call.
#[inline(always)]
fn floor_any(x: f32) -> f32 {
    let t = x as i32 as f32;
    if t > x {
        t - 1.0
    } else {
        t
    }
}

/// torchvision's grayscale weights as float32 (`0.2989 r + 0.587 g + 0.114 b`).
const WR: f32 = 0.2989;
const WG: f32 = 0.587;
const WB: f32 = 0.114;

/// The float32 luma of torchvision's `rgb_to_grayscale` before it is cast:
/// `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)` with fused adds.
#[inline(always)]
pub fn luma(r: u8, g: u8, b: u8) -> f32 {
    let t = r32(r as f64 * WR as f64);
    let t = r32(g as f64 * WG as f64 + t as f64);
    r32(b as f64 * WB as f64 + t as f64)
}

/// Defines `fn $name(args) body` twice: for the x86-64 baseline (SSE2) and compiled with AVX2,
/// picked at run time. The kernels are plain Rust that the compiler vectorises, four lanes wide
/// or eight; both versions compile the same IEEE operations in the same order, so the bytes are
/// the same either way.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                /// `body` compiled with AVX2.
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::image::ops::color::simd_allowed() && std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2 (detected just above), `avx2`'s only requirement.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
thread_local! {
    /// Tests set this to run the portable kernels on a CPU that has the vector ones.
    pub(crate) static PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the vector kernels may run (always, outside tests).
#[inline(always)]
pub(crate) fn simd_allowed() -> bool {
    #[cfg(test)]
    if PORTABLE.get() {
        return false;
    }
    true
}

/// Applies `lut` to every byte of `img` (all channels alike), eight bytes per step (one load
/// and one store of a word instead of eight of each).
#[inline]
pub fn apply_lut(img: &mut [u8], lut: &[u8; 256]) {
    let (words, rest) = img.as_chunks_mut::<8>();
    for w in words {
        *w = w.map(|v| lut[v as usize]);
    }
    for v in rest {
        *v = lut[*v as usize];
    }
}

/// Applies one table per channel to an RGB8 image, eight pixels per step.
#[inline]
fn apply_luts(img: &mut [u8], luts: &[[u8; 256]; 3]) {
    let (blocks, rest) = img.as_chunks_mut::<24>();
    for b in blocks {
        for (k, v) in b.iter_mut().enumerate() {
            *v = luts[k % 3][*v as usize];
        }
    }
    for (k, v) in rest.iter_mut().enumerate() {
        *v = luts[k % 3][*v as usize];
    }
}

/// float32 → uint8 as torch's `.clamp_(0, 255).to(torch.uint8)` (clamp, truncate; NaN: 0, as
/// `NaN as u8`). Written so that it vectorises: the two comparisons are `maxps` / `minps`, and
/// the conversion of a value known to be in range is `cvttps2dq` without saturation fix-ups.
#[inline(always)]
pub(crate) fn to_u8(x: f32) -> u8 {
    let x = if x > 0.0 { x } else { 0.0 };
    let x = if x < 255.0 { x } else { 255.0 };
    // SAFETY: `x` is in [0, 255] (NaN failed the first comparison and became 0), which `i32`
    // represents after truncation.
    unsafe { x.to_int_unchecked::<i32>() as u8 }
}

/// The binary exponent of a normal float32 (`None`: zero, subnormal, infinite or NaN).
#[inline]
fn exponent(x: f32) -> Option<i32> {
    let e = ((x.to_bits() >> 23) & 0xff) as i32;
    (1..255).contains(&e).then_some(e - 127)
}

/// Whether `f32(x * alpha + y)` computed in float64 (the product and the sum each rounded to
/// float64, then to float32) is the float32 fused multiply-add `fma(x, alpha, y)` for every
/// integer `x` in `[-255, 255]` and `y` in `[0, 255]`: when the sum is exact in float64. Its
/// magnitude is below `2^(e + 10)` (or `2^9` for `e < -1`) and its lowest bit at least
/// `2^(e - 23)`, `e` the exponent of `alpha`: at most 53 bits for `e >= -21` (`-20` here).
fn blend_is_fused(alpha: f32) -> bool {
    alpha == 0.0 || exponent(alpha).is_some_and(|e| e >= -20)
}

/// Whether `f32(g * alpha + f32(v * ratio))` computed in float64 is the float32
/// `fma(g, alpha, v * ratio)` (the product `v * ratio` native: exact in float64, rounded once)
/// for all bytes `g` and `v`: when the float64 sum is exact. With `ea`, `er` the exponents, its
/// magnitude is below `2^(max(ea, er) + 10)` and its lowest bit at least
/// `2^(min(ea, er) - 23)` (`|v * ratio| >= |ratio|` when not 0): at most 53 bits when the two
/// exponents are within 20 of each other. With `alpha` or `ratio` zero, one term is left.
fn saturation_is_fused(ratio: f32, alpha: f32) -> bool {
    if ratio == 0.0 || alpha == 0.0 {
        return ratio.is_finite() && alpha.is_finite();
    }
    matches!((exponent(ratio), exponent(alpha)), (Some(a), Some(b)) if (a - b).abs() <= 20)
}

/// `_blend(image, other, ratio)` for one value: `image * ratio + other * (1 - ratio)` as torch
/// computes it (`image.mul(ratio).add_(other, alpha=1 - ratio)`, the add fused), clamped and
/// truncated. `ratio` and `alpha` are the float32 scalars (`alpha` = `f32(1.0 - ratio)` with
/// the subtraction in double, as Python does it).
#[inline(always)]
fn blend1(v: u8, other: f32, ratio: f32, alpha: f32) -> u8 {
    let a = r32(v as f64 * ratio as f64);
    to_u8(r32(other as f64 * alpha as f64 + a as f64))
}

/// The float32 scalars of a blend factor given as a double (what Python hands torch).
#[inline]
fn ratio_alpha(factor: f64) -> (f32, f32) {
    (factor as f32, (1.0 - factor) as f32)
}

/// `adjust_brightness(img, factor)`: `clamp(v * factor)`. The float32 product of a byte and a
/// float32 is exact in float64, so its one rounding is the native float32 product: computed
/// directly, vectorised (`brightness_is_its_table` checks it against the fused form).
pub fn brightness(img: &mut [u8], factor: f64) {
    brightness_by(img, factor as f32)
}

multiversion! {
    /// [`brightness`] by the float32 factor `f`.
    fn brightness_by(img: &mut [u8], f: f32) {
        let px = |v: u8| to_u8(v as f32 * f);
        let (blocks, rest) = img.as_chunks_mut::<32>();
        for b in blocks {
            *b = b.map(px);
        }
        for v in rest {
            *v = px(*v);
        }
    }
}

/// The floored luma of a pixel (`rgb_to_grayscale(...).floor_()`: the luma is non-negative, so
/// truncation floors).
#[inline(always)]
fn floor_luma(p: &[u8; 3]) -> u32 {
    // SAFETY: the luma is finite and in [0, 255] (non-negative weights summing to less than 1),
    // which `i32` represents after truncation (checked conversions do not vectorise).
    unsafe { luma(p[0], p[1], p[2]).to_int_unchecked::<i32>() as u32 }
}

/// The floored float32 luma of every pixel's grayscale (`rgb_to_grayscale(...,
/// preserve_dtype=False).floor_()`), summed: torchvision's contrast mean is `sum / n`.
fn luma_sum(img: &[u8]) -> u64 {
    let (px, _) = img.as_chunks::<3>();
    #[cfg(target_arch = "x86_64")]
    if avx2::available() {
        let (eights, rest) = px.as_flattened().as_chunks::<24>();
        // SAFETY: the CPU has AVX2 and FMA (`available`).
        let sum = unsafe { avx2::luma_sum(eights) };
        let (rest, _) = rest.as_chunks::<3>();
        return sum + rest.iter().map(floor_luma).sum::<u32>() as u64;
    }
    px.iter().map(|p| floor_luma(p) as u64).sum()
}

/// `adjust_contrast(img, factor)`: a blend with the mean of the floored grayscale (float32).
pub fn contrast(img: &mut [u8], factor: f64) {
    let n = (img.len() / 3).max(1);
    contrast_about(img, luma_sum(img) as f32 / n as f32, factor);
}

/// Contrast's blend of every value with `mean`, through a table of the 256 values.
fn contrast_about(img: &mut [u8], mean: f32, factor: f64) {
    let (ratio, alpha) = ratio_alpha(factor);
    let mut lut = [0u8; 256];
    for (v, l) in lut.iter_mut().enumerate() {
        *l = blend1(v as u8, mean, ratio, alpha);
    }
    apply_lut(img, &lut);
}

/// `adjust_saturation(img, factor)`: each pixel blended with its floored grayscale:
/// `to_u8(f32(g * alpha + f32(v * ratio)))` per channel value `v` (the sum in float64, where
/// both products are exact, rounded once to float32 as the fused add rounds); with AVX2 and FMA
/// a float32 fused multiply-add where that is the same ([`saturation_is_fused`]).
pub fn saturation(img: &mut [u8], factor: f64) {
    let (ratio, alpha) = ratio_alpha(factor);
    saturation_by(img, ratio, alpha)
}

/// [`saturation`] by the float32 scalars.
fn saturation_by(img: &mut [u8], ratio: f32, alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    let img = if avx2::available() {
        let (eights, rest) = img.as_chunks_mut::<24>();
        let fused = saturation_is_fused(ratio, alpha);
        // SAFETY: the CPU has AVX2 and FMA (`available`).
        unsafe { avx2::saturation(eights, ratio, alpha, fused) };
        rest
    } else {
        img
    };
    let (ratio, alpha) = (ratio as f64, alpha as f64);
    let (pixels, _) = img.as_chunks_mut::<3>();
    for p in pixels {
        let g = floor_luma(p) as f64 * alpha;
        *p = p.map(|v| to_u8(r32(g + r32(v as f64 * ratio) as f64)));
    }
}

/// `rgb_to_grayscale(img, num_output_channels=3)` (`RandomGrayscale`): the luma cast to uint8
/// (truncated) in all three channels.
pub fn grayscale(img: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    let img = if avx2::available() {
        let (eights, rest) = img.as_chunks_mut::<24>();
        // SAFETY: the CPU has AVX2 and FMA (`available`).
        unsafe { avx2::grayscale(eights) };
        rest
    } else {
        img
    };
    let (pixels, _) = img.as_chunks_mut::<3>();
    for p in pixels {
        *p = [floor_luma(p) as u8; 3];
    }
}

/// The luma kernels eight pixels at a time with AVX2 and FMA: the pixels spread to 32-bit lanes
/// by a byte shuffle, [`luma`]'s arithmetic with fused multiply-adds, and for [`saturation`]
/// the float64 blend of the scalar path on four lanes (the same IEEE operations in the same
/// order).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{WB, WG, WR};
    use std::arch::x86_64::*;

    /// Whether the CPU has AVX2 and FMA.
    pub(super) fn available() -> bool {
        super::simd_allowed() && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    /// Eight RGB8 pixels as eight lanes `r | g << 8 | b << 16`.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn load8(p: &[u8; 24]) -> __m256i {
        // SAFETY: the two 16-byte unaligned loads read bytes 0..16 and 8..24 of `p`.
        let (lo, hi) = unsafe { (_mm_loadu_si128(p.as_ptr().cast()), _mm_loadu_si128(p.as_ptr().add(8).cast())) };
        let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
        // Lane 0 holds pixels 0..4 at bytes 0..12, lane 1 pixels 4..8 at bytes 4..16.
        #[rustfmt::skip]
        let idx = _mm256_setr_epi8(
            0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1,
            4, 5, 6, -1, 7, 8, 9, -1, 10, 11, 12, -1, 13, 14, 15, -1,
        );
        _mm256_shuffle_epi8(v, idx)
    }

    /// [`load8`]'s inverse (the lanes' top bytes are dropped).
    #[target_feature(enable = "avx2")]
    #[inline]
    fn store8(p: &mut [u8; 24], v: __m256i) {
        #[rustfmt::skip]
        let idx = _mm256_setr_epi8(
            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
            0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1,
        );
        let packed = _mm256_shuffle_epi8(v, idx);
        // The 24 bytes to the low end: dwords 0, 1, 2 of each lane.
        let v = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7));
        // SAFETY: the stores write bytes 0..16 and 16..24 of `p`.
        unsafe {
            _mm_storeu_si128(p.as_mut_ptr().cast(), _mm256_castsi256_si128(v));
            _mm_storel_epi64(p.as_mut_ptr().add(16).cast(), _mm256_extracti128_si256::<1>(v));
        }
    }

    /// Byte `k` of each lane, as 32-bit integers.
    #[target_feature(enable = "avx2")]
    #[inline]
    fn channel<const SHIFT: i32>(px: __m256i) -> __m256i {
        _mm256_and_si256(_mm256_srli_epi32::<SHIFT>(px), _mm256_set1_epi32(0xff))
    }

    /// The floored luma of eight pixels ([`super::floor_luma`]) with fused multiply-adds:
    /// `fma(b, WB, fma(g, WG, r * WR))` is [`super::luma`], whose products and sums are all exact
    /// in float64 (at most 35 significant bits), so that each of its roundings to float32 is the
    /// fused one (`luma_with_fma_is_luma` checks all 2^24 colours).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn floor_luma8(px: __m256i) -> __m256i {
        let r = _mm256_cvtepi32_ps(channel::<0>(px));
        let g = _mm256_cvtepi32_ps(channel::<8>(px));
        let b = _mm256_cvtepi32_ps(channel::<16>(px));
        let l = _mm256_mul_ps(r, _mm256_set1_ps(WR));
        let l = _mm256_fmadd_ps(g, _mm256_set1_ps(WG), l);
        let l = _mm256_fmadd_ps(b, _mm256_set1_ps(WB), l);
        _mm256_cvttps_epi32(l)
    }

    /// The sum of the floored lumas.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn luma_sum(px: &[[u8; 24]]) -> u64 {
        let mut sum = 0u64;
        // At most 255 per pixel: 2^20 steps cannot overflow a 32-bit lane.
        for run in px.chunks(1 << 20) {
            let mut acc = _mm256_setzero_si256();
            for p in run {
                acc = _mm256_add_epi32(acc, floor_luma8(load8(p)));
            }
            let mut lanes = [0u32; 8];
            // SAFETY: `lanes` is 32 bytes.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc) };
            sum += lanes.iter().map(|&v| v as u64).sum::<u64>();
        }
        sum
    }

    /// [`super::saturation_by`]: `to_u8(fma(g, alpha, v * ratio))` in float32 where `fused`
    /// ([`super::saturation_is_fused`]), else the float64 blend on four lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn saturation(px: &mut [[u8; 24]], ratio: f32, alpha: f32, fused: bool) {
        let (ratio_s, alpha_s) = (_mm256_set1_ps(ratio), _mm256_set1_ps(alpha));
        let (ratio_d, alpha_d) = (_mm256_set1_pd(ratio as f64), _mm256_set1_pd(alpha as f64));
        let (zero, top) = (_mm256_setzero_ps(), _mm256_set1_ps(255.0));
        for p in px {
            let v = load8(p);
            let gray = floor_luma8(v);
            let gray_s = _mm256_cvtepi32_ps(gray);
            let g_lo = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(gray)), alpha_d);
            let g_hi = _mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_extracti128_si256::<1>(gray)), alpha_d);
            // `f32(g + f64(f32(v * ratio)))` of four values.
            let half = |c: __m128i, g: __m256d| -> __m128 {
                let a = _mm256_cvtps_pd(_mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtepi32_pd(c), ratio_d)));
                _mm256_cvtpd_ps(_mm256_add_pd(g, a))
            };
            let blend = |c: __m256i| -> __m256i {
                let x = if fused {
                    _mm256_fmadd_ps(gray_s, alpha_s, _mm256_mul_ps(_mm256_cvtepi32_ps(c), ratio_s))
                } else {
                    let lo = half(_mm256_castsi256_si128(c), g_lo);
                    let hi = half(_mm256_extracti128_si256::<1>(c), g_hi);
                    _mm256_set_m128(hi, lo)
                };
                _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(x, zero), top))
            };
            let r = blend(channel::<0>(v));
            let g = _mm256_slli_epi32::<8>(blend(channel::<8>(v)));
            let b = _mm256_slli_epi32::<16>(blend(channel::<16>(v)));
            store8(p, _mm256_or_si256(r, _mm256_or_si256(g, b)));
        }
    }

    /// [`super::sharpness`] where [`super::blend_is_fused`]: the blend as the float32
    /// `fma(blurred - v, alpha, v)`, eight lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn sharpen(img: &mut [u8], src: &[u8], w: usize, h: usize, alpha: f32) {
        super::sharpen_rows(img, src, w, h, |d, v| super::to_u8((d as f32).mul_add(alpha, v as f32)))
    }

    /// [`super::grayscale`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn grayscale(px: &mut [[u8; 24]]) {
        for p in px {
            let l = floor_luma8(load8(p));
            let l = _mm256_or_si256(l, _mm256_or_si256(_mm256_slli_epi32::<8>(l), _mm256_slli_epi32::<16>(l)));
            store8(p, l);
        }
    }
}

/// `posterize(img, bits)`: keeps the `bits` high bits (0 bits: black, 8: unchanged), as
/// torchvision's tensor kernel (`image & mask`). Pillow (timm) refuses 0 bits since Pillow 13;
/// stoker follows torchvision.
pub fn posterize(img: &mut [u8], bits: u32) {
    if bits >= 8 {
        return;
    }
    let mask = (((1u32 << bits) - 1) << (8 - bits)) as u8;
    for v in img.iter_mut() {
        *v &= mask;
    }
}

/// `solarize(img, threshold)`: values `>= threshold` (compared in float32, as torch compares a
/// uint8 tensor with a Python float) are inverted. The comparison is monotonic in the value:
/// it is `v >= first`, the first byte value that passes it (256: none).
pub fn solarize(img: &mut [u8], threshold: f64) {
    let t = threshold as f32;
    let first = (0..256u16).find(|&v| v as f32 >= t).unwrap_or(256);
    for v in img.iter_mut() {
        *v = if *v as u16 >= first { 255 - *v } else { *v };
    }
}

/// timm's `solarize_add(img, add, thresh)`: values below `thresh` raised by `add` (at most 255).
pub fn solarize_add(img: &mut [u8], add: u32, thresh: u32) {
    // `min(v + add, 255)` is the saturating add of `min(add, 255)`.
    let add = add.min(255) as u8;
    for v in img.iter_mut() {
        *v = if (*v as u32) < thresh { v.saturating_add(add) } else { *v };
    }
}

/// `invert(img)`: `255 - v`.
pub fn invert(img: &mut [u8]) {
    for v in img.iter_mut() {
        *v = !*v;
    }
}

/// The per-channel minimum and maximum of an RGB8 image (16 pixels per step).
fn channel_range(img: &[u8]) -> ([u8; 3], [u8; 3]) {
    let (blocks, rest) = img.as_chunks::<48>();
    let (mut lo48, mut hi48) = ([255u8; 48], [0u8; 48]);
    for b in blocks {
        for k in 0..48 {
            lo48[k] = lo48[k].min(b[k]);
            hi48[k] = hi48[k].max(b[k]);
        }
    }
    let (mut lo, mut hi) = ([255u8; 3], [0u8; 3]);
    for k in 0..48 {
        lo[k % 3] = lo[k % 3].min(lo48[k]);
        hi[k % 3] = hi[k % 3].max(hi48[k]);
    }
    for px in rest.chunks_exact(3) {
        for c in 0..3 {
            lo[c] = lo[c].min(px[c]);
            hi[c] = hi[c].max(px[c]);
        }
    }
    (lo, hi)
}

/// `autocontrast(img)`: per channel, `(v - min) / ((max - min) * (1 / 255))` in float32,
/// clamped and truncated; a channel with `max == min` is unchanged.
pub fn autocontrast(img: &mut [u8]) {
    let (lo, hi) = channel_range(img);
    let step = (1.0f64 / 255.0) as f32;
    let (mut min, mut inv_scale) = ([0f32; 3], [1f32; 3]);
    for c in 0..3 {
        let (l, h) = (lo[c] as f32, hi[c] as f32);
        if l != h {
            (min[c], inv_scale[c]) = (l, (h - l) * step);
        }
    }
    autocontrast_by(img, min, inv_scale)
}

multiversion! {
    /// [`autocontrast`] by the float32 minimum and scale of each channel:
    /// `(v - min) / inv_scale`, 16 pixels per step.
    fn autocontrast_by(img: &mut [u8], min: [f32; 3], inv_scale: [f32; 3]) {
        let px = |c: usize, v: u8| to_u8((v as f32 - min[c]) / inv_scale[c]);
        let (m48, s48): ([f32; 48], [f32; 48]) = (std::array::from_fn(|k| min[k % 3]), std::array::from_fn(|k| inv_scale[k % 3]));
        let (blocks, rest) = img.as_chunks_mut::<48>();
        for b in blocks {
            for k in 0..48 {
                b[k] = to_u8((b[k] as f32 - m48[k]) / s48[k]);
            }
        }
        for (k, v) in rest.iter_mut().enumerate() {
            *v = px(k % 3, *v);
        }
    }
}

/// `equalize(img)`: torchvision's histogram equalisation (Pillow's scheme), per channel.
pub fn equalize(img: &mut [u8]) {
    // Two histograms per channel, even and odd pixels, summed: neighbouring pixels often share
    // a value, and one counter incremented twice in a row waits on its own store.
    let mut hist2 = [[[0u32; 256]; 3]; 2];
    let (pairs, rest) = img.as_chunks::<6>();
    for p in pairs {
        for c in 0..3 {
            hist2[0][c][p[c] as usize] += 1;
            hist2[1][c][p[3 + c] as usize] += 1;
        }
    }
    for px in rest.chunks_exact(3) {
        for c in 0..3 {
            hist2[0][c][px[c] as usize] += 1;
        }
    }
    let mut hist = hist2[0];
    for (h, h1) in hist.iter_mut().zip(&hist2[1]) {
        for (a, b) in h.iter_mut().zip(h1) {
            *a += b;
        }
    }
    apply_luts(img, &equalize_luts(&hist, (img.len() / 3) as u64));
}

/// Equalisation's tables from each channel's histogram of `n` pixels (Pillow's scheme, as
/// torchvision's `equalize`).
fn equalize_luts(hist: &[[u32; 256]; 3], n: u64) -> [[u8; 256]; 3] {
    let mut luts = [[0u8; 256]; 3];
    for c in 0..3 {
        let h = &hist[c];
        // The last non-empty bin: the first where the cumulative histogram reaches `n`.
        let last = (0..256).rev().find(|&k| h[k] > 0).unwrap_or(0);
        let step = (n - h[last] as u64) / 255;
        if step == 0 {
            for (v, l) in luts[c].iter_mut().enumerate() {
                *l = v as u8;
            }
            continue;
        }
        let mut cum = 0u64;
        luts[c][0] = 0;
        for k in 1..256 {
            cum += h[k - 1] as u64;
            luts[c][k] = ((cum + step / 2) / step).min(255) as u8;
        }
    }
    luts
}

/// `adjust_sharpness(img, factor)`: the interior pixels blended with a 3x3 smoothing (1s around
/// a 5, over 13, rounded); the border kept. `scratch` holds a copy of the image.
///
/// The smoothing is torchvision's `round(f32(ring * f32(1/13) + center * f32(5/13)))` (the
/// sum exact in float64, rounded once), which is the integer `(ring + 5 center + 6) / 13`
/// for every ring (0..=2040) and center (0..=255): `(ring + 5 center) / 13` is never within
/// 1/26 of a half, far more than the weights' and the rounding's errors
/// (`sharpness_smoothing_is_integer` checks all pairs). The blend
/// `f32((blurred - v) * alpha + v)` is computed in float64 as before, vectorised, or, with AVX2
/// and FMA, as a float32 fused multiply-add where that is the same ([`blend_is_fused`]).
pub fn sharpness(img: &mut [u8], w: usize, h: usize, factor: f64, scratch: &mut Vec<u8>) {
    if w <= 2 || h <= 2 {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(img);
    let src = &scratch[..];
    let alpha = (1.0 - factor) as f32;
    #[cfg(target_arch = "x86_64")]
    if blend_is_fused(alpha) && avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA (`available`).
        return unsafe { avx2::sharpen(img, src, w, h, alpha) };
    }
    sharpen(img, src, w, h, alpha as f64);
}

/// [`sharpness`]'s interior rows `1..h - 1` from the copy `src`, each value `v` becoming
/// `blend(blurred - v, v)`.
#[inline(always)]
fn sharpen_rows(img: &mut [u8], src: &[u8], w: usize, h: usize, blend: impl Fn(i32, u8) -> u8) {
    let row = w * 3;
    // One row of vertical 3-sums.
    let mut vsum = vec![0u16; row];
    for y in 1..h - 1 {
        let (up, mid, down) =
            (&src[(y - 1) * row..y * row], &src[y * row..(y + 1) * row], &src[(y + 1) * row..][..row]);
        for (((s, &a), &b), &c) in vsum.iter_mut().zip(up).zip(mid).zip(down) {
            *s = a as u16 + b as u16 + c as u16;
        }
        // Interior values k in 3..row - 3: the neighbours' column sums at k - 3, k, k + 3.
        let n = row - 6;
        let (left, centre, right) = (&vsum[..n], &vsum[3..3 + n], &vsum[6..6 + n]);
        let out = &mut img[y * row + 3..][..n];
        for ((((o, &v), &l), &cs), &r) in out.iter_mut().zip(&mid[3..3 + n]).zip(left).zip(centre).zip(right) {
            let ring = l + cs + r - v as u16;
            let blurred = (ring + 5 * v as u16 + 6) / 13;
            *o = blend(blurred as i32 - v as i32, v);
        }
    }
}

multiversion! {
    /// [`sharpness`]'s interior with the float32 `1 - factor` as a double: the blend
    /// `f32((blurred - v) * alpha + v)` in float64.
    fn sharpen(img: &mut [u8], src: &[u8], w: usize, h: usize, alpha: f64) {
        sharpen_rows(img, src, w, h, |d, v| to_u8(r32(d as f64 * alpha + v as f64)))
    }
}

/// `adjust_hue(img, factor)`: float32 RGB → HSV, hue shifted by `factor` (mod 1), → RGB, scaled
/// back with torchvision's `* 255.999` and truncation.
pub fn hue(img: &mut [u8], factor: f64) {
    let hf = factor as f32;
    let inv = (1.0f64 / 255.0) as f32;
    let up = (255.0f64 + 1.0 - 1e-3) as f32;
    for px in img.chunks_exact_mut(3) {
        let (r, g, b) = (px[0] as f32 * inv, px[1] as f32 * inv, px[2] as f32 * inv);
        let maxc = r.max(g).max(b);
        let minc = r.min(g).min(b);
        let eqc = maxc == minc;
        let cr = maxc - minc;
        let s = cr / if eqc { 1.0 } else { maxc };
        let div = if eqc { 1.0 } else { cr };
        let rc = (maxc - r) / div;
        let gc = (maxc - g) / div;
        let bc = (maxc - b) / div;
        let neq_r = maxc != r;
        let eq_g = maxc == g;
        let hr = if !neq_r { bc - gc } else { 0.0 };
        let hg = if eq_g && neq_r { (rc + 2.0) - bc } else { 0.0 };
        let hb = if neq_r && !eq_g { (gc + 4.0) - rc } else { 0.0 };
        let mut hh = hr + hg + hb;
        // `fmod(h / 6 + 1, 1)` of a non-negative value: the fraction (exact).
        hh = hh * (1.0f64 / 6.0) as f32 + 1.0;
        hh -= floor_pos(hh);
        // `h.add_(hue_factor).remainder_(1.0)`: Python-style remainder (non-negative).
        let mut hh = hh + hf;
        hh -= floor_any(hh);
        let v = maxc;
        let h6 = hh * 6.0;
        let i = floor_any(h6);
        let f = h6 - i;
        let i = (i as i32).rem_euclid(6);
        let sxf = s * f;
        let one_minus_s = 1.0 - s;
        let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
        let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
        let p = (one_minus_s * v).clamp(0.0, 1.0);
        let (ro, go, bo) = match i {
            0 => (v, t, p),
            1 => (q, v, p),
            2 => (p, v, t),
            3 => (p, q, v),
            4 => (t, p, v),
            _ => (v, p, q),
        };
        px[0] = (ro * up) as u8;
        px[1] = (go * up) as u8;
        px[2] = (bo * up) as u8;
    }
}

/// The scalar kernels these replaced (per-pixel float64 emulation and tables), kept as the
/// reference the vectorised ones are checked against byte for byte.
#[cfg(test)]
pub(crate) mod reference {
    use super::{r32, round_even, WB, WG, WR};

    /// [`luma`] by tables: the three products are exact in `f64`, so only the two sums (each
    /// rounded to float32, as the fused adds are) remain per pixel.
    pub struct Luma {
        r: [f64; 256],
        g: [f64; 256],
        b: [f64; 256],
    }

    impl Luma {
        fn new() -> Self {
            let mut t = Luma { r: [0.0; 256], g: [0.0; 256], b: [0.0; 256] };
            for v in 0..256 {
                t.r[v] = r32(v as f64 * WR as f64) as f64;
                t.g[v] = v as f64 * WG as f64;
                t.b[v] = v as f64 * WB as f64;
            }
            t
        }

        #[inline(always)]
        fn of(&self, r: u8, g: u8, b: u8) -> f32 {
            let t = r32(self.g[g as usize] + self.r[r as usize]);
            r32(self.b[b as usize] + t as f64)
        }
    }

    /// Applies `lut` to every byte of `img` (all channels alike).
    #[inline]
    pub fn apply_lut(img: &mut [u8], lut: &[u8; 256]) {
        for v in img.iter_mut() {
            *v = lut[*v as usize];
        }
    }

    /// Applies one table per channel to an RGB8 image.
    #[inline]
    pub fn apply_luts(img: &mut [u8], luts: &[[u8; 256]; 3]) {
        for px in img.chunks_exact_mut(3) {
            px[0] = luts[0][px[0] as usize];
            px[1] = luts[1][px[1] as usize];
            px[2] = luts[2][px[2] as usize];
        }
    }

    /// float32 → uint8 as torch's `.clamp_(0, 255).to(torch.uint8)` (clamp, truncate).
    #[inline(always)]
    pub fn to_u8(x: f32) -> u8 {
        x.clamp(0.0, 255.0) as u8
    }

    /// The float32 scalars of a blend factor given as a double (what Python hands torch).
    #[inline]
    pub fn ratio_alpha(factor: f64) -> (f32, f32) {
        (factor as f32, (1.0 - factor) as f32)
    }

    /// `adjust_brightness(img, factor)`: `clamp(v * factor)`, a table.
    pub fn brightness(img: &mut [u8], factor: f64) {
        let f = factor as f32;
        let mut lut = [0u8; 256];
        for (v, l) in lut.iter_mut().enumerate() {
            *l = to_u8(r32(v as f64 * f as f64));
        }
        apply_lut(img, &lut);
    }

    /// The floored float32 luma of every pixel's grayscale (`rgb_to_grayscale(...,
    /// preserve_dtype=False).floor_()`), summed: torchvision's contrast mean is `sum / n`.
    pub fn luma_sum(img: &[u8]) -> u64 {
        let l = Luma::new();
        img.chunks_exact(3).map(|p| l.of(p[0], p[1], p[2]) as u64).sum()
    }

    /// `adjust_contrast(img, factor)`: a blend with the mean of the floored grayscale (float32);
    /// the mean is what the fast path changed, the blend is the one rule.
    pub fn contrast(img: &mut [u8], factor: f64) {
        let n = (img.len() / 3).max(1);
        super::contrast_about(img, luma_sum(img) as f32 / n as f32, factor);
    }

    /// `adjust_saturation(img, factor)`: each pixel blended with its floored grayscale.
    pub fn saturation(img: &mut [u8], factor: f64) {
        let (ratio, alpha) = ratio_alpha(factor);
        let l = Luma::new();
        // blend1(v, g) = to_u8(f32(g * alpha + f32(v * ratio))): both products by table.
        let (mut a, mut o) = ([0f64; 256], [0f64; 256]);
        for v in 0..256 {
            a[v] = r32(v as f64 * ratio as f64) as f64;
            o[v] = v as f64 * alpha as f64;
        }
        for px in img.chunks_exact_mut(3) {
            let g = o[l.of(px[0], px[1], px[2]) as usize];
            px[0] = to_u8(r32(g + a[px[0] as usize]));
            px[1] = to_u8(r32(g + a[px[1] as usize]));
            px[2] = to_u8(r32(g + a[px[2] as usize]));
        }
    }

    /// `rgb_to_grayscale(img, num_output_channels=3)` (`RandomGrayscale`): the luma cast to uint8
    /// (truncated) in all three channels.
    pub fn grayscale(img: &mut [u8]) {
        let l = Luma::new();
        for px in img.chunks_exact_mut(3) {
            let g = l.of(px[0], px[1], px[2]) as u8;
            px.fill(g);
        }
    }

    /// `solarize(img, threshold)`: values `>= threshold` (compared in float32, as torch compares a
    /// uint8 tensor with a Python float) are inverted.
    pub fn solarize(img: &mut [u8], threshold: f64) {
        let t = threshold as f32;
        let mut lut = [0u8; 256];
        for (v, l) in lut.iter_mut().enumerate() {
            *l = if v as f32 >= t { 255 - v as u8 } else { v as u8 };
        }
        apply_lut(img, &lut);
    }

    /// timm's `solarize_add(img, add, thresh)`: values below `thresh` raised by `add` (at most 255).
    pub fn solarize_add(img: &mut [u8], add: u32, thresh: u32) {
        let mut lut = [0u8; 256];
        for (v, l) in lut.iter_mut().enumerate() {
            *l = if (v as u32) < thresh { (v as u32 + add).min(255) as u8 } else { v as u8 };
        }
        apply_lut(img, &lut);
    }

    /// `autocontrast(img)`: per channel, `(v - min) / ((max - min) * (1 / 255))` in float32,
    /// clamped and truncated; a channel with `max == min` is unchanged.
    pub fn autocontrast(img: &mut [u8]) {
        let (mut lo, mut hi) = ([255u8; 3], [0u8; 3]);
        for px in img.chunks_exact(3) {
            for c in 0..3 {
                lo[c] = lo[c].min(px[c]);
                hi[c] = hi[c].max(px[c]);
            }
        }
        let mut luts = [[0u8; 256]; 3];
        let step = (1.0f64 / 255.0) as f32;
        for c in 0..3 {
            let (min, max) = (lo[c] as f32, hi[c] as f32);
            let (min, inv_scale) = if max == min { (0.0, 1.0) } else { (min, (max - min) * step) };
            for (v, l) in luts[c].iter_mut().enumerate() {
                *l = to_u8((v as f32 - min) / inv_scale);
            }
        }
        apply_luts(img, &luts);
    }

    /// `equalize(img)`: torchvision's histogram equalisation (Pillow's scheme), per channel.
    pub fn equalize(img: &mut [u8]) {
        let mut hist = [[0u32; 256]; 3];
        for px in img.chunks_exact(3) {
            hist[0][px[0] as usize] += 1;
            hist[1][px[1] as usize] += 1;
            hist[2][px[2] as usize] += 1;
        }
        // The histogram is what the fast path changed; the tables are the one rule.
        apply_luts(img, &super::equalize_luts(&hist, (img.len() / 3) as u64));
    }

    /// `adjust_sharpness(img, factor)`: the interior pixels blended with a 3x3 smoothing (1s around
    /// a 5, over 13, rounded); the border kept. `scratch` holds a copy of the image.
    pub fn sharpness(img: &mut [u8], w: usize, h: usize, factor: f64, scratch: &mut Vec<u8>) {
        if w <= 2 || h <= 2 {
            return;
        }
        let row = w * 3;
        // The source, then one row of vertical 3-sums (integers: the 8 neighbours' sum is exact).
        scratch.clear();
        scratch.extend_from_slice(img);
        scratch.resize(img.len() + row * 2, 0);
        let (src, vsum) = scratch.split_at_mut(img.len());
        let (ka, kb) = ((1.0f64 / 13.0) as f32 as f64, (5.0f64 / 13.0) as f32 as f64);
        let alpha = (1.0 - factor) as f32 as f64;
        for y in 1..h - 1 {
            let (up, mid, down) = (&src[(y - 1) * row..y * row], &src[y * row..(y + 1) * row], &src[(y + 1) * row..]);
            for (k, pair) in vsum.chunks_exact_mut(2).take(row).enumerate() {
                let v = up[k] as u16 + mid[k] as u16 + down[k] as u16;
                pair.copy_from_slice(&v.to_ne_bytes());
            }
            let vs = |k: usize| u16::from_ne_bytes([vsum[2 * k], vsum[2 * k + 1]]) as u32;
            let out = &mut img[y * row..(y + 1) * row];
            for k in 3..row - 3 {
                let center = mid[k] as u32;
                let ring = vs(k - 3) + vs(k) + vs(k + 3) - center;
                // ring * a + center * b, exact in f64, rounded once (the convolution's sum).
                let blurred = round_even(r32(ring as f64 * ka + center as f64 * kb));
                let v = center as f64;
                out[k] = to_u8(r32((blurred as f64 - v) * alpha + v));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Photo-like test images: smooth gradients with noise, flat patches and saturated pixels,
    /// or uniform noise, at the crop size and at sizes with ragged blocks and rows.
    pub(crate) fn test_images(n: u64) -> Vec<(Vec<u8>, usize, usize)> {
        use crate::shell::rng::Rng;
        let mut out = vec![];
        for k in 0..n {
            let mut rng = Rng::new(50, 1, k);
            let (w, h) = match k % 4 {
                0 | 1 => (224, 224),
                2 => (37 + rng.below(40) as usize, 3 + rng.below(50) as usize),
                _ => (1 + rng.below(20) as usize, 1 + rng.below(20) as usize),
            };
            let noise = rng.below(60) as i32;
            let uniform = k % 7 == 5;
            let (fx, fy, f0) = (rng.uniform(-3.0, 3.0), rng.uniform(-3.0, 3.0), rng.uniform(-100.0, 300.0));
            let mut img = vec![0u8; w * h * 3];
            for y in 0..h {
                for x in 0..w {
                    for c in 0..3 {
                        let v = if uniform {
                            rng.below(256) as i32
                        } else {
                            let base = f0 + fx * x as f64 + fy * y as f64 + 40.0 * c as f64;
                            base as i32 + rng.below(noise as u64 * 2 + 1) as i32 - noise
                        };
                        img[(y * w + x) * 3 + c] = v.clamp(0, 255) as u8;
                    }
                }
            }
            out.push((img, w, h));
        }
        out
    }

    /// Factors of the blend ops: the policies' ranges, both ends, and odd values.
    fn factors() -> Vec<f64> {
        let mut rng = crate::shell::rng::Rng::new(50, 2, 0);
        let mut f = vec![0.0, 0.01, 0.1, 0.5, 0.9, 1.0, 1.1, 1.5, 1.99, 2.0, 3.7, 1e-7, 0.9999999, 1.0000001];
        f.extend((0..40).map(|_| rng.uniform(0.0, 2.0)));
        f
    }

    #[test]
    fn vectorised_kernels_equal_the_scalar_reference() {
        for portable in [false, true] {
            PORTABLE.set(portable);
            kernels_equal_the_scalar_reference();
        }
        PORTABLE.set(false);
    }

    fn kernels_equal_the_scalar_reference() {
        for (img, w, h) in test_images(28) {
            let check = |name: &str, a: &[u8], b: &[u8]| assert_eq!(a, b, "{name} on {w}x{h}");
            for f in factors() {
                let (mut a, mut b) = (img.clone(), img.clone());
                brightness(&mut a, f);
                reference::brightness(&mut b, f);
                check("brightness", &a, &b);
                let (mut a, mut b) = (img.clone(), img.clone());
                contrast(&mut a, f);
                reference::contrast(&mut b, f);
                check("contrast", &a, &b);
                let (mut a, mut b) = (img.clone(), img.clone());
                saturation(&mut a, f);
                reference::saturation(&mut b, f);
                check("saturation", &a, &b);
                let (mut a, mut b) = (img.clone(), img.clone());
                sharpness(&mut a, w, h, f, &mut vec![]);
                reference::sharpness(&mut b, w, h, f, &mut vec![]);
                check("sharpness", &a, &b);
            }
            for t in [-1.0, 0.0, 0.5, 1.0, 100.2, 127.5, 128.0, 254.9, 255.0, 255.5, 256.0, 300.0] {
                let (mut a, mut b) = (img.clone(), img.clone());
                solarize(&mut a, t);
                reference::solarize(&mut b, t);
                check("solarize", &a, &b);
            }
            for (add, thresh) in [(0, 128), (10, 128), (110, 128), (128, 0), (300, 256), (255, 300)] {
                let (mut a, mut b) = (img.clone(), img.clone());
                solarize_add(&mut a, add, thresh);
                reference::solarize_add(&mut b, add, thresh);
                check("solarize_add", &a, &b);
            }
            type Kernel = fn(&mut [u8]);
            let ops: [(&str, Kernel, Kernel); 3] = [
                ("grayscale", grayscale, reference::grayscale),
                ("autocontrast", autocontrast, reference::autocontrast),
                ("equalize", equalize, reference::equalize),
            ];
            for (name, new, old) in ops {
                let (mut a, mut b) = (img.clone(), img.clone());
                new(&mut a);
                old(&mut b);
                check(name, &a, &b);
            }
        }
    }

    /// The brightness product computed natively in float32 is the table's fused form, for every
    /// byte value, over a sweep of factors.
    #[test]
    fn brightness_is_its_table() {
        let mut rng = crate::shell::rng::Rng::new(50, 3, 0);
        for k in 0..20_000 {
            let f = if k < 10_000 { rng.uniform(0.0, 2.0) } else { rng.uniform(0.0, 300.0) } as f32;
            for v in 0..=255u8 {
                assert_eq!(to_u8(v as f32 * f), to_u8(r32(v as f64 * f as f64)), "{v} {f}");
            }
        }
    }

    /// The fused form of the AVX2 kernels' luma is [`luma`] for every colour.
    #[test]
    fn luma_with_fma_is_luma() {
        for r in 0..=255u8 {
            for g in 0..=255u8 {
                for b in 0..=255u8 {
                    let fused = (b as f32).mul_add(WB, (g as f32).mul_add(WG, r as f32 * WR));
                    assert_eq!(fused.to_bits(), luma(r, g, b).to_bits(), "{r} {g} {b}");
                }
            }
        }
    }

    /// Where [`blend_is_fused`] and [`saturation_is_fused`] say so, the float32 fused forms are
    /// the float64 ones for every pair of values, over factors near and beyond their bounds.
    #[test]
    fn fused_blends_equal_the_float64_ones_where_admitted() {
        let mut rng = crate::shell::rng::Rng::new(50, 6, 0);
        let mut alphas: Vec<f32> = vec![0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.7, 1e-7, 1e-6, -1e-6, 9.6e-7, 5e-7];
        alphas.extend((0..300).map(|k| {
            let e = -26.0 + (k % 30) as f64;
            (rng.uniform(1.0, 2.0) * 2f64.powf(e) * if k % 2 == 0 { 1.0 } else { -1.0 }) as f32
        }));
        let (mut admitted, mut refused) = (0, 0);
        for &alpha in &alphas {
            if !blend_is_fused(alpha) {
                refused += 1;
                continue;
            }
            admitted += 1;
            for d in -255..=255i32 {
                for v in 0..=255u8 {
                    let fused = to_u8((d as f32).mul_add(alpha, v as f32));
                    assert_eq!(fused, to_u8(r32(d as f64 * alpha as f64 + v as f64)), "{alpha} {d} {v}");
                }
            }
        }
        assert!(admitted > 100 && refused > 10, "{admitted} {refused}");
        let (mut admitted, mut refused) = (0, 0);
        for k in 0..400 {
            let factor = match k % 4 {
                0 => rng.uniform(0.0, 2.0),
                1 => 1.0 + rng.uniform(-1.0, 1.0) * 2f64.powi(-(rng.below(30) as i32)),
                2 => rng.uniform(-1.0, 1.0) * 2f64.powi(-(rng.below(30) as i32)),
                _ => [0.0, 1.0, 2.0, 0.5, 1e-7, 1.0 - 1e-7][k / 4 % 6],
            };
            let (ratio, alpha) = ratio_alpha(factor);
            if !saturation_is_fused(ratio, alpha) {
                refused += 1;
                continue;
            }
            admitted += 1;
            for g in 0..=255u32 {
                for v in 0..=255u8 {
                    let fused = to_u8((g as f32).mul_add(alpha, v as f32 * ratio));
                    let double = to_u8(r32(g as f64 * alpha as f64 + r32(v as f64 * ratio as f64) as f64));
                    assert_eq!(fused, double, "{factor} {g} {v}");
                }
            }
        }
        assert!(admitted > 200 && refused > 10, "{admitted} {refused}");
    }

    /// The integer smoothing of [`sharpness`] is torchvision's float32 one for every ring sum
    /// and centre value.
    #[test]
    fn sharpness_smoothing_is_integer() {
        let (ka, kb) = ((1.0f64 / 13.0) as f32 as f64, (5.0f64 / 13.0) as f32 as f64);
        for ring in 0..=2040u32 {
            for center in 0..=255u32 {
                let float = round_even(r32(ring as f64 * ka + center as f64 * kb));
                assert_eq!(float as u32, (ring + 5 * center + 6) / 13, "{ring} {center}");
            }
        }
    }

    #[test]
    fn integer_ops_on_known_values() {
        let mut a = vec![0u8, 100, 255, 37, 128, 200];
        posterize(&mut a, 2);
        assert_eq!(a, vec![0, 64, 192, 0, 128, 192]);
        let mut b = vec![0u8, 100, 255];
        posterize(&mut b, 0);
        assert_eq!(b, vec![0, 0, 0]);
        let mut c = vec![0u8, 127, 128, 255, 10, 200];
        solarize(&mut c, 128.0);
        assert_eq!(c, vec![0, 127, 127, 0, 10, 55]);
        invert(&mut c);
        assert_eq!(c, vec![255, 128, 128, 255, 245, 200]);
        // A flat channel is left alone by autocontrast and equalize.
        let mut d = vec![5u8, 9, 7, 5, 200, 7];
        autocontrast(&mut d);
        assert_eq!(d, vec![5, 0, 7, 5, 255, 7]);
    }

    #[test]
    fn grayscale_weights_truncate() {
        let mut p = vec![255u8, 255, 255, 10, 20, 30];
        grayscale(&mut p);
        // 0.2989 + 0.587 + 0.114 = 0.9999 in float32: white becomes 254, as in torchvision.
        assert_eq!(p, vec![254, 254, 254, 18, 18, 18]);
    }

    #[test]
    fn hue_zero_is_identity_within_a_level() {
        let mut img: Vec<u8> = (0..=255u8).flat_map(|v| [v, v.wrapping_mul(7), 255 - v]).collect();
        let orig = img.clone();
        hue(&mut img, 0.0);
        assert!(img.iter().zip(&orig).all(|(a, b)| (*a as i32 - *b as i32).abs() <= 1));
    }
}
