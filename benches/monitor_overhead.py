"""What `stoker monitor` costs: the monitor's own CPU per watched second, on a running PyTorch
DataLoader job (a main process and N worker processes, each with its threads).

    python benches/monitor_overhead.py --workers 4 8 --seconds 20 --repeats 3 [--interval 100ms]

For each worker count, a job is started and left to warm up; then `stoker monitor --pid JOB
--duration S --json` watches it, `repeats` times in a row, and the monitor's
`overhead.cpu_share_of_one_core` (its CPU time over the watched time, start-up included) is
reported with the number of processes, threads and samples. Prints one JSON object.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

JOB = """
import sys, time, torch
from torch.utils.data import DataLoader, Dataset
class Light(Dataset):
    def __len__(self): return 10**9
    def __getitem__(self, i):
        return torch.full((3, 64, 64), float(i % 7))
loader = DataLoader(Light(), batch_size=32, num_workers=int(sys.argv[1]))
for b in loader:
    time.sleep(0.02)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interval", default="100ms")
    ap.add_argument("--bin", default=os.environ.get("STOKER_BIN", str(ROOT / "target/release/stoker")))
    a = ap.parse_args()
    results = []
    for workers in a.workers:
        job = subprocess.Popen([sys.executable, "-W", "ignore", "-c", JOB, str(workers)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(8)
            runs = []
            for _ in range(a.repeats):
                out = subprocess.run([a.bin, "monitor", "--pid", str(job.pid), "--duration", str(a.seconds), "--json",
                                      "--quiet", "--interval", a.interval], capture_output=True, text=True, check=True)
                r = json.loads(out.stdout)
                runs.append({
                    "cpu_share_of_one_core": r["overhead"]["cpu_share_of_one_core"],
                    "monitor_cpu_seconds": r["overhead"]["monitor_cpu_seconds"],
                    "ticks": r["ticks"],
                    "processes": len(r["processes"]),
                    "threads": sum(len(p["threads"]) for p in r["processes"]),
                })
        finally:
            job.kill()
            job.wait()
        results.append({
            "workers": workers,
            "median_cpu_share_of_one_core": statistics.median(x["cpu_share_of_one_core"] for x in runs),
            "runs": runs,
        })
    print(json.dumps({"interval": a.interval, "seconds": a.seconds, "results": results}, indent=1))


if __name__ == "__main__":
    main()
