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
