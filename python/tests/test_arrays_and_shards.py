"""ArrayLoader, tar shards through the Python API, and multi-process rank sharding."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import stoker


@pytest.fixture(scope="module")
def arrays(tmp_path_factory):
    d = tmp_path_factory.mktemp("arrays")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 3, 5)).astype(np.float32)
    y = rng.integers(0, 10, 1000)
    np.save(d / "x.npy", x)
    return d / "x.npy", x, y


@pytest.mark.wheel
def test_array_batches_are_the_sampler_rows(arrays):
    path, x, y = arrays
    loader = stoker.ArrayLoader(path, y, batch_size=64, shuffle=True, seed=3, output="numpy", threads=2)
    assert len(loader) == 16
    seen = []
    for xb, yb in loader:
        assert xb.dtype == np.float32 and xb.shape[1:] == (3, 5) and yb.dtype == y.dtype
        seen.append((xb.copy(), yb.copy()))
    ref = stoker.ArrayLoader(x, np.arange(1000), batch_size=64, shuffle=True, seed=3, output="numpy", threads=1)
    for (xb, yb), (_, idx) in zip(seen, ref, strict=True):
        np.testing.assert_array_equal(xb, x[idx])
        np.testing.assert_array_equal(yb, y[idx])
    assert sorted(np.concatenate([s[1] for s in seen]).tolist()) == sorted(y.tolist())


def test_an_array_loader_reports_its_batches_rows_and_stages(arrays):
    path, x, y = arrays
    loader = stoker.ArrayLoader(path, y, batch_size=64, output="numpy", threads=2)
    assert sum(1 for _ in loader) == 16
    r = loader.report()
    assert (r["batches"], r["samples"], r["columns"]) == (16, 1000, 2), r
    assert r["bytes_copied"] == x.nbytes + y.nbytes
    assert [s["name"] for s in r["stages"]] == ["copy", "buffer wait", "consumer"]
    assert r["stages"][2]["items"] == 16 and r["wall_seconds"] > 0
    assert r["bottleneck"]["stage"] in {"consumer", "copy", "buffers"} and r["bottleneck"]["suggestion"]
    assert r["device"]["used"] == "cpu" and r["transfer"] is None and r["tuning"] is None
    text = loader.report_text()
    assert text.startswith("1000 rows in ") and "16 batches of 2 array(s)" in text, text


def test_array_resume_and_rank_sharding(arrays):
    _, x, _ = arrays
    idx = np.arange(1000)

    def make(**kw):
        return stoker.ArrayLoader(idx, batch_size=50, shuffle=True, seed=1, output="numpy", **kw)

    full = [b[0].copy() for b in make()]
    a = make()
    it = iter(a)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(a.state_dict()))
    del it
    b = make()
    b.load_state_dict(state)
    rest = [r[0].copy() for r in b]
    assert len(rest) == 13
    for u, v in zip(rest, full[7:], strict=True):
        np.testing.assert_array_equal(u, v)
    seen = []
    for rank in range(4):
        loader = make(rank=rank, world_size=4)
        assert len(loader) == 5
        seen.extend(np.concatenate([r[0].copy() for r in loader]).tolist())
    assert sorted(seen) == list(range(1000))


def test_array_zero_copy_and_errors(arrays, tmp_path):
    path, x, y = arrays
    loader = stoker.ArrayLoader(path, batch_size=10, output="numpy")
    b = next(iter(loader.batches()))
    arr = np.from_dlpack(b.column(0))
    assert arr.ctypes.data == b.column(0).data_ptr and not arr.flags["OWNDATA"]
    with pytest.raises(stoker.ConfigError, match="same length"):
        stoker.ArrayLoader(x, y[:10])
    with pytest.raises(stoker.ConfigError, match="C-contiguous"):
        stoker.ArrayLoader(x.transpose(2, 1, 0))
    with pytest.raises(stoker.ConfigError, match="unsupported dtype"):
        stoker.ArrayLoader(np.zeros(10, dtype=np.complex64))
    (tmp_path / "bad.npy").write_bytes(b"not numpy")
    with pytest.raises(stoker.DecodeError, match="bad.npy"):
        stoker.ArrayLoader(tmp_path / "bad.npy")
    np.save(tmp_path / "t.npy", x)
    raw = (tmp_path / "t.npy").read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(stoker.DecodeError, match="truncated"):
        stoker.ArrayLoader(tmp_path / "t.npy")


def _rows(loader):
    return np.concatenate([b[0].copy() for b in loader])


def test_arrays_come_through_the_buffer_protocol_never_as_addresses(tmp_path):
    import array

    from stoker import _stoker

    x = np.arange(24, dtype=np.float32).reshape(12, 2)
    args = json.dumps({"batch_size": 4})
    # The native class reads memory only from an export it holds: a tuple with an address
    # (what the Python layer used to pass) is refused.
    with pytest.raises(stoker.ConfigError, match=r"arrays\[0\].*tuple"):
        _stoker.ArrayLoader([(x.ctypes.data, 12, 8, "<f4", [2], x)], args)
    # Anything that exports a C-contiguous buffer is read in place, with its element type.
    cases = [
        (bytes(range(12)), np.arange(12, dtype=np.uint8)),
        (bytearray(range(12)), np.arange(12, dtype=np.uint8)),
        (array.array("d", range(12)), np.arange(12, dtype=np.float64)),
        (memoryview(x), x),
        (np.arange(12, dtype=np.int16) > 5, np.arange(12) > 5),
    ]
    for obj, want in cases:
        got = _rows(stoker.ArrayLoader(obj, batch_size=5, output="numpy"))
        assert got.dtype == want.dtype and np.array_equal(got, want), type(obj)
    np.save(tmp_path / "x.npy", x)
    ro = np.load(tmp_path / "x.npy", mmap_mode="r")
    assert not ro.flags["WRITEABLE"]
    assert np.array_equal(_rows(stoker.ArrayLoader(ro, batch_size=5, output="numpy")), x)
    with pytest.raises(stoker.ConfigError, match=r"arrays\[1\].*unsupported dtype"):
        stoker.ArrayLoader(x, x.astype(">f4"))
    with pytest.raises(stoker.ConfigError, match="C-contiguous.*ascontiguousarray"):
        stoker.ArrayLoader(x[::2])
    with pytest.raises(stoker.ConfigError, match="0-d"):
        stoker.ArrayLoader(np.float32(1.0))


def test_the_loader_holds_the_export_so_the_memory_cannot_move():
    buf = bytearray(range(10))
    loader = stoker.ArrayLoader(buf, batch_size=4, output="numpy")
    with pytest.raises(BufferError):
        buf.extend(b"more")  # would reallocate the memory the loader reads
    assert _rows(loader).tolist() == list(range(10))
    del loader
    buf.extend(b"more")  # released with the loader


@pytest.mark.parametrize("shape", ["(3, 6148914691236517206)", "(6148914691236517206, 3)",
                                   "(2, 4611686018427387904)", "(18446744073709551615,)"])
def test_npy_shapes_whose_size_overflows_are_errors(tmp_path, shape):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape
    header += " " * (-(len(header) + 11) % 64) + "\n"
    data = b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + bytes(64)
    (tmp_path / "big.npy").write_bytes(data)
    with pytest.raises(stoker.DecodeError, match="big.npy.*(too large|truncated)"):
        stoker.ArrayLoader(tmp_path / "big.npy")


@pytest.fixture(scope="module")
def shards(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("shards")
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(out), "--shard-size", "1MiB",
                        "--json"], capture_output=True, text=True, check=True)
    summary = json.loads(r.stdout)
    assert summary["samples"] == 96 and len(summary["shards"]) >= 2
    return out


@pytest.mark.wheel
def test_shards_give_the_same_batches_as_the_folder(demo, shards):
    kw = dict(batch_size=16, preset="imagenet-train", shuffle=True, seed=9, output="numpy")
    a = [(x.copy(), y.copy()) for x, y in stoker.ImageLoader(demo, **kw)]
    for root in (str(shards / "shard-*.tar"), sorted(str(p) for p in shards.glob("*.tar"))):
        loader = stoker.ImageLoader(root, **kw)
        assert loader.classes == sorted(p.name for p in demo.iterdir())
        b = [(x.copy(), y.copy()) for x, y in loader]
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)


def test_a_pack_folder_is_a_dataset(demo, shards):
    """What `stoker pack` writes (shards, indexes, classes.json) loads by its folder name, with
    the shards in name order: the same batches as the ImageFolder it came from."""
    kw = dict(batch_size=16, preset="imagenet-val", output="numpy")
    a = [(x.copy(), y.copy()) for x, y in stoker.ImageLoader(demo, **kw)]
    loader = stoker.ImageLoader(shards, **kw)
    assert loader.classes == stoker.ImageLoader(demo, **kw).classes
    assert loader.num_samples == 96
    b = [(x.copy(), y.copy()) for x, y in loader]
    assert len(a) == len(b) == 6
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    # And from the command line: `stoker bench DIR` on the pack folder.
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "bench", str(shards), "--json", "--batch-size", "16",
                        "--preset", "imagenet-val", "--no-shuffle", "--threads", "2"],
                       capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["images"] == 96 and out["classes"] == len(loader.classes) and out["skipped_count"] == 0


def test_bad_shard_paths(shards, tmp_path):
    with pytest.raises(stoker.DatasetError, match="no file matches"):
        stoker.ImageLoader(str(tmp_path / "none-*.tar"), 4, preset="imagenet-val")
    with pytest.raises(stoker.DatasetError, match="no such file or folder"):
        stoker.ImageLoader(str(tmp_path / "missing"), 4, preset="imagenet-val")
    with pytest.raises(stoker.ConfigError, match="`root`"):
        stoker.ImageLoader([], 4, preset="imagenet-val")
    (tmp_path / "lonely.tar").write_bytes(b"\0" * 1024)
    with pytest.raises(stoker.DatasetError, match="stoker index"):
        stoker.ImageLoader(str(tmp_path / "lonely.tar"), 4, preset="imagenet-val")


def _shard_sizes(shards):
    import tarfile

    sizes = []
    for p in sorted(shards.glob("*.tar")):
        with tarfile.open(p) as t:
            sizes.append(sum(1 for m in t.getmembers() if m.name.endswith(".jpg")))
    return sizes


def test_shard_aware_shuffle_is_deterministic_resumable_and_sharded(demo, shards):
    root = str(shards / "shard-*.tar")

    def make(**kw):
        return stoker.ImageLoader(root, 6, preset="imagenet-val", shuffle="shards", shard_window=1, seed=2,
                                  output="numpy", **kw)

    order = [i for b in make().batches() for i in b.indices]
    assert sorted(order) == list(range(96))
    assert order != list(range(96))
    assert order == [i for b in make().batches() for i in b.indices]
    # With a window of one shard, the shards are read one after the other (each once).
    sizes = _shard_sizes(shards)
    assert len(sizes) >= 2 and sum(sizes) == 96
    starts = np.cumsum([0] + sizes)
    shard_of = np.searchsorted(starts, order, side="right") - 1
    assert len(np.flatnonzero(np.diff(shard_of) != 0)) == len(sizes) - 1
    # Resume from batch 5.
    a = make()
    it = a.batches()
    for _ in range(5):
        next(it)
    state = a.state_dict()
    del it
    b = make()
    b.load_state_dict(state)
    assert [i for x in b.batches() for i in x.indices] == order[30:]
    # Ranks in shard-aware mode still cover every sample once.
    seen = []
    for rank in range(3):
        seen += [i for x in make(rank=rank, world_size=3).batches() for i in x.indices]
    assert sorted(seen) == list(range(96))
    with pytest.raises(stoker.ConfigError, match="tar shards"):
        stoker.ImageLoader(demo, 6, preset="imagenet-val", shuffle="shards")
    with pytest.raises(stoker.ConfigError, match="shuffle"):
        stoker.ImageLoader(root, 6, preset="imagenet-val", shuffle="random")


RANK_SCRIPT = """
import json, os, sys, stoker
root = sys.argv[1]
loader = stoker.ImageLoader(root, 5, preset="imagenet-val", shuffle=True, seed=4, drop_last=True, output="numpy")
out = {"rank": loader.rank, "batches": 0, "indices": []}
for b in loader.batches():
    out["batches"] += 1
    out["indices"].extend(b.indices)
print(json.dumps(out))
"""


@pytest.mark.parametrize("source", ["folder", "shards"])
def test_ranks_in_separate_processes_cover_every_sample_once(demo, shards, source):
    root = str(demo) if source == "folder" else str(shards / "shard-*.tar")
    world = 4
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, root], env=env, stdout=subprocess.PIPE,
                                      text=True))
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert sorted(r["rank"] for r in results) == list(range(world))
    assert len({r["batches"] for r in results}) == 1
    seen = sorted(i for r in results for i in r["indices"])
    # 96 samples, 4 ranks of 24, batches of 5 with drop_last: 4 batches each, 80 distinct samples.
    assert len(seen) == len(set(seen)) == 80
