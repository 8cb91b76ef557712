"""The Python side of GPU batches (placement, CUDA DLPack export and its stream argument, the
device pool's held-all error, memory released on drop) against the stand-in driver
``crates/stoker-cli/tests/fake_cuda.c``, which runs copies later on a thread per stream (the
legacy default stream included), keeps a context per device and a current-context stack per
thread, and can run out of memory or fail for good on request. A test double in CI, not a GPU:
``tests/gpu`` checks the real thing where a GPU exists. Each scenario runs in a child process
because the driver library is found through ``LD_LIBRARY_PATH`` at start-up; the scenarios reach
the stand-in driver themselves through ctypes (the same library stoker loaded).
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
    # A consumer that keeps every batch: the device pool grows past its slots (within the
    # memory limit), and the batches are those of a consumer that keeps none.
    held = list(native.iter())
    assert len(held) == len(expected) > native.device_slots, (len(held), native.device_slots)
    assert [b.indices for b in held] == [e[1] for e in expected]
    # Within a memory limit of 4 device batches: past it, an error saying what is held, not a hang.
    small = _stoker.Loader([root], json.dumps({**json.loads(args), "memory_limit": 4 * 16 * 3 * 224 * 224,
                                               "prefetch": 1}), "cuda", 0)
    kept = []
    try:
        for b in small.iter():
            kept.append(b)
    except stoker.MemoryLimitError as e:
        assert "the consumer holds all" in str(e) and "batch buffers" in str(e), e
    else:
        raise AssertionError(f"held {len(kept)} batches within a limit of 4 without an error")
    del kept, small
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


@pytest.mark.wheel
def test_gpu_batches_through_the_python_classes(fake_driver, demo_root):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_COPY_DELAY_US="2000")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(demo_root)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok "), r.stdout


@pytest.mark.wheel
def test_cuda_probe_sees_the_driver(fake_driver):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver))
    code = "import json, stoker; print(json.dumps(stoker.cuda_probe()))"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    probe = json.loads(r.stdout)
    assert probe["driver_library"] and probe["cuda_driver_version"] == 12000
    assert len(probe["devices"]) == 1


# What the scenarios below share: the driver through ctypes, and the host batches to compare with.
PRELUDE = textwrap.dedent("""
    import ctypes, gc, json, os, sys
    import stoker
    from stoker import _stoker

    root = sys.argv[1]
    cuda = ctypes.CDLL("libcuda.so")
    ARGS = json.dumps({"batch_size": 16, "preset": "imagenet-val", "dtype": "uint8", "prefetch": 1})

    def check(r, what):
        assert r == 0, f"{what} -> {r}"

    def current():
        c = ctypes.c_void_p()
        check(cuda.cuCtxGetCurrent(ctypes.byref(c)), "cuCtxGetCurrent")
        return c.value

    def primary(ordinal):
        c = ctypes.c_void_p()
        check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(c), ordinal), "retain")
        return c.value

    def active(ordinal):
        flags, on = ctypes.c_uint(), ctypes.c_int()
        check(cuda.cuDevicePrimaryCtxGetState(ordinal, ctypes.byref(flags), ctypes.byref(on)), "state")
        return bool(on.value)

    def bus_id(ordinal):
        buf = ctypes.create_string_buffer(64)
        check(cuda.cuDeviceGetPCIBusId(buf, 64, ordinal), "bus id")
        return buf.value.decode()

    def read(ptr, n):
        out = ctypes.create_string_buffer(n)
        check(cuda.cuMemcpyDtoH_v2(out, ctypes.c_uint64(ptr), ctypes.c_size_t(n)), "DtoH")
        return out.raw

    def host_batches():
        import numpy as np
        host = _stoker.Loader([root], ARGS, "cpu", 0)
        out = [(np.from_dlpack(b.images).tobytes(), np.from_dlpack(b.labels).tobytes()) for b in host.iter()]
        del host
        return out
""")


def run_scenario(fake_driver, demo_root, body, timeout=120, **env):
    """Runs PRELUDE + ``body`` against the stand-in driver; returns its stdout."""
    full = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_COPY_DELAY_US="2000")
    full.pop("CUDA_VISIBLE_DEVICES", None)
    full.pop("LOCAL_RANK", None)
    full.update(env)
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(demo_root)], env=full,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\\n{r.stdout}\\n{r.stderr}"
    assert "panicked" not in r.stderr, r.stderr
    return r.stdout


def test_device_choice_follows_local_rank_and_cuda_visible_devices(fake_driver, demo_root):
    out = run_scenario(fake_driver, demo_root, """
        # Four GPUs on the machine, two visible: CUDA renumbers them 0 and 1.
        probe = stoker.cuda_probe()
        assert [d["index"] for d in probe["devices"]] == [0, 1], probe
        assert [d["pci_bus_id"] for d in probe["devices"]] == ["0000:12:00.0", "0000:13:00.0"], probe
        # 'cuda' = LOCAL_RANK (torch has not initialised CUDA), a CUDA ordinal: physical GPU 3.
        loader = stoker.ImageLoader(root, 16, preset="imagenet-val", dtype="uint8", device="cuda")
        assert loader.device == "cuda:1", loader.device
        assert active(1) and not active(0), (active(0), active(1))
        assert bus_id(1) == "0000:13:00.0"
        b = next(loader.batches())
        assert b.device == "cuda:1" and b.images.__dlpack_device__() == (2, 1)
        del b, loader
        gc.collect()
        assert not active(1), "the primary context is released with the loader"
        # 'auto' means the same device; 'cuda:N' is CUDA's ordinal N, and there are two.
        assert stoker.ImageLoader(root, 16, preset="imagenet-val", dtype="uint8", device="auto").device == "cuda:1"
        assert stoker.ImageLoader(root, 16, preset="imagenet-val", dtype="uint8", device="cuda:0").device == "cuda:0"
        try:
            _stoker.Loader([root], ARGS, "cuda:2", 0)
        except stoker.DeviceError as e:
            assert "driver sees 2 device(s)" in str(e), e
        else:
            raise AssertionError("cuda:2 opened with two visible devices")
        # PyTorch's current device wins over LOCAL_RANK once PyTorch has initialised CUDA.
        import types
        from stoker._device import device_ordinal
        fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True,
                                                                      current_device=lambda: 0))
        sys.modules["torch"] = fake_torch
        assert device_ordinal() == 0
        fake_torch.cuda.is_initialized = lambda: False
        assert device_ordinal() == 1
        print("ok")
    """, FAKE_CUDA_DEVICES="4", CUDA_VISIBLE_DEVICES="2,3", LOCAL_RANK="1")
    assert out.strip().endswith("ok"), out


def test_callers_current_context_is_left_alone(fake_driver, demo_root):
    out = run_scenario(fake_driver, demo_root, """
        # The caller (PyTorch, say) works on device 1; stoker loads onto device 0.
        mine = primary(1)
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(mine)), "push")
        native = _stoker.Loader([root], ARGS, "cuda:0", 0)
        assert current() == mine, "creating a loader changed the current context"
        n = 0
        for b in native.iter():
            for s in (None, 1, 2, -1):
                b.images.__dlpack__(stream=s)
                b.labels.__dlpack__(stream=s)
            assert current() == mine, f"batch {n} changed the current context"
            n += 1
            del b
            gc.collect()
            assert current() == mine, f"dropping batch {n} changed the current context"
        assert n > 2
        it = native.iter()
        next(it)
        it.close()
        del it, native
        gc.collect()
        assert current() == mine, "dropping the loader changed the current context"
        assert not active(0), "device 0's primary context is still retained"
        # With no context current at all, none is left current.
        check(cuda.cuCtxPopCurrent_v2(None), "pop")
        assert current() is None
        native = _stoker.Loader([root], ARGS, "cuda", 0)
        b = next(native.iter())
        b.images.__dlpack__(stream=None)
        del b, native
        gc.collect()
        assert current() is None, "stoker left a context current"
        print("ok")
    """, FAKE_CUDA_DEVICES="2")
    assert out.strip().endswith("ok"), out


def test_legacy_default_stream_work_finishes_before_the_memory_is_reused(fake_driver, demo_root):
    # The consumer reads each batch on the legacy default stream with a slow copy (200 ms); the
    # device pool has 3 slots, so batch 3 reuses batch 0's memory. Were it reused before the
    # queued read ran, the bytes read would be batch 3's.
    out = run_scenario(fake_driver, demo_root, """
        expected = host_batches()
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")
        native = _stoker.Loader([root], ARGS, "cuda:0", 0)
        assert native.device_slots == 3, native.device_slots
        reads = []
        it = native.iter()
        for k in range(6):
            b = next(it)
            b.images.__dlpack__(stream=None)  # the legacy default stream waits for the copy
            n = len(expected[k][0])
            buf = ctypes.create_string_buffer(n)
            check(cuda.cuMemcpyDtoHAsync_v2(buf, ctypes.c_uint64(b.images.data_ptr), ctypes.c_size_t(n),
                                            ctypes.c_void_p(1)), "DtoH async")
            reads.append(buf)
            del b  # released: its memory may be reused once the legacy stream passed this point
        check(cuda.cuStreamSynchronize(ctypes.c_void_p(1)), "sync")
        for k, buf in enumerate(reads):
            assert buf.raw == expected[k][0], f"batch {k} was overwritten before the legacy stream read it"
        it.close()
        print("ok")
    """, FAKE_CUDA_DTOH_DELAY_US="200000")
    assert out.strip().endswith("ok"), out


def test_labels_never_keep_the_images_buffer(fake_driver, demo_root):
    out = run_scenario(fake_driver, demo_root, """
        expected = host_batches()
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")
        native = _stoker.Loader([root], ARGS, "cuda:0", 0)
        kept = []  # every labels view and capsule of the epoch, as metrics code would keep them
        for b in native.iter():
            labels = b.labels
            kept.append((labels, labels.__dlpack__(stream=1)))
            b.images.__dlpack__(stream=1)
            del b, labels  # the images go; the labels stay
        assert len(kept) == len(expected) > native.device_slots, (len(kept), native.device_slots)
        for (labels, _), (_, want) in zip(kept, expected):
            assert labels.__dlpack_device__() == (2, 0)
            assert read(labels.data_ptr, len(want)) == want
        # Kept labels keep only their own few bytes: the pool goes with the loader.
        del native
        gc.collect()
        assert stoker.cuda_memory_in_use()[0] == len(kept) * 16 * 8, stoker.cuda_memory_in_use()
        del kept, labels, _
        gc.collect()
        assert stoker.cuda_memory_in_use() == (0, 0), stoker.cuda_memory_in_use()
        print("ok")
    """)
    assert out.strip().endswith("ok"), out


def test_out_of_device_memory_is_a_clear_error(fake_driver, demo_root):
    images = 16 * 3 * 224 * 224
    pool = 3 * (images + 16 * 8)
    out = run_scenario(fake_driver, demo_root, """
        limit = int(os.environ["FAKE_CUDA_MEM_LIMIT"])
        big = json.dumps({"batch_size": 64, "preset": "imagenet-val", "dtype": "uint8", "prefetch": 1})
        try:
            _stoker.Loader([root], big, "cuda", 0)
        except stoker.DeviceError as e:
            assert "cannot allocate" in str(e) and "out of memory" in str(e), e
        else:
            raise AssertionError("a pool larger than the device was allocated")
        gc.collect()
        assert stoker.cuda_memory_in_use() == (0, 0), stoker.cuda_memory_in_use()
        # The pool fits, with room for two batches' labels: keeping every batch's labels runs
        # the device out of memory mid-epoch, which is an error from next(), not a hang.
        native = _stoker.Loader([root], ARGS, "cuda", 0)
        kept = []
        try:
            for b in native.iter():
                kept.append(b.labels)
                del b
        except stoker.DeviceError as e:
            assert "cannot allocate" in str(e), e
            assert len(kept) == 2, len(kept)
        else:
            raise AssertionError("labels allocated past the device's memory")
        print("ok")
    """, FAKE_CUDA_MEM_LIMIT=str(pool + 2 * 16 * 8))
    assert out.strip().endswith("ok"), out


def test_a_sticky_driver_error_ends_the_iteration_with_an_error(fake_driver, demo_root):
    out = run_scenario(fake_driver, demo_root, """
        native = _stoker.Loader([root], ARGS, "cuda", 0)
        n = 0
        try:
            for b in native.iter():
                n += 1
                del b
        except stoker.DeviceError as e:
            assert "illegal memory access" in str(e), e
        else:
            raise AssertionError("a failed driver went unnoticed")
        assert n <= 3, n
        del native
        gc.collect()
        print("ok")
    """, timeout=60, FAKE_CUDA_STICKY_AFTER="4")
    assert out.strip().endswith("ok"), out


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, glob, os, sys, time

    def transfer_threads():
        names = []
        for comm in glob.glob("/proc/self/task/*/comm"):
            try:
                names.append(open(comm).read().strip())
            except OSError:
                pass
        return [n for n in names if n == "stoker-transfer"]

    def after_stokers_hook():
        # atexit runs handlers last-in first-out: this one is registered before stoker is
        # imported (which registers stoker's), so it runs after it, just before the driver goes.
        # A joined thread can stay listed in /proc for a moment after pthread_join returns (the
        # kernel clears its tid before it releases the task): give the listing 0.5 s to catch
        # up. Without stoker's hook the thread waits for a free slot forever and stays listed.
        deadline = time.monotonic() + 0.5
        while transfer_threads() and time.monotonic() < deadline:
            time.sleep(0.01)
        left = transfer_threads()
        if left:
            sys.stderr.write(f"transfer threads still running at exit: {left}\\\\n")
            sys.stderr.flush()
            os._exit(3)
        print("clean")
        sys.stdout.flush()

    atexit.register(after_stokers_hook)
    import stoker

    loader = stoker.ImageLoader(sys.argv[1], 16, preset="imagenet-val", dtype="uint8", device="cuda", prefetch=1)
    it = loader.batches()
    b = next(it)  # mid-epoch: the transfer thread is copying the next batches
    assert transfer_threads(), "the transfer thread is running"
    print("exiting")
""")


def test_interpreter_exit_with_a_live_iterator_stops_the_transfer_thread_first(fake_driver, demo_root):
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), FAKE_CUDA_COPY_DELAY_US="2000")
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(demo_root)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"exit {r.returncode}\\n{r.stdout}\\n{r.stderr}"
    assert r.stdout.split() == ["exiting", "clean"], r.stdout
    assert "panicked" not in r.stderr, r.stderr


def test_the_engine_decides_what_the_gpu_normalises(fake_driver, demo_root):
    """Batches for a GPU cross the bus as uint8; the engine (``stoker::args::image_config``)
    says what the GPU side makes of them, and the Python loader only applies it."""
    out = run_scenario(fake_driver, demo_root, """
        mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
        for dtype, want in [(None, "float32"), ("float16", "float16"), ("bfloat16", "bfloat16")]:
            loader = stoker.ImageLoader(root, 16, preset="imagenet-train", dtype=dtype, layout="NHWC",
                                        device="cuda", output="auto")
            n = json.loads(loader._loader().device_normalize_json())
            assert n["dtype"] == want and n["channels_last"] is True, n
            assert [round(x, 3) for x in n["mean"]] == mean and [round(x, 3) for x in n["std"]] == std, n
            assert loader._normalizer is not None
            b = next(loader.batches())
            assert b.images.__dlpack_device__() == (2, 0)
            del b, loader
            gc.collect()
        # uint8 asked, or the host: nothing is normalised on a GPU.
        assert json.loads(_stoker.Loader([root], ARGS, "cuda", 0).device_normalize_json()) is None
        host = stoker.ImageLoader(root, 16, preset="imagenet-val", output="numpy")
        assert json.loads(host._loader().device_normalize_json()) is None and host._normalizer is None
        try:
            stoker.ImageLoader(root, 16, preset="imagenet-val", device="cuda", output="numpy")
        except stoker.ConfigError as e:
            assert "delivers torch tensors" in str(e), e
        else:
            raise AssertionError("numpy output from a GPU loader")
        print("ok")
    """)
    assert out.strip().endswith("ok"), out


def test_mixed_batches_for_the_gpu_carry_the_host_soft_labels_and_unmixed_images(fake_driver, demo_root):
    """``batch_transform`` with ``device='cuda'``: the engine makes each batch's soft labels on the
    host and copies them to the device beside the labels (``targets`` is a device tensor equal to
    the host-mixed batch's), and leaves the images uint8 and unmixed (the host batch of the same
    seed without mixing), for the GPU side to normalise and then mix (``stoker._gpu.Mixer``)."""
    out = run_scenario(fake_driver, demo_root, """
        import numpy as np
        spec = {"mixup_alpha": 0.8, "cutmix_alpha": 1.0, "prob": 1.0, "switch_prob": 0.5, "label_smoothing": 0.1,
                "num_classes": 1000, "style": "timm"}
        base = {"batch_size": 16, "preset": "imagenet-train", "shuffle": True, "seed": 5, "prefetch": 1}
        plain = _stoker.Loader([root], json.dumps({**base, "dtype": "uint8"}), "cpu", 0)
        mixed = _stoker.Loader([root], json.dumps({**base, "dtype": "uint8", "batch_transform": spec}), "cpu", 0)
        assert json.loads(mixed.device_mix_json()) is None  # the host mixes its own batches
        want = []
        for p, h in zip(plain.iter(), mixed.iter()):
            images = np.from_dlpack(p.images).tobytes()
            assert np.from_dlpack(h.images).tobytes() != images  # mixed on the host
            want.append((images, np.from_dlpack(h.targets).tobytes(), len(p.indices)))
        assert len(want) >= 8
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")  # as a framework would
        for dtype, layout in [("uint8", "NCHW"), ("float32", "NHWC"), ("bfloat16", "NCHW")]:
            args = {**base, "dtype": dtype, "layout": layout, "batch_transform": spec}
            dev = _stoker.Loader([root], json.dumps(args), "cuda", 0)
            m = json.loads(dev.device_mix_json())
            assert m["style"] == "timm" and m["num_classes"] == 1000, m
            assert m["channels_last"] is (layout == "NHWC"), m
            n = 0
            for k, b in enumerate(dev.iter()):
                images, targets, rows = want[k]
                assert b.epoch == 0 and b.index == k and len(b.indices) == rows
                t = b.targets
                assert t.__dlpack_device__() == (2, 0) and t.shape == [rows, 1000], t.shape
                assert b.labels.__dlpack_device__() == (2, 0)
                t.__dlpack__(stream=None)  # the legacy default stream waits on the copy
                b.images.__dlpack__(stream=None)
                check(cuda.cuStreamSynchronize(ctypes.c_void_p(1)), "sync")
                assert read(t.data_ptr, len(targets)) == targets, (dtype, k)
                if layout == "NCHW":  # the images as they cross the bus: uint8, unmixed
                    assert read(b.images.data_ptr, len(images)) == images, (dtype, k)
                n += 1
            assert n == len(want), (dtype, n)
            del b, t, dev
        # Without batch_transform a device batch has no targets, and nothing is mixed there.
        dev = _stoker.Loader([root], ARGS, "cuda", 0)
        assert json.loads(dev.device_mix_json()) is None and next(dev.iter()).targets is None
        del dev, plain, mixed
        gc.collect()
        print("ok")
    """)
    assert out.strip().endswith("ok"), out


@pytest.mark.wheel
def test_token_batches_on_the_gpu_equal_the_host_batches(fake_driver, demo_root, tmp_path):
    """TokenLoader(device='cuda'): every array of every batch, read back from the device, equals
    the host loader's; the pinned and device pools are released with the loader."""
    import numpy as np

    rng = np.random.default_rng(7)
    tokens = rng.integers(0, 50000, size=20000, dtype=np.uint16)
    tokens[rng.choice(20000, size=150, replace=False)] = 50256  # document ends
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    out = run_scenario(fake_driver, demo_root, f"""
        import numpy as np
        kw = dict(seq_len=256, batch_size=4, pack="best_fit", eos_id=50256, shuffle=True, seed=3)
        host = stoker.TokenLoader({str(path)!r}, output="numpy", **kw)
        want = [(b.index, b.max_seqlen, [np.from_dlpack(b.field(f)).copy() for f in FIELDS])
                for b in host.batches()]
        gpu = stoker.TokenLoader({str(path)!r}, device="cuda", **kw)
        assert gpu.device == "cuda:0" and gpu.device_report()["used"] == "cuda:0"
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")  # as a framework would
        n = 0
        for k, b in enumerate(gpu.batches()):
            assert b.device == "cuda:0" and b.index == want[k][0] and b.max_seqlen == want[k][1]
            for f, w in zip(FIELDS, want[k][2]):
                t = b.field(f)
                assert t.__dlpack_device__() == (2, 0)
                t.__dlpack__(stream=None)  # the legacy default stream waits on the copy
                check(cuda.cuStreamSynchronize(ctypes.c_void_p(1)), "sync")
                got = np.frombuffer(read(t.data_ptr, w.nbytes), dtype=np.int32).reshape(w.shape)
                assert np.array_equal(got, w), (k, f)
            n += 1
        assert n == len(want) > 10, (n, len(want))
        del b, t, gpu, host
        gc.collect()
        assert stoker.cuda_memory_in_use() == (0, 0), stoker.cuda_memory_in_use()
        print("ok", n)
    """.replace("FIELDS", '("input_ids", "labels", "position_ids", "cu_seqlens")'))
    assert out.strip().startswith("ok "), out


@pytest.mark.wheel
def test_pair_batches_on_the_gpu_equal_the_host_batches(fake_driver, demo_root, tmp_path):
    """PairLoader(device='cuda'): images, caption ids and masks read back from the device equal
    the host loader's batch for batch."""
    pairs = tmp_path / "pairs"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make-pairs.py"), str(pairs), "--shards", "2",
                    "--per-shard", "10"], check=True, capture_output=True)
    clip = ROOT / "tests" / "data" / "text" / "tokenizer-clip.json"
    out = run_scenario(fake_driver, demo_root, f"""
        import numpy as np
        kw = dict(tokenizer={str(clip)!r}, preset="imagenet-val", dtype="uint8", shuffle=True, seed=2)
        host = stoker.PairLoader({str(pairs / "*.tar")!r}, 4, output="numpy", **kw)
        want = [(b["keys"], [b[f].copy() for f in ("images", "input_ids", "attention_mask")]) for b in host]
        gpu = stoker.PairLoader({str(pairs / "*.tar")!r}, 4, device="cuda", **kw)
        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")  # as a framework would
        n = 0
        for k, b in enumerate(gpu.batches()):
            assert b.device == "cuda:0" and gpu.keys(b.indices) == want[k][0]
            for t, w in zip((b.images, b.input_ids, b.attention_mask), want[k][1]):
                assert t.__dlpack_device__() == (2, 0)
                t.__dlpack__(stream=None)
                check(cuda.cuStreamSynchronize(ctypes.c_void_p(1)), "sync")
                got = np.frombuffer(read(t.data_ptr, w.nbytes), dtype=w.dtype).reshape(w.shape)
                assert np.array_equal(got, w), k
            n += 1
        assert n == len(want) >= 3, (n, len(want))
        del b, t, gpu, host
        gc.collect()
        assert stoker.cuda_memory_in_use() == (0, 0), stoker.cuda_memory_in_use()
        print("ok", n)
    """)
    assert out.strip().startswith("ok "), out


@pytest.fixture(scope="module")
def fake_nvjpeg(fake_driver, demo_root, tmp_path_factory):
    """The stand-in libnvjpeg beside the stand-in driver, and the pixels it serves: each demo
    JPEG decoded whole by Pillow (libjpeg-turbo, as stoker's CPU path), named by the FNV-1a hash
    of its bytes (see fake_nvjpeg.c)."""
    from PIL import Image

    cc = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(fake_driver / "libnvjpeg.so"),
                    str(ROOT / "crates/stoker-cli/tests/fake_nvjpeg.c"), f"-L{fake_driver}", "-lcuda",
                    f"-Wl,-rpath,{fake_driver}"], check=True)
    pixels = tmp_path_factory.mktemp("nvjpeg-pixels")
    for path in sorted(Path(demo_root).rglob("*.jpg")):
        data = path.read_bytes()
        h = 0xCBF29CE484222325
        for b in data:
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        with Image.open(path) as im:
            rgb = im.convert("RGB")
            header = rgb.width.to_bytes(4, "little") + rgb.height.to_bytes(4, "little")
            (pixels / f"{h:016x}.rgb").write_bytes(header + rgb.tobytes())
    return pixels


@pytest.mark.wheel
def test_gpu_decode_through_the_python_classes(fake_driver, fake_nvjpeg, demo_root):
    """`decode=`/`gpu_share=` reach the engine; the batches equal the CPU path's (the stand-in
    serves the reference decoder's pixels, and its driver runs stoker's resampler kernel from its
    source); the report says what GPU decode did; a GPU decode without a GPU is refused."""
    out = run_scenario(fake_driver, demo_root, """
        args = {"batch_size": 16, "preset": "imagenet-train", "dtype": "uint8", "seed": 3, "shuffle": True,
                "dct_scaling": False, "roi": False}
        def epoch(loader):
            out = []
            for b in loader.iter():
                b.images.__dlpack__(stream=None)  # the legacy stream (the read's) waits for the batch
                out.append((read(b.images.data_ptr, len(b.indices) * 3 * 224 * 224), b.indices))
            return out

        check(cuda.cuCtxPushCurrent_v2(ctypes.c_void_p(primary(0))), "push")
        cpu_loader = _stoker.Loader([root], json.dumps(args), "cuda", 0)
        cpu = epoch(cpu_loader)
        gpu_loader = _stoker.Loader([root], json.dumps({**args, "decode": "gpu", "gpu_share": 0.75}), "cuda", 0)
        gpu = epoch(gpu_loader)
        assert gpu == cpu, "GPU-decoded batches differ from the CPU path's"
        stats = json.loads(gpu_loader.gpu_decode_json())
        assert stats["backend"] == "hardware" and stats["share"] == 0.75 and stats["images"] > 0, stats
        # The Python class: the same arguments, and the report's section.
        loader = stoker.ImageLoader(root, 16, preset="imagenet-val", dtype="uint8", device="cuda", decode="auto")
        assert loader.report()["gpu_decode"]["backend"] == "hardware"
        try:
            stoker.ImageLoader(root, 16, preset="imagenet-val", decode="gpu")
        except stoker.ConfigError as e:
            assert "decode='gpu' needs device='cuda'" in str(e), e
        else:
            raise AssertionError("decode='gpu' accepted on the host")
        print("ok", len(gpu), stats["images"])
    """, FAKE_NVJPEG_DIR=str(fake_nvjpeg))
    assert out.strip().startswith("ok"), out
