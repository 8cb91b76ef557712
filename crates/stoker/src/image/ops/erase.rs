//! `RandomErasing(p, scale, ratio, value)` on a finished sample in its slot (float16 or float32,
//! either layout), as torchvision's `transforms.v2.RandomErasing` runs in its recipes: after
//! `Normalize`, on the float tensor. The box is drawn as torchvision draws it (10 tries of an
//! area fraction and a log-uniform aspect ratio, `h = round(sqrt(area * ratio))`, `w =
//! round(sqrt(area / ratio))`, both smaller than the image, then a uniform position; no erase
//! when every try fails); `value` is a constant per channel (0 by default) or, for `"random"`,
//! standard normal values per element (timm's `mode='pixel'`). An erase placed *before*
//! `Normalize` erases the `[0, 1]` image, so its values are normalised as the image is.
//! The draws come from the sample's stream, not from PyTorch's generator.
//! Owns: the erase box and its values. May not touch: the uint8 crop, the rest of the write.

use super::{DType, Layout};
use crate::shell::rng::Rng;

/// What fills the erased box.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum EraseValue {
    /// One value per channel (in the units of the output, or of `[0, 1]` when normalised).
    Const([f32; 3]),
    /// Standard normal values, one per element.
    Random,
}

/// A compiled `RandomErasing`.
#[derive(Debug, Clone, PartialEq)]
pub struct Erase {
    /// Probability of erasing.
    pub p: f64,
    /// Range of the box's area fraction.
    pub scale: [f64; 2],
    /// Range of the box's aspect ratio (height / width).
    pub ratio: [f64; 2],
    /// What to write.
    pub value: EraseValue,
    /// `(mean, std)` of a `Normalize` that follows the erase (its values are normalised).
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

/// A box `(top, left, height, width)` to erase.
pub type EraseBox = [usize; 4];

/// Two standard normal draws, one pair at a time: the definition of the stream [`Normals`]
/// draws in batches.
#[cfg(test)]
fn normal_pair(rng: &mut Rng) -> [f32; 2] {
    loop {
        let (u, v, s) = polar_draw(rng.next_u64());
        if s > 0.0 && s < 1.0 {
            let m = (-2.0 * s.ln() / s).sqrt();
            return [u * m, v * m];
        }
    }
}

impl Erase {
    /// Draws the box for an `h` x `w` sample (`None`: no erase).
    pub fn draw(&self, h: usize, w: usize, rng: &mut Rng) -> Option<EraseBox> {
        if rng.next_f64() as f32 as f64 >= self.p {
            return None;
        }
        let area = (h * w) as f64;
        let lr = [self.ratio[0].ln() as f32 as f64, self.ratio[1].ln() as f32 as f64];
        for _ in 0..10 {
            let erase_area = area * (rng.uniform(self.scale[0], self.scale[1]) as f32 as f64);
            let aspect = (rng.uniform(lr[0], lr[1]) as f32).exp() as f64;
            let eh = super::geometry::round_half_even((erase_area * aspect).sqrt()) as usize;
            let ew = super::geometry::round_half_even((erase_area / aspect).sqrt()) as usize;
            if !(eh < h && ew < w) {
                continue;
            }
            let i = rng.below((h - eh + 1) as u64) as usize;
            let j = rng.below((w - ew + 1) as u64) as usize;
            return Some([i, j, eh, ew]);
        }
        None
    }

    /// Erases `bx` of one sample `out` (`h` x `w`, `dtype`, `layout`), drawing random values from
    /// `rng`.
    ///
    /// Row by row of each channel (torchvision's `normal_` order on a `[c, h, w]` tensor): the
    /// row's values (drawn from one stream of pairs, [`Normals`], a pair's second value starting
    /// the next row when a row takes an odd number), then normalised and written in one pass.
    #[allow(clippy::too_many_arguments)]
    pub fn apply(&self, bx: EraseBox, out: &mut [u8], h: usize, w: usize, dtype: DType, layout: Layout, rng: &mut Rng) {
        let [i, j, eh, ew] = bx;
        if eh == 0 || ew == 0 {
            return;
        }
        let mut normals = Normals::default();
        let mut vals = vec![0f32; ew];
        let mut halves = vec![half::f16::ZERO; if dtype == DType::Float16 { ew } else { 0 }];
        for c in 0..3 {
            let (mean, std) = self.normalize.map_or((0.0, 1.0), |(m, s)| (m[c], s[c]));
            for y in i..i + eh {
                match self.value {
                    EraseValue::Const(v) => vals.fill(v[c]),
                    EraseValue::Random => normals.fill(rng, &mut vals),
                }
                if self.normalize.is_some() {
                    for v in vals.iter_mut() {
                        *v = (*v - mean) / std;
                    }
                }
                // Element `x` of the row is at `first + x * step` (in elements).
                let (first, step) = match layout {
                    Layout::NCHW => ((c * h + y) * w + j, 1),
                    Layout::NHWC => ((y * w + j) * 3 + c, 3),
                };
                let size = dtype.size();
                let span = &mut out[first * size..(first + (ew - 1) * step + 1) * size];
                match dtype {
                    DType::Float32 => {
                        for (d, v) in span.chunks_mut(4 * step).zip(&vals) {
                            d[..4].copy_from_slice(&v.to_ne_bytes());
                        }
                    }
                    DType::Float16 => {
                        half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut halves[..], &vals);
                        for (d, v) in span.chunks_mut(2 * step).zip(&halves) {
                            d[..2].copy_from_slice(&v.to_ne_bytes());
                        }
                    }
                    DType::Uint8 => {
                        for (d, v) in span.iter_mut().step_by(step).zip(&vals) {
                            *d = v.clamp(0.0, 255.0) as u8;
                        }
                    }
                }
            }
        }
    }
}

/// The stream of standard normal values of one erase: pairs of Marsaglia's polar method in
/// float32 (both uniforms from one 64-bit draw, 24 bits each), both values used in order.
#[derive(Default)]
struct Normals {
    /// The second value of the last pair, when not yet used.
    spare: Option<f32>,
    /// Accepted draws `(u, v, s)` of the polar method, then `ln(s)`.
    polar: Vec<[f32; 4]>,
}

impl Normals {
    /// Fills `vals` with the next values of the stream: the draws and values that drawing one
    /// pair at a time makes (the tests' `normal_pair`), but the accepted points are gathered
    /// first (a loop without a branch per draw) and the logarithms and roots computed
    /// afterwards, independent of each other.
    fn fill(&mut self, rng: &mut Rng, vals: &mut [f32]) {
        let vals = match (self.spare, vals) {
            (Some(s), [first, rest @ ..]) => {
                *first = s;
                self.spare = None;
                rest
            }
            (_, vals) => vals,
        };
        let pairs = vals.len().div_ceil(2);
        self.polar.clear();
        self.polar.resize(pairs + 1, [0.0; 4]);
        let mut got = 0;
        while got < pairs {
            let (u, v, s) = polar_draw(rng.next_u64());
            self.polar[got] = [u, v, s, 0.0];
            got += (s > 0.0 && s < 1.0) as usize;
        }
        // The logarithms (libm's `logf`, as one pair at a time), then the rest of the arithmetic in
        // a loop the compiler vectorises (IEEE division and square root: the same bits).
        let polar = &mut self.polar[..pairs];
        for p in polar.iter_mut() {
            p[3] = p[2].ln();
        }
        let m = |s: f32, l: f32| (-2.0 * l / s).sqrt();
        let (whole, odd) = vals.as_chunks_mut::<2>();
        for (out, &[u, v, s, l]) in whole.iter_mut().zip(polar.iter()) {
            let m = m(s, l);
            *out = [u * m, v * m];
        }
        if let ([last], Some(&[u, v, s, l])) = (odd, polar.last()) {
            let m = m(s, l);
            *last = u * m;
            self.spare = Some(v * m);
        }
    }
}

/// One draw of Marsaglia's polar method: two uniforms in `[-1, 1)` from 24 bits each of `bits`,
/// and the square of their norm (accepted in `(0, 1)`).
#[inline(always)]
fn polar_draw(bits: u64) -> (f32, f32, f32) {
    const SCALE: f32 = 1.0 / (1u32 << 23) as f32;
    let u = ((bits >> 40) as u32 as f32) * SCALE - 1.0;
    let v = (((bits >> 8) & 0xff_ffff) as u32 as f32) * SCALE - 1.0;
    (u, v, u * u + v * v)
}

#[cfg(test)]
impl Erase {
    /// The element-by-element erase this replaced, the reference of `rows_equal_the_reference`.
    #[allow(clippy::too_many_arguments)]
    fn reference_apply(
        &self,
        bx: EraseBox,
        out: &mut [u8],
        h: usize,
        w: usize,
        dtype: DType,
        layout: Layout,
        rng: &mut Rng,
    ) {
        let [i, j, eh, ew] = bx;
        let norm = |c: usize, v: f32| match self.normalize {
            Some((mean, std)) => (v - mean[c]) / std[c],
            None => v,
        };
        let size = dtype.size();
        let mut put = |idx: usize, v: f32| {
            let at = idx * size;
            match dtype {
                DType::Float32 => out[at..at + 4].copy_from_slice(&v.to_ne_bytes()),
                DType::Float16 => out[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_ne_bytes()),
                DType::Uint8 => out[at] = v.clamp(0.0, 255.0) as u8,
            }
        };
        // Channel by channel, row by row: torchvision's `normal_` on a `[c, h, w]` tensor.
        let mut spare: Option<f32> = None;
        for c in 0..3 {
            for y in i..i + eh {
                for x in j..j + ew {
                    let v = match self.value {
                        EraseValue::Const(v) => v[c],
                        EraseValue::Random => spare.take().unwrap_or_else(|| {
                            let [a, b] = normal_pair(rng);
                            spare = Some(b);
                            a
                        }),
                    };
                    let idx = match layout {
                        Layout::NCHW => (c * h + y) * w + x,
                        Layout::NHWC => (y * w + x) * 3 + c,
                    };
                    put(idx, norm(c, v));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_equal_the_reference() {
        let mut rng = Rng::new(50, 5, 0);
        for k in 0..300u64 {
            let (h, w) = (1 + rng.below(40) as usize, 1 + rng.below(40) as usize);
            let (eh, ew) = (rng.below(h as u64 + 1) as usize, rng.below(w as u64 + 1) as usize);
            let bx = [rng.below((h - eh) as u64 + 1) as usize, rng.below((w - ew) as u64 + 1) as usize, eh, ew];
            let e = Erase {
                p: 1.0,
                scale: [0.02, 0.33],
                ratio: [0.3, 3.3],
                value: if k % 3 == 0 { EraseValue::Const([0.5, -1.0, 300.0]) } else { EraseValue::Random },
                normalize: if k % 2 == 0 { Some(([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])) } else { None },
            };
            for dtype in [DType::Float32, DType::Float16, DType::Uint8] {
                for layout in [Layout::NCHW, Layout::NHWC] {
                    let n = h * w * 3 * dtype.size();
                    let (mut a, mut b) = (vec![7u8; n], vec![7u8; n]);
                    let (mut ra, mut rb) = (Rng::new(1, 2, k), Rng::new(1, 2, k));
                    e.apply(bx, &mut a, h, w, dtype, layout, &mut ra);
                    e.reference_apply(bx, &mut b, h, w, dtype, layout, &mut rb);
                    assert_eq!(a, b, "{bx:?} {h}x{w} {dtype:?} {layout:?}");
                    assert_eq!(ra.next_u64(), rb.next_u64(), "the stream after the erase");
                }
            }
        }
    }

    #[test]
    fn boxes_fit_and_follow_p() {
        let e = Erase {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: EraseValue::Const([0.0; 3]),
            normalize: None,
        };
        let mut hits = 0;
        for k in 0..4000 {
            if let Some([i, j, eh, ew]) = e.draw(224, 224, &mut Rng::new(0, 1, k)) {
                hits += 1;
                assert!(i + eh <= 224 && j + ew <= 224 && eh > 0 && ew > 0);
                let frac = (eh * ew) as f64 / (224.0 * 224.0);
                assert!((0.01..0.36).contains(&frac), "{frac}");
            }
        }
        assert!((1800..2200).contains(&hits), "{hits}");
    }

    #[test]
    fn random_values_are_standard_normal() {
        let mut rng = Rng::new(9, 9, 9);
        let v: Vec<f64> = (0..50_000).flat_map(|_| normal_pair(&mut rng)).map(f64::from).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        let within1 = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / v.len() as f64;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.03 && (within1 - 0.6827).abs() < 0.01,
            "{mean} {var} {within1}"
        );
    }

    #[test]
    fn erase_writes_the_value_in_either_layout() {
        let e = Erase {
            p: 1.0,
            scale: [0.1, 0.1],
            ratio: [1.0, 1.0],
            value: EraseValue::Const([1.0, 2.0, 3.0]),
            normalize: None,
        };
        for layout in [Layout::NCHW, Layout::NHWC] {
            let mut out = vec![0u8; 4 * 4 * 3 * 4];
            e.apply([1, 1, 2, 2], &mut out, 4, 4, DType::Float32, layout, &mut Rng::new(0, 0, 0));
            let f: Vec<f32> = out.chunks_exact(4).map(|b| f32::from_ne_bytes(b.try_into().unwrap())).collect();
            assert_eq!(f.iter().filter(|v| **v != 0.0).count(), 12);
            assert_eq!(f.iter().sum::<f32>(), 4.0 * 6.0);
        }
    }
}
