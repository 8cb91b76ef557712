"""The package as users meet it: torch is imported only when asked for, the type information
does not depend on torch, and every argument rule lives in the engine (one message each)."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import stoker

PACKAGE = Path(stoker.__file__).parent


def _run(code, *args):
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.wheel
def test_import_stoker_does_not_import_torch(demo):
    out = _run("import sys, stoker\n"
               "print('torch' in sys.modules)\n"
               "loader = stoker.ImageLoader(sys.argv[1], 16, preset='imagenet-val', output='numpy')\n"
               "for x, y in loader: pass\n"
               "print('torch' in sys.modules)\n", demo)
    assert out.split() == ["False", "False"]


@pytest.mark.wheel
def test_no_static_torch_import_in_the_package():
    """mypy sees no `import torch`, so it checks the same with or without torch installed."""
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{path.name}: {names}"


@pytest.mark.parametrize("kwargs, arg, text", [
    ({"memory_limit": "12parsecs"}, "memory_limit", "unknown unit"),
    ({"memory_limit": 0}, "memory_limit", "must be positive"),
    ({"batch_size": 0}, "batch_size", "must be at least 1"),
    ({"batch_size": True}, "batch_size", "expected a positive integer, got True"),
    ({"batch_size": 2.0}, "batch_size", "expected a positive integer"),
    ({"threads": "many"}, "threads", "'auto'"),
    ({"seed": -1}, "seed", "non-negative"),
    ({"shuffle": "yes"}, "shuffle", "'shards'"),
    ({"rank": 3, "world_size": 2}, "rank", "0..1"),
    ({"on_error": "ignore"}, "on_error", "skip, raise"),
    ({"layout": "CHWN"}, "layout", "nchw, nhwc"),
    ({"dtype": "int7"}, "dtype", "uint8, float16, float32"),
    ({"device": "gpu"}, "device", "'cuda:N'"),
    ({"device": 0}, "device", "'cuda:N'"),
    ({"preset": "imagenet-tran"}, "preset", "imagenet-train, imagenet-val"),
    ({"output": "jax"}, "output", "auto, torch, numpy"),
])
def test_argument_errors_come_from_one_place(demo, kwargs, arg, text):
    kw = {"preset": "imagenet-val", **kwargs}
    with pytest.raises(stoker.ConfigError) as e:
        stoker.ImageLoader(demo, kw.pop("batch_size", 8), **kw)
    msg = str(e.value)
    assert msg.startswith(f"invalid argument `{arg}`") and text in msg, msg
    assert msg.count("invalid argument") == 1, msg


def test_numpy_integers_pass_through(demo):
    np = pytest.importorskip("numpy")
    loader = stoker.ImageLoader(demo, np.int64(8), preset="imagenet-val", seed=np.uint32(3), output="numpy")
    assert loader.batch_size == 8 and len(loader) == 12


def test_rank_and_world_size_come_from_torchrun_environment(demo):
    env = dict(os.environ, RANK="1", WORLD_SIZE="4", LOCAL_RANK="1")
    code = ("import sys, stoker\n"
            "l = stoker.ImageLoader(sys.argv[1], 8, preset='imagenet-val', output='numpy')\n"
            "print(l.rank, l.world_size, len(l), l.local_rank)\n")
    r = subprocess.run([sys.executable, "-c", code, str(demo)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "4", "3", "1"]
    env["WORLD_SIZE"] = "four"
    r = subprocess.run([sys.executable, "-c", code, str(demo)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "WORLD_SIZE" in r.stderr and "ConfigError" in r.stderr


def test_array_loader_uses_the_same_rules():
    np = pytest.importorskip("numpy")
    x = np.zeros((10, 3), dtype=np.float32)
    with pytest.raises(stoker.ConfigError, match=r"^invalid argument `memory_limit`: unknown unit"):
        stoker.ArrayLoader(x, batch_size=2, memory_limit="3 parsecs")
    with pytest.raises(stoker.ConfigError, match=r"^invalid argument `shuffle`: expected False or True"):
        stoker.ArrayLoader(x, batch_size=2, shuffle="shards")
    assert json.loads(json.dumps(stoker.ArrayLoader(x, batch_size=4).state_dict()))["next_batch"] == 0
