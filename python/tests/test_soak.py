"""Soak: 30 epochs in one process, used the way training scripts use a loader (a new iterator
per epoch, ``set_epoch``, a ``state_dict`` saved and loaded, an epoch abandoned halfway, batches
kept for a while), with the process's RSS read after every epoch. The pools are fixed, so RSS
must be flat once the first epochs have touched every buffer: within 5% of epoch 2's after
epoch 2. A leak of one batch buffer, one decoder or one sample's bytes per epoch fails it."""

import importlib.util
import json
import sys
import textwrap

import pytest
from helpers import run_bounded

EPOCHS = 30

SOAK = """
import json, os, sys
import numpy as np
import stoker

kind, output, root = sys.argv[1], sys.argv[2], sys.argv[3]
page = os.sysconf("SC_PAGE_SIZE")

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

if kind == "images":
    loader = stoker.ImageLoader(root, 16, preset="imagenet-train", output=output, shuffle=True, seed=5,
                                threads=2, prefetch=2)
else:
    x = np.random.default_rng(0).standard_normal((20000, 64)).astype(np.float32)
    loader = stoker.ArrayLoader(x, np.arange(20000), batch_size=512, shuffle=True, output=output, threads=2)
n_batches = len(loader)
out, kept = [], []
for epoch in range(EPOCHS):
    loader.set_epoch(epoch)
    seen = 0
    for i, batch in enumerate(loader):
        seen += len(batch[-1])
        kept.append(batch)          # hold a few batches, as metrics/logging code does
        if len(kept) > 2:
            kept.pop(0)
        if epoch % 7 == 3 and i == n_batches // 2:
            state = loader.state_dict()
            break                   # abandon the epoch halfway (a preemption) ...
    else:
        assert seen, "an epoch delivered nothing"
    if epoch % 7 == 3:
        loader.load_state_dict(json.loads(json.dumps(state)))
        for batch in loader:        # ... and resume it from the saved state
            pass
    kept.clear()
    out.append(rss())
print(json.dumps(out))
""".replace("EPOCHS", str(EPOCHS))

OUTPUTS = ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else [])


@pytest.mark.parametrize("output", OUTPUTS)
@pytest.mark.parametrize("kind", ["images", "arrays"])
def test_thirty_epochs_keep_rss_flat(demo, kind, output):
    r = run_bounded([sys.executable, "-c", textwrap.dedent(SOAK), kind, output, str(demo)], 600,
                    peak_rss=2 << 30, address_space=16 << 30)
    assert r.returncode == 0, r.stderr
    rss = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rss) == EPOCHS
    base = rss[2]
    worst = max(rss[2:])
    mib = [round(v / 2**20, 1) for v in rss]
    assert worst <= base * 1.05, f"RSS grew {worst / base - 1:.1%} after epoch 2 (MiB per epoch: {mib})"
