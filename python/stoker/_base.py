"""What the loaders share: fork safety, the epoch/resume surface and the batch iterator."""

from __future__ import annotations

import os
from typing import Any, Callable, Protocol

from .errors import ConfigError

# Loaders inherited through fork() are replaced in the child; the originals are kept alive here
# (never dropped), because their threads and locks belong to the parent process.
_INHERITED: list[Any] = []


class _Native(Protocol):
    """The part of the native loader classes the shared surface uses."""

    def __len__(self) -> int: ...
    @property
    def threads(self) -> int: ...
    def set_epoch(self, epoch: int) -> None: ...
    def state(self) -> tuple[int, int, int]: ...
    def load_state(self, seed: int, epoch: int, next_batch: int) -> None: ...


def converter(torch_output: bool) -> Callable[[Any], Any]:
    """``torch.from_dlpack`` or ``numpy.from_dlpack``."""
    if torch_output:
        import torch.utils.dlpack

        return torch.utils.dlpack.from_dlpack
    import numpy as np

    return np.from_dlpack


class BatchIterator:
    """Yields one converted tensor per exported view of each native batch; keeps no reference
    to a batch it has handed out, so a batch returns to the pool as soon as the caller drops
    its tensors."""

    def __init__(self, native: Any, convert: Callable[[Any], Any], views: Callable[[Any], tuple[Any, ...]]) -> None:
        self._native = native
        self._convert = convert
        self._views = views

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> tuple[Any, ...]:
        b = self._native.__next__()
        return tuple(self._convert(v) for v in self._views(b))

    def close(self) -> None:
        """Stops the iteration now; every worker thread is joined."""
        self._native.close()


class LoaderBase:
    """Fork-safe access to the native loader, epochs and resumable state."""

    _native: Any
    _pid: int
    rank: int
    world_size: int

    def _new_native(self) -> Any:
        raise NotImplementedError

    def _start(self) -> None:
        self._native = self._new_native()
        self._pid = os.getpid()

    def _base(self) -> _Native:
        """The native loader of this process (rebuilt after a fork, keeping the position)."""
        if os.getpid() != self._pid:
            old = self._native
            _INHERITED.append(old)
            seed, epoch, next_batch = old.state()
            self._native = self._new_native()
            self._native.load_state(seed, epoch, next_batch)
            self._pid = os.getpid()
        native: _Native = self._native
        return native

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._base())

    @property
    def threads(self) -> int:
        """Worker threads in use."""
        return self._base().threads

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (its shuffle and augmentations). Changing it restarts at batch 0;
        setting the current epoch again keeps a restored position."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"invalid argument `epoch`: expected a non-negative integer, got {epoch!r}")
        self._base().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable position: ``{seed, epoch, next_batch}`` plus checks."""
        seed, epoch, next_batch = self._base().state()
        return {"version": 1, "seed": seed, "epoch": epoch, "next_batch": next_batch,
                "batches_per_epoch": len(self), "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a position from :meth:`state_dict`: iteration resumes with exactly the
        batches that were still to come."""
        try:
            seed, epoch, next_batch = int(state["seed"]), int(state["epoch"]), int(state["next_batch"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError("invalid argument `state`: expected a dict from state_dict() with seed, epoch, "
                              "next_batch") from None
        if state.get("world_size", self.world_size) != self.world_size:
            raise ConfigError(f"invalid argument `state`: saved with world_size={state['world_size']}, "
                              f"this loader has {self.world_size}")
        self._base().load_state(seed, epoch, next_batch)


__all__ = ["BatchIterator", "LoaderBase", "converter"]
