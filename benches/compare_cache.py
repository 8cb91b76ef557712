#!/usr/bin/env python3
"""The decoded-pixel cache, measured: CPU per epoch with and without it, and two processes
sharing one cache.

Rounds, interleaved (A B C D A B C D ...), each contender a fresh process over the same data
(``bench-data/imagenet-like-v2``, made by ``make_imagenet_like.py``), ``--epochs`` passes:

- ``default``: ``stoker bench`` as shipped (region + DCT-scaled decode), no cache;
- ``full-res``: ``--no-dct-scaling --no-roi``, what the cache's batches are bit-identical to;
- ``cache``: ``--cache DIR`` with a budget larger than the dataset, a fresh DIR every round (so
  epoch 1 fills it and later epochs hit);
- ``cache-half``: the same with ``--cache-bytes`` half of what the whole dataset needs;
- ``cache-reduced``: ``--cache DIR --cache-max-side N`` (``--max-side``, default 320): entries
  reduced to a longer side of N (not bit-identical to full resolution);
- ``dataloader`` (with ``--dataloader``): one epoch of torchvision's ImageFolder + DataLoader
  (PIL), from ``compare_torchvision.py``, for the issue's "vs the DataLoader" ratio.

Reported per contender and epoch: median CPU-seconds per 1000 images (from the bench JSON's
``per_epoch``). Ratios: a cached later epoch against a default first epoch and against the
DataLoader.

Then sharing: a cache is filled once, and two processes run ``stoker bench --cache DIR`` over
it at the same time; their RSS and PSS are sampled together every 100 ms. The cache is one set
of files (on tmpfs for ``/dev/shm``), stored once whatever the number of processes; each
process maps an entry only while it processes that sample, so neither holds a copy: the sum of
their PSS stays at what two processes without a cache use, while the cache's bytes are counted
once, in the files.

Usage: python3 benches/compare_cache.py [--repeats 3] [--epochs 3] [--dataloader] [--out bench-cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_torchvision import run_measured, tree_memory  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def dataset_pixel_bytes(root: Path) -> int:
    """Bytes of the dataset decoded at full resolution as RGB8 (what a whole cache holds,
    headers aside)."""
    from PIL import Image

    total = 0
    for p in root.rglob("*.jpg"):
        with Image.open(p) as im:
            total += im.width * im.height * 3
    return total


def bench(args: argparse.Namespace, *extra: str) -> dict:
    cmd = [str(args.stoker), "bench", str(args.data), "--preset", args.preset, "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs), "--json", "--no-digest", *extra]
    out, *_ = run_measured(cmd)
    result: dict = json.loads(out)
    return result


def sharing(args: argparse.Namespace, cache_dir: Path) -> dict:
    """Two processes over one filled cache at once: peak sums of RSS and PSS."""
    cmd = [str(args.stoker), "bench", str(args.data), "--preset", args.preset, "--batch-size", str(args.batch_size),
           "--epochs", "2", "--json", "--no-digest", "--cache", str(cache_dir)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    peak = {"rss_sum": 0, "pss_sum": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            rss = pss = 0
            for p in procs:
                r, s = tree_memory(p.pid)
                rss, pss = rss + r, pss + s
            peak["rss_sum"], peak["pss_sum"] = max(peak["rss_sum"], rss), max(peak["pss_sum"], pss)
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    outs = [p.communicate() for p in procs]
    done.set()
    t.join()
    for p, (_, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            raise RuntimeError(f"{cmd} failed: {err}")
    caches = [json.loads(o)["cache"] for o, _ in outs]
    return {**peak, "hits": [c["hits"] for c in caches], "misses": [c["misses"] for c in caches]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "imagenet-like-v2")
    ap.add_argument("--preset", default="imagenet-train", choices=["imagenet-train", "imagenet-val"])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dataloader", action="store_true", help="also time one epoch of the torchvision DataLoader")
    ap.add_argument("--max-side", type=int, default=320, help="--cache-max-side of the cache-reduced contender")
    ap.add_argument("--cache-root", type=Path, default=None,
                    help="where the caches go (default: a fresh folder under /dev/shm)")
    ap.add_argument("--stoker", type=Path, default=ROOT / "target" / "release" / "stoker")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-cache.json")
    args = ap.parse_args()
    if not args.data.exists():
        subprocess.run([sys.executable, str(ROOT / "benches" / "make_imagenet_like.py"), "--out", str(args.data),
                        "--check"], check=True)
    whole = dataset_pixel_bytes(args.data)
    files = sum(1 for _ in args.data.rglob("*.jpg"))
    base = Path(tempfile.mkdtemp(prefix="stoker-bench-cache-", dir=args.cache_root or "/dev/shm"))
    contenders = {
        "default": lambda _r: [],
        "full-res": lambda _r: ["--no-dct-scaling", "--no-roi"],
        "cache": lambda r: ["--cache", str(base / f"whole-{r}"), "--cache-bytes", str(2 * whole)],
        "cache-half": lambda r: ["--cache", str(base / f"half-{r}"), "--cache-bytes", str(whole // 2)],
        "cache-reduced": lambda r: ["--cache", str(base / f"reduced-{r}"), "--cache-bytes", str(2 * whole),
                                    "--cache-max-side", str(args.max_side)],
    }
    runs: dict[str, list[list[float]]] = {k: [] for k in contenders}
    dataloader: list[float] = []
    tv = [sys.executable, str(ROOT / "benches" / "compare_torchvision.py"), "--torch-runner", "--data",
          str(args.data), "--preset", args.preset, "--batch-size", str(args.batch_size), "--workers",
          str(os.cpu_count())]
    try:
        for r in range(args.repeats):
            for name, extra in contenders.items():
                j = bench(args, *extra(r))
                per = [e["cpu_seconds_per_1000"] for e in j["per_epoch"]]
                runs[name].append(per)
                print(f"round {r + 1} {name:10s} CPU-s/1000 per epoch: " + " ".join(f"{x:5.2f}" for x in per),
                      file=sys.stderr)
                for d in ("whole", "half", "reduced"):
                    shutil.rmtree(base / f"{d}-{r}", ignore_errors=True)
            if args.dataloader:
                out, *_ = run_measured(tv)
                j = json.loads(out.strip().splitlines()[-1])
                dataloader.append(j["cpu_seconds"] / j["images"] * 1000)
                print(f"round {r + 1} dataloader CPU-s/1000: {dataloader[-1]:5.2f}", file=sys.stderr)
        shared_dir = base / "shared"
        bench(args, "--cache", str(shared_dir), "--cache-bytes", str(2 * whole))  # fill it once
        share = sharing(args, shared_dir)
        share["cache_file_bytes"] = sum(f.stat().st_size for f in shared_dir.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(base, ignore_errors=True)

    med = {k: [statistics.median(v[e] for v in runs[k]) for e in range(args.epochs)] for k in runs}
    later = statistics.median(med["cache"][1:])
    summary = {
        "data": str(args.data), "files": files, "preset": args.preset, "batch_size": args.batch_size,
        "epochs": args.epochs, "repeats": args.repeats, "dataset_pixel_bytes": whole,
        "machine": {"cpus": os.cpu_count()}, "runs": runs, "median_cpu_s_per_1000": med,
        "cached_later_epochs_vs_default_epoch1": med["default"][0] / later,
        "half_cache_later_epochs_vs_default_epoch1": med["default"][0] / statistics.median(med["cache-half"][1:]),
        "max_side": args.max_side,
        "reduced_cache_later_epochs_vs_default_epoch1":
            med["default"][0] / statistics.median(med["cache-reduced"][1:]),
        "sharing": share, "dataloader_cpu_s_per_1000": dataloader,
    }
    if dataloader:
        summary["cached_later_epochs_vs_dataloader"] = statistics.median(dataloader) / later
        summary["reduced_cache_later_epochs_vs_dataloader"] = (statistics.median(dataloader)
                                                               / statistics.median(med["cache-reduced"][1:]))
    args.out.write_text(json.dumps(summary, indent=2))

    print(f"\n{files} JPEGs ({whole / 2**20:.0f} MiB decoded), preset {args.preset}, batch {args.batch_size}; "
          f"medians of {args.repeats} interleaved rounds; CPU-seconds per 1000 images\n")
    print("| contender | " + " | ".join(f"epoch {e + 1}" for e in range(args.epochs)) + " |")
    print("|---" * (args.epochs + 1) + "|")
    for k, v in med.items():
        print(f"| {k} | " + " | ".join(f"{x:.2f}" for x in v) + " |")
    if dataloader:
        print(f"| DataLoader (PIL), one epoch | {statistics.median(dataloader):.2f} |" + " |" * (args.epochs - 1))
    print(f"\ncached later epochs vs a default first epoch: {summary['cached_later_epochs_vs_default_epoch1']:.2f}x "
          f"fewer CPU-seconds; half budget: {summary['half_cache_later_epochs_vs_default_epoch1']:.2f}x; "
          f"reduced to {args.max_side} px: {summary['reduced_cache_later_epochs_vs_default_epoch1']:.2f}x")
    if dataloader:
        print(f"cached later epochs vs the DataLoader: {summary['cached_later_epochs_vs_dataloader']:.2f}x; "
              f"reduced: {summary['reduced_cache_later_epochs_vs_dataloader']:.2f}x")
    print(f"two processes over one cache: hits {share['hits']}, misses {share['misses']}; the cache's files "
          f"{share['cache_file_bytes'] / 2**20:.0f} MiB (once); the processes' peak sum of RSS "
          f"{share['rss_sum'] / 2**20:.0f} MiB, of PSS {share['pss_sum'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
