#!/usr/bin/env python3
"""How far GPU-decoded samples are from the CPU's: nvJPEG against libjpeg-turbo on real photos,
after the same crop.

Two `stoker.ImageLoader`s over the same images with the same seed draw the same crops and flips;
one decodes every JPEG on the CPU (libjpeg-turbo), the other on the GPU (`decode="gpu",
gpu_share=1`: nvJPEG, then stoker's resampler, whose arithmetic is the CPU path's). DCT scaling
and region decoding are off, so both resample the same full-resolution pixels' crop and only the
decoders' rounding (IDCT, chroma upsampling, colour conversion) differs. Reported per preset:
the mean and maximum absolute difference over every byte, its 99th and 99.9th percentiles, the
share of bytes that differ at all, and the largest per-sample mean.

    python3 benches/gpu_decode_diff.py                      # the demo photos (made here), 2048 samples
    python3 benches/gpu_decode_diff.py --root /data/imagenet/val --samples 10000 --out diff.json

Needs an NVIDIA GPU, PyTorch and a usable libnvjpeg (PyTorch's or torchvision's wheels install
one); without them it says why and exits with status 2.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def batches(root, preset, decode, samples, batch_size):
    import stoker

    kw = {"decode": "gpu", "gpu_share": 1.0} if decode == "gpu" else {}
    loader = stoker.ImageLoader(str(root), batch_size, preset=preset, dtype="uint8", shuffle=True, seed=11,
                                dct_scaling=False, roi=False, device="cuda", **kw)
    n = 0
    for x, y in loader:
        yield x.cpu().numpy(), y.cpu().numpy()
        n += len(y)
        if n >= samples:
            break
    if decode == "gpu":
        print(f"  gpu_decode: {loader.report()['gpu_decode']}", file=sys.stderr)


def measure(root, preset, samples, batch_size):
    hist = np.zeros(256, dtype=np.int64)
    worst_sample = 0.0
    count = 0
    for (a, la), (b, lb) in zip(batches(root, preset, "cpu", samples, batch_size),
                                batches(root, preset, "gpu", samples, batch_size)):
        if not np.array_equal(la, lb):
            raise SystemExit("the two loaders' labels differ: not the same samples")
        d = np.abs(a.astype(np.int16) - b.astype(np.int16)).astype(np.uint8)
        hist += np.bincount(d.ravel(), minlength=256)
        worst_sample = max(worst_sample, float(d.reshape(len(d), -1).mean(axis=1).max()))
        count += len(la)
    total = hist.sum()
    cum = np.cumsum(hist) / total

    def pct(q):
        return int(np.searchsorted(cum, q))

    return {
        "samples": count, "bytes": int(total),
        "mean_abs": float((hist * np.arange(256)).sum() / total),
        "max_abs": int(np.nonzero(hist)[0].max()),
        "p99_abs": pct(0.99), "p999_abs": pct(0.999),
        "share_differing": float(1 - hist[0] / total),
        "worst_sample_mean_abs": worst_sample,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, help="an ImageFolder or shards (default: demo photos made here)")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        sys.exit(2)
    import stoker
    from stoker import _stoker
    from stoker.loader import find_nvjpeg

    find_nvjpeg()
    nv = json.loads(_stoker.nvjpeg_json())
    if "error" in nv:
        print(f"nvJPEG is not usable: {nv['error']}", file=sys.stderr)
        sys.exit(2)
    root = args.root
    if root is None:
        root = ROOT / "bench-data" / "gpu-decode-demo"
        if not root.exists():
            stoker.make_demo(str(root), args.samples, seed=1)
    out = {"gpu": torch.cuda.get_device_name(0), "nvjpeg": nv, "root": str(root), "presets": {}}
    for preset in ("imagenet-train", "imagenet-val"):
        print(f"{preset}:", file=sys.stderr)
        out["presets"][preset] = r = measure(root, preset, args.samples, args.batch_size)
        print(f"  {r}", file=sys.stderr)
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
