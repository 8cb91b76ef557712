"""Storage that misbehaves under a running loader, from Python: a `.npy` file truncated while an
`ArrayLoader` reads it (once a SIGBUS that killed the process), a host-wide CPU registry whose
lock another process holds (once a wait without end in the `ImageLoader` constructor), and an
object store that accepts connections and never answers (once a time per sample). Each case
runs in a subprocess with a timeout, so a signal or a hang fails the test instead of pytest."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from helpers import run_bounded

TIMEOUT = 120


def python(code: str, *args: str, env: dict[str, str] | None = None,
           timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter (bounded: see `run_bounded`)."""
    full_env = dict(os.environ, **(env or {}))
    return run_bounded([sys.executable, "-c", textwrap.dedent(code), *args], timeout, env=full_env)


TRUNCATE = """
import json, os, sys
import numpy as np
import stoker
path, given = sys.argv[1], sys.argv[2]
# The path, or the array NumPy maps from it (np.load(mmap_mode="r"), as training scripts do).
source = path if given == "path" else np.load(path, mmap_mode="r")
loader = stoker.ArrayLoader(source, batch_size=16, shuffle=True, seed=3, threads=2, output="numpy")
n, error = 0, None
try:
    for i, (x,) in enumerate(loader):
        n += len(x)
        if i == 0:
            os.truncate(path, 128 + 10 * x.shape[1] * 4)  # another process cuts it to ~10 rows
except stoker.StokerError as e:
    error = {"type": type(e).__name__, "message": str(e), "oserror": isinstance(e, OSError)}
print(json.dumps({"rows": n, "error": error}))
"""


@pytest.mark.parametrize("given", ["path", "mmap"])
def test_an_npy_truncated_while_read_raises_read_error_not_sigbus(tmp_path: Path, given: str) -> None:
    path = tmp_path / "x.npy"
    # 40 MiB: more than stoker reads whole when it opens a file (32 MiB), so rows are read as
    # batches need them.
    x = np.arange(2_500 * 4096, dtype=np.uint32).reshape(2_500, 4096)
    np.save(path, x)
    r = python(TRUNCATE, str(path), given)
    assert r.returncode == 0, f"exit status {r.returncode} (negative: killed by a signal)\n{r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["error"] is not None, out
    assert out["error"]["type"] == "ReadError" and out["error"]["oserror"], out
    assert str(path) in out["error"]["message"] and "became shorter" in out["error"]["message"], out
    assert 0 < out["rows"] < 2_500, out


HELD_LOCK = """
import fcntl, json, sys, time
import stoker
root, registry = sys.argv[1], sys.argv[2]
holder = open(registry, "a")
fcntl.flock(holder, fcntl.LOCK_EX)  # a stopped or hung process holding the registry
t0 = time.monotonic()
loader = stoker.ImageLoader(root, 16, preset="imagenet-val", output="numpy", cpu_budget=2)
made = time.monotonic() - t0
samples = sum(len(y) for _, y in loader)
print(json.dumps({"made_s": made, "total_s": time.monotonic() - t0, "samples": samples,
                  "tuning": loader.report()["tuning"], "text": loader.report_text()}))
"""


def test_a_held_cpu_registry_lock_does_not_stop_a_loader(demo: Path, tmp_path: Path) -> None:
    registry = tmp_path / "budget"
    env = {"STOKER_SHARED_BUDGET": "1", "STOKER_BUDGET_FILE": str(registry)}
    r = python(HELD_LOCK, str(demo), str(registry), env=env, timeout=60)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # The lock is waited for ~1.5 s, not forever; the bound leaves room for a loaded machine.
    assert out["made_s"] < 15, out
    assert out["samples"] == 96
    t = out["tuning"]
    assert t["shared"] is False and t["registry_busy"] is True, t
    assert "sharing skipped" in t["note"] and str(registry) in t["note"], t
    assert "not shared: sharing skipped" in out["text"], out["text"]


STALLED = """
import json, socket, sys, threading, time
import stoker
shards = sys.argv[1]
from pathlib import Path
files = {p.name: p.read_bytes() for p in Path(shards).iterdir()}
stall = threading.Event()
held = []

def serve(conn):
    buf = b""
    while True:
        while b"\\r\\n\\r\\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
        head, buf = buf.split(b"\\r\\n\\r\\n", 1)
        if stall.is_set():
            held.append(conn)  # accepted, read, never answered
            return
        lines = head.decode().split("\\r\\n")
        method, target = lines[0].split()[:2]
        rng = [l.split("=", 1)[1] for l in lines[1:] if l.lower().startswith("range:")]
        body = files.get(target.lstrip("/"))
        if body is None:
            conn.sendall(b"HTTP/1.1 404 Not Found\\r\\nContent-Length: 0\\r\\n\\r\\n")
            continue
        extra = ""
        status = "200 OK"
        if rng:
            a, b = (int(v) for v in rng[0].split("-"))
            b = min(b, len(body) - 1)
            extra = f"Content-Range: bytes {a}-{b}/{len(body)}\\r\\n"
            body, status = body[a:b + 1], "206 Partial Content"
        msg = f"HTTP/1.1 {status}\\r\\nContent-Length: {len(body)}\\r\\n{extra}\\r\\n".encode()
        conn.sendall(msg + (b"" if method == "HEAD" else body))

listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]

def accept():
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()

threading.Thread(target=accept, daemon=True).start()
names = sorted(n for n in files if n.endswith(".tar"))
urls = [f"http://127.0.0.1:{port}/{n}" for n in names]
loader = stoker.ImageLoader(urls, 8, preset="imagenet-val", output="numpy", threads=1, io_threads=2)
healthy = sum(len(y) for _, y in loader)
stall.set()
t0 = time.monotonic()
error = None
try:
    for _ in loader:
        pass
except stoker.StokerError as e:
    error = {"type": type(e).__name__, "message": str(e)}
failed_s = time.monotonic() - t0
t1 = time.monotonic()
del loader
print(json.dumps({"port": port, "healthy": healthy, "failed_s": failed_s, "drop_s": time.monotonic() - t1,
                  "error": error}))
"""


def test_a_stalled_object_store_fails_the_pass_once(demo: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    r = run_bounded([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(shards), "--shard-size", "256KiB"],
                    TIMEOUT)
    assert r.returncode == 0, r.stderr
    r = python(STALLED, str(shards), env={"STOKER_OBJECT_TIMEOUT": "1"})
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr[-3000:]}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["healthy"] == 96, out
    # ~2 s (a request and its retry); 96 samples x 2 s / 2 threads before the circuit breaker.
    assert out["failed_s"] < 12, out
    assert out["drop_s"] < 5, out
    e = out["error"]
    assert e is not None and e["type"] == "DatasetError", out
    assert f"object store http://127.0.0.1:{out['port']} is not answering" in e["message"], e
    assert "timed out" in e["message"], e
