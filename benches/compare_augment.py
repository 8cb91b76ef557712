#!/usr/bin/env python3
"""Augmentation recipes: stoker vs torchvision's DataLoader, images per CPU-second.

Two recipes of issue 50, each run by both loaders over the same ImageFolder (made by
``benches/make_imagenet_like.py``), one epoch per run, interleaved A B A B ... so machine noise
hits both alike; medians of ``--repeats`` runs:

- ``ta``: torchvision's ResNet-50 reference recipe (``--auto-augment ta_wide --random-erase
  0.1``): RandomResizedCrop(224) + RandomHorizontalFlip + TrivialAugmentWide + ToTensor +
  Normalize + RandomErasing(0.1). The DataLoader runs ``transforms.v2`` on the PIL image as the
  reference script does (``--backend pil``);
- ``deit``: timm's DeiT recipe, ``timm.data.create_transform(224, is_training=True,
  auto_augment='rand-m9-mstd0.5-inc1', re_prob=0.25, re_mode='pixel')`` (timm turns its colour
  jitter off when RandAugment is on) against stoker's RandomResizedCrop + flip +
  ``rand_augment('rand-m9-mstd0.5-inc1')`` + Normalize + ``RandomErasing(0.25, value='random')``.
  Both resample the crop bicubic (the first figures in BENCHMARKS.md, made before stoker had
  bicubic, ran stoker's crop bilinear: slightly in its favour). timm's
  PosterizeIncreasing at magnitude 10 asks Pillow 13 for 0 bits, which raises
  (``ValueError: bits must be between or equal to 1 and 8``); the DataLoader side patches it to a
  black image (torchvision's and stoker's result) so that the epoch completes.

The DataLoader has ``num_workers=2`` (the machine's cores), batch 128, float32 NCHW; stoker's
``ImageLoader`` the same batches with its default threads. Measured per run: images, wall
seconds and CPU-seconds of the loop (stoker: rusage of the process; the DataLoader: its main
process plus its reaped workers), hence images per CPU-second.

Usage: python3 benches/compare_augment.py --data bench-data/imagenet-like [--stoker-data SHARDS] [--repeats 3]
[--out FILE]. With ``--stoker-data`` stoker reads the same images as random-access shards
(``stoker pack DIR SHARDS --random-access``), the DataLoader still the ImageFolder.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_torch(args):
    import torch
    import torchvision.transforms.v2 as T
    from torchvision.datasets import ImageFolder

    if args.recipe == "ta":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.TrivialAugmentWide(),
                        T.PILToTensor(), T.ToDtype(torch.float32, scale=True), T.Normalize(MEAN, STD),
                        T.RandomErasing(0.1)])
    else:
        import timm.data.auto_augment as aa
        from PIL import Image
        from timm.data import create_transform

        # Pillow 13 refuses posterize(0 bits), which timm's PosterizeIncreasing asks for at magnitude
        # 10 (2% of the draws with mstd0.5): a black image, as torchvision's posterize and stoker give.
        def posterize(img, bits, **_):
            return Image.new(img.mode, img.size) if bits <= 0 else aa.posterize(img, bits)

        for name in ("Posterize", "PosterizeIncreasing", "PosterizeOriginal"):
            aa.NAME_TO_OP[name] = posterize

        tf = create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25,
                              re_mode="pixel", re_count=1)
    ds = ImageFolder(str(args.data), transform=tf)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=2,
                                         drop_last=True)
    c0, t0 = cpu_seconds(), time.perf_counter()
    n = 0
    it = iter(loader)
    for images, _ in it:
        n += images.shape[0]
    del it
    return {"images": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0}


def run_stoker(args):
    import stoker
    import stoker.transforms as T

    # timm's DeiT crop is bicubic (create_transform's interpolation), torchvision's bilinear.
    crop = T.RandomResizedCrop(224, interpolation="bicubic" if args.recipe == "deit" else "bilinear")
    geo = [crop, T.RandomHorizontalFlip()]
    norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
    if args.recipe == "ta":
        tf = geo + [T.TrivialAugmentWide()] + norm + [T.RandomErasing(0.1)]
    else:
        tf = geo + [T.rand_augment("rand-m9-mstd0.5-inc1")] + norm + \
            [T.RandomErasing(0.25, scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3), value="random")]
    root = str(args.stoker_data or args.data)
    loader = stoker.ImageLoader(root, batch_size=args.batch_size, transforms=tf, shuffle=True,
                                drop_last=True, output="numpy")
    c0, t0 = cpu_seconds(), time.perf_counter()
    n = 0
    for _images, labels in loader:
        n += labels.shape[0]
    out = {"images": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0}
    stages = {s["name"]: s for s in loader.report()["stages"]}
    out["augment_ms_per_image"] = 1e3 * stages["augment"]["busy_seconds"] / max(1, stages["augment"]["items"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--stoker-data", type=Path,
                    help="what stoker reads instead of --data: the same images packed by `stoker pack --random-access` "
                         "(issue 50's setting: only the crop's restart intervals are decoded)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--recipes", default="ta,deit")
    ap.add_argument("--out", type=Path, default=Path("bench-augment.json"))
    ap.add_argument("--child", choices=["torch", "stoker"], help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(run_torch(args) if args.child == "torch" else run_stoker(args)))
        return
    results = {}
    for recipe in args.recipes.split(","):
        runs = {"torch": [], "stoker": []}
        for _ in range(args.repeats):
            for who in ("stoker", "torch"):
                cmd = [sys.executable, __file__, "--child", who, "--recipe", recipe, "--data", str(args.data),
                       "--batch-size", str(args.batch_size)]
                if args.stoker_data is not None:
                    cmd += ["--stoker-data", str(args.stoker_data)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                r["images_per_cpu_second"] = r["images"] / r["cpu_seconds"]
                r["images_per_second"] = r["images"] / r["seconds"]
                runs[who].append(r)
                print(recipe, who, json.dumps(r), flush=True)
        med = {who: {k: statistics.median(r[k] for r in rs) for k in ("images_per_cpu_second", "images_per_second")}
               for who, rs in runs.items()}
        med["ratio_per_cpu_second"] = med["stoker"]["images_per_cpu_second"] / med["torch"]["images_per_cpu_second"]
        results[recipe] = {"runs": runs, "median": med}
    args.out.write_text(json.dumps(results, indent=2))
    print("| recipe | stoker img/CPU-s | DataLoader(2) img/CPU-s | ratio | stoker img/s | DataLoader img/s |")
    print("|---|---|---|---|---|---|")
    for recipe, r in results.items():
        m = r["median"]
        print(f"| {recipe} | {m['stoker']['images_per_cpu_second']:.0f} | {m['torch']['images_per_cpu_second']:.0f} | "
              f"{m['ratio_per_cpu_second']:.2f}x | {m['stoker']['images_per_second']:.0f} | "
              f"{m['torch']['images_per_second']:.0f} |")


if __name__ == "__main__":
    main()
