"""Every live iteration of the process, closed at interpreter exit."""

from __future__ import annotations

import atexit
import weakref
from typing import Any

# Every live iteration of this process, weakly: at interpreter exit they are closed (their
# transfer and worker threads joined) before the CUDA driver shuts down, so no stoker thread
# calls into a driver that is going away. Plain `weakref.ref`s without callbacks, pruned when a
# new one is added: a callback (as `weakref.WeakSet` uses) is Python code that runs inside an
# object's deallocation, where a pending KeyboardInterrupt would be raised and then swallowed
# as an "unraisable" exception. Nothing stoker runs while an object dies executes Python code.
_LIVE: dict[int, weakref.ref[Any]] = {}


def track(iteration: Any) -> Any:
    """Registers an iteration (anything with ``close()``) to be closed at interpreter exit;
    returns it. Objects that cannot be weakly referenced are left alone."""
    try:
        ref = weakref.ref(iteration)
    except TypeError:
        return iteration
    for key in [k for k, r in _LIVE.items() if r() is None]:
        del _LIVE[key]
    _LIVE[id(iteration)] = ref
    return iteration


def close_live_iterations() -> int:
    """Closes every live iteration of this process (the ``atexit`` hook); returns how many.
    Never raises: interpreter exit must go on."""
    closed = 0
    for ref in list(_LIVE.values()):
        it = ref()
        if it is None:
            continue
        try:
            it.close()
            closed += 1
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
    _LIVE.clear()
    return closed


atexit.register(close_live_iterations)


__all__ = ["close_live_iterations", "track"]
