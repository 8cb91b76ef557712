"""The ``output=`` argument: batches as torch tensors or NumPy arrays (DLPack either way)."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable

from .errors import ConfigError

_OUTPUTS = ("auto", "torch", "numpy")


def torch_module() -> Any:
    """PyTorch, imported on first use. Never imported statically: ``import stoker`` does not
    load torch, and the package type-checks the same with or without torch installed."""
    torch = importlib.import_module("torch")
    importlib.import_module("torch.utils.dlpack")
    return torch


def converter(torch_output: bool) -> Callable[[Any], Any]:
    """``torch.from_dlpack`` or ``numpy.from_dlpack``."""
    if torch_output:
        from_dlpack: Callable[[Any], Any] = torch_module().utils.dlpack.from_dlpack
        return from_dlpack
    import numpy as np

    return np.from_dlpack


def want_torch(output: Any) -> bool:
    """Whether batches become torch tensors: ``output='torch'``, or ``'auto'`` with PyTorch
    installed. Torch itself is imported only when the first batch is converted."""
    if output not in _OUTPUTS:
        raise ConfigError(f"invalid argument `output`: {output!r}; allowed: {', '.join(_OUTPUTS)}")
    if output == "numpy":
        return False
    if importlib.util.find_spec("torch") is None:
        if output == "torch":
            raise ConfigError("invalid argument `output`: 'torch' needs PyTorch installed; use output='numpy'")
        return False
    return True


__all__ = ["converter", "torch_module", "want_torch"]
