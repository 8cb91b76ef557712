#!/usr/bin/env python3
"""Later epochs from the local shard cache: stoker over moto's S3 behind python/tests/s3proxy.py
(a delay per request), two epochs with ``shard_cache`` (a fresh folder) against the same pack
folder read from the local disk, in one process each, interleaved; images/s and GETs per epoch.

    python benches/shard_cache_epochs.py PACK_FOLDER [--delay-ms 50] [--runs 3]

PACK_FOLDER: what ``stoker pack --shuffle`` wrote (``benches/compare_remote.py`` leaves one
under its --workdir).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests"))
from s3proxy import Proxy, start_moto  # noqa: E402

CHILD = r"""
import json, sys, time, stoker
root, cache = sys.argv[1], sys.argv[2] or None
kw = dict(shard_cache=cache) if cache else {}
ld = stoker.ImageLoader(root, 64, preset="imagenet-train", shuffle=True, seed=0, output="numpy", **kw)
out = []
for epoch in range(2):
    ld.set_epoch(epoch)
    t = time.perf_counter()
    n = sum(len(y) for _, y in ld)
    out.append(n / (time.perf_counter() - t))
    if cache and epoch == 0:
        deadline = time.monotonic() + 120
        while ld.report()["storage"]["cache"]["stored"] < ld.report()["storage"]["part_requests"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("pack", type=Path)
    ap.add_argument("--delay-ms", type=float, default=50)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    import boto3

    moto, port = start_moto()
    try:
        c = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="test",
                         aws_secret_access_key="test", region_name="us-east-1")
        c.create_bucket(Bucket="bench")
        for p in sorted(a.pack.iterdir()):
            if p.is_file() and not p.name.startswith("."):
                c.upload_file(str(p), "bench", f"pack/{p.name}")
        with Proxy(port, delay_ms=a.delay_ms) as proxy:
            env = dict(os.environ, AWS_ENDPOINT=proxy.endpoint, AWS_ALLOW_HTTP="true", AWS_ACCESS_KEY_ID="test",
                       AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1")
            res: dict = {"remote+cache": [], "local": []}
            gets = []
            for _ in range(a.runs):
                for name in res:
                    with tempfile.TemporaryDirectory() as cache:
                        root = "s3://bench/pack/" if name == "remote+cache" else str(a.pack)
                        proxy.reset_counts()
                        r = subprocess.run([sys.executable, "-c", CHILD, root, cache if name != "local" else ""],
                                           env=env, capture_output=True, text=True, check=True, timeout=600)
                        res[name].append(json.loads(r.stdout.split("RESULT ", 1)[1]))
                        if name == "remote+cache":
                            gets.append(proxy.counts()["gets"])
        for name, runs in res.items():
            e0 = statistics.median(r[0] for r in runs)
            e1 = statistics.median(r[1] for r in runs)
            print(f"{name}: epoch 0 {e0:.0f} img/s, epoch 1 {e1:.0f} img/s")
        print(f"GETs of both epochs (remote+cache): {gets}")
    finally:
        moto.terminate()
        moto.wait(10)


if __name__ == "__main__":
    main()
