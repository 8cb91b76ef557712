//! Vector kernels of [`TransformPlan::write`](super::TransformPlan::write): flip, RGB
//! deinterleave (NCHW) or pass-through (NHWC), normalisation and the dtype conversion, eight
//! pixels per step.
//!
//! Exactness: the portable path looks values up in [`normalize_table`](super::normalize_table),
//! `(v as f32 / 255.0 - mean) / std`. The AVX2 kernel does the same three IEEE operations
//! (divide, subtract, divide, each correctly rounded, no fused multiply-add) on eight lanes, so
//! it produces the same bits; [`simd_matches_table`] checks this for all 3 x 256 values when a
//! plan is compiled, and the plan keeps the portable path if it ever differs. The float16
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

/// Whether the AVX2 kernel's arithmetic gives exactly `lut` (and, for float16, exactly
/// `half::f16::from_f32` of it) for every channel and byte value. False when the CPU lacks
/// AVX2 or F16C.
pub(crate) fn simd_matches_table(lut: &[[f32; 256]; 3], norm: &Norm) -> bool {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c") {
        // SAFETY: AVX2 and F16C were detected just above.
        return unsafe { check_avx2(lut, norm) };
    }
    let _ = (lut, norm);
    false
}

/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn check_avx2(lut: &[[f32; 256]; 3], norm: &Norm) -> bool {
    use std::arch::x86_64::*;
    for (c, table) in lut.iter().enumerate() {
        for v0 in (0..256).step_by(8) {
            let i = _mm256_setr_epi32(v0, v0 + 1, v0 + 2, v0 + 3, v0 + 4, v0 + 5, v0 + 6, v0 + 7);
            let f = _mm256_div_ps(
                _mm256_sub_ps(
                    _mm256_div_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(255.0)),
                    _mm256_set1_ps(norm.mean[c]),
                ),
                _mm256_set1_ps(norm.std[c]),
            );
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
/// The CPU must support AVX2 and F16C, and [`simd_matches_table`] must hold for `lut` and
/// `norm` for the result to equal the portable path's (memory safety does not depend on it).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn write_avx2<const D: u8>(
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
        }
    }
    // SAFETY: each array is 16 bytes (masks) or 8 f32 (32 bytes); unaligned loads.
    let (mlo, mhi, mean, std) = unsafe {
        (
            [0, 1, 2].map(|k| _mm_loadu_si128(mlo[k].as_ptr().cast())),
            [0, 1, 2].map(|k| _mm_loadu_si128(mhi[k].as_ptr().cast())),
            [0, 1, 2].map(|k| _mm256_loadu_ps(mean[k].as_ptr())),
            [0, 1, 2].map(|k| _mm256_loadu_ps(std[k].as_ptr())),
        )
    };
    let inv = _mm256_set1_ps(255.0);
    let plane = h * w;
    let blocks = w / 8;
    let src = hwc.as_ptr();
    let dst = out.as_mut_ptr();
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
                // which `out` holds (checked above); unaligned stores.
                unsafe {
                    let o = dst.add(e * esize);
                    if D == OUT_U8 {
                        _mm_storel_epi64(o.cast(), bytes);
                    } else {
                        let f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
                        let f = _mm256_div_ps(_mm256_sub_ps(_mm256_div_ps(f, inv), mean[k]), std[k]);
                        if D == OUT_F16 {
                            _mm_storeu_si128(o.cast(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(f));
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
}
