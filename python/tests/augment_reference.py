"""The augmentation kernels against torchvision's tensor kernels and timm's Pillow ops, op by
op, on real photos: run by ``test_augment.py`` in a child process (``python augment_reference.py
DEMO_ROOT``), so that the test process never imports torchvision and timm (160 MB more RSS than
torch alone: the RSS-bounded tests fork from the test process and would inherit it).

Prints one JSON object: for each check, ``"ok"`` or the assertion's message, and its log lines.
See ``test_augment.py`` for the stated agreement.
"""

import contextlib
import io
import json
import sys
import traceback
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from stoker import _stoker
from timm.data import auto_augment as timm_aa
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2 import functional as F

torch.set_num_threads(1)



EXACT_OPS = ["Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
             "Contrast", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert"]
SIZES = [(224, 224), (37, 53), (150, 200)]


def photos(demo):
    """Crops of real photos at the test sizes: one per demo class."""
    files = [next(iter(sorted(d.iterdir()))) for d in sorted(demo.iterdir()) if d.is_dir()][:4]
    out = []
    for k, f in enumerate(files):
        h, w = SIZES[k % len(SIZES)]
        img = Image.open(f).convert("RGB").resize((w, h), Image.BILINEAR)
        out.append(np.ascontiguousarray(np.asarray(img)))
    # Every size for the first photo too.
    first = Image.open(files[0]).convert("RGB")
    out += [np.asarray(first.resize((w, h), Image.BILINEAR)).copy() for h, w in SIZES[1:]]
    return out


def mine(op, magnitude, img, fill=None):
    h, w, _ = img.shape
    out = _stoker.augment_op(op, float(magnitude), img.tobytes(), h, w, fill)
    return np.frombuffer(out, np.uint8).reshape(h, w, 3)


def theirs(op, magnitude, img, fill=None):
    aug = v2.TrivialAugmentWide(fill=fill)
    t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
    out = aug._apply_image_or_video_transform(t, op, float(magnitude), interpolation=InterpolationMode.NEAREST,
                                               fill=aug._fill)
    return out.permute(1, 2, 0).numpy()


def magnitudes(space, op, bins, h, w):
    """Every magnitude torchvision can draw for `op` in `space`, both signs where signed."""
    fn, signed = space._AUGMENTATION_SPACE[op]
    m = fn(bins, h, w)
    if m is None:
        return [0.0]
    vals = [float(v) for v in m]
    return vals + ([-v for v in vals] if signed else [])


def check_auto_augment_ops_are_bit_exact(photos, op):
    checked = 0
    for img in photos:
        h, w, _ = img.shape
        mags = set()
        for space, bins in [(v2.TrivialAugmentWide, 31), (v2.RandAugment, 31), (v2.AutoAugment, 10)]:
            if op in space._AUGMENTATION_SPACE:
                mags.update(magnitudes(space, op, bins, h, w))
        for m in sorted(mags):
            fills = [None, [128, 10, 200]] if op in ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate") \
                else [None]
            for fill in fills:
                a, b = mine(op, m, img, fill), theirs(op, m, img, fill)
                assert np.array_equal(a, b), (op, m, img.shape, fill, int((a != b).sum()))
                checked += 1
    assert checked >= len(photos)
    print(f"{op}: {checked} cases bit-exact")


def check_posterize_zero_bits_is_black_like_torchvision(photos):
    img = photos[0]
    assert not mine("Posterize", 0, img).any()
    assert np.array_equal(mine("Posterize", 0, img), F.posterize(torch.from_numpy(img.copy()).permute(2, 0, 1), 0)
                          .permute(1, 2, 0).numpy())


def check_color_jitter_factors_are_bit_exact(photos):
    rng = np.random.default_rng(0)
    factors = [float(np.float32(f)) for f in rng.uniform(0.0, 2.0, 12)] + [0.0, 1.0, 0.6, 1.4]
    for img in photos:
        t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        for f in factors:
            for op, fn in [("Brightness", F.adjust_brightness), ("Contrast", F.adjust_contrast),
                           ("Color", F.adjust_saturation)]:
                ref = fn(t, f).permute(1, 2, 0).numpy()
                got = mine(op, f - 1.0, img)
                # `1 + (f - 1)` is `f` for these factors, so both sides see the same float32 factor.
                assert float(np.float32(1.0 + (f - 1.0))) == float(np.float32(f))
                assert np.array_equal(got, ref), (op, f, img.shape)


def check_grayscale_is_bit_exact(photos):
    for img in photos:
        t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        ref = F.rgb_to_grayscale(t, num_output_channels=3).permute(1, 2, 0).numpy()
        assert np.array_equal(mine("Grayscale", 0.0, img), ref)


def check_float_ops_are_within_one_level(photos, op):
    diff_bytes = total = 0
    for img in photos:
        t = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        if op == "Sharpness":
            cases = [(m, lambda m=m, t=t: F.adjust_sharpness(t, 1.0 + m))
                     for m in magnitudes(v2.TrivialAugmentWide, op, 31, *img.shape[:2])]
        else:
            cases = [(h, lambda h=h, t=t: F.adjust_hue(t, h)) for h in (-0.5, -0.3, -0.1, -0.02, 0.0, 0.05, 0.2, 0.5)]
        for m, ref_fn in cases:
            ref = ref_fn().permute(1, 2, 0).numpy().astype(np.int16)
            got = mine(op, m, img).astype(np.int16)
            d = np.abs(got - ref)
            assert d.max() <= 1, (op, m, img.shape, int(d.max()))
            diff_bytes += int((d > 0).sum())
            total += d.size
    print(f"{op}: {diff_bytes} of {total} bytes off by one ({diff_bytes / total:.2e})")
    assert diff_bytes / total < 1e-3




def check_timm_integer_ops_match_pillow_bit_for_bit(photos):
    """timm's ops are Pillow's. Equalize, Invert, Posterize (1-8 bits), Solarize and SolarizeAdd
    are integer tables in both and agree exactly; Posterize with 0 bits (timm's
    PosterizeIncreasing at magnitude 10) raises in Pillow 13 and is black in stoker, as in
    torchvision."""
    for img in photos:
        pil = Image.fromarray(img)

        def same(op, m, ref, img=img):
            assert np.array_equal(mine(op, m, img), np.asarray(ref)), (op, m, img.shape)

        same("Equalize", 0, timm_aa.equalize(pil))
        same("Invert", 0, timm_aa.invert(pil))
        for bits in range(1, 9):
            same("Posterize", bits, timm_aa.posterize(pil, bits))
        for t in range(0, 257, 8):
            same("Solarize", t / 255.0, timm_aa.solarize(pil, t))
        for add in range(0, 111, 10):
            same("SolarizeAdd", add, timm_aa.solarize_add(pil, add))
    try:
        timm_aa.posterize(Image.fromarray(photos[0]), 0)
    except ValueError:
        pass
    else:
        raise AssertionError("Pillow accepted posterize(0 bits)")


def check_timm_float_ops_against_pillow_are_bounded(photos):
    """timm's AutoContrast and ImageEnhance ops (Pillow's arithmetic: integer luma, its own
    blend and smoothing) against stoker's (torchvision's) over timm's factor range [0.1, 1.9]:
    within 1 level (the measured worst, printed). The geometric ops are not compared: timm
    samples bilinear or bicubic, stoker nearest."""
    worst = {}
    for img in photos:
        pil = Image.fromarray(img)
        cases = [("AutoContrast", 0.0, timm_aa.auto_contrast(pil))]
        for f in (0.1, 0.5, 0.9, 1.3, 1.9):
            cases += [("Brightness", f - 1.0, timm_aa.brightness(pil, f)), ("Color", f - 1.0, timm_aa.color(pil, f)),
                      ("Contrast", f - 1.0, timm_aa.contrast(pil, f)),
                      ("Sharpness", f - 1.0, timm_aa.sharpness(pil, f))]
        for op, m, ref in cases:
            d = int(np.abs(mine(op, m, img).astype(np.int16) - np.asarray(ref).astype(np.int16)).max())
            worst[op] = max(worst.get(op, 0), d)
    print("worst |stoker - timm(Pillow)| in levels:", worst)
    assert worst["AutoContrast"] <= 1 and worst["Brightness"] <= 1, worst
    assert max(worst.values()) <= 1, worst


def main(demo: Path) -> None:
    ph = photos(demo)
    checks = [(f"bit_exact[{op}]", lambda op=op: check_auto_augment_ops_are_bit_exact(ph, op)) for op in EXACT_OPS]
    checks += [
        ("posterize_zero_bits", lambda: check_posterize_zero_bits_is_black_like_torchvision(ph)),
        ("color_jitter_factors", lambda: check_color_jitter_factors_are_bit_exact(ph)),
        ("grayscale", lambda: check_grayscale_is_bit_exact(ph)),
        ("within_one_level[Sharpness]", lambda: check_float_ops_are_within_one_level(ph, "Sharpness")),
        ("within_one_level[Hue]", lambda: check_float_ops_are_within_one_level(ph, "Hue")),
        ("timm_integer_ops", lambda: check_timm_integer_ops_match_pillow_bit_for_bit(ph)),
        ("timm_float_ops", lambda: check_timm_float_ops_against_pillow_are_bounded(ph)),
    ]
    out = {}
    for name, fn in checks:
        log = io.StringIO()
        with contextlib.redirect_stdout(log):
            try:
                fn()
                result = "ok"
            except Exception:  # noqa: BLE001 - every failure is reported to the parent test
                result = traceback.format_exc()
        out[name] = {"result": result, "log": log.getvalue()}
    print(json.dumps(out))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
