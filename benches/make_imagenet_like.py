#!/usr/bin/env python3
"""Benchmark data with ImageNet's statistics, made from the embedded public-domain photos.

Image loaders spend most of their CPU in the JPEG decoder, whose cost follows the entropy-coded
bytes per pixel. ImageNet's training JPEGs average ~400 x 350 pixels and ~110 KB, 0.5-0.8 bytes
per pixel; smooth or upscaled images decode several times faster and flatter every ratio. This
generator writes an ImageFolder (one class per photo) whose images match:

- **sizes**: ImageNet's common shapes (500 x 375, 375 x 500, 500 x 333, ...) for ~70% of the
  images, other sizes between 200 and 600 px for ~28%, and a tail with the long side between
  900 and 2000 px (log-uniform) for ~2%: ~200 kpixels per image on average, as ImageNet's
  training set (mean ~470 x 390);
- **content**: crops of the real photos at native or reduced scale (0.3-1.0, Lanczos; never
  upscaled), flipped and slightly jittered in brightness and contrast; an image larger than a
  photo allows is a mosaic of several such crops;
- **sensor noise**: the photos are clean, downsampled images with large smooth areas (sky, a
  white suit, the black of deep space) and less fine detail than a consumer camera's output;
  even mosaics of 0.3x-scaled crops stay near 0.3 bytes per pixel. A per-image Gaussian noise
  (luma sigma 12-24, chroma half of it: a high-ISO photo's grain) brings the entropy to
  ImageNet's: the mean bytes per pixel lands near 0.55. This is a stand-in for texture, stated
  as such: the decoder's cost follows the coded bytes, which is what the benchmark needs;
- **encoding**: baseline JPEG, 4:2:0 chroma subsampling, quality 85-95 (Pillow's libjpeg), ~2% of
  the images grayscale, as in ImageNet.

The mean bytes per pixel and the size distribution are printed (and written to
``ROOT.stats.json`` beside the folder); ``--check`` fails when the mean is outside 0.5-0.8.

Usage: python3 benches/make_imagenet_like.py --out bench-data/imagenet-like-v2 [--images 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
PHOTOS = ROOT / "crates" / "stoker" / "assets" / "photos"
COMMON = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 400), (400, 500), (500, 500), (640, 480),
          (480, 640), (500, 334)]
TARGET_BPP = (0.5, 0.8)
#: Luma noise sigma range (chroma: half of it), calibrated for TARGET_BPP.
NOISE = (12.0, 24.0)

_photos: list[tuple[str, np.ndarray]] = []


def photos() -> list[tuple[str, np.ndarray]]:
    """The embedded photos as RGB arrays, by class name (loaded once per process)."""
    if not _photos:
        for p in sorted(PHOTOS.iterdir()):
            if p.suffix in (".png", ".jpg"):
                name = p.stem.split("_")[0]
                _photos.append((name, np.asarray(Image.open(p).convert("RGB"))))
    return _photos


def size_of(rng: np.random.Generator) -> tuple[int, int]:
    u = rng.random()
    if u < 0.70:
        return COMMON[rng.integers(len(COMMON))]
    if u < 0.98:
        return int(rng.integers(200, 601)), int(rng.integers(200, 601))
    long_side, ratio = int(np.exp(rng.uniform(np.log(900), np.log(2000)))), rng.uniform(0.6, 0.9)
    w, h = long_side, int(long_side * ratio)
    return (w, h) if rng.random() < 0.6 else (h, w)


def crop(rng: np.random.Generator, src: np.ndarray, w: int, h: int) -> np.ndarray | None:
    """A `w` x `h` crop of `src` at a random scale in [0.3, 1] (never upscaled), flipped and
    jittered in brightness and contrast; `None` when the photo is too small at scale 1."""
    ph, pw = src.shape[:2]
    need = max(w / pw, h / ph)
    if need > 1.0:
        return None
    s = rng.uniform(max(0.3, need), 1.0)
    sw, sh = min(pw, int(np.ceil(w / s))), min(ph, int(np.ceil(h / s)))
    x0, y0 = int(rng.integers(0, pw - sw + 1)), int(rng.integers(0, ph - sh + 1))
    tile = Image.fromarray(src[y0:y0 + sh, x0:x0 + sw]).resize((w, h), Image.LANCZOS)
    a = np.asarray(tile).astype(np.float32)
    if rng.random() < 0.5:
        a = a[:, ::-1]
    return (a - 128.0) * rng.uniform(0.85, 1.15) + 128.0 + rng.uniform(-15, 15)


#: Mosaic tiles fit in every photo at native scale (the smallest is 451 x 300).
TILE = (160, 300)


def render(rng: np.random.Generator, w: int, h: int) -> tuple[str, np.ndarray]:
    """The pixels of one image (float RGB) and its class (the photo it comes from, or for a
    mosaic the photo of its first tile)."""
    ph = photos()
    k = int(rng.integers(len(ph)))
    name, src = ph[k]
    whole = crop(rng, src, w, h)
    if whole is not None:
        return name, whole
    canvas = np.empty((h, w, 3), np.float32)
    y, first = 0, True
    while y < h:
        th = min(h - y, int(rng.integers(*TILE)))
        x = 0
        while x < w:
            tw = min(w - x, int(rng.integers(*TILE)))
            j = k if first else int(rng.integers(len(ph)))
            tile = crop(rng, ph[j][1], tw, th)
            assert tile is not None, "mosaic tiles fit every photo"
            canvas[y:y + th, x:x + tw] = tile
            x, first = x + tw, False
        y += th
    return name, canvas


def make_one(job: tuple[int, int, str]) -> tuple[str, int, int, int]:
    """Writes image `i` under `root`; returns (path, width, height, bytes)."""
    i, seed, root = job
    rng = np.random.default_rng([seed, i])
    w, h = size_of(rng)
    name, a = render(rng, w, h)
    sigma = rng.uniform(*NOISE)
    luma = rng.standard_normal((h, w, 1), dtype=np.float32) * sigma
    chroma = rng.standard_normal((h, w, 3), dtype=np.float32) * (sigma / 2)
    img = Image.fromarray(np.clip(a + luma + chroma, 0, 255).astype(np.uint8))
    if rng.random() < 0.02:
        img = img.convert("L")
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=int(rng.integers(85, 96)), subsampling=2)
    path = Path(root) / name / f"{i:06d}.jpg"
    path.write_bytes(buf.getvalue())
    return str(path), w, h, buf.tell()


def stats_path(root: Path) -> Path:
    """Where the statistics of the dataset at `root` are kept (beside it: a file inside the root
    would be a stray entry of the ImageFolder)."""
    return root.parent / f"{root.name}.stats.json"


def make(root: Path, images: int, seed: int = 0, workers: int | None = None) -> dict[str, float]:
    """Writes `images` JPEGs under `root/CLASS/`; returns and stores the statistics."""
    for name, _ in photos():
        (root / name).mkdir(parents=True, exist_ok=True)
    jobs = [(i, seed, str(root)) for i in range(images)]
    with ProcessPoolExecutor(workers) as ex:
        out = list(ex.map(make_one, jobs, chunksize=16))
    px = np.array([w * h for _, w, h, _ in out], dtype=np.float64)
    size = np.array([b for *_, b in out], dtype=np.float64)
    long_side = np.array([max(w, h) for _, w, h, _ in out])
    stats = {
        "images": images,
        "seed": seed,
        "mean_bytes_per_pixel": float(size.sum() / px.sum()),
        "median_bytes_per_pixel": float(np.median(size / px)),
        "mean_pixels": float(px.mean()),
        "mean_kb": float(size.mean() / 1000),
        "long_side_p50": float(np.percentile(long_side, 50)),
        "long_side_p95": float(np.percentile(long_side, 95)),
        "long_side_max": int(long_side.max()),
        "total_mb": float(size.sum() / 1e6),
    }
    stats_path(root).write_text(json.dumps(stats, indent=1) + "\n")
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench-data" / "imagenet-like-v2")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true", help=f"fail unless the mean bytes/pixel is in {TARGET_BPP}")
    args = ap.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        print(f"{args.out} exists and is not empty; remove it first", file=sys.stderr)
        return 2
    s = make(args.out, args.images, args.seed)
    print(f"{s['images']} JPEGs in {args.out}: {s['mean_bytes_per_pixel']:.3f} bytes/pixel (mean), "
          f"{s['mean_kb']:.0f} KB and {s['mean_pixels'] / 1e3:.0f} kpixels per image, long side p50 "
          f"{s['long_side_p50']:.0f} / p95 {s['long_side_p95']:.0f} / max {s['long_side_max']} px, "
          f"{s['total_mb']:.0f} MB")
    lo, hi = TARGET_BPP
    if args.check and not lo <= s["mean_bytes_per_pixel"] <= hi:
        print(f"mean bytes/pixel {s['mean_bytes_per_pixel']:.3f} is outside ImageNet's {lo}-{hi}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
