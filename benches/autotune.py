"""Autotuning and the shared CPU budget, measured with `stoker bench` (writes JSON).

(a) With a simulated training step (`--consumer-ms`), every fixed threads x prefetch setting and
    the autotuned loader (`--threads auto --prefetch auto`), interleaved in rounds (A B C ... A B
    C ...); medians; the autotuned throughput over the best fixed one, and CPU-s per 1000 images.
(b) Two concurrent `stoker bench` runs, with the host-wide budget (a fresh registry file) and
    without it (`STOKER_SHARED_BUDGET=0`), interleaved: total throughput and each one's share.

    python benches/autotune.py --stoker target/release/stoker \\
        --data bench-data/imagenet-like-v2 --rounds 3 --out benches/results/autotune.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def bench(stoker: str, data: str, args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    cmd = [stoker, "bench", data, "--json", "--no-digest", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def result(p: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"stoker bench failed ({p.returncode}): {err.strip()[-2000:]}")
    r: dict[str, Any] = json.loads(out)
    return r


def summary(r: dict[str, Any]) -> dict[str, Any]:
    t = r.get("tuning") or {}
    return {
        "images_per_sec": r["images_per_sec"],
        "cpu_seconds_per_1000": r["cpu_seconds_per_1000"],
        "starvation": r["starvation"],
        "threads_active": t.get("threads_active"),
        "threads_max": t.get("threads_max"),
        "prefetch_active": t.get("prefetch_active"),
        "share": t.get("share"),
        "processes_sharing": t.get("processes_sharing"),
        "share_min": t.get("share_min"),
        "processes_sharing_max": t.get("processes_sharing_max"),
        "decisions": t.get("decisions"),
    }


def part_a(a: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "STOKER_SHARED_BUDGET": "0"}
    common = ["--batch-size", str(a.batch_size), "--consumer-ms", str(a.consumer_ms)]
    configs: dict[str, list[str]] = {}
    for t in (1, 2):
        for p in (1, 2, 4):
            configs[f"threads={t},prefetch={p}"] = ["--threads", str(t), "--prefetch", str(p)]
    configs["auto"] = ["--threads", "auto", "--prefetch", "auto"]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in configs}
    for r in range(a.rounds):
        for name, extra in configs.items():
            s = summary(result(bench(a.stoker, a.data, common + extra, env)))
            runs[name].append(s)
            print(f"round {r + 1} {name}: {s['images_per_sec']:.1f} images/s, threads {s['threads_active']}")
    med = {
        k: {
            "images_per_sec": statistics.median(x["images_per_sec"] for x in v),
            "cpu_seconds_per_1000": statistics.median(x["cpu_seconds_per_1000"] for x in v),
        }
        for k, v in runs.items()
    }
    best = max((k for k in med if k != "auto"), key=lambda k: med[k]["images_per_sec"])
    return {
        "consumer_ms": a.consumer_ms,
        "batch_size": a.batch_size,
        "runs": runs,
        "medians": med,
        "best_fixed": best,
        "auto_over_best_fixed": med["auto"]["images_per_sec"] / med[best]["images_per_sec"],
        "auto_cpu_per_1000_over_best_fixed": (
            med["auto"]["cpu_seconds_per_1000"] / med[best]["cpu_seconds_per_1000"]
        ),
    }


def part_b(a: argparse.Namespace) -> dict[str, Any]:
    common = ["--batch-size", str(a.batch_size), "--threads", "auto"]
    if a.pair_consumer_ms:
        common += ["--consumer-ms", str(a.pair_consumer_ms)]
    rounds: dict[str, list[dict[str, Any]]] = {"shared": [], "unshared": []}
    for r in range(a.rounds):
        for mode in ("shared", "unshared"):
            with tempfile.TemporaryDirectory() as d:
                env = dict(os.environ)
                if mode == "shared":
                    env["STOKER_SHARED_BUDGET"] = "1"
                    env["STOKER_BUDGET_FILE"] = str(Path(d) / "budget")
                else:
                    env["STOKER_SHARED_BUDGET"] = "0"
                t0 = time.perf_counter()
                procs = [bench(a.stoker, a.data, common, env) for _ in range(2)]
                each = [summary(result(p)) for p in procs]
                wall = time.perf_counter() - t0
            total = sum(x["images_per_sec"] for x in each)
            rounds[mode].append({"each": each, "total_images_per_sec": total, "wall_seconds": wall})
            shares = [x["share_min"] for x in each]
            print(f"round {r + 1} {mode}: total {total:.1f} images/s, each "
                  f"{[round(x['images_per_sec'], 1) for x in each]}, threads "
                  f"{[x['threads_active'] for x in each]}, smallest shares {shares}")
    return {
        "rounds": rounds,
        "median_total_images_per_sec": {
            k: statistics.median(x["total_images_per_sec"] for x in v) for k, v in rounds.items()
        },
        "median_cpu_seconds_per_1000": {
            k: statistics.median(y["cpu_seconds_per_1000"] for x in v for y in x["each"]) for k, v in rounds.items()
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stoker", default="target/release/stoker")
    ap.add_argument("--data", default="bench-data/imagenet-like-v2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--consumer-ms", type=float, default=150.0,
                    help="the simulated step of part (a): one decode thread must not keep up")
    ap.add_argument("--pair-consumer-ms", type=float, default=0.0,
                    help="the simulated step of the two concurrent runs of part (b) (0: as fast as possible)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--part", choices=("a", "b", "both"), default="both")
    ap.add_argument("--out", default="benches/results/autotune.json")
    a = ap.parse_args()
    out: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "loadavg_at_start": os.getloadavg()},
        "data": a.data,
    }
    if a.part in ("a", "both"):
        out["a"] = part_a(a)
        print(f"(a) auto / best fixed ({out['a']['best_fixed']}): {out['a']['auto_over_best_fixed']:.3f}")
    if a.part in ("b", "both"):
        out["b"] = part_b(a)
        print(f"(b) median totals: {out['b']['median_total_images_per_sec']}")
    out["machine"]["loadavg_at_end"] = os.getloadavg()
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
