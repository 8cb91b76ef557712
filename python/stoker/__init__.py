"""stoker keeps GPUs fed: image files to training batches on a Rust thread pool, handed to
PyTorch or NumPy zero-copy.

>>> import stoker
>>> loader = stoker.ImageLoader("data/train", batch_size=256, preset="imagenet-train", shuffle=True)
>>> for epoch in range(90):
...     loader.set_epoch(epoch)
...     for images, labels in loader:
...         ...
"""

from typing import Any

from . import transforms
from ._stoker import LIBJPEG_TURBO_VERSION, __version__
from .arrays import ArrayLoader
from .errors import ConfigError, DatasetError, DecodeError, DeviceError, MemoryLimitError, ReadError, StokerError
from .loader import ImageLoader, PairLoader
from .text import TokenLoader
from .tokenizer import Tokenizer


def make_demo(root: str, images: int = 350, seed: int = 0) -> int:
    """Writes the demo ImageFolder (ImageNet-like JPEGs derived from embedded public-domain
    photos) under ``root``; returns the number of images."""
    import os

    from . import _stoker

    return _stoker.make_demo(os.fspath(root), images, seed)


def cuda_probe() -> dict[str, Any]:
    """What the CUDA driver and NVML report: driver versions, devices (name, memory, PCIe link),
    or ``unavailable_reason``. Never raises for a missing driver."""
    import json

    from . import _stoker

    probe: dict[str, Any] = json.loads(_stoker.cuda_probe_json())
    return probe


def cuda_memory_in_use() -> tuple[int, int]:
    """``(device bytes, page-locked host bytes)`` that stoker has allocated in this process."""
    from . import _stoker

    return _stoker.cuda_memory_in_use()


__all__ = ["ImageLoader", "PairLoader", "ArrayLoader", "TokenLoader", "Tokenizer", "transforms", "make_demo",
           "cuda_probe", "cuda_memory_in_use", "StokerError",
           "ConfigError", "DatasetError", "DecodeError", "ReadError", "MemoryLimitError", "DeviceError", "__version__",
           "LIBJPEG_TURBO_VERSION"]
