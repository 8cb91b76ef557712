"""`ArrayLoader`: the cure for ``TensorDataset`` + ``DataLoader`` on numeric arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from . import _stoker
from ._base import BatchIterator, LoaderBase, check_device, converter
from .errors import ConfigError
from .loader import _env_int, _positive_int, _want_torch, parse_bytes


def _column(a: Any) -> Any:
    """A `.npy` path (memory-mapped by stoker) or a native column tuple for a NumPy array."""
    import numpy as np

    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ConfigError(f"invalid argument `arrays`: {path!r} is not a .npy file")
        return path
    if not isinstance(a, np.ndarray):
        try:
            a = np.asarray(a)  # torch tensors on the CPU, lists, ...
        except Exception:
            raise ConfigError(f"invalid argument `arrays`: cannot use {type(a).__name__} as an array") from None
    if a.ndim == 0:
        raise ConfigError("invalid argument `arrays`: a 0-d array has no rows")
    if not a.flags["C_CONTIGUOUS"]:
        raise ConfigError("invalid argument `arrays`: arrays must be C-contiguous (use np.ascontiguousarray)")
    descr = a.dtype.str
    if descr[0] == "=":
        descr = "<" + descr[1:]
    if descr[0] == ">" or descr[1:] not in ("f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"):
        raise ConfigError(f"invalid argument `arrays`: unsupported dtype {a.dtype} "
                          "(little-endian bool, int, uint or float)")
    row_shape = list(a.shape[1:])
    row_bytes = int(a.itemsize * int(np.prod(row_shape, dtype=np.int64)))
    return (int(a.ctypes.data), int(a.shape[0]), row_bytes, descr, row_shape, a)


class ArrayLoader(LoaderBase):
    """Batches of rows from equally long arrays: NumPy arrays (any C-contiguous numeric dtype)
    or ``.npy`` files, which are memory-mapped (only the rows a batch touches are read).

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
        if output not in ("auto", "torch", "numpy"):
            raise ConfigError(f"invalid argument `output`: {output!r}; allowed: auto, torch, numpy")
        _positive_int("batch_size", batch_size)
        _positive_int("prefetch", prefetch)
        n_threads = None if threads == "auto" else _positive_int("threads", threads)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"invalid argument `seed`: expected a non-negative integer, got {seed!r}")
        rank = _env_int("RANK") or 0 if rank is None else rank
        world_size = _env_int("WORLD_SIZE") or 1 if world_size is None else world_size
        _positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"invalid argument `rank`: must be in 0..{world_size - 1}, got {rank!r}")
        self._columns = [_column(a) for a in arrays]
        self._config = {
            "sampler": {"batch_size": batch_size, "shuffle": bool(shuffle), "seed": seed,
                        "drop_last": bool(drop_last), "rank": rank, "world_size": world_size},
            "threads": n_threads,
            "prefetch": prefetch,
            "memory_limit": parse_bytes(memory_limit),
        }
        self._ordinal, on_gpu = check_device(device)
        self._device = device
        if on_gpu and output == "numpy":
            raise ConfigError(f"invalid argument `output`: device={device!r} delivers torch tensors; "
                              "use output='torch' or 'auto'")
        self._torch = _want_torch("torch" if on_gpu else output)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self._start()

    def _new_native(self) -> _stoker.ArrayLoader:
        return _stoker.ArrayLoader(self._columns, json.dumps(self._config), self._device, self._ordinal)

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
