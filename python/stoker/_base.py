"""What the loaders share: fork safety and the epoch/resume surface."""

from __future__ import annotations

import json
import operator
import os
from typing import Any, Protocol

from ._device import local_rank
from ._output import converter
from .errors import ConfigError

# Loaders inherited through fork() are replaced in the child; the originals are kept alive here
# (never dropped), because their threads and locks belong to the parent process.
_INHERITED: list[Any] = []


class _Native(Protocol):
    """The part of the native loader classes the shared surface uses."""

    def __len__(self) -> int: ...
    @property
    def threads(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    def set_epoch(self, epoch: object) -> None: ...
    def state(self) -> tuple[int, int, int]: ...
    def elastic_json(self) -> str | None: ...
    def load_state(self, seed: int, epoch: int, next_batch: int, resume: bool = True,
                   elastic_json: str | None = None) -> None: ...
    def fingerprint_json(self) -> str: ...
    def state_json(self) -> str: ...
    def load_state_json(self, state_json: str) -> None: ...
    def load_states_json(self, states_json: str) -> None: ...
    @property
    def device(self) -> str: ...
    def device_report_json(self) -> str: ...
    def report_json(self) -> str: ...
    def report_text(self) -> str: ...


class LoaderBase:
    """Fork-safe access to the native loader, epochs and resumable state."""

    _native: Any
    _device: str
    _torch: bool
    _pid: int

    def _new_native(self) -> Any:
        raise NotImplementedError

    def _start(self) -> None:
        self._native = self._new_native()
        self._pid = os.getpid()
        # The batch converter's module (numpy or torch) is imported now, not at the first
        # iteration: a Ctrl-C that lands inside an import turns into an ImportError, and a
        # failed `import torch` cannot be retried in the same process.
        converter(bool(getattr(self, "_torch", False)))

    def _to_device(self, used: str, output: str) -> None:
        """After the engine resolved the device (``used``: ``cpu`` or ``cuda:N``): batches on a
        GPU are torch tensors, so ``output='numpy'`` is refused and torch is imported now."""
        if used == "cpu":
            return
        if output == "numpy":
            raise ConfigError(f"invalid argument `output`: device={self._device!r} delivers torch tensors; "
                              "use output='torch' or 'auto'")
        self._torch = True
        converter(True)

    def _base(self) -> _Native:
        """The native loader of this process (rebuilt after a fork, keeping the position)."""
        if os.getpid() != self._pid:
            old = self._native
            _INHERITED.append(old)
            self._native = self._new_native()
            self._adopt(old, self._native)
            self._pid = os.getpid()
        native: _Native = self._native
        return native

    def _adopt(self, old: Any, new: Any) -> None:
        """Gives ``new`` (rebuilt in a fork child) the parent's position ``old`` had (with its
        elastic base), and whether it was still to be resumed."""
        seed, epoch, next_batch = old.state()
        new.load_state(seed, epoch, next_batch, old.resume_pending, old.elastic_json())

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._base())

    @property
    def threads(self) -> int:
        """Worker threads in use."""
        return self._base().threads

    @property
    def batch_size(self) -> int:
        """Samples (rows) per batch."""
        return self._base().batch_size

    @property
    def rank(self) -> int:
        """This process's rank (``rank=``, else the initialised ``torch.distributed`` default
        group's, else torchrun's ``RANK``, else 0)."""
        return self._base().rank

    @property
    def world_size(self) -> int:
        """Ranks sharing the dataset (``world_size=``, else the initialised
        ``torch.distributed`` default group's, else torchrun's ``WORLD_SIZE``, else 1)."""
        return self._base().world_size

    @property
    def local_rank(self) -> int:
        """This process's GPU index on its node (torchrun's ``LOCAL_RANK``; 0 when unset)."""
        return local_rank()

    @property
    def device(self) -> str:
        """Where batches are delivered: ``'cpu'`` or ``'cuda:N'``."""
        return self._base().device

    def device_report(self) -> dict[str, Any]:
        """``{requested, used, note}`` for the ``device=`` argument."""
        report: dict[str, Any] = json.loads(self._base().device_report_json())
        return report

    def report(self) -> dict[str, Any]:
        """What the loader did, the same keys for every kind: ``wall_seconds`` (of its passes),
        ``samples`` (rows for arrays and tokens) delivered, ``stages`` (each with ``name``,
        ``threads``, ``items``, ``busy_seconds``, ``wait_seconds``, ``utilization``: the kind's
        stages, then ``buffer wait``, ``consumer`` and, on a GPU, ``transfer``), ``starvation``
        (the consumer's share of time waiting for data) and ``starvation_steady`` (the same
        without each pass's first batch, the pipeline's fill: what the verdict weighs), ``cpu``
        (the CPU clocks over the passes: ``process_seconds`` and ``process_cores`` of the whole
        process, ``workers_seconds`` and ``workers_busy`` of the threads doing the per-sample
        work, their ``threads``, the ``allowance`` of cores, ``host_busy``: the host's busy
        share), ``bottleneck`` (``{stage, reason,
        suggestion}``: the stage that limits the rate, ``consumer`` when the training step does,
        and what to change; ``None`` before a token loader's first iteration), ``skipped_count``
        and ``skipped``, ``device``, ``transfer`` and ``tuning``; beside them the kind's own keys
        (images: ``decode_warnings``, ``restart_decodes``, ``augment_ops`` (``[{name, count,
        seconds}]``: the ``augment`` stage op by op), ``cache``, ``gpu_decode``; tokens: the
        :meth:`stats` counters, ``tokenizer``, ``cache``; arrays: ``batches``, ``columns``,
        ``bytes_copied``)."""
        report: dict[str, Any] = json.loads(self._base().report_json())
        return report

    def report_text(self) -> str:
        """The human summary of :meth:`report`: the stage table and the bottleneck verdict."""
        return self._base().report_text()

    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch (its shuffle and augmentations). Changing it restarts at batch 0;
        setting the current epoch again keeps a restored position."""
        self._base().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """A small, JSON-serialisable position: ``{seed, epoch, next_batch}`` and the
        ``fingerprint`` of what it is valid for (sample count and a hash of the sample list,
        batch size, drop_last, shuffle mode, world size, rank, transform). In an epoch continued
        from other ranks' states (:meth:`load_state_dict` of a list) it also has ``elastic``,
        the saved runs that epoch continues (``version`` 3): ``next_batch`` counts batches of the
        continued epoch, so the state resumes it exactly, on a loader of the same ranks."""
        state: dict[str, Any] = json.loads(self._base().state_json())
        return state

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Restores a position from :meth:`state_dict`: the next ``iter()`` resumes with exactly
        the batches that were still to come (a running iterator becomes stale). The engine checks
        the state field by field (``seed``, ``epoch``, ``next_batch``: non-negative integers;
        ``version``; ``elastic``; the ``fingerprint``'s fields); a bad value, or a state saved by
        a loader with another dataset, batch size, sharding, shuffle or transform, is refused with
        a :class:`ConfigError` naming the field.

        Elastic resume: given the list of every rank's state (``dist.all_gather_object``; any
        order), the epoch continues on this loader's ranks, however many. Its remaining samples
        are the epoch's shuffled order less every sample that a saved rank delivered (its first
        ``next_batch`` batches), in that order; they are dealt to the new ranks as a normal epoch
        is, with equal batch counts on every rank. With ``drop_last`` the last ``R % (world_size
        * batch_size)`` of the ``R`` remaining samples are not delivered (with ``drop_last`` a
        normal epoch drops its tail too; samples that the saved ranks' epoch dropped are among
        the remaining ones); without it, the last batch on a rank may be short and fewer than
        ``world_size`` samples from the start of the remainder are delivered twice, to pad every
        rank to the same count. So each sample of the epoch is delivered exactly once, before or
        after the resume, up to that remainder. ``len()`` is the continued epoch's batch count
        until the next epoch, which is a normal one. The states must be of one run: the same
        seed, epoch, world size and elastic base, every rank ``0..world_size-1`` once, and
        fingerprints equal to this loader's but for ``rank`` and ``world_size``; otherwise a
        :class:`ConfigError` names the list element and field (``state[2]['epoch']``). States
        taken within a continued epoch may be given as such a list again."""
        try:
            text = json.dumps(state, default=_json_integer, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as e:
            raise ConfigError(f"invalid argument `state`: expected a dict from state_dict(): {e}") from None
        if isinstance(state, list):
            self._base().load_states_json(text)
        else:
            self._base().load_state_json(text)


def _json_integer(value: Any) -> int:
    """For ``json.dumps``: integer-like objects (NumPy integers, 0-d integer tensors) as ints;
    anything else cannot be part of a state."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{value!r} (of type {type(value).__name__}) is not a value of a state") from None


__all__ = ["LoaderBase"]
