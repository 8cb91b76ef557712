//! Batch mixing: MixUp and CutMix on a finished host batch, with soft labels, as torchvision
//! v2's `MixUp`/`CutMix` and timm's `Mixup` (`mode='batch'`) compute them.
//!
//! One draw per batch ([`MixSpec::draw`], from the batch's own random stream: seed, epoch,
//! rank and batch number), so batches are the same whatever the thread count and a resumed
//! run mixes as the original did. Given the draw ([`MixParams`]: lambda, the box after
//! clipping, lambda recomputed from the box's area), the arithmetic is the references':
//!
//! - float32: `x * lam + partner * (1 - lam)`, each product and the sum rounded to float32
//!   (torch's `mul`/`add` with the scalars as float32); float16 the same with each result
//!   rounded to half (torch's half ops compute in float32);
//! - uint8 (the references mix floats): timm's fast-collate arithmetic, the float32 value
//!   above rounded half to even (`np.rint`), so a uint8 batch holds the nearest level;
//! - CutMix copies the box from the partner in every dtype (exact);
//! - soft labels (float32 `[N, num_classes]`): `one_hot(y) * lam + one_hot(partner) * (1 -
//!   lam)` in float32, the one-hot values `1 - smoothing + smoothing / C` and `smoothing / C`
//!   (timm's `mixup_target`; torchvision: no smoothing).
//!
//! Partners: torchvision rolls the batch by one (sample `i` mixes with `i - 1`, the first with
//! the last); timm flips it (`i` with `n - 1 - i`). A batch shortened by skipped samples mixes
//! the samples it has.
//!
//! Where it runs ([`MixSpec::images`], decided once by `stoker::args::image_config`): for host
//! batches, everything here, on the thread that completes the batch. For batches bound for a
//! GPU (they cross the bus as uint8 and are normalised there), that thread writes only the soft
//! labels, which travel to the GPU beside the labels; the images are mixed on the GPU after
//! their normalisation, by torch ops in Python (`stoker._gpu.Mixer`) given this batch's draw,
//! with the same arithmetic as above (each product and the sum rounded to the dtype, no fused
//! multiply-add), so a GPU batch equals the host batch of the same seed bit for bit.

use crate::error::{Error, Result};
use crate::image::ops::{DType, Layout};
use crate::shell::rng::Rng;

/// Whose semantics: the box formula, the partner and the draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MixStyle {
    /// torchvision v2 `MixUp` / `CutMix`: partner by roll, box of half-side
    /// `int(0.5 * sqrt(1 - lam) * side)` around a uniform centre, always applied; with both
    /// alphas, `RandomChoice([MixUp, CutMix], p)`: CutMix with `switch_prob`.
    Torchvision,
    /// timm `Mixup`: partner by flip, box of side `int(side * sqrt(1 - lam))` (halved with
    /// `//`), applied with probability `prob`, CutMix chosen with `switch_prob`.
    Timm,
}

/// Where a batch's images are mixed (its soft labels are always made on the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MixImages {
    /// On the host, in the finished batch ([`MixSpec::mix_images`]).
    #[default]
    Host,
    /// On the GPU, after the batch's normalisation there: the host leaves the images unmixed.
    Device,
}

/// A batch mixing: what `stoker.transforms.MixUp`, `CutMix` and `Mixup` compile to.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MixSpec {
    /// Beta(alpha, alpha) for MixUp; 0 for none.
    pub mixup_alpha: f64,
    /// Beta(alpha, alpha) for CutMix; 0 for none.
    pub cutmix_alpha: f64,
    /// Probability that a batch is mixed at all (timm's `prob`; 1 for torchvision).
    pub prob: f64,
    /// Probability of CutMix when both are on (timm's `switch_prob`; torchvision's
    /// `RandomChoice` weight of its `CutMix`).
    pub switch_prob: f64,
    /// Label smoothing of the soft labels (timm's `label_smoothing`; 0 for torchvision).
    pub label_smoothing: f64,
    /// Classes of the soft labels.
    pub num_classes: usize,
    /// Whose semantics.
    pub style: MixStyle,
    /// Where the images are mixed: set by `stoker::args::image_config` (never by the user), and
    /// not part of the spec's JSON, so a state saved on a GPU resumes on the host and back.
    #[serde(skip)]
    pub images: MixImages,
}

/// One batch's draw.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MixParams {
    /// Whether the batch is CutMix (else MixUp, or nothing when `lam` is 1).
    pub cutmix: bool,
    /// The weight of each sample itself; for CutMix recomputed from the clipped box's area.
    pub lam: f64,
    /// CutMix's box `[y0, y1, x0, x1)` in output pixels.
    pub area: Option<[usize; 4]>,
}

impl MixSpec {
    /// Checks the values (what `stoker::args` calls once).
    pub fn check(&self) -> Result<()> {
        let bad = |msg: String| Error::config("batch_transform", msg);
        let alpha = |a: f64| a.is_finite() && a >= 0.0;
        if !alpha(self.mixup_alpha) || !alpha(self.cutmix_alpha) {
            return Err(bad(format!("alphas must be >= 0, got {} and {}", self.mixup_alpha, self.cutmix_alpha)));
        }
        if self.mixup_alpha == 0.0 && self.cutmix_alpha == 0.0 {
            return Err(bad("mixup_alpha or cutmix_alpha must be positive".into()));
        }
        for (name, p) in
            [("prob", self.prob), ("switch_prob", self.switch_prob), ("label_smoothing", self.label_smoothing)]
        {
            if !(0.0..=1.0).contains(&p) {
                return Err(bad(format!("{name} must be in [0, 1], got {p}")));
            }
        }
        if self.num_classes == 0 || self.num_classes > 1 << 24 {
            return Err(bad(format!("num_classes must be in 1..=16777216, got {}", self.num_classes)));
        }
        Ok(())
    }

    /// MixUp or CutMix (true) and its alpha: the one that is on, or CutMix with `switch_prob`
    /// when both are (one coin from `rng`).
    fn pick(&self, rng: &mut Rng) -> (bool, f64) {
        match (self.mixup_alpha > 0.0, self.cutmix_alpha > 0.0) {
            (true, true) if rng.next_f64() < self.switch_prob => (true, self.cutmix_alpha),
            (true, _) => (false, self.mixup_alpha),
            _ => (true, self.cutmix_alpha),
        }
    }

    /// The draw of one batch of `h` x `w` images from its stream `rng`, in this order:
    /// torchvision: (both on) the choice, lambda, then (CutMix) the centre's x and y; timm: the
    /// `prob` coin, then (both on) the switch coin, lambda, then (CutMix) the centre's y and x.
    pub fn draw(&self, rng: &mut Rng, h: usize, w: usize) -> MixParams {
        let none = MixParams { cutmix: false, lam: 1.0, area: None };
        let (cutmix, alpha) = match self.style {
            MixStyle::Torchvision => self.pick(rng),
            MixStyle::Timm => {
                if rng.next_f64() >= self.prob {
                    return none;
                }
                self.pick(rng)
            }
        };
        let lam = beta(rng, alpha);
        if !cutmix {
            return MixParams { cutmix, lam, area: None };
        }
        let [y0, y1, x0, x1] = match self.style {
            MixStyle::Torchvision => {
                let (rx, ry) = (rng.below(w as u64) as i64, rng.below(h as u64) as i64);
                let r = 0.5 * (1.0 - lam).sqrt();
                let (hw, hh) = ((r * w as f64) as i64, (r * h as f64) as i64);
                [(ry - hh).max(0), (ry + hh).min(h as i64), (rx - hw).max(0), (rx + hw).min(w as i64)]
            }
            MixStyle::Timm => {
                let ratio = (1.0 - lam).sqrt();
                let (ch, cw) = ((h as f64 * ratio) as i64, (w as f64 * ratio) as i64);
                let (cy, cx) = (rng.below(h as u64) as i64, rng.below(w as u64) as i64);
                let clip = |v: i64, n: usize| v.clamp(0, n as i64);
                [clip(cy - ch / 2, h), clip(cy + ch / 2, h), clip(cx - cw / 2, w), clip(cx + cw / 2, w)]
            }
        }
        .map(|v| v as usize);
        let lam = 1.0 - ((y1 - y0) * (x1 - x0)) as f64 / (h * w) as f64;
        MixParams { cutmix, lam, area: Some([y0, y1, x0, x1]) }
    }

    /// Sample `i`'s partner in a batch of `n`.
    pub fn partner(&self, i: usize, n: usize) -> usize {
        match self.style {
            MixStyle::Torchvision => (i + n - 1) % n,
            MixStyle::Timm => n - 1 - i,
        }
    }

    /// Writes the soft labels of `labels` mixed by `p` into `out` (`labels.len() *
    /// num_classes` float32). A label outside `0..num_classes` is an error naming it.
    pub fn soft_labels(&self, p: &MixParams, labels: &[i64], out: &mut [f32]) -> Result<()> {
        let c = self.num_classes;
        let n = labels.len();
        if let Some(&y) = labels.iter().find(|&&y| y < 0 || y as u64 >= c as u64) {
            return Err(Error::config(
                "batch_transform",
                format!("a label {y} is outside 0..{c} (num_classes): soft labels need a class per sample"),
            ));
        }
        let off = (self.label_smoothing / c as f64) as f32;
        let on = (1.0 - self.label_smoothing + self.label_smoothing / c as f64) as f32;
        let (l0, l1) = (p.lam as f32, (1.0 - p.lam) as f32);
        let (a0, a1) = (off * l0, off * l1);
        for (i, row) in out[..n * c].chunks_exact_mut(c).enumerate() {
            let (own, other) = (labels[i] as usize, labels[self.partner(i, n)] as usize);
            row.fill(a0 + a1);
            row[own] = on * l0 + if own == other { on * l1 } else { a1 };
            if own != other {
                row[other] = a0 + on * l1;
            }
        }
        Ok(())
    }

    /// Mixes the `n` samples of `data` (`dtype`, `layout`, `h` x `w` RGB, one after another)
    /// by `p`. `scratch` is reused between calls (one sample for a rolled batch).
    #[allow(clippy::too_many_arguments)]
    pub fn mix_images(
        &self,
        p: &MixParams,
        data: &mut [u8],
        n: usize,
        dtype: DType,
        layout: Layout,
        h: usize,
        w: usize,
        scratch: &mut Vec<u8>,
    ) {
        let sb = h * w * 3 * dtype.size();
        if n < 2 || p.lam >= 1.0 {
            return;
        }
        let data = &mut data[..n * sb];
        let (l0, l1) = (p.lam as f32, (1.0 - p.lam) as f32);
        let e = dtype.size();
        // own = mix(own, partner) over the bytes of one sample that change: CutMix's box (a
        // run of bytes per row, per plane for NCHW) or the whole sample.
        let apply = |own: &mut [u8], partner: &[u8]| match p.area.filter(|_| p.cutmix) {
            Some([y0, y1, x0, x1]) => {
                let planes = if layout == Layout::NCHW { 3 } else { 1 };
                for c in 0..planes {
                    for y in y0..y1 {
                        let r = match layout {
                            Layout::NCHW => (c * h * w + y * w + x0) * e..(c * h * w + y * w + x1) * e,
                            Layout::NHWC => (y * w + x0) * 3 * e..(y * w + x1) * 3 * e,
                        };
                        own[r.clone()].copy_from_slice(&partner[r]);
                    }
                }
            }
            None => mix_bytes(own, partner, dtype, l0, l1),
        };
        match self.style {
            MixStyle::Torchvision => {
                // Sample i takes i - 1: from the last down, the first from a copy of the last.
                scratch.clear();
                scratch.extend_from_slice(&data[(n - 1) * sb..n * sb]);
                for i in (1..n).rev() {
                    let (head, tail) = data.split_at_mut(i * sb);
                    apply(&mut tail[..sb], &head[(i - 1) * sb..]);
                }
                apply(&mut data[..sb], scratch);
            }
            MixStyle::Timm => {
                // Pairs (i, n - 1 - i) from the originals of both; a middle sample mixes with
                // itself (as timm's arithmetic does).
                for i in 0..n / 2 {
                    let j = n - 1 - i;
                    let (head, tail) = data.split_at_mut(j * sb);
                    let (a, b) = (&mut head[i * sb..(i + 1) * sb], &mut tail[..sb]);
                    scratch.clear();
                    scratch.extend_from_slice(a);
                    apply(a, b);
                    apply(b, scratch);
                }
                if n % 2 == 1 {
                    let m = n / 2;
                    scratch.clear();
                    scratch.extend_from_slice(&data[m * sb..(m + 1) * sb]);
                    apply(&mut data[m * sb..(m + 1) * sb], scratch);
                }
            }
        }
    }
}

/// `own = own * l0 + partner * l1` elementwise, in `dtype`'s arithmetic (see the module's
/// notes).
fn mix_bytes(own: &mut [u8], partner: &[u8], dtype: DType, l0: f32, l1: f32) {
    match dtype {
        DType::Uint8 => {
            for (o, &q) in own.iter_mut().zip(partner) {
                let v = *o as f32 * l0 + q as f32 * l1;
                *o = v.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
        DType::Float32 => {
            for (o, q) in own.chunks_exact_mut(4).zip(partner.chunks_exact(4)) {
                let a = f32::from_ne_bytes([o[0], o[1], o[2], o[3]]);
                let b = f32::from_ne_bytes([q[0], q[1], q[2], q[3]]);
                o.copy_from_slice(&(a * l0 + b * l1).to_ne_bytes());
            }
        }
        DType::Float16 => {
            use half::f16;
            for (o, q) in own.chunks_exact_mut(2).zip(partner.chunks_exact(2)) {
                let a = f16::from_ne_bytes([o[0], o[1]]).to_f32();
                let b = f16::from_ne_bytes([q[0], q[1]]).to_f32();
                let (x, y) = (f16::from_f32(a * l0).to_f32(), f16::from_f32(b * l1).to_f32());
                o.copy_from_slice(&f16::from_f32(x + y).to_ne_bytes());
            }
        }
    }
}

/// A Beta(`a`, `a`) variate: `x / (x + y)` of two Gamma(`a`) variates.
fn beta(rng: &mut Rng, a: f64) -> f64 {
    let x = gamma(rng, a);
    let y = gamma(rng, a);
    if x + y == 0.0 {
        return 0.5;
    }
    x / (x + y)
}

/// A Gamma(`a`, 1) variate: Marsaglia and Tsang's method, with `a < 1` boosted by `U^(1/a)`.
fn gamma(rng: &mut Rng, a: f64) -> f64 {
    if a < 1.0 {
        let u = 1.0 - rng.next_f64(); // (0, 1]
        return gamma(rng, a + 1.0) * u.powf(1.0 / a);
    }
    let d = a - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = 1.0 - rng.next_f64();
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// A standard normal variate (Box-Muller, one of the pair).
fn normal(rng: &mut Rng) -> f64 {
    let u = 1.0 - rng.next_f64();
    let v = rng.next_f64();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(style: MixStyle, mixup: f64, cutmix: f64) -> MixSpec {
        MixSpec {
            mixup_alpha: mixup,
            cutmix_alpha: cutmix,
            prob: 1.0,
            switch_prob: 0.5,
            label_smoothing: 0.0,
            num_classes: 5,
            style,
            images: MixImages::Host,
        }
    }

    #[test]
    fn beta_has_the_right_moments() {
        // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
        for a in [0.2, 0.8, 1.0, 2.5] {
            let mut rng = Rng::new(1, 2, 3);
            let n = 200_000;
            let xs: Vec<f64> = (0..n).map(|_| beta(&mut rng, a)).collect();
            let mean = xs.iter().sum::<f64>() / n as f64;
            let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
            let want = 1.0 / (4.0 * (2.0 * a + 1.0));
            assert!((mean - 0.5).abs() < 0.005 && (var - want).abs() < 0.02 * want + 0.001, "{a}: {mean} {var}");
            assert!(xs.iter().all(|x| (0.0..=1.0).contains(x)));
        }
    }

    #[test]
    fn boxes_follow_each_reference_and_lambda_is_their_area() {
        for style in [MixStyle::Torchvision, MixStyle::Timm] {
            let s = spec(style, 0.0, 1.0);
            for seed in 0..200 {
                let p = s.draw(&mut Rng::new(seed, 7, 0), 24, 40);
                let [y0, y1, x0, x1] = p.area.unwrap();
                assert!(p.cutmix && y0 <= y1 && y1 <= 24 && x0 <= x1 && x1 <= 40);
                assert_eq!(p.lam, 1.0 - ((y1 - y0) * (x1 - x0)) as f64 / 960.0);
                if style == MixStyle::Timm {
                    // Even sides before clipping (2 * (cut // 2)).
                    assert!((y0 == 0 || y1 == 24 || (y1 - y0) % 2 == 0) && (x0 == 0 || x1 == 40 || (x1 - x0) % 2 == 0));
                }
            }
        }
        // timm without the prob coin: no mixing, lambda 1.
        let mut s = spec(MixStyle::Timm, 1.0, 1.0);
        s.prob = 0.0;
        assert_eq!(s.draw(&mut Rng::new(0, 0, 0), 8, 8), MixParams { cutmix: false, lam: 1.0, area: None });
    }

    #[test]
    fn mixing_is_the_references_arithmetic() {
        let (h, w, n) = (2, 3, 3);
        let sb = h * w * 3;
        let px: Vec<u8> = (0..n * sb).map(|i| (i * 37 % 256) as u8).collect();
        let p = MixParams { cutmix: false, lam: 0.3, area: None };
        let (l0, l1) = (0.3f32, 0.7f32);
        for style in [MixStyle::Torchvision, MixStyle::Timm] {
            let s = spec(style, 1.0, 0.0);
            let mut got = px.clone();
            s.mix_images(&p, &mut got, n, DType::Uint8, Layout::NCHW, h, w, &mut vec![]);
            for i in 0..n {
                let j = s.partner(i, n);
                for e in 0..sb {
                    let v = (px[i * sb + e] as f32 * l0 + px[j * sb + e] as f32 * l1).round_ties_even() as u8;
                    assert_eq!(got[i * sb + e], v, "{style:?} {i} {e}");
                }
            }
            let f: Vec<f32> = px.iter().map(|&v| v as f32 / 7.0).collect();
            let mut bytes: Vec<u8> = f.iter().flat_map(|v| v.to_ne_bytes()).collect();
            s.mix_images(&p, &mut bytes, n, DType::Float32, Layout::NHWC, h, w, &mut vec![]);
            for (k, c) in bytes.chunks_exact(4).enumerate() {
                let (i, e) = (k / sb, k % sb);
                let want = f[i * sb + e] * l0 + f[s.partner(i, n) * sb + e] * l1;
                assert_eq!(f32::from_ne_bytes(c.try_into().unwrap()), want);
            }
        }
        // CutMix copies the partner's box, in the layout's order.
        let s = spec(MixStyle::Torchvision, 0.0, 1.0);
        let p = MixParams { cutmix: true, lam: 0.5, area: Some([0, 1, 1, 3]) };
        for layout in [Layout::NCHW, Layout::NHWC] {
            let mut got = px.clone();
            s.mix_images(&p, &mut got, n, DType::Uint8, layout, h, w, &mut vec![]);
            for i in 0..n {
                let j = s.partner(i, n);
                for c in 0..3 {
                    for y in 0..h {
                        for x in 0..w {
                            let e = match layout {
                                Layout::NCHW => c * h * w + y * w + x,
                                Layout::NHWC => (y * w + x) * 3 + c,
                            };
                            let from = if y < 1 && (1..3).contains(&x) { j } else { i };
                            assert_eq!(got[i * sb + e], px[from * sb + e], "{layout:?} {i} {c} {y} {x}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn soft_labels_are_timms_mixup_target() {
        let mut s = spec(MixStyle::Timm, 1.0, 0.0);
        s.label_smoothing = 0.1;
        let p = MixParams { cutmix: false, lam: 0.75, area: None };
        let labels = [0i64, 3, 3, 1];
        let mut out = vec![0f32; 4 * 5];
        s.soft_labels(&p, &labels, &mut out).unwrap();
        let (off, on) = ((0.1f64 / 5.0) as f32, (1.0 - 0.1 + 0.1 / 5.0) as f32);
        let hot = |y: i64, c: usize| if y as usize == c { on } else { off };
        for i in 0..4 {
            let j = 3 - i;
            for c in 0..5 {
                let want = hot(labels[i], c) * 0.75f32 + hot(labels[j], c) * 0.25f32;
                assert_eq!(out[i * 5 + c], want, "{i} {c}");
            }
        }
        let e = s.soft_labels(&p, &[0, 5], &mut out).unwrap_err();
        assert!(e.to_string().contains("num_classes"), "{e}");
    }

    #[test]
    fn bad_specs_say_why() {
        let mut s = spec(MixStyle::Timm, 0.0, 0.0);
        assert!(s.check().unwrap_err().to_string().contains("positive"));
        s.mixup_alpha = 1.0;
        s.prob = 1.5;
        assert!(s.check().unwrap_err().to_string().contains("prob"));
        s.prob = 1.0;
        s.num_classes = 0;
        assert!(s.check().unwrap_err().to_string().contains("num_classes"));
    }
}
