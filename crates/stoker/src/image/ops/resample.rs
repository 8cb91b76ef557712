//! Antialiased resampling of RGB8, bit-compatible with Pillow's `Image.resize(..., BILINEAR)`,
//! `BICUBIC` and `NEAREST` (which torchvision's PIL path calls, `antialias=True`): for the two
//! convolutions the same coefficient computation (bicubic with `a = -0.5`, support 2), the same
//! 22-bit fixed point, the same horizontal-then-vertical order with an 8-bit intermediate; for
//! nearest, Pillow's sampling grid (its affine scan, one source pixel per output pixel) run as
//! a one-tap convolution through the same kernels.
//!
//! It resamples a *box* of the source straight to the output, so `Resize` + `CenterCrop` and
//! `RandomResizedCrop` cost one pass over only the pixels they need. A box can be *soft* (a
//! window into a resize of the whole image: the filter may read neighbours outside the box, as
//! resizing first then cropping does) or *hard* (crop first, then resize: the filter is clipped
//! at the box, as `img.crop(box).resize(size)` does).
//!
//! All buffers are reused: after warm-up a call allocates nothing. The [`Kernel`] is chosen
//! once, at construction, from what the CPU has: AVX-512BW (the AVX2 kernels with the
//! horizontal pass four rows at a time), AVX2 (horizontal pass two rows at a time with
//! `vpmaddwd` on the weights split into two 11-bit halves, vertical pass in 8 lanes), SSE4.1,
//! or portable Rust; all give the same bytes, and the tests force each one the CPU has. The
//! kernels only see windows of taps and their fixed-point weights (`Coeffs`), so every
//! [`Interpolation`] runs through the same code.
//!
//! The row kernels themselves live in `resample/rows.rs`; this file holds the filters, the
//! coefficients, the choice of kernel and the two passes.

mod rows;

use rows::*;

/// The resampling filter of `Resize` and `RandomResizedCrop`: torchvision's
/// `InterpolationMode` as its PIL path (`antialias=True`) applies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// Pillow's antialiased triangle filter (support 1): torchvision's default.
    #[default]
    Bilinear,
    /// Pillow's antialiased cubic convolution with `a = -0.5` (support 2), as timm's and
    /// open_clip's ViT recipes use.
    Bicubic,
    /// Pillow's nearest neighbour: output pixel `x` takes source pixel `floor((x + 0.5) *
    /// in / out)` (torchvision's PIL path for `NEAREST` and `NEAREST_EXACT`; its tensor path's
    /// `NEAREST` is another grid, `floor(x * in / out)`).
    Nearest,
}

/// From a name: `bilinear`, `bicubic`, `nearest` (or `nearest-exact`, which torchvision's PIL
/// path also runs as Pillow's nearest); anything else is an error that lists them.
impl<'de> serde::Deserialize<'de> for Interpolation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Interpolation;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an interpolation: bilinear, bicubic or nearest")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Interpolation, E> {
                match v {
                    "bilinear" => Ok(Interpolation::Bilinear),
                    "bicubic" => Ok(Interpolation::Bicubic),
                    "nearest" | "nearest-exact" => Ok(Interpolation::Nearest),
                    _ => Err(E::custom(format!(
                        "unknown interpolation {v:?}; allowed: bilinear, bicubic, nearest (or nearest-exact)"
                    ))),
                }
            }
        }
        d.deserialize_str(Name)
    }
}

impl Interpolation {
    /// Whether this is the default, bilinear (serialised specs leave it out, so a bilinear
    /// transform's fingerprint is what it was before interpolation was a choice).
    pub fn is_bilinear(&self) -> bool {
        *self == Interpolation::Bilinear
    }

    /// The lowercase name (torchvision's `InterpolationMode` value).
    pub fn name(self) -> &'static str {
        match self {
            Interpolation::Bilinear => "bilinear",
            Interpolation::Bicubic => "bicubic",
            Interpolation::Nearest => "nearest",
        }
    }
}

/// A filter and the order of the two passes: what one resampling needs to give Pillow's bytes.
/// The passes round to 8 bits in between, so their order changes some bytes by one level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Filter {
    /// The filter.
    pub interpolation: Interpolation,
    /// Run the vertical pass first, then the horizontal one (else horizontal first).
    pub vertical_first: bool,
}

impl Filter {
    /// Bilinear, horizontal pass first: stoker's resampling of every bilinear box.
    pub const BILINEAR: Filter = Filter { interpolation: Interpolation::Bilinear, vertical_first: false };

    /// `interpolation` for an image of `from = (width, height)` resized to `to = (width,
    /// height)` (a whole resize: `Resize`, or `RandomResizedCrop`'s crop), in Pillow 13's pass
    /// order: vertical first when the height shrinks by more than twice as many pixels as the
    /// width does (`ImagingResampleInner`; Pillow 12 and older always run horizontal first).
    /// Bilinear keeps horizontal first whatever the sizes: its bytes stay those stoker always
    /// gave and the GPU resampler gives (`kernels/resize.cu`), equal to Pillow 12's and within
    /// one level of Pillow 13's where the orders differ.
    pub fn pillow(interpolation: Interpolation, from: (usize, usize), to: (usize, usize)) -> Filter {
        let (dw, dh) = (from.0 as f64 - to.0 as f64, from.1 as f64 - to.1 as f64);
        let vertical_first = interpolation != Interpolation::Bilinear && dh > 0.0 && dh > 2.0 * dw;
        Filter { interpolation, vertical_first }
    }
}

/// Pillow's `bilinear_filter`.
fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

/// Pillow's `bicubic_filter` (`a = -0.5`), written in its order of operations so that the
/// doubles, and so the fixed-point weights, are the same.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The margin, in source pixels, to keep around a box of `box_len` pixels resampled to
/// `out_len` so that pixels near its edge see the same neighbours as in the whole image: the
/// widest filter's reach (bicubic's support 2, times the downscale factor; bilinear reaches
/// half as far, nearest a quarter) plus two pixels. Used by region decoding and by the cache's
/// row reads; a margin wider than a filter needs changes no output byte.
pub fn filter_margin(box_len: f64, out_len: usize) -> f64 {
    2.0 * (box_len / out_len as f64).max(1.0) + 2.0
}

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

impl Coeffs {
    /// Pillow's `precompute_coeffs` + `normalize_coeffs_8bpc` for `filter` on an input axis of
    /// `in_size` pixels, the box `[in0, in1)` and `out_size` outputs (nearest: [`Self::nearest`]).
    fn compute(&mut self, filter: Interpolation, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        let (weight, support): (fn(f64) -> f64, f64) = match filter {
            Interpolation::Bilinear => (bilinear, 1.0),
            Interpolation::Bicubic => (bicubic, 2.0),
            Interpolation::Nearest => return self.nearest(in_size, in0, in1, out_size),
        };
        let scale = (in1 - in0) / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = support * filterscale;
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
                let w = weight((x as f64 + xmin as f64 - center + 0.5) * ss);
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

    /// Pillow's `NEAREST` resize (`ImagingScaleAffine`) as one tap of weight one per output
    /// pixel: source pixel `floor(xo)`, `xo` starting at `a / 2` and growing by `a = in / out`
    /// per output pixel, in doubles as Pillow adds them. A box that is a window into a resize
    /// of the whole axis (a soft `Resize` + `CenterCrop` box: `in_size / scale` and
    /// `in0 / scale` whole numbers) continues the whole axis' scan from its first pixel, so it
    /// picks exactly the pixels `resize` then `crop` does; any other box scans from `in0`.
    fn nearest(&mut self, in_size: usize, in0: f64, in1: f64, out_size: usize) {
        let scale = (in1 - in0) / out_size as f64;
        let n = in_size as f64;
        let (full, first) = ((n / scale).round(), (in0 / scale).round());
        let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * n;
        let (a, mut xo) = if full >= 1.0 && near(full * scale, n) && near(first * scale, in0) && first >= 0.0 {
            let a = n / full;
            let mut xo = a * 0.5;
            for _ in 0..first as usize {
                xo += a;
            }
            (a, xo)
        } else {
            (scale, in0 + scale * 0.5)
        };
        self.ksize = 1;
        self.bounds.clear();
        self.pre.clear();
        grow(&mut self.pre, out_size, 1.0);
        self.k.clear();
        grow(&mut self.k, out_size, 1 << PRECISION_BITS);
        for _ in 0..out_size {
            let x = if xo < 0.0 { 0 } else { (xo as usize).min(in_size - 1) };
            self.bounds.push((x, 1));
            xo += a;
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

/// A code path of the resampler. All give the same bytes; [`BoxResampler::new`] picks the
/// fastest this CPU has, [`BoxResampler::with_kernel`] forces one (for tests and benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernel {
    /// AVX-512BW: horizontal pass four rows at a time (a row per 128-bit lane); the AVX2
    /// vertical pass.
    Avx512,
    /// AVX2: horizontal pass two rows at a time with `vpmaddwd`, vertical pass in 8 lanes.
    Avx2,
    /// SSE4.1: horizontal pass one pixel per vector; portable vertical pass.
    Sse41,
    /// Plain Rust, any CPU.
    #[default]
    Portable,
}

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 4] = [Kernel::Avx512, Kernel::Avx2, Kernel::Sse41, Kernel::Portable];

    /// Whether this CPU can run the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx2")
            }
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Kernel::Sse41 => is_x86_feature_detected!("sse4.1"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU can run.
    pub fn best() -> Kernel {
        Kernel::ALL.into_iter().find(|k| k.available()).unwrap_or(Kernel::Portable)
    }
}

/// Reusable resampling state (coefficients, intermediate rows, accumulators, output).
#[derive(Debug, Default)]
pub struct BoxResampler {
    h: Coeffs,
    v: Coeffs,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    hw: MaddWeights,
    tmp: Vec<u8>,
    acc: Vec<i32>,
    kernel: Kernel,
}

impl BoxResampler {
    /// A resampler using the best SIMD level this CPU has.
    pub fn new() -> Self {
        BoxResampler { kernel: Kernel::best(), ..Default::default() }
    }

    /// The portable code path only (for testing the SIMD paths against it).
    pub fn portable() -> Self {
        BoxResampler::default()
    }

    /// A resampler forced to `kernel`, or `None` if this CPU cannot run it.
    pub fn with_kernel(kernel: Kernel) -> Option<Self> {
        kernel.available().then(|| BoxResampler { kernel, ..Default::default() })
    }

    /// The kernel this resampler runs.
    pub fn kernel(&self) -> Kernel {
        self.kernel
    }

    /// Resamples with `filter` (in its pass order) the box `bbox = (left, top, width, height)`
    /// of `src` (`sw` x `sh` RGB8, rows of `sw * 3` bytes), with the filter clipped to `clip =
    /// [x0, y0, x1, y1]`, to a `dw` x `dh` RGB8 image written into `out` at `(dx, dy)` with rows
    /// of `out_stride` bytes.
    #[allow(clippy::too_many_arguments)]
    pub fn resample_into(
        &mut self,
        filter: Filter,
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
        self.h.compute(filter.interpolation, vw, bx - x0 as f64, bx + bw - x0 as f64, dw);
        self.v.compute(filter.interpolation, vh, by - y0 as f64, by + bh - y0 as f64, dh);
        let (h, v, hw, acc) = (&self.h, &self.v, &mut self.hw, &mut self.acc);
        let kernel = self.kernel;
        let window = &src[(y0 * sw + x0) * 3..];
        let (stride, out_at) = (sw * 3, dy * out_stride + dx * 3);
        if filter.vertical_first {
            // Vertical pass over the window's columns into `dh` rows, then the horizontal pass
            // straight into the output rows.
            let row_len = vw * 3;
            // Never shrunk: the vertical pass writes every byte the horizontal pass reads.
            if self.tmp.len() < dh * row_len {
                grow(&mut self.tmp, dh * row_len, 0);
            }
            vertical_pass(kernel, v, window, stride, row_len, 0, acc, &mut self.tmp, 0, row_len);
            let tmp = &self.tmp;
            let row = |r: usize| &tmp[r * row_len..(r + 1) * row_len];
            horizontal_pass(kernel, h, hw, dh, row, out, out_at, out_stride);
            return;
        }
        let first = v.bounds[0].0;
        let last = v.bounds.iter().map(|&(s, n)| s + n).max().unwrap_or(first);
        let row_len = dw * 3;
        let rows = last - first;
        // Never shrunk: the horizontal pass writes every byte the vertical pass reads, so a
        // crop after a smaller one need not zero-fill the difference.
        if self.tmp.len() < rows * row_len {
            grow(&mut self.tmp, rows * row_len, 0);
        }
        // Horizontal pass over only the rows the vertical pass reads, then the vertical pass
        // straight into the output rows.
        let row = |r: usize| &window[(first + r) * stride..(first + r) * stride + vw * 3];
        horizontal_pass(kernel, h, hw, rows, row, &mut self.tmp, 0, row_len);
        vertical_pass(kernel, v, &self.tmp, row_len, row_len, first, acc, out, out_at, out_stride);
    }
}

/// The horizontal pass of `h` over `rows` rows: input row `r` is `row(r)` (the window's
/// bytes), its output the `h.bounds.len() * 3` bytes at `out[at + r * stride..]`. Several rows
/// at a time where `kernel` has the instructions.
#[allow(clippy::too_many_arguments)]
fn horizontal_pass<'a>(
    kernel: Kernel,
    h: &Coeffs,
    hw: &mut MaddWeights,
    rows: usize,
    row: impl Fn(usize) -> &'a [u8],
    out: &mut [u8],
    at: usize,
    stride: usize,
) {
    let len = h.bounds.len() * 3;
    let mut r0 = 0;
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx512 && rows >= 4 {
        hw.build(h, 4, row(0).len());
        while r0 + 4 <= rows {
            let rs = [row(r0), row(r0 + 1), row(r0 + 2), row(r0 + 3)];
            let chunk = &mut out[at + r0 * stride..at + (r0 + 3) * stride + len];
            let (a, rest) = chunk.split_at_mut(stride);
            let (b, rest) = rest.split_at_mut(stride);
            let (c, d) = rest.split_at_mut(stride);
            // SAFETY: the kernel is only chosen when AVX-512F/BW are available; `hw` was just
            // built from `h` with 4 lanes, for rows of this length.
            unsafe { horizontal_rows4_avx512(rs, h, hw, [a, b, c, d]) };
            r0 += 4;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Avx2 && rows >= 2 {
        hw.build(h, 2, row(0).len());
        while r0 + 2 <= rows {
            let chunk = &mut out[at + r0 * stride..at + (r0 + 1) * stride + len];
            let (head, tail) = chunk.split_at_mut(stride);
            // SAFETY: the kernel is only chosen when AVX2 is available; `hw` was just built
            // from `h` with 2 lanes, for rows of this length.
            unsafe { horizontal_rows2_avx2(row(r0), row(r0 + 1), h, hw, head, tail) };
            r0 += 2;
        }
    }
    for r in r0..rows {
        let dst = &mut out[at + r * stride..at + r * stride + len];
        #[cfg(target_arch = "x86_64")]
        if matches!(kernel, Kernel::Avx512 | Kernel::Avx2 | Kernel::Sse41) {
            // SAFETY: these kernels are only chosen when SSE4.1 is available (AVX2 implies it).
            unsafe { horizontal_row_sse41(row(r), h, dst) };
            continue;
        }
        horizontal_row_scalar(row(r), h, dst);
    }
    let _ = (kernel, hw);
}

/// The vertical pass of `v` over rows of `row_len` bytes, input row `r` at `input[r *
/// in_stride..]` (`first` is the input row that `v`'s row 0 is), output row `yy` at `out[at +
/// yy * stride..]`.
#[allow(clippy::too_many_arguments)]
fn vertical_pass(
    kernel: Kernel,
    v: &Coeffs,
    input: &[u8],
    in_stride: usize,
    row_len: usize,
    first: usize,
    acc: &mut Vec<i32>,
    out: &mut [u8],
    at: usize,
    stride: usize,
) {
    grow(acc, row_len, 0);
    for (yy, &(start, n)) in v.bounds.iter().enumerate() {
        let k = &v.k[yy * v.ksize..yy * v.ksize + n];
        let o = &mut out[at + yy * stride..at + yy * stride + row_len];
        #[cfg(target_arch = "x86_64")]
        if matches!(kernel, Kernel::Avx512 | Kernel::Avx2) {
            // SAFETY: both kernels are only chosen when AVX2 is available.
            unsafe { vertical_row_avx2(input, in_stride, row_len, start - first, k, acc, o) };
            continue;
        }
        vertical_row_generic(input, in_stride, row_len, start - first, k, acc, o);
    }
    let _ = kernel;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every filter in both pass orders.
    const FILTERS: [Filter; 6] = [
        filter(Interpolation::Bilinear, false),
        filter(Interpolation::Bicubic, false),
        filter(Interpolation::Nearest, false),
        filter(Interpolation::Bilinear, true),
        filter(Interpolation::Bicubic, true),
        filter(Interpolation::Nearest, true),
    ];

    const fn filter(interpolation: Interpolation, vertical_first: bool) -> Filter {
        Filter { interpolation, vertical_first }
    }

    fn image(w: usize, h: usize) -> Vec<u8> {
        (0..w * h * 3).map(|i| ((i * 37 + (i / 7) * 11) % 256) as u8).collect()
    }

    #[test]
    fn identity_is_a_copy() {
        let (w, h) = (13, 7);
        let src = image(w, h);
        let mut out = vec![0u8; w * h * 3];
        BoxResampler::new().resample_into(
            Filter::BILINEAR,
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
            for f in FILTERS {
                BoxResampler::new().resample_into(f, &src, w, bbox, clip, dw, dh, &mut a, 0, 0, dw * 3);
                BoxResampler::portable().resample_into(f, &src, w, bbox, clip, dw, dh, &mut b, 0, 0, dw * 3);
                assert_eq!(a, b, "{f:?} {bbox:?}");
            }
        }
    }

    /// xorshift64: deterministic test randomness.
    struct Xs(u64);
    impl Xs {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in `lo..=hi`.
        fn int(&mut self, lo: usize, hi: usize) -> usize {
            lo + (self.next() % (hi - lo + 1) as u64) as usize
        }
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Resamples with `kernel` and with the portable path into a padded canvas and compares.
    #[allow(clippy::too_many_arguments)]
    fn check(
        kernel: Kernel,
        filter: Filter,
        src: &[u8],
        w: usize,
        bbox: [f64; 4],
        clip: [usize; 4],
        dw: usize,
        dh: usize,
        pad: (usize, usize),
    ) {
        let (ow, oh) = (dw + 2 * pad.0, dh + 2 * pad.1);
        let mut a = vec![7u8; ow * oh * 3];
        let mut b = a.clone();
        let mut ka = BoxResampler::with_kernel(kernel).unwrap();
        assert_eq!(ka.kernel(), kernel);
        ka.resample_into(filter, src, w, bbox, clip, dw, dh, &mut a, pad.0, pad.1, ow * 3);
        BoxResampler::portable().resample_into(filter, src, w, bbox, clip, dw, dh, &mut b, pad.0, pad.1, ow * 3);
        assert!(
            a == b,
            "{kernel:?} {filter:?}: src width {w}, bbox {bbox:?}, clip {clip:?}, out {dw}x{dh}, pad {pad:?}"
        );
    }

    #[test]
    fn every_kernel_equals_the_portable_path_on_random_boxes() {
        let mut rng = Xs(0x5EED_1234_ABCD_0001);
        let kernels: Vec<Kernel> = Kernel::ALL.into_iter().filter(|k| k.available()).collect();
        eprintln!("kernels tested: {kernels:?}");
        let mut cases = 0;
        for i in 0..400usize {
            // Small and odd sizes often, a few large ones.
            let (w, h) = if i.is_multiple_of(40) {
                (rng.int(300, 700), rng.int(200, 500))
            } else {
                (rng.int(1, 70), rng.int(1, 50))
            };
            let src: Vec<u8> = (0..w * h * 3).map(|_| rng.next() as u8).collect();
            let hard = rng.next().is_multiple_of(2);
            // A box, sometimes touching the image's edges, sometimes the whole image.
            let (bx, by, bw, bh) = match rng.next() % 4 {
                0 => (0.0, 0.0, w as f64, h as f64),
                1 => {
                    let bw = rng.int(1, w) as f64;
                    let bh = rng.int(1, h) as f64;
                    (w as f64 - bw, h as f64 - bh, bw, bh)
                }
                _ => {
                    let bw = (rng.unit() * w as f64).max(0.5);
                    let bh = (rng.unit() * h as f64).max(0.5);
                    (rng.unit() * (w as f64 - bw), rng.unit() * (h as f64 - bh), bw, bh)
                }
            };
            let clip = if hard {
                let l = (bx.floor() as usize).min(w - 1);
                let t = (by.floor() as usize).min(h - 1);
                let r = ((bx + bw).ceil() as usize).clamp(l + 1, w);
                let b = ((by + bh).ceil() as usize).clamp(t + 1, h);
                [l, t, r, b]
            } else {
                [0, 0, w, h]
            };
            // Downscales, upscales and 1-pixel outputs.
            let pick = |rng: &mut Xs, n: f64| match rng.next() % 5 {
                0 => 1,
                1 => rng.int(1, 7),
                2 => (n * (1.0 + 3.0 * rng.unit())).ceil() as usize,
                _ => ((n * rng.unit()).ceil() as usize).max(1),
            };
            let (dw, dh) = (pick(&mut rng, bw).min(400), pick(&mut rng, bh).min(400));
            let pad = if rng.next().is_multiple_of(3) { (rng.int(0, 5), rng.int(0, 5)) } else { (0, 0) };
            for &k in &kernels {
                let f = FILTERS[i % FILTERS.len()];
                check(k, f, &src, w, [bx, by, bw, bh], clip, dw, dh, pad);
                cases += 1;
            }
        }
        assert!(cases >= 400);
    }

    #[test]
    fn every_kernel_equals_the_portable_path_on_train_like_crops() {
        // ImageNet-like sizes cropped and resized to 224, as RandomResizedCrop does.
        let mut rng = Xs(0xC0FF_EE00_0000_0042);
        for _ in 0..12 {
            let (w, h) = (rng.int(200, 640), rng.int(200, 480));
            let src: Vec<u8> = (0..w * h * 3).map(|_| rng.next() as u8).collect();
            let (bw, bh) = (rng.int(8, w), rng.int(8, h));
            let (l, t) = (rng.int(0, w - bw), rng.int(0, h - bh));
            for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
                let bbox = [l as f64, t as f64, bw as f64, bh as f64];
                for f in FILTERS {
                    check(k, f, &src, w, bbox, [l, t, l + bw, t + bh], 224, 224, (0, 0));
                    check(k, f, &src, w, bbox, [0, 0, w, h], 224, 224, (0, 0));
                }
            }
        }
    }

    #[test]
    fn coefficients_match_pillow_for_a_halving() {
        // Pillow, 4 -> 2 bilinear: support 2, out 0 centred at 1.0 reads inputs 0..3 with
        // weights 0.75, 0.75, 0.25 before normalisation.
        let mut c = Coeffs::default();
        c.compute(Interpolation::Bilinear, 4, 0.0, 4.0, 2);
        assert_eq!(c.bounds, vec![(0, 3), (1, 3)]);
        let w = &c.pre[..3];
        assert!(
            (w[0] - 3.0 / 7.0).abs() < 1e-12 && (w[1] - 3.0 / 7.0).abs() < 1e-12 && (w[2] - 1.0 / 7.0).abs() < 1e-12,
            "{w:?}"
        );
    }

    #[test]
    fn bicubic_coefficients_match_pillow() {
        // Pillow's bicubic (a = -0.5) at the taps of an 8 -> 4 halving: support 4, output 0
        // centred at 1.0 reads inputs 0..5, output 1 (at 3.0) inputs 0..7; output 0's weights
        // are w((x + 0.5 - 1) / 2) normalised.
        assert_eq!((bicubic(0.0), bicubic(1.0), bicubic(2.0), bicubic(-0.5)), (1.0, 0.0, 0.0, 0.5625));
        assert_eq!(bicubic(1.5), -0.0625);
        let mut c = Coeffs::default();
        c.compute(Interpolation::Bicubic, 8, 0.0, 8.0, 4);
        assert_eq!((c.ksize, c.bounds[0], c.bounds[1]), (9, (0, 5), (0, 7)));
        let raw: Vec<f64> = (0..5).map(|x| bicubic((x as f64 - 1.0 + 0.5) / 2.0)).collect();
        let sum: f64 = raw.iter().sum();
        for (got, want) in c.pre[..5].iter().zip(&raw) {
            assert_eq!(*got, want / sum);
        }
        // Negative weights round away from zero, as normalize_coeffs_8bpc.
        let neg = c.pre[..5].iter().position(|&p| p < 0.0).unwrap();
        assert_eq!(c.k[neg], (-0.5 + c.pre[neg] * (1u64 << PRECISION_BITS) as f64) as i32);
        // The identity is a copy for every filter (bicubic's taps at +-1, +-2 weigh zero).
        let (w, h) = (13, 7);
        let src = image(w, h);
        for f in FILTERS {
            let mut out = vec![0u8; w * h * 3];
            let whole = [0.0, 0.0, w as f64, h as f64];
            BoxResampler::new().resample_into(f, &src, w, whole, [0, 0, w, h], w, h, &mut out, 0, 0, w * 3);
            assert_eq!(out, src, "{f:?}");
        }
    }

    #[test]
    fn bicubic_overshoot_saturates_like_pillow() {
        // A step 0 | 255 upscaled: the cubic rings below 0 and above 255 next to the edge; the
        // 8-bit passes clip (Pillow's clip8) in every kernel, so the row rises monotonically
        // (a wrapped sum would show as a dip or a spike).
        let (w, h) = (8, 2);
        let src: Vec<u8> = (0..w * h).flat_map(|i| [if i % w < 4 { 0 } else { 255 }; 3]).collect();
        for k in Kernel::ALL.into_iter().filter(|k| k.available()) {
            let mut out = vec![0u8; 32 * 2 * 3];
            let mut r = BoxResampler::with_kernel(k).unwrap();
            let bicubic = Filter { interpolation: Interpolation::Bicubic, vertical_first: false };
            r.resample_into(bicubic, &src, w, [0.0, 0.0, 8.0, 2.0], [0, 0, 8, 2], 32, 2, &mut out, 0, 0, 96);
            let row: Vec<u8> = out[..96].iter().step_by(3).copied().collect();
            assert!(row.starts_with(&[0, 0, 0]) && row.ends_with(&[255, 255, 255]), "{k:?} {row:?}");
            assert!(row.windows(2).all(|p| p[0] <= p[1]), "{k:?} {row:?}");
        }
    }

    #[test]
    fn the_pass_order_is_pillow_13s() {
        // Measured on Pillow 13.0.0 (bicubic): vertical first when the height shrinks by more
        // than twice as many pixels as the width (strictly); bilinear keeps horizontal first.
        let vf = |from, to| Filter::pillow(Interpolation::Bicubic, from, to).vertical_first;
        assert!(!vf((40, 50), (35, 40)) && vf((40, 50), (35, 39)) && !vf((40, 50), (35, 41)));
        assert!(vf((30, 80), (31, 20)) && vf((30, 80), (29, 20)) && !vf((30, 80), (20, 60)));
        assert!(!vf((60, 50), (90, 70)) && vf((333, 500), (700, 180)));
        assert!(!Filter::pillow(Interpolation::Bilinear, (333, 500), (700, 180)).vertical_first);
    }

    #[test]
    fn nearest_takes_pillows_pixels() {
        // Pillow: output x takes floor(a/2 + x*a) (accumulated), a = in / out.
        let mut c = Coeffs::default();
        c.compute(Interpolation::Nearest, 5, 0.0, 5.0, 3);
        assert_eq!(c.bounds, vec![(0, 1), (2, 1), (4, 1)]);
        c.compute(Interpolation::Nearest, 2, 0.0, 2.0, 5);
        assert_eq!(c.bounds.iter().map(|b| b.0).collect::<Vec<_>>(), vec![0, 0, 1, 1, 1]);
        // A window into a resize of the whole axis (Resize 10 -> 4, then pixels 1..3) picks
        // what the whole resize picks there.
        c.compute(Interpolation::Nearest, 10, 0.0, 10.0, 4);
        let whole: Vec<usize> = c.bounds.iter().map(|b| b.0).collect();
        c.compute(Interpolation::Nearest, 10, 2.5, 7.5, 2);
        assert_eq!(c.bounds.iter().map(|b| b.0).collect::<Vec<_>>(), whole[1..3]);
        assert!(c.k.iter().take(2).all(|&k| k == 1 << PRECISION_BITS));
    }
}
