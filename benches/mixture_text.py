#!/usr/bin/env python3
"""What a weighted mixture costs: CPU seconds per token of a three-source ``TokenLoader``
mixture against one ``TokenLoader`` over the same files, steady state, interleaved runs.

- ``one``: ``stoker.TokenLoader([AA, AB, AC], tokenizer=..., seq_len, batch_size, shuffle=True)``:
  the three Wikipedia shards as one source.
- ``mix``: ``stoker.TokenLoader({"aa": (AA, 0.5), "ab": (AB, 0.3), "ac": (AC, 0.2)}, ...,
  epoch_items=...)``: the same files as three sources, row by row (each source a loader of its
  own, its rows copied into the mixture's batch).

Each run is a process of its own: it builds the loader (not timed: the document indexes are
cached on disk by then), iterates, and measures its own CPU time (``RUSAGE_SELF``: every stoker
thread is in the process) and the tokens delivered (``input_ids`` that are not padding) between
batch ``--skip`` and batch ``--skip + --measure``: steady state, after the start-up (the first
windows read, the pipelines filled) and well before the end, so no loader's read-ahead covers
the measured batches and the work done meanwhile is the work for them. Runs alternate (one mix
one mix ...); the ratio mix/one of CPU seconds per token is paired per round, then the median.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TEXT = "/work/shared/text"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def child(kind: str, a: argparse.Namespace) -> None:
    import stoker

    files = [f"{a.text}/wiki-en-2015-{s}.jsonl.zst" for s in ("AA", "AB", "AC")]
    args = dict(tokenizer=f"{a.text}/tokenizer-gpt2.json", seq_len=a.seq_len, batch_size=a.batch_size,
                shuffle=True, seed=1, threads=a.threads, output="numpy")
    if kind == "one":
        loader = stoker.TokenLoader(files, **args)
    else:
        sources = {"aa": (files[0], 0.5), "ab": (files[1], 0.3), "ac": (files[2], 0.2)}
        loader = stoker.TokenLoader(sources, epoch_items=(a.skip + a.measure + 10) * a.batch_size, **args)
    pad = loader.special_ids()["pad"]
    tokens, t0, c0, wall0 = 0, 0.0, 0.0, 0.0
    for k, b in enumerate(loader):
        if k == a.skip:
            c0, wall0 = cpu(), time.perf_counter()
        elif a.skip < k <= a.skip + a.measure:
            ids = b["input_ids"]
            tokens += int(ids.size - (ids == pad).sum()) if pad is not None else int(ids.size)
        if k == a.skip + a.measure:
            t0 = cpu() - c0
            wall = time.perf_counter() - wall0
            break
    print(json.dumps({"kind": kind, "cpu_s": t0, "wall_s": wall, "tokens": tokens,
                      "cpu_s_per_mtok": t0 / tokens * 1e6}))
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", default=TEXT)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip", type=int, default=40)
    p.add_argument("--measure", type=int, default=200)
    p.add_argument("--child", choices=["one", "mix"])
    p.add_argument("--out")
    a = p.parse_args()
    if a.child:
        child(a.child, a)
        return
    runs: dict[str, list[dict[str, float]]] = {"one": [], "mix": []}
    base = [sys.executable, __file__, "--text", a.text, "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
            "--threads", str(a.threads), "--skip", str(a.skip), "--measure", str(a.measure)]
    for kind in ("one", "mix"):  # a first run of each builds the document indexes (not counted)
        subprocess.run(base + ["--child", kind], check=True, capture_output=True)
    for r in range(a.rounds):
        for kind in ("one", "mix"):
            out = subprocess.run(base + ["--child", kind], check=True, capture_output=True, text=True).stdout
            runs[kind].append(json.loads(out.strip().splitlines()[-1]))
            print(f"round {r} {kind}: {runs[kind][-1]}", flush=True)
    ratios = [m["cpu_s_per_mtok"] / o["cpu_s_per_mtok"] for o, m in zip(runs["one"], runs["mix"])]
    result = {
        "command": " ".join(sys.argv),
        "median_cpu_s_per_mtok": {k: statistics.median(x["cpu_s_per_mtok"] for x in v) for k, v in runs.items()},
        "median_tokens_per_wall_s": {k: statistics.median(x["tokens"] / x["wall_s"] for x in v)
                                     for k, v in runs.items()},
        "ratio_mix_over_one": {"median": statistics.median(ratios), "all": ratios},
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
