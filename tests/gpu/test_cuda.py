"""stoker's CUDA hand-off on a real GPU: the bytes, stream ordering, memory release, device choice.

Needs PyTorch with CUDA, an NVIDIA GPU and a stoker build that finds it (``stoker.cuda_probe()``);
anywhere else every test is skipped with the reason. Run:

    python3 -m pytest -q -rs tests/gpu
"""

import gc
import time

import numpy as np
import pytest
import stoker

try:
    import torch
except ImportError:
    torch = None

IMAGE_BYTES = 3 * 224 * 224  # one uint8 CHW sample of the presets
MiB = 2**20


def _skip_reason():
    if torch is None:
        return "PyTorch is not installed: CUDA tests skipped"
    if not torch.cuda.is_available():
        return f"PyTorch {torch.__version__} finds no usable CUDA device: CUDA tests skipped"
    probe = stoker.cuda_probe()
    if not probe["devices"]:
        return f"stoker finds no GPU ({probe['unavailable_reason']}): CUDA tests skipped"
    return None


SKIP_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


def host_batches(loader):
    """Copies of one epoch's batches (the CPU loader's tensors are views of pooled buffers)."""
    return [(x.clone(), y.clone()) for x, y in loader]


def busy(a, b, out):
    """Long GPU work on the current stream that reads no batch: ~1 ms of spinning plus 3 matmuls
    of 4096 x 4096 (a few ms)."""
    torch.cuda._sleep(2_000_000)
    for _ in range(3):
        torch.mm(a, b, out=out)


def let_go(index, images, labels, arrival):
    """Copies a held batch out on the current stream into pinned host memory without waiting and
    takes its checksum again, all queued behind the busy kernels; the caller drops the batch
    right after, so stoker must not reuse its memory before the stream has passed this work."""
    x = torch.empty(images.shape, dtype=images.dtype, pin_memory=True)
    y = torch.empty(labels.shape, dtype=labels.dtype, pin_memory=True)
    x.copy_(images, non_blocking=True)
    y.copy_(labels, non_blocking=True)
    return index, x, y, arrival, images.sum(dtype=torch.int64)


def assert_held_batch_unchanged(epoch, entry, expected):
    index, images, labels, _ = entry
    want_images, want_labels = expected[index]
    assert torch.equal(images.cpu(), want_images), f"epoch {epoch}, batch {index}: images changed while held"
    assert torch.equal(labels.cpu(), want_labels), f"epoch {epoch}, batch {index}: labels changed while held"


def memory_after_release(baseline, timeout=5.0):
    """``stoker.cuda_memory_in_use()`` once it is back at ``baseline``, or its value after
    ``timeout`` seconds: device memory goes back when the stream that used it has passed that
    point, which stoker may notice a moment after the last tensor is dropped."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        torch.cuda.synchronize()
        now = stoker.cuda_memory_in_use()
        if now == baseline or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def free_device_memory():
    """Free bytes on the current GPU, with torch's cached blocks given back first."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def test_gpu_batches_equal_host_batches_while_consumer_holds_and_runs_long_kernels(gpu_demo):
    kw = dict(batch_size=32, preset="imagenet-train", dtype=torch.uint8, shuffle=True, seed=7, prefetch=2)
    host = stoker.ImageLoader(gpu_demo, device="cpu", output="torch", **kw)
    gpu = stoker.ImageLoader(gpu_demo, device="cuda", **kw)
    assert gpu.device == "cuda:0"
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    out = torch.empty(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    for epoch in range(5):
        host.set_epoch(epoch)
        gpu.set_epoch(epoch)
        expected = host_batches(host)
        held = []  # the consumer keeps the last 3 batches: (index, images, labels, checksum at arrival)
        results = []  # (index, pinned images, pinned labels, checksum at arrival, checksum when let go)
        images = labels = None
        with torch.cuda.stream(side):
            for index, (images, labels) in enumerate(gpu):
                assert images.device == torch.device("cuda", 0) and labels.device == images.device
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                arrival = images.sum(dtype=torch.int64)  # queued on `side` the moment the batch arrives
                busy(a, b, out)
                held.append((index, images, labels, arrival))
                if len(held) > 3:
                    results.append(let_go(*held.pop(0)))
            images = labels = None
            # The epoch is over; the batches still held must be unchanged too (`.cpu()` waits for
            # `side`, so this runs after every queued kernel). Indexing keeps no loop variable alive.
            for k in range(len(held)):
                assert_held_batch_unchanged(epoch, held[k], expected)
            while held:
                results.append(let_go(*held.pop(0)))
        torch.cuda.synchronize()
        assert [r[0] for r in results] == list(range(len(expected))), f"epoch {epoch}: batch count or order"
        for index, x, y, arrival, leaving in results:
            want_images, want_labels = expected[index]
            assert torch.equal(x, want_images), f"epoch {epoch}, batch {index}: bytes changed before they were read"
            assert torch.equal(y, want_labels), f"epoch {epoch}, batch {index}: labels changed before they were read"
            want = int(want_images.sum(dtype=torch.int64))
            assert int(arrival) == want, f"epoch {epoch}, batch {index}: checksum at arrival {int(arrival)} != {want}"
            assert int(leaving) == want, f"epoch {epoch}, batch {index}: checksum when let go {int(leaving)} != {want}"


def test_next_does_not_wait_for_the_consumers_stream(gpu_demo):
    kw = dict(batch_size=32, preset="imagenet-val", dtype=torch.uint8)
    expected = host_batches(stoker.ImageLoader(gpu_demo, device="cpu", output="torch", **kw))
    loader = stoker.ImageLoader(gpu_demo, device="cuda", **kw)
    it = iter(loader)
    first = next(it)
    time.sleep(1.0)  # the following batches are decoded and copied meanwhile
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(1_000_000_000)  # about half a second of spinning on the consumer's stream
    t = time.perf_counter()
    images, labels = next(it)
    took = time.perf_counter() - t
    assert not stream.query(), (f"next() took {took:.3f} s and the consumer's stream had drained by then: "
                                "the hand-off waited on the host instead of making the stream wait")
    assert torch.equal(images.cpu(), expected[1][0]) and torch.equal(labels.cpu(), expected[1][1])
    assert torch.equal(first[0].cpu(), expected[0][0])
    it.close()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_normalized_gpu_batches_are_bit_identical_to_the_cpu_path(gpu_demo, dtype):
    # uint8 crosses the bus and is normalised on the GPU through the engine's own table: float32
    # equals the host batches bit for bit, float16/bfloat16 are those values rounded.
    want_dtype = getattr(torch, dtype)
    host = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-val", device="cpu", output="torch")
    extra = {} if dtype == "float32" else {"dtype": want_dtype}  # float32 is the preset's default
    gpu = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-val", device="cuda", **extra)
    n = 0
    for (x, y), (hx, hy) in zip(gpu, host, strict=True):
        assert x.is_cuda and x.dtype == want_dtype and x.shape == hx.shape and hx.dtype == torch.float32
        assert torch.equal(y.cpu(), hy)
        assert torch.equal(x.cpu(), hx.to(want_dtype)), f"{dtype}: max difference {(x.cpu().float() - hx).abs().max()}"
        n += x.shape[0]
    assert n == 300


def batch_mixing(style):
    """torchvision's RandomChoice([MixUp, CutMix]) or timm's Mixup (smoothing too), both kinds of
    batch in one epoch; 1000 classes cover the demo's labels."""
    from stoker import transforms as T

    if style == "torchvision":
        return T.RandomChoice([T.MixUp(alpha=1.0, num_classes=1000), T.CutMix(alpha=1.0, num_classes=1000)])
    return T.Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, label_smoothing=0.1,
                   num_classes=1000)


@pytest.mark.parametrize("dtype,layout", [("float32", "NCHW"), ("float16", "NHWC"), ("uint8", "NCHW")])
@pytest.mark.parametrize("style", ["torchvision", "timm"])
def test_mixed_gpu_batches_are_bit_identical_to_the_cpu_path(gpu_demo, style, dtype, layout):
    # With device='cuda' the host makes the soft labels and the GPU mixes the images after their
    # normalisation (stoker._gpu.Mixer), with the host's arithmetic: the same bytes.
    kw = dict(preset="imagenet-train", shuffle=True, seed=7, layout=layout, batch_transform=batch_mixing(style))
    if dtype != "float32":  # float32 is the preset's default
        kw["dtype"] = getattr(torch, dtype)
    host = stoker.ImageLoader(gpu_demo, 32, device="cpu", output="torch", **kw)
    gpu = stoker.ImageLoader(gpu_demo, 32, device="cuda", **kw)
    kinds, n = set(), 0
    for k, ((x, t), (hx, ht)) in enumerate(zip(gpu, host, strict=True)):
        p = gpu.mix_params(0, k)
        kinds.add("cutmix" if p["cutmix"] else "mixup")
        assert x.is_cuda and t.is_cuda and t.dtype == torch.float32 and t.shape == ht.shape == (len(hx), 1000)
        assert x.dtype == hx.dtype == getattr(torch, dtype) and x.shape == hx.shape
        assert torch.equal(t.cpu(), ht), k
        got = x.cpu()
        assert torch.equal(got.view(torch.uint8), hx.view(torch.uint8)), \
            f"{style} {dtype} {layout} batch {k} {p}: max difference {(got.float() - hx.float()).abs().max()}"
        n += len(x)
    assert n == 300 and kinds == {"cutmix", "mixup"}, (n, kinds)


@pytest.mark.parametrize("style", ["torchvision", "timm"])
def test_mixed_bfloat16_gpu_batches_round_each_operation(gpu_demo, style):
    # The host has no bfloat16: the GPU's batch is the Mixer's bfloat16 arithmetic (each product
    # and the sum rounded to bfloat16, as torch computes it on any device) on the host's
    # normalised values rounded to bfloat16. CutMix (a copy) is then the host's float32 batch
    # rounded; MixUp is within 3 roundings (unit 2**-8 each) of it: |err| <= 2**-6 * (|x| lam
    # + |partner| (1 - lam)).
    from stoker._gpu import Mixer

    mix = batch_mixing(style)
    kw = dict(preset="imagenet-train", shuffle=True, seed=7)
    plain = stoker.ImageLoader(gpu_demo, 32, device="cpu", output="torch", **kw)
    host = stoker.ImageLoader(gpu_demo, 32, device="cpu", output="torch", batch_transform=mix, **kw)
    gpu = stoker.ImageLoader(gpu_demo, 32, device="cuda", dtype=torch.bfloat16, batch_transform=mix, **kw)
    mixer = Mixer(style, channels_last=False)
    kinds = set()
    for k, ((x, t), (hx, ht), (px, _)) in enumerate(zip(gpu, host, plain, strict=True)):
        p = gpu.mix_params(0, k)
        got = x.cpu()
        assert x.dtype == torch.bfloat16 and torch.equal(t.cpu(), ht)
        assert torch.equal(got, mixer(px.to(torch.bfloat16), p)), (k, p)
        if p["cutmix"]:
            kinds.add("cutmix")
            assert torch.equal(got, hx.to(torch.bfloat16)), (k, p)
        else:
            kinds.add("mixup")
            l0, l1 = np.float32(p["lam"]), np.float32(1.0 - p["lam"])
            partner = torch.roll(px, 1, 0) if style == "torchvision" else px.flip(0)
            bound = (px.abs() * float(l0) + partner.abs() * float(l1)) * 2**-6
            err = (got.float() - hx).abs()
            assert (err <= bound).all(), (k, p, float((err - bound).max()))
    assert kinds == {"cutmix", "mixup"}, kinds


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_normaliser_on_the_device_equals_the_table_for_every_byte(layout):
    from stoker._gpu import Normalizer, normalize_table
    from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD

    values = torch.arange(256, dtype=torch.uint8).repeat(3, 1)  # (3, 256): every byte per channel
    x = values.reshape(1, 3, 16, 16) if layout == "NCHW" else values.reshape(3, 16, 16).permute(1, 2, 0)[None]
    x = x.contiguous()
    norm = Normalizer(IMAGENET_MEAN, IMAGENET_STD, torch.float32, channels_last=layout == "NHWC")
    on_gpu, on_cpu = norm(x.cuda()).cpu(), norm(x)
    table = torch.from_numpy(normalize_table(IMAGENET_MEAN, IMAGENET_STD))
    want = table.reshape(1, 3, 16, 16) if layout == "NCHW" else table.reshape(3, 16, 16).permute(1, 2, 0)[None]
    assert torch.equal(on_gpu, want) and torch.equal(on_cpu, want)


def test_torchs_current_device_is_left_alone():
    # PyTorch tracks its current device through the driver's current context: stoker creating,
    # iterating and dropping a loader on another device must not move it.
    n = torch.cuda.device_count()
    other = 1 if n > 1 else 0
    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")  # torch's context is current on this thread
    data = np.arange(4096, dtype=np.float32).reshape(1024, 4)
    loader = stoker.ArrayLoader(data, batch_size=64, device=f"cuda:{other}")
    assert torch.cuda.current_device() == 0
    for (x,) in loader:
        assert x.device.index == other
        assert torch.cuda.current_device() == 0
    del x, loader
    gc.collect()
    assert torch.cuda.current_device() == 0
    assert torch.zeros(1, device="cuda").device.index == 0


def test_labels_kept_for_a_whole_epoch_do_not_hold_the_images(gpu_demo):
    loader = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-val", device="cuda", prefetch=1)
    kept = []
    for images, labels in loader:
        kept.append(labels)  # metrics code keeps labels; the images go
        del images
    assert len(kept) == len(loader) > loader._native.device_slots
    host = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-val", device="cpu", output="torch")
    for got, (_, want) in zip(kept, host, strict=True):
        assert torch.equal(got.cpu(), want)


def test_dropping_the_loader_frees_device_and_pinned_memory(gpu_demo):
    gc.collect()
    before = stoker.cuda_memory_in_use()
    free_before = free_device_memory()

    # A whole epoch, the last batch still held at the end.
    loader = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-train", shuffle=True, device="cuda")
    it = iter(loader)
    last = next(it)
    during = stoker.cuda_memory_in_use()
    assert during[0] > before[0] and during[1] > before[1], f"device and pinned bytes in use: {during}"
    for batch in it:
        last = batch
    del batch, last, it, loader
    after = memory_after_release(before)
    assert after == before, f"stoker still holds {after} (device, pinned) bytes after the loader was dropped"
    free_after = free_device_memory()
    assert free_after >= free_before - 64 * MiB, f"{(free_before - free_after) / MiB:.0f} MiB of device memory lost"

    # Abandoned after 2 batches; the second batch outlives its iterator and loader.
    kw = dict(batch_size=32, preset="imagenet-train", shuffle=True, seed=1, dtype=torch.uint8)
    host_it = iter(stoker.ImageLoader(gpu_demo, device="cpu", output="torch", **kw))
    next(host_it)
    want_images, want_labels = (t.clone() for t in next(host_it))
    host_it.close()
    del host_it
    loader = stoker.ImageLoader(gpu_demo, device="cuda", **kw)
    it = iter(loader)
    next(it)
    images, labels = next(it)
    del it, loader
    gc.collect()
    assert stoker.cuda_memory_in_use()[0] > before[0], "the batch still alive must keep its device memory"
    assert torch.equal(images.cpu(), want_images) and torch.equal(labels.cpu(), want_labels)
    del images, labels
    after = memory_after_release(before)
    assert after == before, f"stoker still holds {after} (device, pinned) bytes after an abandoned epoch"
    free_after = free_device_memory()
    assert free_after >= free_before - 64 * MiB, f"{(free_before - free_after) / MiB:.0f} MiB of device memory lost"


def test_cuda_n_is_honoured(gpu_demo):
    count = torch.cuda.device_count()
    for n in range(count):
        # Another device is current, so only the argument can pick device n.
        with torch.cuda.device((n + 1) % count):
            loader = stoker.ImageLoader(gpu_demo, 8, preset="imagenet-val", device=f"cuda:{n}")
            assert loader.device == f"cuda:{n}"
            images, labels = next(iter(loader))
            assert images.device == torch.device("cuda", n) and labels.device == torch.device("cuda", n)
            assert loader.report()["device"]["used"] == f"cuda:{n}"
            del images, labels, loader
    with pytest.raises(stoker.DeviceError) as e:
        stoker.ImageLoader(gpu_demo, 8, preset="imagenet-val", device=f"cuda:{count}")
    assert isinstance(e.value, stoker.StokerError) and isinstance(e.value, RuntimeError)
    assert str(count) in str(e.value), f"the message should name the device count {count}: {e.value}"
    with pytest.raises(stoker.DeviceError):
        stoker.ArrayLoader(np.zeros((10, 2), np.float32), batch_size=4, device=f"cuda:{count}")

    auto = stoker.ImageLoader(gpu_demo, 8, preset="imagenet-val", device="auto")
    images, labels = next(iter(auto))
    assert images.is_cuda and labels.is_cuda
    assert auto.device.startswith("cuda")
    report = auto.report()["device"]
    assert report["requested"] == "auto" and report["used"].startswith("cuda"), report


def test_array_loader_on_gpu():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 16)).astype(np.float32)
    y = rng.integers(0, 10, 1000).astype(np.int64)
    kw = dict(batch_size=64, shuffle=True, seed=5)
    host = stoker.ArrayLoader(x, y, device="cpu", output="torch", **kw)
    gpu = stoker.ArrayLoader(x, y, device="cuda", **kw)
    rows = 0
    for (gx, gy), (hx, hy) in zip(gpu, host, strict=True):
        assert gx.device == torch.device("cuda", 0) and gy.device == gx.device
        assert gx.dtype == torch.float32 and gy.dtype == torch.int64
        assert gx.shape == hx.shape and gy.shape == hy.shape
        # Bit for bit: compare the float32 words as integers.
        assert torch.equal(gx.cpu().view(torch.int32), hx.view(torch.int32))
        assert torch.equal(gy.cpu(), hy)
        rows += gx.shape[0]
    assert rows == 1000


def test_report_has_transfer_stage(gpu_demo):
    loader = stoker.ImageLoader(gpu_demo, 32, preset="imagenet-val", device="cuda")
    samples = 0
    for images, _ in loader:
        samples += images.shape[0]
    torch.cuda.synchronize()
    # stoker's transfer thread counts a copy once its event has completed, which can be a moment
    # after the consumer got the batch: wait (briefly) for the last one.
    deadline = time.monotonic() + 5.0
    report = loader.report()
    while report["transfer"]["batches"] < len(loader) and time.monotonic() < deadline:
        time.sleep(0.01)
        report = loader.report()
    assert report["device"]["requested"] == "cuda" and report["device"]["used"] == "cuda:0", report["device"]
    t = report["transfer"]
    assert t["batches"] == len(loader)
    assert t["bytes"] > 0 and t["copy_seconds"] > 0 and t["gbps"] > 0, t
    assert t["gbps"] == pytest.approx(t["bytes"] / t["copy_seconds"] / 1e9, rel=1e-6)
    # Batches cross the bus as uint8 (normalisation runs on the GPU): one byte per pixel and
    # channel plus the labels, not the four of float32.
    assert samples * IMAGE_BYTES <= t["bytes"] < 2 * samples * IMAGE_BYTES, t
    assert "transfer" in [s["name"] for s in report["stages"]]
    assert 0.0 <= report["starvation"] <= 1.0
    assert isinstance(report["bottleneck"]["stage"], str)


def test_token_batches_on_the_gpu_equal_the_host_batches(tmp_path):
    """TokenLoader(device='cuda') on a real GPU: every array of every batch equals the host
    loader's, consumed on torch's current stream while a long kernel runs."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 50000, size=200_000, dtype=np.uint16)
    tokens[rng.choice(tokens.size, size=800, replace=False)] = 50256
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    kw = dict(seq_len=1024, batch_size=8, pack="best_fit", eos_id=50256, shuffle=True, seed=3)
    host = [{k: v.copy() if hasattr(v, "copy") else v for k, v in b.items()}
            for b in stoker.TokenLoader(path, output="numpy", **kw)]
    loader = stoker.TokenLoader(path, device="cuda", **kw)
    assert loader.device.startswith("cuda")
    big = torch.randn(4096, 4096, device="cuda")
    n = 0
    for b, want in zip(loader, host, strict=True):
        big = big @ big  # keep the consumer's stream busy while the next copies run
        big /= big.norm()
        for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert b[k].is_cuda and b[k].dtype == torch.int32
            np.testing.assert_array_equal(b[k].cpu().numpy(), want[k])
        assert b["max_seqlen"] == want["max_seqlen"]
        n += 1
    assert n == len(host) > 10
