"""``stoker.transforms.recipe`` (issue 50, item 4): each recipe's settings against the libraries
that define them (timm's ``create_transform`` and ``Mixup`` arguments for DeiT, torchvision's
``ResNet50_Weights.IMAGENET1K_V2`` evaluation transform), and every recipe running: a training
batch (mixed, soft labels, where the recipe mixes) and a validation batch, the same at 1 and 2
threads."""

import numpy as np
import pytest
import stoker
from helpers import in_python_child
from stoker import transforms as T

C = 7  # the demo's classes


def _spec(ts):
    return [t.spec() for t in ts]


def test_timm_deit_is_timms_create_transform():
    in_python_child("test_recipes", "check_timm_deit")


def check_timm_deit():
    from timm.data import create_transform, resolve_data_config
    from timm.data.random_erasing import RandomErasing
    from timm.data.transforms import RandomResizedCropAndInterpolation
    from timm.models import get_pretrained_cfg

    r = T.recipe("timm-deit", num_classes=1000)
    train = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                             re_prob=0.25, re_mode="pixel", re_count=1)
    steps = {type(t).__name__: t for t in train.transforms}
    rrc = next(t for t in train.transforms if isinstance(t, RandomResizedCropAndInterpolation))
    crop, flip, aa, _, norm, erase = r.train
    assert crop.spec()["size"] == [224, 224] and tuple(crop.spec()["scale"]) == tuple(rrc.scale)
    assert tuple(crop.spec()["ratio"]) == pytest.approx(tuple(rrc.ratio))
    assert crop.spec()["interpolation"] == rrc.interpolation.value == "bicubic"
    assert flip.spec()["p"] == steps["RandomHorizontalFlip"].p
    assert aa.spec()["config"] == "rand-m9-mstd0.5-inc1" and "ColorJitter" not in steps
    assert tuple(norm.spec()["mean"]) == pytest.approx(steps["Normalize"].mean.tolist())
    assert tuple(norm.spec()["std"]) == pytest.approx(steps["Normalize"].std.tolist())
    re = next(t for t in train.transforms if isinstance(t, RandomErasing))
    e = erase.spec()
    assert (e["p"], e["value"]) == (re.probability, None) and re.mode == "pixel" and re.max_count == 1
    assert tuple(e["scale"]) == pytest.approx((re.min_area, re.max_area))
    assert np.log(e["ratio"]) == pytest.approx(re.log_aspect_ratio)
    # Evaluation: DeiT's pretrained config (crop_pct 0.875, bicubic) through timm's factory.
    cfg = resolve_data_config({}, pretrained_cfg=get_pretrained_cfg("deit_base_patch16_224").to_dict())
    val = create_transform(**cfg, is_training=False)
    resize, center = val.transforms[0], val.transforms[1]
    assert r.val[0].spec()["size"] == resize.size and r.val[0].spec()["interpolation"] == "bicubic"
    assert r.val[1].spec()["size"] == [center.size[0], center.size[1]]
    mix = r.batch_transform.spec()
    assert (mix["mixup_alpha"], mix["cutmix_alpha"], mix["switch_prob"], mix["label_smoothing"]) == (0.8, 1.0, 0.5,
                                                                                                      0.1)


def test_torchvision_resnet50_v2_evaluates_as_its_weights():
    in_python_child("test_recipes", "check_torchvision")


def check_torchvision():
    from torchvision.models import ResNet50_Weights

    r = T.recipe("torchvision-resnet50-v2", num_classes=1000)
    ev = ResNet50_Weights.IMAGENET1K_V2.transforms()
    resize, crop = r.val[0].spec(), r.val[1].spec()
    assert resize["size"] == ev.resize_size[0] and [crop["size"][0]] == ev.crop_size
    assert resize.get("interpolation", "bilinear") == ev.interpolation.value
    assert tuple(r.val[-1].spec()["mean"]) == pytest.approx(tuple(ev.mean))
    assert tuple(r.val[-1].spec()["std"]) == pytest.approx(tuple(ev.std))
    mix = r.batch_transform.spec()
    assert (mix["mixup_alpha"], mix["cutmix_alpha"], mix["switch_prob"], mix["style"]) == (0.2, 1.0, 0.5,
                                                                                            "torchvision")


@pytest.mark.parametrize("name", ["torchvision-resnet50-v2", "timm-deit", "open_clip"])
def test_every_recipe_runs_the_same_at_any_thread_count(demo, name):
    r = T.recipe(name, num_classes=C)
    assert r.source and r.name == name

    def first(threads, train):
        kw = r.loader_kwargs(train)
        loader = stoker.ImageLoader(str(demo), 8, shuffle=True, seed=3, threads=threads, output="numpy", **kw)
        return next(iter(loader))

    a, b = first(1, True), first(2, True)
    if r.batch_transform is not None:
        (xa, ya), (xb, yb) = a, b
        assert ya.shape == (8, C) and np.allclose(ya.sum(1), 1.0)
        np.testing.assert_array_equal(ya, yb)
    else:
        (xa, _), (xb, _) = a, b
    assert xa.dtype == np.float32 and xa.shape[0] == 8
    np.testing.assert_array_equal(xa, xb)
    (v, _) = first(2, False)
    assert v.shape == (8, 3, 224, 224)


def test_random_choice_is_mixup_or_cutmix_per_batch(demo):
    mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=C), T.CutMix(alpha=1.0, num_classes=C)])
    loader = stoker.ImageLoader(str(demo), 8, transforms=[T.RandomResizedCrop(32), T.ToTensor()], shuffle=True,
                                seed=5, drop_last=True, batch_transform=mix, output="numpy")
    n = sum(1 for _ in loader)
    kinds = [loader.mix_params(0, k)["cutmix"] for k in range(n)]
    assert n >= 5 and any(kinds) and not all(kinds)
    with pytest.raises(stoker.ConfigError, match="one MixUp and one CutMix"):
        T.RandomChoice([T.MixUp(num_classes=C), T.MixUp(num_classes=C)])
    with pytest.raises(stoker.ConfigError, match="unknown recipe"):
        T.recipe("imagenet-2012")
