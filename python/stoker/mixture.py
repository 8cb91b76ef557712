"""Weighted mixtures of sources: the ``mixture`` argument every loader kind sends the engine,
and the ``sources`` ids of a mixture's batches.

A mixture is given as a dict ``{name: source}``; a source is ``(data, weight)`` or a dict with
``weight``, the kind's data field (``root`` for images) and its options (``exhausted``:
``'repeat'`` or ``'stop'``; ``label_offset`` for images). The engine checks every field
(``stoker::args``); this module only rearranges them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

from .errors import ConfigError


def _plain(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def mixture_argument(sources: Mapping[str, Any], data_field: str, epoch_items: int | None) -> dict[str, Any]:
    """The engine's ``mixture`` argument for ``sources`` (``{name: (data, weight) | {...}}``):
    ``data_field`` names what a tuple's first item is (``root`` for images)."""
    if not sources:
        raise ConfigError("invalid argument `mixture`: has no source")
    out = []
    for name, source in sources.items():
        if isinstance(source, Mapping):
            fields = {k: _plain(v) for k, v in source.items()}
        elif isinstance(source, (tuple, list)) and len(source) == 2:
            fields = {data_field: _plain(source[0]), "weight": source[1]}
        else:
            raise ConfigError(f"invalid argument `mixture`: mixture source {name!r}: expected ({data_field}, weight) "
                              f"or a dict with {data_field!r} and 'weight', got {source!r}")
        out.append({"name": str(name), **fields})
    arg: dict[str, Any] = {"sources": out}
    if epoch_items is not None:
        arg["epoch_items"] = epoch_items
    return arg


class SourceIds:
    """Turns a batch's dataset indices into the ids of the mixture's sources they come from
    (the order of the mixture's dict)."""

    def __init__(self, mixture_json: str) -> None:
        import numpy as np

        self.sources: list[dict[str, Any]] = json.loads(mixture_json)
        self._starts = np.array([s["start"] for s in self.sources], dtype=np.int64)

    @property
    def names(self) -> list[str]:
        """The sources' names, by id."""
        return [s["name"] for s in self.sources]

    def __call__(self, indices: Any) -> Any:
        import numpy as np

        idx = np.asarray(indices, dtype=np.int64)
        return np.searchsorted(self._starts, idx, side="right").astype(np.int64) - 1
