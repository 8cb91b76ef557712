#!/usr/bin/env python3
"""Preparing data on a Ray cluster: stoker's tokenizer inside Ray Data, and `stoker.ray.pack`.

Both on a local Ray cluster of ``--nodes`` nodes of one CPU each (``ray.cluster_utils.Cluster``,
100 MB object stores, no dashboard), started once for all runs.

``tokenize``: tokens per CPU-second of the tokenizing step of the usual Ray Data pipeline,
``ds.map_batches(Class, batch_format="pyarrow", concurrency=--nodes)`` with one tokenizer per
worker, over the same dataset (the ``text`` column of ``--data``, read once into the object
store and materialised before the runs, so reading and JSON parsing are in no run):

- ``stoker``: ``stoker.Tokenizer(--tokenizer)``, ``encode_batch(texts, threads=1, format="arrow")``;
- ``tokenizers``: HuggingFace ``tokenizers.Tokenizer.from_file(--tokenizer)``,
  ``encode_batch(texts, add_special_tokens=False)``, the ids into a ``pyarrow`` list array (its
  own threads: its default, as users run it);
- ``tokenizers-1t``: the same with ``RAYON_NUM_THREADS=1`` and ``TOKENIZERS_PARALLELISM=false``
  in its workers (``runtime_env``): one thread per worker, its best per CPU-second.

Each worker measures its own process's CPU time (``time.process_time``: every thread of the
process) around the encode call (``encode``) and around the whole ``__call__`` (``udf``: the
Arrow column to Python strings, the encode, the ids back to Arrow), and counts the tokens; the
driver sums them over the batches of a run. Runs alternate (stoker, tokenizers, stoker, ...);
the ratio of tokens per CPU-second is paired per round, then the median.

``pack``: ``stoker.ray.pack(DIR, --random-access)`` on the cluster against ``stoker pack DIR
--random-access --threads N`` on this machine (N = the nodes' CPUs), on the demo dataset
(``stoker.make_demo``, ``--images`` JPEGs from the embedded public-domain photos); wall seconds,
interleaved, medians; and, at the measured rate per core (input bytes per core-second), the
core-hours for ImageNet-21k (14.2 M images, ~1.3 TB) and LAION-400M (~10 TB of JPEGs at 256 px).

``python3 benches/ray_tokenize.py --rounds 3 --out benches/results/ray-tokenize.json``
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
import time
from typing import Any

TEXT = "/work/shared/text"


class StokerEncode:
    def __init__(self, path: str) -> None:
        import stoker

        self.tok = stoker.Tokenizer(path)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        c0 = time.process_time()
        texts = batch.column("text").to_pylist()
        c1 = time.process_time()
        ids = self.tok.encode_batch(texts, threads=1, format="arrow")
        c2 = time.process_time()
        n = len(ids.values)
        out = pa.table({"ids": ids})
        c3 = time.process_time()
        del out
        return pa.table({"tokens": [n], "encode": [c2 - c1], "udf": [c3 - c0], "docs": [len(texts)]})


class HFEncode:
    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(path)

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        c0 = time.process_time()
        texts = batch.column("text").to_pylist()
        c1 = time.process_time()
        enc = self.tok.encode_batch(texts, add_special_tokens=False)
        c2 = time.process_time()
        lists = [e.ids for e in enc]
        offsets = np.zeros(len(lists) + 1, np.int64)
        np.cumsum([len(x) for x in lists], out=offsets[1:])
        flat = np.fromiter((i for x in lists for i in x), np.uint32, int(offsets[-1]))
        ids = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat))
        out = pa.table({"ids": ids})
        c3 = time.process_time()
        del out
        return pa.table({"tokens": [int(offsets[-1])], "encode": [c2 - c1], "udf": [c3 - c0], "docs": [len(texts)]})


def texts_of(path: str, limit: int) -> list[str]:
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb")).read()
    texts = [json.loads(line)["text"] for line in raw.split(b"\n") if line.strip()]
    return texts[:limit] if limit else texts


#: The contenders: the class, and the environment of its workers.
CONTENDERS: dict[str, tuple[Any, dict[str, str]]] = {
    "stoker": (StokerEncode, {}),
    "tokenizers": (HFEncode, {}),
    "tokenizers-1t": (HFEncode, {"RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}),
}


def tokenize_round(ray: Any, ds: Any, kind: str, tokenizer: str, nodes: int, batch: int) -> dict[str, float]:
    cls, env = CONTENDERS[kind]
    t0 = time.monotonic()
    out = ds.map_batches(cls, fn_constructor_args=(tokenizer,), batch_format="pyarrow", batch_size=batch,
                         compute=ray.data.ActorPoolStrategy(size=nodes), num_cpus=1,
                         runtime_env={"env_vars": env} if env else None).take_all()
    wall = time.monotonic() - t0
    tokens = sum(r["tokens"] for r in out)
    enc = sum(r["encode"] for r in out)
    udf = sum(r["udf"] for r in out)
    return {"tokens": tokens, "encode_cpu_s": enc, "udf_cpu_s": udf, "wall_s": wall,
            "tokens_per_encode_cpu_s": tokens / enc, "tokens_per_udf_cpu_s": tokens / udf,
            "docs": sum(r["docs"] for r in out)}


def pack_round(kind: str, data: str, out: str, nodes: int, files_per_task: int) -> float:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.monotonic()
    if kind == "ray":
        import stoker.ray

        stoker.ray.pack(data, out, random_access=True, files_per_task=files_per_task, progress=False)
    else:
        subprocess.run([sys.executable, "-m", "stoker.cli", "pack", data, out, "--random-access", "--threads",
                        str(nodes), "--json"], check=True, capture_output=True)
    return time.monotonic() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=f"{TEXT}/wiki-en-2015-AA.jsonl.zst")
    p.add_argument("--tokenizer", default=f"{TEXT}/tokenizer-gpt2.json")
    p.add_argument("--docs", type=int, default=0, help="the first N documents (0: all)")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=1000, help="demo JPEGs for the pack runs (0: no pack runs)")
    p.add_argument("--files-per-task", type=int, default=64)
    p.add_argument("--out", help="write the JSON here")
    a = p.parse_args()

    import pyarrow as pa
    import ray
    import stoker
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(a.nodes - 1):
        c.add_node(**node)
    c.wait_for_nodes(timeout=120)
    ray.init(address=c.address, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    result: dict[str, Any] = {"machine": os.uname().nodename, "cpus": os.cpu_count(), "nodes": a.nodes,
                              "argv": sys.argv, "ray": ray.__version__, "stoker": stoker.__version__}
    try:
        texts = texts_of(a.data, a.docs)
        ds = ray.data.from_arrow(pa.table({"text": texts})).repartition(4 * a.nodes).materialize()
        rounds: list[dict[str, Any]] = []
        for r in range(a.rounds + 1):  # round 0 warms up (workers, imports), not counted
            row = {k: tokenize_round(ray, ds, k, a.tokenizer, a.nodes, a.batch_size) for k in CONTENDERS}
            shown = [f"{k} {v['tokens_per_encode_cpu_s'] / 1e6:.2f} M tok/encode-CPU-s "
                     f"({v['tokens_per_udf_cpu_s'] / 1e6:.2f} per UDF-CPU-s, {v['wall_s']:.1f} s)"
                     for k, v in row.items()]
            print(f"round {r}: " + ", ".join(shown), flush=True)
            if r:
                rounds.append(row)
        med = {k: {m: statistics.median(x[k][m] for x in rounds) for m in rounds[0][k]} for k in rounds[0]}
        def ratio(m: str, ref: str) -> float:
            return statistics.median(x["stoker"][m] / x[ref][m] for x in rounds)

        ratios = {ref: {m: ratio(m, ref) for m in ("tokens_per_encode_cpu_s", "tokens_per_udf_cpu_s")}
                  for ref in ("tokenizers", "tokenizers-1t")}
        result["tokenize"] = {"docs": len(texts), "rounds": rounds, "median": med, "stoker_over": ratios}
        for ref, r2 in ratios.items():
            print(f"tokenize: stoker/{ref} tokens per CPU-second: {r2['tokens_per_encode_cpu_s']:.2f}x (encode), "
                  f"{r2['tokens_per_udf_cpu_s']:.2f}x (UDF)")
        if a.images:
            work = tempfile.mkdtemp(prefix="ray-pack-bench-")
            data = os.path.join(work, "data")
            stoker.make_demo(data, a.images, seed=0)
            os.remove(os.path.join(data, "LICENSE.md"))
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(data) for f in fs)
            times: dict[str, list[float]] = {"ray": [], "one": []}
            for r in range(a.rounds + 1):
                for kind in ("ray", "one"):
                    s = pack_round(kind, data, os.path.join(work, kind), a.nodes, a.files_per_task)
                    if r:
                        times[kind].append(s)
                print(f"pack round {r}: ray {times['ray'][-1] if r else s:.1f} s", flush=True)
            ray_s, one_s = statistics.median(times["ray"]), statistics.median(times["one"])
            per_core = size / (ray_s * a.nodes)  # input bytes per core-second, on the cluster
            per_core_one = size / (one_s * a.nodes)
            hours = {name: nbytes / per_core / 3600 for name, nbytes in
                     (("imagenet-21k (1.3 TB)", 1.3e12), ("laion-400m at 256 px (~10 TB)", 10e12))}
            result["pack"] = {"images": a.images, "bytes": size, "ray_s": times["ray"], "one_s": times["one"],
                              "ray_median_s": ray_s, "one_median_s": one_s,
                              "bytes_per_core_s_ray": per_core, "bytes_per_core_s_one": per_core_one,
                              "core_hours": hours}
            print(f"pack --random-access: {a.images} images, {size / 2**20:.1f} MiB: ray {ray_s:.1f} s, one machine "
                  f"{one_s:.1f} s; {per_core / 2**20:.1f} MiB per core-second on Ray; core-hours: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in hours.items()))
            shutil.rmtree(work, ignore_errors=True)
    finally:
        ray.shutdown()
        c.shutdown()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
