"""The Python API: shapes, determinism, resume, sharding, zero-copy, GIL, shutdown, errors."""

import gc
import json
import os
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import stoker
from helpers import digest, run_bounded
from stoker import transforms as T


@pytest.mark.wheel
def test_shapes_dtypes_and_labels(demo):
    loader = stoker.ImageLoader(demo, batch_size=16, preset="imagenet-val", output="numpy")
    assert len(loader) == 6
    assert loader.classes == sorted(p.name for p in demo.iterdir())
    assert loader.class_to_idx == {c: i for i, c in enumerate(loader.classes)}
    files = [(c, f) for c in loader.classes for f in sorted((demo / c).iterdir())]
    seen = []
    for images, labels in loader:
        assert isinstance(images, np.ndarray) and images.dtype == np.float32
        assert images.shape == (16, 3, 224, 224)
        assert labels.dtype == np.int64 and labels.shape == (16,)
        assert -2.2 <= images.min() and images.max() <= 2.7
        seen.extend(labels.tolist())
    # Unshuffled: dataset order, labels as ImageFolder assigns them.
    assert seen == [loader.class_to_idx[c] for c, _ in files]


def test_explicit_transforms_dtypes_and_layouts(demo):
    tf = [T.Resize(64), T.CenterCrop((48, 40)), T.RandomHorizontalFlip(0.0)]
    loader = stoker.ImageLoader(demo, 8, transforms=tf, output="numpy", layout="NHWC")
    images, _ = next(iter(loader))
    assert images.shape == (8, 48, 40, 3) and images.dtype == np.uint8
    loader = stoker.ImageLoader(demo, 8, transforms=tf + [T.ToDtype("float16")], output="numpy")
    images, _ = next(iter(loader))
    assert images.shape == (8, 3, 48, 40) and images.dtype == np.float16
    assert 0.0 <= images.min() and images.max() <= 1.0
    u8 = stoker.ImageLoader(demo, 8, transforms=tf, output="numpy", layout="NCHW")
    f32 = stoker.ImageLoader(demo, 8, transforms=tf + [T.ToTensor()], output="numpy")
    a, _ = next(iter(u8))
    b, _ = next(iter(f32))
    np.testing.assert_allclose(a.astype(np.float32) / 255.0, b, atol=1e-6)


def test_same_seed_same_batches_whatever_the_thread_count(demo):
    def run(threads, seed=7, epoch=0):
        loader = stoker.ImageLoader(demo, 16, preset="imagenet-train", shuffle=True, seed=seed,
                                    threads=threads, output="numpy")
        loader.set_epoch(epoch)
        return digest(loader)

    assert run(1) == run(2) == run(3)
    assert run(2) != run(2, seed=8)
    assert run(2) != run(2, epoch=1)


def test_state_dict_resumes_exactly(demo):
    def make():
        return stoker.ImageLoader(demo, 8, preset="imagenet-train", shuffle=True, seed=3, output="numpy")

    ref = make()
    ref.set_epoch(2)
    batches = [(x.copy(), y.copy()) for x, y in ref]
    assert len(batches) == 12
    for stop in (0, 1, 5, 11, 12):
        a = make()
        a.set_epoch(2)
        it = iter(a)
        for _ in range(stop):
            next(it)
        state = json.loads(json.dumps(a.state_dict()))
        del it
        assert state["next_batch"] == stop and state["epoch"] == 2
        b = make()
        b.load_state_dict(state)
        b.set_epoch(2)  # the usual call at the top of the epoch loop keeps the position
        rest = [(x.copy(), y.copy()) for x, y in b] if stop < 12 else []
        assert len(rest) == 12 - stop
        for (x, y), (rx, ry) in zip(rest, batches[stop:], strict=True):
            np.testing.assert_array_equal(x, rx)
            np.testing.assert_array_equal(y, ry)
    with pytest.raises(stoker.ConfigError, match="seed"):
        make().load_state_dict({"seed": 99, "epoch": 0, "next_batch": 0})


@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_cover_every_sample_once_with_equal_batch_counts(demo, drop_last):
    world = 4
    seen, counts = [], []
    for rank in range(world):
        loader = stoker.ImageLoader(demo, 6, preset="imagenet-val", shuffle=True, seed=5, rank=rank,
                                    world_size=world, drop_last=drop_last, output="numpy")
        n = 0
        for b in loader.batches():
            seen.extend(b.indices)
            n += 1
        counts.append(n)
        assert n == len(loader)
    assert len(set(counts)) == 1
    # 96 samples / 4 ranks = 24 each = 4 batches of 6: every sample exactly once.
    assert sorted(seen) == list(range(96))


def test_rank_and_world_size_default_to_torchrun_env(demo, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    loader = stoker.ImageLoader(demo, 4, preset="imagenet-val")
    assert (loader.rank, loader.world_size, loader.local_rank) == (2, 3, 1)
    assert loader.state_dict()["world_size"] == 3


def test_numpy_is_zero_copy_and_held_batches_keep_their_values(big_demo):
    loader = stoker.ImageLoader(big_demo, 4, preset="imagenet-train", shuffle=True, output="numpy",
                                prefetch=2)
    native = loader._native
    addresses = set(native.buffer_addresses())
    it = iter(loader)
    held_x, held_y = next(it)
    assert held_x.ctypes.data in addresses, "the array's memory is one of the pool's buffers"
    assert not held_x.flags["OWNDATA"]
    snapshot = held_x.copy(), held_y.copy()
    for _ in range(50):
        x, y = next(it)
        assert x.ctypes.data in addresses and x.ctypes.data != held_x.ctypes.data
        del x, y
    np.testing.assert_array_equal(held_x, snapshot[0])
    np.testing.assert_array_equal(held_y, snapshot[1])
    assert native.held >= 1
    del held_x, held_y
    gc.collect()
    assert native.held == 0
    it.close()


def test_holding_every_buffer_raises_instead_of_hanging(demo):
    loader = stoker.ImageLoader(demo, 4, preset="imagenet-val", output="numpy",
                                memory_limit=2 * 4 * 3 * 224 * 224 * 4)
    it = iter(loader)
    keep = [next(it), next(it)]
    t = time.monotonic()
    with pytest.raises(stoker.MemoryLimitError, match="the consumer holds all 2 batch buffers"):
        next(it)
    assert time.monotonic() - t < 5
    assert len(keep) == 2


def test_gil_is_released_while_the_loader_works(big_demo):
    """A second Python thread runs while `next()` waits for a batch. Scheduling-independent:
    with the GIL held during a wait, the ticker could not record a single tick inside that
    wait, whatever the machine's load; with it released, it ticks inside most long waits."""
    loader = stoker.ImageLoader(big_demo, 64, preset="imagenet-train", threads=1, output="numpy")
    ticks, stop = [], threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    windows = []
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        windows.append((t0, time.perf_counter()))
    stop.set()
    t.join()
    assert len(windows) == 5
    ticks_arr = np.array(ticks)
    long_waits = [(a, b) for a, b in windows if b - a > 0.02]
    inside = [int(((ticks_arr > a) & (ticks_arr < b)).sum()) for a, b in long_waits]
    assert long_waits, "decoding a batch of 64 takes longer than 20 ms"
    assert sum(n > 0 for n in inside) * 2 >= len(long_waits), f"ticks inside each long wait: {inside}"


KEYBOARD_CHILD = textwrap.dedent("""
    import _thread, gc, signal, sys, threading, time
    # Ctrl-C as a terminal gives it, whatever this process inherited: started in the background
    # by a script (`cmd &`), SIGINT is ignored and interrupt_main() does nothing. That, not
    # stoker, was the interrupt lost after ~100 tests in a fresh-clone run.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, sys.argv[2])
    import stoker
    from helpers import new_stoker_threads, stoker_threads

    # Only stoker's own threads are counted: a baseline of all threads would count threads that
    # other code (a timer, PyTorch) is still starting or stopping.
    before = stoker_threads()
    loader = stoker.ImageLoader(sys.argv[1], 8, preset="imagenet-train", threads=2, output="numpy")
    timer = threading.Timer(0.3, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 60:  # bounded: a lost interrupt is reported, not waited for
            for _batch in loader:
                time.sleep(0.02)
        print("interrupt lost")
        sys.exit(1)
    except KeyboardInterrupt:
        pass
    timer.join()
    _batch = None
    print("after interrupt", sorted(new_stoker_threads(before, within=2)))
    # An iterator abandoned half-way, then `del loader` mid-epoch.
    it = iter(loader)
    next(it)
    print("running", bool(stoker_threads() - before))
    del it
    gc.collect()
    print("after del it", sorted(new_stoker_threads(before)))
    it = iter(loader)
    next(it)
    del loader
    del it
    gc.collect()
    print("after del loader", sorted(new_stoker_threads(before)))
""")


def test_keyboard_interrupt_and_del_stop_every_thread(big_demo):
    # In a child process with a time-out: a lost interrupt must fail the test, never hang the
    # suite (see test_reliability_interrupt.py for the stress test of every moment an interrupt
    # can land).
    r = run_bounded([sys.executable, "-c", KEYBOARD_CHILD, str(big_demo), os.path.dirname(__file__)], timeout=180,
                    peak_rss=1536 << 20, address_space=1 << 40, hang="the keyboard-interrupt test hung")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert r.stdout.splitlines() == ["after interrupt []", "running True", "after del it []",
                                     "after del loader []"], r.stdout


def test_abandoned_iteration_then_new_epoch(demo):
    loader = stoker.ImageLoader(demo, 8, preset="imagenet-train", shuffle=True, output="numpy")
    it = iter(loader)
    next(it)
    next(it)
    loader.set_epoch(1)
    assert sum(1 for _ in loader) == 12
    # A finished epoch iterated again replays it (as DataLoader does without set_epoch).
    assert sum(1 for _ in loader) == 12


def test_fork_after_creating_a_loader_does_not_deadlock(demo):
    loader = stoker.ImageLoader(demo, 8, preset="imagenet-val", output="numpy")
    it = iter(loader)
    next(it)  # worker threads are running in the parent
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # A new iteration in the child follows the parent's rules: the epoch from its
            # first batch (12 of them), whatever the parent's iterator had consumed.
            code = 0 if sum(1 for _ in loader) == 12 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    assert sum(1 for _ in it) == 11


def test_bad_samples_skip_by_default_and_raise_on_request(bad_demo):
    loader = stoker.ImageLoader(bad_demo, 8, preset="imagenet-val", output="numpy")
    total = sum(len(y) for _, y in loader)
    assert total == 96
    report = loader.report()
    assert report["skipped_count"] == 5
    reasons = {os.path.basename(s["path"]): s["reason"] for s in report["skipped"]}
    assert "empty file" in reasons["zz_empty.jpg"]
    assert "not an image" in reasons["zz_text.jpg"]
    assert "truncated" in reasons["zz_truncated.jpg"]
    assert "No such file" in reasons["zz_missing.jpg"]
    assert "skipped 5 bad sample(s)" in loader.report_text()
    assert report["bottleneck"]["stage"] in {"consumer", "decode", "ops", "storage", "buffers", "delivery", "cpu"}
    # The CPU clocks beside the stages' wall times: the decode threads' CPU is the process's.
    cpu = report["cpu"]
    assert 0 < cpu["workers_seconds"] <= cpu["process_seconds"] and cpu["allowance"] >= 1, cpu

    # Regression: with one decoder fed by two I/O threads, a TurboJPEG handle reused after a
    # failed decode reported stale dimensions, so good files were skipped (about 1 run in 2).
    for _ in range(12):
        again = stoker.ImageLoader(bad_demo, 8, preset="imagenet-val", threads=1, io_threads=2, output="numpy")
        assert sum(len(y) for _, y in again) == 96
        assert again.report()["skipped_count"] == 5

    strict = stoker.ImageLoader(bad_demo, 8, preset="imagenet-val", on_error="raise", output="numpy")
    with pytest.raises((stoker.DecodeError, stoker.ReadError), match="chelsea/zz_") as e:
        for _ in strict:
            pass
    assert isinstance(e.value, stoker.StokerError)


def test_bad_arguments_name_the_argument(demo, tmp_path):
    cases = [
        (dict(preset="imagenet-tran"), "preset"),
        (dict(), "preset"),
        (dict(preset="imagenet-val", transforms=[]), "transforms"),
        (dict(preset="imagenet-val", batch_size=0), "batch_size"),
        (dict(preset="imagenet-val", threads=0), "threads"),
        (dict(preset="imagenet-val", threads="many"), "threads"),
        (dict(preset="imagenet-val", on_error="ignore"), "on_error"),
        (dict(preset="imagenet-val", output="jax"), "output"),
        (dict(preset="imagenet-val", memory_limit="lots"), "memory_limit"),
        (dict(preset="imagenet-val", memory_limit=1000), "memory limit"),
        (dict(preset="imagenet-val", rank=4, world_size=4), "rank"),
        (dict(preset="imagenet-val", layout="CHW"), "layout"),
        (dict(transforms=[T.Resize(10)]), "CenterCrop"),
        (dict(transforms=[T.CenterCrop(8), T.Normalize([0.5] * 3, [0.0] * 3)]), "std"),
        (dict(transforms=["RandomCrop"]), "transforms"),
    ]
    for kwargs, needle in cases:
        kwargs.setdefault("batch_size", 4)
        with pytest.raises(stoker.StokerError, match=needle):
            stoker.ImageLoader(demo, **kwargs)
    with pytest.raises(stoker.ConfigError) as e:
        stoker.ImageLoader(demo, 4, preset="imagenet-val", on_error="ignore")
    assert isinstance(e.value, ValueError) and "skip, raise" in str(e.value)
    with pytest.raises(stoker.DatasetError, match="no such file or folder"):
        stoker.ImageLoader(tmp_path / "missing", 4, preset="imagenet-val")
    (tmp_path / "empty" / "cls").mkdir(parents=True)
    with pytest.raises(stoker.DatasetError, match="no image files"):
        stoker.ImageLoader(tmp_path / "empty", 4, preset="imagenet-val")
    with pytest.raises(stoker.MemoryLimitError):
        stoker.ImageLoader(demo, 4, preset="imagenet-val", memory_limit="1KiB")


@pytest.mark.wheel
def test_dlpack_protocol_details(demo):
    loader = stoker.ImageLoader(demo, 4, preset="imagenet-val", output="numpy")
    batch = next(iter(loader.batches()))
    assert batch.images.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        batch.images.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        batch.images.__dlpack__(dl_device=(2, 0))
    cap = batch.images.__dlpack__()
    del cap  # an unconsumed capsule frees its reference
    arr = np.from_dlpack(batch.labels)
    assert arr.ctypes.data == batch.labels.data_ptr
    assert len(batch) == 4 and batch.index == 0 and batch.indices == [0, 1, 2, 3]


@pytest.mark.wheel
def test_cli_is_installed_with_the_package(demo):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "stoker.cli", "bench", str(demo), "--batch-size", "16", "--json"],
                       capture_output=True, text=True, check=True)
    out = json.loads(r.stdout)
    assert out["images"] == 96 and out["digest"]
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "bench", str(demo), "--preset", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "imagenet-train, imagenet-val" in r.stderr
