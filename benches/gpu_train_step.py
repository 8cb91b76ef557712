#!/usr/bin/env python3
"""GPU benchmark: a training loop fed by `stoker.ImageLoader(device="cuda")` vs torchvision's
ImageFolder + DataLoader (pinned memory, `.cuda(non_blocking=True)`).

Each batch gets the same fixed amount of GPU work (`--step-ms`, default 20 ms): it reads the whole
batch (its mean goes into an accumulator) and runs a calibrated number of bf16 4096 x 4096 matmuls
on the consumer's current stream. The number of matmuls is calibrated once, in a separate process,
and the same count is given to every run. Contenders:

- stoker: `stoker.ImageLoader(root, batch_size, preset=..., shuffle=True, drop_last=True,
  device="cuda")`: float32 batches normalised on the GPU (uint8 crosses the bus);
- DataLoader: `ImageFolder` with the torchvision transforms of the same preset (imagenet-train:
  RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize), `DataLoader(num_workers=
  --workers, pin_memory=True, persistent_workers=False, shuffle=True, drop_last=True)`, both tensors
  moved with `.cuda(non_blocking=True)`.

Every run is a fresh subprocess (this script re-invoked with `--run stoker|dataloader`, printing
one JSON line); contenders alternate A B A B ... for `--repeats` rounds so machine noise hits both
alike, and medians are reported with stoker / DataLoader ratios. The files are read once before
the first run (when they fit in half the available RAM) so both start with a warm page cache.

Measured per run:

- images/s over the loop, after `--warmup` batches (not measured);
- GPU-wait fraction: the loop synchronises the GPU after each step, so a step's time is its real
  GPU time and the GPU is idle while the loop waits for data. Waiting for data is the time in
  `next()` (for the DataLoader including the `.cuda()` calls) plus a synchronisation of the
  consumer's stream that finishes any copy still outstanding (stoker makes the stream wait on its
  copy event; the DataLoader's copy runs on the stream itself). Fraction = wait / loop time;
- CPU-seconds per 1000 images: `getrusage` of the process (SELF) plus its reaped children
  (CHILDREN: the DataLoader's workers, which are not persistent, so they are joined when an epoch
  ends or the loop stops), from just before the loader is made to the end of the loop, divided by
  every image delivered (warm-up included, as a worker's CPU time cannot be split by batch);
- peak host memory of the process tree: RSS and PSS summed over the processes, sampled every
  100 ms from /proc by the parent;
- peak GPU memory for data: torch's allocator peak above the baseline before the loop
  (`torch.cuda.max_memory_allocated`: the DataLoader's batches) plus stoker's device pool
  (`stoker.cuda_memory_in_use()[0]`, peak sampled at every step); and the device-wide used
  memory (`torch.cuda.mem_get_info`), peak above the baseline, sampled at every step;
- stoker only: `report()["transfer"]["gbps"]` (bytes over the GPU time of its H2D copies), the
  pinned host-to-device bandwidth that `stoker doctor --json` measures (`gpus[0]
  ["h2d_pinned_gbps"]`) and their ratio, `report()["starvation"]` and the bottleneck stage.

Usage (a machine with an NVIDIA GPU, PyTorch and torchvision; 16 cores used here):

    python3 benches/gpu_train_step.py --images 10240 --batch-size 256 --repeats 3 --step-ms 20 \\
        --out benches/results-gpu-train-step.json
    python3 benches/gpu_train_step.py --root /data/imagenet/train --batches 300
    python3 benches/gpu_train_step.py --dry-run      # prints the plan; needs no GPU

Writes JSON to --out and prints a Markdown table.
"""

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG"}
MATMUL_SIZE = 4096
MiB = 2**20


# Process-tree memory sampling is shared with the other benches.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_torchvision import run_measured  # noqa: E402

# --- child side: the training loop ---------------------------------------------------------------

def cpu_seconds():
    """CPU time of this process and its reaped children."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class Step:
    """The fixed GPU work of one training step, queued on the current stream: reads the whole
    batch (its mean, and the labels', go into an accumulator) and runs `iters` bf16 matmuls."""

    def __init__(self, iters):
        import torch

        self.torch = torch
        self.iters = iters
        g = torch.Generator(device="cuda")
        g.manual_seed(0)
        self.a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16, generator=g)
        self.b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16, generator=g)
        self.out = torch.empty(MATMUL_SIZE, MATMUL_SIZE, device="cuda", dtype=torch.bfloat16)
        self.acc = torch.zeros((), device="cuda", dtype=torch.float32)

    def matmuls(self, n):
        for _ in range(n):
            self.torch.mm(self.a, self.b, out=self.out)

    def __call__(self, images, labels):
        self.acc += images.float().mean()
        self.acc += labels.float().mean()
        self.matmuls(self.iters)
        self.acc += self.out[0, 0].float()


def calibrate(args):
    """Child mode: how many matmuls make --step-ms of GPU time; prints a JSON line."""
    import torch

    step = Step(0)
    step.matmuls(200)  # cuBLAS handle and workspace, clocks up
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_matmul = []
    for _ in range(5):
        start.record()
        step.matmuls(50)
        end.record()
        end.synchronize()
        per_matmul.append(start.elapsed_time(end) / 50)
    ms_per_matmul = statistics.median(per_matmul)
    step.iters = max(1, round(args.step_ms / ms_per_matmul))
    images = torch.randn(args.batch_size, 3, 224, 224, device="cuda")
    labels = torch.zeros(args.batch_size, dtype=torch.int64, device="cuda")
    step_ms = []
    for _ in range(5):
        start.record()
        step(images, labels)
        end.record()
        end.synchronize()
        step_ms.append(start.elapsed_time(end))
    print(json.dumps({"iters": step.iters, "ms_per_matmul": ms_per_matmul, "step_ms": statistics.median(step_ms),
                      "gpu": torch.cuda.get_device_name(0)}))


def stoker_batches(loader, epochs):
    """(images, labels) on the GPU, epoch after epoch; each epoch's iterator is closed (its threads
    joined) when it ends or when the consumer stops early."""
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        it = iter(loader)
        try:
            for batch in it:
                yield batch
        finally:
            it.close()


def dataloader_batches(loader, epochs):
    """(images, labels) copied to the GPU, epoch after epoch. Dropping an epoch's iterator shuts
    its (non-persistent) workers down and joins them, so their CPU time reaches RUSAGE_CHILDREN."""
    for _ in range(epochs):
        it = iter(loader)
        try:
            for images, labels in it:
                yield images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
        finally:
            del it


def make_dataloader(args):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    norm = T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    if args.preset == "imagenet-train":
        tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    else:
        tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
    torch.manual_seed(0)
    return torch.utils.data.DataLoader(ImageFolder(str(args.root), transform=tf), batch_size=args.batch_size,
                                       shuffle=True, num_workers=args.workers, pin_memory=True,
                                       persistent_workers=False, drop_last=True)


def train(args):
    """Child mode: the training loop with one contender; prints a JSON line."""
    import torch

    torch.cuda.set_device(0)
    step = Step(args.step_iters)
    # One step on dummy data loads every kernel the loop uses, for both contenders alike.
    step(torch.zeros(args.batch_size, 3, 224, 224, device="cuda"),
         torch.zeros(args.batch_size, dtype=torch.int64, device="cuda"))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the dummy batch's cached blocks would otherwise hide a real batch's memory
    torch.cuda.reset_peak_memory_stats()
    base_allocated = torch.cuda.memory_allocated()
    free, total = torch.cuda.mem_get_info()
    base_used = total - free
    epochs = args.epochs if args.batches is None else 10**9  # with --batches: as many as it takes

    stoker = None
    cpu0 = cpu_seconds()
    if args.run == "stoker":
        import stoker

        loader = stoker.ImageLoader(str(args.root), args.batch_size, preset=args.preset, shuffle=True,
                                    drop_last=True, device="cuda")
        batches = stoker_batches(loader, epochs)
    else:
        loader = make_dataloader(args)
        batches = dataloader_batches(loader, epochs)

    stream = torch.cuda.current_stream()
    wait = 0.0
    measured_batches = measured_images = all_images = 0
    peak_used = base_used
    peak_stoker_device = peak_stoker_pinned = 0
    t_start = t_end = None
    k = 0
    while args.batches is None or measured_batches < args.batches:
        t0 = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            break
        stream.synchronize()  # a copy still outstanding is waiting for data too
        t1 = time.perf_counter()
        step(images, labels)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        n = images.shape[0]
        all_images += n
        if k == args.warmup:
            t_start = t0
        if k >= args.warmup:
            wait += t1 - t0
            measured_batches += 1
            measured_images += n
            t_end = t2
        k += 1
        free, total = torch.cuda.mem_get_info()
        peak_used = max(peak_used, total - free)
        if stoker is not None:
            device_bytes, pinned_bytes = stoker.cuda_memory_in_use()
            peak_stoker_device = max(peak_stoker_device, device_bytes)
            peak_stoker_pinned = max(peak_stoker_pinned, pinned_bytes)
    images = labels = None
    batches.close()  # closes the epoch's iterator: stoker's threads / the DataLoader's workers are joined
    gc.collect()
    cpu = cpu_seconds() - cpu0
    if measured_batches == 0:
        raise SystemExit(f"no batch after the {args.warmup} warm-up batches: use more images or --epochs")

    seconds = t_end - t_start
    torch_peak = torch.cuda.max_memory_allocated() - base_allocated
    result = {
        "contender": args.run,
        "gpu": torch.cuda.get_device_name(0),
        "batches": measured_batches,
        "images": measured_images,
        "seconds": seconds,
        "images_per_sec": measured_images / seconds,
        "wait_seconds": wait,
        "gpu_wait_fraction": wait / seconds,
        "all_images": all_images,
        "cpu_seconds": cpu,
        "cpu_s_per_1000": cpu / all_images * 1000,
        "gpu_torch_peak_bytes": torch_peak,
        "gpu_stoker_peak_bytes": peak_stoker_device,
        "gpu_data_peak_bytes": torch_peak + peak_stoker_device,
        "gpu_used_delta_peak_bytes": peak_used - base_used,
    }
    if stoker is not None:
        report = loader.report()
        result.update({
            "threads": loader.threads,
            "device": report["device"],
            "pinned_stoker_peak_bytes": peak_stoker_pinned,
            "transfer": report["transfer"],
            "transfer_gbps": report["transfer"]["gbps"],
            "starvation": report["starvation"],
            "bottleneck": report["bottleneck"]["stage"],
        })
    else:
        result["workers"] = args.workers
    print(json.dumps(result))


# --- parent side ---------------------------------------------------------------------------------

def demo_root(args):
    return ROOT / "bench-data" / "gpu-demo" / f"{args.images}-images"


def count_images(root):
    return sum(1 for p in root.rglob("*") if p.suffix in IMAGE_SUFFIXES)


def warm_page_cache(root):
    """Reads every file once when the set fits in half the available RAM."""
    files = [p for p in root.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    available = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    if available is not None and size > available // 2:
        print(f"{size / 2**30:.1f} GiB of files do not fit in half the available RAM: page cache not warmed",
              file=sys.stderr)
        return
    for p in files:
        with open(p, "rb") as f:
            while f.read(1 << 22):
                pass


def doctor_bandwidth():
    """`stoker doctor --json`'s measured host-to-device bandwidth of GPU 0 (GB/s): (pinned, pageable)."""
    exe = shutil.which("stoker")
    cmd = [exe] if exe else [sys.executable, "-m", "stoker.cli"]
    proc = subprocess.run(cmd + ["doctor", "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"stoker doctor failed: {proc.stderr.strip()}", file=sys.stderr)
        return None, None
    gpus = json.loads(proc.stdout).get("gpus") or []
    gpu = next((g for g in gpus if g.get("index", 0) == 0), None)
    if gpu is None:
        print("stoker doctor lists no GPU", file=sys.stderr)
        return None, None
    return gpu.get("h2d_pinned_gbps"), gpu.get("h2d_pageable_gbps")


def child_cmd(args, run, step_iters=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--run", run, "--root", str(args.root), "--preset", args.preset,
           "--batch-size", str(args.batch_size), "--workers", str(args.workers), "--warmup", str(args.warmup),
           "--step-ms", str(args.step_ms)]
    cmd += ["--epochs", str(args.epochs)] if args.batches is None else ["--batches", str(args.batches)]
    if step_iters is not None:
        cmd += ["--step-iters", str(step_iters)]
    return cmd


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ratio(r):
    return "n/a" if r is None else f"{r:.2f}x"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, help="an ImageFolder (default: a demo set of --images images)")
    ap.add_argument("--images", type=int, default=10240,
                    help="demo images to make under bench-data/gpu-demo when --root is not given")
    ap.add_argument("--preset", default="imagenet-train", choices=["imagenet-train", "imagenet-val"])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=1, help="epochs per run (default 1)")
    ap.add_argument("--batches", type=int, help="measured batches per run instead of --epochs (epochs repeat)")
    ap.add_argument("--warmup", type=int, default=5, help="batches at the start of a run that are not timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=20.0, help="GPU work per batch, milliseconds")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader num_workers (default: cores)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-gpu-results.json")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (needs no GPU)")
    ap.add_argument("--run", choices=["stoker", "dataloader", "calibrate"], help=argparse.SUPPRESS)
    ap.add_argument("--step-iters", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("images", "batch_size", "epochs", "repeats", "workers"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.batches is not None and args.batches < 1:
        ap.error("--batches must be at least 1")
    if args.warmup < 0 or args.step_ms <= 0:
        ap.error("--warmup must be >= 0 and --step-ms > 0")

    if args.run == "calibrate":
        return calibrate(args)
    if args.run is not None:
        if args.step_iters is None:
            ap.error("--run needs --step-iters")
        return train(args)

    make_demo = args.root is None
    if make_demo:
        args.root = demo_root(args)
    if args.dry_run:
        state = "exists" if args.root.exists() else ("will be made" if make_demo else "MISSING")
        length = f"{args.epochs} epoch(s)" if args.batches is None else f"{args.batches} batches"
        print(f"data: {args.root} ({state}{f', {args.images} demo images' if make_demo else ''})")
        print(f"preset {args.preset}, batch {args.batch_size}, {length} per run after {args.warmup} warm-up "
              f"batches, {args.step_ms:g} ms of GPU work per batch")
        print(f"{args.repeats} rounds of: stoker, dataloader (DataLoader num_workers={args.workers}); medians")
        print("calibration: " + " ".join(child_cmd(args, "calibrate")))
        for run in ("stoker", "dataloader"):
            print(f"{run}: " + " ".join(child_cmd(args, run, step_iters="N")))
        print(f"bandwidth reference: stoker doctor --json; results: {args.out}")
        return None

    if make_demo and not args.root.exists():
        import stoker

        print(f"making {args.images} demo images in {args.root}", file=sys.stderr)
        stoker.make_demo(str(args.root), args.images, seed=0)
    if not args.root.is_dir():
        ap.error(f"--root {args.root} is not a directory")
    files = count_images(args.root)
    warm_page_cache(args.root)

    pinned_gbps, pageable_gbps = doctor_bandwidth()
    cal_out, _, _, _ = run_measured(child_cmd(args, "calibrate"))
    cal = json.loads(cal_out.strip().splitlines()[-1])
    print(f"{cal['gpu']}: {cal['iters']} bf16 matmuls of {MATMUL_SIZE} ({cal['ms_per_matmul']:.3f} ms each) make a "
          f"{cal['step_ms']:.1f} ms step", file=sys.stderr)

    names = ["stoker", "dataloader"]
    runs = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names:
            out, rss, pss, wall = run_measured(child_cmd(args, name, cal["iters"]))
            rec = json.loads(out.strip().splitlines()[-1])
            rec.update({"peak_rss_tree": rss, "peak_pss_tree": pss, "process_wall": wall})
            runs[name].append(rec)
            print(f"run {r + 1} {name:10s} {rec['images_per_sec']:8.1f} img/s  wait {rec['gpu_wait_fraction']:6.1%}"
                  f"  {rec['cpu_s_per_1000']:6.2f} CPU-s/1000  RSS {rss / MiB:7.0f} MiB"
                  f"  GPU data {rec['gpu_data_peak_bytes'] / MiB:6.0f} MiB", file=sys.stderr)

    def med(name, key):
        return statistics.median(x[key] for x in runs[name])

    metrics = ["images_per_sec", "gpu_wait_fraction", "cpu_s_per_1000", "peak_rss_tree", "peak_pss_tree",
               "gpu_data_peak_bytes", "gpu_torch_peak_bytes", "gpu_stoker_peak_bytes", "gpu_used_delta_peak_bytes"]
    summary = {
        "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "gpu": cal["gpu"]},
        "data": str(args.root), "files": files, "preset": args.preset, "batch_size": args.batch_size,
        "epochs": args.epochs if args.batches is None else None, "batches": args.batches, "warmup": args.warmup,
        "workers": args.workers, "repeats": args.repeats, "step_ms": args.step_ms, "calibration": cal,
        "doctor_h2d_pinned_gbps": pinned_gbps, "doctor_h2d_pageable_gbps": pageable_gbps, "runs": runs,
    }
    for key in metrics:
        a, b = med("stoker", key), med("dataloader", key)
        summary[key] = {"stoker": a, "dataloader": b, "ratio": ratio(a, b)}
    pairs = list(zip(runs["stoker"], runs["dataloader"], strict=True))
    summary["paired_ratio_images_per_sec"] = statistics.median(a["images_per_sec"] / b["images_per_sec"]
                                                               for a, b in pairs)
    transfer_gbps = med("stoker", "transfer_gbps")
    summary["stoker_transfer_gbps"] = transfer_gbps
    summary["stoker_transfer_vs_pinned"] = ratio(transfer_gbps, pinned_gbps)
    summary["stoker_starvation"] = med("stoker", "starvation")
    summary["stoker_pinned_peak_bytes"] = med("stoker", "pinned_stoker_peak_bytes")
    summary["stoker_bottleneck"] = [x["bottleneck"] for x in runs["stoker"]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))

    s = summary
    threads = runs["stoker"][0]["threads"]
    print(f"\n{files} images, preset {args.preset}, batch {args.batch_size}, {args.step_ms:g} ms GPU step "
          f"({cal['iters']} bf16 matmuls), {cal['gpu']}; stoker threads={threads}, DataLoader num_workers="
          f"{args.workers}; medians of {args.repeats} interleaved runs\n")
    print("| metric | stoker (device=\"cuda\") | DataLoader + .cuda() | stoker / DataLoader |")
    print("|---|---|---|---|")

    def row(label, key, scale=1.0, unit="", digits=1):
        a, b = s[key]["stoker"] / scale, s[key]["dataloader"] / scale
        print(f"| {label} | {a:.{digits}f}{unit} | {b:.{digits}f}{unit} | {fmt_ratio(s[key]['ratio'])} |")

    row("images/s", "images_per_sec")
    row("GPU-wait fraction", "gpu_wait_fraction", scale=0.01, unit=" %")
    row("CPU-s per 1000 images", "cpu_s_per_1000", digits=2)
    row("peak RSS, process tree", "peak_rss_tree", scale=MiB, unit=" MiB", digits=0)
    row("peak PSS, process tree", "peak_pss_tree", scale=MiB, unit=" MiB", digits=0)
    row("peak GPU memory for data (torch allocator + stoker pool)", "gpu_data_peak_bytes", scale=MiB,
        unit=" MiB", digits=0)
    row("peak GPU memory used, device-wide delta (mem_get_info)", "gpu_used_delta_peak_bytes", scale=MiB,
        unit=" MiB", digits=0)
    print(f"\npaired images/s ratio: {s['paired_ratio_images_per_sec']:.2f}x")
    pinned = "n/a" if pinned_gbps is None else f"{pinned_gbps:.1f} GB/s"
    print(f"stoker H2D copies: {transfer_gbps:.1f} GB/s (report()['transfer']); stoker doctor pinned H2D: {pinned}; "
          f"ratio {fmt_ratio(s['stoker_transfer_vs_pinned'])}")
    print(f"stoker starvation (its own report): {s['stoker_starvation']:.1%}; bottleneck stage per run: "
          f"{', '.join(s['stoker_bottleneck'])}; pinned host memory peak "
          f"{s['stoker_pinned_peak_bytes'] / MiB:.0f} MiB")
    print(f"\nJSON: {args.out}")
    return None


if __name__ == "__main__":
    main()
