//! Rotate, shear and translate an RGB8 crop with nearest sampling, exactly as torchvision's
//! tensor kernels do (`transforms.v2.functional.affine` / `rotate` on uint8 images,
//! `interpolation=NEAREST`): the inverse matrix in double (`_get_inverse_affine_matrix`), cast
//! to float32; the output grid `(x - (w - 1) / 2, y - (h - 1) / 2)` times the matrix rescaled by
//! `(w / 2, h / 2)` in float32, summed left to right without fusing (as PyTorch's `bmm` does
//! here); `grid_sample`'s unnormalisation `(g + 1) * (size / 2) - 0.5` and round half to even;
//! outside the image, the fill (zeros by default). `rotate`'s fast paths (0 and 180 degrees, and
//! 90 / 270 on square images: `torch.rot90`) are taken as torchvision takes them. The result is
//! bit-exact against torchvision (checked on real photos by `python/tests/test_augment.py`).
//! Owns: the geometric aug ops' coordinate arithmetic. May not touch: randomness, colour.

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)` (degrees),
/// in double.
pub fn inverse_affine_matrix(
    center: [f64; 2],
    angle: f64,
    translate: [f64; 2],
    scale: f64,
    shear: [f64; 2],
) -> [f64; 6] {
    // Python's `math.radians` is `x * (pi / 180)`, as Rust's `to_radians`.
    let rot = angle.to_radians();
    let sx = shear[0].to_radians();
    let sy = shear[1].to_radians();
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let cx_plus_tx = cx + tx;
    let cy_plus_ty = cy + ty;
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// Samples `img` (`w` x `h` RGB8) in place through the inverse matrix `m` (torchvision's, in
/// centred coordinates) with nearest sampling; pixels from outside get `fill`. `scratch` takes a
/// copy of the source.
///
/// Row by row: the source offset of every pixel in a loop the compiler vectorises (the same
/// float32 operations, in the same order, for each pixel as torchvision's grid), then a
/// branch-free gather of four bytes per pixel from the copy, which ends with the fill (the
/// offset of every pixel from outside) and a spare byte.
pub fn affine_nearest(img: &mut [u8], w: usize, h: usize, m: [f64; 6], fill: [u8; 3], scratch: &mut Vec<u8>) {
    let n = img.len();
    scratch.clear();
    scratch.extend_from_slice(img);
    scratch.extend_from_slice(&fill);
    scratch.push(0);
    let t: [f32; 6] = m.map(|v| v as f32);
    let (hw, hh) = ((0.5 * w as f64) as f32, (0.5 * h as f64) as f32);
    // rescaled_theta = theta^T / [w / 2, h / 2]: rows (x, y, 1), columns (gx, gy).
    let r = [[t[0] / hw, t[3] / hh], [t[1] / hw, t[4] / hh], [t[2] / hw, t[5] / hh]];
    let cx = (w as f64 - 1.0) * 0.5;
    // The centred x of each column (exact: halves of small integers).
    let xs: Vec<f32> = (0..w).map(|x| (x as f64 - cx) as f32).collect();
    let mut offs = vec![0u32; w];
    let mut out = vec![0u8; w * 3 + 1];
    for y in 0..h {
        let yc = (y as f64 - (h as f64 - 1.0) * 0.5) as f32;
        grid_row(&mut offs, &xs, yc, r, w, h, n as u32);
        for (d, &o) in out.chunks_exact_mut(3).zip(&offs) {
            // Four bytes read and written: the fourth is the next pixel's, rewritten next (or the
            // spare byte of `out`).
            let o = o as usize;
            let v: [u8; 4] = scratch[o..o + 4].try_into().expect("4 bytes");
            // SAFETY: `d` is 3 bytes of `out` that are followed by at least one more (`out` has
            // `w * 3 + 1` bytes), so the 4-byte unaligned write stays inside `out`.
            unsafe { d.as_mut_ptr().cast::<[u8; 4]>().write_unaligned(v) };
        }
        img[y * w * 3..(y + 1) * w * 3].copy_from_slice(&out[..w * 3]);
    }
}

super::color::multiversion! {
    /// The source offsets of one output row (centred y `yc`) of [`affine_nearest`]: `iy * row +
    /// ix * 3` inside the image, `outside` elsewhere.
    fn grid_row(offs: &mut [u32], xs: &[f32], yc: f32, r: [[f32; 2]; 3], w: usize, h: usize, outside: u32) {
        let (by0, by1) = (yc * r[1][0], yc * r[1][1]);
        let (sw, sh) = (w as f32 * 0.5, h as f32 * 0.5);
        let (wf, hf) = (w as f32, h as f32);
        let row = (w * 3) as i32;
        for (o, &xc) in offs.iter_mut().zip(xs) {
            let gx = (xc * r[0][0] + by0) + r[2][0];
            let gy = (xc * r[0][1] + by1) + r[2][1];
            let ix = super::color::round_even((gx + 1.0) * sw - 0.5);
            let iy = super::color::round_even((gy + 1.0) * sh - 0.5);
            let inside = (ix >= 0.0) & (ix < wf) & (iy >= 0.0) & (iy < hf);
            // The clamped copies convert without overflow (outside values are discarded).
            let (cx, cy) = (if inside { ix } else { 0.0 }, if inside { iy } else { 0.0 });
            // SAFETY: `cx` and `cy` are 0 or whole numbers in [0, w) and [0, h), which `i32`
            // represents.
            let (px, py) = unsafe { (cx.to_int_unchecked::<i32>(), cy.to_int_unchecked::<i32>()) };
            *o = if inside { (py * row + px * 3) as u32 } else { outside };
        }
    }
}

/// `torch.rot90(img, k, dims=(-2, -1))` for `k` in 1..=3 of a `w` x `h` RGB8 image into `dst`
/// (`k` 1 or 3 need a square image).
pub fn rot90(src: &[u8], dst: &mut [u8], w: usize, h: usize, k: u32) {
    let row = w * 3;
    for y in 0..h {
        for x in 0..w {
            let (sy, sx) = match k {
                1 => (x, w - 1 - y),
                2 => (h - 1 - y, w - 1 - x),
                _ => (h - 1 - x, y),
            };
            let (d, s) = (y * row + x * 3, sy * row + sx * 3);
            dst[d..d + 3].copy_from_slice(&src[s..s + 3]);
        }
    }
}

/// The geometric aug ops, with torchvision's arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Affine {
    /// `rotate(img, angle)` (degrees, counter-clockwise), about the centre.
    Rotate(f64),
    /// `affine(img, shear=[degrees(atan(m)), 0], center=[0, 0])`: AutoAugment's ShearX.
    ShearX(f64),
    /// `affine(img, shear=[0, degrees(atan(m))], center=[0, 0])`: ShearY.
    ShearY(f64),
    /// `affine(img, translate=[int(m), 0])`.
    TranslateX(f64),
    /// `affine(img, translate=[0, int(m)])`.
    TranslateY(f64),
}

/// Applies `op` to `img` (`w` x `h` RGB8) in place, through `scratch`.
pub fn apply(op: Affine, img: &mut [u8], w: usize, h: usize, fill: [u8; 3], scratch: &mut Vec<u8>) {
    let (cw, ch) = (-(w as f64) * 0.5, -(h as f64) * 0.5);
    let m = match op {
        Affine::Rotate(angle) => {
            let a = angle.rem_euclid(360.0);
            let k = if a == 0.0 {
                return;
            } else if a == 180.0 {
                Some(2)
            } else if w == h && a == 90.0 {
                Some(1)
            } else if w == h && a == 270.0 {
                Some(3)
            } else {
                None
            };
            if let Some(k) = k {
                scratch.clear();
                scratch.extend_from_slice(img);
                rot90(scratch, img, w, h, k);
                return;
            }
            inverse_affine_matrix([0.0, 0.0], -a, [0.0, 0.0], 1.0, [0.0, 0.0])
        }
        Affine::ShearX(m) => inverse_affine_matrix([cw, ch], 0.0, [0.0, 0.0], 1.0, [m.atan().to_degrees(), 0.0]),
        Affine::ShearY(m) => inverse_affine_matrix([cw, ch], 0.0, [0.0, 0.0], 1.0, [0.0, m.atan().to_degrees()]),
        Affine::TranslateX(m) => inverse_affine_matrix([0.0, 0.0], 0.0, [m.trunc(), 0.0], 1.0, [0.0, 0.0]),
        Affine::TranslateY(m) => inverse_affine_matrix([0.0, 0.0], 0.0, [0.0, m.trunc()], 1.0, [0.0, 0.0]),
    };
    affine_nearest(img, w, h, m, fill, scratch);
}

/// The scalar sampler this replaced, the reference of `vectorised_sampling_equals_the_reference`.
#[cfg(test)]
fn reference_nearest(src: &[u8], dst: &mut [u8], w: usize, h: usize, m: [f64; 6], fill: [u8; 3]) {
    let t: [f32; 6] = m.map(|v| v as f32);
    let (hw, hh) = ((0.5 * w as f64) as f32, (0.5 * h as f64) as f32);
    // rescaled_theta = theta^T / [w / 2, h / 2]: rows (x, y, 1), columns (gx, gy).
    let r = [[t[0] / hw, t[3] / hh], [t[1] / hw, t[4] / hh], [t[2] / hw, t[5] / hh]];
    let (sw, sh) = (w as f32 * 0.5, h as f32 * 0.5);
    let (wf, hf) = (w as f32, h as f32);
    let row = w * 3;
    // Per run of 64 pixels of a row, the source offset of each (-1: outside), computed in a
    // loop the compiler vectorises, then gathered.
    const RUN: usize = 64;
    let mut offs = [0i32; RUN];
    let cx = (w as f64 - 1.0) * 0.5;
    for y in 0..h {
        let yc = (y as f64 - (h as f64 - 1.0) * 0.5) as f32;
        let (by0, by1) = (yc * r[1][0], yc * r[1][1]);
        for x0 in (0..w).step_by(RUN) {
            let n = RUN.min(w - x0);
            for (k, o) in offs[..n].iter_mut().enumerate() {
                let xc = ((x0 + k) as f64 - cx) as f32;
                let gx = (xc * r[0][0] + by0) + r[2][0];
                let gy = (xc * r[0][1] + by1) + r[2][1];
                let ix = super::color::round_even((gx + 1.0) * sw - 0.5);
                let iy = super::color::round_even((gy + 1.0) * sh - 0.5);
                let inside = ix >= 0.0 && ix < wf && iy >= 0.0 && iy < hf;
                *o = if inside { iy as i32 * row as i32 + ix as i32 * 3 } else { -1 };
            }
            let out = &mut dst[y * row + x0 * 3..y * row + (x0 + n) * 3];
            for (d, &o) in out.chunks_exact_mut(3).zip(&offs[..n]) {
                if o >= 0 {
                    let o = o as usize;
                    d.copy_from_slice(&src[o..o + 3]);
                } else {
                    d.copy_from_slice(&fill);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectorised_sampling_equals_the_reference() {
        use crate::ops::color::PORTABLE;
        use crate::shell::rng::Rng;
        let mut rng = Rng::new(50, 4, 0);
        for (k, (img, w, h)) in crate::ops::color::tests::test_images(16).into_iter().enumerate() {
            PORTABLE.set(k % 2 == 1);
            for k in 0..40 {
                let op = match k % 5 {
                    0 => Affine::Rotate(rng.uniform(-180.0, 180.0)),
                    1 => Affine::ShearX(rng.uniform(-1.0, 1.0)),
                    2 => Affine::ShearY(rng.uniform(-1.0, 1.0)),
                    3 => Affine::TranslateX(rng.uniform(-120.0, 120.0)),
                    _ => Affine::TranslateY(rng.uniform(-120.0, 120.0)),
                };
                let fill = [rng.below(256) as u8, 7, 250];
                let mut a = img.clone();
                apply(op, &mut a, w, h, fill, &mut vec![]);
                let (cw, ch) = (-(w as f64) * 0.5, -(h as f64) * 0.5);
                let m = match op {
                    Affine::Rotate(angle) => {
                        let a = angle.rem_euclid(360.0);
                        inverse_affine_matrix([0.0, 0.0], -a, [0.0, 0.0], 1.0, [0.0, 0.0])
                    }
                    Affine::ShearX(m) => {
                        inverse_affine_matrix([cw, ch], 0.0, [0.0; 2], 1.0, [m.atan().to_degrees(), 0.0])
                    }
                    Affine::ShearY(m) => {
                        inverse_affine_matrix([cw, ch], 0.0, [0.0; 2], 1.0, [0.0, m.atan().to_degrees()])
                    }
                    Affine::TranslateX(m) => inverse_affine_matrix([0.0; 2], 0.0, [m.trunc(), 0.0], 1.0, [0.0; 2]),
                    Affine::TranslateY(m) => inverse_affine_matrix([0.0; 2], 0.0, [0.0, m.trunc()], 1.0, [0.0; 2]),
                };
                let mut b = img.clone();
                reference_nearest(&img, &mut b, w, h, m, fill);
                assert_eq!(a, b, "{op:?} on {w}x{h}");
            }
        }
        PORTABLE.set(false);
    }

    #[test]
    fn translate_by_whole_pixels_shifts() {
        let (w, h) = (5, 3);
        let mut img: Vec<u8> = (0..w * h * 3).map(|i| i as u8 + 1).collect();
        let orig = img.clone();
        apply(Affine::TranslateX(2.9), &mut img, w, h, [0; 3], &mut vec![]);
        for y in 0..h {
            for x in 0..w {
                let got = &img[(y * w + x) * 3..][..3];
                if x < 2 {
                    assert_eq!(got, &[0, 0, 0]);
                } else {
                    assert_eq!(got, &orig[(y * w + x - 2) * 3..][..3]);
                }
            }
        }
    }

    #[test]
    fn rotations_by_quarter_turns_are_permutations() {
        let n = 4;
        let img: Vec<u8> = (0..n * n * 3).map(|i| i as u8).collect();
        for angle in [90.0, 180.0, 270.0, -90.0, 360.0] {
            let mut a = img.clone();
            apply(Affine::Rotate(angle), &mut a, n, n, [0; 3], &mut vec![]);
            let mut s = a.clone();
            s.sort_unstable();
            assert_eq!(s, img, "{angle}");
        }
    }
}
