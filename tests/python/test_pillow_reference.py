"""stoker's `imagenet-val` output against torchvision's semantics reproduced with Pillow.

torchvision's `Resize(256)` + `CenterCrop(224)` on a PIL image is: convert to RGB, resize the
shorter side to 256 (the longer to int(256 * long / short)) with BILINEAR (Pillow's antialiased
convolution), then crop at (round((h - 224) / 2), round((w - 224) / 2)) with Python's rounding.
stoker decodes with libjpeg-turbo and resamples with Pillow's coefficients and fixed point, so
the two agree to within rounding when stoker decodes at full resolution. Stated tolerances:

- exact decode (`--no-dct-scaling`): mean absolute difference <= 0.05 levels per image, no pixel
  off by more than 2 levels;
- default (DCT-scaled decode where the source box is at least twice the output, e.g. 800x600
  images): mean absolute difference <= 2 levels per image, no pixel off by more than 40.
"""

import subprocess

import numpy as np
import pytest
from PIL import Image

EXACT = (0.05, 2)
SCALED = (2.0, 40)


def torchvision_val(path):
    img = Image.open(path).convert("RGB")
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = 256, int(256 * long / short)
    size = (new_short, new_long) if w <= h else (new_long, new_short)
    img = img.resize(size, Image.BILINEAR)
    w, h = img.size
    top = int(round((h - 224) / 2.0))
    left = int(round((w - 224) / 2.0))
    return np.asarray(img.crop((left, top, left + 224, top + 224)))


def imagefolder_order(root):
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = []
    for label, c in enumerate(classes):
        for f in sorted((root / c).iterdir()):
            files.append((f, label))
    return files



@pytest.mark.parametrize("mode", ["exact", "scaled"])
@pytest.mark.wheel
def test_imagenet_val_matches_pillow(stoker_bin, demo_root, tmp_path, mode):
    out = tmp_path / "val.npy"
    extra = ["--no-dct-scaling"] if mode == "exact" else []
    mean_tol, max_tol = EXACT if mode == "exact" else SCALED
    subprocess.run(
        [str(stoker_bin), "export", str(demo_root), "--out", str(out), "--preset", "imagenet-val",
         "--dtype", "uint8", "--layout", "nhwc", "--no-exif", *extra],
        check=True,
    )
    got = np.load(out)
    labels = np.load(tmp_path / "val_labels.npy")
    files = imagefolder_order(demo_root)
    assert got.shape == (len(files), 224, 224, 3)
    assert labels.tolist() == [label for _, label in files]
    worst_mean, worst_max, exact = 0.0, 0, 0
    for k, (path, _) in enumerate(files):
        ref = torchvision_val(path).astype(np.int16)
        diff = np.abs(got[k].astype(np.int16) - ref)
        worst_mean = max(worst_mean, float(diff.mean()))
        worst_max = max(worst_max, int(diff.max()))
        exact += int(diff.max() == 0)
        assert diff.mean() <= mean_tol and diff.max() <= max_tol, (path, diff.mean(), diff.max())
    print(f"{mode}: {len(files)} images: worst mean abs diff {worst_mean:.4f}, "
          f"worst max {worst_max}, bit-exact {exact}")


def test_float32_normalisation_matches(stoker_bin, demo_root, tmp_path):
    out = tmp_path / "val32.npy"
    subprocess.run(
        [str(stoker_bin), "export", str(demo_root), "--out", str(out), "--preset", "imagenet-val",
         "--dtype", "float32", "--layout", "nchw", "--no-exif", "--limit", "10", "--no-dct-scaling"],
        check=True,
    )
    got = np.load(out)
    assert got.shape == (10, 3, 224, 224) and got.dtype == np.float32
    mean = np.array([0.485, 0.456, 0.406], dtype=np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], dtype=np.float32)[:, None, None]
    for k, (path, _) in enumerate(imagefolder_order(demo_root)[:10]):
        ref = torchvision_val(path).astype(np.float32).transpose(2, 0, 1) / 255.0
        ref = (ref - mean) / std
        # One 8-bit level is 1/255/std ~ 0.0175 in normalised units.
        assert np.abs(got[k] - ref).mean() <= EXACT[0] * 0.0175 + 1e-6


def test_bad_arguments_exit_nonzero_with_one_clear_message(stoker_bin, demo_root, tmp_path):
    cases = [
        (["bench", str(tmp_path / "missing")], "no such file or folder"),
        (["bench", str(demo_root), "--preset", "nope"], "imagenet-train, imagenet-val"),
        (["bench", str(demo_root), "--threads", "zero"], "--threads"),
        (["bench", str(demo_root), "--batch-size", "16", "--memory-limit", "10"], "cannot hold one batch"),
        (["bench", str(demo_root), "--on-error", "ignore"], "skip, raise"),
        (["bench", str(demo_root), "--batch-size", "0"], "--batch-size"),
    ]
    for args, needle in cases:
        r = subprocess.run([str(stoker_bin), *args], capture_output=True, text=True)
        assert r.returncode != 0, args
        assert needle in r.stderr, (args, r.stderr)
        assert "panicked" not in r.stderr


def test_bench_json_fields_and_determinism(stoker_bin, demo_root):
    import json

    def run(threads):
        r = subprocess.run(
            [str(stoker_bin), "bench", str(demo_root), "--batch-size", "16", "--threads", threads, "--json"],
            capture_output=True, text=True, check=True,
        )
        return json.loads(r.stdout)

    a, b = run("1"), run("2")
    for key in ["images", "batches", "seconds", "images_per_sec", "cpu_seconds", "cpu_seconds_per_1000",
                "peak_rss_bytes", "skipped", "stages", "starvation", "bottleneck", "threads", "digest"]:
        assert key in a, key
    assert a["images"] == 128 and a["batches"] == 8
    assert a["digest"] == b["digest"]
    assert (a["threads"], b["threads"]) == (1, 2)


@pytest.mark.wheel
def test_doctor_reports_the_machine_without_a_gpu(stoker_bin):
    import json

    r = subprocess.run([str(stoker_bin), "doctor", "--json"], capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["cpu"]["effective"] >= 1 and out["decode_threads"] >= 1
    assert out["libjpeg_turbo"].startswith("3.")
    assert out["memory"]["total_bytes"] > 0
    gpu = out["gpu"]
    if not gpu["devices"]:
        print("doctor, no GPU:", gpu["unavailable_reason"])
        assert gpu["unavailable_reason"]
        assert any("no GPU" in a for a in out["recommendations"])
    r = subprocess.run([str(stoker_bin), "doctor"], capture_output=True, text=True, check=True)
    assert "recommendations:" in r.stdout and "CPU:" in r.stdout
