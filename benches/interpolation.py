"""What the resampling filter costs: stoker's `ops` stage (resample + the final write) per image
for RandomResizedCrop(224) with bilinear, bicubic and nearest, beside torchvision's
RandomResizedCrop on already-decoded PIL images (Pillow's resize, the reference's cost of the same
step), one thread each, rounds interleaved (A B C ... A B C ...), medians reported.

    python benches/interpolation.py [--images 320] [--rounds 5] [--out benches/results/interpolation.json]

stoker decodes at full resolution here (dct_scaling=False), so both sides resample the same
number of source pixels.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

MODES = ["bilinear", "bicubic", "nearest"]


def stoker_ops_us(root: str, mode: str) -> float:
    import stoker
    from stoker import transforms as T

    ts = [T.RandomResizedCrop(224, interpolation=mode), T.RandomHorizontalFlip()]
    loader = stoker.ImageLoader(root, 64, transforms=ts, threads=1, dct_scaling=False, output="numpy",
                                shuffle=True, seed=1)
    for _ in loader:
        pass
    ops = {s["name"]: s for s in loader.report()["stages"]}["ops"]
    return 1e6 * ops["busy_seconds"] / max(ops["items"], 1)


def torchvision_us(images: list, mode: str) -> float:
    import torch
    from torchvision.transforms import InterpolationMode, v2

    torch.manual_seed(1)
    t = v2.RandomResizedCrop(224, interpolation=InterpolationMode(mode), antialias=True)
    t0 = time.perf_counter()
    for img in images:
        t(img)
    return 1e6 * (time.perf_counter() - t0) / len(images)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=320)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benches/results/interpolation.json")
    a = ap.parse_args()
    import stoker
    import torch
    from PIL import Image

    torch.set_num_threads(1)
    os.environ.setdefault("STOKER_SHARED_BUDGET", "0")
    root = Path(tempfile.mkdtemp()) / "data"
    stoker.make_demo(str(root), a.images, seed=2)
    (root / "LICENSE.md").unlink()
    images = [Image.open(p).convert("RGB") for p in sorted(root.glob("*/*.jpg"))]
    for img in images:
        img.load()
    runs: dict[str, list[float]] = {}
    for _ in range(a.rounds):
        for mode in MODES:
            runs.setdefault(f"stoker {mode}", []).append(stoker_ops_us(str(root), mode))
            if mode != "nearest":
                runs.setdefault(f"torchvision {mode}", []).append(torchvision_us(images, mode))
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "images": len(images),
        "rounds": a.rounds,
        "us_per_image_median": {k: round(statistics.median(v), 1) for k, v in runs.items()},
        "us_per_image_runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
    }
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    for k, v in result["us_per_image_median"].items():
        print(f"{k:24s} {v:8.1f} us/image")


if __name__ == "__main__":
    main()
