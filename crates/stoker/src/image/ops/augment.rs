//! The photometric and policy augmentations (`ColorJitter`, `RandomGrayscale`,
//! `TrivialAugmentWide`, `RandAugment`, `AutoAugment`) compiled from their specs into one
//! [`AugmentPlan`] that runs on the sample's uint8 crop, in place, after the resample and before
//! the final write (flip, normalise, dtype, layout).
//!
//! Each op's arithmetic is torchvision's tensor kernel's ([`super::color`], [`super::affine`]);
//! the random draws mirror torchvision's structure (which op, which magnitude bin, which sign,
//! which order) but come from the sample's own stream (seed, epoch, index), so batches are the
//! same whatever the thread count and resume is exact. PyTorch's generator is not reproduced:
//! the tests compare op by op with explicit parameters ([`apply_op`]) and check the draws'
//! frequencies.
//! Owns: the policies (op spaces, magnitude bins, probabilities) and their draws. May not touch:
//! the resample, the slot, threads.

use super::affine::{self, Affine};
use super::color;
use crate::shell::rng::Rng;
use crate::values::augment::TimmConfig;

/// An op of torchvision's auto-augment spaces (`_apply_image_or_video_transform`'s ids).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AugOp {
    /// No change.
    Identity,
    /// Shear along x by `atan(m)` degrees, about the top-left corner.
    ShearX,
    /// Shear along y.
    ShearY,
    /// Translate by `int(m)` pixels along x.
    TranslateX,
    /// Translate along y.
    TranslateY,
    /// Rotate by `m` degrees.
    Rotate,
    /// `adjust_brightness(1 + m)`.
    Brightness,
    /// `adjust_saturation(1 + m)`.
    Color,
    /// `adjust_contrast(1 + m)`.
    Contrast,
    /// `adjust_sharpness(1 + m)`.
    Sharpness,
    /// `posterize(int(m))`.
    Posterize,
    /// `solarize(255 * m)`.
    Solarize,
    /// `autocontrast`.
    AutoContrast,
    /// `equalize`.
    Equalize,
    /// `invert`.
    Invert,
    /// timm's `solarize_add(add)`: values below 128 raised by `m` (at most 255).
    SolarizeAdd,
}

impl AugOp {
    /// torchvision's name of the op.
    pub fn name(self) -> &'static str {
        match self {
            AugOp::Identity => "Identity",
            AugOp::ShearX => "ShearX",
            AugOp::ShearY => "ShearY",
            AugOp::TranslateX => "TranslateX",
            AugOp::TranslateY => "TranslateY",
            AugOp::Rotate => "Rotate",
            AugOp::Brightness => "Brightness",
            AugOp::Color => "Color",
            AugOp::Contrast => "Contrast",
            AugOp::Sharpness => "Sharpness",
            AugOp::Posterize => "Posterize",
            AugOp::Solarize => "Solarize",
            AugOp::AutoContrast => "AutoContrast",
            AugOp::Equalize => "Equalize",
            AugOp::Invert => "Invert",
            AugOp::SolarizeAdd => "SolarizeAdd",
        }
    }

    /// The op named `name` (torchvision's spelling).
    pub fn parse(name: &str) -> Option<Self> {
        ALL_OPS.iter().copied().find(|o| o.name() == name)
    }
}

const ALL_OPS: [AugOp; 16] = [
    AugOp::SolarizeAdd,
    AugOp::Identity,
    AugOp::ShearX,
    AugOp::ShearY,
    AugOp::TranslateX,
    AugOp::TranslateY,
    AugOp::Rotate,
    AugOp::Brightness,
    AugOp::Color,
    AugOp::Contrast,
    AugOp::Sharpness,
    AugOp::Posterize,
    AugOp::Solarize,
    AugOp::AutoContrast,
    AugOp::Equalize,
    AugOp::Invert,
];

/// The op space of `RandAugment` and `TrivialAugmentWide`, in torchvision's dict order (which
/// the uniform op choice indexes): every op of [`ALL_OPS`] but its first (`SolarizeAdd`) and
/// last (`Invert`), which only AutoAugment's policy and timm's `rand_augment` use.
const RA_OPS: &[AugOp] = ALL_OPS.split_at(ALL_OPS.len() - 1).0.split_at(1).1;

/// `torch.linspace(start, end, n)[i]` in float32 as PyTorch's CPU kernel computes it: the step
/// `(end - start) / (n - 1)`, then `start + step * i` for the first half and
/// `end - step * (n - 1 - i)` for the second, each a fused multiply-add.
pub fn linspace_at(start: f64, end: f64, n: usize, i: usize) -> f32 {
    let (s, e) = (start as f32, end as f32);
    if n <= 1 {
        return s;
    }
    let step = (e - s) / (n - 1) as f32;
    if i < n / 2 {
        (step as f64 * i as f64 + s as f64) as f32
    } else {
        (-(step as f64) * (n - 1 - i) as f64 + e as f64) as f32
    }
}

/// Which table of magnitudes (torchvision's `_AUGMENTATION_SPACE`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// `RandAugment` and `AutoAugment`.
    RandAugment,
    /// `TrivialAugmentWide`.
    Wide,
}

/// The magnitude of bin `i` of `n` for `op` on a `w` x `h` image, and whether it is signed (a
/// random sign is drawn); `None` for ops without magnitude.
pub fn magnitude(space: Space, op: AugOp, n: usize, i: usize, w: usize, h: usize) -> Option<(f64, bool)> {
    let wide = space == Space::Wide;
    let lin = |end: f64| linspace_at(0.0, end, n, i) as f64;
    Some(match op {
        AugOp::Identity | AugOp::AutoContrast | AugOp::Equalize | AugOp::Invert | AugOp::SolarizeAdd => return None,
        AugOp::ShearX | AugOp::ShearY => (lin(if wide { 0.99 } else { 0.3 }), true),
        AugOp::TranslateX => (lin(if wide { 32.0 } else { 150.0 / 331.0 * w as f64 }), true),
        AugOp::TranslateY => (lin(if wide { 32.0 } else { 150.0 / 331.0 * h as f64 }), true),
        AugOp::Rotate => (lin(if wide { 135.0 } else { 30.0 }), true),
        AugOp::Brightness | AugOp::Color | AugOp::Contrast | AugOp::Sharpness => {
            (lin(if wide { 0.99 } else { 0.9 }), true)
        }
        AugOp::Posterize => {
            // (8 - (arange(n) / ((n - 1) / q))).round().int(), in float32.
            let q = if wide { 6.0 } else { 4.0 };
            let d = ((n as f64 - 1.0) / q) as f32;
            (color::round_even(8.0 - i as f32 / d) as i32 as f64, false)
        }
        AugOp::Solarize => (linspace_at(1.0, 0.0, n, i) as f64, false),
    })
}

/// torchvision's `_apply_image_or_video_transform(image, op, magnitude)` on `img` (`w` x `h`
/// RGB8) in place: `fill` outside the image for the geometric ops; `scratch` is reused.
pub fn apply_op(op: AugOp, m: f64, img: &mut [u8], w: usize, h: usize, fill: [u8; 3], scratch: &mut Vec<u8>) {
    match op {
        AugOp::Identity => {}
        AugOp::ShearX => affine::apply(Affine::ShearX(m), img, w, h, fill, scratch),
        AugOp::ShearY => affine::apply(Affine::ShearY(m), img, w, h, fill, scratch),
        AugOp::TranslateX => affine::apply(Affine::TranslateX(m), img, w, h, fill, scratch),
        AugOp::TranslateY => affine::apply(Affine::TranslateY(m), img, w, h, fill, scratch),
        AugOp::Rotate => affine::apply(Affine::Rotate(m), img, w, h, fill, scratch),
        AugOp::Brightness => color::brightness(img, 1.0 + m),
        AugOp::Color => color::saturation(img, 1.0 + m),
        AugOp::Contrast => color::contrast(img, 1.0 + m),
        AugOp::Sharpness => color::sharpness(img, w, h, 1.0 + m, scratch),
        AugOp::Posterize => color::posterize(img, m as u32),
        AugOp::Solarize => color::solarize(img, 255.0 * m),
        AugOp::AutoContrast => color::autocontrast(img),
        AugOp::Equalize => color::equalize(img),
        AugOp::Invert => color::invert(img),
        AugOp::SolarizeAdd => color::solarize_add(img, m as u32, 128),
    }
}

/// One step of ColorJitter, or the hue adjustment, with its factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// `adjust_brightness(f)`.
    Brightness(f64),
    /// `adjust_contrast(f)`.
    Contrast(f64),
    /// `adjust_saturation(f)`.
    Saturation(f64),
    /// `adjust_hue(f)`.
    Hue(f64),
}

/// Applies one jitter step.
pub fn apply_jitter(j: Jitter, img: &mut [u8]) {
    match j {
        Jitter::Brightness(f) => color::brightness(img, f),
        Jitter::Contrast(f) => color::contrast(img, f),
        Jitter::Saturation(f) => color::saturation(img, f),
        Jitter::Hue(f) => color::hue(img, f),
    }
}

/// AutoAugment's ImageNet policy: pairs of (op, probability, magnitude bin of 10).
const IMAGENET_POLICY: [[(AugOp, f64, usize); 2]; 25] = {
    use AugOp::*;
    [
        [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
        [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
        [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
        [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
        [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
        [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
        [(Rotate, 0.8, 8), (Color, 0.4, 0)],
        [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
        [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Rotate, 0.8, 8), (Color, 1.0, 2)],
        [(Color, 0.8, 8), (Solarize, 0.8, 7)],
        [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
        [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
        [(Color, 0.4, 0), (Equalize, 0.6, 0)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
    ]
};

/// One compiled augmentation.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `ColorJitter`: the factor ranges of brightness, contrast, saturation, hue (`None`: off),
    /// applied in a random order.
    ColorJitter([Option<[f64; 2]>; 4]),
    /// `RandomGrayscale(p)`.
    Grayscale(f64),
    /// `TrivialAugmentWide(num_magnitude_bins)`.
    TrivialAugmentWide {
        /// Magnitude bins.
        bins: usize,
        /// Fill of the geometric ops.
        fill: [u8; 3],
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins)`.
    RandAugment {
        /// Ops applied in sequence.
        num_ops: usize,
        /// The magnitude bin.
        magnitude: usize,
        /// Magnitude bins.
        bins: usize,
        /// Fill of the geometric ops.
        fill: [u8; 3],
    },
    /// `AutoAugment(AutoAugmentPolicy.IMAGENET)`.
    AutoAugment {
        /// Fill of the geometric ops.
        fill: [u8; 3],
    },
    /// timm's `rand_augment_transform("rand-m{magnitude}-n{num_ops}-p{prob}-mstd{std}-mmax{max}-inc{0,1}")`.
    TimmRandAugment(TimmRandAugment),
}

/// timm's RandAugment (`timm.data.auto_augment`): `num_ops` ops drawn uniformly with
/// replacement from timm's set (the increasing-severity set with `increasing`), each applied
/// with probability `prob`, at a magnitude drawn from a normal of mean `magnitude` and
/// deviation `magnitude_std` (uniform in `[0, magnitude]` when infinite), clipped to `[0,
/// magnitude_max]`, turned into each op's argument by timm's level functions. The arithmetic is
/// stoker's (torchvision's tensor kernels, nearest sampling), not Pillow's: see the module's
/// notes in `python/tests/test_augment.py` for what matches timm bit for bit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimmRandAugment {
    /// The settings of timm's string (`m`, `n`, `p`, `mstd`, `mmax`, `inc`).
    pub config: TimmConfig,
    /// `translate_pct` (0.45): TranslateXRel/YRel's reach at magnitude 10.
    pub translate_pct: f64,
    /// Fill of the geometric ops (timm's factory: the mean in bytes).
    pub fill: [u8; 3],
}

/// timm's op names (`_RAND_TRANSFORMS`, `_RAND_INCREASING_TRANSFORMS`), by index.
const TIMM_OPS: [&str; 15] = [
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
];

impl TimmRandAugment {
    /// Draws one op of timm's set at `level` (the noisy magnitude), with its random sign, as
    /// stoker's op and torchvision-style magnitude; `None` is timm's skipped op.
    fn draw_op(&self, rng: &mut Rng, w: usize) -> Option<Drawn> {
        let name = TIMM_OPS[rng.below(TIMM_OPS.len() as u64) as usize];
        if self.config.prob < 1.0 && rng.next_f64() > self.config.prob {
            return None;
        }
        let mut level = self.config.magnitude;
        if self.config.magnitude_std > 0.0 {
            level = if self.config.magnitude_std.is_infinite() {
                rng.uniform(0.0, self.config.magnitude)
            } else {
                self.config.magnitude + self.config.magnitude_std * gauss(rng)
            };
        }
        let level = level.min(self.config.magnitude_max).max(0.0);
        let frac = level / 10.0;
        // `_randomly_negate`: negated when `random() > 0.5`.
        let negate = |rng: &mut Rng, v: f64| if rng.next_f64() > 0.5 { -v } else { v };
        let inc = self.config.increasing;
        Some(match name {
            "AutoContrast" => Drawn::Op(AugOp::AutoContrast, 0.0),
            "Equalize" => Drawn::Op(AugOp::Equalize, 0.0),
            "Invert" => Drawn::Op(AugOp::Invert, 0.0),
            "Rotate" => Drawn::Op(AugOp::Rotate, negate(rng, frac * 30.0)),
            "Posterize" => {
                let bits = (frac * 4.0) as i64;
                Drawn::Op(AugOp::Posterize, if inc { 4 - bits } else { bits } as f64)
            }
            "Solarize" => {
                let t = ((frac * 256.0) as i64).min(256);
                let t = if inc { 256 - t } else { t };
                Drawn::Op(AugOp::Solarize, t as f64 / 255.0)
            }
            "SolarizeAdd" => Drawn::Op(AugOp::SolarizeAdd, ((frac * 110.0) as i64).min(128) as f64),
            "Color" | "Contrast" | "Brightness" | "Sharpness" => {
                let factor = if inc { (1.0 + negate(rng, frac * 0.9)).max(0.1) } else { frac * 1.8 + 0.1 };
                let op = match name {
                    "Color" => AugOp::Color,
                    "Contrast" => AugOp::Contrast,
                    "Brightness" => AugOp::Brightness,
                    _ => AugOp::Sharpness,
                };
                Drawn::Op(op, factor - 1.0)
            }
            "ShearX" => Drawn::Op(AugOp::ShearX, negate(rng, frac * 0.3)),
            "ShearY" => Drawn::Op(AugOp::ShearY, negate(rng, frac * 0.3)),
            // Pillow's (1, 0, p, 0, 1, 0) reads x + p: the image moves by -p.
            "TranslateXRel" => Drawn::Op(AugOp::TranslateX, -negate(rng, frac * self.translate_pct) * w as f64),
            _ => Drawn::Op(AugOp::TranslateY, -negate(rng, frac * self.translate_pct) * w as f64),
        })
    }
}

/// A standard normal draw (Box-Muller).
fn gauss(rng: &mut Rng) -> f64 {
    let u1 = rng.next_f64().max(f64::MIN_POSITIVE);
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// The names of the kinds of augmentation work timed apart in the report (an [`AugOp`] by its
/// index in this list, then the jitter steps, grayscale and the erase): see [`Drawn::kind`].
pub const KINDS: [&str; 22] = [
    "SolarizeAdd",
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
    "Invert",
    "ColorJitter.brightness",
    "ColorJitter.contrast",
    "ColorJitter.saturation",
    "ColorJitter.hue",
    "RandomGrayscale",
    "RandomErasing",
];

/// [`KINDS`]' index of the erase.
pub const KIND_ERASE: usize = 21;

/// What a sample's draws decided, op by op (for tests and traces).
#[derive(Debug, Clone, PartialEq)]
pub enum Drawn {
    /// A jitter step with its factor.
    Jitter(Jitter),
    /// Grayscale.
    Grayscale,
    /// An auto-augment op with its magnitude.
    Op(AugOp, f64),
}

impl Drawn {
    /// The index of this work in [`KINDS`].
    pub fn kind(&self) -> usize {
        match self {
            Drawn::Op(op, _) => ALL_OPS.iter().position(|o| o == op).unwrap_or(0),
            Drawn::Jitter(Jitter::Brightness(_)) => 16,
            Drawn::Jitter(Jitter::Contrast(_)) => 17,
            Drawn::Jitter(Jitter::Saturation(_)) => 18,
            Drawn::Jitter(Jitter::Hue(_)) => 19,
            Drawn::Grayscale => 20,
        }
    }
}

/// The augmentations of a transform, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AugmentPlan {
    steps: Vec<Step>,
}

/// A float32 uniform draw in `[lo, hi)` (torch's `uniform_` on a float32 tensor).
fn uniform32(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    rng.uniform(lo, hi) as f32 as f64
}

/// `torch.rand(()) <= p` / `< p` on float32 values.
fn rand32(rng: &mut Rng) -> f64 {
    rng.next_f64() as f32 as f64
}

impl AugmentPlan {
    /// A plan of `steps` (checked by `stoker::args`).
    pub fn new(steps: Vec<Step>) -> Self {
        AugmentPlan { steps }
    }

    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Draws what to do for one `w` x `h` sample from `rng`, in order, into `out` (cleared).
    pub fn draw(&self, w: usize, h: usize, rng: &mut Rng, out: &mut Vec<Drawn>) {
        out.clear();
        for step in &self.steps {
            match step {
                Step::ColorJitter(ranges) => {
                    let mut order = [0usize, 1, 2, 3];
                    crate::shell::rng::shuffle(&mut order, rng);
                    let mut f = [None; 4];
                    for (k, r) in ranges.iter().enumerate() {
                        f[k] = r.map(|[lo, hi]| uniform32(rng, lo, hi));
                    }
                    for k in order {
                        if let Some(v) = f[k] {
                            out.push(Drawn::Jitter(match k {
                                0 => Jitter::Brightness(v),
                                1 => Jitter::Contrast(v),
                                2 => Jitter::Saturation(v),
                                _ => Jitter::Hue(v),
                            }));
                        }
                    }
                }
                Step::Grayscale(p) => {
                    if rand32(rng) < *p {
                        out.push(Drawn::Grayscale);
                    }
                }
                Step::TrivialAugmentWide { bins, .. } => {
                    let op = RA_OPS[rng.below(RA_OPS.len() as u64) as usize];
                    let bin = if magnitude(Space::Wide, op, *bins, 0, w, h).is_some() {
                        rng.below(*bins as u64) as usize
                    } else {
                        0
                    };
                    out.push(signed(rng, Space::Wide, op, *bins, bin, w, h));
                }
                Step::RandAugment { num_ops, magnitude: bin, bins, .. } => {
                    for _ in 0..*num_ops {
                        let op = RA_OPS[rng.below(RA_OPS.len() as u64) as usize];
                        out.push(signed(rng, Space::RandAugment, op, *bins, *bin, w, h));
                    }
                }
                Step::TimmRandAugment(t) => {
                    for _ in 0..t.config.num_ops {
                        if let Some(d) = t.draw_op(rng, w) {
                            out.push(match d {
                                // TranslateYRel moves by a share of the height.
                                Drawn::Op(AugOp::TranslateY, m) => {
                                    Drawn::Op(AugOp::TranslateY, m / w as f64 * h as f64)
                                }
                                d => d,
                            });
                        }
                    }
                }
                Step::AutoAugment { .. } => {
                    let sub = &IMAGENET_POLICY[rng.below(IMAGENET_POLICY.len() as u64) as usize];
                    for &(op, p, bin) in sub {
                        if rand32(rng) > p {
                            continue;
                        }
                        out.push(signed(rng, Space::RandAugment, op, 10, bin, w, h));
                    }
                }
            }
        }
    }

    /// The fill of the geometric ops of the policy step (zeros when none).
    fn fill(&self) -> [u8; 3] {
        self.steps
            .iter()
            .find_map(|s| match s {
                Step::TrivialAugmentWide { fill, .. } | Step::RandAugment { fill, .. } | Step::AutoAugment { fill } => {
                    Some(*fill)
                }
                Step::TimmRandAugment(t) => Some(t.fill),
                _ => None,
            })
            .unwrap_or([0; 3])
    }

    /// Applies `drawn` (from [`draw`](Self::draw)) to `img` (`w` x `h` RGB8) in place, telling
    /// `timed` each op's [kind](Drawn::kind) and time.
    pub fn apply(
        &self,
        drawn: &[Drawn],
        img: &mut [u8],
        w: usize,
        h: usize,
        scratch: &mut Vec<u8>,
        timed: &mut dyn FnMut(usize, std::time::Duration),
    ) {
        let fill = self.fill();
        for d in drawn {
            let t0 = std::time::Instant::now();
            match *d {
                Drawn::Jitter(j) => apply_jitter(j, img),
                Drawn::Grayscale => color::grayscale(img),
                Drawn::Op(op, m) => apply_op(op, m, img, w, h, fill, scratch),
            }
            timed(d.kind(), t0.elapsed());
        }
    }
}

/// The op with the magnitude of `bin`, negated with probability one half when signed.
fn signed(rng: &mut Rng, space: Space, op: AugOp, bins: usize, bin: usize, w: usize, h: usize) -> Drawn {
    match magnitude(space, op, bins, bin, w, h) {
        None => Drawn::Op(op, 0.0),
        Some((m, sign)) => Drawn::Op(op, if sign && rand32(rng) <= 0.5 { -m } else { m }),
    }
}

impl TimmRandAugment {
    /// timm's settings parsed from its string ([`crate::values::augment::timm_rand_augment`]), with
    /// timm's `translate_pct` (0.45) and `fill`.
    pub fn new(c: TimmConfig, fill: [u8; 3]) -> Self {
        TimmRandAugment { config: c, translate_pct: 0.45, fill }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rand_augment_ops_are_torchvisions_in_dict_order() {
        let names: Vec<&str> = RA_OPS.iter().map(|o| o.name()).collect();
        let torchvision = "Identity ShearX ShearY TranslateX TranslateY Rotate Brightness Color Contrast Sharpness \
                           Posterize Solarize AutoContrast Equalize";
        assert_eq!(names.join(" "), torchvision);
    }

    #[test]
    fn linspace_matches_torch_on_known_values() {
        // torch.linspace(0, 32, 31)[15] == 15.999999 (float32), [17] == 18.133333.
        assert_eq!(linspace_at(0.0, 32.0, 31, 15), 15.999999_f32);
        assert_eq!(linspace_at(0.0, 32.0, 31, 17), 18.133333_f32);
        assert_eq!(linspace_at(0.0, 135.0, 31, 20), 90.0);
        assert_eq!(linspace_at(1.0, 0.0, 31, 30), 0.0);
        assert_eq!(linspace_at(0.0, 0.99, 1, 0), 0.0);
    }

    #[test]
    fn posterize_bins_match_torch() {
        let wide: Vec<i32> =
            (0..31).map(|i| magnitude(Space::Wide, AugOp::Posterize, 31, i, 1, 1).unwrap().0 as i32).collect();
        assert_eq!(wide, [8, 8, 8, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 3, 3, 3, 3, 3, 2, 2, 2]);
        let aa: Vec<i32> =
            (0..10).map(|i| magnitude(Space::RandAugment, AugOp::Posterize, 10, i, 1, 1).unwrap().0 as i32).collect();
        assert_eq!(aa, [8, 8, 7, 7, 6, 6, 5, 5, 4, 4]);
    }

    /// The draws are a function of the stream, and their frequencies are torchvision's: a
    /// uniform op of 14, a uniform bin of 31, a fair sign.
    #[test]
    fn trivial_augment_draws_are_uniform_and_deterministic() {
        let plan = AugmentPlan::new(vec![Step::TrivialAugmentWide { bins: 31, fill: [0; 3] }]);
        let mut counts = std::collections::HashMap::new();
        let (mut neg, mut signed_n) = (0, 0);
        let mut out = vec![];
        let n = 28_000;
        for i in 0..n {
            plan.draw(224, 224, &mut Rng::new(5, 9, i), &mut out);
            let mut again = vec![];
            plan.draw(224, 224, &mut Rng::new(5, 9, i), &mut again);
            assert_eq!(out, again);
            let Drawn::Op(op, m) = out[0] else { panic!() };
            *counts.entry(op).or_insert(0) += 1;
            if matches!(op, AugOp::Rotate) {
                signed_n += 1;
                neg += (m < 0.0) as i32;
                assert!(m.abs() <= 135.0);
            }
        }
        assert_eq!(counts.len(), 14);
        for (op, c) in &counts {
            assert!((1800..2200).contains(c), "{op:?} {c}");
        }
        assert!((neg as f64 / signed_n as f64 - 0.5).abs() < 0.06, "{neg}/{signed_n}");
    }

    #[test]
    fn color_jitter_draws_factors_in_range_in_a_random_order() {
        let r = [Some([0.6, 1.4]), Some([0.6, 1.4]), Some([0.6, 1.4]), Some([-0.1, 0.1])];
        let plan = AugmentPlan::new(vec![Step::ColorJitter(r)]);
        let mut firsts = [0; 4];
        let mut out = vec![];
        for i in 0..4000 {
            plan.draw(8, 8, &mut Rng::new(1, 2, i), &mut out);
            assert_eq!(out.len(), 4);
            for d in &out {
                match d {
                    Drawn::Jitter(Jitter::Hue(f)) => assert!((-0.1..0.1).contains(f)),
                    Drawn::Jitter(Jitter::Brightness(f) | Jitter::Contrast(f) | Jitter::Saturation(f)) => {
                        assert!((0.6..1.4).contains(f))
                    }
                    _ => panic!(),
                }
            }
            firsts[match out[0] {
                Drawn::Jitter(Jitter::Brightness(_)) => 0,
                Drawn::Jitter(Jitter::Contrast(_)) => 1,
                Drawn::Jitter(Jitter::Saturation(_)) => 2,
                _ => 3,
            }] += 1;
        }
        assert!(firsts.iter().all(|c| (850..1150).contains(c)), "{firsts:?}");
    }

    #[test]
    fn timm_rand_augment_draws_its_set_with_noisy_magnitudes() {
        let config = TimmConfig {
            magnitude: 9.0,
            num_ops: 2,
            prob: 0.5,
            magnitude_std: 0.5,
            magnitude_max: 10.0,
            increasing: true,
        };
        let t = TimmRandAugment::new(config, [124, 116, 104]);
        let plan = AugmentPlan::new(vec![Step::TimmRandAugment(t)]);
        let (mut n_ops, mut rotations, mut black) = (0, vec![], 0);
        let mut out = vec![];
        let n = 20_000;
        for i in 0..n {
            plan.draw(224, 224, &mut Rng::new(2, 2, i), &mut out);
            n_ops += out.len();
            for d in &out {
                match *d {
                    Drawn::Op(AugOp::Rotate, m) => rotations.push(m.abs()),
                    Drawn::Op(AugOp::Posterize, b) => black += (b == 0.0) as usize,
                    _ => {}
                }
            }
        }
        // Two ops, each kept with probability one half.
        assert!((n_ops as f64 / n as f64 - 1.0).abs() < 0.03, "{n_ops}");
        // |angle| = 3 * level, level ~ N(9, 0.5) clipped at 10: mean near 27, never above 30.
        let mean = rotations.iter().sum::<f64>() / rotations.len() as f64;
        assert!((mean - 26.9).abs() < 0.4 && rotations.iter().all(|a| *a <= 30.0), "{mean}");
        // Level 10 (about 2% of the draws) gives posterize-increasing 0 bits: black, as
        // torchvision's posterize (Pillow 13 refuses it).
        assert!(black > 0);
    }

    #[test]
    fn auto_augment_applies_each_op_with_its_probability() {
        let plan = AugmentPlan::new(vec![Step::AutoAugment { fill: [0; 3] }]);
        let mut out = vec![];
        let mut total = 0;
        let n = 20_000;
        for i in 0..n {
            plan.draw(224, 224, &mut Rng::new(3, 3, i), &mut out);
            assert!(out.len() <= 2);
            total += out.len();
        }
        // The mean of all 50 probabilities, twice per sample.
        let mean: f64 = IMAGENET_POLICY.iter().flatten().map(|x| x.1).sum::<f64>() / 25.0;
        let got = total as f64 / n as f64;
        assert!((got - mean).abs() < 0.03, "{got} vs {mean}");
    }
}
