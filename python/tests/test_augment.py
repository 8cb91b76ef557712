"""The augmentations against torchvision's tensor kernels, op by op, on real photos (the demo's),
and in the loader: the same batches at 1, 2 and 8 threads, exact resume, the recipe in the
fingerprint, the `augment` stage in the report, and clear refusals.

stoker cannot replay PyTorch's generator, so the ops are compared with explicit parameters
(`_stoker.augment_op`, the engine's kernels) against torchvision's
`_apply_image_or_video_transform` and `transforms.v2.functional`, over every magnitude bin of
torchvision's spaces, and against timm's Pillow ops; those comparisons live in
`augment_reference.py` and run in a child process (torchvision and timm would add 160 MB to this
process, which the RSS-bounded tests fork from). Stated agreement (uint8 images):

- bit-exact: Identity, ShearX/Y, TranslateX/Y, Rotate (nearest, any fill), Brightness, Color
  (saturation), Contrast, Posterize, Solarize, AutoContrast, Equalize, Invert, Grayscale;
- within 1 level: Sharpness (the 3x3 convolution's float32 summation order), Hue (float32
  RGB->HSV->RGB); the share of bytes that differ is printed and bounded (0 measured);
- timm (Pillow): Equalize, Invert, Posterize 1-8 bits, Solarize, SolarizeAdd bit-exact;
  AutoContrast, Brightness, Color, Contrast, Sharpness within 1 level; the geometric ops are not
  compared (timm samples bilinear or bicubic, stoker nearest).
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import stoker
import stoker.transforms as T

REFERENCE_CHECKS = [f"bit_exact[{op}]" for op in (
    "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
    "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert")] + [
    "posterize_zero_bits", "color_jitter_factors", "grayscale", "within_one_level[Sharpness]",
    "within_one_level[Hue]", "timm_integer_ops", "timm_float_ops"]


@pytest.fixture(scope="module")
def reference(demo):
    """The op-by-op checks of ``augment_reference.py``, run once in a child process (torchvision
    and timm stay out of this process)."""
    missing = [m for m in ("torch", "torchvision", "timm") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: the reference comparisons are skipped")
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("augment_reference.py")), str(demo)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("check", REFERENCE_CHECKS)
def test_against_torchvision_and_timm(reference, check):
    got = reference[check]
    print(got["log"], end="")
    assert got["result"] == "ok", got["result"]

def recipe(**extra):
    return [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ColorJitter(0.4, 0.4, 0.4),
            T.RandomGrayscale(0.2), T.ToTensor(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD),
            T.RandomErasing(0.5, value="random")]


def test_batches_do_not_depend_on_threads_and_resume_exactly(demo):
    def make(threads, tf=None):
        return stoker.ImageLoader(demo, 8, transforms=tf or recipe(), shuffle=True, seed=4, threads=threads,
                                  output="numpy")

    import helpers

    digests = {t: helpers.digest(make(t)) for t in (1, 2, 8)}
    assert len(set(digests.values())) == 1, digests
    plain = [T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToTensor(),
             T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]
    assert helpers.digest(make(2, plain)) != digests[1]

    ref = [x.copy() for x, _ in make(2)]
    a = make(2)
    it = iter(a)
    for _ in range(5):
        next(it)
    state = json.loads(json.dumps(a.state_dict()))
    del it
    b = make(1)
    b.load_state_dict(state)
    rest = [x.copy() for x, _ in b]
    assert len(rest) == len(ref) - 5
    for x, r in zip(rest, ref[5:], strict=True):
        np.testing.assert_array_equal(x, r)
    # A state saved with another recipe is refused.
    other = make(1, recipe()[:3] + recipe()[4:])
    with pytest.raises(stoker.ConfigError):
        other.load_state_dict(state)


def test_augmentations_change_pixels_and_are_reported(demo):
    tf = [T.CenterCrop(96), T.ColorJitter(brightness=(0.5, 0.5))]
    base = stoker.ImageLoader(demo, 8, transforms=[T.CenterCrop(96)], output="numpy")
    dark = stoker.ImageLoader(demo, 8, transforms=tf, output="numpy")
    x0, _ = next(iter(base))
    x1, _ = next(iter(dark))
    # Brightness 0.5 exactly: every value halved and truncated.
    np.testing.assert_array_equal(x1, (x0.astype(np.float32) * np.float32(0.5)).astype(np.uint8))
    report = dark.report()
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["augment"]["items"] >= 8, stages.keys()
    ops = {o["name"]: o for o in report["augment_ops"]}
    assert ops["ColorJitter.brightness"]["count"] >= 8 and ops["ColorJitter.brightness"]["seconds"] > 0, ops
    assert "augment" not in {s["name"] for s in base.report()["stages"]}
    assert base.report()["augment_ops"] == []


def test_erasing_zero_after_normalize_writes_zeros(demo):
    tf = [T.CenterCrop(64), T.ToTensor(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD),
          T.RandomErasing(p=1.0, scale=(0.1, 0.1), ratio=(1.0, 1.0))]
    x, _ = next(iter(stoker.ImageLoader(demo, 8, transforms=tf, output="numpy")))
    zeros = (x == 0).all(axis=1).sum(axis=(1, 2))
    # A 20x20 box (round(sqrt(409.6))) of exact zeros in every image.
    assert (zeros >= 400).all(), zeros


class _Enum:
    """Stands for torchvision's ``InterpolationMode`` / ``AutoAugmentPolicy`` members (a ``value``)."""

    def __init__(self, value: str) -> None:
        self.value = value


@pytest.mark.parametrize("bad, match", [
    (T.TrivialAugmentWide(interpolation=_Enum("bilinear")), "TrivialAugmentWide.interpolation"),
    (T.RandAugment(magnitude=31), "RandAugment.magnitude"),
    (T.AutoAugment(policy=_Enum("cifar10")), "AutoAugment.policy"),
    (T.TrivialAugmentWide(fill=[1, 2]), "fill"),
])
def test_unsupported_arguments_are_refused(demo, bad, match):
    with pytest.raises(stoker.ConfigError, match=match):
        stoker.ImageLoader(demo, 8, transforms=[T.RandomResizedCrop(64), bad], output="numpy")


def test_timm_strings_are_checked_by_the_engine(demo):
    assert T.RandAugment.from_timm("rand-m9-mstd0.5-inc1").spec() == T.rand_augment("rand-m9-mstd0.5-inc1").spec()
    stoker.ImageLoader(demo, 8, transforms=[T.RandomResizedCrop(64), T.rand_augment("rand-m9-mstd0.5-inc1")])
    for bad in ("auto-m9", "rand-m9-tweights", "rand-m9-zz3"):
        with pytest.raises(stoker.ConfigError, match="TimmRandAugment.config"):
            stoker.ImageLoader(demo, 8, transforms=[T.RandomResizedCrop(64), T.rand_augment(bad)])


def test_erasing_needs_float_output_and_order_is_checked(demo):
    with pytest.raises(stoker.ConfigError, match="RandomErasing"):
        stoker.ImageLoader(demo, 8, transforms=[T.CenterCrop(64), T.RandomErasing()], output="numpy")
    with pytest.raises(stoker.ConfigError, match="RandomHorizontalFlip must precede"):
        stoker.ImageLoader(demo, 8, transforms=[T.CenterCrop(64), T.ColorJitter(0.4), T.RandomHorizontalFlip()],
                           output="numpy")
    with pytest.raises(stoker.ConfigError, match="ColorJitter.hue"):
        T.ColorJitter(hue=0.7)


def test_mixtures_and_pair_loaders_augment_the_same_whatever_the_threads(demo, tmp_path):
    import pathlib
    import subprocess
    import sys

    tf = [T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ColorJitter(0.4, 0.4, 0.4),
          T.ToTensor(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD), T.RandomErasing(0.5)]

    def mixture(threads):
        return stoker.ImageLoader({"a": (demo, 0.25), "b": (demo, 0.75)}, 6, transforms=tf, shuffle=True, seed=3,
                                  output="numpy", threads=threads, epoch_items=48)

    def batches(loader):
        return [(x.copy(), np.asarray(y).copy(), list(src)) for x, y, src in loader]

    m1, m2 = batches(mixture(1)), batches(mixture(2))
    assert len(m1) == len(m2) == 8
    for (x1, y1, s1), (x2, y2, s2) in zip(m1, m2, strict=True):
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y2)
        assert s1 == s2
    root = pathlib.Path(__file__).resolve().parents[2]
    out = tmp_path / "pairs"
    subprocess.run([sys.executable, str(root / "scripts" / "make-pairs.py"), str(out), "--shards", "2",
                    "--per-shard", "8"], check=True, capture_output=True)

    def pairs(threads):
        loader = stoker.PairLoader(str(out / "*.tar"), 4, tokenizer=root / "tests" / "data" / "text" /
                                   "tokenizer-clip.json", transforms=tf, shuffle=True, seed=1, output="numpy",
                                   threads=threads)
        return [(b["images"].copy(), b["input_ids"].copy()) for b in loader]

    a, b = pairs(1), pairs(2)
    assert len(a) == len(b) > 0
    for (xa, ia), (xb, ib) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ia, ib)
