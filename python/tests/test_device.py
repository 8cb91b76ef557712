"""``device=`` on a machine without a GPU: clear errors for CUDA, the CPU fallback of ``auto``,
and the probes (``cuda_probe``, ``cuda_memory_in_use``, ``stoker doctor``). The GPU side is
tested by tests/gpu on a machine with one."""

import json
import shutil
import subprocess

import numpy as np
import pytest
import stoker

PROBE = stoker.cuda_probe()
if PROBE["devices"]:
    pytest.skip("a GPU is present; the no-GPU behaviour is tested on machines without one", allow_module_level=True)


def image_loader(root, **kw):
    """The default output (``'auto'``): the device error must come from ``device=`` itself, not
    from a conflict with ``output='numpy'``."""
    return stoker.ImageLoader(root, 16, preset="imagenet-val", **kw)


def array_loader(**kw):
    return stoker.ArrayLoader(np.arange(200, dtype=np.float32).reshape(100, 2), batch_size=16, **kw)


def token_loader(tmp_path, **kw):
    path = tmp_path / "tokens.bin"
    np.arange(1000, dtype=np.uint16).tofile(path)
    return stoker.TokenLoader(path, seq_len=32, batch_size=4, eos_id=999, **kw)


def any_loader(kind, demo, tmp_path, **kw):
    """A loader of `kind` (image, array or token) with the keyword arguments `kw`."""
    if kind == "image":
        return image_loader(demo, **kw)
    if kind == "token":
        return token_loader(tmp_path, **kw)
    return array_loader(**kw)


@pytest.mark.parametrize("kind", ["image", "array", "token"])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_a_gpu_is_a_device_error(demo, tmp_path, kind, device):
    with pytest.raises(stoker.DeviceError) as e:
        any_loader(kind, demo, tmp_path, device=device)
    assert isinstance(e.value, stoker.StokerError) and isinstance(e.value, RuntimeError)
    assert not isinstance(e.value, stoker.ConfigError)
    message = str(e.value)
    assert "CUDA" in message, message
    # The reason is the one the probe gives, e.g. "no NVIDIA driver: libcuda.so could not be loaded".
    assert PROBE["unavailable_reason"] in message, message


@pytest.mark.parametrize("kind", ["image", "array", "token"])
@pytest.mark.parametrize("device", ["gpu", "cuda:x", "cuda:-1", 3])
def test_bad_device_values_are_config_errors(demo, tmp_path, kind, device):
    with pytest.raises(stoker.ConfigError) as e:
        any_loader(kind, demo, tmp_path, device=device)
    assert isinstance(e.value, ValueError)
    message = str(e.value)
    assert "device" in message and str(device) in message, message


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_bfloat16_needs_a_gpu(demo, device):
    with pytest.raises(stoker.ConfigError, match="bfloat16"):
        image_loader(demo, device=device, dtype="bfloat16")


def test_auto_falls_back_to_the_cpu_with_a_note(demo):
    kw = dict(batch_size=16, preset="imagenet-train", shuffle=True, seed=5, output="numpy")
    auto = stoker.ImageLoader(demo, device="auto", **kw)
    cpu = stoker.ImageLoader(demo, device="cpu", **kw)
    assert auto.device == "cpu"
    batches = 0
    for (x, y), (cx, cy) in zip(auto, cpu, strict=True):
        assert isinstance(x, np.ndarray) and x.dtype == np.float32
        np.testing.assert_array_equal(x, cx)
        np.testing.assert_array_equal(y, cy)
        batches += 1
    assert batches == len(cpu) == 6
    report = auto.report()["device"]
    assert set(report) == {"requested", "used", "note"}, report
    assert report["requested"] == "auto" and report["used"] == "cpu", report
    assert isinstance(report["note"], str) and "cuda" in report["note"].lower(), report

    rows = np.arange(300, dtype=np.float64).reshape(100, 3)
    akw = dict(batch_size=16, shuffle=True, seed=2, output="numpy")
    auto_rows = stoker.ArrayLoader(rows, device="auto", **akw)
    assert auto_rows.device == "cpu"
    for (a,), (c,) in zip(auto_rows, stoker.ArrayLoader(rows, **akw), strict=True):
        np.testing.assert_array_equal(a, c)


def test_token_loader_auto_falls_back_to_the_cpu_with_a_note(tmp_path):
    auto = token_loader(tmp_path, device="auto", output="numpy")
    assert auto.device == "cpu"
    report = auto.device_report()
    assert report["requested"] == "auto" and report["used"] == "cpu" and "cuda" in report["note"].lower(), report
    for a, c in zip(auto, token_loader(tmp_path, output="numpy"), strict=True):
        for k in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(a[k], c[k])


def test_cpu_device_report(demo):
    loader = image_loader(demo, output="numpy")  # device="cpu" is the default
    assert loader.device == "cpu"
    for _ in loader:
        pass
    report = loader.report()
    assert report["device"] == {"requested": "cpu", "used": "cpu", "note": None}
    assert report.get("transfer") is None
    assert "transfer" not in [s["name"] for s in report["stages"]]
    assert image_loader(demo, device="cpu").report()["device"]["requested"] == "cpu"


def test_cuda_probe_explains_the_missing_gpu():
    probe = stoker.cuda_probe()
    assert isinstance(probe, dict)
    assert probe["devices"] == []
    assert isinstance(probe["unavailable_reason"], str) and probe["unavailable_reason"].strip()
    assert isinstance(probe["driver_library"], bool)
    assert "cuda_driver_version" in probe and "nvidia_driver_version" in probe
    if not probe["driver_library"]:
        assert probe["cuda_driver_version"] is None


def test_no_cuda_memory_in_use(demo):
    assert stoker.cuda_memory_in_use() == (0, 0)
    loader = image_loader(demo, device="auto", output="numpy")
    batch = next(iter(loader))
    assert stoker.cuda_memory_in_use() == (0, 0)
    del batch, loader


def test_doctor_json_lists_no_gpus():
    exe = shutil.which("stoker")
    if exe is None:
        pytest.skip("the `stoker` executable is not on PATH (install the package)")
    proc = subprocess.run([exe, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["gpus"] == [], report["gpus"]


def test_normaliser_table_is_the_cpu_paths_arithmetic_for_every_byte():
    # The GPU normaliser looks bytes up in this table; here the same code runs on CPU tensors and
    # must equal the engine's float32 output for every byte value of every channel.
    torch = pytest.importorskip("torch")
    from stoker._gpu import Normalizer, normalize_table
    from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD

    table = normalize_table(IMAGENET_MEAN, IMAGENET_STD)
    assert table.shape == (3, 256) and table.dtype == np.float32
    for c in range(3):
        want = (np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(IMAGENET_MEAN[c])) \
            / np.float32(IMAGENET_STD[c])
        assert np.array_equal(table[c], want)
    x = torch.arange(256, dtype=torch.uint8).repeat(3, 1).reshape(1, 3, 16, 16).contiguous()
    y = Normalizer(IMAGENET_MEAN, IMAGENET_STD, torch.float32, channels_last=False)(x)
    assert torch.equal(y, torch.from_numpy(table).reshape(1, 3, 16, 16))
    nhwc = Normalizer(IMAGENET_MEAN, IMAGENET_STD, "float16", channels_last=True)(x.permute(0, 2, 3, 1).contiguous())
    assert torch.equal(nhwc, torch.from_numpy(table).reshape(1, 3, 16, 16).permute(0, 2, 3, 1).half())
