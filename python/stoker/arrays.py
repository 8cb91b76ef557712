"""`ArrayLoader`: the cure for ``TensorDataset`` + ``DataLoader`` on numeric arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from . import _stoker
from ._base import BatchIterator, LoaderBase, converter, native_device
from .errors import ConfigError
from .loader import arguments_json, want_torch


def _column(a: Any) -> Any:
    """A `.npy` path (its rows read by stoker as batches need them) or an object exporting its
    memory through the buffer protocol (NumPy arrays, ``bytes``, ``bytearray``, ...), which stoker reads in place
    and checks itself (C-contiguous, a supported element type, at least one dimension)."""
    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ConfigError(f"invalid argument `arrays`: {path!r} is not a .npy file")
        return path
    try:
        memoryview(a).release()
        return a
    except TypeError:
        pass
    import numpy as np

    try:
        return np.asarray(a)  # torch tensors on the CPU, lists, ...
    except Exception:
        raise ConfigError(f"invalid argument `arrays`: cannot use {type(a).__name__} as an array") from None


class ArrayLoader(LoaderBase):
    """Batches of rows from equally long arrays: NumPy arrays (any C-contiguous numeric dtype)
    or ``.npy`` files, of which only the rows a batch needs are read (positional reads: a file
    truncated meanwhile raises ``ReadError``; a file of at most 32 MiB is read whole when opened).

    ``for x, y in stoker.ArrayLoader(x, y, batch_size=256, shuffle=True)`` yields one tensor per
    array, gathered by the sampler's indices with parallel row copies into pooled buffers and
    handed over zero-copy. Same seed/epoch shuffle, ``rank``/``world_size`` sharding (torchrun's
    environment by default), ``state_dict`` resume and ``memory_limit`` as ``ImageLoader``.
    ``device='cuda'`` (``'cuda:N'``, ``'auto'``) delivers each column as a CUDA tensor through
    pinned buffers and stoker's copy stream, as ``ImageLoader`` does.
    """

    def __init__(self, *arrays: Any, batch_size: int = 256, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, threads: int | str = "auto", prefetch: int = 2,
                 memory_limit: int | str | None = None, output: str = "auto", rank: int | None = None,
                 world_size: int | None = None, device: str = "cpu") -> None:
        if not arrays:
            raise ConfigError("invalid argument `arrays`: give at least one array or .npy path")
        self._columns = [_column(a) for a in arrays]
        self._args = arguments_json(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                    threads=threads, prefetch=prefetch, memory_limit=memory_limit, rank=rank,
                                    world_size=world_size)
        self._device, self._ordinal = native_device(device)
        self._torch = want_torch(output)
        self._start()
        self._to_device(self._loader().device, output)

    def _new_native(self) -> _stoker.ArrayLoader:
        return _stoker.ArrayLoader(self._columns, self._args, self._device, self._ordinal)

    @property
    def device(self) -> str:
        """Where batches are delivered: ``'cpu'`` or ``'cuda:N'``."""
        return self._loader().device

    def device_report(self) -> dict[str, Any]:
        """``{requested, used, note}`` for the ``device=`` argument."""
        report: dict[str, Any] = json.loads(self._loader().device_report_json())
        return report

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        n = len(self._columns)
        return BatchIterator(self._loader().iter(), converter(self._torch),
                             lambda b: tuple(b.column(c) for c in range(n)))

    def _loader(self) -> _stoker.ArrayLoader:
        native: _stoker.ArrayLoader = self._base()  # type: ignore[assignment]
        return native

    def batches(self) -> _stoker.ArrayIterator:
        """The raw iterator of ``stoker._stoker.ArrayBatch`` objects."""
        return self._loader().iter()


__all__ = ["ArrayLoader"]
