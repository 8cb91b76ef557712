#!/usr/bin/env python3
"""ArrayLoader vs TensorDataset + DataLoader on a memory-mapped float32 array.

Data: ``bench-data/arrays/x.npy`` (1,000,000 x 256 float32, 1 GiB) and ``y.npy`` (int64 labels),
created on first use. Both loaders read the same memory-mapped files (warm page cache), shuffle,
batch 256, and hand torch tensors to a loop that only counts rows. Each run loads ``--batches``
batches; runs are interleaved A B A B and medians reported. Measured: batches/s, CPU-seconds per
1000 batches (the process plus its reaped workers), peak RSS of the process tree.

    python3 benches/compare_arrays.py [--rows 1000000] [--cols 256] [--batches 400] [--repeats 3]
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_torchvision import run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def runner(args):
    import warnings

    import numpy as np
    import torch

    x_path, y_path = args.data / "x.npy", args.data / "y.npy"
    if args.runner == "stoker":
        import stoker

        loader = stoker.ArrayLoader(x_path, y_path, batch_size=256, shuffle=True, output="torch")
    else:
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        x = torch.from_numpy(np.load(x_path, mmap_mode="r"))
        y = torch.from_numpy(np.load(y_path, mmap_mode="r"))
        ds = torch.utils.data.TensorDataset(x, y)
        loader = torch.utils.data.DataLoader(ds, batch_size=256, shuffle=True, num_workers=args.workers)
    c0, t0 = cpu(), time.perf_counter()
    it = iter(loader)
    rows = 0
    for _ in range(args.batches):
        xb, yb = next(it)
        rows += xb.shape[0]
    del it
    seconds = time.perf_counter() - t0
    print(json.dumps({"batches": args.batches, "rows": rows, "seconds": seconds, "cpu_seconds": cpu() - c0}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "arrays")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cols", type=int, default=256)
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path, default=ROOT / "bench-arrays.json")
    ap.add_argument("--runner", choices=["stoker", "torch"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.runner:
        return runner(args)
    import numpy as np

    args.data.mkdir(parents=True, exist_ok=True)
    if not (args.data / "x.npy").exists():
        x = np.lib.format.open_memmap(args.data / "x.npy", mode="w+", dtype=np.float32, shape=(args.rows, args.cols))
        rng = np.random.default_rng(0)
        for s in range(0, args.rows, 100_000):
            x[s:s + 100_000] = rng.standard_normal((min(100_000, args.rows - s), args.cols), dtype=np.float32)
        x.flush()
        del x
        np.save(args.data / "y.npy", rng.integers(0, 1000, args.rows))
    base = [sys.executable, __file__, "--data", str(args.data), "--batches", str(args.batches), "--workers",
            str(args.workers)]
    cmds = {"stoker": base + ["--runner", "stoker"], "torch": base + ["--runner", "torch"]}
    runs = {k: [] for k in cmds}
    for cmd in cmds.values():
        run_measured(cmd)  # warm the page cache and imports
    for r in range(args.repeats):
        for name, cmd in cmds.items():
            out, rss, pss, _ = run_measured(cmd)
            j = json.loads(out.strip().splitlines()[-1])
            rec = {"batches_per_sec": j["batches"] / j["seconds"], "cpu_s_per_1000_batches": j["cpu_seconds"] /
                   j["batches"] * 1000, "peak_rss_tree": rss, "peak_pss_tree": pss}
            runs[name].append(rec)
            print(f"run {r + 1} {name:7s} {rec['batches_per_sec']:9.1f} batches/s "
                  f"{rec['cpu_s_per_1000_batches']:7.2f} CPU-s/1000 batches  RSS {rss / 2**20:7.1f} MiB",
                  file=sys.stderr)
    pairs = list(zip(runs["stoker"], runs["torch"], strict=True))
    summary = {
        "rows": args.rows, "cols": args.cols, "batches": args.batches, "workers": args.workers, "runs": runs,
        "batches_per_sec_ratio": statistics.median(a["batches_per_sec"] / b["batches_per_sec"] for a, b in pairs),
        "cpu_ratio": statistics.median(b["cpu_s_per_1000_batches"] / a["cpu_s_per_1000_batches"] for a, b in pairs),
        "rss_ratio": statistics.median(a["peak_rss_tree"] / b["peak_rss_tree"] for a, b in pairs),
    }
    args.out.write_text(json.dumps(summary, indent=2))

    def med(name, key):
        return statistics.median(x[key] for x in runs[name])

    print(f"\n{args.rows} x {args.cols} float32 (memory-mapped), batch 256, shuffle, {args.batches} batches per run, "
          f"DataLoader num_workers={args.workers}; medians of {args.repeats} interleaved runs\n")
    print("| metric | stoker ArrayLoader | TensorDataset + DataLoader | ratio |")
    print("|---|---|---|---|")
    print(f"| batches/s | {med('stoker', 'batches_per_sec'):.1f} | {med('torch', 'batches_per_sec'):.1f} | "
          f"{summary['batches_per_sec_ratio']:.1f}x |")
    print(f"| CPU-s per 1000 batches | {med('stoker', 'cpu_s_per_1000_batches'):.2f} | "
          f"{med('torch', 'cpu_s_per_1000_batches'):.2f} | {summary['cpu_ratio']:.1f}x less CPU |")
    print(f"| peak RSS, process tree | {med('stoker', 'peak_rss_tree') / 2**20:.0f} MiB | "
          f"{med('torch', 'peak_rss_tree') / 2**20:.0f} MiB | {summary['rss_ratio']:.2f}x |")


if __name__ == "__main__":
    main()
