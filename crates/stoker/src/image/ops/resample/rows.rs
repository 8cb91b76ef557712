//! The resampler's row kernels: one row (or two, or four) of the horizontal pass and one row
//! of the vertical pass, in plain Rust and with SSE4.1, AVX2 and AVX-512BW, all giving the same
//! bytes from the same fixed-point weights ([`Coeffs`]).

use super::{grow, Coeffs, PRECISION_BITS};

#[inline(always)]
pub(super) fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One output pixel of the horizontal pass: taps `px` (RGB8) weighted by `k`.
#[inline(always)]
pub(super) fn pixel_scalar(px: &[u8], k: &[i32]) -> [u8; 3] {
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
pub(super) fn horizontal_row_scalar(row: &[u8], c: &Coeffs, out: &mut [u8]) {
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
pub(super) unsafe fn horizontal_row_sse41(row: &[u8], c: &Coeffs, out: &mut [u8]) {
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

/// The horizontal weights rearranged for the `vpmaddwd` kernel. Each 22-bit weight `w` is
/// split as `w = hi * 2^11 + lo` with `0 <= lo < 2^11`, both fitting `i16`, so that
/// `sum(p * w) = (sum(p * hi) << 11) + sum(p * lo)` exactly (no sum overflows `i32`: the
/// portable path's own sum is below 2^31 and these are smaller), and `vpmaddwd` does two taps
/// of three channels per instruction.
///
/// Per output pixel and pair of taps `(t0, t1)`: a 128-bit vector of eight words
/// `[hi0 hi1 hi0 hi1 hi0 hi1 0 0]` repeated for each 128-bit lane (one lane per image row),
/// then the same for `lo`. Taps past a window's end have weight 0.
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) struct MaddWeights {
    /// Pairs of taps per output pixel (`ceil(max taps / 2)`).
    pairs: usize,
    /// 128-bit lanes each vector is repeated in.
    lanes: usize,
    w: Vec<i16>,
    /// Per output pixel, the byte offset of its window's first pixel in a row (`start * 3`).
    offs: Vec<usize>,
    /// The row length in bytes the kernels read (`len`), and how many leading output pixels
    /// (`fast`) have every 16-byte load of their window inside such a row: the kernels take
    /// those without a check, the others the portable way.
    len: usize,
    fast: usize,
}

/// A 22-bit weight as `(hi, lo)` with `w = hi * 2^11 + lo` and `0 <= lo < 2^11` (see
/// [`MaddWeights`]; the vertical kernel splits its weights the same way).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) fn weight_halves(w: i32) -> (i16, i16) {
    ((w >> 11) as i16, (w & 2047) as i16)
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl MaddWeights {
    /// Builds the weights of `c` for `lanes` rows per vector and rows of `len` bytes.
    pub(super) fn build(&mut self, c: &Coeffs, lanes: usize, len: usize) {
        let maxn = c.bounds.iter().map(|b| b.1).max().unwrap_or(0);
        let pairs = maxn.div_ceil(2).max(1);
        self.pairs = pairs;
        self.lanes = lanes;
        self.len = len;
        // Bytes read from a window's first pixel: 16-byte loads at pixels 0, 4, 8, ...
        let reach = 12 * (pairs.div_ceil(2) - 1) + 16;
        self.offs.clear();
        self.offs.extend(c.bounds.iter().map(|&(start, _)| start * 3));
        self.fast = self.offs.iter().position(|&o| o + reach > len).unwrap_or(self.offs.len());
        let per = 16 * lanes;
        grow(&mut self.w, c.bounds.len() * pairs * per, 0);
        for (xx, &(_, n)) in c.bounds.iter().enumerate() {
            let k = &c.k[xx * c.ksize..xx * c.ksize + n];
            for q in 0..pairs {
                let w0 = k.get(2 * q).copied().unwrap_or(0);
                let w1 = k.get(2 * q + 1).copied().unwrap_or(0);
                let ((h0, l0), (h1, l1)) = (weight_halves(w0), weight_halves(w1));
                let hv = [h0, h1, h0, h1, h0, h1, 0, 0];
                let lv = [l0, l1, l0, l1, l0, l1, 0, 0];
                let base = (xx * pairs + q) * per;
                for l in 0..lanes {
                    self.w[base + 8 * l..base + 8 * l + 8].copy_from_slice(&hv);
                    self.w[base + 8 * (lanes + l)..base + 8 * (lanes + l) + 8].copy_from_slice(&lv);
                }
            }
        }
    }
}

/// The byte shuffles of the `vpmaddwd` horizontal kernels, per 128-bit lane (one row): from 16
/// bytes loaded at a window's pixel, taps 0-1 (`PAIR0`) or 2-3 (`PAIR1`) as the words
/// `[r0 r1 g0 g1 b0 b1 0 0]`; -128 gives a zero byte.
#[cfg(target_arch = "x86_64")]
pub(super) const PAIR0: [i8; 16] = [0, -128, 3, -128, 1, -128, 4, -128, 2, -128, 5, -128, -128, -128, -128, -128];
#[cfg(target_arch = "x86_64")]
pub(super) const PAIR1: [i8; 16] = [6, -128, 9, -128, 7, -128, 10, -128, 8, -128, 11, -128, -128, -128, -128, -128];

/// Per 128-bit lane, the twelve bytes `[r g b]` of four pixels out of the sixteen `[r g b 0]`
/// the packs give; -128 gives a zero byte.
#[cfg(target_arch = "x86_64")]
pub(super) const RGB12: [i8; 16] = [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -128, -128, -128, -128];

/// Two rows of the horizontal pass at once with AVX2 and `vpmaddwd` (see [`MaddWeights`]):
/// row A in the low 128-bit lane, row B in the high one; one 16-byte load per row covers four
/// taps, a byte shuffle puts a pair of taps as words `[r0 r1 g0 g1 b0 b1 0 0]`, and two
/// `vpmaddwd` (high and low weight halves) accumulate them. Output pixels go four at a time:
/// their sums are narrowed together (saturating packs, as `clip8`) and stored as 12 bytes per
/// row. Exactly the portable path's integer result. `P` is the number of pairs (`mw.pairs`),
/// or 0 for "read it at run time".
///
/// # Safety
/// The CPU must support AVX2; `mw` must be built from `c` with 2 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal_rows2_madd<const P: usize>(
    row_a: &[u8],
    row_b: &[u8],
    c: &Coeffs,
    mw: &MaddWeights,
    out_a: &mut [u8],
    out_b: &mut [u8],
) {
    use std::arch::x86_64::*;
    let pairs = if P == 0 { mw.pairs } else { P };
    let len = row_a.len();
    let dw = c.bounds.len();
    assert!(pairs == mw.pairs && mw.lanes == 2 && mw.w.len() >= dw * pairs * 32);
    assert!(row_b.len() == len && mw.len == len && mw.offs.len() == dw && mw.fast <= dw);
    assert!(out_a.len() >= dw * 3 && out_b.len() >= dw * 3);
    let loads = pairs.div_ceil(2);
    // SAFETY: three 16-byte arrays.
    let (p0, p1, p12) = unsafe {
        (
            _mm_loadu_si128(PAIR0.as_ptr().cast()),
            _mm_loadu_si128(PAIR1.as_ptr().cast()),
            _mm_loadu_si128(RGB12.as_ptr().cast()),
        )
    };
    let (sh0, sh1, rgb12) =
        (_mm256_broadcastsi128_si256(p0), _mm256_broadcastsi128_si256(p1), _mm256_broadcastsi128_si256(p12));
    let half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    let (pa, pb) = (row_a.as_ptr(), row_b.as_ptr());
    let (oa, ob) = (out_a.as_mut_ptr(), out_b.as_mut_ptr());
    let wbase = mw.w.as_ptr();
    let offs = mw.offs.as_ptr();
    // Output pixel xx's sums shifted down: [a_r a_g a_b 0 | b_r b_g b_b 0].
    let pixel = |xx: usize| -> __m256i {
        // SAFETY: xx < mw.fast, so its window's loads, at offs[xx] + 12 g + 16 <= offs[xx] +
        // reach <= len for g < loads, are inside both rows (`MaddWeights::build`); its weights
        // are the 32 * pairs words at xx * pairs * 32 (length asserted above).
        unsafe {
            let off = *offs.add(xx);
            let wp = wbase.add(xx * pairs * 32);
            let mut ah = _mm256_setzero_si256();
            let mut al = half;
            for g in 0..loads {
                let o = off + 12 * g;
                let v = _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_loadu_si128(pa.add(o).cast())),
                    _mm_loadu_si128(pb.add(o).cast()),
                );
                let q = 2 * g;
                let x = _mm256_shuffle_epi8(v, sh0);
                ah = _mm256_add_epi32(ah, _mm256_madd_epi16(x, _mm256_loadu_si256(wp.add(q * 32).cast())));
                al = _mm256_add_epi32(al, _mm256_madd_epi16(x, _mm256_loadu_si256(wp.add(q * 32 + 16).cast())));
                if q + 1 < pairs {
                    let x = _mm256_shuffle_epi8(v, sh1);
                    ah = _mm256_add_epi32(ah, _mm256_madd_epi16(x, _mm256_loadu_si256(wp.add(q * 32 + 32).cast())));
                    al = _mm256_add_epi32(al, _mm256_madd_epi16(x, _mm256_loadu_si256(wp.add(q * 32 + 48).cast())));
                }
            }
            _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(_mm256_add_epi32(_mm256_slli_epi32::<11>(ah), al))
        }
    };
    let fast = mw.fast;
    let mut xx = 0;
    while xx + 4 <= fast {
        let (s0, s1, s2, s3) = (pixel(xx), pixel(xx + 1), pixel(xx + 2), pixel(xx + 3));
        // Per lane: bytes [p0 r g b 0, p1, p2, p3] with the saturation of clip8, then the
        // twelve bytes of the four pixels.
        let bytes = _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3));
        let rgb = _mm256_shuffle_epi8(bytes, rgb12);
        let (lo, hi) = (_mm256_castsi256_si128(rgb), _mm256_extracti128_si256::<1>(rgb));
        let at = xx * 3;
        // SAFETY: xx + 4 <= dw, so bytes at..at + 12 are inside both outputs (asserted); a
        // 16-byte store is used only when its last 4 (zero) bytes are too, and they belong to
        // pixels written later.
        unsafe {
            if at + 16 <= dw * 3 {
                _mm_storeu_si128(oa.add(at).cast(), lo);
                _mm_storeu_si128(ob.add(at).cast(), hi);
            } else {
                _mm_storel_epi64(oa.add(at).cast(), lo);
                _mm_storel_epi64(ob.add(at).cast(), hi);
                std::ptr::write_unaligned(oa.add(at + 8).cast::<i32>(), _mm_extract_epi32::<2>(lo));
                std::ptr::write_unaligned(ob.add(at + 8).cast::<i32>(), _mm_extract_epi32::<2>(hi));
            }
        }
        xx += 4;
    }
    for xx in xx..dw {
        if xx < fast {
            let s = _mm256_packus_epi16(_mm256_packs_epi32(pixel(xx), half), half);
            let v = _mm256_extract_epi32::<0>(s).to_le_bytes();
            let w = _mm256_extract_epi32::<4>(s).to_le_bytes();
            out_a[xx * 3..xx * 3 + 3].copy_from_slice(&v[..3]);
            out_b[xx * 3..xx * 3 + 3].copy_from_slice(&w[..3]);
        } else {
            let (start, n) = c.bounds[xx];
            let k = &c.k[xx * c.ksize..xx * c.ksize + n];
            out_a[xx * 3..xx * 3 + 3].copy_from_slice(&pixel_scalar(&row_a[start * 3..(start + n) * 3], k));
            out_b[xx * 3..xx * 3 + 3].copy_from_slice(&pixel_scalar(&row_b[start * 3..(start + n) * 3], k));
        }
    }
}

/// Four rows of the horizontal pass at once with AVX-512BW: [`horizontal_rows2_madd`] with a
/// row in each 128-bit lane of a 512-bit vector (`mw` built with 4 lanes), the same shuffles and
/// `vpmaddwd` pairs, so the same integers, and the same narrowing of four output pixels at a
/// time (saturating packs, as `clip8`). `P` as there.
///
/// # Safety
/// The CPU must support AVX-512F and AVX-512BW; `mw` must be built from `c` with 4 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn horizontal_rows4_madd<const P: usize>(
    rows: [&[u8]; 4],
    c: &Coeffs,
    mw: &MaddWeights,
    mut outs: [&mut [u8]; 4],
) {
    use std::arch::x86_64::*;
    let pairs = if P == 0 { mw.pairs } else { P };
    let len = rows[0].len();
    let dw = c.bounds.len();
    assert!(pairs == mw.pairs && mw.lanes == 4 && mw.w.len() >= dw * pairs * 64);
    assert!(mw.len == len && mw.offs.len() == dw && mw.fast <= dw);
    assert!(rows.iter().all(|r| r.len() == len) && outs.iter().all(|o| o.len() >= dw * 3));
    let loads = pairs.div_ceil(2);
    // SAFETY: three 16-byte arrays.
    let (p0, p1, p12) = unsafe {
        (
            _mm_loadu_si128(PAIR0.as_ptr().cast()),
            _mm_loadu_si128(PAIR1.as_ptr().cast()),
            _mm_loadu_si128(RGB12.as_ptr().cast()),
        )
    };
    let (sh0, sh1, rgb12) = (_mm512_broadcast_i32x4(p0), _mm512_broadcast_i32x4(p1), _mm512_broadcast_i32x4(p12));
    let half = _mm512_set1_epi32(1 << (PRECISION_BITS - 1));
    let p = rows.map(|r| r.as_ptr());
    let o = outs.each_mut().map(|o| o.as_mut_ptr());
    let wbase = mw.w.as_ptr();
    let offs = mw.offs.as_ptr();
    // Output pixel xx's sums shifted down: lane l is [r g b 0] of row l.
    let pixel = |xx: usize| -> __m512i {
        // SAFETY: xx < mw.fast, so its window's loads, at offs[xx] + 12 g + 16 <= offs[xx] +
        // reach <= len for g < loads, are inside all four rows (`MaddWeights::build`); its
        // weights are the 64 * pairs words at xx * pairs * 64 (length asserted above).
        unsafe {
            let off = *offs.add(xx);
            let wp = wbase.add(xx * pairs * 64);
            let mut ah = _mm512_setzero_si512();
            let mut al = half;
            for g in 0..loads {
                let at = off + 12 * g;
                let v = _mm512_castsi128_si512(_mm_loadu_si128(p[0].add(at).cast()));
                let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(p[1].add(at).cast()));
                let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(p[2].add(at).cast()));
                let v = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(p[3].add(at).cast()));
                let q = 2 * g;
                let x = _mm512_shuffle_epi8(v, sh0);
                ah = _mm512_add_epi32(ah, _mm512_madd_epi16(x, _mm512_loadu_si512(wp.add(q * 64).cast())));
                al = _mm512_add_epi32(al, _mm512_madd_epi16(x, _mm512_loadu_si512(wp.add(q * 64 + 32).cast())));
                if q + 1 < pairs {
                    let x = _mm512_shuffle_epi8(v, sh1);
                    ah = _mm512_add_epi32(ah, _mm512_madd_epi16(x, _mm512_loadu_si512(wp.add(q * 64 + 64).cast())));
                    al = _mm512_add_epi32(al, _mm512_madd_epi16(x, _mm512_loadu_si512(wp.add(q * 64 + 96).cast())));
                }
            }
            _mm512_srai_epi32::<{ PRECISION_BITS }>(_mm512_add_epi32(_mm512_slli_epi32::<11>(ah), al))
        }
    };
    let fast = mw.fast;
    let mut xx = 0;
    while xx + 4 <= fast {
        let (s0, s1, s2, s3) = (pixel(xx), pixel(xx + 1), pixel(xx + 2), pixel(xx + 3));
        // Per lane (row): the twelve bytes of the four pixels, saturated as clip8.
        let bytes = _mm512_packus_epi16(_mm512_packs_epi32(s0, s1), _mm512_packs_epi32(s2, s3));
        let rgb = _mm512_shuffle_epi8(bytes, rgb12);
        let lanes = [
            _mm512_castsi512_si128(rgb),
            _mm512_extracti32x4_epi32::<1>(rgb),
            _mm512_extracti32x4_epi32::<2>(rgb),
            _mm512_extracti32x4_epi32::<3>(rgb),
        ];
        let at = xx * 3;
        for (&out, lane) in o.iter().zip(lanes) {
            // SAFETY: xx + 4 <= dw, so bytes at..at + 12 are inside every output (asserted); a
            // 16-byte store is used only when its last 4 (zero) bytes are too, and they belong
            // to pixels written later.
            unsafe {
                if at + 16 <= dw * 3 {
                    _mm_storeu_si128(out.add(at).cast(), lane);
                } else {
                    _mm_storel_epi64(out.add(at).cast(), lane);
                    std::ptr::write_unaligned(out.add(at + 8).cast::<i32>(), _mm_extract_epi32::<2>(lane));
                }
            }
        }
        xx += 4;
    }
    for xx in xx..dw {
        if xx < fast {
            let bytes = _mm512_packus_epi16(_mm512_packs_epi32(pixel(xx), half), half);
            // Lane l's first four bytes: row l's [r g b 0].
            let mut v = [0u32; 16];
            // SAFETY: 64 bytes into a 64-byte array.
            unsafe { _mm512_storeu_si512(v.as_mut_ptr().cast(), bytes) };
            for (l, out) in outs.iter_mut().enumerate() {
                out[xx * 3..xx * 3 + 3].copy_from_slice(&v[4 * l].to_le_bytes()[..3]);
            }
        } else {
            let (start, n) = c.bounds[xx];
            let k = &c.k[xx * c.ksize..xx * c.ksize + n];
            for (row, out) in rows.iter().zip(outs.iter_mut()) {
                out[xx * 3..xx * 3 + 3].copy_from_slice(&pixel_scalar(&row[start * 3..(start + n) * 3], k));
            }
        }
    }
}

/// [`horizontal_rows4_madd`] specialised for the common pair counts.
///
/// # Safety
/// As [`horizontal_rows4_madd`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn horizontal_rows4_avx512(rows: [&[u8]; 4], c: &Coeffs, mw: &MaddWeights, outs: [&mut [u8]; 4]) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match mw.pairs {
            1 => horizontal_rows4_madd::<1>(rows, c, mw, outs),
            2 => horizontal_rows4_madd::<2>(rows, c, mw, outs),
            3 => horizontal_rows4_madd::<3>(rows, c, mw, outs),
            4 => horizontal_rows4_madd::<4>(rows, c, mw, outs),
            _ => horizontal_rows4_madd::<0>(rows, c, mw, outs),
        }
    }
}

/// [`horizontal_rows2_madd`] specialised for the common pair counts.
///
/// # Safety
/// As [`horizontal_rows2_madd`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn horizontal_rows2_avx2(
    row_a: &[u8],
    row_b: &[u8],
    c: &Coeffs,
    mw: &MaddWeights,
    out_a: &mut [u8],
    out_b: &mut [u8],
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match mw.pairs {
            1 => horizontal_rows2_madd::<1>(row_a, row_b, c, mw, out_a, out_b),
            2 => horizontal_rows2_madd::<2>(row_a, row_b, c, mw, out_a, out_b),
            3 => horizontal_rows2_madd::<3>(row_a, row_b, c, mw, out_a, out_b),
            4 => horizontal_rows2_madd::<4>(row_a, row_b, c, mw, out_a, out_b),
            _ => horizontal_rows2_madd::<0>(row_a, row_b, c, mw, out_a, out_b),
        }
    }
}

/// One output row of the vertical pass: `out[j] = clip8(sum_t w_t * rows[start + t][j])` for
/// `j < row_len`, row `r` starting at byte `r * stride` of `tmp` (`stride >= row_len`).
#[inline(always)]
pub(super) fn vertical_row_generic(
    tmp: &[u8],
    stride: usize,
    row_len: usize,
    start: usize,
    k: &[i32],
    acc: &mut [i32],
    out: &mut [u8],
) {
    let acc = &mut acc[..row_len];
    acc.fill(1 << (PRECISION_BITS - 1));
    for (t, &w) in k.iter().enumerate() {
        let src = &tmp[(start + t) * stride..(start + t) * stride + row_len];
        for (a, &p) in acc.iter_mut().zip(src) {
            *a += p as i32 * w;
        }
    }
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = clip8(a);
    }
}

/// Most taps [`vertical_row_avx2`] keeps in registers; longer windows (downscaling by more
/// than ~30x) take the generic loop.
pub(super) const VERTICAL_MAX_PAIRS: usize = 32;

/// One output row of the vertical pass, as [`vertical_row_generic`], 32 bytes at a time with
/// `vpmaddwd`: the weights split into 11-bit halves as in [`MaddWeights`], two source rows'
/// bytes interleaved as words so that one `vpmaddwd` does two taps of eight bytes, and the
/// sums kept in registers over all taps (the generic loop stores them after every tap and
/// multiplies with `vpmulld`). Exactly the generic path's integer result (the argument of
/// [`MaddWeights`]). The last `row_len % 32` bytes take the scalar loop.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn vertical_row_avx2(
    tmp: &[u8],
    stride: usize,
    row_len: usize,
    start: usize,
    k: &[i32],
    acc: &mut [i32],
    out: &mut [u8],
) {
    use std::arch::x86_64::*;
    let n = k.len();
    let pairs = n / 2;
    if n.div_ceil(2) > VERTICAL_MAX_PAIRS {
        return vertical_row_generic(tmp, stride, row_len, start, k, acc, out);
    }
    assert!(
        n > 0 && stride >= row_len && (start + n - 1) * stride + row_len <= tmp.len() && out.len() >= row_len,
        "vertical_row_avx2: rows out of range"
    );
    // Per pair of taps (and the odd last tap, paired with weight 0): the high and the low
    // weight halves as two i16 in an i32.
    let split = |a: i32, b: i32| {
        let ((ha, la), (hb, lb)) = (weight_halves(a), weight_halves(b));
        let pack = |x: i16, y: i16| (x as u16 as u32 | (y as u16 as u32) << 16) as i32;
        (pack(ha, hb), pack(la, lb))
    };
    let mut w = [(0i32, 0i32); VERTICAL_MAX_PAIRS];
    for (q, wq) in w.iter_mut().enumerate().take(n.div_ceil(2)) {
        *wq = split(k[2 * q], k.get(2 * q + 1).copied().unwrap_or(0));
    }
    let half = _mm256_set1_epi32(1 << (PRECISION_BITS - 1));
    let rows = tmp[start * stride..(start + n - 1) * stride + row_len].as_ptr();
    let finish = |h: __m256i, l: __m256i| {
        _mm256_srai_epi32::<{ PRECISION_BITS as i32 }>(_mm256_add_epi32(
            _mm256_add_epi32(_mm256_slli_epi32::<11>(h), l),
            half,
        ))
    };
    let mut j = 0;
    while j + 32 <= row_len {
        let z = _mm256_setzero_si256();
        // Accumulators for bytes [j..j+4 | j+8..j+12], [j+4..j+8 | j+12..j+16], and the same
        // 16 bytes further; high and low weight halves apart.
        let (mut h, mut l) = ([z; 4], [z; 4]);
        let mut add = |r0: __m256i, r1: __m256i, s: usize, (wh, wl): (i32, i32)| {
            let (vh, vl) = (_mm256_set1_epi32(wh), _mm256_set1_epi32(wl));
            let (lo, hi) = (_mm256_unpacklo_epi16(r0, r1), _mm256_unpackhi_epi16(r0, r1));
            h[s] = _mm256_add_epi32(h[s], _mm256_madd_epi16(lo, vh));
            l[s] = _mm256_add_epi32(l[s], _mm256_madd_epi16(lo, vl));
            h[s + 1] = _mm256_add_epi32(h[s + 1], _mm256_madd_epi16(hi, vh));
            l[s + 1] = _mm256_add_epi32(l[s + 1], _mm256_madd_epi16(hi, vl));
        };
        for (q, &wq) in w.iter().enumerate().take(pairs) {
            // SAFETY: rows 2q and 2q + 1 < n of the window, bytes j..j + 32 <= row_len of each:
            // inside `tmp` (asserted above).
            let (a0, a1, b0, b1) = unsafe {
                let p = rows.add(2 * q * stride + j);
                (
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast())),
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16).cast())),
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(stride).cast())),
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(stride + 16).cast())),
                )
            };
            add(a0, b0, 0, wq);
            add(a1, b1, 2, wq);
        }
        if n % 2 == 1 {
            // SAFETY: row n - 1 of the window, bytes j..j + 32: as above.
            let (a0, a1) = unsafe {
                let p = rows.add((n - 1) * stride + j);
                (
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast())),
                    _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(16).cast())),
                )
            };
            add(a0, z, 0, w[pairs]);
            add(a1, z, 2, w[pairs]);
        }
        for half16 in 0..2 {
            let s = 2 * half16;
            // Words [j..j+8 | j+8..j+16], then 16 bytes with the saturation of clip8.
            let words = _mm256_packs_epi32(finish(h[s], l[s]), finish(h[s + 1], l[s + 1]));
            let bytes = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256::<1>(words));
            // SAFETY: j + 16 * half16 + 16 <= row_len <= out.len() (asserted above).
            unsafe { _mm_storeu_si128(out.as_mut_ptr().add(j + 16 * half16).cast(), bytes) };
        }
        j += 32;
    }
    for (x, o) in out[..row_len].iter_mut().enumerate().skip(j) {
        let mut a = 1 << (PRECISION_BITS - 1);
        for (t, &wt) in k.iter().enumerate() {
            a += tmp[(start + t) * stride + x] as i32 * wt;
        }
        *o = clip8(a);
    }
}
