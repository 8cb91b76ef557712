"""A loader's arguments as the JSON object the engine checks (``stoker::args``)."""

from __future__ import annotations

import json
import operator
from typing import Any

from ._device import process_group
from .errors import ConfigError


def arguments_json(**args: Any) -> str:
    """The loader's arguments as the JSON object the engine checks (``stoker::args``): values
    pass through unchanged; ``None`` means the engine's default. Integer-like objects (NumPy
    integers) become ints; anything JSON cannot carry is a :class:`ConfigError` naming it.
    A loader that shards (``world_size`` is one of its arguments) also gets the rank and size
    of the initialised ``torch.distributed`` default group, if any (``group_rank``,
    ``group_world_size``): the engine takes its ranks from them when none are given."""
    out: dict[str, Any] = {}
    group = process_group() if "world_size" in args else None
    if group is not None:
        out["group_rank"], out["group_world_size"] = group
    for name, value in args.items():
        if value is None:
            continue
        if isinstance(value, (bool, int, float, str, list, dict)):
            out[name] = value
            continue
        try:
            out[name] = operator.index(value)
        except TypeError:
            raise ConfigError(f"invalid argument `{name}`: unsupported value {value!r} of type "
                              f"{type(value).__name__}") from None
    return json.dumps(out)


__all__ = ["arguments_json"]
