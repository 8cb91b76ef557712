"""The PyTorch hand-off; skipped with a printed reason where torch is not importable."""

import gc

import numpy as np
import pytest
import stoker

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch hand-off tests skipped")


def test_torch_tensors_are_zero_copy_views(demo):
    loader = stoker.ImageLoader(demo, 8, preset="imagenet-train", shuffle=True, output="torch")
    addresses = set(loader._native.buffer_addresses())
    images, labels = next(iter(loader))
    assert isinstance(images, torch.Tensor) and images.dtype == torch.float32
    assert images.shape == (8, 3, 224, 224) and labels.dtype == torch.int64
    assert images.data_ptr() in addresses
    assert images.is_contiguous()


@pytest.mark.wheel
def test_torch_and_numpy_outputs_agree(demo):
    kw = dict(batch_size=8, preset="imagenet-train", shuffle=True, seed=4)
    t = [x.clone() for x, _ in stoker.ImageLoader(demo, output="torch", **kw)]
    n = [x.copy() for x, _ in stoker.ImageLoader(demo, output="numpy", **kw)]
    for a, b in zip(t, n, strict=True):
        np.testing.assert_array_equal(a.numpy(), b)


def test_buffer_returns_to_pool_when_tensor_dies(demo):
    loader = stoker.ImageLoader(demo, 8, preset="imagenet-val", output="torch")
    it = iter(loader)
    x, y = next(it)
    assert loader._native.held == 1
    del x, y
    gc.collect()
    assert loader._native.held == 0
    it.close()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_gpu_normaliser_reproduces_the_cpu_float_path_bit_for_bit(demo, layout):
    # With device='cuda' images cross the bus as uint8 and are normalised by these torch ops on
    # the consumer's stream; run here on the CPU, they must equal the engine's float32 output.
    from stoker._gpu import Normalizer
    from stoker.transforms import IMAGENET_MEAN, IMAGENET_STD

    kw = dict(batch_size=8, preset="imagenet-train", shuffle=True, seed=3, layout=layout, output="torch")
    u8 = [x.clone() for x, _ in stoker.ImageLoader(demo, dtype="uint8", **kw)]
    f32 = [x.clone() for x, _ in stoker.ImageLoader(demo, **kw)]
    norm = Normalizer(IMAGENET_MEAN, IMAGENET_STD, torch.float32, channels_last=layout == "NHWC")
    for a, b in zip(u8, f32, strict=True):
        assert torch.equal(norm(a), b)
    half = Normalizer(IMAGENET_MEAN, IMAGENET_STD, torch.bfloat16, channels_last=layout == "NHWC")(u8[0])
    assert half.dtype == torch.bfloat16 and torch.equal(half, f32[0].to(torch.bfloat16))
