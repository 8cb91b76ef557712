"""Pinned batch digests: the exact bytes stoker delivers for fixed inputs and seeds, written down
once (from main at 3ddf101, before this session's changes) so that any change of layout,
reliability fix or refactor that alters a single byte of a batch fails here.

Inputs are made by stoker itself (`make_demo`, deterministic) and by NumPy's seeded generator;
the shard case packs the demo with `stoker pack`. To print the digests of the installed
package instead of checking them: `STOKER_PRINT_DIGESTS=1 pytest -s python/tests/test_digests.py`.
Digests are SHA-256 of every batch's images/columns and labels in delivery order."""

import os
import subprocess
import sys

import numpy as np
import pytest
import stoker
from helpers import digest

PINNED = {
    "train": "1d8c3e65f6386b8791f2f241f854ff7ec1b475152b3edff65d804a3b0fa414f5",
    "val": "2ab3344f1e520b9a667a74b740c336481031a995e616e5202aed643db7e01f74",
    "train-uint8-nhwc": "5c16cddd4418cc7a4be3757a7658fd49edf26007f16b8494174838541bb5406b",
    "val-float16": "68180204dda167c963609baae87411a8b0ae145d159134c13db42e3a02a97ba8",
    "train-rank1of2-epoch3": "9514678e87ca4b91b5911ebb23cd9d6e1d8d2ba8d3382a50f22a2326283a1447",
    "cached-train": "119b13b97ad65244239a9b07d9f88d41dbefb297d73f0cd1be3640cb1b91177d",
    "shards-train": "1d8c3e65f6386b8791f2f241f854ff7ec1b475152b3edff65d804a3b0fa414f5",
    "arrays": "c4898376b2926bad0c7b443cea057d6285fb8a81eeffce2d8c34bab5f07139c3",
    "arrays-resumed": "cb35ce843cb8a204915bad5a89dd40152390c2b0198e62a1768995a7a140bb46",
}


@pytest.fixture(scope="module")
def shards(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("pinned-shards") / "packed"
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(out), "--shard-size", "1MiB"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def image_case(name, demo, shards, tmp_path):
    kw = dict(batch_size=16, shuffle=True, seed=7, output="numpy", threads=2)
    if name == "train":
        return stoker.ImageLoader(demo, preset="imagenet-train", **kw)
    if name == "val":
        return stoker.ImageLoader(demo, preset="imagenet-val", **{**kw, "shuffle": False})
    if name == "train-uint8-nhwc":
        return stoker.ImageLoader(demo, preset="imagenet-train", dtype="uint8", layout="NHWC", **kw)
    if name == "val-float16":
        return stoker.ImageLoader(demo, preset="imagenet-val", dtype="float16", **kw)
    if name == "train-rank1of2-epoch3":
        loader = stoker.ImageLoader(demo, preset="imagenet-train", rank=1, world_size=2, drop_last=True, **kw)
        loader.set_epoch(3)
        return loader
    if name == "cached-train":
        return stoker.ImageLoader(demo, preset="imagenet-train", cache=tmp_path / "cache", **kw)
    if name == "shards-train":
        return stoker.ImageLoader(shards, preset="imagenet-train", **kw)
    raise AssertionError(name)


def array_case(name):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((500, 3, 7)).astype(np.float32)
    y = rng.integers(0, 1000, 500)
    loader = stoker.ArrayLoader(x, y, batch_size=48, shuffle=True, seed=5, output="numpy", threads=2)
    if name == "arrays-resumed":
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        del it
        loader = stoker.ArrayLoader(x, y, batch_size=48, shuffle=True, seed=5, output="numpy", threads=1)
        loader.load_state_dict(state)
    return loader


@pytest.mark.parametrize("name", list(PINNED))
def test_batches_are_the_pinned_bytes(name, demo, shards, tmp_path):
    loader = array_case(name) if name.startswith("arrays") else image_case(name, demo, shards, tmp_path)
    got = digest(loader)
    if name == "cached-train":
        # The cache's second pass (pixels read from the entries) gives the same bytes.
        assert digest(loader) == got
    if name == "shards-train":
        # Shards packed from the folder give the folder's batches.
        assert got == PINNED["train"]
    if os.environ.get("STOKER_PRINT_DIGESTS"):
        print(f'\n    "{name}": "{got}",')
        return
    assert got == PINNED[name], f"{name}: batches changed"
