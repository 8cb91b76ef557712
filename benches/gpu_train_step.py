#!/usr/bin/env python3
"""GPU benchmark: a training loop fed by `stoker.ImageLoader(device="cuda")` vs PyTorch's
DataLoader, plain and in its strongest hand-written form.

Each batch gets the same fixed amount of GPU work (`--step-ms`, default 20 ms): it reads the whole
batch (its mean goes into an accumulator) and runs a calibrated number of bf16 4096 x 4096 matmuls
on the consumer's current (compute) stream. The number of matmuls is calibrated once, in a
separate process, and the same count is given to every run. Contenders:

- stoker: `stoker.ImageLoader(root, batch_size, preset=..., shuffle=True, drop_last=True,
  device="cuda")`: uint8 crosses the bus, float32 is made on the GPU;
- stoker-gpu: the same with `decode="auto"`: nvJPEG decodes a share of each batch on the GPU,
  tuned so that the CPU threads and the GPU finish together;
- dataloader (the plain recipe): `ImageFolder` with the torchvision transforms of the same preset
  (imagenet-train: RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize),
  `DataLoader(num_workers=--workers, pin_memory=True, persistent_workers=True, shuffle=True,
  drop_last=True)`, float32 moved with `.cuda(non_blocking=True)` on the compute stream;
- dataloader-uint8 (the strongest hand-written PyTorch pipeline): the same geometry ending in
  `PILToTensor` (uint8 crosses the bus: 4x fewer bytes), `pin_memory=True`, persistent workers;
  batch k+1 is copied (`non_blocking=True`) and normalised on a side stream while step k runs,
  and the compute stream waits on the side stream's event (`record_stream` keeps the allocator
  honest).

Length of a run: steady state. Every loader makes batches ahead of the training step (the
DataLoader up to `--workers` x prefetch_factor 2 batches, one more for dataloader-uint8's side
stream; stoker up to 2 x (prefetch 2 + 2): its pinned host pool and its device pool). Batches
made before the clock starts are free to the measurement, so a run measures `--batches` batches
after `--warmup` warm-up batches, and the loaders' epochs repeat (stoker's `set_epoch` and a new
pass; the DataLoader re-iterated over its persistent workers) until they are reached, however
small the image set. The default is 4x the most batches any contender can hold made ahead
(132 with 16 workers), so what was made before the clock started is a small part of what is
measured. A run whose measured batches are not more than that capacity is refused (its figures
would count work done before the clock started, and CPU-seconds over its wall time could add up
to more cores than the machine has); one under 4x it runs with a warning. `--epochs N` measures
whole epochs instead (N epochs less the warm-up batches), under the same check.

`--model resnet18` (or resnet50) makes the step a real one instead: torchvision's model in bf16
autocast, channels-last, forward, cross-entropy, backward and an SGD step on each batch. The
calibration child then measures the model's own ceiling (one batch, already on the GPU, reused
for every step) and every run is also given as a share of that ceiling (`of_ceiling`).
`--root` may be random-access shards (`stoker pack --random-access`) for the stoker contenders.

Every run is a fresh subprocess (this script re-invoked with `--run NAME`, printing one JSON
line); contenders alternate for `--repeats` rounds so machine noise hits all alike, and medians
are reported with ratios to stoker. The files are read once before the first run (when they fit
in half the available RAM) so all start with a warm page cache.

Timing modes (`--timing`):

- `events` (default; what a real training loop does): no synchronisation per step. A CUDA event
  is recorded on the compute stream just before each step's work and one just after; the loop
  never waits for the GPU, so `next()` overlaps the previous steps' GPU work as it would in
  training. After the loop, GPU idle time = the sum of the gaps between one step's end event
  and the next step's start event (the compute stream had nothing to do: it waited for data),
  and the GPU-idle fraction = idle / (last end - first start), both on the GPU's clock.
  images/s = measured images / wall time from the first measured `next()` to the end of the
  last step (synchronised once, at the end).
- `per-step` (the older, stricter measure): the loop synchronises the GPU after each step, so
  the loader's `next()` latency (which a real loop hides behind the previous step) counts as
  GPU wait. Kept for comparison with earlier results.

Measured per run besides: CPU-seconds per 1000 images (`getrusage` of the process plus its
reaped children: the DataLoader's persistent workers are shut down and joined before the count
is taken; it is divided by the images delivered, warm-up included, so the work on batches made
ahead and never delivered when a run stops is in it too: one more reason for the margin above),
peak RSS/PSS of the process tree (sampled every 100 ms from /proc by the parent),
peak GPU memory for data (torch's allocator peak above the baseline, plus stoker's device pool),
and for stoker its own report (transfer GB/s, starvation, bottleneck) and the pinned bandwidth
`stoker doctor --json` measures.

Usage (a machine with an NVIDIA GPU, PyTorch and torchvision):

    python3 benches/gpu_train_step.py --images 10240 --batch-size 256 --repeats 3 --step-ms 20 \\
        --out benches/results/gpu-train-step.json     # 4x the prefetch capacity, epochs repeat
    python3 benches/gpu_train_step.py --root /data/imagenet/train --batches 300 --timing per-step
    python3 benches/gpu_train_step.py --dry-run      # prints the plan; needs no GPU

Without a GPU the script says so and exits with status 2 (after `--help` and `--dry-run`, which
need none). Writes JSON to --out and prints a Markdown table.
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
# How far ahead each contender may work; given to the loaders explicitly, so `made_ahead` stays true.
STOKER_PREFETCH = 2
DATALOADER_PREFETCH_FACTOR = 2
STEADY_MARGIN = 4  # default measured batches = this x the largest made-ahead capacity


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


class ModelStep:
    """A real training step: torchvision's `name` in bf16 autocast, channels-last, forward,
    cross-entropy, backward and SGD with momentum."""

    def __init__(self, name):
        import torch
        import torchvision

        self.torch = torch
        torch.manual_seed(0)
        self.model = getattr(torchvision.models, name)(num_classes=1000).cuda().to(memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)

    def __call__(self, images, labels):
        torch = self.torch
        x = images.contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(self.model(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()


def make_step(args):
    return Step(args.step_iters) if args.model == "matmul" else ModelStep(args.model)


def calibrate_model(args):
    """Child mode with --model: the model's ceiling, one batch on the GPU reused for every step
    (the issue's definition); also the step on 8 distinct float batches taken in turn (no cache
    can hold them) and on 8 distinct uint8 batches normalised on the GPU by stoker's own
    `Normalizer` each step (what any loader whose batches cross the bus as uint8 pays)."""
    import torch
    from stoker._gpu import Normalizer

    step = ModelStep(args.model)
    n = args.batch_size
    images = torch.randn(n, 3, 224, 224, device="cuda")
    labels = torch.randint(0, 1000, (n,), device="cuda")
    fresh = [torch.randn(n, 3, 224, 224, device="cuda") for _ in range(8)]
    raw = [torch.randint(0, 256, (n, 3, 224, 224), dtype=torch.uint8, device="cuda") for _ in range(8)]
    norm = Normalizer((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "float32", False)

    def timed(batch_of):
        for i in range(15):
            step(batch_of(i), labels)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        steps = 50
        start.record()
        for i in range(steps):
            step(batch_of(i), labels)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / steps

    ms = timed(lambda i: images)
    fresh_ms = timed(lambda i: fresh[i % 8])
    normalized_ms = timed(lambda i: norm(raw[i % 8]))
    print(json.dumps({"iters": 0, "ms_per_matmul": 0.0, "step_ms": ms, "model": args.model,
                      "ceiling_images_per_sec": n / ms * 1e3, "fresh_step_ms": fresh_ms,
                      "fresh_images_per_sec": n / fresh_ms * 1e3, "normalized_step_ms": normalized_ms,
                      "normalized_images_per_sec": n / normalized_ms * 1e3, "gpu": torch.cuda.get_device_name(0)}))


def calibrate(args):
    """Child mode: how many matmuls make --step-ms of GPU time; prints a JSON line."""
    import torch

    if args.model != "matmul":
        return calibrate_model(args)
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


CONTENDERS = ("stoker", "stoker-gpu", "dataloader", "dataloader-uint8")
STOKER = ("stoker", "stoker-gpu")
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def made_ahead(name, workers):
    """The most batches contender `name` can hold made ahead of the training step.

    stoker: its pinned host pool and its device pool have `prefetch + 2` slots each. DataLoader:
    `num_workers x prefetch_factor` outstanding batches; dataloader-uint8 uploads one more on its
    side stream."""
    if name in STOKER:
        return 2 * (STOKER_PREFETCH + 2)
    return workers * DATALOADER_PREFETCH_FACTOR + (1 if name == "dataloader-uint8" else 0)


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
    """The plain recipe: float32 batches copied to the GPU on the compute stream, epoch after
    epoch (persistent workers: the same worker processes serve every epoch)."""
    for epoch in range(epochs):
        del epoch  # the DataLoader's sampler reshuffles every epoch by itself
        for images, labels in loader:
            yield images.cuda(non_blocking=True), labels.cuda(non_blocking=True)


def prefetched_batches(loader, epochs):
    """The strongest hand-written pipeline: uint8 pinned batches are copied and normalised on a
    side stream one batch ahead of the training step; the compute stream waits on the side
    stream's event before it uses a batch, and `record_stream` tells the caching allocator that
    the compute stream uses the memory (so it is not reused while the step still reads it)."""
    import torch

    side = torch.cuda.Stream()
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255

    def upload(images, labels):
        with torch.cuda.stream(side):
            x = images.cuda(non_blocking=True)
            y = labels.cuda(non_blocking=True)
            x = x.float().sub_(mean).div_(std)
            ready = torch.cuda.Event()
            ready.record(side)
        return x, y, ready

    for _ in range(epochs):
        pending = None
        for images, labels in loader:
            nxt = upload(images, labels)
            if pending is not None:
                yield finish(pending)
            pending = nxt
        if pending is not None:
            yield finish(pending)


def finish(pending):
    """Hands a prefetched batch to the compute stream (see `prefetched_batches`)."""
    import torch

    x, y, ready = pending
    stream = torch.cuda.current_stream()
    stream.wait_event(ready)
    x.record_stream(stream)
    y.record_stream(stream)
    return x, y


def make_dataloader(args, uint8):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    if args.preset == "imagenet-train":
        geometry = [T.RandomResizedCrop(224), T.RandomHorizontalFlip()]
    else:
        geometry = [T.Resize(256), T.CenterCrop(224)]
    tail = [T.PILToTensor()] if uint8 else [T.ToTensor(), T.Normalize(MEAN, STD)]
    torch.manual_seed(0)
    return torch.utils.data.DataLoader(ImageFolder(str(args.root), transform=T.Compose(geometry + tail)),
                                       batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                       prefetch_factor=DATALOADER_PREFETCH_FACTOR, pin_memory=True,
                                       persistent_workers=True, drop_last=True)


def shut_down_workers(loader):
    """Joins a DataLoader's persistent workers, so their CPU time reaches RUSAGE_CHILDREN."""
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None


def idle_gaps(starts, ends, warmup):
    """GPU idle of the compute stream from the step events: the gaps between one step's end and
    the next step's start (ms), and the span from the first measured start to the last end."""
    gaps = [ends[k].elapsed_time(starts[k + 1]) for k in range(warmup, len(starts) - 1)]
    span = starts[warmup].elapsed_time(ends[-1])
    return gaps, span


def train(args):
    """Child mode: the training loop with one contender; prints a JSON line."""
    import torch

    torch.cuda.set_device(0)
    step = make_step(args)
    # One step on dummy data loads every kernel the loop uses, for both contenders alike.
    for _ in range(1 if args.model == "matmul" else 3):
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
    if args.run in STOKER:
        import stoker

        decode = "auto" if args.run == "stoker-gpu" else "cpu"
        loader = stoker.ImageLoader(str(args.root), args.batch_size, preset=args.preset, shuffle=True,
                                    drop_last=True, device="cuda", prefetch=STOKER_PREFETCH, decode=decode)
        batches = stoker_batches(loader, epochs)
    elif args.run == "dataloader":
        loader = make_dataloader(args, uint8=False)
        batches = dataloader_batches(loader, epochs)
    else:
        loader = make_dataloader(args, uint8=True)
        batches = prefetched_batches(loader, epochs)

    stream = torch.cuda.current_stream()
    per_step = args.timing == "per-step"
    wait = next_seconds = 0.0
    measured_batches = measured_images = all_images = 0
    peak_used = base_used
    peak_stoker_device = peak_stoker_pinned = 0
    starts, ends = [], []
    t_start = t_end = None
    k = 0
    while args.batches is None or measured_batches < args.batches:
        t0 = time.perf_counter()
        try:
            images, labels = next(batches)
        except StopIteration:
            break
        t1 = time.perf_counter()
        if per_step:
            stream.synchronize()  # a copy still outstanding is waiting for data too
            t1 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        step(images, labels)
        end.record(stream)
        starts.append(start)
        ends.append(end)
        if per_step:
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        n = images.shape[0]
        all_images += n
        if k == args.warmup:
            t_start = t0
            if args.run in STOKER:
                loader.reset_report()  # the report (verdict, CPU clocks) covers the measured steps alone
        if k >= args.warmup:
            wait += t1 - t0
            next_seconds += t1 - t0
            measured_batches += 1
            measured_images += n
            t_end = t2
        k += 1
        if per_step or k % 16 == 0:  # mem_get_info synchronises the device: rarely, without per-step sync
            free, total = torch.cuda.mem_get_info()
            peak_used = max(peak_used, total - free)
        if stoker is not None:
            device_bytes, pinned_bytes = stoker.cuda_memory_in_use()
            peak_stoker_device = max(peak_stoker_device, device_bytes)
            peak_stoker_pinned = max(peak_stoker_pinned, pinned_bytes)
    torch.cuda.synchronize()
    if t_end is not None:
        t_end = time.perf_counter() if not per_step else t_end
    images = labels = None
    batches.close()  # closes the epoch's iterator: stoker's threads are joined
    if args.run not in STOKER:
        shut_down_workers(loader)  # persistent workers: joined now, so their CPU time is counted
    gc.collect()
    cpu = cpu_seconds() - cpu0
    if measured_batches == 0:
        raise SystemExit(f"no batch after the {args.warmup} warm-up batches: use more images, --batches or "
                         "--epochs")
    gaps, span = idle_gaps(starts, ends, args.warmup)
    idle_ms = sum(gaps)

    seconds = t_end - t_start
    torch_peak = torch.cuda.max_memory_allocated() - base_allocated
    result = {
        "contender": args.run,
        "gpu": torch.cuda.get_device_name(0),
        "batches": measured_batches,
        "images": measured_images,
        "seconds": seconds,
        "images_per_sec": measured_images / seconds,
        "timing": args.timing,
        "next_seconds": next_seconds,
        # per-step: host time waiting for data with the GPU drained; events: the GPU's own idle gaps.
        "wait_seconds": wait if per_step else idle_ms / 1e3,
        "gpu_wait_fraction": wait / seconds if per_step else idle_ms / span,
        "gpu_idle_ms": idle_ms,
        "gpu_idle_gap_ms_median": statistics.median(gaps) if gaps else 0.0,
        "gpu_idle_gap_ms_max": max(gaps) if gaps else 0.0,
        "gpu_span_ms": span,
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
            "verdict": report["bottleneck"],
            "cpu": report["cpu"],
            "gpu_decode": report["gpu_decode"],
        })
    else:
        result["workers"] = args.workers
        del loader
    print(json.dumps(result))


# --- parent side ---------------------------------------------------------------------------------

def demo_root(args):
    return ROOT / "bench-data" / "gpu-demo" / f"{args.images}-images"


def count_images(root):
    """Image files under an ImageFolder; for shards, the samples stoker finds in them."""
    n = sum(1 for p in root.rglob("*") if p.suffix in IMAGE_SUFFIXES)
    if n == 0:
        import stoker

        n = stoker.ImageLoader(str(root), 1, preset="imagenet-val").num_samples
    return n


def is_image_folder(root):
    return any(p.suffix in IMAGE_SUFFIXES for p in root.rglob("*"))


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


def plan_length(args, names, files, error):
    """Settles how many batches a run measures (steady state, see the module docstring) and
    refuses a length that the loaders' prefetch could cover. Sets `args.batches` when neither
    --batches nor --epochs was given; returns (measured batches or None when unknown, batches per
    epoch or None, the largest made-ahead capacity, a line that says where that comes from)."""
    ahead = {name: made_ahead(name, args.workers) for name in names}
    capacity = max(ahead.values())
    why = ", ".join(f"{n} {c}" for n, c in ahead.items())
    side = ", +1 for dataloader-uint8's side stream" if "dataloader-uint8" in names else ""
    why = (f"{why}: DataLoader {args.workers} workers x prefetch_factor {DATALOADER_PREFETCH_FACTOR}{side}; stoker "
           f"pinned and device pools of prefetch {STOKER_PREFETCH} + 2 slots each")
    per_epoch = None if files is None else files // args.batch_size
    if per_epoch == 0:
        error(f"{files} images make no batch of --batch-size {args.batch_size} (drop_last)")
    if args.epochs is not None:
        measured = None if per_epoch is None else args.epochs * per_epoch - args.warmup
        flag = f"--epochs {args.epochs} ({per_epoch} batches each, less --warmup {args.warmup})"
    else:
        if args.batches is None:
            args.batches = STEADY_MARGIN * capacity
        measured = args.batches
        flag = f"--batches {args.batches}"
    if measured is not None and measured <= capacity:
        error(f"{flag} measures {measured} batches, not more than the {capacity} a loader can make before the "
              f"clock starts ({why}): its figures would count work done before it started. Give --batches "
              f"{STEADY_MARGIN * capacity} (epochs repeat) or leave --batches and --epochs out, or use fewer --workers")
    if measured is not None and measured < STEADY_MARGIN * capacity:
        print(f"WARNING: {flag} measures {measured} batches, under {STEADY_MARGIN}x the {capacity} a loader can "
              f"make ahead ({why}): batches made before the clock started are a large part of the figures. "
              f"--batches {STEADY_MARGIN * capacity} (the default) measures a steady state.", file=sys.stderr)
    return measured, per_epoch, capacity, why


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
           "--step-ms", str(args.step_ms), "--timing", args.timing, "--model", args.model,
           "--prefetch", str(args.prefetch)]
    cmd += ["--epochs", str(args.epochs)] if args.batches is None else ["--batches", str(args.batches)]
    if step_iters is not None:
        cmd += ["--step-iters", str(step_iters)]
    return cmd


def ratio(a, b):
    return a / b if a is not None and b else None


def fmt_ratio(r):
    return "n/a" if r is None else f"{r:.2f}x"


def main():
    global STOKER_PREFETCH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, help="an ImageFolder (default: a demo set of --images images)")
    ap.add_argument("--images", type=int, default=10240,
                    help="demo images to make under bench-data/gpu-demo when --root is not given")
    ap.add_argument("--preset", default="imagenet-train", choices=["imagenet-train", "imagenet-val"])
    ap.add_argument("--batch-size", type=int, default=256)
    length = ap.add_mutually_exclusive_group()
    length.add_argument("--batches", type=int,
                        help="measured batches per run, after --warmup; the loaders' epochs repeat until they are "
                             f"reached, however few the images (default: {STEADY_MARGIN}x the most batches any "
                             f"contender can make ahead, --workers x {DATALOADER_PREFETCH_FACTOR} (+1) for the "
                             "DataLoader: a steady state). No more than that capacity is refused; under "
                             f"{STEADY_MARGIN}x it, warned about")
    length.add_argument("--epochs", type=int,
                        help="measure whole epochs instead of --batches: N epochs less the warm-up batches, under "
                             "the same check (a small set with many workers is refused)")
    ap.add_argument("--warmup", type=int, default=10, help="batches at the start of a run that are not timed "
                                                           "(default 10)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-ms", type=float, default=20.0, help="GPU work per batch, milliseconds")
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader num_workers (default: cores)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-gpu-results.json")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (needs no GPU)")
    ap.add_argument("--timing", choices=["events", "per-step"], default="events",
                    help="events: no per-step synchronisation, GPU idle gaps from CUDA events (default); "
                         "per-step: synchronise after every step (the older, stricter measure)")
    ap.add_argument("--contenders", default=",".join(CONTENDERS),
                    help=f"comma-separated subset of {', '.join(CONTENDERS)} (default: all)")
    ap.add_argument("--model", choices=["matmul", "resnet18", "resnet50"], default="matmul",
                    help="the training step: --step-ms of bf16 matmuls (default), or a real torchvision model "
                         "(bf16 autocast, channels-last, SGD) measured against its own one-batch ceiling")
    ap.add_argument("--prefetch", type=int, default=STOKER_PREFETCH,
                    help=f"stoker's prefetch (default {STOKER_PREFETCH}; its pools hold prefetch + 2 batches)")
    ap.add_argument("--run", choices=[*CONTENDERS, "calibrate"], help=argparse.SUPPRESS)
    ap.add_argument("--step-iters", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("images", "batch_size", "epochs", "batches", "repeats", "workers", "prefetch"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0 or args.step_ms <= 0:
        ap.error("--warmup must be >= 0 and --step-ms > 0")
    STOKER_PREFETCH = args.prefetch
    names = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown or "stoker" not in names or len(names) < 2:
        ap.error(f"--contenders: stoker and at least one of {', '.join(CONTENDERS[1:])}; unknown: {unknown}")
    if args.run is None and args.root is not None and args.root.is_dir() and not is_image_folder(args.root) \
            and any(n not in STOKER for n in names):
        ap.error(f"--root {args.root} holds no image files (shards?): only {', '.join(STOKER)} read it; "
                 "give --contenders stoker,stoker-gpu")
    if args.run is None and not args.dry_run:
        require_gpu()

    if args.run == "calibrate":
        return calibrate(args)
    if args.run is not None:
        if args.step_iters is None and args.model == "matmul":
            ap.error("--run needs --step-iters")
        return train(args)

    make_demo = args.root is None
    if make_demo:
        args.root = demo_root(args)
    if args.root.is_dir():
        files = count_images(args.root)
    else:
        files = args.images if make_demo else None
    measured, per_epoch, capacity, why = plan_length(args, names, files, ap.error)
    if args.dry_run:
        state = "exists" if args.root.exists() else ("will be made" if make_demo else "MISSING")
        if args.batches is not None:
            length = f"{args.batches} measured batches (epochs repeat)"
        else:
            length = f"{args.epochs} epoch(s): {'?' if measured is None else measured} measured batches"
        epoch = "" if per_epoch is None else f", {per_epoch} batches an epoch"
        print(f"data: {args.root} ({state}{f', {args.images} demo images' if make_demo else ''}"
              f"{'' if files is None or make_demo else f', {files} images'}{epoch})")
        print(f"preset {args.preset}, batch {args.batch_size}, {length} per run after {args.warmup} warm-up "
              f"batches, {args.step_ms:g} ms of GPU work per batch")
        print(f"made ahead at most: {why}; measured batches must exceed {capacity} "
              f"({STEADY_MARGIN}x = {STEADY_MARGIN * capacity} for a steady state)")
        print(f"{args.repeats} rounds of: {', '.join(names)} (DataLoader num_workers={args.workers}, persistent "
              f"workers); timing: {args.timing}; medians")
        print("calibration: " + " ".join(child_cmd(args, "calibrate")))
        for run in names:
            print(f"{run}: " + " ".join(child_cmd(args, run, step_iters="N")))
        print(f"bandwidth reference: stoker doctor --json; results: {args.out}")
        return None

    if make_demo and not args.root.exists():
        import stoker

        print(f"making {args.images} demo images in {args.root}", file=sys.stderr)
        stoker.make_demo(str(args.root), args.images, seed=0)
    if not args.root.is_dir():
        ap.error(f"--root {args.root} is not a directory")
    counted = count_images(args.root)
    if counted != files:  # the demo set was just made: check its real size
        files = counted
        measured, per_epoch, capacity, why = plan_length(args, names, files, ap.error)
    warm_page_cache(args.root)

    pinned_gbps, pageable_gbps = doctor_bandwidth()
    cal_out, _, _, _ = run_measured(child_cmd(args, "calibrate"))
    cal = json.loads(cal_out.strip().splitlines()[-1])
    if args.model == "matmul":
        print(f"{cal['gpu']}: {cal['iters']} bf16 matmuls of {MATMUL_SIZE} ({cal['ms_per_matmul']:.3f} ms each) "
              f"make a {cal['step_ms']:.1f} ms step", file=sys.stderr)
    else:
        print(f"{cal['gpu']}: {args.model} step {cal['step_ms']:.1f} ms on a reused batch: ceiling "
              f"{cal['ceiling_images_per_sec']:.0f} img/s; on 8 distinct batches {cal['fresh_step_ms']:.1f} ms "
              f"({cal['fresh_images_per_sec']:.0f} img/s); on 8 uint8 batches normalised on the GPU each step "
              f"{cal['normalized_step_ms']:.1f} ms ({cal['normalized_images_per_sec']:.0f} img/s)", file=sys.stderr)

    runs = {name: [] for name in names}
    for r in range(args.repeats):
        for name in names:
            out, rss, pss, wall = run_measured(child_cmd(args, name, cal["iters"]))
            rec = json.loads(out.strip().splitlines()[-1])
            rec.update({"peak_rss_tree": rss, "peak_pss_tree": pss, "process_wall": wall})
            if "ceiling_images_per_sec" in cal:
                rec["of_ceiling"] = rec["images_per_sec"] / cal["ceiling_images_per_sec"]
                rec["of_normalized_ceiling"] = rec["images_per_sec"] / cal["normalized_images_per_sec"]
            runs[name].append(rec)
            print(f"run {r + 1} {name:16s} {rec['images_per_sec']:8.1f} img/s  GPU idle {rec['gpu_wait_fraction']:6.1%}"
                  f"  {rec['cpu_s_per_1000']:6.2f} CPU-s/1000  RSS {rss / MiB:7.0f} MiB"
                  f"  GPU data {rec['gpu_data_peak_bytes'] / MiB:6.0f} MiB", file=sys.stderr)
            if "cpu" in rec:  # stoker's own account of the measured steps (its report, reset after warm-up)
                c, share = rec["cpu"], (rec.get("gpu_decode") or {}).get("share")
                print(f"      verdict {rec['bottleneck']}: decode threads {c['workers_busy']:.0%} busy by the CPU "
                      f"clock, process {c['process_cores']:.1f} of {c['allowance']} cores, host "
                      f"{c['host_busy'] if c['host_busy'] is None else format(c['host_busy'], '.0%')} busy; "
                      f"GPU share {share}", file=sys.stderr)

    def med(name, key):
        return statistics.median(x[key] for x in runs[name])

    ceiling = ["of_ceiling", "of_normalized_ceiling"] if "ceiling_images_per_sec" in cal else []
    metrics = ["images_per_sec", *ceiling, "gpu_wait_fraction", "next_seconds", "cpu_s_per_1000", "peak_rss_tree",
               "peak_pss_tree", "gpu_data_peak_bytes", "gpu_torch_peak_bytes", "gpu_stoker_peak_bytes",
               "gpu_used_delta_peak_bytes"]
    summary = {
        "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "gpu": cal["gpu"]},
        "data": str(args.root), "files": files, "preset": args.preset, "batch_size": args.batch_size,
        "epochs": args.epochs, "batches": args.batches, "warmup": args.warmup, "measured_batches": measured,
        "batches_per_epoch": per_epoch, "made_ahead_batches": {name: made_ahead(name, args.workers) for name in names},
        "workers": args.workers, "repeats": args.repeats, "step_ms": args.step_ms, "timing": args.timing,
        "calibration": cal, "doctor_h2d_pinned_gbps": pinned_gbps, "doctor_h2d_pageable_gbps": pageable_gbps,
        "runs": runs,
    }
    for key in metrics:
        values = {name: med(name, key) for name in names}
        summary[key] = {**values, "ratio_to_stoker": {n: ratio(v, values["stoker"]) for n, v in values.items()}}
    summary["paired_ratio_images_per_sec"] = {
        name: statistics.median(a["images_per_sec"] / b["images_per_sec"]
                                for a, b in zip(runs["stoker"], runs[name], strict=True))
        for name in names if name != "stoker"}
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
    idle = "GPU idle fraction (CUDA events)" if args.timing == "events" else "GPU-wait fraction (per-step sync)"
    print(f"\n{files} images, preset {args.preset}, batch {args.batch_size}, {args.step_ms:g} ms GPU step "
          f"({cal['iters']} bf16 matmuls), {cal['gpu']}; stoker threads={threads}, DataLoader num_workers="
          f"{args.workers} (persistent); timing {args.timing}; {measured} measured batches after {args.warmup} "
          f"warm-up ({per_epoch} an epoch; at most {capacity} made ahead); medians of {args.repeats} interleaved "
          "runs\n")
    print("| metric | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")

    def row(label, key, scale=1.0, unit="", digits=1):
        cells = [f"{s[key][n] / scale:.{digits}f}{unit}" for n in names]
        print(f"| {label} | " + " | ".join(cells) + " |")

    row("images/s", "images_per_sec")
    if "of_ceiling" in s:
        row(f"share of the {args.model} ceiling ({cal['ceiling_images_per_sec']:.0f} img/s)", "of_ceiling",
            scale=0.01, unit=" %")
        row(f"share of its ceiling on uint8 batches normalised on the GPU ({cal['normalized_images_per_sec']:.0f} "
            "img/s)", "of_normalized_ceiling", scale=0.01, unit=" %")
    row(idle, "gpu_wait_fraction", scale=0.01, unit=" %")
    row("host time in next(), s", "next_seconds", digits=2)
    row("CPU-s per 1000 images", "cpu_s_per_1000", digits=2)
    row("peak RSS, process tree", "peak_rss_tree", scale=MiB, unit=" MiB", digits=0)
    row("peak PSS, process tree", "peak_pss_tree", scale=MiB, unit=" MiB", digits=0)
    row("peak GPU memory for data (torch allocator + stoker pool)", "gpu_data_peak_bytes", scale=MiB,
        unit=" MiB", digits=0)
    row("peak GPU memory used, device-wide delta (mem_get_info)", "gpu_used_delta_peak_bytes", scale=MiB,
        unit=" MiB", digits=0)
    for name, r in s["paired_ratio_images_per_sec"].items():
        print(f"\npaired images/s ratio stoker / {name}: {r:.2f}x", end="")
    print()
    pinned = "n/a" if pinned_gbps is None else f"{pinned_gbps:.1f} GB/s"
    print(f"stoker H2D copies: {transfer_gbps:.1f} GB/s (report()['transfer']); stoker doctor pinned H2D: {pinned}; "
          f"ratio {fmt_ratio(s['stoker_transfer_vs_pinned'])}")
    print(f"stoker starvation (its own report): {s['stoker_starvation']:.1%}; bottleneck stage per run: "
          f"{', '.join(s['stoker_bottleneck'])}; pinned host memory peak "
          f"{s['stoker_pinned_peak_bytes'] / MiB:.0f} MiB")
    print(f"\nJSON: {args.out}")
    return None


def require_gpu():
    """Exits with status 2 and the reason when there is no GPU to measure on."""
    try:
        import torch
    except ImportError:
        raise SystemExit("gpu_train_step.py: PyTorch is not installed; it needs PyTorch with CUDA and an NVIDIA "
                         "GPU (--dry-run prints the plan without one)") from None
    if not torch.cuda.is_available():
        print(f"gpu_train_step.py: no usable CUDA GPU (PyTorch {torch.__version__}: torch.cuda.is_available() "
              "is False); this benchmark needs an NVIDIA GPU (--dry-run prints the plan without one)",
              file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
