"""What clusters and evaluation loops meet, per loader kind: a consumer that keeps every batch
(`list(loader)`) is served while the batches fit in `memory_limit` and refused past it with an
error that says how much it holds; every numeric argument refuses text, floats and booleans
with a `ConfigError` naming it (NumPy integers stay fine); ranks come from an initialised
`torch.distributed` group and a disagreement with torchrun's variables is an error naming both.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import stoker

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
GPT2 = DATA / "tokenizer-gpt2.json"
SAMPLE = DATA / "wiki-sample.jsonl.zst"

# --- a consumer that keeps its batches ----------------------------------------------------


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory):
    """80 short documents (real English sentences of the shared sample) as JSON Lines."""
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(SAMPLE.open("rb")).read()
    texts = [json.loads(line)["text"] for line in raw.decode().splitlines() if line.strip()]
    sentences = [s.strip() + "." for t in texts for s in t.split(". ") if 20 < len(s) < 200][:80]
    assert len(sentences) == 80
    path = tmp_path_factory.mktemp("held") / "docs.jsonl"
    path.write_text("".join(json.dumps({"text": s}) + "\n" for s in sentences))
    return path


def test_a_token_loader_serves_a_consumer_that_keeps_every_batch(jsonl):
    """The issue: `list(TokenLoader(...))` over 80 small documents (1 KiB batches) was refused
    at four held batches; now it gets the same batches a streaming consumer gets."""
    kw = dict(tokenizer=GPT2, seq_len=64, batch_size=1, output="numpy")
    streamed = [b["input_ids"].copy() for b in stoker.TokenLoader(jsonl, **kw)]
    kept = list(stoker.TokenLoader(jsonl, **kw))
    assert len(kept) == len(streamed) > 8
    assert all(np.array_equal(k["input_ids"], s) for k, s in zip(kept, streamed))
    # The byte limit still holds: 8 KiB holds 8 batches of 64 x 4 arrays x 4 bytes (+ cu_seqlens).
    loader = stoker.TokenLoader(jsonl, **kw, memory_limit=8 * 1040)
    it = iter(loader)
    held = []
    with pytest.raises(stoker.MemoryLimitError, match=r"the consumer holds all 8 batch buffers") as e:
        for b in it:
            held.append(b)
    assert len(held) == 8
    assert "memory_limit" in str(e.value)


def test_an_image_loader_serves_a_consumer_that_keeps_every_batch(demo):
    kw = dict(batch_size=8, preset="imagenet-val", dtype="uint8", output="numpy", threads=2)
    streamed = [x.copy() for x, _ in stoker.ImageLoader(demo, **kw)]
    kept = list(stoker.ImageLoader(demo, **kw))
    assert len(kept) == len(streamed) > 4
    assert all(np.array_equal(x, s) for (x, _), s in zip(kept, streamed))
    batch = 8 * 3 * 224 * 224
    it = iter(stoker.ImageLoader(demo, **kw, memory_limit=5 * batch))
    held = [next(it) for _ in range(5)]
    with pytest.raises(stoker.MemoryLimitError, match=r"the consumer holds all 5 batch buffers \(5\.7 MiB"):
        next(it)
    assert len(held) == 5


def test_an_array_loader_serves_a_consumer_that_keeps_every_batch():
    x = np.arange(64 * 1000, dtype=np.float32).reshape(1000, 64)
    kept = list(stoker.ArrayLoader(x, batch_size=10, output="numpy"))
    assert len(kept) == 100
    assert np.array_equal(np.concatenate([b for (b,) in kept]), x)
    it = iter(stoker.ArrayLoader(x, batch_size=10, output="numpy", memory_limit=6 * 2560))
    held = [next(it) for _ in range(6)]
    with pytest.raises(stoker.MemoryLimitError, match="the consumer holds all 6 batch buffers"):
        next(it)
    assert len(held) == 6


# --- numeric arguments are numbers -------------------------------------------------------

IMAGE_INTEGERS = ["batch_size", "seed", "shard_window", "threads", "io_threads", "prefetch", "rank", "world_size",
                  "max_pixels", "max_failures", "cache_max_side", "trace_events"]
IMAGE_SIZES = ["memory_limit", "max_file_bytes", "cache_bytes"]
TOKEN_INTEGERS = ["seq_len", "batch_size", "pack_window", "seed", "shuffle_window", "threads", "prefetch", "rank",
                  "world_size", "token_bytes", "eos_id", "pad_id", "max_failures", "trace_events"]
TOKEN_SIZES = ["memory_limit", "max_document_bytes", "cache_bytes"]
ARRAY_INTEGERS = ["batch_size", "seed", "threads", "prefetch", "rank", "world_size"]


def _image(demo, **kw):
    stoker.ImageLoader(demo, **{"batch_size": 4, "preset": "imagenet-val", "output": "numpy", **kw})


def _tokens(path, **kw):
    stoker.TokenLoader(path, **{"eos_id": 0, "seq_len": 16, "batch_size": 2, "output": "numpy", **kw})


def _arrays(**kw):
    stoker.ArrayLoader(np.zeros((16, 4), np.float32), **{"batch_size": 4, "output": "numpy", **kw})


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("ints") / "train.bin"
    np.arange(1, 200, dtype=np.uint16).tofile(path)
    return path


def _refused(make, name, value):
    with pytest.raises(stoker.ConfigError, match=f"invalid argument `{name}`") as e:
        make(**{name: value})
    return str(e.value)


@pytest.mark.parametrize("value", ["2", 2.0, True], ids=["str", "float", "bool"])
def test_every_numeric_argument_refuses_text_floats_and_booleans(demo, token_file, tmp_path, value):
    extra = {"cache_max_side": {"cache": str(tmp_path / "c")}, "trace_events": {"trace": str(tmp_path / "t.json")},
             "cache_bytes": {"cache": str(tmp_path / "c")}}
    for name in IMAGE_INTEGERS + ([] if isinstance(value, str) else IMAGE_SIZES):
        if name == "max_failures" and isinstance(value, float):
            continue  # a fraction of the pass's samples
        message = _refused(lambda n=name, **kw: _image(demo, **extra.get(n, {}), **kw), name, value)
        assert repr(value) in message.replace('"', "'") or str(value) in message, message
    for name in TOKEN_INTEGERS + ([] if isinstance(value, str) else TOKEN_SIZES):
        _refused(lambda n=name, **kw: _tokens(token_file, **extra.get(n, {}), **kw), name, value)
    for name in ARRAY_INTEGERS + ([] if isinstance(value, str) else ["memory_limit"]):
        _refused(_arrays, name, value)
    # The number of cores may be fractional; it is still a number.
    _image(demo, cpu_budget=1.5)
    for bad in ("1.5", True):
        _refused(lambda **kw: _image(demo, **kw), "cpu_budget", bad)
        _refused(lambda **kw: _tokens(token_file, **kw), "cpu_budget", bad)


def test_numpy_integers_are_integers(token_file):
    _tokens(token_file, seq_len=np.int64(16), batch_size=np.uint8(2), seed=np.int32(3))
    _arrays(batch_size=np.int16(4), prefetch=np.int64(1))
    with pytest.raises(stoker.ConfigError, match="`seq_len`: expected a positive integer, got \"128\" \\(a str\\)"):
        _tokens(token_file, seq_len="128")


# --- ranks from a torch.distributed group ------------------------------------------------

GROUP = """
import json, os, sys, tempfile
import torch.distributed as dist
import stoker
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
out = {}
try:
    loader = stoker.ArrayLoader(__import__("numpy").zeros((8, 2)), batch_size=2, output="numpy")
    out["ranks"] = [loader.rank, loader.world_size]
except stoker.ConfigError as e:
    out["error"] = str(e)
print(json.dumps(out))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("env,expect", [
    ({}, {"ranks": [0, 1]}),
    ({"WORLD_SIZE": "1", "RANK": "0"}, {"ranks": [0, 1]}),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "world_size 1, but the environment variable WORLD_SIZE says 2"),
    ({"WORLD_SIZE": "1", "RANK": "3"}, "rank 0, but the environment variable RANK says 3"),
])
def test_ranks_come_from_the_process_group_and_must_agree_with_torchrun(env, expect):
    pytest.importorskip("torch")
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(GROUP)], env={**clean, **env}, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if isinstance(expect, dict):
        assert out == expect
    else:
        assert expect in out["error"] and "torch.distributed's default group says" in out["error"], out
