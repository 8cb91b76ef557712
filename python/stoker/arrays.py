"""`ArrayLoader`: the cure for ``TensorDataset`` + ``DataLoader`` on numeric arrays."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator

from . import _stoker
from .errors import ConfigError
from .loader import _env_int, _positive_int, _want_torch, parse_bytes

_INHERITED: list[Any] = []


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


class ArrayLoader:
    """Batches of rows from equally long arrays: NumPy arrays (any C-contiguous numeric dtype)
    or ``.npy`` files, which are memory-mapped (only the rows a batch touches are read).

    ``for x, y in stoker.ArrayLoader(x, y, batch_size=256, shuffle=True)`` yields one tensor per
    array, gathered by the sampler's indices with parallel row copies into pooled buffers and
    handed over zero-copy. Same seed/epoch shuffle, ``rank``/``world_size`` sharding (torchrun's
    environment by default), ``state_dict`` resume and ``memory_limit`` as ``ImageLoader``.
    """

    def __init__(self, *arrays: Any, batch_size: int = 256, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, threads: int | str = "auto", prefetch: int = 2,
                 memory_limit: int | str | None = None, output: str = "auto", rank: int | None = None,
                 world_size: int | None = None) -> None:
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
        self._torch = _want_torch(output)
        self._native = _stoker.ArrayLoader(self._columns, json.dumps(self._config))
        self._pid = os.getpid()
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size

    def _loader(self) -> _stoker.ArrayLoader:
        if os.getpid() != self._pid:
            old = self._native
            _INHERITED.append(old)
            seed, epoch, next_batch = old.state()
            self._native = _stoker.ArrayLoader(self._columns, json.dumps(self._config))
            self._native.load_state(seed, epoch, next_batch)
            self._pid = os.getpid()
        return self._native

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._loader())

    @property
    def threads(self) -> int:
        """Copy threads in use."""
        return self._loader().threads

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's permutation (changing it restarts at batch 0)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"invalid argument `epoch`: expected a non-negative integer, got {epoch!r}")
        self._loader().set_epoch(epoch)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        convert: Callable[[Any], Any]
        if self._torch:
            import torch.utils.dlpack

            convert = torch.utils.dlpack.from_dlpack
        else:
            import numpy as np

            convert = np.from_dlpack
        return _ArrayIterator(self._loader().iter(), convert, len(self._columns))

    def batches(self) -> _stoker.ArrayIterator:
        """The raw iterator of ``stoker._stoker.ArrayBatch`` objects."""
        return self._loader().iter()

    def state_dict(self) -> dict[str, Any]:
        """``{seed, epoch, next_batch}`` plus checks, JSON-serialisable."""
        seed, epoch, next_batch = self._loader().state()
        return {"version": 1, "seed": seed, "epoch": epoch, "next_batch": next_batch,
                "batches_per_epoch": len(self), "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes exactly where :meth:`state_dict` was taken."""
        try:
            seed, epoch, next_batch = int(state["seed"]), int(state["epoch"]), int(state["next_batch"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError("invalid argument `state`: expected a dict from state_dict()") from None
        self._loader().load_state(seed, epoch, next_batch)


class _ArrayIterator:
    def __init__(self, native: Any, convert: Callable[[Any], Any], n: int) -> None:
        self._native = native
        self._convert = convert
        self._n = n

    def __iter__(self) -> _ArrayIterator:
        return self

    def __next__(self) -> tuple[Any, ...]:
        b = self._native.__next__()
        return tuple(self._convert(b.column(c)) for c in range(self._n))

    def close(self) -> None:
        self._native.close()


__all__ = ["ArrayLoader"]
