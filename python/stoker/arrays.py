"""`ArrayLoader`: the cure for ``TensorDataset`` + ``DataLoader`` on numeric arrays."""

from __future__ import annotations

import mmap
import os
import sys
from typing import Any, Iterator, Mapping

from . import _stoker
from ._args import arguments_json
from ._base import LoaderBase
from ._batches import BatchIterator
from ._device import native_device
from ._output import converter, want_torch
from .errors import ConfigError
from .mixture import SourceIds, mixture_argument


def _source_arrays(source: dict[str, Any]) -> tuple[Any, ...]:
    """Takes a mixture source's arrays out of its fields (the engine gets them beside the
    arguments)."""
    arrays = source.pop("arrays", None)
    if not isinstance(arrays, (list, tuple)) or not arrays:
        raise ConfigError(f"invalid argument `mixture`: mixture source {source['name']!r}: expected a tuple of "
                          f"arrays, got {arrays!r}")
    return tuple(arrays)


def _column(a: Any) -> Any:
    """A `.npy` path (its rows read by stoker as batches need them) or an object exporting its
    memory through the buffer protocol (NumPy arrays, ``bytes``, ``bytearray``, ...), which stoker reads in place
    and checks itself (C-contiguous, a supported element type, at least one dimension)."""
    if isinstance(a, (str, os.PathLike)):
        path = os.fspath(a)
        if not path.endswith(".npy"):
            raise ConfigError(f"invalid argument `arrays`: {path!r} is not a .npy file")
        return path
    path = _whole_npy_memmap(a)
    if path is not None:
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


def _whole_npy_memmap(a: Any) -> str | None:
    """The `.npy` file behind ``np.load(path, mmap_mode=...)``, when ``a`` is that whole array:
    stoker then reads the file's rows itself (positional reads), so a file truncated meanwhile is
    a ``ReadError`` where reading through the mapping would kill the process with ``SIGBUS``.
    ``None`` for anything else (a slice of it, a raw ``np.memmap``), which is read in place."""
    np = sys.modules.get("numpy")
    if np is None or not isinstance(a, np.memmap) or not isinstance(a.base, mmap.mmap):
        return None
    if getattr(a, "mode", None) not in ("r", "r+"):  # copy-on-write: only the mapping has the writes
        return None
    filename = getattr(a, "filename", None)
    if not isinstance(filename, str) or not filename.endswith(".npy") or not a.flags.c_contiguous:
        return None
    try:
        with open(filename, "rb") as f:
            version = np.lib.format.read_magic(f)
            fmt = np.lib.format
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(f)
            header_end = f.tell()
    except Exception:  # not a .npy NumPy can read: the array is read in place, as before
        return None
    if fortran or tuple(shape) != a.shape or dtype != a.dtype or a.offset != header_end:
        return None
    return filename


class ArrayLoader(LoaderBase):
    """Batches of rows from equally long arrays: NumPy arrays (any C-contiguous numeric dtype)
    or ``.npy`` files, of which only the rows a batch needs are read (positional reads: a file
    truncated meanwhile raises ``ReadError``; a file of at most 32 MiB is read whole when opened).
    A whole ``np.load(path, mmap_mode='r')`` array is read like its path; other memory-mapped
    arrays are read in place, through the mapping (a file truncated under it ends the process
    with ``SIGBUS``, as it would for NumPy itself).

    ``for x, y in stoker.ArrayLoader(x, y, batch_size=256, shuffle=True)`` yields one tensor per
    array, gathered by the sampler's indices with parallel row copies into pooled buffers and
    handed over zero-copy. Same seed/epoch shuffle, ``rank``/``world_size`` sharding (the
    ``torch.distributed`` group's, else torchrun's environment, by default), ``state_dict`` resume
    and ``memory_limit`` as ``ImageLoader``.
    ``device='cuda'`` (``'cuda:N'``, ``'auto'``) delivers each column as a CUDA tensor through
    pinned buffers and stoker's copy stream, as ``ImageLoader`` does.

    A weighted mixture: one dict ``{name: ((x, y), weight)}`` (or ``{name: {"arrays": (x, y),
    "weight": w, "exhausted": "stop"}}``) whose sources have the same columns (element type and
    row shape); it follows the schedule, passes and epochs ``ImageLoader`` documents for
    mixtures (``epoch_items``), and each batch ends with the ``sources`` ids of its rows.
    """

    def __init__(self, *arrays: Any, batch_size: int = 256, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, threads: int | str = "auto", prefetch: int = 2,
                 memory_limit: int | str | None = None, output: str = "auto", rank: int | None = None,
                 world_size: int | None = None, device: str = "cpu", epoch_items: int | None = None) -> None:
        if not arrays:
            raise ConfigError("invalid argument `arrays`: give at least one array or .npy path")
        mixture = None
        if len(arrays) == 1 and isinstance(arrays[0], Mapping):
            mixture = mixture_argument(arrays[0], "arrays", epoch_items)
            arrays = tuple(_source_arrays(source) for source in mixture["sources"])
            if len({len(a) for a in arrays}) != 1:
                raise ConfigError("invalid argument `mixture`: every source needs the same number of arrays, got "
                                  + ", ".join(f"{s['name']!r}: {len(a)}" for s, a in zip(mixture["sources"], arrays)))
            self._width = len(arrays[0])
            arrays = tuple(a for source in arrays for a in source)
        elif epoch_items is not None:
            raise ConfigError("invalid argument `epoch_items`: only a mixture ({name: (arrays, weight)}) has one")
        else:
            self._width = len(arrays)
        self._columns = [_column(a) for a in arrays]
        self._args = arguments_json(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
                                    threads=threads, prefetch=prefetch, memory_limit=memory_limit, rank=rank,
                                    world_size=world_size, mixture=mixture)
        self._device, self._ordinal = native_device(device)
        self._torch = want_torch(output)
        self._start()
        mix = self._loader().mixture_json()
        self._source_ids = SourceIds(mix) if mix is not None else None
        self._to_device(self._loader().device, output)

    @property
    def sources(self) -> list[str] | None:
        """A mixture's source names, by the ids its batches carry (``None``: one set of arrays)."""
        return None if self._source_ids is None else self._source_ids.names

    def _new_native(self) -> _stoker.ArrayLoader:
        return _stoker.ArrayLoader(self._columns, self._args, self._device, self._ordinal)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        n, ids = self._width, self._source_ids
        if ids is None:
            return BatchIterator(self._loader().iter(), converter(self._torch),
                                 lambda b: tuple(b.column(c) for c in range(n)))
        return BatchIterator(self._loader().iter(), converter(self._torch),
                             lambda b: tuple(b.column(c) for c in range(n)) + (ids(b.indices),))

    def _loader(self) -> _stoker.ArrayLoader:
        native: _stoker.ArrayLoader = self._base()  # type: ignore[assignment]
        return native

    def batches(self) -> _stoker.ArrayIterator:
        """The raw iterator of ``stoker._stoker.ArrayBatch`` objects."""
        return self._loader().iter()


__all__ = ["ArrayLoader"]
