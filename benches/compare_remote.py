#!/usr/bin/env python3
"""Reading ImageNet-like JPEGs from S3, side by side: stoker (its ``stoker pack`` shards, plain
and ``--random-access``), litdata (chunks written by ``litdata.optimize``) and MosaicML Streaming
(MDS shards written by ``MDSWriter``), behind a proxy that adds a per-request delay.

The object store is moto's standalone S3 server on 127.0.0.1; every loader reads it through
``python/tests/s3proxy.py`` (a thread of this process), which delays each request by
``--delays`` ms (default 0, 25, 50, 100: same-region S3 first-byte latency is ~10-50 ms, a
cross-region or congested one 100 ms and more) and counts requests and bytes exactly.

The data: ``--images`` (default 2000) JPEGs made by ``make_imagenet_like.py`` (ImageNet's sizes
and bytes per pixel), written once per ``--workdir`` into the three formats with shards of
``--shard-mib`` (default 64) MiB each: ``stoker pack --shard-size 64MiB`` (also
``--random-access``), ``litdata.optimize(chunk_bytes=64 MiB)`` with ``{"image": JPEG bytes,
"label": int}`` items, ``MDSWriter(size_limit=64 MiB, columns={"image": "bytes", "label":
"int"})``; all uploaded to moto (directly, not through the proxy).

One run = one shuffled epoch of one loader at one delay, in a fresh process, with a fresh
local cache folder for litdata and Streaming (deleted after the run: no cache hit across runs):

- ``stoker``, ``stoker-ra``: ``stoker.ImageLoader("s3://bench/<prefix>/", batch_size=64,
  preset="imagenet-train", shuffle=True, seed=0, output="numpy")``, defaults otherwise;
- ``litdata``: ``StreamingDataset(s3_url, cache_dir=tmp, shuffle=True, seed=0)`` whose items
  are PIL-decoded and transformed by torchvision's RandomResizedCrop(224), RandomHorizontalFlip,
  ToTensor and Normalize (ImageNet's train pipeline), read by ``StreamingDataLoader(batch_size=64,
  num_workers=2)``;
- ``streaming``: ``StreamingDataset(remote=s3_url, local=tmp, shuffle=True, batch_size=64)``
  with the same decode and transforms, read by ``torch.utils.data.DataLoader(batch_size=64,
  num_workers=2)``.

Runs are interleaved (each repetition goes over the delays, and at each delay over the loaders,
in an order rotated by the repetition) and repeated ``--runs`` times (default 3). Reported per
loader and delay, medians over the runs:

- ``images_per_s``: images delivered / seconds from making the loader (listing and index reads
  included) to the end of the epoch; ``first_batch_s``: seconds to the first batch;
- ``gets``: GET requests the proxy saw (listings included; ``lists`` says how many were
  listings), ``heads``, ``body_mib``: MiB of GET response bodies, ``kib_per_get``: body bytes
  per GET;
- ``cpu_s_per_1000``: CPU-seconds per 1000 images of the loader's process tree (the process and
  its DataLoader workers, RUSAGE_SELF + RUSAGE_CHILDREN, from making the loader to the end of
  the epoch: interpreter start-up and imports excluded), not moto's nor the proxy's;
  ``cpu_total_s``: the whole process tree from its start (imports included), from this
  process's RUSAGE_CHILDREN;
- for stoker, ``loader.report()["storage"]`` raw when the report has that section.

Pitfalls met when writing this (kept here for whoever changes it):

- Endpoints: stoker (Rust ``object_store``) reads ``AWS_ENDPOINT`` and needs
  ``AWS_ALLOW_HTTP=true`` for ``http://``; boto3 reads ``AWS_ENDPOINT_URL``; MosaicML Streaming
  ignores both and reads ``S3_ENDPOINT_URL``; litdata reads index.json with boto3 (its
  ``storage_options={"endpoint_url": ...}`` or ``AWS_ENDPOINT_URL``) and the chunks with obstore,
  whose store it builds from the boto3 client's endpoint (path-style for a non-AWS host) plus
  fixed client options that forbid ``http://`` whatever the environment says (the chunk GETs
  fail with "HTTP error: builder error ... BadScheme"): the child adds ``allow_http`` to
  ``litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS`` (a private name: check it when
  litdata changes). All the variables are set for every child; the credentials are moto's
  dummies and ``AWS_REGION``/``AWS_DEFAULT_REGION`` are set too.
- litdata needs a local cache folder (``cache_dir``) even when streaming from S3 (chunks are
  downloaded whole to it, then read); without one it picks a default one under the home folder
  or ``/cache`` that survives runs (a cache hit in the next run). A fresh folder per run here.
- Fork: obstore's Tokio runtime is not fork-safe. litdata fetches index.json with boto3 in the
  parent on purpose and starts obstore only in the DataLoader workers; code that touches obstore
  (or litdata's chunk downloads) in the parent before the workers fork makes the workers hang.
  Likewise stoker's native threads must not be running when a process forks: stoker runs in its
  own process here, with no DataLoader around it.
- MosaicML Streaming keeps shared-memory state named from the local folder; a local folder
  reused by a run that was killed leaves stale shared memory (``clean_stale_shared_memory()`` is
  called first); its boto3 client uses ``retries={"mode": "adaptive"}`` (a client-side rate
  limiter that slows down after 503s).
- moto materialises the whole object for every GET, ranged or not, then slices it: a ranged
  GET of a few KiB from a 64 MiB shard costs moto a 64 MiB read and copy. A loader that makes
  one GET per sample is therefore slower against moto than the proxy's delay alone explains;
  the per-request cost that matters for S3 is the delay, and the GET counts are what carry over.
- The proxy and moto are Python and share this machine's cores with the loader: at zero delay
  the numbers are bounded by moto's and the proxy's speed as well (compare across loaders, not
  with a real S3's bandwidth).
- The litdata and Streaming processes start an interpreter with torch, torchvision and their
  libraries (4-5 CPU-s on this 2-core machine, against ~0.1 s for stoker's): ``cpu_total_s``
  includes it, ``cpu_s_per_1000`` does not. ``cpu_s_per_1000`` counts the DataLoader workers
  because they are joined (and so reaped) when the epoch's iterator ends, before it is read.

Usage (stoker in the project's .venv, litdata and Streaming in a separate venv, since their pins
conflict with the project's)::

    python3 -m venv /tmp/benchvenv && /tmp/benchvenv/bin/pip install litdata mosaicml-streaming \\
        torch torchvision boto3 "moto[server]" pillow numpy
    .venv/bin/python benches/compare_remote.py --ref-python /tmp/benchvenv/bin/python \\
        [--images 2000] [--delays 0,25,50,100] [--runs 3] [--loaders stoker,stoker-ra,litdata,streaming] \\
        [--workdir bench-data/remote] [--out benches/results/remote.json]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from s3proxy import Proxy, start_moto  # noqa: E402

LOADERS = ("stoker", "stoker-ra", "litdata", "streaming", "stoker-local")
#: The object prefix of each format in the bucket, and the module each loader's Python needs.
PREFIX = {"stoker": "stoker", "stoker-ra": "stoker-ra", "litdata": "litdata", "streaming": "mds",
          "stoker-local": "stoker"}
NEEDS = {"stoker": "stoker", "stoker-ra": "stoker", "stoker-local": "stoker", "litdata": "litdata, torchvision, PIL",
         "streaming": "streaming, torchvision, PIL"}
BUCKET = "bench"
CREDS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
         "AWS_DEFAULT_REGION": "us-east-1"}
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------------------------
# Child side: one epoch of one loader, or writing one format.
# --------------------------------------------------------------------------------------------


def cpu_seconds() -> float:
    """CPU-seconds of this process and of its children that were waited for."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def train_transform() -> Any:
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])


def decode(jpeg: bytes) -> Any:
    from PIL import Image

    return Image.open(io.BytesIO(jpeg)).convert("RGB")


def make_stoker_loader(a: argparse.Namespace) -> Any:
    import stoker

    # stoker-local: the same pack folder on the local disk (no store, no proxy): the baseline of
    # the remote runs.
    root = a.local if a.child == "stoker-local" else f"s3://{a.bucket}/{a.prefix}/"
    return stoker.ImageLoader(root, batch_size=a.batch_size, preset="imagenet-train", shuffle=True, seed=0,
                              output="numpy")


def make_litdata_loader(a: argparse.Namespace) -> Any:
    import litdata
    from litdata.streaming import downloader

    # litdata builds its obstore S3Store with fixed client options and no way to allow plain
    # HTTP (real S3 is HTTPS): without this its chunk GETs fail with "builder error: BadScheme".
    # The dict is read when a store is made, in the workers after fork, so this reaches them.
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True  # type: ignore[index]
    tf = train_transform()

    class Images(litdata.StreamingDataset):
        def __getitem__(self, index: Any) -> Any:
            item = super().__getitem__(index)
            return tf(decode(item["image"])), item["label"]

    storage = {"endpoint_url": a.endpoint, "aws_access_key_id": CREDS["AWS_ACCESS_KEY_ID"],
               "aws_secret_access_key": CREDS["AWS_SECRET_ACCESS_KEY"], "region_name": CREDS["AWS_REGION"]}
    ds = Images(f"s3://{a.bucket}/{a.prefix}", cache_dir=a.cache, shuffle=True, seed=0, storage_options=storage)
    return litdata.StreamingDataLoader(ds, batch_size=a.batch_size, num_workers=a.workers)


def make_streaming_loader(a: argparse.Namespace) -> Any:
    import torch
    from streaming import StreamingDataset

    tf = train_transform()

    class Images(StreamingDataset):
        def __getitem__(self, index: Any) -> Any:
            item = super().__getitem__(index)
            return tf(decode(item["image"])), item["label"]

    ds = Images(remote=f"s3://{a.bucket}/{a.prefix}", local=a.cache, shuffle=True, shuffle_seed=0,
                batch_size=a.batch_size)
    return torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.workers)


def child_epoch(a: argparse.Namespace) -> dict:
    """One shuffled epoch; returns what the parent reports."""
    if a.child in ("litdata", "streaming"):
        import torch  # noqa: F401  (imported before the clock starts, as stoker's import is)
        import torchvision  # noqa: F401
    if a.child == "streaming":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
    make = {"stoker": make_stoker_loader, "stoker-ra": make_stoker_loader, "stoker-local": make_stoker_loader,
            "litdata": make_litdata_loader,
            "streaming": make_streaming_loader}[a.child]
    if a.child.startswith("stoker"):
        import stoker  # noqa: F401
    gc.collect()
    c0, t0 = cpu_seconds(), time.perf_counter()
    loader = make(a)
    images = batches = 0
    first = None
    it = iter(loader)
    for batch in it:
        labels = batch[1]
        if first is None:
            first = time.perf_counter() - t0
        images += len(labels)
        batches += 1
    del it  # the DataLoader's workers are joined (and so counted in RUSAGE_CHILDREN)
    gc.collect()
    wall = time.perf_counter() - t0
    out: dict = {"images": images, "batches": batches, "wall_s": wall, "first_batch_s": first,
                 "cpu_s": cpu_seconds() - c0}
    if a.child.startswith("stoker"):
        report = loader.report()
        out["skipped"] = report.get("skipped_count")
        if "storage" in report:
            out["storage"] = report["storage"]
    return out


def child_make(a: argparse.Namespace) -> None:
    """Writes the images of `a.images_dir` as litdata chunks or MDS shards into `a.out_dir`."""
    root = Path(a.images_dir)
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    items = [(str(p), i) for i, c in enumerate(classes) for p in sorted((root / c).glob("*.jpg"))]
    if a.make == "litdata":
        import litdata

        litdata.optimize(fn=litdata_item, inputs=items, output_dir=a.out_dir, chunk_bytes=a.shard_bytes,
                         num_workers=1, mode="overwrite")
    else:
        from streaming import MDSWriter

        with MDSWriter(out=a.out_dir, columns={"image": "bytes", "label": "int"}, size_limit=a.shard_bytes) as w:
            for path, label in items:
                w.write({"image": Path(path).read_bytes(), "label": label})


def litdata_item(item: tuple[str, int]) -> dict:
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


# --------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    """Runs a preparation step; its output goes to stderr (stdout is for the table)."""
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    kw.setdefault("stdout", sys.stderr)
    return subprocess.run(cmd, check=True, **kw)


def has(python: str, modules: str) -> str | None:
    """None when `python` imports `modules`, else why not."""
    r = subprocess.run([python, "-c", f"import {modules}"], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["import failed"])[-1]


def prepare(args: argparse.Namespace, loaders: list[str]) -> dict[str, Path]:
    """The images and each needed format under --workdir (made once, reused when complete)."""
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    images = work / f"images-{args.images}"
    if not (images / ".complete").exists():
        shutil.rmtree(images, ignore_errors=True)
        maker = next((p for p in (args.ref_python, args.stoker_python, sys.executable) if not has(p, "numpy, PIL")),
                     None)
        if maker is None:
            sys.exit("no Python with numpy and Pillow to make the images")
        run([maker, str(ROOT / "benches" / "make_imagenet_like.py"), "--out", str(images), "--images",
             str(args.images)])
        (images / ".complete").write_text("")
    shard = f"{args.shard_mib}MiB"
    shard_bytes = args.shard_mib << 20
    out: dict[str, Path] = {}
    for name in loaders:
        dst = work / f"{PREFIX[name]}-{args.images}-{shard}{'-shuffled' if name.startswith('stoker') else ''}"
        out[name] = dst
        if (dst / ".complete").exists():
            continue
        shutil.rmtree(dst, ignore_errors=True)
        if name.startswith("stoker"):
            # --shuffle: each shard a random sample of the dataset (make_imagenet_like writes
            # class folders), as a shard-window order needs (litdata and Streaming shuffle
            # chunks and shards the same way, within a window).
            run([args.stoker_python, "-m", "stoker.cli", "pack", str(images), str(dst), "--shard-size", shard,
                 "--shuffle", *(["--random-access"] if name == "stoker-ra" else [])])
        else:
            run([args.ref_python, __file__, "--_make", name, "--_images-dir", str(images), "--_out-dir", str(dst),
                 "--_shard-bytes", str(shard_bytes)])
        (dst / ".complete").write_text("")
    return out


def upload(endpoint: str, formats: dict[str, Path]) -> dict[str, dict]:
    """Uploads every format under its prefix; returns each one's object count and bytes."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=CREDS["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=CREDS["AWS_SECRET_ACCESS_KEY"], region_name=CREDS["AWS_REGION"])
    s3.create_bucket(Bucket=BUCKET)
    sizes = {}
    for name, root in formats.items():
        if name == "stoker-local":
            continue
        files = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".complete"]
        for p in files:
            s3.upload_file(str(p), BUCKET, f"{PREFIX[name]}/{p.relative_to(root).as_posix()}")
        sizes[name] = {"objects": len(files), "mib": sum(p.stat().st_size for p in files) / (1 << 20)}
    return sizes


def child_env(endpoint: str) -> dict[str, str]:
    env = dict(os.environ)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        env.pop(k, None)
    env.update(CREDS)
    env.update({"AWS_ENDPOINT": endpoint, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint,
                "S3_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"})
    return env


def one_run(args: argparse.Namespace, proxy: Proxy, name: str, delay: float) -> dict:
    python = args.stoker_python if name.startswith("stoker") else args.ref_python
    cache = Path(tempfile.mkdtemp(prefix=f"cache-{name}-", dir=args.workdir))
    cmd = [python, __file__, "--_child", name, "--_endpoint", proxy.endpoint, "--_bucket", BUCKET, "--_prefix",
           PREFIX[name], "--_cache", str(cache), "--_batch-size", str(args.batch_size), "--_workers",
           str(args.workers), "--_local", str(args.formats.get(name, ""))]
    proxy.set(delay_ms=delay)
    proxy.reset_counts()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=child_env(proxy.endpoint), capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.timeout} s"}
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    elapsed = time.perf_counter() - t
    counts = proxy.counts()
    sizes = sorted(e[4] for e in proxy.log() if e[0] == "GET" and e[3] is not None and e[3] < 300)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": f"exit {p.returncode}: {p.stderr.strip()[-2000:]}"}
    r = json.loads(lines[-1][len("RESULT "):])
    images = r["images"]
    r.update({
        "images_per_s": images / r["wall_s"],
        "cpu_s_per_1000": 1000 * r["cpu_s"] / max(images, 1),
        "cpu_total_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "process_s": elapsed,
        "gets": counts["gets"], "lists": counts["lists"], "heads": counts["heads"],
        "ranged_gets": counts["ranged_gets"], "requests": counts["requests"],
        "errors_injected": counts["errors_injected"],
        "body_mib": counts["body_bytes"] / (1 << 20), "bytes_down": counts["bytes_down"],
        "kib_per_get": counts["body_bytes"] / 1024 / max(counts["gets"], 1),
        # Body sizes of the successful GETs: what the requests look like (whole shards, parts, samples).
        "get_bytes": {"min": sizes[0], "median": statistics.median(sizes), "max": sizes[-1]} if sizes else None,
    })
    return r


MEDIAN_KEYS = ("images_per_s", "first_batch_s", "wall_s", "gets", "lists", "heads", "ranged_gets", "requests",
               "body_mib", "kib_per_get", "cpu_s_per_1000", "cpu_s", "cpu_total_s", "images")


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    out: dict = {"runs": len(runs), "ok": len(ok)}
    for k in MEDIAN_KEYS:
        vals = [r[k] for r in ok if r.get(k) is not None]
        if vals:
            out[k] = statistics.median(vals)
    return out


def table(results: dict, delays: list[float], loaders: list[str]) -> str:
    rows = ["| loader | delay ms | images/s | first batch s | GETs (lists) | MiB read | KiB/GET | CPU-s/1000 img "
            "| CPU-s total | ok/runs |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for d in delays:
        for name in loaders:
            s = results.get(name, {}).get(str(d))
            if s is None:
                continue
            if not s["ok"]:
                rows.append(f"| {name} | {d:g} | failed | | | | | | | 0/{s['runs']} |")
                continue
            rows.append(f"| {name} | {d:g} | {s['images_per_s']:.0f} | {s['first_batch_s']:.2f} | "
                        f"{s['gets']:.0f} ({s['lists']:.0f}) | {s['body_mib']:.0f} | {s['kib_per_get']:.0f} | "
                        f"{s['cpu_s_per_1000']:.2f} | {s['cpu_total_s']:.1f} | {s['ok']}/{s['runs']} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--delays", default="0,25,50,100", help="proxy delays in ms, comma-separated")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--loaders", default=",".join(LOADERS))
    ap.add_argument("--workdir", type=Path, default=ROOT / "bench-data" / "remote")
    ap.add_argument("--out", type=Path, default=None, help="JSON results (default: WORKDIR/results.json)")
    ap.add_argument("--stoker-python", default=sys.executable)
    ap.add_argument("--ref-python", default=sys.executable, help="the Python with litdata and mosaicml-streaming")
    ap.add_argument("--shard-mib", type=int, default=64, help="shard / chunk size of every format")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of litdata and Streaming")
    ap.add_argument("--error-rate", type=float, default=0.0, help="proxy's injected 503 rate on GETs")
    ap.add_argument("--bandwidth", type=float, default=None, help="proxy's bytes/s per connection (default: none)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds one run may take")
    # Child modes (this file runs itself).
    ap.add_argument("--_child", choices=LOADERS, help=argparse.SUPPRESS)
    ap.add_argument("--_make", choices=("litdata", "streaming"), help=argparse.SUPPRESS)
    for k in ("endpoint", "bucket", "prefix", "cache", "images-dir", "out-dir", "local"):
        ap.add_argument(f"--_{k}", help=argparse.SUPPRESS)
    for k in ("batch-size", "workers", "shard-bytes"):
        ap.add_argument(f"--_{k}", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args._child:
        a = argparse.Namespace(child=args._child, endpoint=args._endpoint, bucket=args._bucket, prefix=args._prefix,
                               cache=args._cache, batch_size=args._batch_size, workers=args._workers,
                               local=args._local)
        print("RESULT " + json.dumps(child_epoch(a)), flush=True)
        return 0
    if args._make:
        child_make(argparse.Namespace(make=args._make, images_dir=args._images_dir, out_dir=args._out_dir,
                                      shard_bytes=args._shard_bytes))
        return 0

    args.workdir = args.workdir.resolve()
    loaders = [x.strip() for x in args.loaders.split(",") if x.strip()]
    unknown = set(loaders) - set(LOADERS)
    if unknown:
        ap.error(f"unknown loaders {sorted(unknown)}; known: {', '.join(LOADERS)}")
    delays = [float(d) for d in args.delays.split(",") if d.strip()]
    skipped = {}
    for name in list(loaders):
        python = args.stoker_python if name.startswith("stoker") else args.ref_python
        why = has(python, NEEDS[name])
        if why:
            skipped[name] = f"{python}: {why}"
            loaders.remove(name)
            print(f"skipping {name}: {skipped[name]}", file=sys.stderr)
    if not loaders:
        sys.exit("no loader can run")
    formats = args.formats = prepare(args, loaders)
    moto, moto_port = start_moto(sys.executable)
    runs: dict[str, dict[str, list]] = {n: {str(d): [] for d in delays} for n in loaders}
    try:
        sizes = upload(f"http://127.0.0.1:{moto_port}", formats)
        with Proxy(moto_port, error_rate=args.error_rate, bandwidth=args.bandwidth) as proxy:
            for rep in range(args.runs):
                for d in delays:
                    order = loaders[rep % len(loaders):] + loaders[: rep % len(loaders)]
                    for name in order:
                        r = one_run(args, proxy, name, d)
                        runs[name][str(d)].append(r)
                        if "error" in r:
                            print(f"run {rep + 1} {name} @ {d:g} ms: FAILED {r['error']}", file=sys.stderr)
                        else:
                            print(f"run {rep + 1} {name} @ {d:g} ms: {r['images']} images, "
                                  f"{r['images_per_s']:.0f} img/s, first batch {r['first_batch_s']:.2f} s, "
                                  f"{r['gets']} GETs, {r['body_mib']:.0f} MiB, "
                                  f"{r['cpu_s_per_1000']:.2f} CPU-s/1000", file=sys.stderr, flush=True)
    finally:
        moto.terminate()
        moto.wait(10)
    results = {n: {d: summarize(rs) for d, rs in by.items()} for n, by in runs.items()}
    doc = {
        "images": args.images, "delays_ms": delays, "runs": args.runs, "shard_mib": args.shard_mib,
        "batch_size": args.batch_size, "workers": args.workers, "error_rate": args.error_rate,
        "bandwidth": args.bandwidth, "cpus": os.cpu_count(), "stoker_python": args.stoker_python,
        "ref_python": args.ref_python, "formats": sizes, "skipped": skipped,
        "median": results, "per_run": runs,
    }
    out = args.out or args.workdir / "results.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(table(results, delays, loaders))
    print(f"\n{args.images} images, {args.runs} run(s), medians; JSON in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
