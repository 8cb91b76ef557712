"""Shards and pack under bad input: tar shards written by Python's tarfile (PAX and GNU formats,
long and non-ASCII names), long file names through ``stoker pack``, packing over an earlier run,
a full disk, and a stalled object-store endpoint. Every case ends in full coverage or a clear
error, within a time bound; nothing is lost silently."""

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import textwrap
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import stoker
from helpers import run_bounded


def cli(*args, timeout=600):
    return run_bounded([sys.executable, "-m", "stoker.cli", *map(str, args)], timeout)


def images(demo):
    """(class index, class name, path) of every demo image, in ImageFolder order."""
    classes = sorted(p.name for p in demo.iterdir() if p.is_dir())
    return [(k, c, p) for k, c in enumerate(classes) for p in sorted((demo / c).iterdir())]


def coverage(root, **kw):
    """Indices of every sample delivered in one epoch, the labels in order, and the report."""
    loader = stoker.ImageLoader(root, 8, preset="imagenet-val", output="numpy", **kw)
    seen = [i for b in loader.batches() for i in b.indices]
    labels = [int(v) for _, y in loader for v in y]
    return seen, labels, loader.report()


def shard_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tar"))


def no_shard_without_index(folder):
    names = set(os.listdir(folder))
    assert not [n for n in names if "partial" in n], names
    for n in names:
        if n.endswith(".tar"):
            assert n + ".idx" in names, f"{n} has no index: {sorted(names)}"


# --- shards written by other tools -----------------------------------------------------------

def key_for(i, cls):
    """A 150+-byte ASCII name, a short non-ASCII one, or a 150-byte non-ASCII one."""
    return [f"{cls}/{'k' * 150}-{i}", f"{cls}/ünïcødé-猫-{i}", f"{cls}/{'é' * 75}-{i}"][i % 3]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT], ids=["pax", "gnu"])
def test_tarfile_shards_with_long_and_non_ascii_names_load_every_sample(demo, tmp_path, fmt):
    items = images(demo)
    shards = [tmp_path / "part-0.tar", tmp_path / "part-1.tar"]
    half = len(items) // 2
    for shard, start in zip(shards, (0, half)):
        with tarfile.open(shard, "w", format=fmt) as tar:
            for i, (label, cls, path) in enumerate(items[start:start + half], start=start):
                key = key_for(i, cls)
                assert len(key.encode()) >= 150 or not key.isascii()
                data = path.read_bytes()
                for name, payload in ((f"{key}.jpg", data), (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    info.mtime = 1_700_000_000
                    tar.addfile(info, io.BytesIO(payload))
    r = cli("index", *shards)
    assert r.returncode == 0, r.stderr
    assert f"{half} samples indexed" in r.stdout
    seen, labels, report = coverage([str(s) for s in shards])
    assert sorted(seen) == list(range(len(items))), f"skipped: {report['skipped']}"
    assert report["skipped_count"] == 0
    assert labels == [label for label, _, _ in items]


# --- what shards drop: hard links, labels (issue 19, item 10) ---------------------------------

def linked_folder(demo, root, n=6):
    """``root/v/KEY.jpg`` + ``KEY.cls`` for ``n`` demo images, and for every other one a second
    name ``KEY-link.jpg`` (a hard link: one file, two names) with its own ``.cls``. Returns
    (key, label) in name order."""
    (root / "v").mkdir(parents=True)
    keys = []
    for k, (label, _, path) in enumerate(images(demo)[:: len(images(demo)) // n][:n]):
        shutil.copy(path, root / "v" / f"s{k}.jpg")
        (root / "v" / f"s{k}.cls").write_text(str(label))
        keys.append((f"s{k}", label))
        if k % 2 == 0:
            os.link(root / "v" / f"s{k}.jpg", root / "v" / f"s{k}-link.jpg")
            (root / "v" / f"s{k}-link.cls").write_text(str(label))
            keys.append((f"s{k}-link", label))
    return sorted(keys)


def link_members(shard):
    with tarfile.open(shard) as t:
        return [m.name for m in t.getmembers() if m.islnk()]


@pytest.mark.parametrize("writer", ["tarfile-pax", "tarfile-gnu", "gnu-tar", "gnu-tar-posix"])
def test_hard_linked_members_read_the_file_they_link_to(demo, tmp_path, writer):
    # Regression: the second name of a hard-linked file (a link member without data, as GNU
    # tar and tarfile write it) was dropped without a word.
    src = tmp_path / "src"
    keys = linked_folder(demo, src)
    shard = tmp_path / "linked.tar"
    if writer.startswith("tarfile"):
        fmt = tarfile.PAX_FORMAT if writer.endswith("pax") else tarfile.GNU_FORMAT
        with tarfile.open(shard, "w", format=fmt) as tar:
            tar.add(src / "v", arcname="v")  # sorted; a second name of an inode becomes a link
    else:
        if shutil.which("tar") is None:
            pytest.skip("GNU tar is not installed")
        fmt = ["--format=posix"] if writer.endswith("posix") else []
        subprocess.run(["tar", "-cf", str(shard), "--sort=name", *fmt, "-C", str(src), "v"], check=True)
    assert len(link_members(shard)) == 3, link_members(shard)
    r = cli("index", shard)
    assert r.returncode == 0, r.stderr
    assert f"{len(keys)} samples indexed" in r.stdout, r.stdout
    seen, labels, report = coverage(str(shard))
    assert sorted(seen) == list(range(len(keys))) and report["skipped_count"] == 0, report["skipped"]
    with tarfile.open(shard) as t:  # samples follow the archive's order
        order = [os.path.basename(m.name)[: -len(".jpg")] for m in t.getmembers() if m.name.endswith(".jpg")]
    assert sorted(order) == [k for k, _ in keys]
    assert labels == [dict(keys)[k] for k in order]
    # Both names of a file decode to the same pixels, whichever one the writer made the link.
    loader = stoker.ImageLoader(str(shard), len(keys), preset="imagenet-val", output="numpy")
    batch, _ = next(iter(loader))
    for k, name in enumerate(order):
        if name.endswith("-link"):
            assert np.array_equal(batch[k], batch[order.index(name[: -len("-link")])]), name


def test_class_name_labels_go_through_classes_json_and_bad_labels_drop_only_their_sample(demo, tmp_path):
    # Regression: a .cls holding a class name (WebDataset's ImageNet shards use n01440764)
    # refused the whole shard; an image without .cls got label -1.
    items = images(demo)[:12]
    classes = sorted({f"n0{1000000 + cls_index:07d}" for cls_index, _, _ in items})
    wnid = {k: f"n0{1000000 + k:07d}" for k, _, _ in items}
    out = tmp_path / "wds"
    out.mkdir()
    bad = {3: None, 5: b"", 8: b"n99999999"}  # no .cls, an empty one, a class not in classes.json
    with tarfile.open(out / "train-0.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i, (k, _, path) in enumerate(items):
            members = [(f"s{i:02d}.jpg", path.read_bytes())]
            cls = bad.get(i, wnid[k].encode())
            if cls is not None:
                members.append((f"s{i:02d}.cls", cls))
            for name, payload in members:
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    (out / "classes.json").write_text(json.dumps(classes))
    r = cli("index", out / "train-0.tar")
    assert r.returncode == 0, r.stderr
    seen, labels, _ = coverage(str(out / "train-0.tar"))
    good = [i for i in range(len(items)) if i not in bad]
    assert len(seen) == len(good)
    assert labels == [classes.index(wnid[items[i][0]]) for i in good]
    # What was left out is in the report, with the reason.
    loader = stoker.ImageLoader(str(out / "train-0.tar"), 8, preset="imagenet-val", output="numpy")
    skipped = {s["path"].rsplit(":", 1)[1]: s["reason"] for s in loader.report()["skipped"]}
    assert sorted(skipped) == ["s03.jpg", "s05.jpg", "s08.jpg"], skipped
    assert "no label" in skipped["s03.jpg"]
    assert "s05.cls is empty" in skipped["s05.jpg"]
    assert '"n99999999" is not a class' in skipped["s08.jpg"]
    assert "train-0.tar:s03.jpg" in loader.report_text()


# --- stoker pack -------------------------------------------------------------------------------

def test_pack_writes_200_byte_and_non_ascii_file_names(demo, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(demo, src)
    files = sorted((src / "rocket").iterdir())
    long_name = "r" * 196 + ".jpg"
    assert len(long_name.encode()) == 200
    files[0].rename(files[0].with_name(long_name))
    files[1].rename(files[1].with_name("fusée-🚀-" + "é" * 60 + ".jpg"))
    out = tmp_path / "out"
    r = cli("pack", src, out, "--shard-size", "1MiB")
    assert r.returncode == 0, r.stderr
    no_shard_without_index(out)
    seen, labels, report = coverage(str(out))
    assert sorted(seen) == list(range(96)) and report["skipped_count"] == 0
    _, folder_labels, _ = coverage(str(src))
    assert labels == folder_labels


def test_pack_twice_into_one_folder_is_refused_and_overwrite_leaves_no_stale_shard(demo, tmp_path):
    out = tmp_path / "out"
    r = cli("pack", demo, out, "--shard-size", "256KiB")
    assert r.returncode == 0, r.stderr
    first = shard_files(out)
    assert len(first) > 2
    (out / "README.txt").write_text("not a shard")
    before = sorted(os.listdir(out))
    r = cli("pack", demo, out)
    assert r.returncode != 0
    assert "--overwrite" in r.stderr and "already holds" in r.stderr, r.stderr
    assert sorted(os.listdir(out)) == before
    r = cli("pack", demo, out, "--overwrite")  # one 256 MiB shard this time
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stdout
    assert shard_files(out) == ["shard-000000.tar"]
    assert sorted(os.listdir(out)) == ["README.txt", "classes.json", "shard-000000.tar", "shard-000000.tar.idx"]
    seen, _, report = coverage(str(out))
    assert sorted(seen) == list(range(96)) and report["skipped_count"] == 0


def test_pack_onto_a_full_disk_is_a_clear_error_and_keeps_no_shard_without_index(demo, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if shutil.which("mount") is None:
        reason = "no mount command: the disk-full test needs a 1 MiB tmpfs"
        print(reason)
        pytest.skip(reason)
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if m.returncode != 0:
        reason = f"cannot mount a 1 MiB tmpfs (needs root): {m.stderr.strip()}"
        print(reason)
        pytest.skip(reason)
    try:
        out = mnt / "out"
        r = cli("pack", demo, out, "--shard-size", "128KiB")
        assert r.returncode != 0
        assert "No space left on device" in r.stderr, r.stderr
        assert ".tar" in r.stderr and str(out) in r.stderr, r.stderr
        assert "panicked" not in r.stderr
        no_shard_without_index(out)
        if shard_files(out):  # what was completed is a usable dataset
            seen, _, report = coverage(str(out))
            assert len(seen) > 0 and report["skipped_count"] == 0
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# --- object storage that never answers ---------------------------------------------------------

def silent_server():
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()

    def close():
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        srv.close()

    return srv.getsockname()[1], held, close


def run_python(code, timeout):
    env = dict(os.environ, STOKER_OBJECT_TIMEOUT="2")
    r = run_bounded([sys.executable, "-c", textwrap.dedent(code)], timeout, env=env,
                    hang="no error: a stalled object store hangs the loader")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_stalled_object_store_is_a_clear_error_within_a_bound():
    port, held, close = silent_server()
    try:
        out = run_python(f"""
            import json, time, stoker
            t = time.monotonic()
            try:
                stoker.ImageLoader("http://127.0.0.1:{port}/x/shard-000000.tar", 4, preset="imagenet-val",
                                   output="numpy")
                out = {{"error": None}}
            except stoker.StokerError as e:
                out = {{"error": type(e).__name__, "message": str(e)}}
            out["seconds"] = time.monotonic() - t
            print(json.dumps(out))
        """, timeout=90)
    finally:
        close()
    assert out["error"] is not None, out
    assert "127.0.0.1" in out["message"] and "shard-000000.tar" in out["message"], out
    assert "timed out" in out["message"], out
    # 2 s per request, at most 2 x 2 s before the last retry: about 4-6 s, bounded well under 30.
    assert out["seconds"] < 30, out
    assert len(held) >= 2, "the request was retried"


class StallRanges(SimpleHTTPRequestHandler):
    """Serves files (HEAD, whole GETs) but never answers a ranged GET: samples stall."""

    def do_GET(self):
        if "Range" in self.headers:
            self.server.stall.wait()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


def test_stalled_sample_reads_end_in_bounded_time_and_drop_does_not_wait(demo, tmp_path):
    src = tmp_path / "src"
    for _, cls, path in images(demo)[:: 24]:
        (src / cls).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, src / cls / path.name)
    shards = tmp_path / "shards"
    assert cli("pack", src, shards).returncode == 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(StallRanges, directory=str(shards)))
    server.stall = threading.Event()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/shard-000000.tar"
    try:
        out = run_python(f"""
            import json, time, stoker
            loader = stoker.ImageLoader("{url}", 2, preset="imagenet-val", output="numpy", io_threads=4)
            out = {{"samples": loader.num_samples}}
            t = time.monotonic()
            try:
                out["delivered"] = sum(len(y) for _, y in loader)
                out["report"] = loader.report()
            except stoker.StokerError as e:
                out["error"] = str(e)
            out["seconds"] = time.monotonic() - t
            # Dropped while its reads are stalled: waits for them at most one request's bound.
            # (Past the store's cool-down first: its circuit, shared by every loader of the
            # process, refuses requests for one request bound after it opened.)
            time.sleep(2.5)
            loader = stoker.ImageLoader("{url}", 2, preset="imagenet-val", output="numpy", io_threads=4)
            it = loader.batches()
            time.sleep(0.5)
            t = time.monotonic()
            del it, loader
            out["drop_seconds"] = time.monotonic() - t
            print(json.dumps(out))
        """, timeout=120)
    finally:
        server.stall.set()
        server.shutdown()
        server.server_close()
    assert out["samples"] == 4
    # Every read fails after its bound: skipped with a reason, or the loader's error; never a hang.
    if "error" not in out:
        assert out["delivered"] == 0 and out["report"]["skipped_count"] == 4, out
        text = json.dumps(out["report"]["skipped"]).lower()
        assert "shard-000000.tar" in text and "timed out" in text, out
    else:
        assert "timed out" in out["error"], out
    assert out["seconds"] < 40, out
    assert out["drop_seconds"] < 15, out
