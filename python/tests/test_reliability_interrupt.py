"""Ctrl-C always reaches the user: hundreds of interrupts (a real SIGINT and `_thread.interrupt_main`)
at random moments of iteration (waiting for a batch, converting it, starting and abandoning
iterators, between epochs, loading a state), each of which must surface as KeyboardInterrupt.

A lost interrupt leaves the loop running; the child notices (the timer fired, 5 s went by without
a KeyboardInterrupt) and counts it. An interrupt raised inside a destructor or a weakref callback
is swallowed by Python as "unraisable": the child records those too. Runs in a subprocess with a
time-out, so a lost interrupt can never hang the suite."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import run_bounded

CHILD = textwrap.dedent("""
    import _thread, gc, json, os, random, signal, sys, threading, time
    # Ctrl-C as a terminal gives it. A process started in the background by a non-interactive
    # shell (`cmd &` in a script, as CI and test scripts do) inherits SIGINT ignored, and then
    # neither SIGINT nor interrupt_main() does anything: every interrupt would be "lost".
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, sys.argv[4])
    import stoker
    from helpers import new_stoker_threads, stoker_threads

    root, n, output = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    swallowed = []
    sys.unraisablehook = lambda u: swallowed.append(f"{u.exc_type.__name__} in {u.object!r}")
    before = stoker_threads()
    loader = stoker.ImageLoader(root, 4, preset="imagenet-train", shuffle=True, threads=2, output=output)
    rng = random.Random(0)
    surfaced = lost = 0
    for k in range(n):
        fired = threading.Event()
        real = k % 2 == 0

        def fire(real=real, fired=fired):
            if real:
                os.kill(os.getpid(), signal.SIGINT)
            else:
                _thread.interrupt_main()
            fired.set()

        timer = threading.Timer(rng.uniform(0.0, 0.06), fire)
        try:
            timer.start()
            deadline = None
            while True:
                mode = rng.randrange(5)
                if mode == 0:  # a whole epoch, batches converted and dropped
                    for images, labels in loader:
                        pass
                    images = labels = None
                elif mode == 1:  # a peek: an iterator abandoned after one batch
                    it = iter(loader)
                    next(it)
                    del it
                elif mode == 2:  # a new epoch, batches kept a little
                    loader.set_epoch(k)
                    kept = [b for _, b in zip(range(2), loader)]
                    del kept
                elif mode == 3:  # resume from a state
                    loader.load_state_dict(loader.state_dict())
                    for _ in zip(range(2), loader):
                        pass
                else:  # garbage collection between epochs, with a live iterator
                    it = iter(loader)
                    gc.collect()
                    next(it)
                if fired.is_set():
                    if deadline is None:
                        deadline = time.monotonic() + 5
                    elif time.monotonic() > deadline:
                        break
        except KeyboardInterrupt:
            surfaced += 1
        else:
            lost += 1
            if lost >= 3:
                break
        timer.join()
    # Whatever an interrupt left bound (a live iterator of the last round, batches) goes too.
    it = images = labels = kept = None
    del loader
    gc.collect()
    leftover = sorted(new_stoker_threads(before, within=2))
    print(json.dumps({"surfaced": surfaced, "lost": lost, "swallowed": swallowed, "leftover": leftover}))
""")


@pytest.fixture(scope="module")
def tiny(demo, tmp_path_factory):
    """12 images: epochs of 3 batches, so that interrupts often land at the end of an epoch,
    when an iterator is finished and dropped (where a weakref callback once swallowed them)."""
    root = tmp_path_factory.mktemp("tiny") / "data"
    for cls in sorted(os.listdir(demo))[:3]:
        os.makedirs(root / cls)
        for f in sorted(os.listdir(demo / cls))[:4]:
            shutil.copy(demo / cls / f, root / cls / f)
    return root


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_every_interrupt_surfaces(tiny, output):
    if output == "torch":
        pytest.importorskip("torch")
    here = os.path.dirname(__file__)
    n = 300
    r = run_bounded([sys.executable, "-c", CHILD, str(tiny), str(n), output, here], timeout=240,
                    peak_rss=1536 << 20, address_space=1 << 40, hang="the interrupt stress test hung")
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"surfaced": n, "lost": 0, "swallowed": [], "leftover": []}, got


def test_threads_stop_and_interrupts_surface_beside_cpu_hogs(tiny):
    """The thread-count and interrupt checks again, while two processes spin on every core: the
    counts must not depend on how promptly a loaded host schedules the exiting threads (only
    stoker's own threads are counted, each joined before `del` returns)."""
    here = os.path.dirname(__file__)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        r = run_bounded([sys.executable, "-c", CHILD, str(tiny), "60", "numpy", here], timeout=240,
                        peak_rss=1536 << 20, address_space=1 << 40, hang="the interrupt test beside CPU hogs hung")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got == {"surfaced": 60, "lost": 0, "swallowed": [], "leftover": []}, got
