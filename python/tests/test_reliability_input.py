"""Bad input is a skipped sample, never an abort, a hang or a wrong index: decompression bombs,
FIFOs, devices, sockets, a 1 TiB sparse file, symlink loops and files that change mid-epoch,
through the CLI (``python -m stoker.cli bench --json``, also ``--decode-only``) and the Python
package. Each run is a subprocess with a timeout, a 4 GiB address-space limit and a bound on
its peak RSS, so an abort (SIGABRT on a failed allocation), a hang or an allocation sized from
a hostile header fails the test instead of killing pytest."""

import io
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
from helpers import run_bounded

ADDRESS_SPACE = 4 << 30
TIMEOUT = 120
MAX_PIXELS = 178956970
MAX_FILE_BYTES = 256 << 20
DEMO_IMAGES = 96


def run(args: list[str], timeout: int = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return run_bounded(args, timeout, address_space=ADDRESS_SPACE)


def bench(root: Path, *flags: str) -> dict[str, Any]:
    """``stoker bench --json`` over ``root``; a non-zero or negative (signal) exit fails."""
    r = run([sys.executable, "-m", "stoker.cli", "bench", str(root), "--json", "--preset", "imagenet-val",
             "--batch-size", "16", "--threads", "2", "--keep-last", "--no-shuffle", *flags])
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr}"
    out: dict[str, Any] = json.loads(r.stdout)
    return out


LOAD = """
import json, os, sys
import stoker
root, kw, delete = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
loader = stoker.ImageLoader(root, 8, preset="imagenet-val", output="numpy", threads=2, **kw)
n, error = 0, None
try:
    for i, (images, labels) in enumerate(loader):
        n += len(labels)
        if i == 0:
            for spec in delete:  # mid-epoch: "rm:PATH" or "fifo:PATH"
                what, path = spec.split(":", 1)
                os.remove(path)
                if what == "fifo":
                    os.mkfifo(path)
except stoker.StokerError as e:
    error = {"type": type(e).__name__, "message": str(e), "oserror": isinstance(e, OSError)}
report = loader.report()
print(json.dumps({"images": n, "error": error, "skipped": report["skipped"]}))
"""


def load(root: Path, *, delete: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    """Iterates an ``ImageLoader`` over ``root`` in a subprocess; ``delete`` changes files after
    the first batch."""
    r = run([sys.executable, "-c", LOAD, str(root), json.dumps(kw), *delete])
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr}"
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def skipped(out: dict[str, Any], root: Path) -> dict[str, str]:
    return {os.path.relpath(s["path"], root): s["reason"] for s in out["skipped"]}


@pytest.fixture()
def data(demo: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(demo, root)
    return root


def a_jpeg(root: Path) -> bytes:
    return sorted((root / "rocket").iterdir())[0].read_bytes()


# Bombs, made from a valid image: only the size in the header is wrong.

def claim_jpeg(jpeg: bytes, w: int, h: int) -> bytes:
    """``jpeg`` with its SOF (baseline, extended or progressive) claiming ``w`` x ``h``."""
    pos = 2
    while jpeg[pos] == 0xFF:
        marker = jpeg[pos + 1]
        (length,) = struct.unpack(">H", jpeg[pos + 2:pos + 4])
        if marker in (0xC0, 0xC1, 0xC2):
            return jpeg[:pos + 5] + struct.pack(">HH", h, w) + jpeg[pos + 9:]
        pos += 2 + length
    raise AssertionError("no SOF segment")


def progressive(jpeg: bytes) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(jpeg)).save(out, "JPEG", quality=90, progressive=True)
    return out.getvalue()


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(w: int, h: int) -> bytes:
    """A 70-byte PNG: IHDR claims ``w`` x ``h`` RGB, IDAT holds one row of a 1x1 image."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00\x80\x80\x80")
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def write_bombs(root: Path) -> dict[str, str]:
    """Writes the bombs into ``root``; returns ``{relative path: expected reason}``."""
    good = a_jpeg(root)
    bombs = {
        "chelsea/bomb_baseline.jpg": (claim_jpeg(good, 65500, 65500), "65500x65500"),
        "chelsea/bomb_progressive.jpg": (claim_jpeg(progressive(good), 65500, 65500), "65500x65500"),
        "coffee/bomb.png": (png_claiming(100000, 100000), "100000x100000"),
    }
    for rel, (data, _) in bombs.items():
        (root / rel).write_bytes(data)
    return {rel: f"image too large: {claim} > max_pixels ({MAX_PIXELS})" for rel, (_, claim) in bombs.items()}


@pytest.mark.parametrize("flags", [(), ("--no-dct-scaling", "--no-roi", "--no-exif"), ("--no-roi",)])
def test_bench_skips_decompression_bombs_with_the_reason(data, flags):
    want = write_bombs(data)
    out = bench(data, *flags)
    assert out["images"] == DEMO_IMAGES
    assert skipped(out, data) == want


def test_decode_only_skips_decompression_bombs_with_the_reason(data):
    want = write_bombs(data)
    out = bench(data, "--decode-only")
    assert (out["images"], out["failed"]) == (DEMO_IMAGES, len(want))
    assert skipped(out, data) == want
    # A lower limit is honoured too: every demo image is larger than 1000 pixels.
    out = bench(data, "--decode-only", "--max-pixels", "1000")
    assert (out["images"], out["failed"]) == (0, DEMO_IMAGES + len(want))
    assert all("> max_pixels (1000)" in s["reason"] for s in out["skipped"])


def test_the_python_package_skips_bombs_and_raises_decode_error_on_request(data):
    want = write_bombs(data)
    out = load(data)
    assert out["images"] == DEMO_IMAGES and out["error"] is None
    assert skipped(out, data) == want
    out = load(data, on_error="raise")
    assert out["error"]["type"] == "DecodeError"
    assert "image too large" in out["error"]["message"]


def test_a_sparse_terabyte_file_is_skipped_from_its_size(data):
    big = data / "chelsea" / "huge.jpg"
    with open(big, "wb") as f:
        f.truncate(1 << 40)
    out = bench(data)
    assert (out["dataset_samples"], out["images"]) == (DEMO_IMAGES + 1, DEMO_IMAGES)
    assert skipped(out, data) == {
        "chelsea/huge.jpg": f"file too large: {1 << 40} bytes > max_file_bytes ({MAX_FILE_BYTES})"}
    out = bench(data, "--decode-only")
    assert (out["images"], out["failed"]) == (DEMO_IMAGES, 1)
    out = load(data)
    assert out["images"] == DEMO_IMAGES
    assert list(skipped(out, data)) == ["chelsea/huge.jpg"]


def test_fifos_devices_and_sockets_are_not_samples(data):
    os.mkfifo(data / "chelsea" / "fifo.jpg")
    os.symlink("/dev/zero", data / "chelsea" / "zero.jpg")
    os.symlink("/dev/null", data / "rocket" / "null.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(data / "coffee" / "sock.jpg"))
    try:
        out = bench(data)
        assert (out["dataset_samples"], out["images"]) == (DEMO_IMAGES, DEMO_IMAGES)
        # Not samples, but reported: each path with its reason.
        reasons = skipped(out, data)
        assert set(reasons) == {"chelsea/fifo.jpg", "chelsea/zero.jpg", "rocket/null.png", "coffee/sock.jpg"}
        assert all(r.startswith("not a regular file") for r in reasons.values()), reasons
        out = bench(data, "--decode-only")
        assert (out["images"], out["failed"]) == (DEMO_IMAGES, 0)
        out = load(data)
        assert out["images"] == DEMO_IMAGES and out["error"] is None
    finally:
        sock.close()


def test_symlink_loops_and_repeated_folders_index_each_file_once(data):
    os.symlink(".", data / "chelsea" / "loop")
    os.symlink("..", data / "rocket" / "up")  # the root: rocket/up/rocket/... would repeat
    sub = data / "coffee" / "sub"
    sub.mkdir()
    for p in sorted((data / "coffee").glob("*.jpg"))[:3]:
        p.rename(sub / p.name)
    os.symlink("sub", data / "coffee" / "again")
    out = bench(data)
    assert (out["dataset_samples"], out["images"]) == (DEMO_IMAGES, DEMO_IMAGES)
    # The loop and the repeats are reported, not walked.
    assert set(skipped(out, data)) == {"chelsea/loop", "rocket/up", "coffee/again"}, out["skipped"]
    out = load(data)
    assert out["images"] == DEMO_IMAGES


def test_files_deleted_or_replaced_by_a_fifo_mid_epoch(data):
    last = sorted((data / "rocket").iterdir())
    gone, fifo = last[-1], last[-2]
    out = load(data, delete=(f"rm:{gone}", f"fifo:{fifo}"), prefetch=1)
    assert out["images"] == DEMO_IMAGES - 2 and out["error"] is None
    reasons = skipped(out, data)
    assert set(reasons) == {f"rocket/{gone.name}", f"rocket/{fifo.name}"}
    assert "No such file" in reasons[f"rocket/{gone.name}"]
    assert reasons[f"rocket/{fifo.name}"] == "not a regular file: a FIFO (named pipe)"


def test_a_fifo_mid_epoch_raises_read_error_on_request(data):
    fifo = sorted((data / "rocket").iterdir())[-1]
    out = load(data, delete=(f"fifo:{fifo}",), prefetch=1, on_error="raise")
    assert out["error"]["type"] == "ReadError" and out["error"]["oserror"]
    assert str(fifo) in out["error"]["message"] and "not a regular file" in out["error"]["message"]
