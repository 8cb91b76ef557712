//! The transform as plain data: the ops in torchvision's names and arguments ([`OpSpec`]),
//! the output's dtype and layout, and the whole [`TransformSpec`] (serde; checked and
//! compiled into a [`TransformPlan`](super::TransformPlan)).

use super::resample::Interpolation;
use crate::error::{Error, Result};

/// `Resize`'s size argument, as in torchvision.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ResizeSize {
    /// An int: the shorter side becomes this, keeping the aspect ratio.
    Shorter(usize),
    /// `(height, width)`: exactly this size.
    Exact([usize; 2]),
}

/// One transform, named and parameterised like torchvision's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op")]
pub enum OpSpec {
    /// `RandomResizedCrop(size, scale, ratio, interpolation)`, antialiased.
    RandomResizedCrop {
        /// Output `(height, width)`.
        size: [usize; 2],
        /// Range of the crop's area fraction.
        scale: [f64; 2],
        /// Range of the crop's aspect ratio (width / height).
        ratio: [f64; 2],
        /// The filter; bilinear (the default) is left out of the serialised spec, so that a
        /// bilinear transform's fingerprint is unchanged.
        #[serde(default, skip_serializing_if = "Interpolation::is_bilinear")]
        interpolation: Interpolation,
    },
    /// `Resize(size, interpolation)`, antialiased.
    Resize {
        /// Shorter side, or exact `(height, width)`.
        size: ResizeSize,
        /// The filter (bilinear by default, left out of the serialised spec when bilinear).
        #[serde(default, skip_serializing_if = "Interpolation::is_bilinear")]
        interpolation: Interpolation,
    },
    /// `CenterCrop(size)`; pads with zeros when the image is smaller, like torchvision.
    CenterCrop {
        /// Output `(height, width)`.
        size: [usize; 2],
    },
    /// `RandomHorizontalFlip(p)`.
    RandomHorizontalFlip {
        /// Probability of flipping.
        p: f64,
    },
    /// `Normalize(mean, std)` on values scaled to `[0, 1]` (after `ToTensor`).
    Normalize {
        /// Per-channel mean.
        mean: [f32; 3],
        /// Per-channel standard deviation.
        std: [f32; 3],
    },
    /// `ColorJitter(brightness, contrast, saturation, hue)` with each argument resolved to its
    /// factor range as torchvision resolves it (`0.4` -> `[0.6, 1.4]`, hue `0.1` -> `[-0.1,
    /// 0.1]`); `None` leaves that adjustment out. Applied in a random order.
    ColorJitter {
        /// Brightness factor range.
        #[serde(default)]
        brightness: Option<[f64; 2]>,
        /// Contrast factor range.
        #[serde(default)]
        contrast: Option<[f64; 2]>,
        /// Saturation factor range.
        #[serde(default)]
        saturation: Option<[f64; 2]>,
        /// Hue shift range, within `[-0.5, 0.5]`.
        #[serde(default)]
        hue: Option<[f64; 2]>,
    },
    /// `RandomGrayscale(p)`.
    RandomGrayscale {
        /// Probability of converting.
        p: f64,
    },
    /// `TrivialAugmentWide(num_magnitude_bins, interpolation, fill)`.
    TrivialAugmentWide {
        /// Magnitude bins (31).
        #[serde(default = "default_bins")]
        num_magnitude_bins: usize,
        /// Only `nearest`.
        #[serde(default = "default_interpolation")]
        interpolation: String,
        /// Fill of the geometric ops: none (zeros), one value or three.
        #[serde(default)]
        fill: Option<Vec<f64>>,
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`.
    RandAugment {
        /// Ops per image (2).
        #[serde(default = "default_num_ops")]
        num_ops: usize,
        /// The magnitude bin (9).
        #[serde(default = "default_magnitude")]
        magnitude: usize,
        /// Magnitude bins (31).
        #[serde(default = "default_bins")]
        num_magnitude_bins: usize,
        /// Only `nearest`.
        #[serde(default = "default_interpolation")]
        interpolation: String,
        /// Fill of the geometric ops.
        #[serde(default)]
        fill: Option<Vec<f64>>,
    },
    /// `AutoAugment(policy, interpolation, fill)`.
    AutoAugment {
        /// Only `imagenet`.
        #[serde(default = "default_policy")]
        policy: String,
        /// Only `nearest`.
        #[serde(default = "default_interpolation")]
        interpolation: String,
        /// Fill of the geometric ops.
        #[serde(default)]
        fill: Option<Vec<f64>>,
    },
    /// timm's RandAugment from its config string (`rand-m9-mstd0.5-inc1`), see
    /// [`augment::TimmRandAugment`]; the string is parsed by `stoker::args`.
    TimmRandAugment {
        /// timm's `rand-...` string.
        config: String,
        /// Fill of the geometric ops (timm's factory: the ImageNet mean in bytes, `(124, 116,
        /// 104)`).
        #[serde(default)]
        fill: Option<Vec<f64>>,
    },
    /// `RandomErasing(p, scale, ratio, value)`; `value` `None` is torchvision's `"random"`
    /// (standard normal values per element, timm's `mode='pixel'`).
    RandomErasing {
        /// Probability of erasing.
        p: f64,
        /// Range of the box's area fraction.
        scale: [f64; 2],
        /// Range of the box's aspect ratio.
        ratio: [f64; 2],
        /// One value or three, or `None` for random values.
        value: Option<Vec<f64>>,
    },
}

fn default_bins() -> usize {
    31
}
fn default_num_ops() -> usize {
    2
}
fn default_magnitude() -> usize {
    9
}
fn default_interpolation() -> String {
    "nearest".into()
}
fn default_policy() -> String {
    "imagenet".into()
}

impl OpSpec {
    /// Whether the op is an augmentation of the uint8 crop (after geometry and flip, before
    /// the write).
    pub fn is_augmentation(&self) -> bool {
        matches!(
            self,
            OpSpec::ColorJitter { .. }
                | OpSpec::RandomGrayscale { .. }
                | OpSpec::TrivialAugmentWide { .. }
                | OpSpec::RandAugment { .. }
                | OpSpec::AutoAugment { .. }
                | OpSpec::TimmRandAugment { .. }
        )
    }
}

/// How uint8 batches are normalised on the GPU (see [`TransformSpec::split_for_device`]): the
/// per-channel `mean` and `std` of `Normalize` on `[0, 1]` values, into `dtype`, with the
/// channels last (`NHWC`) or not.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceNormalize {
    /// Per-channel mean.
    pub mean: [f32; 3],
    /// Per-channel standard deviation.
    pub std: [f32; 3],
    /// `float32`, `float16` or `bfloat16`.
    pub dtype: String,
    /// Whether the channels are the last axis.
    pub channels_last: bool,
}

/// Element type of the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Raw 0..255 values.
    Uint8,
    /// IEEE half precision, values in `[0,1]` or normalised.
    Float16,
    /// Single precision, values in `[0,1]` or normalised.
    Float32,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::Uint8 => 1,
            DType::Float16 => 2,
            DType::Float32 => 4,
        }
    }

    /// Parses `uint8`, `float16`, `float32` (and the torch-style aliases `half`, `float`).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "uint8" | "u8" => Ok(DType::Uint8),
            "float16" | "f16" | "half" => Ok(DType::Float16),
            "float32" | "f32" | "float" => Ok(DType::Float32),
            _ => Err(Error::config("dtype", format!("unknown dtype {s:?}; allowed: uint8, float16, float32"))),
        }
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            DType::Uint8 => "uint8",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
        }
    }
}

/// Memory layout of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Layout {
    /// Batch, channel, height, width (PyTorch's default).
    NCHW,
    /// Batch, height, width, channel.
    NHWC,
}

impl Layout {
    /// Parses `nchw` / `nhwc` (any case).
    pub fn parse(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "nchw" => Ok(Layout::NCHW),
            "nhwc" => Ok(Layout::NHWC),
            _ => Err(Error::config("layout", format!("unknown layout {s:?}; allowed: nchw, nhwc"))),
        }
    }
}

/// The ImageNet channel means.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// The ImageNet channel standard deviations.
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// A whole transform: ops, output dtype and layout, and whether to honour EXIF orientation.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TransformSpec {
    /// The ops, in torchvision order.
    pub ops: Vec<OpSpec>,
    /// Output element type.
    pub dtype: DType,
    /// Output layout.
    pub layout: Layout,
    /// Apply JPEG EXIF orientation (torchvision's PIL loader does not).
    pub apply_exif: bool,
}

impl TransformSpec {
    /// A named preset: `imagenet-train` (RandomResizedCrop 224 + flip) or `imagenet-val`
    /// (Resize 256 + CenterCrop 224), both normalised with ImageNet statistics to float32 NCHW.
    pub fn preset(name: &str) -> Result<Self> {
        let geo = match name {
            "imagenet-train" => vec![
                OpSpec::RandomResizedCrop {
                    size: [224, 224],
                    scale: [0.08, 1.0],
                    ratio: [3.0 / 4.0, 4.0 / 3.0],
                    interpolation: Interpolation::Bilinear,
                },
                OpSpec::RandomHorizontalFlip { p: 0.5 },
            ],
            "imagenet-val" => {
                let resize = OpSpec::Resize { size: ResizeSize::Shorter(256), interpolation: Interpolation::Bilinear };
                vec![resize, OpSpec::CenterCrop { size: [224, 224] }]
            }
            _ => {
                return Err(Error::config(
                    "preset",
                    format!("unknown preset {name:?}; allowed: imagenet-train, imagenet-val"),
                ))
            }
        };
        let mut ops = geo;
        ops.push(OpSpec::Normalize { mean: IMAGENET_MEAN, std: IMAGENET_STD });
        Ok(TransformSpec { ops, dtype: DType::Float32, layout: Layout::NCHW, apply_exif: true })
    }

    /// For batches bound for a GPU: they cross the bus as uint8 and are normalised there into
    /// `dtype` (a name: `float32`, `float16` or `bfloat16`, which only the GPU side produces).
    /// Drops `Normalize` and makes this transform deliver uint8; returns what the GPU side
    /// applies (mean and std of the last `Normalize`, or none: `[0, 1]` values).
    pub fn split_for_device(&mut self, dtype: &str) -> DeviceNormalize {
        let (mean, std) = self
            .ops
            .iter()
            .rev()
            .find_map(|o| match o {
                OpSpec::Normalize { mean, std } => Some((*mean, *std)),
                _ => None,
            })
            .unwrap_or(([0.0; 3], [1.0; 3]));
        self.ops.retain(|o| !matches!(o, OpSpec::Normalize { .. }));
        self.dtype = DType::Uint8;
        DeviceNormalize { mean, std, dtype: dtype.to_string(), channels_last: self.layout == Layout::NHWC }
    }

    /// The filter of the geometric op (`Resize` or `RandomResizedCrop`; bilinear without one).
    pub fn interpolation(&self) -> Interpolation {
        self.ops
            .iter()
            .find_map(|o| match o {
                OpSpec::RandomResizedCrop { interpolation, .. } | OpSpec::Resize { interpolation, .. } => {
                    Some(*interpolation)
                }
                _ => None,
            })
            .unwrap_or_default()
    }

    /// The same transform with `interpolation` as the filter of its `Resize` and
    /// `RandomResizedCrop`.
    pub fn with_interpolation(mut self, interpolation: Interpolation) -> Self {
        for o in &mut self.ops {
            if let OpSpec::RandomResizedCrop { interpolation: i, .. } | OpSpec::Resize { interpolation: i, .. } = o {
                *i = interpolation;
            }
        }
        self
    }

    /// The same transform with another dtype; `uint8` drops `Normalize` (raw pixels).
    pub fn with_dtype(mut self, dtype: DType) -> Self {
        if dtype == DType::Uint8 {
            self.ops.retain(|o| !matches!(o, OpSpec::Normalize { .. }));
        }
        self.dtype = dtype;
        self
    }
}

/// The op's torchvision name, for errors.
pub(super) fn op_name(op: &OpSpec) -> &'static str {
    match op {
        OpSpec::RandomResizedCrop { .. } => "RandomResizedCrop",
        OpSpec::Resize { .. } => "Resize",
        OpSpec::CenterCrop { .. } => "CenterCrop",
        OpSpec::RandomHorizontalFlip { .. } => "RandomHorizontalFlip",
        OpSpec::Normalize { .. } => "Normalize",
        OpSpec::ColorJitter { .. } => "ColorJitter",
        OpSpec::RandomGrayscale { .. } => "RandomGrayscale",
        OpSpec::TrivialAugmentWide { .. } => "TrivialAugmentWide",
        OpSpec::RandAugment { .. } => "RandAugment",
        OpSpec::AutoAugment { .. } => "AutoAugment",
        OpSpec::TimmRandAugment { .. } => "TimmRandAugment",
        OpSpec::RandomErasing { .. } => "RandomErasing",
    }
}
