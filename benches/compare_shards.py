#!/usr/bin/env python3
"""Shards vs ImageFolder, and `--max-side 512` shards vs originals, with `stoker bench`.

Packs the benchmark ImageFolder (``bench-data/imagenet-like-v2``, made by
``benches/make_imagenet_like.py``, ImageNet's sizes and bytes per pixel) into shards twice (as is, and with
``--max-side 512``), then runs ``stoker bench --json --no-digest`` on the three sources
interleaved, ``--repeats`` rounds, and prints medians and paired ratios.

    python3 benches/compare_shards.py [--preset imagenet-train] [--repeats 3]
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_torchvision import run_measured  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "bench-data" / "imagenet-like-v2")
    ap.add_argument("--preset", default="imagenet-train")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stoker", type=Path, default=ROOT / "target" / "release" / "stoker")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-shards.json")
    args = ap.parse_args()
    if not args.data.exists():
        subprocess.run([sys.executable, str(ROOT / "benches" / "make_imagenet_like.py"), "--out", str(args.data),
                        "--check"], check=True)
    shards = args.data.parent / f"{args.data.name}-shards"
    small = args.data.parent / f"{args.data.name}-shards-max512"
    for dst, extra in ((shards, []), (small, ["--max-side", "512"])):
        if not dst.exists():
            subprocess.run([str(args.stoker), "pack", str(args.data), str(dst), *extra], check=True)
    sources = {"folder": str(args.data), "shards": str(shards / "shard-*.tar"),
               "shards --max-side 512": str(small / "shard-*.tar")}
    runs = {k: [] for k in sources}
    cmd = {k: [str(args.stoker), "bench", v, "--preset", args.preset, "--json", "--no-digest"]
           for k, v in sources.items()}
    for c in cmd.values():
        run_measured(c)
    for _ in range(args.repeats):
        for k, c in cmd.items():
            out, rss, _, _ = run_measured(c)
            j = json.loads(out)
            runs[k].append({"images_per_sec": j["images_per_sec"], "cpu_s_per_1000": j["cpu_seconds_per_1000"],
                            "peak_rss": rss})

    def med(k, key):
        return statistics.median(r[key] for r in runs[k])

    def ratio(a, b, key):
        return statistics.median(x[key] / y[key] for x, y in zip(runs[a], runs[b], strict=True))

    args.out.write_text(json.dumps(runs, indent=2))
    sizes = {k: sum(p.stat().st_size for p in Path(v).parent.glob(Path(v).name)) if k != "folder"
             else sum(p.stat().st_size for p in args.data.rglob("*.jpg")) for k, v in sources.items()}
    print(f"preset {args.preset}, medians of {args.repeats} interleaved runs\n")
    print("| source | bytes | images/s | CPU-s per 1000 | vs folder (images/s, paired) |")
    print("|---|---|---|---|---|")
    for k in sources:
        print(f"| {k} | {sizes[k] / 2**20:.0f} MiB | {med(k, 'images_per_sec'):.0f} | {med(k, 'cpu_s_per_1000'):.2f} | "
              f"{ratio(k, 'folder', 'images_per_sec'):.2f}x |")


if __name__ == "__main__":
    main()
