#!/usr/bin/env python3
"""Side-by-side benchmark: `stoker bench` vs torchvision's ImageFolder + DataLoader.

Both load the same generated ImageFolder (JPEGs with ImageNet's sizes and bytes per pixel,
made by ``benches/make_imagenet_like.py``) with the same preset, one epoch
each, interleaved A B A B ... so machine noise hits both alike; medians are reported, with
ratios. Measured per run:

- images/s over the loading loop (stoker's consumer skips its digest: `--no-digest`, as the
  DataLoader loop hashes nothing either);
- CPU-seconds per 1000 images over the loading loop: stoker's in-process rusage; for the
  DataLoader, rusage of the main process plus its reaped worker processes (workers are not
  persistent, so they are joined when the epoch ends). Interpreter and `import torch` time is
  excluded for the DataLoader, process start-up and indexing is included for stoker;
- peak memory of the whole process tree, sampled every 100 ms: the sum of RSS (what the issue
  asks for) and the sum of PSS (shared pages split between processes, fairer to forked workers);
- each loader's own footprint: that peak PSS minus the peak PSS of a process that only imported
  torch and torchvision and ran the same number of loop iterations (measured in every round).

Also measured: a pure single-thread full-size libjpeg-turbo decode of the same files
(`stoker bench --decode-only`), to compare with stoker's per-thread rate.

`--python` adds a third contender to every round: a plain ``for images, labels in loader`` loop
over ``stoker.ImageLoader(..., output="torch")`` (the installed package), compared with both the
CLI (the cost of the Python API) and the DataLoader.

Usage: python3 benches/compare_torchvision.py [--images 2000] [--repeats 3] [--preset imagenet-train] [--python]
Writes JSON to --out (default bench-results.json) and prints a Markdown table.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tree_pids(pid):
    """pid and all its descendants (Linux /proc)."""
    children = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, stack = [], [pid]
    while stack:
        q = stack.pop()
        out.append(q)
        stack.extend(children.get(q, []))
    return out


def tree_memory(pid):
    rss = pss = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return rss, pss


def run_measured(cmd, env=None):
    """Runs cmd, sampling the tree's memory; returns (stdout, peak_rss, peak_pss, wall)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = [0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            rss, pss = tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            done.wait(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {err}")
    return out, peak[0], peak[1], wall


def torch_runner(args):
    """Child mode: one epoch of torchvision's DataLoader; prints a JSON line."""
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    if args.v2:
        # The fastest stock recipe: libjpeg-turbo through torchvision.io.decode_jpeg on uint8
        # tensors, v2 transforms, float conversion last.
        import torchvision.transforms.v2 as T2
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        geo = [T2.RandomResizedCrop(224, antialias=True), T2.RandomHorizontalFlip()] \
            if args.preset == "imagenet-train" else [T2.Resize(256, antialias=True), T2.CenterCrop(224)]
        tf = T2.Compose([*geo, T2.ToDtype(torch.float32, scale=True), T2.Normalize(mean, std)])
        ds = ImageFolder(args.data, transform=tf,
                         loader=lambda p: decode_jpeg(read_file(p), mode=ImageReadMode.RGB))
    else:
        norm = T.Normalize(mean, std)
        if args.preset == "imagenet-train":
            tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), norm])
        else:
            tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), norm])
        ds = ImageFolder(args.data, transform=tf)
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                         drop_last=True)

    def cpu():
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    n = 0
    it = iter(loader)
    for images, _labels in it:
        n += images.shape[0]
    del it  # joins the workers, so their CPU time is accounted to us
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": n, "seconds": seconds, "cpu_seconds": cpu() - c0}))


def baseline_runner(args):
    """Child mode: what a training script costs without a loader: import torch and torchvision,
    run the loop's iterations with nothing to load. Its peak PSS is subtracted from the others'
    to give each loader's own footprint."""
    import torch
    import torchvision  # noqa: F401

    files = sum(1 for _ in args.data.rglob("*.jpg"))
    t0 = time.perf_counter()
    x = torch.zeros(1)
    for _ in range(files // args.batch_size):
        x += 1
    print(json.dumps({"images": 0, "seconds": time.perf_counter() - t0, "cpu_seconds": 0.0}))


def stoker_python_runner(args):
    """Child mode: one epoch through the Python API; prints a JSON line. torch is imported
    before the clock starts, as a training script has (the loader imports it on first use)."""
    import stoker
    import torch  # noqa: F401

    loader = stoker.ImageLoader(str(args.data), batch_size=args.batch_size, preset=args.preset, shuffle=True,
                                drop_last=True, output="torch")

    def cpu():
        s = resource.getrusage(resource.RUSAGE_SELF)
        return s.ru_utime + s.ru_stime

    c0, t0 = cpu(), time.perf_counter()
    n = 0
    for _images, labels in loader:
        n += labels.shape[0]
    seconds = time.perf_counter() - t0
    print(json.dumps({"images": n, "seconds": seconds, "cpu_seconds": cpu() - c0, "threads": loader.threads}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "imagenet-like-v2")
    ap.add_argument("--images", type=int, default=2000,
                    help="images to generate (benches/make_imagenet_like.py) if --data does not exist")
    ap.add_argument("--preset", default="imagenet-train", choices=["imagenet-train", "imagenet-val"])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader num_workers (default: cores)")
    ap.add_argument("--threads", type=int, default=None,
                    help="stoker's worker threads (default: its own choice, one per core of its CPU budget); "
                         "with --workers N the same N, for a scaling series")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stoker", type=Path, default=ROOT / "target" / "release" / "stoker")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results.json")
    ap.add_argument("--python", action="store_true", help="also time the Python API (stoker.ImageLoader)")
    ap.add_argument("--v2", action="store_true",
                    help="also time the DataLoader with torchvision.io.decode_jpeg and v2 transforms")
    ap.add_argument("--shards", action="append", default=[], metavar="NAME=DIR",
                    help="also run `stoker bench` over DIR, shards of the same images made by `stoker pack` "
                         "(e.g. plain=... and random-access=... with --random-access); repeatable")
    ap.add_argument("--torch-runner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--python-runner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--baseline-runner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_runner:
        return baseline_runner(args)
    if args.torch_runner:
        return torch_runner(args)
    if args.python_runner:
        return stoker_python_runner(args)

    if not args.data.exists():
        subprocess.run([sys.executable, str(ROOT / "benches" / "make_imagenet_like.py"), "--out", str(args.data),
                        "--images", str(args.images), "--check"], check=True)
    files = sum(1 for _ in args.data.rglob("*.jpg"))
    stoker_cmd = [str(args.stoker), "bench", str(args.data), "--preset", args.preset, "--batch-size",
                  str(args.batch_size), "--json", "--no-digest"]
    if args.threads is not None:
        stoker_cmd += ["--threads", str(args.threads)]
    torch_cmd = [sys.executable, __file__, "--torch-runner", "--data", str(args.data), "--preset", args.preset,
                 "--batch-size", str(args.batch_size), "--workers", str(args.workers)]

    python_cmd = [sys.executable, __file__, "--python-runner", "--data", str(args.data), "--preset", args.preset,
                  "--batch-size", str(args.batch_size)]
    contenders = [("stoker", stoker_cmd), ("torchvision", torch_cmd)]
    cli = {"stoker"}
    for spec in args.shards:
        name, _, shard_dir = spec.partition("=")
        if not name or not Path(shard_dir).is_dir():
            sys.exit(f"--shards wants NAME=DIR with an existing DIR, got {spec!r}")
        cli.add(f"stoker-{name}")
        contenders.insert(len(cli) - 1, (f"stoker-{name}", [str(args.stoker), "bench", shard_dir, *stoker_cmd[3:]]))
    if args.v2:
        contenders.append(("torchvision-v2", [*torch_cmd, "--v2"]))
    if args.python:
        contenders.insert(1, ("stoker-python", python_cmd))
    baseline_cmd = [sys.executable, __file__, "--baseline-runner", "--data", str(args.data), "--batch-size",
                    str(args.batch_size)]
    runs = {name: [] for name, _ in contenders}
    baseline_pss = []
    # Warm the page cache (and the imports) once for each, not counted.
    for _, cmd in contenders:
        run_measured(cmd)
    for r in range(args.repeats):
        baseline_pss.append(run_measured(baseline_cmd)[2])
        for name, cmd in contenders:
            out, rss, pss, wall = run_measured(cmd)
            j = json.loads(out) if name in cli else json.loads(out.strip().splitlines()[-1])
            rec = {"images": j["images"], "seconds": j["seconds"], "cpu_seconds": j["cpu_seconds"],
                   "peak_rss_tree": rss, "peak_pss_tree": pss, "process_wall": wall}
            if "threads" in j:
                rec["threads"] = j["threads"]
            rec["images_per_sec"] = rec["images"] / rec["seconds"]
            rec["cpu_s_per_1000"] = rec["cpu_seconds"] / rec["images"] * 1000
            runs[name].append(rec)
            print(f"run {r + 1} {name:12s} {rec['images_per_sec']:8.1f} img/s  {rec['cpu_s_per_1000']:6.2f} CPU-s/1000"
                  f"  RSS {rss / 2**20:7.1f} MiB  PSS {pss / 2**20:7.1f} MiB", file=sys.stderr)

    dec_out, _, _, _ = run_measured([str(args.stoker), "bench", str(args.data), "--decode-only", "--json"])
    decode = json.loads(dec_out)

    def med(name, key):
        return statistics.median(x[key] for x in runs[name])

    summary = {
        "machine": {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0))},
        "data": str(args.data), "files": files, "preset": args.preset, "batch_size": args.batch_size,
        "workers": args.workers, "repeats": args.repeats, "runs": runs, "pure_decode": decode,
    }
    for key in ["images_per_sec", "cpu_s_per_1000", "peak_rss_tree", "peak_pss_tree"]:
        a, b = med("stoker", key), med("torchvision", key)
        summary[key] = {"stoker": a, "torchvision": b, "ratio": a / b}
    # Ratios pair by pair (A/B of the same round), then their median.
    pairs = list(zip(runs["stoker"], runs["torchvision"], strict=True))
    summary["paired_ratio_images_per_cpu_second"] = statistics.median(
        (1000 / a["cpu_s_per_1000"]) / (1000 / b["cpu_s_per_1000"]) for a, b in pairs)
    summary["paired_ratio_rss"] = statistics.median(a["peak_rss_tree"] / b["peak_rss_tree"] for a, b in pairs)
    threads = runs["stoker"][0]["threads"]
    per_thread = med("stoker", "images_per_sec") / threads
    summary["stoker_per_thread_images_per_sec"] = per_thread
    # Each loader's own memory: its tree's peak PSS minus that of a process that only imported
    # torch and torchvision and ran the loop (the CLI imports neither: its whole PSS is its own).
    base = statistics.median(baseline_pss)
    summary["baseline_pss_torch_only"] = base
    summary["footprint_pss"] = {"stoker": med("stoker", "peak_pss_tree"),
                                "torchvision": med("torchvision", "peak_pss_tree") - base}
    if args.python:
        summary["footprint_pss"]["stoker-python"] = med("stoker-python", "peak_pss_tree") - base
    summary["pure_decode_images_per_sec"] = decode["images_per_sec"]
    summary["per_thread_vs_pure_decode"] = per_thread / decode["images_per_sec"]
    # The same comparison per CPU-second, which a busy machine disturbs far less than wall time.
    summary["per_cpu_second_vs_pure_decode"] = (1000 / med("stoker", "cpu_s_per_1000")) / (
        decode["images"] / decode["cpu_seconds_including_reads"])
    args.out.write_text(json.dumps(summary, indent=2))

    print(f"\n{files} JPEGs, preset {args.preset}, batch {args.batch_size}, DataLoader num_workers={args.workers},"
          f" stoker threads={threads}; medians of {args.repeats} interleaved runs\n")
    print("| metric | stoker | torchvision DataLoader | stoker / DataLoader |")
    print("|---|---|---|---|")
    s = summary
    print(f"| images/s | {s['images_per_sec']['stoker']:.1f} | {s['images_per_sec']['torchvision']:.1f} |"
          f" {s['images_per_sec']['ratio']:.2f}x |")
    print(f"| CPU-s per 1000 images | {s['cpu_s_per_1000']['stoker']:.2f} | {s['cpu_s_per_1000']['torchvision']:.2f} |"
          f" {s['cpu_s_per_1000']['ratio']:.2f}x (images per CPU-s: "
          f"{s['paired_ratio_images_per_cpu_second']:.2f}x, paired) |")
    print(f"| peak RSS, process tree | {s['peak_rss_tree']['stoker'] / 2**20:.0f} MiB |"
          f" {s['peak_rss_tree']['torchvision'] / 2**20:.0f} MiB | {s['peak_rss_tree']['ratio']:.2f}x |")
    print(f"| peak PSS, process tree | {s['peak_pss_tree']['stoker'] / 2**20:.0f} MiB |"
          f" {s['peak_pss_tree']['torchvision'] / 2**20:.0f} MiB | {s['peak_pss_tree']['ratio']:.2f}x |")
    fp = summary["footprint_pss"]
    print(f"| loader's own footprint (PSS minus torch-only, {base / 2**20:.0f} MiB) | {fp['stoker'] / 2**20:.0f} MiB "
          f"(CLI, no torch) | {fp['torchvision'] / 2**20:.0f} MiB | {fp['stoker'] / fp['torchvision']:.2f}x |")
    if args.python:
        print(f"| Python API: loader's own footprint | {fp['stoker-python'] / 2**20:.0f} MiB | | "
              f"{fp['stoker-python'] / fp['torchvision']:.2f}x vs DataLoader |")
        for key in ["images_per_sec", "cpu_s_per_1000", "peak_rss_tree", "peak_pss_tree"]:
            summary[key]["stoker-python"] = med("stoker-python", key)
        py_vs_cli = [p["images_per_sec"] / c["images_per_sec"] for p, c in zip(runs["stoker-python"], runs["stoker"],
                                                                              strict=True)]
        py_vs_tv = [p["images_per_sec"] / t["images_per_sec"] for p, t in
                    zip(runs["stoker-python"], runs["torchvision"], strict=True)]
        py_cpu_vs_tv = [t["cpu_s_per_1000"] / p["cpu_s_per_1000"] for p, t in
                        zip(runs["stoker-python"], runs["torchvision"], strict=True)]
        summary["python_vs_cli_images_per_sec"] = statistics.median(py_vs_cli)
        summary["python_vs_dataloader_images_per_sec"] = statistics.median(py_vs_tv)
        summary["python_vs_dataloader_images_per_cpu_second"] = statistics.median(py_cpu_vs_tv)
        summary["python_vs_dataloader_rss"] = med("stoker-python", "peak_rss_tree") / med("torchvision",
                                                                                         "peak_rss_tree")
        print(f"| Python API: images/s | {s['images_per_sec']['stoker-python']:.1f} | | "
              f"{summary['python_vs_dataloader_images_per_sec']:.2f}x vs DataLoader, "
              f"{summary['python_vs_cli_images_per_sec']:.3f}x vs CLI (paired) |")
        print(f"| Python API: CPU-s per 1000 images | {s['cpu_s_per_1000']['stoker-python']:.2f} | | "
              f"{summary['python_vs_dataloader_images_per_cpu_second']:.2f}x images per CPU-s vs DataLoader |")
        print(f"| Python API: peak RSS, process tree | {s['peak_rss_tree']['stoker-python'] / 2**20:.0f} MiB | | "
              f"{summary['python_vs_dataloader_rss']:.2f}x vs DataLoader |")
        args.out.write_text(json.dumps(summary, indent=2))
    for name in sorted(cli - {"stoker"}):
        per_cpu = [(b["cpu_s_per_1000"] / a["cpu_s_per_1000"], c["cpu_s_per_1000"] / a["cpu_s_per_1000"])
                   for a, b, c in zip(runs[name], runs["torchvision"], runs["stoker"], strict=True)]
        summary.setdefault("shards", {})[name] = {
            "cpu_s_per_1000": med(name, "cpu_s_per_1000"), "images_per_sec": med(name, "images_per_sec"),
            "peak_rss_tree": med(name, "peak_rss_tree"),
            "images_per_cpu_second_vs_dataloader": statistics.median(x for x, _ in per_cpu),
            "images_per_cpu_second_vs_stoker_folder": statistics.median(y for _, y in per_cpu)}
        t = summary["shards"][name]
        print(f"| {name} (shards) | {t['cpu_s_per_1000']:.2f} CPU-s/1000, {t['images_per_sec']:.1f} img/s | | "
              f"{t['images_per_cpu_second_vs_dataloader']:.2f}x images per CPU-s vs DataLoader, "
              f"{t['images_per_cpu_second_vs_stoker_folder']:.2f}x vs stoker on the folder (paired) |")
        args.out.write_text(json.dumps(summary, indent=2))
    if args.v2:
        v2 = runs["torchvision-v2"]
        adv = statistics.median(b["cpu_s_per_1000"] / a["cpu_s_per_1000"] for a, b in zip(runs["stoker"], v2,
                                                                                           strict=True))
        summary["torchvision_v2"] = {"cpu_s_per_1000": med("torchvision-v2", "cpu_s_per_1000"),
                                     "images_per_sec": med("torchvision-v2", "images_per_sec"),
                                     "peak_pss_tree": med("torchvision-v2", "peak_pss_tree"),
                                     "stoker_images_per_cpu_second_ratio": adv}
        t = summary["torchvision_v2"]
        print(f"| DataLoader, decode_jpeg + v2 transforms | {t['cpu_s_per_1000']:.2f} CPU-s/1000, "
              f"{t['images_per_sec']:.1f} img/s | | stoker: {adv:.2f}x images per CPU-s (paired) |")
        args.out.write_text(json.dumps(summary, indent=2))
    print(f"\nstoker per-thread rate {per_thread:.1f} img/s vs pure full-size libjpeg-turbo decode "
          f"{decode['images_per_sec']:.1f} img/s (1 thread): {summary['per_thread_vs_pure_decode']:.2f}x; "
          f"per CPU-second: {summary['per_cpu_second_vs_pure_decode']:.2f}x")


if __name__ == "__main__":
    main()
