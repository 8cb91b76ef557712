"""The Python side of GPU batches (placement, CUDA DLPack export and its stream argument, the
device pool's held-all error, memory released on drop) against the stand-in driver
``crates/stoker-cli/tests/fake_cuda.c``, which runs copies later on a thread per stream. A test
double in CI, not a GPU: ``tests/gpu`` checks the real thing where a GPU exists. Each scenario runs
in a child process because the driver library is found through ``LD_LIBRARY_PATH`` at start-up.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json, sys
    import stoker
    from stoker import _stoker

    root = sys.argv[1]
    # The arguments of a uint8 loader (no torch needed: the native classes are used directly).
    args = json.dumps({"batch_size": 16, "preset": "imagenet-val", "dtype": "uint8"})
    host = _stoker.Loader([root], args, "cpu", 0)
    expected = [(None, b.indices) for b in host.iter()]  # the bytes are compared by the CLI's test
    native = _stoker.Loader([root], args, "cuda", 0)
    assert native.device == "cuda:0" and native.host_memory == "pinned", (native.device, native.host_memory)
    dev, pinned = stoker.cuda_memory_in_use()
    assert dev > 0 and pinned > 0, (dev, pinned)
    n = 0
    for k, b in enumerate(native.iter()):
        assert b.device == "cuda:0"
        assert b.images.__dlpack_device__() == (2, 0) and b.labels.__dlpack_device__() == (2, 0)
        assert b.indices == expected[k][1]
        # The protocol's stream values: None (legacy default), 1, 2, -1 (no sync), a stream handle.
        for s in (None, 1, 2, -1):
            b.images.__dlpack__(stream=s)
        for bad in ({"dl_device": (1, 0)}, {"copy": True}, {"stream": -7}, {"stream": "x"}):
            try:
                b.images.__dlpack__(**bad)
            except BufferError:
                pass
            else:
                raise AssertionError(f"{bad} accepted")
        n += 1
    assert n == len(expected), (n, len(expected))
    report = json.loads(native.report_json())
    assert report["device"]["used"] == "cuda:0"
    assert report["transfer"]["bytes"] > 0
    # Holding every device buffer and asking for more is an error, not a hang.
    held = []
    try:
        for b in native.iter():
            held.append(b)
    except stoker.MemoryLimitError as e:
        assert "device batch buffers are held" in str(e), e
    else:
        raise AssertionError(f"held {len(held)} batches of {native.device_slots} slots without an error")
    del held, b, native, host
    gc.collect()
    assert stoker.cuda_memory_in_use() == (0, 0), stoker.cuda_memory_in_use()
    print("ok", n)
""")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fake CUDA driver")
    out = tmp_path_factory.mktemp("fakecuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(out / "libcuda.so"),
                    str(ROOT / "crates/stoker-cli/tests/fake_cuda.c")], check=True)
    return out


def test_gpu_batches_through_the_python_classes(fake_driver, demo_root):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_COPY_DELAY_US="2000")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(demo_root)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok "), r.stdout


def test_cuda_probe_sees_the_driver(fake_driver):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver))
    code = "import json, stoker; print(json.dumps(stoker.cuda_probe()))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    probe = json.loads(r.stdout)
    assert probe["driver_library"] and probe["cuda_driver_version"] == 12000
    assert len(probe["devices"]) == 1
