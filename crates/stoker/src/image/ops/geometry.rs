//! Where each output pixel comes from: torchvision's RandomResizedCrop sampling, Resize's output
//! size and CenterCrop's offsets (with Python's round-half-even), reduced to one source box that is
//! resampled to the output in a single pass.

use crate::shell::rng::Rng;

/// Python's `round()`: round half to even.
pub fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// A crop box in integer pixels: top `i`, left `j`, height `h`, width `w` (torchvision's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// Top row.
    pub i: usize,
    /// Left column.
    pub j: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
}

/// torchvision's `RandomResizedCrop.get_params`: 10 tries of (area scale, log-uniform aspect
/// ratio), then the center-crop fallback clamped to `ratio`.
pub fn rrc_params(width: usize, height: usize, scale: [f64; 2], ratio: [f64; 2], rng: &mut Rng) -> CropBox {
    let area = (width * height) as f64;
    let log_ratio = [ratio[0].ln(), ratio[1].ln()];
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale[0], scale[1]);
        let aspect = rng.uniform(log_ratio[0], log_ratio[1]).exp();
        let w = round_half_even((target_area * aspect).sqrt()) as i64;
        let h = round_half_even((target_area / aspect).sqrt()) as i64;
        if 0 < w && w <= width as i64 && 0 < h && h <= height as i64 {
            let i = rng.int_inclusive(0, height as i64 - h) as usize;
            let j = rng.int_inclusive(0, width as i64 - w) as usize;
            return CropBox { i, j, h: h as usize, w: w as usize };
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio[0].min(ratio[1]) {
        (width, round_half_even(width as f64 / ratio[0].min(ratio[1])) as usize)
    } else if in_ratio > ratio[0].max(ratio[1]) {
        (round_half_even(height as f64 * ratio[0].max(ratio[1])) as usize, height)
    } else {
        (width, height)
    };
    let (w, h) = (w.clamp(1, width), h.clamp(1, height));
    CropBox { i: (height - h) / 2, j: (width - w) / 2, h, w }
}

/// torchvision's output size for `Resize(size)` with an int: the shorter side becomes `size`,
/// the longer `int(size * long / short)`. Returns `(width, height)`.
pub fn resize_shorter(width: usize, height: usize, size: usize) -> (usize, usize) {
    let (short, long) = if width <= height { (width, height) } else { (height, width) };
    let new_long = ((size as f64) * (long as f64) / (short as f64)) as usize;
    let new_long = new_long.max(1);
    if width <= height {
        (size, new_long)
    } else {
        (new_long, size)
    }
}

/// torchvision's CenterCrop along one axis for an image of `len` and a crop of `crop`:
/// returns `(offset into the image, offset into the output, length copied)`. When the crop is
/// larger, torchvision pads with zeros around the image first.
pub fn center_crop_axis(len: usize, crop: usize) -> (usize, usize, usize) {
    if crop <= len {
        (round_half_even((len - crop) as f64 / 2.0) as usize, 0, crop)
    } else {
        (0, (crop - len) / 2, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::rng::Rng;
    use proptest::prelude::{prop_assert, proptest};

    #[test]
    fn python_rounding() {
        assert_eq!(round_half_even(0.5), 0.0);
        assert_eq!(round_half_even(1.5), 2.0);
        assert_eq!(round_half_even(2.5), 2.0);
        assert_eq!(round_half_even(2.6), 3.0);
        assert_eq!(round_half_even(-0.5), 0.0);
    }

    #[test]
    fn resize_and_center_crop_match_torchvision() {
        assert_eq!(resize_shorter(500, 375, 256), (341, 256));
        assert_eq!(resize_shorter(375, 500, 256), (256, 341));
        assert_eq!(resize_shorter(256, 256, 256), (256, 256));
        // (341 - 224) / 2 = 58.5 -> 58 (half to even).
        assert_eq!(center_crop_axis(341, 224), (58, 0, 224));
        assert_eq!(center_crop_axis(257, 224), (16, 0, 224)); // 16.5 -> 16
        assert_eq!(center_crop_axis(100, 224), (0, 62, 100));
    }

    #[test]
    fn fallback_is_centered_and_ratio_clamped() {
        // scale > 1 makes every try fail: the fallback clamps a 1000x100 image to ratio 4/3.
        let mut rng = Rng::new(0, 0, 0);
        let b = rrc_params(1000, 100, [2.0, 3.0], [3.0 / 4.0, 4.0 / 3.0], &mut rng);
        assert_eq!(b, CropBox { i: 0, j: (1000 - 133) / 2, h: 100, w: 133 });
    }

    proptest! {
        #[test]
        fn rrc_boxes_are_inside_and_in_range(w in 1usize..2000, h in 1usize..2000, seed: u64) {
            let mut rng = Rng::new(seed, 2, 0);
            let b = rrc_params(w, h, [0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0], &mut rng);
            prop_assert!(b.w >= 1 && b.h >= 1 && b.j + b.w <= w && b.i + b.h <= h);
        }
    }

    /// The distribution of accepted boxes follows torchvision's: area fraction uniform in
    /// `scale`, log aspect ratio uniform in `log(ratio)` (checked on a large image where nearly
    /// every first try is accepted), offsets uniform over the valid range.
    #[test]
    fn rrc_distribution_matches_torchvision() {
        let (w, h) = (4000usize, 3000usize);
        let n = 40_000;
        let mut area_bins = [0u32; 10];
        let mut logr_bins = [0u32; 10];
        let mut left_fraction = 0.0;
        let lr = [(3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln()];
        for k in 0..n {
            let mut rng = Rng::new(11, 2, k);
            let b = rrc_params(w, h, [0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0], &mut rng);
            let frac = (b.w * b.h) as f64 / (w * h) as f64;
            // Rounding w and h moves the area a little; map into [0.08, 1] bins.
            let a = ((frac - 0.08) / 0.92 * 10.0).floor().clamp(0.0, 9.0) as usize;
            area_bins[a] += 1;
            let r = ((b.w as f64 / b.h as f64).ln() - lr[0]) / (lr[1] - lr[0]);
            logr_bins[(r * 10.0).floor().clamp(0.0, 9.0) as usize] += 1;
            if w > b.w {
                left_fraction += b.j as f64 / (w - b.w) as f64;
            }
        }
        // Accepted boxes follow the proposal (area fraction uniform, log-ratio uniform)
        // conditioned on fitting inside the image, because rejected tries are redrawn
        // independently. Integrate that density numerically and compare every bin.
        let (mut ea, mut er) = ([0f64; 10], [0f64; 10]);
        let g = 400;
        for a in 0..g {
            let s = 0.08 + 0.92 * (a as f64 + 0.5) / g as f64;
            for b in 0..g {
                let t = (b as f64 + 0.5) / g as f64;
                let r = (lr[0] + (lr[1] - lr[0]) * t).exp();
                let area = s * (w * h) as f64;
                if (area * r).sqrt() <= w as f64 && (area / r).sqrt() <= h as f64 {
                    ea[(a * 10) / g] += 1.0;
                    er[(b * 10) / g] += 1.0;
                }
            }
        }
        let (ta, tr): (f64, f64) = (ea.iter().sum(), er.iter().sum());
        for k in 0..10 {
            let (pa, pr) = (ea[k] / ta * n as f64, er[k] / tr * n as f64);
            assert!((area_bins[k] as f64 - pa).abs() < 0.06 * pa + 60.0, "area bin {k}: {area_bins:?} vs {ea:?}");
            assert!((logr_bins[k] as f64 - pr).abs() < 0.06 * pr + 60.0, "log-ratio bin {k}: {logr_bins:?} vs {er:?}");
        }
        let mean_left = left_fraction / n as f64;
        assert!((mean_left - 0.5).abs() < 0.01, "mean relative offset {mean_left}");
    }
}
