"""Transforms named and parameterised like torchvision's, compiled by stoker into one fused
resample and one write per sample.

Supported pipelines: ``[RandomResizedCrop]`` or ``[Resize, CenterCrop]`` (or either alone when
it fixes the output size), then optionally ``RandomHorizontalFlip``, then optionally ``ToTensor``
/ ``ToDtype`` and ``Normalize``. Without ``Normalize``/``ToTensor``/``ToDtype`` batches are uint8
(0..255); ``ToTensor()`` or ``ToDtype(float32, scale=True)`` gives floats in [0, 1];
``Normalize`` implies float32 unless ``ToDtype`` says float16.

``Resize`` and ``RandomResizedCrop`` take torchvision's ``interpolation``: ``"bilinear"`` (the
default), ``"bicubic"`` or ``"nearest"`` (a string, ``torchvision.transforms.InterpolationMode``
or ``PIL.Image.Resampling``), applied as torchvision's PIL path does with ``antialias=True``:
Pillow's antialiased convolutions (bicubic with ``a = -0.5``) and Pillow's nearest grid, the same
bytes as Pillow on the same pixels. torchvision's tensor path differs: on uint8 tensors its
bilinear/bicubic are within 1 level of Pillow's (2 when upscaling with bicubic); its ``NEAREST``
samples ``floor(x * in / out)`` (another grid) and ``NEAREST_EXACT`` Pillow's grid up to ties, so
both map to Pillow's ``NEAREST`` here, as torchvision's PIL path maps them.

Augmentations run on the uint8 crop after the geometry and the flip, before ``Normalize``, with
torchvision's tensor arithmetic (``transforms.v2``): ``ColorJitter``, ``RandomGrayscale``,
``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment`` (ImageNet policy). ``RandomErasing``
runs on the finished float sample (after ``Normalize``, as in torchvision's and timm's recipes;
placed before ``Normalize`` its values are normalised too). Random draws come from stoker's
per-sample streams (seed, epoch, index), not from PyTorch's generator: batches are the same
whatever the thread count, and resume is exact.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple, Union

from .errors import ConfigError

Size = Union[int, Sequence[int]]


def _pair(name: str, size: Size) -> Tuple[int, int]:
    if isinstance(size, int):
        return (size, size)
    if isinstance(size, (list, tuple)) and len(size) == 1:
        return (int(size[0]), int(size[0]))
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return (int(size[0]), int(size[1]))
    raise ConfigError(f"invalid argument `{name}.size`: expected an int or (height, width), got {size!r}")


class Transform:
    """Base class: a transform describes itself as a plain dict (its `spec`)."""

    def spec(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _interpolation(value: Any) -> Any:
    """The name of an interpolation: a string as given (lowercased), torchvision's
    ``InterpolationMode`` by its value, Pillow's ``Resampling`` by its name; anything else as
    it is. The engine checks it (``bilinear``, ``bicubic``, ``nearest``)."""
    if isinstance(value, str):
        return value.lower()
    mode = getattr(value, "value", None)
    if isinstance(mode, str):  # torchvision.transforms.InterpolationMode
        return mode
    name = getattr(value, "name", None)
    if isinstance(name, str) and type(value).__name__ == "Resampling":  # PIL.Image.Resampling
        return name.lower()
    return value


class RandomResizedCrop(Transform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio, interpolation)`` (antialiased;
    bilinear by default, ``"bicubic"`` or ``"nearest"``)."""

    def __init__(self, size: Size, scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0), interpolation: Any = "bilinear",
                 antialias: bool = True) -> None:
        if not antialias:
            raise ConfigError("invalid argument `RandomResizedCrop.antialias`: only True is supported")
        self.size = _pair("RandomResizedCrop", size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.interpolation = _interpolation(interpolation)

    def spec(self) -> dict[str, Any]:
        return {"op": "RandomResizedCrop", "size": list(self.size), "scale": list(self.scale),
                "ratio": list(self.ratio), "interpolation": self.interpolation}


class Resize(Transform):
    """torchvision's ``Resize(size, interpolation)``: an int resizes the shorter side; (h, w) is
    exact (antialiased; bilinear by default, ``"bicubic"`` or ``"nearest"``)."""

    def __init__(self, size: Size, interpolation: Any = "bilinear", antialias: bool = True) -> None:
        if not antialias:
            raise ConfigError("invalid argument `Resize.antialias`: only True is supported")
        self.size = size if isinstance(size, int) else _pair("Resize", size)
        self.interpolation = _interpolation(interpolation)

    def spec(self) -> dict[str, Any]:
        return {"op": "Resize", "size": self.size if isinstance(self.size, int) else list(self.size),
                "interpolation": self.interpolation}


class CenterCrop(Transform):
    """torchvision's ``CenterCrop(size)`` (zero padding when the image is smaller)."""

    def __init__(self, size: Size) -> None:
        self.size = _pair("CenterCrop", size)

    def spec(self) -> dict[str, Any]:
        return {"op": "CenterCrop", "size": list(self.size)}


class RandomHorizontalFlip(Transform):
    """torchvision's ``RandomHorizontalFlip(p)``."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = float(p)

    def spec(self) -> dict[str, Any]:
        return {"op": "RandomHorizontalFlip", "p": self.p}


class Normalize(Transform):
    """torchvision's ``Normalize(mean, std)`` on values scaled to [0, 1]."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        if len(mean) != 3 or len(std) != 3:
            raise ConfigError("invalid argument `Normalize`: mean and std need 3 values (RGB)")
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]

    def spec(self) -> dict[str, Any]:
        return {"op": "Normalize", "mean": self.mean, "std": self.std}


def _range(name: str, value: Any, center: float, bound: Tuple[float, float],
           clip_first_on_zero: bool = True) -> list[float] | None:
    """torchvision's ``ColorJitter._check_input``: a number ``v`` is ``[center - v, center + v]``
    (the lower end clipped at 0 for the factors), a pair is taken as is; ``None`` or a range that
    is only ``center`` turns the adjustment off."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(f"invalid argument `ColorJitter.{name}`: a single number must be non-negative, "
                              f"got {value}")
        lo, hi = center - float(value), center + float(value)
        if clip_first_on_zero:
            lo = max(lo, 0.0)
    elif isinstance(value, (list, tuple)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
    else:
        raise ConfigError(f"invalid argument `ColorJitter.{name}`: a number or (min, max), got {value!r}")
    if not bound[0] <= lo <= hi <= bound[1]:
        raise ConfigError(f"invalid argument `ColorJitter.{name}`: values must lie in {bound} and increase, "
                          f"got {[lo, hi]}")
    return None if lo == hi == center else [lo, hi]


def _mode(value: Any) -> str:
    """An interpolation or policy given as a string or an enum (torchvision's
    ``InterpolationMode`` / ``AutoAugmentPolicy``): its lower-case name."""
    return str(getattr(value, "value", value)).lower()


def _fill(fill: Any) -> list[float] | None:
    if fill is None:
        return None
    if isinstance(fill, dict):
        raise ConfigError("invalid argument `fill`: a fill per input type (a dict) is not supported; give one value "
                          "or three (RGB)")
    if isinstance(fill, (int, float)):
        return [float(fill)]
    return [float(v) for v in fill]


class ColorJitter(Transform):
    """torchvision's ``ColorJitter(brightness, contrast, saturation, hue)``: the four adjustments
    in a random order, each with a factor drawn uniformly from its range."""

    def __init__(self, brightness: Any = None, contrast: Any = None, saturation: Any = None,
                 hue: Any = None) -> None:
        inf = float("inf")
        self.brightness = _range("brightness", brightness, 1.0, (0.0, inf))
        self.contrast = _range("contrast", contrast, 1.0, (0.0, inf))
        self.saturation = _range("saturation", saturation, 1.0, (0.0, inf))
        self.hue = _range("hue", hue, 0.0, (-0.5, 0.5), clip_first_on_zero=False)

    def spec(self) -> dict[str, Any]:
        return {"op": "ColorJitter", "brightness": self.brightness, "contrast": self.contrast,
                "saturation": self.saturation, "hue": self.hue}


class RandomGrayscale(Transform):
    """torchvision's ``RandomGrayscale(p)`` (the grayscale in all three channels)."""

    def __init__(self, p: float = 0.1) -> None:
        self.p = float(p)

    def spec(self) -> dict[str, Any]:
        return {"op": "RandomGrayscale", "p": self.p}


class TrivialAugmentWide(Transform):
    """torchvision's ``TrivialAugmentWide(num_magnitude_bins, interpolation, fill)``; only
    NEAREST interpolation (torchvision's default)."""

    def __init__(self, num_magnitude_bins: int = 31, interpolation: Any = "nearest", fill: Any = None) -> None:
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.interpolation = _mode(interpolation)
        self.fill = _fill(fill)

    def spec(self) -> dict[str, Any]:
        return {"op": "TrivialAugmentWide", "num_magnitude_bins": self.num_magnitude_bins,
                "interpolation": self.interpolation, "fill": self.fill}


class RandAugment(Transform):
    """torchvision's ``RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)``;
    only NEAREST interpolation."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, num_magnitude_bins: int = 31,
                 interpolation: Any = "nearest", fill: Any = None) -> None:
        self.num_ops = int(num_ops)
        self.magnitude = int(magnitude)
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.interpolation = _mode(interpolation)
        self.fill = _fill(fill)
        if self.num_ops < 0 or self.magnitude < 0:
            raise ConfigError("invalid argument `RandAugment`: num_ops and magnitude must be non-negative")

    @staticmethod
    def from_timm(config: str, fill: Any = None) -> TimmRandAugment:
        """timm's RandAugment from its config string (``rand-m9-mstd0.5-inc1``): see
        :class:`TimmRandAugment`."""
        return TimmRandAugment(config, fill)

    def spec(self) -> dict[str, Any]:
        return {"op": "RandAugment", "num_ops": self.num_ops, "magnitude": self.magnitude,
                "num_magnitude_bins": self.num_magnitude_bins, "interpolation": self.interpolation,
                "fill": self.fill}


class AutoAugment(Transform):
    """torchvision's ``AutoAugment(policy, interpolation, fill)``; only the ImageNet policy and
    NEAREST interpolation."""

    def __init__(self, policy: Any = "imagenet", interpolation: Any = "nearest", fill: Any = None) -> None:
        self.policy = _mode(policy)
        self.interpolation = _mode(interpolation)
        self.fill = _fill(fill)

    def spec(self) -> dict[str, Any]:
        return {"op": "AutoAugment", "policy": self.policy, "interpolation": self.interpolation, "fill": self.fill}


class TimmRandAugment(Transform):
    """timm's RandAugment from its config string (``rand-m9-mstd0.5-inc1``: magnitude 9, noise of
    deviation 0.5 clipped to [0, 10], the increasing-severity op set; ``n``, ``p``, ``mmax``
    too), with timm's draws and stoker's arithmetic (torchvision's tensor kernels, nearest
    sampling; timm's Pillow ops differ: see ``python/tests/test_augment.py``). ``fill`` defaults
    to timm's factory's, the ImageNet mean in bytes ``(124, 116, 104)``."""

    def __init__(self, config: str, fill: Any = None) -> None:
        if not isinstance(config, str):
            raise ConfigError(f"invalid argument `TimmRandAugment.config`: a string such as 'rand-m9-mstd0.5-inc1', "
                              f"got {config!r}")
        self.config = config
        self.fill = _fill(fill)

    def spec(self) -> dict[str, Any]:
        return {"op": "TimmRandAugment", "config": self.config, "fill": self.fill}


def rand_augment(config: str, fill: Any = None) -> TimmRandAugment:
    """timm's ``rand_augment_transform(config)``: see :class:`TimmRandAugment`."""
    return TimmRandAugment(config, fill)


class RandomErasing(Transform):
    """torchvision's ``RandomErasing(p, scale, ratio, value)``: ``value`` a number, three numbers
    or ``"random"`` (standard normal values, timm's ``mode='pixel'``)."""

    def __init__(self, p: float = 0.5, scale: Sequence[float] = (0.02, 0.33), ratio: Sequence[float] = (0.3, 3.3),
                 value: Any = 0.0, inplace: bool = False) -> None:
        self.p = float(p)
        self.scale = [float(scale[0]), float(scale[1])]
        self.ratio = [float(ratio[0]), float(ratio[1])]
        if isinstance(value, str):
            if value != "random":
                raise ConfigError(f"invalid argument `RandomErasing.value`: a string must be 'random', got {value!r}")
            self.value: list[float] | None = None
        elif isinstance(value, (int, float)):
            self.value = [float(value)]
        else:
            self.value = [float(v) for v in value]

    def spec(self) -> dict[str, Any]:
        return {"op": "RandomErasing", "p": self.p, "scale": self.scale, "ratio": self.ratio, "value": self.value}


def dtype_name(dtype: Any) -> str:
    """'uint8', 'float16' or 'float32' from a string, a NumPy dtype or a torch dtype (the
    engine checks the name)."""
    from . import _stoker

    return _stoker.dtype_name(str(dtype).replace("torch.", ""))


class ToDtype(Transform):
    """torchvision v2's ``ToDtype(dtype, scale=True)``: uint8, float16 or float32 output."""

    def __init__(self, dtype: Any, scale: bool = True) -> None:
        self.dtype = dtype_name(dtype)
        if self.dtype != "uint8" and not scale:
            raise ConfigError("invalid argument `ToDtype.scale`: float output is always scaled to [0, 1]")
        self.scale = scale

    def spec(self) -> None:
        return None


class ToTensor(ToDtype):
    """torchvision's ``ToTensor()``: float32 in [0, 1] (stoker's layout is set on the loader)."""

    def __init__(self) -> None:
        super().__init__("float32")


class BatchTransform:
    """Base class of the batch mixings given to ``ImageLoader(batch_transform=...)``: they run
    in stoker on each finished host batch (on its threads, one draw per batch from the batch's
    own random stream; with ``device='cuda'`` the images are mixed on the GPU after their
    normalisation, with the same draw and arithmetic), and the loader then yields ``(images,
    targets)``, ``targets`` the soft labels (float32 ``[N, num_classes]``)."""

    def spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


def _classes(name: str, num_classes: Any) -> int:
    if num_classes is None:
        raise ConfigError(f"invalid argument `{name}.num_classes`: give the number of classes (the soft labels' width)")
    return int(num_classes)


class MixUp(BatchTransform):
    """torchvision v2's ``MixUp(alpha, num_classes)``: lambda from Beta(alpha, alpha), each sample
    mixed with the previous one (the batch rolled by one), one-hot labels mixed alike."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None) -> None:
        self.alpha = float(alpha)
        self.num_classes = _classes("MixUp", num_classes)

    def spec(self) -> dict[str, Any]:
        return {"mixup_alpha": self.alpha, "cutmix_alpha": 0.0, "prob": 1.0, "switch_prob": 0.0,
                "label_smoothing": 0.0, "num_classes": self.num_classes, "style": "torchvision"}


class CutMix(BatchTransform):
    """torchvision v2's ``CutMix(alpha, num_classes)``: a box of the previous sample pasted in,
    lambda recomputed from the box's area after clipping."""

    def __init__(self, *, alpha: float = 1.0, num_classes: int | None = None) -> None:
        self.alpha = float(alpha)
        self.num_classes = _classes("CutMix", num_classes)

    def spec(self) -> dict[str, Any]:
        return {"mixup_alpha": 0.0, "cutmix_alpha": self.alpha, "prob": 1.0, "switch_prob": 0.0,
                "label_smoothing": 0.0, "num_classes": self.num_classes, "style": "torchvision"}


class RandomChoice(BatchTransform):
    """torchvision v2's ``RandomChoice([MixUp(...), CutMix(...)], p)``, as its reference recipe
    (``--mixup-alpha 0.2 --cutmix-alpha 1.0``) builds it: each batch either MixUp or CutMix,
    CutMix with its weight in ``p`` (equal weights by default), each with its own alpha. Only that
    pair (in either order)."""

    def __init__(self, transforms: Sequence[BatchTransform], p: Sequence[float] | None = None) -> None:
        ts = list(transforms)
        kinds = sorted(type(t).__name__ for t in ts)
        if kinds != ["CutMix", "MixUp"]:
            raise ConfigError(f"invalid argument `RandomChoice.transforms`: one MixUp and one CutMix, got {kinds}")
        weights = [1.0, 1.0] if p is None else [float(w) for w in p]
        if len(weights) != 2 or min(weights) < 0 or sum(weights) <= 0:
            raise ConfigError(f"invalid argument `RandomChoice.p`: two non-negative weights, got {p!r}")
        mixup = next(t for t in ts if isinstance(t, MixUp))
        cutmix = next(t for t in ts if isinstance(t, CutMix))
        if mixup.num_classes != cutmix.num_classes:
            raise ConfigError("invalid argument `RandomChoice.transforms`: MixUp and CutMix with other num_classes")
        self.mixup, self.cutmix = mixup, cutmix
        self.p_cutmix = weights[ts.index(cutmix)] / sum(weights)

    def spec(self) -> dict[str, Any]:
        return {"mixup_alpha": self.mixup.alpha, "cutmix_alpha": self.cutmix.alpha, "prob": 1.0,
                "switch_prob": self.p_cutmix, "label_smoothing": 0.0, "num_classes": self.mixup.num_classes,
                "style": "torchvision"}


class Mixup(BatchTransform):
    """timm's ``Mixup`` (``mode='batch'``): mixed with probability ``prob``, CutMix instead of MixUp
    with ``switch_prob`` when both alphas are positive, the batch paired with its reverse (sample
    ``i`` with ``N - 1 - i``), lambda corrected to the clipped box's area, smoothed soft labels."""

    def __init__(self, mixup_alpha: float = 1.0, cutmix_alpha: float = 0.0, cutmix_minmax: Any = None,
                 prob: float = 1.0, switch_prob: float = 0.5, mode: str = "batch", correct_lam: bool = True,
                 label_smoothing: float = 0.1, num_classes: int = 1000) -> None:
        if cutmix_minmax is not None or mode != "batch" or not correct_lam:
            raise ConfigError("invalid argument `Mixup`: only cutmix_minmax=None, mode='batch' and correct_lam=True "
                              "are supported")
        self.mixup_alpha = float(mixup_alpha)
        self.cutmix_alpha = float(cutmix_alpha)
        self.prob = float(prob)
        self.switch_prob = float(switch_prob)
        self.label_smoothing = float(label_smoothing)
        self.num_classes = _classes("Mixup", num_classes)

    def spec(self) -> dict[str, Any]:
        return {"mixup_alpha": self.mixup_alpha, "cutmix_alpha": self.cutmix_alpha, "prob": self.prob,
                "switch_prob": self.switch_prob, "label_smoothing": self.label_smoothing,
                "num_classes": self.num_classes, "style": "timm"}


IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def compile_transforms(transforms: Sequence[Transform]) -> tuple[list[dict[str, Any]], str]:
    """The op specs and the output dtype of a transform list."""
    ops: list[dict[str, Any]] = []
    dtype = None
    normalize = False
    for t in transforms:
        if not isinstance(t, Transform):
            raise ConfigError(f"invalid argument `transforms`: {t!r} is not a stoker.transforms transform; "
                              "allowed: RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, Normalize, "
                              "ToTensor, ToDtype, ColorJitter, RandomGrayscale, TrivialAugmentWide, RandAugment, "
                              "AutoAugment, TimmRandAugment, RandomErasing")
        if isinstance(t, ToDtype):
            dtype = t.dtype
            continue
        if isinstance(t, Normalize):
            normalize = True
        ops.append(t.spec())  # type: ignore[arg-type]
    if dtype is None:
        dtype = "float32" if normalize else "uint8"
    return ops, dtype


def recipe(name: str, *, num_classes: int = 1000) -> Any:
    """A well-known training recipe's transforms and batch mixing in one call
    (``"torchvision-resnet50-v2"``, ``"timm-deit"``, ``"open_clip"``): a
    :class:`stoker.recipes.Recipe`; ``ImageLoader(root, batch_size, **r.loader_kwargs())``.
    See :mod:`stoker.recipes` for the source of each setting."""
    from .recipes import recipe as build  # the recipes are built from this module's transforms

    return build(name, num_classes=num_classes)


__all__ = ["Transform", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip", "Normalize",
           "ToDtype", "ToTensor", "BatchTransform", "MixUp", "CutMix", "RandomChoice", "Mixup", "ColorJitter",
           "RandomGrayscale", "TrivialAugmentWide", "RandAugment", "AutoAugment", "TimmRandAugment", "rand_augment",
           "RandomErasing", "IMAGENET_MEAN", "IMAGENET_STD", "recipe"]
