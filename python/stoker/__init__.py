"""stoker keeps GPUs fed: image files to training batches on a Rust thread pool, handed to
PyTorch or NumPy zero-copy.

>>> import stoker
>>> loader = stoker.ImageLoader("data/train", batch_size=256, preset="imagenet-train", shuffle=True)
>>> for epoch in range(90):
...     loader.set_epoch(epoch)
...     for images, labels in loader:
...         ...
"""

from . import transforms
from ._stoker import LIBJPEG_TURBO_VERSION, __version__
from .arrays import ArrayLoader
from .errors import ConfigError, DatasetError, DecodeError, MemoryLimitError, ReadError, StokerError
from .loader import ImageLoader


def make_demo(root: str, images: int = 350, seed: int = 0) -> int:
    """Writes the demo ImageFolder (ImageNet-like JPEGs derived from embedded public-domain
    photos) under ``root``; returns the number of images."""
    import os

    from . import _stoker

    return _stoker.make_demo(os.fspath(root), images, seed)


__all__ = ["ImageLoader", "ArrayLoader", "transforms", "make_demo", "StokerError", "ConfigError", "DatasetError",
           "DecodeError", "ReadError", "MemoryLimitError", "__version__", "LIBJPEG_TURBO_VERSION"]
