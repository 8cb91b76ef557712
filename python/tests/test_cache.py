"""The decoded-pixel cache from Python and the CLI: counts, bit-identity with the uncached
full-resolution path, two processes sharing one cache, argument errors."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import stoker

COUNTS = ("hits", "misses", "stored", "read_bytes", "decode_seconds_saved")


def epoch_arrays(loader, epoch):
    """One epoch's batches, and the cache report with this epoch's counts (report() counts
    since the loader was made)."""
    before = loader.report().get("cache")
    loader.set_epoch(epoch)
    out = [(np.array(x, copy=True), np.array(y, copy=True)) for x, y in loader]
    rep = loader.report().get("cache")
    if rep is not None and before is not None:
        rep = {**rep, **{k: rep[k] - before[k] for k in COUNTS}}
    return out, rep


def same(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert np.array_equal(ya, yb)
        assert xa.tobytes() == xb.tobytes()


def test_epochs_after_the_first_hit_and_batches_equal_the_full_resolution_path(demo, tmp_path):
    kw = dict(batch_size=16, preset="imagenet-train", shuffle=True, seed=5, output="numpy")
    cached = stoker.ImageLoader(demo, cache=tmp_path / "c", cache_bytes="1GiB", **kw)
    plain = stoker.ImageLoader(demo, dct_scaling=False, roi=False, **kw)
    default = stoker.ImageLoader(demo, **kw)
    for e in range(3):
        got, rep = epoch_arrays(cached, e)
        want, _ = epoch_arrays(plain, e)
        same(got, want)
        if e == 0:
            assert (rep["hits"], rep["misses"], rep["stored"]) == (0, 96, 96), rep
        else:
            assert (rep["hits"], rep["misses"], rep["stored"]) == (96, 0, 0), rep
            assert rep["read_bytes"] > 0 and rep["decode_seconds_saved"] > 0, rep
        assert rep["budget_bytes"] == 1 << 30 and 0 < rep["used_bytes"] <= 1 << 30
    # The claim is about the full-resolution path: the default (DCT-scaled, region) decode differs.
    with pytest.raises(AssertionError):
        same(epoch_arrays(default, 1)[0], epoch_arrays(plain, 1)[0])
    assert "cache" in cached.report_text() and "hits" in cached.report_text()
    assert stoker.ImageLoader(demo, **kw).report().get("cache") is None


def bench(root, *flags):
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "bench", str(root), "--json", "--batch-size", "16",
                        "--preset", "imagenet-train", "--dtype", "uint8", "--threads", "2", *flags],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_two_processes_share_one_cache_and_the_second_decodes_nothing(demo, tmp_path):
    cache = str(tmp_path / "shared")
    first = bench(demo, "--cache", cache, "--epochs", "2")
    assert (first["cache"]["hits"], first["cache"]["misses"]) == (96, 96), first["cache"]
    assert [e["images"] for e in first["per_epoch"]] == [96, 96]
    second = bench(demo, "--cache", cache, "--cache-bytes", "1GiB")
    assert (second["cache"]["hits"], second["cache"]["misses"], second["cache"]["stored"]) == (96, 0, 0)
    assert second["cache"]["decode_seconds_saved"] > 0
    uncached = bench(demo, "--no-dct-scaling", "--no-roi")
    assert second["digest"] == uncached["digest"]
    assert uncached["cache"] is None


def test_ram_cache(tmp_path, demo):
    root = tmp_path / "small" / "c"
    root.mkdir(parents=True)
    for f in sorted((demo / "rocket").iterdir())[:4]:
        shutil.copy(f, root / f.name)
    shm = f"/dev/shm/stoker-cache-{os.getuid()}"
    existed = os.path.isdir(shm)
    loader = stoker.ImageLoader(root.parent, batch_size=2, preset="imagenet-val", cache="ram",
                                cache_bytes="64MiB", output="numpy")
    try:
        epoch_arrays(loader, 0)
        _, rep = epoch_arrays(loader, 1)
        assert rep["dir"].startswith("/dev/shm/") and (rep["hits"], rep["misses"]) == (4, 0), rep
    finally:
        if not existed:  # the test made it: leave /dev/shm as it was
            shutil.rmtree(shm, ignore_errors=True)


def test_cache_arguments_are_checked(demo, tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(stoker.ConfigError, match="`cache`.*a-file"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache=tmp_path / "a-file" / "sub")
    with pytest.raises(stoker.ConfigError, match="`cache_bytes`"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache=tmp_path / "c", cache_bytes="lots")
    with pytest.raises(stoker.ConfigError, match="`cache_bytes`: needs cache"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache_bytes="1GiB")
    with pytest.raises(stoker.ConfigError, match="`cache`"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache=3)  # type: ignore[arg-type]
    with pytest.raises(stoker.ConfigError, match="`cache_max_side`: needs cache"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache_max_side=256)
    with pytest.raises(stoker.ConfigError, match="`cache_max_side`"):
        stoker.ImageLoader(demo, 8, preset="imagenet-val", cache=tmp_path / "c", cache_max_side=0)
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "bench", str(demo), "--cache", str(tmp_path / "c"),
                        "--cache-bytes", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--cache-bytes" in r.stderr, r.stderr


def test_two_processes_filling_one_cache_at_once_share_its_budget(demo, tmp_path):
    cache, budget = tmp_path / "c", 20 << 20
    cmd = [sys.executable, "-m", "stoker.cli", "bench", str(demo), "--json", "--batch-size", "16", "--preset",
           "imagenet-train", "--dtype", "uint8", "--threads", "2", "--epochs", "2", "--cache", str(cache),
           "--cache-bytes", str(budget)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    uncached = bench(demo, "--epochs", "2", "--no-dct-scaling", "--no-roi")
    for o in outs:
        assert o["digest"] == uncached["digest"]
        assert o["cache"]["used_bytes"] <= budget and o["cache"]["hits"] > 0, o["cache"]
    on_disk = sum(f.stat().st_size for f in cache.rglob("*.px"))
    assert 0 < on_disk <= budget
    assert not list(cache.rglob(".tmp-*")), "no temporary file is left behind"


def test_a_max_side_cache_reads_what_it_filled_and_stays_close_to_full_resolution(demo, tmp_path):
    kw = dict(batch_size=16, preset="imagenet-val", shuffle=True, seed=2, output="numpy", dtype="uint8")
    filling = stoker.ImageLoader(demo, cache=tmp_path / "c", cache_max_side=160, **kw)
    first, rep = epoch_arrays(filling, 0)
    assert (rep["misses"], rep["stored"], rep["max_side"]) == (96, 96, 160), rep
    # A second loader (another process would do the same) only hits, and gets the same batches.
    reading = stoker.ImageLoader(demo, cache=tmp_path / "c", cache_max_side=160, **kw)
    again, rep = epoch_arrays(reading, 0)
    same(again, first)
    assert (rep["hits"], rep["misses"]) == (96, 0), rep
    # Entries hold at most 160 px on a side, so far fewer bytes than full resolution.
    full = stoker.ImageLoader(demo, cache=tmp_path / "full", **kw)
    want, rep_full = epoch_arrays(full, 0)
    assert rep["used_bytes"] < rep_full["used_bytes"] / 2, (rep, rep_full)
    diff = np.mean([np.abs(a.astype(int) - b.astype(int)).mean() for (a, _), (b, _) in zip(first, want)])
    assert diff < 8.0, diff
