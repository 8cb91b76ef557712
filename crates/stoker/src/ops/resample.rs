//! Antialiased bilinear resampling of RGB8, bit-compatible with Pillow's `Image.resize(...,
//! BILINEAR)` (which torchvision's `antialias=True` PIL path calls): the same coefficient
//! computation, the same 22-bit fixed point, the same horizontal-then-vertical order with an
//! 8-bit intermediate.
//!
//! It resamples a *box* of the source straight to the output, so `Resize` + `CenterCrop` and
//! `RandomResizedCrop` cost one pass over only the pixels they need. A box can be *soft* (a
//! window into a resize of the whole image: the filter may read neighbours outside the box, as
//! resizing first then cropping does) or *hard* (crop first, then resize: the filter is clipped
//! at the box, as `img.crop(box).resize(size)` does).
//!
//! All buffers are reused: after warm-up a call allocates nothing. The horizontal pass uses
//! SSE4.1 and the vertical pass AVX2 when the CPU has them (checked at run time).

/// Fixed-point precision of the coefficients, as Pillow's `PRECISION_BITS` for 8-bit images.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Per-output-pixel filter windows and fixed-point weights for one axis.
#[derive(Debug, Default)]
struct Coeffs {
    /// `(first input index, taps)` per output pixel.
    bounds: Vec<(usize, usize)>,
    /// `ksize` weights per output pixel (unused tail zero).
    k: Vec<i32>,
    ksize: usize,
    pre: Vec<f64>,
}

fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

impl Coeffs {
    /// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for an input axis of `in_size`
    /// pixels, the box `[in0, in1)` and `out_size` outputs.
    fn compute(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        let scale = (in1 - in0) / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filterscale; // bilinear support is 1.0
        let ksize = support.ceil() as usize * 2 + 1;
        self.ksize = ksize;
        self.bounds.clear();
        if self.bounds.capacity() < out_size {
            self.bounds.reserve_exact(out_size.next_power_of_two());
        }
        self.pre.clear();
        grow(&mut self.pre, out_size * ksize, 0.0);
        self.k.clear();
        grow(&mut self.k, out_size * ksize, 0);
        let ss = 1.0 / filterscale;
        for xx in 0..out_size {
            let center = in0 + (xx as f64 + 0.5) * scale;
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(xmin as i64) as usize - xmin;
            let k = &mut self.pre[xx * ksize..(xx + 1) * ksize];
            let mut ww = 0.0;
            for (x, kx) in k.iter_mut().enumerate().take(xmax) {
                let w = bilinear((x as f64 + xmin as f64 - center + 0.5) * ss);
                *kx = w;
                ww += w;
            }
            if ww != 0.0 {
                for kx in k.iter_mut().take(xmax) {
                    *kx /= ww;
                }
            }
            self.bounds.push((xmin, xmax));
        }
        let one = (1i64 << PRECISION_BITS) as f64;
        for (d, &p) in self.k.iter_mut().zip(&self.pre) {
            *d = if p < 0.0 { (-0.5 + p * one) as i32 } else { (0.5 + p * one) as i32 };
        }
    }
}

/// Resizes `v` to `n` elements, growing its capacity to a power of two so that a stream of
/// slightly different sizes reallocates only a logarithmic number of times.
pub(crate) fn grow<T: Clone>(v: &mut Vec<T>, n: usize, fill: T) {
    if v.capacity() < n {
        v.reserve_exact(n.next_power_of_two() - v.len());
    }
    v.resize(n, fill);
}

#[inline(always)]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One output pixel of the horizontal pass: taps `px` (RGB8) weighted by `k`.
#[inline(always)]
fn pixel_scalar(px: &[u8], k: &[i32]) -> [u8; 3] {
    let half = 1i32 << (PRECISION_BITS - 1);
    let (mut r, mut g, mut b) = (half, half, half);
    for (p, &w) in px.chunks_exact(3).zip(k) {
        r += p[0] as i32 * w;
        g += p[1] as i32 * w;
        b += p[2] as i32 * w;
    }
    [clip8(r), clip8(g), clip8(b)]
}

/// One row of the horizontal pass, portable version.
fn horizontal_row_scalar(row: &[u8], c: &Coeffs, out: &mut [u8]) {
    for (xx, (&(start, n), o)) in c.bounds.iter().zip(out.chunks_exact_mut(3)).enumerate() {
        o.copy_from_slice(&pixel_scalar(&row[start * 3..(start + n) * 3], &c.k[xx * c.ksize..xx * c.ksize + n]));
    }
}

/// One row of the horizontal pass with SSE4.1: a pixel's three channels (plus one ignored
/// byte) in one vector, one multiply-add per tap.
///
/// # Safety
/// The CPU must support SSE4.1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.1")]
unsafe fn horizontal_row_sse41(row: &[u8], c: &Coeffs, out: &mut [u8]) {
    use std::arch::x86_64::*;
    let half = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
    for (xx, (&(start, n), o)) in c.bounds.iter().zip(out.chunks_exact_mut(3)).enumerate() {
        // Each tap loads 4 bytes; the last tap of the row's last pixel would read one byte past
        // the row's slice, so such windows take the portable path.
        if (start + n) * 3 + 1 > row.len() {
            o.copy_from_slice(&pixel_scalar(&row[start * 3..(start + n) * 3], &c.k[xx * c.ksize..xx * c.ksize + n]));
            continue;
        }
        let k = &c.k[xx * c.ksize..xx * c.ksize + n];
        let mut acc = half;
        let base = row.as_ptr();
        for (t, &w) in k.iter().enumerate() {
            // SAFETY: (start + t) * 3 + 4 <= (start + n) * 3 + 1 <= row.len(), checked above.
            let v = unsafe { std::ptr::read_unaligned(base.add((start + t) * 3).cast::<i32>()) };
            let px = _mm_cvtepu8_epi32(_mm_cvtsi32_si128(v));
            acc = _mm_add_epi32(acc, _mm_mullo_epi32(px, _mm_set1_epi32(w)));
        }
        let shifted = _mm_srai_epi32(acc, PRECISION_BITS as i32);
        let packed = _mm_packus_epi16(_mm_packs_epi32(shifted, shifted), _mm_setzero_si128());
        let bytes = (_mm_cvtsi128_si32(packed) as u32).to_le_bytes();
        o.copy_from_slice(&bytes[..3]);
    }
}

/// Two rows of the horizontal pass at once with AVX2: both rows share the windows and weights,
/// so each tap is one 8-lane multiply-add (`[r, g, b, _]` of row A and of row B). Same integer
/// arithmetic as the portable path, so the result is identical.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn horizontal_rows2_avx2(row_a: &[u8], row_b: &[u8], c: &Coeffs, out_a: &mut [u8], out_b: &mut [u8]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(row_a.len(), row_b.len());
    let half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    let (pa, pb) = (row_a.as_ptr(), row_b.as_ptr());
    for (xx, ((&(start, n), oa), ob)) in
        c.bounds.iter().zip(out_a.chunks_exact_mut(3)).zip(out_b.chunks_exact_mut(3)).enumerate()
    {
        let k = &c.k[xx * c.ksize..xx * c.ksize + n];
        if (start + n) * 3 + 1 > row_a.len() {
            oa.copy_from_slice(&pixel_scalar(&row_a[start * 3..(start + n) * 3], k));
            ob.copy_from_slice(&pixel_scalar(&row_b[start * 3..(start + n) * 3], k));
            continue;
        }
        let mut acc = half;
        for (t, &w) in k.iter().enumerate() {
            let off = (start + t) * 3;
            // SAFETY: off + 4 <= (start + n) * 3 + 1 <= len of both rows, checked above.
            let (va, vb) = unsafe {
                (
                    std::ptr::read_unaligned(pa.add(off).cast::<i32>()),
                    std::ptr::read_unaligned(pb.add(off).cast::<i32>()),
                )
            };
            let px = _mm256_cvtepu8_epi32(_mm_unpacklo_epi32(_mm_cvtsi32_si128(va), _mm_cvtsi32_si128(vb)));
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, _mm256_set1_epi32(w)));
        }
        let shifted = _mm256_srai_epi32(acc, PRECISION_BITS as i32);
        // [a_r a_g a_b _ | b_r b_g b_b _] -> saturating packs, as clip8 does.
        let lo = _mm256_castsi256_si128(shifted);
        let hi = _mm256_extracti128_si256(shifted, 1);
        let packed = _mm_packus_epi16(_mm_packs_epi32(lo, hi), _mm_setzero_si128());
        let v = _mm_cvtsi128_si64(packed) as u64;
        let bytes = v.to_le_bytes();
        oa.copy_from_slice(&bytes[..3]);
        ob.copy_from_slice(&bytes[4..7]);
    }
}

/// One output row of the vertical pass: `out[j] = clip8(sum_t w_t * rows[start + t][j])`.
#[inline(always)]
fn vertical_row_generic(tmp: &[u8], row_len: usize, start: usize, k: &[i32], acc: &mut [i32], out: &mut [u8]) {
    acc.fill(1 << (PRECISION_BITS - 1));
    for (t, &w) in k.iter().enumerate() {
        let src = &tmp[(start + t) * row_len..(start + t + 1) * row_len];
        for (a, &p) in acc.iter_mut().zip(src) {
            *a += p as i32 * w;
        }
    }
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = clip8(a);
    }
}

/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vertical_row_avx2(tmp: &[u8], row_len: usize, start: usize, k: &[i32], acc: &mut [i32], out: &mut [u8]) {
    vertical_row_generic(tmp, row_len, start, k, acc, out)
}

/// Reusable resampling state (coefficients, intermediate rows, accumulators, output).
#[derive(Debug, Default)]
pub struct BoxResampler {
    h: Coeffs,
    v: Coeffs,
    tmp: Vec<u8>,
    acc: Vec<i32>,
    sse41: bool,
    avx2: bool,
}

impl BoxResampler {
    /// A resampler using the best SIMD level this CPU has.
    pub fn new() -> Self {
        #[cfg(target_arch = "x86_64")]
        let (sse41, avx2) = (is_x86_feature_detected!("sse4.1"), is_x86_feature_detected!("avx2"));
        #[cfg(not(target_arch = "x86_64"))]
        let (sse41, avx2) = (false, false);
        BoxResampler { sse41, avx2, ..Default::default() }
    }

    /// The portable code path only (for testing the SIMD paths against it).
    pub fn portable() -> Self {
        BoxResampler::default()
    }

    /// Resamples the box `bbox = (left, top, width, height)` of `src` (`sw` x `sh` RGB8,
    /// rows of `sw * 3` bytes), with the filter clipped to `clip = [x0, y0, x1, y1]`, to a
    /// `dw` x `dh` RGB8 image written into `out` at `(dx, dy)` with rows of `out_stride` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn resample_into(
        &mut self,
        src: &[u8],
        sw: usize,
        bbox: [f64; 4],
        clip: [usize; 4],
        dw: usize,
        dh: usize,
        out: &mut [u8],
        dx: usize,
        dy: usize,
        out_stride: usize,
    ) {
        if dw == 0 || dh == 0 {
            return;
        }
        let [x0, y0, x1, y1] = clip;
        let (vw, vh) = (x1 - x0, y1 - y0);
        let [bx, by, bw, bh] = bbox;
        self.h.compute(vw, bx - x0 as f64, bx + bw - x0 as f64, dw);
        self.v.compute(vh, by - y0 as f64, by + bh - y0 as f64, dh);
        let first = self.v.bounds[0].0;
        let last = self.v.bounds.iter().map(|&(s, n)| s + n).max().unwrap_or(first);
        let row_len = dw * 3;
        let rows = last - first;
        grow(&mut self.tmp, rows * row_len, 0);
        // Horizontal pass over only the rows the vertical pass reads.
        let mut r0 = 0;
        #[cfg(target_arch = "x86_64")]
        if self.avx2 {
            while r0 + 2 <= rows {
                let (ya, yb) = (y0 + first + r0, y0 + first + r0 + 1);
                let row_a = &src[(ya * sw + x0) * 3..(ya * sw + x1) * 3];
                let row_b = &src[(yb * sw + x0) * 3..(yb * sw + x1) * 3];
                let (head, tail) = self.tmp[r0 * row_len..(r0 + 2) * row_len].split_at_mut(row_len);
                // SAFETY: AVX2 support was detected at construction.
                unsafe { horizontal_rows2_avx2(row_a, row_b, &self.h, head, tail) };
                r0 += 2;
            }
        }
        for r in r0..rows {
            let y = y0 + first + r;
            let row = &src[(y * sw + x0) * 3..(y * sw + x1) * 3];
            let dst = &mut self.tmp[r * row_len..(r + 1) * row_len];
            #[cfg(target_arch = "x86_64")]
            if self.sse41 {
                // SAFETY: SSE4.1 support was detected at construction.
                unsafe { horizontal_row_sse41(row, &self.h, dst) };
                continue;
            }
            horizontal_row_scalar(row, &self.h, dst);
        }
        // Vertical pass, straight into the output rows.
        grow(&mut self.acc, row_len, 0);
        for yy in 0..dh {
            let (start, n) = self.v.bounds[yy];
            let k = &self.v.k[yy * self.v.ksize..yy * self.v.ksize + n];
            let o = &mut out[(dy + yy) * out_stride + dx * 3..(dy + yy) * out_stride + dx * 3 + row_len];
            #[cfg(target_arch = "x86_64")]
            if self.avx2 {
                // SAFETY: AVX2 support was detected at construction.
                unsafe { vertical_row_avx2(&self.tmp, row_len, start - first, k, &mut self.acc, o) };
                continue;
            }
            vertical_row_generic(&self.tmp, row_len, start - first, k, &mut self.acc, o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3).map(|i| ((i * 37 + (i / 7) * 11) % 256) as u8).collect()
    }

    #[test]
    fn identity_is_a_copy() {
        let (w, h) = (13, 7);
        let src = image(w, h);
        let mut out = vec![0u8; w * h * 3];
        BoxResampler::new().resample_into(
            &src,
            w,
            [0.0, 0.0, w as f64, h as f64],
            [0, 0, w, h],
            w,
            h,
            &mut out,
            0,
            0,
            w * 3,
        );
        assert_eq!(out, src);
    }

    #[test]
    fn simd_paths_equal_the_portable_path() {
        let (w, h) = (97, 61);
        let src = image(w, h);
        for (bbox, clip, dw, dh) in [
            ([0.0, 0.0, 97.0, 61.0], [0, 0, 97, 61], 40, 30),
            ([3.5, 2.25, 50.0, 40.0], [0, 0, 97, 61], 33, 17),
            ([10.0, 5.0, 60.0, 50.0], [10, 5, 70, 55], 224, 224),
            ([0.0, 0.0, 97.0, 61.0], [0, 0, 97, 61], 97, 20),
        ] {
            let mut a = vec![0u8; dw * dh * 3];
            let mut b = a.clone();
            BoxResampler::new().resample_into(&src, w, bbox, clip, dw, dh, &mut a, 0, 0, dw * 3);
            BoxResampler::portable().resample_into(&src, w, bbox, clip, dw, dh, &mut b, 0, 0, dw * 3);
            assert_eq!(a, b, "{bbox:?}");
        }
    }

    #[test]
    fn coefficients_match_pillow_for_a_halving() {
        // Pillow, 4 -> 2 bilinear: support 2, out 0 centred at 1.0 reads inputs 0..3 with
        // weights 0.75, 0.75, 0.25 before normalisation.
        let mut c = Coeffs::default();
        c.compute(4, 0.0, 4.0, 2);
        assert_eq!(c.bounds, vec![(0, 3), (1, 3)]);
        let w = &c.pre[..3];
        assert!(
            (w[0] - 3.0 / 7.0).abs() < 1e-12 && (w[1] - 3.0 / 7.0).abs() < 1e-12 && (w[2] - 1.0 / 7.0).abs() < 1e-12,
            "{w:?}"
        );
    }
}
