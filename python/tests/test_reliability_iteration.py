"""Every call sequence a user can make has a written meaning (README: "Iteration and resume
rules"), and no fault hangs or crashes the interpreter: panics become StokerError, dead
threads are errors, stale iterators say so, fork children can drop what they inherited.
Cases that could hang run in a subprocess with a timeout, so a regression fails instead of
blocking the suite."""

import json
import os
import sys
import textwrap

import numpy as np
import pytest
import stoker
from helpers import run_bounded


def _child(code, *args, timeout=120):
    """Runs `code` in a fresh interpreter, with an address-space limit and a bound on its peak
    RSS (`helpers.run_bounded`); returns the result."""
    return run_bounded([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], timeout,
                       address_space=8 << 30)


def _loader(root, **kw):
    kw.setdefault("preset", "imagenet-val")
    kw.setdefault("output", "numpy")
    return stoker.ImageLoader(root, kw.pop("batch_size", 8), **kw)


def _indices(it):
    return [i for b in it for i in b.indices]


def test_every_iter_starts_the_epoch_at_its_first_batch(demo):
    loader = _loader(demo, shuffle=True, seed=3)
    first = next(iter(loader))  # a shape check, as users do
    assert first[0].shape == (8, 3, 224, 224)
    loader.set_epoch(0)
    assert sum(len(y) for _, y in loader) == 96, "a full pass after a peek yields the whole epoch"
    assert sum(len(y) for _, y in loader) == 96, "and so does the next one"


def test_a_loaded_state_resumes_once_then_epochs_start_over(demo):
    loader = _loader(demo, shuffle=True, seed=3)
    order = _indices(loader.batches())
    it = loader.batches()
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    assert state["next_batch"] == 5 and state["fingerprint"]["batch_size"] == 8
    state = json.loads(json.dumps(state))  # what a checkpoint file round trip does
    fresh = _loader(demo, shuffle=True, seed=3)
    fresh.load_state_dict(state)
    fresh.set_epoch(0)  # the usual call before an epoch keeps a restored position
    assert _indices(fresh.batches()) == order[40:]
    assert _indices(fresh.batches()) == order, "the next iter() starts the epoch over"


@pytest.mark.parametrize("change, field", [
    (dict(batch_size=16), "batch_size"),
    (dict(drop_last=True), "drop_last"),
    (dict(shuffle=False), "shuffle"),
    (dict(preset="imagenet-train"), "transform"),
    (dict(rank=0, world_size=2), "world_size"),
    (dict(rank=1, world_size=2), "world_size"),
])
def test_a_state_from_another_configuration_is_refused(demo, change, field):
    saved = _loader(demo, shuffle=True, seed=3).state_dict()
    kw = dict(shuffle=True, seed=3)
    kw.update(change)
    with pytest.raises(stoker.ConfigError, match=f"saved with {field}="):
        _loader(demo, **kw).load_state_dict(saved)


def test_a_state_from_another_dataset_is_refused(demo, big_demo):
    saved = _loader(demo).state_dict()
    with pytest.raises(stoker.ConfigError, match="saved with samples=96"):
        _loader(big_demo).load_state_dict(saved)


@pytest.mark.parametrize("how", ["iter", "set_epoch", "load_state_dict"])
def test_a_stale_iterator_raises_instead_of_yielding(demo, how):
    loader = _loader(demo, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    if how == "iter":
        newer = iter(loader)
    elif how == "set_epoch":
        loader.set_epoch(1)
    else:
        loader.load_state_dict(state)
    with pytest.raises(stoker.StokerError, match="stale iterator"):
        next(it)
    if how == "iter":
        assert sum(len(y) for _, y in newer) == 96, "the newer iterator has the whole epoch and every buffer"


def test_raise_policy_keeps_the_position_at_the_failing_batch(bad_demo):
    loader = stoker.ImageLoader(bad_demo, 4, preset="imagenet-val", on_error="raise", output="numpy")
    delivered = 0
    with pytest.raises(stoker.StokerError):
        for _ in loader.batches():
            delivered += 1
    assert loader.state_dict()["next_batch"] == delivered, "the saved state resumes at the failing batch"


def test_failure_budget_stops_an_epoch_whose_files_vanished(demo, tmp_path):
    import shutil

    root = tmp_path / "data"
    shutil.copytree(demo, root)
    loader = stoker.ImageLoader(root, 8, preset="imagenet-val", output="numpy", max_failures=10)
    for p in root.rglob("*.jpg"):
        p.unlink()  # the storage went away after indexing
    with pytest.raises(stoker.DatasetError, match=r"more than max_failures \(10\).*last errors"):
        for _ in loader.batches():
            pass
    # With the default budget (10%, at least 100) a pass in which every sample failed is an
    # error too, not an empty epoch.
    loader = stoker.ImageLoader(demo, 8, preset="imagenet-val", output="numpy")
    shutil.rmtree(root)
    shutil.copytree(demo, root)
    loader = stoker.ImageLoader(root, 8, preset="imagenet-val", output="numpy")
    for p in root.rglob("*.jpg"):
        p.unlink()
    with pytest.raises(stoker.DatasetError, match="every sample"):
        for _ in loader.batches():
            pass


def test_max_failures_values_are_checked(demo):
    for bad in (-1, 1.5, "lots", "200%"):
        with pytest.raises(stoker.ConfigError, match="max_failures"):
            _loader(demo, max_failures=bad)


def test_a_panicking_transform_is_an_error_not_a_hang(demo):
    r = _child("""
        import sys, stoker
        from stoker import transforms as T
        try:
            # The output size is refused when the loader is made (a ConfigError); it used to
            # reach a panic further in. Either way: a StokerError, never a PanicException.
            loader = stoker.ImageLoader(sys.argv[1], 4, transforms=[T.CenterCrop((2**32, 2**32))], output="numpy")
            for _ in loader:
                pass
        except Exception as e:          # a StokerError, never a PanicException (BaseException)
            print(type(e).__name__, isinstance(e, stoker.StokerError))
        else:
            print("no error")
        """, demo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "True", r.stdout + r.stderr


def test_a_bad_npy_header_is_an_error_not_a_panic(tmp_path):
    header = "{'descr': '\u00e9f4', 'fortran_order': False, 'shape': (10,), }".encode()
    header = header.ljust(117) + b"\n"
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + bytes(40))
    with pytest.raises(stoker.StokerError):
        stoker.ArrayLoader(tmp_path / "bad.npy", batch_size=2)


def test_array_loader_new_iteration_while_one_is_partly_consumed(tmp_path):
    r = _child("""
        import numpy as np, stoker
        x = np.arange(1000, dtype=np.float32).reshape(100, 10)
        loader = stoker.ArrayLoader(x, batch_size=10, output="numpy", prefetch=1)
        held = iter(loader)
        kept = next(held)                      # the consumer keeps a batch of the old iteration
        rows = sum(len(b) for b, in loader)    # a new iteration runs a whole epoch
        try:
            next(held)
        except stoker.StokerError as e:
            print(rows, "stale" in str(e))
        """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["100", "True"]


def test_fork_child_can_use_close_and_drop_what_it_inherited(demo):
    r = _child("""
        import gc, os, sys, stoker
        loader = stoker.ImageLoader(sys.argv[1], 8, preset="imagenet-val", output="numpy")
        it = iter(loader)
        next(it)
        pid = os.fork()
        if pid == 0:
            try:
                try:
                    next(it)
                except stoker.StokerError:
                    pass
                it.close()
                del it
                gc.collect()
                n = sum(len(y) for _, y in loader)
                os._exit(0 if n == 96 else 3)
            except BaseException:
                os._exit(4)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), sum(len(y) for _, y in loader))
        """, demo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "96"], r.stdout + r.stderr


def test_dropping_an_iterator_mid_epoch_stops_its_threads(demo):
    r = _child("""
        import os, sys, time, stoker
        def stoker_threads():
            n = 0
            for t in os.listdir("/proc/self/task"):
                try:
                    n += open(f"/proc/self/task/{t}/comm").read().startswith("stoker-")
                except OSError:  # gone between the listing and the read
                    pass
            return n
        loader = stoker.ImageLoader(sys.argv[1], 8, preset="imagenet-val", output="numpy")
        it = iter(loader)
        next(it)
        busy = stoker_threads()
        t = time.monotonic()
        del it
        took = time.monotonic() - t
        # A joined thread can stay listed for a moment after pthread_join returns (the kernel
        # clears its tid before releasing the task); let the listing catch up, briefly.
        deadline = time.monotonic() + 0.5
        while stoker_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        print(busy > 0, stoker_threads(), took < 2)
        """, demo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "0", "True"]


def test_thread_count_does_not_change_the_batches(demo):
    a = [(x.copy(), y.copy()) for x, y in _loader(demo, shuffle=True, seed=1, threads=1, preset="imagenet-train")]
    b = [(x.copy(), y.copy()) for x, y in _loader(demo, shuffle=True, seed=1, threads=3, preset="imagenet-train")]
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_state_survives_fork_child_rebuild(demo):
    r = _child("""
        import os, sys, stoker
        loader = stoker.ImageLoader(sys.argv[1], 8, preset="imagenet-val", output="numpy")
        it = loader.batches()
        for _ in range(3):
            next(it)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if loader.state_dict()["next_batch"] == 3 else 5)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """, demo)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0"]
