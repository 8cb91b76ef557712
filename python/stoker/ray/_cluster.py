"""Joining a Ray cluster and waiting on its tasks with a deadline: what `stoker.ray`'s commands share."""

from __future__ import annotations

import importlib
import sys
import time
from typing import Any, Callable, Sequence

from .. import _stoker
from ..errors import StokerError

#: The environment variable only tests set: a folder; while it holds a file ``armed``, a task
#: kills its own worker process (SIGKILL) once per stage, leaving a half-written file, to show
#: that Ray's retry gives the same output (``prepare`` and ``write`` marker files record it).
KILL_ONCE_VAR = "STOKER_RAY_TEST_KILL_ONCE"


def import_ray() -> Any:
    """The ``ray`` module, or a `StokerError` saying how to install it."""
    try:
        return importlib.import_module("ray")
    except ImportError as e:
        raise StokerError(f"stoker.ray needs Ray: pip install 'stoker[ray]' ({e})") from None


def connect(address: str | None) -> Any:
    """``ray``, joined to the cluster at ``address`` (checked as ``--ray`` checks it; ``None``:
    the one this process already joined, else ``ray.init()``'s default)."""
    if address is not None:
        address = _stoker.ray_address(address)
    ray = import_ray()
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    return ray


def wait_all(ray: Any, refs: Sequence[Any], what: Callable[[int], str], timeout: float, label: str,
             progress: bool) -> list[Any]:
    """The results of ``refs`` in their order, each within ``timeout`` seconds of the previous
    one finishing (so a hung task is an error naming it, ``what(i)``, not a hang); ``progress``
    prints ``label: done/total`` on stderr."""
    results: dict[int, Any] = {}
    index = {ref: i for i, ref in enumerate(refs)}
    pending = list(refs)
    last = time.monotonic()
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, last + timeout - time.monotonic()))
        if not ready:
            stuck = sorted(index[r] for r in pending)
            for r in pending:
                ray.cancel(r, force=True)
            raise StokerError(f"{label}: no task finished within {timeout:.0f} s; still running: "
                              + ", ".join(what(i) for i in stuck[:5]) + (" ..." if len(stuck) > 5 else ""))
        for r in ready:
            results[index[r]] = ray.get(r, timeout=timeout)
        last = time.monotonic()
        if progress:
            print(f"\r{label}: {len(results)}/{len(refs)}", end="", file=sys.stderr, flush=True)
    if progress and refs:
        print(file=sys.stderr)
    return [results[i] for i in range(len(refs))]
