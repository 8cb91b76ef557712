//! Vector kernels of [`TransformPlan::write`](super::TransformPlan::write): flip, RGB
//! deinterleave (NCHW) or pass-through (NHWC), normalisation and the dtype conversion, eight
//! pixels per step.
//!
//! Exactness: the portable path looks values up in [`normalize_table`](super::normalize_table),
//! `(v as f32 / 255.0 - mean) / std`. The AVX2 kernel computes the same correctly rounded
//! quotients on eight lanes in one of two ways ([`Arith`]): with the two IEEE divisions
//! themselves, or (four times cheaper) with each division done as a product by the rounded
//! reciprocal and corrected by two fused multiply-adds, which gives the correctly rounded
//! quotient (Markstein's correction). Both are checked bit for bit against all 3 x 256 table
//! values when a plan is compiled ([`simd_arith`]): the plan takes the multiply-add kernel where
//! it reproduces the table, else the dividing one, else the portable path. The float16
//! conversion (`vcvtps2ph`, round to nearest even) is checked against `half::f16::from_f32` the
//! same way.

// Only the x86-64 kernel uses most of this file; other targets keep the portable write.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use super::Layout;

/// The normalisation the vector kernel computes: `(v / 255 - mean[c]) / std[c]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Norm {
    pub(crate) mean: [f32; 3],
    pub(crate) std: [f32; 3],
}

/// Output element kinds of the kernel (a const parameter, so each is compiled on its own).
pub(crate) const OUT_U8: u8 = 0;
/// float16 elements.
pub(crate) const OUT_F16: u8 = 1;
/// float32 elements.
pub(crate) const OUT_F32: u8 = 2;

/// For each of the three output groups of eight elements a block of eight RGB pixels gives,
/// the channel and the source byte (0..24 within the block) of each element.
fn groups(layout: Layout, flip: bool) -> [[(usize, usize); 8]; 3] {
    let mut g = [[(0, 0); 8]; 3];
    for (k, group) in g.iter_mut().enumerate() {
        for (j, e) in group.iter_mut().enumerate() {
            let (p, c) = match layout {
                Layout::NCHW => (j, k),
                Layout::NHWC => ((8 * k + j) / 3, (8 * k + j) % 3),
            };
            let sp = if flip { 7 - p } else { p };
            *e = (c, 3 * sp + c);
        }
    }
    g
}

/// How the AVX2 kernel computes `(v / 255 - mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    /// Each division as `q = x * (1/d)` corrected by `q + (x - q * d) * (1/d)`, both steps
    /// fused multiply-adds: the correctly rounded quotient, without the divider (about 4x the
    /// throughput of `vdivps`).
    MulAdd,
    /// The two `vdivps` divisions, exactly as the table.
    Divide,
}

/// The AVX2 kernel's arithmetic that gives exactly `lut` (and, for float16, exactly
/// `half::f16::from_f32` of it) for every channel and byte value: [`Arith::MulAdd`] where it
/// does, else [`Arith::Divide`]. `None` when the CPU lacks AVX2, F16C or FMA, or neither does.
pub(crate) fn simd_arith(lut: &[[f32; 256]; 3], norm: &Norm) -> Option<Arith> {
    [Arith::MulAdd, Arith::Divide].into_iter().find(|&a| simd_exact(lut, norm, a))
}

/// Whether the AVX2 kernel with arithmetic `arith` gives exactly `lut` (see [`simd_arith`]).
pub(crate) fn simd_exact(lut: &[[f32; 256]; 3], norm: &Norm, arith: Arith) -> bool {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2, F16C and FMA were detected just above.
        return unsafe { check_avx2(lut, norm, arith) };
    }
    let _ = (lut, norm, arith);
    false
}

/// The eight lanes' normalisation of the byte values `v` (as floats): `(v / 255 - mean) / std`,
/// with `inv_std = 1 / std` (rounded) for [`Arith::MulAdd`].
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn normalize8(
    v: std::arch::x86_64::__m256,
    mean: std::arch::x86_64::__m256,
    std: std::arch::x86_64::__m256,
    inv_std: std::arch::x86_64::__m256,
    arith: Arith,
) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let d255 = _mm256_set1_ps(255.0);
    match arith {
        Arith::Divide => _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(v, d255), mean), std),
        Arith::MulAdd => {
            // q ~ v / 255, corrected by its remainder; then the same for t / std.
            let inv255 = _mm256_set1_ps(1.0 / 255.0);
            let q0 = _mm256_mul_ps(v, inv255);
            let q = _mm256_fmadd_ps(_mm256_fnmadd_ps(q0, d255, v), inv255, q0);
            let t = _mm256_sub_ps(q, mean);
            let y0 = _mm256_mul_ps(t, inv_std);
            _mm256_fmadd_ps(_mm256_fnmadd_ps(y0, std, t), inv_std, y0)
        }
    }
}

/// # Safety
/// The CPU must support AVX2, F16C and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
unsafe fn check_avx2(lut: &[[f32; 256]; 3], norm: &Norm, arith: Arith) -> bool {
    use std::arch::x86_64::*;
    for (c, table) in lut.iter().enumerate() {
        for v0 in (0..256).step_by(8) {
            let i = _mm256_setr_epi32(v0, v0 + 1, v0 + 2, v0 + 3, v0 + 4, v0 + 5, v0 + 6, v0 + 7);
            // SAFETY: this function's caller guarantees AVX2 and FMA.
            let f = unsafe {
                normalize8(
                    _mm256_cvtepi32_ps(i),
                    _mm256_set1_ps(norm.mean[c]),
                    _mm256_set1_ps(norm.std[c]),
                    _mm256_set1_ps(1.0 / norm.std[c]),
                    arith,
                )
            };
            let mut got = [0f32; 8];
            let mut got16 = [0u16; 8];
            // SAFETY: `got` holds 8 f32 (32 bytes) and `got16` 8 u16 (16 bytes); unaligned stores.
            unsafe {
                _mm256_storeu_ps(got.as_mut_ptr(), f);
                _mm_storeu_si128(got16.as_mut_ptr().cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f));
            }
            for (j, (g, g16)) in got.iter().zip(got16).enumerate() {
                let want = table[v0 as usize + j];
                if g.to_bits() != want.to_bits() || g16 != half::f16::from_f32(want).to_bits() {
                    return false;
                }
            }
        }
    }
    true
}

/// Writes the `h` x `w` RGB8 image `hwc` into `out` (`h * w * 3` elements of kind `D`, as
/// bytes) in `layout`, mirrored when `flip`; float kinds are normalised with `norm`.
///
/// # Safety
/// The CPU must support AVX2, F16C and FMA, and [`simd_exact`] must hold for `lut`, `norm`
/// and `arith` for the result to equal the portable path's (memory safety does not depend on it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn write_avx2<const D: u8>(
    hwc: &[u8],
    h: usize,
    w: usize,
    flip: bool,
    layout: Layout,
    norm: &Norm,
    arith: Arith,
    lut: Option<&[[f32; 256]; 3]>,
    out: &mut [u8],
) {
    // Float elements go to memory with non-temporal stores where every store is aligned (rows
    // of whole blocks, a 32-byte aligned sample): a batch is far larger than the caches and is
    // next read by a copy to the GPU or by the consumer, so this saves reading each line of
    // the destination before writing it.
    let stream = D != OUT_U8 && w.is_multiple_of(8) && (out.as_ptr() as usize).is_multiple_of(32);
    // The arithmetic and the kind of store as constants, so that the loop has no branch on them.
    // SAFETY: forwarded from the caller.
    unsafe {
        match (arith, stream) {
            (Arith::MulAdd, true) => write_rows::<D, true, true>(hwc, h, w, flip, layout, norm, lut, out),
            (Arith::MulAdd, false) => write_rows::<D, true, false>(hwc, h, w, flip, layout, norm, lut, out),
            (Arith::Divide, true) => write_rows::<D, false, true>(hwc, h, w, flip, layout, norm, lut, out),
            (Arith::Divide, false) => write_rows::<D, false, false>(hwc, h, w, flip, layout, norm, lut, out),
        }
    }
}

/// [`write_avx2`] with the arithmetic ([`Arith::MulAdd`] when `MULADD`) and non-temporal
/// stores (`STREAM`: then `w` must be a multiple of 8 and `out` 32-byte aligned) fixed.
///
/// # Safety
/// As [`write_avx2`], and the alignment above when `STREAM`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn write_rows<const D: u8, const MULADD: bool, const STREAM: bool>(
    hwc: &[u8],
    h: usize,
    w: usize,
    flip: bool,
    layout: Layout,
    norm: &Norm,
    lut: Option<&[[f32; 256]; 3]>,
    out: &mut [u8],
) {
    use std::arch::x86_64::*;
    let esize = match D {
        OUT_U8 => 1,
        OUT_F16 => 2,
        _ => 4,
    };
    assert!(hwc.len() >= h * w * 3 && out.len() >= h * w * 3 * esize, "write_avx2: buffers too small");
    let g = groups(layout, flip);
    // Shuffle masks: element j of group k comes from byte b of the block, read from the low
    // load (bytes 0..16) when b < 16, else from the high load (bytes 8..24).
    let mut mlo = [[0x80u8; 16]; 3];
    let mut mhi = [[0x80u8; 16]; 3];
    let mut mean = [[0f32; 8]; 3];
    let mut std = [[0f32; 8]; 3];
    let mut inv_std = [[0f32; 8]; 3];
    for k in 0..3 {
        for j in 0..8 {
            let (c, b) = g[k][j];
            if b < 16 {
                mlo[k][j] = b as u8;
            } else {
                mhi[k][j] = (b - 8) as u8;
            }
            mean[k][j] = norm.mean[c];
            std[k][j] = norm.std[c];
            inv_std[k][j] = 1.0 / norm.std[c];
        }
    }
    // SAFETY: each array is 16 bytes (masks) or 8 f32 (32 bytes); unaligned loads.
    let (mlo, mhi, mean, std, inv_std) = unsafe {
        (
            [0, 1, 2].map(|k| _mm_loadu_si128(mlo[k].as_ptr().cast())),
            [0, 1, 2].map(|k| _mm_loadu_si128(mhi[k].as_ptr().cast())),
            [0, 1, 2].map(|k| _mm256_loadu_ps(mean[k].as_ptr())),
            [0, 1, 2].map(|k| _mm256_loadu_ps(std[k].as_ptr())),
            [0, 1, 2].map(|k| _mm256_loadu_ps(inv_std[k].as_ptr())),
        )
    };
    let plane = h * w;
    let blocks = w / 8;
    let src = hwc.as_ptr();
    let dst = out.as_mut_ptr();
    let arith = if MULADD { Arith::MulAdd } else { Arith::Divide };
    // Non-temporal stores: `_mm_sfence` below orders them before the batch's completion is
    // published.
    let stream = STREAM;
    debug_assert!(!STREAM || (w.is_multiple_of(8) && (dst as usize).is_multiple_of(32)));
    for y in 0..h {
        for b in 0..blocks {
            let x0 = b * 8;
            let sx = if flip { w - 8 - x0 } else { x0 };
            let s = (y * w + sx) * 3;
            // SAFETY: sx + 8 <= w, so bytes s..s + 24 lie in row y of `hwc` (length checked).
            let (lo, hi) = unsafe { (_mm_loadu_si128(src.add(s).cast()), _mm_loadu_si128(src.add(s + 8).cast())) };
            for k in 0..3 {
                let bytes = _mm_or_si128(_mm_shuffle_epi8(lo, mlo[k]), _mm_shuffle_epi8(hi, mhi[k]));
                let e = match layout {
                    Layout::NCHW => k * plane + y * w + x0,
                    Layout::NHWC => (y * w + x0) * 3 + 8 * k,
                };
                // SAFETY: elements e..e + 8 are inside the image's h * w * 3 elements (x0 + 8 <= w),
                // which `out` holds (checked above); unaligned stores, or aligned ones when
                // `stream` (e is then a multiple of 8 and `dst` 32-byte aligned).
                unsafe {
                    let o = dst.add(e * esize);
                    if D == OUT_U8 {
                        _mm_storel_epi64(o.cast(), bytes);
                    } else {
                        let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                        let f = normalize8(f, mean[k], std[k], inv_std[k], arith);
                        if D == OUT_F16 {
                            let f = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f);
                            if stream {
                                _mm_stream_si128(o.cast(), f);
                            } else {
                                _mm_storeu_si128(o.cast(), f);
                            }
                        } else if stream {
                            _mm256_stream_ps(o.cast(), f);
                        } else {
                            _mm256_storeu_ps(o.cast(), f);
                        }
                    }
                }
            }
        }
        // The last w % 8 columns, one element at a time from the table.
        for x in blocks * 8..w {
            let sx = if flip { w - 1 - x } else { x };
            for c in 0..3 {
                let v = hwc[(y * w + sx) * 3 + c];
                let e = match layout {
                    Layout::NCHW => c * plane + y * w + x,
                    Layout::NHWC => (y * w + x) * 3 + c,
                };
                match D {
                    OUT_U8 => out[e] = v,
                    OUT_F16 => {
                        let t = lut.expect("float write has a table")[c][v as usize];
                        out[e * 2..e * 2 + 2].copy_from_slice(&half::f16::from_f32(t).to_ne_bytes());
                    }
                    _ => {
                        let t = lut.expect("float write has a table")[c][v as usize];
                        out[e * 4..e * 4 + 4].copy_from_slice(&t.to_ne_bytes());
                    }
                }
            }
        }
    }
    if stream {
        _mm_sfence();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ops::normalize_table;

    /// OpenAI CLIP's normalisation (as written in its preprocessing, rounded to `f32`).
    #[allow(clippy::excessive_precision)]
    const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
    #[allow(clippy::excessive_precision)]
    const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

    fn has_kernel() -> bool {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("fma") {
            return true;
        }
        eprintln!("no AVX2/F16C/FMA: the vector kernel is not tested here");
        false
    }

    #[test]
    fn the_multiply_add_arithmetic_is_exact_for_usual_and_random_norms() {
        if !has_kernel() {
            return;
        }
        let mut norms = vec![
            ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            (CLIP_MEAN, CLIP_STD),
            ([0.5; 3], [0.5; 3]),
            ([0.1307; 3], [0.3081; 3]),
            ([0.0; 3], [1.0; 3]),
            ([-3.0, 100.0, 1e-3], [1e-3, 70.0, -2.0]),
        ];
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut unit = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32
        };
        for _ in 0..300 {
            norms.push(([unit(), unit(), unit()], [0.01 + unit(), 0.01 + unit(), 0.01 + unit()]));
        }
        for (mean, std) in norms {
            let lut = normalize_table(mean, std);
            let norm = Norm { mean, std };
            assert_eq!(simd_arith(&lut, &norm), Some(Arith::MulAdd), "{mean:?} {std:?}");
            assert!(simd_exact(&lut, &norm, Arith::Divide), "{mean:?} {std:?}");
        }
    }

    #[test]
    fn a_table_the_kernel_misses_by_one_ulp_is_refused() {
        if !has_kernel() {
            return;
        }
        let (mean, std) = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
        let norm = Norm { mean, std };
        for (c, v) in [(0, 0), (1, 77), (2, 255)] {
            let mut lut = normalize_table(mean, std);
            lut[c][v] = f32::from_bits(lut[c][v].to_bits() + 1);
            assert_eq!(simd_arith(&lut, &norm), None, "channel {c} value {v}");
        }
    }
}
