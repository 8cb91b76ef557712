#!/usr/bin/env python3
"""What one ranged GET costs moto's S3 server, by object size and range size: moto reads the
whole object for every GET, ranged or not, then slices it, so on moto a request costs time in
proportion to the object's size (real S3 does not). Explains part of the gap between stoker
over moto at 0 ms and stoker on a local disk in BENCHMARKS.md ("Object storage").

    python benches/moto_ranged_get_cost.py
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import boto3  # noqa: E402
from s3proxy import start_moto  # noqa: E402


def main() -> None:
    moto, port = start_moto()
    try:
        c = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="test",
                         aws_secret_access_key="test", region_name="us-east-1")
        c.create_bucket(Bucket="bench")
        for mib in (16, 64, 240):
            c.put_object(Bucket="bench", Key=f"o{mib}", Body=os.urandom(mib << 20))
        for mib in (16, 64, 240):
            for rng in (1, 16):
                times = []
                for _ in range(5):
                    t = time.perf_counter()
                    c.get_object(Bucket="bench", Key=f"o{mib}", Range=f"bytes=0-{(rng << 20) - 1}")["Body"].read()
                    times.append(time.perf_counter() - t)
                times.sort()
                print(f"{mib:4d} MiB object, {rng:2d} MiB range: median {times[2] * 1000:.0f} ms")
    finally:
        moto.terminate()
        moto.wait(10)


if __name__ == "__main__":
    main()
