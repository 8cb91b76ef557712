"""Values nobody used to check: every one that crosses into the engine (environment variables,
sizes, thread counts, a state dict handed back) is checked once, in ``stoker::args``, and a bad
one is a ``ConfigError`` naming it and what is allowed, never ignored, never a panic, a Rust
backtrace or an OS failure further in ("internal error: ..."). Each case runs in a subprocess
(a timeout, an address-space limit and a bound on its peak RSS; see ``helpers.run_bounded``),
so an abort or a hang fails the test instead of pytest."""

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import run_bounded

TIMEOUT = 120

# What a case prints: the exception's class and message, or "ok" and what the loader did.
RUN = """
import json, sys
import numpy as np
import stoker
kind, kw = sys.argv[1], json.loads(sys.argv[2])
try:
    if kind == "images":
        loader = stoker.ImageLoader(sys.argv[3], kw.pop("batch_size", 8), preset="imagenet-val", output="numpy", **kw)
    elif kind == "url":
        loader = stoker.ImageLoader("http://127.0.0.1:9/shard-*.tar", 8, preset="imagenet-val", output="numpy")
    elif kind == "local_rank":
        print(json.dumps({"ok": stoker.ImageLoader(sys.argv[3], 8, preset="imagenet-val", output="numpy").local_rank}))
        sys.exit(0)
    else:
        loader = stoker.ArrayLoader(np.arange(40, dtype=np.float32).reshape(20, 2), output="numpy", **kw)
    n = sum(len(batch[-1]) for batch in loader)
    print(json.dumps({"ok": n, "threads": loader.threads}))
except Exception as e:
    print(json.dumps({"type": type(e).__name__, "message": str(e)}))
"""


def run(kind: str, root: Path | None = None, env: dict[str, str] | None = None, **kw: Any) -> dict[str, Any]:
    """Runs case ``kind`` in a subprocess with ``env`` added to the environment; the child must
    exit normally and print no Rust panic or backtrace."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("STOKER_NUM_THREADS", "STOKER_SHARED_BUDGET", "STOKER_BUDGET_FILE", "STOKER_OBJECT_TIMEOUT",
                         "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    full.update(env or {})
    full["RUST_BACKTRACE"] = "1"  # a panic would print its backtrace: the check below would see it
    r = run_bounded([sys.executable, "-c", RUN, kind, json.dumps(kw), str(root)], TIMEOUT, env=full)
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stderr}"
    for sign in ("panicked", "stack backtrace", "internal error", "RUST_BACKTRACE"):
        assert sign not in r.stderr and sign not in r.stdout, f"{sign!r} in the output:\n{r.stdout}\n{r.stderr}"
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def assert_config_error(out: dict[str, Any], *names: str) -> str:
    assert out.get("type") == "ConfigError", out
    msg: str = out["message"]
    for name in names:
        assert name in msg, msg
    return msg


@pytest.mark.parametrize("value", ["abc", "1e9", "0", "-2", "100000", "2.5"])
@pytest.mark.parametrize("kind", ["images", "arrays"])
def test_a_bad_stoker_num_threads_is_a_config_error(demo, kind, value):
    out = run(kind, demo, {"STOKER_NUM_THREADS": value})
    msg = assert_config_error(out, "`STOKER_NUM_THREADS`", repr(value).replace("'", '"'), "from 1 to 1024")
    assert "internal error" not in msg


@pytest.mark.parametrize("kind", ["images", "arrays"])
def test_stoker_num_threads_is_used_when_valid(demo, kind):
    out = run(kind, demo, {"STOKER_NUM_THREADS": " 3 "})
    assert out["threads"] == 3 and out["ok"] in (96, 20), out


@pytest.mark.parametrize("env, name", [
    ({"STOKER_SHARED_BUDGET": "maybe"}, "`STOKER_SHARED_BUDGET`"),
    ({"STOKER_BUDGET_FILE": "DIR"}, "`STOKER_BUDGET_FILE`"),
    ({"STOKER_BUDGET_FILE": "DIR/missing/budget"}, "`STOKER_BUDGET_FILE`"),
    ({"WORLD_SIZE": "four"}, "`WORLD_SIZE`"),
    ({"WORLD_SIZE": "0"}, "`WORLD_SIZE`"),
    ({"RANK": "-1"}, "`RANK`"),
])
def test_a_bad_environment_variable_is_a_config_error(demo, tmp_path, env, name):
    env = {k: v.replace("DIR", str(tmp_path)) for k, v in env.items()}
    out = run("images", demo, env)
    assert_config_error(out, name, "environment variable")


def test_a_good_budget_file_is_used(demo, tmp_path):
    out = run("images", demo, {"STOKER_BUDGET_FILE": str(tmp_path / "budget"), "STOKER_SHARED_BUDGET": "on"})
    assert out["ok"] == 96, out
    assert (tmp_path / "budget").exists()


def test_a_bad_local_rank_is_a_config_error(demo):
    assert_config_error(run("local_rank", demo, {"LOCAL_RANK": "abc"}), "`LOCAL_RANK`")
    assert_config_error(run("local_rank", demo, {"LOCAL_RANK": "99999999999"}), "`LOCAL_RANK`")
    assert run("local_rank", demo, {"LOCAL_RANK": "3"}) == {"ok": 3}


@pytest.mark.parametrize("value", ["soon", "0", "-5", "nan", "1e9"])
def test_a_bad_object_timeout_is_a_config_error(value):
    # Checked before any request is made: the unreachable URL is never contacted.
    out = run("url", None, {"STOKER_OBJECT_TIMEOUT": value})
    assert_config_error(out, "`STOKER_OBJECT_TIMEOUT`", "positive number of seconds")


@pytest.mark.parametrize("kind", ["images", "arrays"])
@pytest.mark.parametrize("batch_size", [2**62, 2**64 - 1])
def test_a_batch_size_beyond_memory_is_a_config_error(demo, kind, batch_size):
    out = run(kind, demo, batch_size=batch_size)
    msg = assert_config_error(out, "`batch_size`", "lower batch_size")
    assert "capacity overflow" not in msg


def test_an_array_batch_beyond_this_machine_is_a_memory_error(demo):
    # 10**13 rows of 8 bytes: 80 TB, within any address space but beyond this machine: the
    # allocation fails cleanly (the row size is the array loader's to check).
    out = run("arrays", demo, batch_size=10**13)
    assert out.get("type") in ("ConfigError", "MemoryLimitError"), out
    assert "80000000000000" in out["message"] or "`batch_size`" in out["message"], out


def test_an_image_batch_buffer_beyond_memory_is_a_config_error(demo):
    # 10**9 samples of 224x224x3 float32: 548 TiB, more than any address space.
    out = run("images", demo, batch_size=10**9)
    assert_config_error(out, "`batch_size`", "more than any machine can hold")


@pytest.mark.parametrize("kw, name", [
    (dict(threads=100000), "`threads`"),
    (dict(io_threads=100000), "`io_threads`"),
    (dict(prefetch=2**64 - 1), "`prefetch`"),
    (dict(cpu_budget=5000), "`cpu_budget`"),
])
def test_thread_counts_are_bounded(demo, kw, name):
    out = run("images", demo, **kw)
    msg = assert_config_error(out, name)
    assert "cannot start a thread" not in msg


# Each hand-edited state is loaded in the same child; the result per case is printed.
STATES = """
import json, sys
import numpy as np
import stoker
loader = stoker.ImageLoader(sys.argv[1], 8, preset="imagenet-val", output="numpy", shuffle=True, seed=3)
good = loader.state_dict()
out = {}

def edit(path, value):
    s = json.loads(json.dumps(good))
    at = s
    for k in path[:-1]:
        at = at[k]
    if value == "DELETE":
        del at[path[-1]]
    else:
        at[path[-1]] = value
    return s

circular = dict(good)
circular["fingerprint"] = circular
cases = {
    "next_batch=-1": edit(["next_batch"], -1),
    "next_batch=2**70": edit(["next_batch"], 2**70),
    "next_batch=99": edit(["next_batch"], 99),
    "next_batch='3'": edit(["next_batch"], "3"),
    "seed=-5": edit(["seed"], -5),
    "seed=True": edit(["seed"], True),
    "epoch=1.5": edit(["epoch"], 1.5),
    "epoch=None": edit(["epoch"], None),
    "epoch=nan": edit(["epoch"], float("nan")),
    "epoch=object": edit(["epoch"], object()),
    "version=9": edit(["version"], 9),
    "version='2'": edit(["version"], "2"),
    "no next_batch": edit(["next_batch"], "DELETE"),
    "no fingerprint": edit(["fingerprint"], "DELETE"),
    "fingerprint='x'": edit(["fingerprint"], "x"),
    "fingerprint.samples=-1": edit(["fingerprint", "samples"], -1),
    "fingerprint.batch_size=0": edit(["fingerprint", "batch_size"], 0),
    "fingerprint.drop_last=0": edit(["fingerprint", "drop_last"], 0),
    "fingerprint.samples=95": edit(["fingerprint", "samples"], 95),
    "world_size=0": edit(["world_size"], 0),
    "circular": circular,
    "list": [1, 2, 3],
    "numpy ints": {**good, "epoch": np.int64(2), "next_batch": np.uint8(5)},
    "untouched": good,
}
for name, state in cases.items():
    try:
        loader.load_state_dict(state)
        out[name] = {"ok": list(loader._base().state())}
    except Exception as e:
        out[name] = {"type": type(e).__name__, "message": str(e)}
print(json.dumps(out))
"""


def test_hand_edited_state_dicts_are_config_errors_naming_the_field(demo):
    env = dict(os.environ, RUST_BACKTRACE="1")
    r = run_bounded([sys.executable, "-c", STATES, str(demo)], TIMEOUT, env=env)
    assert r.returncode == 0, r.stderr
    assert "panicked" not in r.stderr and "backtrace" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    named = {
        "next_batch=-1": "`state['next_batch']`: expected a non-negative integer, got -1",
        "next_batch=2**70": "`state['next_batch']`",
        "next_batch='3'": "`state['next_batch']`",
        "seed=-5": "`state['seed']`",
        "seed=True": "`state['seed']`: expected a non-negative integer, got True",
        "epoch=1.5": "`state['epoch']`",
        "epoch=None": "`state['epoch']`",
        "version=9": "`state['version']`: expected 1, 2 or 3",
        "version='2'": "`state['version']`",
        "no next_batch": "no 'next_batch'",
        "no fingerprint": "no 'fingerprint'",
        "fingerprint='x'": "`state['fingerprint']`",
        "fingerprint.samples=-1": "`state['fingerprint']['samples']`",
        "fingerprint.batch_size=0": "`state['fingerprint']['batch_size']`",
        "fingerprint.drop_last=0": "`state['fingerprint']['drop_last']`",
        "fingerprint.samples=95": "saved with samples=95",
        "world_size=0": "`state['world_size']`",
        "next_batch=99": "next_batch 99 exceeds the 12 batches",
        "epoch=nan": "`state`",
        "epoch=object": "`state`",
        "circular": "`state`",
        "list": "`state[0]`: expected a dict from state_dict(), got 1",  # a list: every rank's states
    }
    for case, text in named.items():
        got = out[case]
        assert got.get("type") == "ConfigError", (case, got)
        assert text in got["message"], (case, got)
    # Integer-like values (NumPy integers) are integers; a good state loads.
    assert out["numpy ints"] == {"ok": [3, 2, 5]}, out["numpy ints"]
    assert out["untouched"] == {"ok": [3, 0, 0]}, out["untouched"]
