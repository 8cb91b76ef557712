#!/usr/bin/env python3
"""FFCV vs stoker: ImageNet's training pipeline over the same 2000 JPEGs, on the CPU, side by side.

What is compared: the CPU cost and the speed of making normalised float32 224 x 224 training
batches (random-resized crop, horizontal flip, ImageNet mean/std; batch 256, 2 threads, random
order, last partial batch dropped: 7 batches = 1792 images per epoch) from the benchmark
ImageFolder (``bench-data/imagenet-like-v2``: ImageNet's sizes and bytes per pixel, made by
``benches/make_imagenet_like.py``).

- **FFCV** reads a ``.beton`` written once by this script to ``/tmp/ffcv-data/`` with
  ``RGBImageField(write_mode='jpg', max_resolution=None, jpeg_quality=90)`` (the originals are
  quality 85-95). FFCV has no pass-through for JPEG bytes: ``RGBImageField.encode`` takes pixels,
  so the images are decoded (Pillow, via torchvision's ImageFolder, grayscale expanded to RGB)
  and re-encoded by OpenCV at ``--jpeg-quality``, at full size (``max_resolution=None``: no
  resize). Pipeline: ``RandomResizedCropRGBImageDecoder((224, 224))``, ``RandomHorizontalFlip()``,
  ``NormalizeImage(mean*255, std*255, np.float32)``, ``ToTensor()``, ``ToTorchImage()`` (output
  ``[256, 3, 224, 224]`` float32 in channels-last memory); ``Loader(batch_size=256,
  num_workers=2, order=OrderOption.RANDOM, os_cache=True, drop_last=True)``. On the CPU FFCV's
  ``NormalizeImage`` is a numba lookup-table kernel that runs on the NumPy batch, so it goes
  before ``ToTensor``: placed after ``ToTorchImage`` (the GPU recipe's place) it would hand torch
  tensors to numba. ``--normalize torch`` instead normalises with torch in the timed loop
  (``(x.float() - mean) / std`` on the uint8 channels-last batch), for comparison.
- **stoker**: ``stoker bench DIR --preset imagenet-train --threads 2 --batch-size 256 --json
  --no-digest --epochs 2`` on each ``--stoker-data`` source (default the random-access shards
  ``bench-data/shards-ra2``; the ImageFolder itself can be added).

How: each run is a fresh process that loads one warm-up epoch (FFCV compiles its numba pipeline
there) and then ``--epochs`` measured epochs; only the measured epochs count. A measured epoch
runs from ``iter(loader)`` to its last batch, so nothing was prefetched before it began (FFCV
starts a new producer thread per ``iter``; stoker reports each epoch from ``set_epoch`` to its
last batch). CPU time is ``getrusage(RUSAGE_SELF)`` user + system over that window: all threads of
the process (FFCV's numba workers and producer thread, stoker's pool). Neither consumer touches
the batches. Runs alternate FFCV, stoker, FFCV, stoker, ... for ``--repeats`` rounds after one
discarded round (page cache, first compile); medians and paired per-round ratios are reported.
Whole-process figures (interpreter start, imports, JIT, indexing, warm-up) are recorded too,
as ``process_*``.

Known differences in the work done: FFCV 1.0.2's decoder decodes the whole JPEG at full size
(``tjDecompress2`` at scale 1/1 with ``TJFLAG_FASTDCT``: no DCT scaling, no region-of-interest
decode; the system libturbojpeg), then crops (torchvision's crop sampling, ported to numba) and
resizes with OpenCV's ``INTER_AREA``; stoker decodes only the crop's region at a DCT-reduced
scale. FFCV allocates its batch buffers afresh for every epoch, each image's decode buffer sized
for the dataset's largest height x width, so each epoch page-faults its working set anew: the
measured figures split FFCV's CPU into user and system time and count its minor page faults.

Commands (from the repository root; FFCV lives in its own virtual environment)::

    /work/ffcv-venv/bin/python benches/compare_ffcv.py --repeats 5
    /work/ffcv-venv/bin/python benches/compare_ffcv.py --repeats 5 \\
        --stoker-data bench-data/shards-ra2 --stoker-data bench-data/imagenet-like-v2

Writes every run's figures, the medians and the ratios to ``--out`` (default
``benches/results/ffcv.json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def beton_path(args) -> Path:
    return args.beton_dir / f"{args.data.name}-jpg-q{args.jpeg_quality}.beton"


def convert(args) -> dict:
    """Writes the ImageFolder as a .beton once (kept in --beton-dir); returns what was written."""
    import torchvision
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    dst = beton_path(args)
    meta = dst.with_suffix(".json")
    if dst.exists() and meta.exists():
        return json.loads(meta.read_text())
    dst.parent.mkdir(parents=True, exist_ok=True)
    ds = torchvision.datasets.ImageFolder(str(args.data))
    tmp = dst.with_suffix(".beton.tmp")
    fields = {"image": RGBImageField(write_mode="jpg", max_resolution=None, jpeg_quality=args.jpeg_quality),
              "label": IntField()}
    t0 = time.perf_counter()
    DatasetWriter(str(tmp), fields, num_workers=args.workers).from_indexed_dataset(ds)
    info = {"beton": str(dst), "source": str(args.data), "images": len(ds), "write_mode": "jpg",
            "max_resolution": None, "jpeg_quality": args.jpeg_quality, "seconds": time.perf_counter() - t0,
            "beton_bytes": tmp.stat().st_size,
            "source_bytes": sum(os.path.getsize(p) for p, _ in ds.samples)}
    tmp.rename(dst)
    meta.write_text(json.dumps(info, indent=1))
    return info


def cpu_seconds() -> tuple[float, float, int]:
    """User and system CPU-seconds and minor page faults of this process, all threads."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime, ru.ru_stime, ru.ru_minflt


def ffcv_child(args) -> None:
    """Child mode: warm-up + measured epochs of FFCV's loader; prints one JSON line."""
    import numba
    import numpy as np
    import torch
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, Squeeze, ToTensor, ToTorchImage

    mean, std = np.array(MEAN) * 255, np.array(STD) * 255
    image = [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip()]
    if args.normalize == "ffcv":
        image.append(NormalizeImage(mean, std, np.float32))
    image += [ToTensor(), ToTorchImage()]
    loader = Loader(str(beton_path(args)), batch_size=args.batch_size, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=True, seed=args.seed,
                    pipelines={"image": image, "label": [IntDecoder(), ToTensor(), Squeeze()]})
    tmean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    tstd = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    epochs, sample = [], None
    for epoch in range(1 + args.epochs):
        n, (u0, s0, f0), t0 = 0, cpu_seconds(), time.perf_counter()
        for images, labels in loader:
            if args.normalize == "torch":
                images = (images.float() - tmean) / tstd
            if sample is None:
                sample = {"shape": list(images.shape), "dtype": str(images.dtype),
                          "channels_last": images.is_contiguous(memory_format=torch.channels_last),
                          "mean": images.float().mean().item(), "std": images.float().std().item(),
                          "labels": str(labels.dtype), "label_shape": list(labels.shape)}
            n += images.shape[0]
        t1, (u1, s1, f1) = time.perf_counter(), cpu_seconds()
        epochs.append({"epoch": epoch, "images": n, "seconds": t1 - t0, "cpu_seconds": u1 - u0 + s1 - s0,
                       "user_seconds": u1 - u0, "system_seconds": s1 - s0, "minor_faults": f1 - f0})
    print(json.dumps({"epochs": epochs, "sample": sample, "numba_threading_layer": numba.threading_layer(),
                      "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def run_child(cmd: list[str]) -> tuple[dict, dict]:
    """Runs cmd (its stdout, or its last line, is JSON); returns it and the process's rusage and wall time."""
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:  # a library printed something before the JSON line
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return out, {"process_seconds": wall, "process_cpu_seconds": cpu,
                 "process_system_seconds": r1.ru_stime - r0.ru_stime,
                 "process_minor_faults": r1.ru_minflt - r0.ru_minflt}


def figures(measured: list[dict]) -> dict:
    n = sum(e["images"] for e in measured)
    s = sum(e["seconds"] for e in measured)
    c = sum(e["cpu_seconds"] for e in measured)
    return {"images": n, "seconds": s, "cpu_seconds": c, "cpu_s_per_1000": c / n * 1000,
            "images_per_s": n / s, "images_per_cpu_s": n / c}


def child_cmd(args, mode: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--data", str(args.data),
            "--beton-dir", str(args.beton_dir), "--jpeg-quality", str(args.jpeg_quality),
            "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--epochs", str(args.epochs),
            "--normalize", args.normalize, "--seed", str(args.seed)]


def run_ffcv(args) -> dict:
    out, proc = run_child(child_cmd(args, "ffcv"))
    measured = out["epochs"][1:]
    split = {k: sum(e[k] for e in measured) for k in ("user_seconds", "system_seconds", "minor_faults")}
    return {**figures(measured), **split, **proc, "warmup": out["epochs"][0],
            **{k: v for k, v in out.items() if k != "epochs"}}


def run_stoker(args, data: Path) -> dict:
    cmd = [str(args.stoker), "bench", str(data), "--preset", "imagenet-train", "--threads", str(args.workers),
           "--batch-size", str(args.batch_size), "--json", "--no-digest", "--epochs", str(1 + args.epochs),
           "--seed", str(args.seed)]
    out, proc = run_child(cmd)
    return {**figures(out["per_epoch"][1:]), **proc, "warmup": out["per_epoch"][0],
            "peak_rss_bytes": out["peak_rss_bytes"], "threads": out["threads"], "skipped": out["skipped_count"]}


def environment(args) -> dict:
    from importlib.metadata import version

    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    libs = {p: version(p) for p in ("ffcv", "numba", "numpy", "torch", "torchvision", "opencv-python")}
    pc = subprocess.run(["pkg-config", "--modversion", "libturbojpeg", "opencv4"], capture_output=True, text=True)
    libs["system libturbojpeg, opencv4 (linked by ffcv._libffcv)"] = pc.stdout.split()
    st = args.stoker.stat()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "versions": libs,
            "stoker_binary": str(args.stoker), "stoker_binary_mtime": time.ctime(st.st_mtime),
            "stoker_git": git("rev-parse", "--short", "HEAD"),
            "stoker_git_dirty": git("status", "--short", "--untracked-files=no").splitlines()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "imagenet-like-v2")
    ap.add_argument("--stoker-data", type=Path, action="append",
                    help="stoker's source, repeatable (default bench-data/shards-ra2)")
    ap.add_argument("--stoker", type=Path, default=ROOT / "target" / "release" / "stoker")
    ap.add_argument("--beton-dir", type=Path, default=Path("/tmp/ffcv-data"))
    ap.add_argument("--jpeg-quality", type=int, default=90)
    ap.add_argument("--normalize", choices=("ffcv", "torch"), default="ffcv")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2, help="FFCV num_workers and stoker --threads")
    ap.add_argument("--epochs", type=int, default=1, help="measured epochs per run, after one warm-up epoch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "results" / "ffcv.json")
    ap.add_argument("--child", choices=("convert", "ffcv"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child == "convert":
        print(json.dumps(convert(args)))
        return
    if args.child == "ffcv":
        ffcv_child(args)
        return
    stoker_data = args.stoker_data or [ROOT / "bench-data" / "shards-ra2"]
    if not args.stoker.exists():
        sys.exit(f"--stoker: {args.stoker} does not exist (cargo build --release)")
    # The parent imports neither torch nor FFCV: Linux carries a process's peak RSS across
    # fork + exec, so a heavy parent would inflate its children's ru_maxrss (stoker's peak_rss_bytes).
    beton, _ = run_child(child_cmd(args, "convert"))
    print(f"beton: {beton['beton']} ({beton['beton_bytes'] / 1e6:.0f} MB; originals "
          f"{beton['source_bytes'] / 1e6:.0f} MB)", file=sys.stderr)
    contenders = {"ffcv": lambda: run_ffcv(args)}
    for d in stoker_data:
        contenders[f"stoker {d.name}"] = lambda d=d: run_stoker(args, d)
    load0 = os.getloadavg()
    for name, run in contenders.items():  # discarded round: page cache, first compile
        print(f"warm-up: {name}", file=sys.stderr)
        run()
    runs: dict[str, list[dict]] = {k: [] for k in contenders}
    for i in range(args.repeats):
        for name, run in contenders.items():
            r = run()
            runs[name].append(r)
            print(f"round {i + 1}/{args.repeats} {name}: {r['images_per_s']:.0f} images/s, "
                  f"{r['cpu_s_per_1000']:.2f} CPU-s/1000", file=sys.stderr)

    keys = ("cpu_s_per_1000", "images_per_s", "images_per_cpu_s", "process_seconds", "process_cpu_seconds",
            "peak_rss_bytes")
    medians = {k: {key: statistics.median(r[key] for r in v) for key in keys} for k, v in runs.items()}
    ratios = {}
    for name in runs:
        if name == "ffcv":
            continue
        pairs = list(zip(runs[name], runs["ffcv"], strict=True))
        ratios[f"{name} / ffcv"] = {
            "images_per_cpu_s": statistics.median(s["images_per_cpu_s"] / f["images_per_cpu_s"] for s, f in pairs),
            "images_per_s": statistics.median(s["images_per_s"] / f["images_per_s"] for s, f in pairs)}
    result = {"command": " ".join([Path(sys.executable).as_posix(), *sys.argv]), "args": {
        k: str(v) for k, v in vars(args).items()}, "environment": environment(args), "beton": beton,
        "loadavg_start": load0, "loadavg_end": os.getloadavg(), "runs": runs, "medians": medians,
        "paired_ratios": ratios}
    args.out.write_text(json.dumps(result, indent=1) + "\n")

    print(f"\n{args.repeats} rounds, medians of the measured epochs ({runs['ffcv'][0]['images']} images each):\n")
    print("| loader | CPU-s / 1000 images | images / CPU-s | images / s | peak RSS |")
    print("|---|---:|---:|---:|---:|")
    for k, m in medians.items():
        print(f"| {k} | {m['cpu_s_per_1000']:.2f} | {m['images_per_cpu_s']:.0f} | {m['images_per_s']:.0f} "
              f"| {m['peak_rss_bytes'] / 2**20:.0f} MiB |")
    for k, r in ratios.items():
        print(f"\n{k}, paired per round: {r['images_per_cpu_s']:.2f}x images per CPU-second, "
              f"{r['images_per_s']:.2f}x images/s")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
