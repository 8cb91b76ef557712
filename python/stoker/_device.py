"""Which GPU and which ranks: the ``device=`` argument, ``LOCAL_RANK`` (read and checked by the
engine, ``stoker::args``) and the initialised ``torch.distributed`` group."""

from __future__ import annotations

import json
import sys
from typing import Any


def native_device(device: Any) -> tuple[str, int]:
    """The ``device=`` argument as the engine takes it, and the ordinal that ``cuda`` and
    ``auto`` mean here (:func:`device_ordinal`). The engine parses and checks it (a bad value
    is a :class:`ConfigError`; ``cuda`` without a usable GPU a :class:`DeviceError`, before any
    other check of the engine's) and decides what goes to a GPU."""
    if not isinstance(device, str):
        return repr(device), 0
    return device, (0 if device == "cpu" else device_ordinal())


def device_ordinal() -> int:
    """The ordinal that ``"cuda"`` and ``"auto"`` mean: PyTorch's current device when PyTorch
    has initialised CUDA, else torchrun's ``LOCAL_RANK``, else the rank in the initialised
    ``torch.distributed`` default group modulo the visible GPUs (``mp.spawn`` and SLURM
    scripts that set no ``LOCAL_RANK``), else 0."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                return int(torch.cuda.current_device())
        except Exception:  # pragma: no cover - a broken CUDA setup falls through to LOCAL_RANK
            pass
    given = _native_module().local_rank()
    if given is not None:
        return int(given)
    group = process_group()
    if group is None:
        return 0
    devices = len(json.loads(_native_module().cuda_probe_json())["devices"])
    return group[0] % devices if devices else 0


def process_group() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` default group, or
    ``None`` when there is none (PyTorch not imported, or no group initialised). Loaders take
    their ranks from it when ``rank``/``world_size`` are not given (the engine checks it
    against torchrun's ``RANK``/``WORLD_SIZE``: ``stoker::args``)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def _native_module() -> Any:
    from . import _stoker

    return _stoker


def local_rank() -> int:
    """torchrun's ``LOCAL_RANK`` (0 when unset), as ``stoker::args`` reads and checks it (a value
    that is not a GPU index is a :class:`ConfigError`)."""
    given = _native_module().local_rank()
    return 0 if given is None else int(given)


def gpu_present() -> bool:
    """Whether the CUDA driver reports at least one device (no device is opened)."""
    return bool(json.loads(_native_module().cuda_probe_json())["devices"])


__all__ = ["device_ordinal", "gpu_present", "local_rank", "native_device", "process_group"]
