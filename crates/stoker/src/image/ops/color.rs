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

/// [`luma`] by tables: the three products are exact in `f64`, so only the two sums (each
/// rounded to float32, as the fused adds are) remain per pixel.
struct Luma {
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
fn apply_luts(img: &mut [u8], luts: &[[u8; 256]; 3]) {
    for px in img.chunks_exact_mut(3) {
        px[0] = luts[0][px[0] as usize];
        px[1] = luts[1][px[1] as usize];
        px[2] = luts[2][px[2] as usize];
    }
}

/// float32 → uint8 as torch's `.clamp_(0, 255).to(torch.uint8)` (clamp, truncate).
#[inline(always)]
fn to_u8(x: f32) -> u8 {
    x.clamp(0.0, 255.0) as u8
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
fn luma_sum(img: &[u8]) -> u64 {
    let l = Luma::new();
    img.chunks_exact(3).map(|p| l.of(p[0], p[1], p[2]) as u64).sum()
}

/// `adjust_contrast(img, factor)`: a blend with the mean of the floored grayscale (float32).
pub fn contrast(img: &mut [u8], factor: f64) {
    let n = (img.len() / 3).max(1);
    let mean = luma_sum(img) as f32 / n as f32;
    let (ratio, alpha) = ratio_alpha(factor);
    let mut lut = [0u8; 256];
    for (v, l) in lut.iter_mut().enumerate() {
        *l = blend1(v as u8, mean, ratio, alpha);
    }
    apply_lut(img, &lut);
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

/// `invert(img)`: `255 - v`.
pub fn invert(img: &mut [u8]) {
    for v in img.iter_mut() {
        *v = !*v;
    }
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
    let n = (img.len() / 3) as u64;
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
    apply_luts(img, &luts);
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

#[cfg(test)]
mod tests {
    use super::*;

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
