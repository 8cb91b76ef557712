"""Well-known training recipes in one call: ``stoker.transforms.recipe(name)``.

Each recipe is the augmentation part of a published training setup, written with stoker's
transforms, with the source of every setting, and where stoker differs from it said in
``Recipe.differences``. What is not data loading (the loss's label smoothing, EMA, the optimizer)
stays in the training script; ``Recipe.trainer`` lists it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    BatchTransform,
    CenterCrop,
    CutMix,
    MixUp,
    Mixup,
    Normalize,
    RandomChoice,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    TimmRandAugment,
    ToTensor,
    Transform,
    TrivialAugmentWide,
)

#: CLIP's normalisation (open_clip's ``OPENAI_DATASET_MEAN`` / ``OPENAI_DATASET_STD``).
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class Recipe:
    """A training recipe's data side: ``train`` and ``val`` transform lists, the batch mixing of
    training (``None`` for none), where each setting comes from, how stoker differs, and what
    the training script itself must do."""

    name: str
    train: list[Transform]
    val: list[Transform]
    batch_transform: BatchTransform | None
    source: str
    differences: list[str] = field(default_factory=list)
    trainer: list[str] = field(default_factory=list)

    def loader_kwargs(self, train: bool = True) -> dict[str, Any]:
        """The arguments of ``ImageLoader`` (or ``PairLoader``, for a recipe without mixing)
        for the training or the validation loader: ``ImageLoader(root, batch_size,
        **recipe.loader_kwargs())``."""
        kwargs: dict[str, Any] = {"transforms": list(self.train if train else self.val)}
        if train and self.batch_transform is not None:
            kwargs["batch_transform"] = self.batch_transform
        return kwargs


def _torchvision_resnet50_v2(num_classes: int) -> Recipe:
    norm = [ToTensor(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return Recipe(
        name="torchvision-resnet50-v2",
        train=[RandomResizedCrop(176), RandomHorizontalFlip(0.5), TrivialAugmentWide(), *norm, RandomErasing(p=0.1)],
        val=[Resize(232), CenterCrop(224), *norm],
        batch_transform=RandomChoice([MixUp(alpha=0.2, num_classes=num_classes),
                                      CutMix(alpha=1.0, num_classes=num_classes)]),
        source="torchvision's ResNet50_Weights.IMAGENET1K_V2: references/classification/train.py with "
               "--auto-augment ta_wide --random-erase 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 "
               "--train-crop-size 176 --val-resize-size 232 (the weights' meta['recipe']); the transforms of "
               "references/classification/presets.py (ClassificationPresetTrain / ClassificationPresetEval, "
               "bilinear, antialias=True); MixUp/CutMix as train.py's get_mixup_cutmix (v2.RandomChoice)",
        differences=["TrivialAugmentWide samples its geometric ops with nearest (torchvision's preset passes "
                     "bilinear; stoker's policies are nearest only)"],
        trainer=["CrossEntropyLoss(label_smoothing=0.1)", "--ra-sampler --ra-reps 4 (repeated augmentation): "
                 "not offered by stoker's sampler", "--model-ema, lr 0.5 cosine, 600 epochs, weight decay 2e-5"],
    )


def _timm_deit(num_classes: int) -> Recipe:
    norm = [ToTensor(), Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    return Recipe(
        name="timm-deit",
        train=[RandomResizedCrop(224, interpolation="bicubic"), RandomHorizontalFlip(0.5),
               TimmRandAugment("rand-m9-mstd0.5-inc1"), *norm,
               RandomErasing(p=0.25, scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3), value="random")],
        val=[Resize(248, interpolation="bicubic"), CenterCrop(224), *norm],
        batch_transform=Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, label_smoothing=0.1,
                              num_classes=num_classes),
        source="DeiT's main.py defaults (facebookresearch/deit: --aa rand-m9-mstd0.5-inc1 --reprob 0.25 "
               "--remode pixel --recount 1 --train-interpolation bicubic --mixup 0.8 --cutmix 1.0 "
               "--mixup-prob 1.0 --mixup-switch-prob 0.5 --smoothing 0.1) through timm's create_transform "
               "(RandomResizedCropAndInterpolation, scale (0.08, 1), RandomErasing min_area 0.02, max_area 1/3, "
               "aspect 0.3-3.3; with an auto-augment, no ColorJitter) and timm's Mixup; evaluation as timm's "
               "pretrained config of deit_*_patch16_224 (crop_pct 0.9: Resize 248, bicubic; DeiT's own "
               "repository evaluates at 0.875, Resize 256)",
        differences=["RandAugment's geometric ops sample with nearest (timm's with bilinear or bicubic at random)",
                     "RandAugment's posterize of 0 bits gives black (torchvision's); timm's raises with Pillow 13"],
        trainer=["SoftTargetCrossEntropy on the mixed, smoothed labels (Mixup carries the smoothing)",
                 "--repeated-aug (RASampler): not offered by stoker's sampler"],
    )


def _open_clip(num_classes: int) -> Recipe:
    del num_classes  # image-text pairs: no labels
    norm = [ToTensor(), Normalize(OPENAI_MEAN, OPENAI_STD)]
    return Recipe(
        name="open_clip",
        train=[RandomResizedCrop(224, scale=(0.9, 1.0), interpolation="bicubic"), *norm],
        val=[Resize(224, interpolation="bicubic"), CenterCrop(224), *norm],
        batch_transform=None,
        source="open_clip's image_transform (src/open_clip/transform.py): train RandomResizedCrop(image_size, "
               "scale=(0.9, 1.0), bicubic), ToTensor, Normalize(OPENAI_DATASET_MEAN/STD); eval Resize(image_size, "
               "bicubic) (resize_mode 'shortest'), CenterCrop(image_size); no flip",
        trainer=["for PairLoader: PairLoader(root, batch_size, tokenizer=..., **recipe.loader_kwargs())"],
    )


_RECIPES = {"torchvision-resnet50-v2": _torchvision_resnet50_v2, "timm-deit": _timm_deit, "open_clip": _open_clip}


def recipe(name: str, *, num_classes: int = 1000) -> Recipe:
    """The recipe ``name``: ``"torchvision-resnet50-v2"``, ``"timm-deit"`` or ``"open_clip"``;
    ``num_classes`` sizes the soft labels of the recipes that mix batches."""
    if name not in _RECIPES:
        raise ConfigError(f"invalid argument `recipe`: unknown recipe {name!r}; allowed: {', '.join(_RECIPES)}")
    return _RECIPES[name](int(num_classes))


__all__ = ["Recipe", "recipe", "OPENAI_MEAN", "OPENAI_STD"]
