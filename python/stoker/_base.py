"""What the loaders share: fork safety, the epoch/resume surface and the batch iterator."""

from __future__ import annotations

import atexit
import importlib
import json
import operator
import os
import sys
import weakref
from typing import Any, Callable, Protocol, Sequence

from .errors import ConfigError

# Loaders inherited through fork() are replaced in the child; the originals are kept alive here
# (never dropped), because their threads and locks belong to the parent process.
_INHERITED: list[Any] = []


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
    def load_state_json(self, state_json: str) -> None: ...
    def load_states_json(self, states_json: str) -> None: ...
    @property
    def device(self) -> str: ...
    def device_report_json(self) -> str: ...
    def report_json(self) -> str: ...
    def report_text(self) -> str: ...


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
    group = process_group()
    if "LOCAL_RANK" in os.environ or group is None:
        return local_rank()
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
    """torchrun's ``LOCAL_RANK`` (0 when unset)."""
    from . import _stoker

    return _stoker.local_rank()


def gpu_present() -> bool:
    """Whether the CUDA driver reports at least one device (no device is opened)."""
    import json

    from . import _stoker

    return bool(json.loads(_stoker.cuda_probe_json())["devices"])


def normalize_table(mean: Sequence[float], std: Sequence[float]) -> Any:
    """The engine's normalisation table (``stoker::ops::normalize_table``, the CPU path's own
    values): for channel ``c`` and byte ``v``, ``(v / 255 - mean[c]) / std[c]`` in float32 with
    true division. A ``(3, 256)`` float32 NumPy array."""
    import numpy as np

    from . import _stoker

    raw = _stoker.normalize_table([float(m) for m in mean], [float(s) for s in std])
    table: Any = np.frombuffer(raw, dtype="<f4").reshape(3, 256).copy()
    return table


class Normalizer:
    """uint8 images to normalised ``dtype`` with torch ops, on the tensor's device and the
    current stream. This is how batches that crossed the bus as uint8 are normalised on the GPU.

    Bit-identical to host batches by construction: the engine normalises through a table of
    ``(v / 255 - mean) / std`` per channel and byte value; this looks the bytes up in the same
    table (:func:`normalize_table`, float32 arithmetic on the host), so no device arithmetic is
    involved (CUDA's division by a scalar multiplies by the reciprocal, 1 ulp off for some
    values). float16/bfloat16 are the float32 values rounded to nearest even, as on the CPU."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: Any, channels_last: bool) -> None:
        self._table = normalize_table(mean, std)
        self._dtype = str(dtype).replace("torch.", "")  # a name or a torch dtype
        self._channels_last = channels_last
        self._consts: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, x: Any) -> Any:
        torch = torch_module()

        c = self._consts.get(x.device)
        if c is None:
            channels = self._table.shape[0]
            shape = (1, 1, 1, -1) if self._channels_last else (1, -1, 1, 1)
            table = torch.from_numpy(self._table.reshape(-1).copy()).to(x.device)
            offsets = (torch.arange(channels, dtype=torch.int32) * 256).reshape(shape).to(x.device)
            c = self._consts[x.device] = (table, offsets)
        table, offsets = c
        # Flat index of (channel, byte) into the table: an exact gather, no arithmetic on floats.
        index = x.to(torch.int32).add_(offsets)
        y = table.index_select(0, index.reshape(-1)).reshape(x.shape)
        return y if self._dtype == "float32" else y.to(getattr(torch, self._dtype))


class Mixer:
    """MixUp/CutMix of a batch's images with torch ops, on the tensor's device and the current
    stream: how batches bound for a GPU are mixed there, after the :class:`Normalizer` (or raw,
    for ``dtype=uint8``). The engine draws each batch's mix and makes its soft labels on the host
    (``stoker::image::ops::mix``); this applies the draw (``Loader.mix_params``) to the images
    with the host's arithmetic exactly, so a GPU batch equals the host batch bit for bit:

    - float32 ``x * lam + partner * (1 - lam)``, ``lam`` and ``1 - lam`` float32 scalars, each
      product and the sum rounded to float32 (two ``mul`` and an ``add``: no fused multiply-add);
      float16/bfloat16 the same with each result rounded to that dtype;
    - uint8: the float32 value above rounded half to even, clamped to 0..255;
    - CutMix copies the box ``area = [y0, y1, x0, x1]`` from the partner (exact);
    - partner: ``style='torchvision'`` rolls the batch by one (``i`` takes ``i - 1``, the first
      the last), ``'timm'`` flips it (``i`` takes ``n - 1 - i``).

    A batch of fewer than two samples, or a draw with ``lam >= 1``, is returned unchanged."""

    def __init__(self, style: str, channels_last: bool) -> None:
        if style not in ("torchvision", "timm"):
            raise ConfigError(f"invalid argument `batch_transform`: unknown mixing style {style!r}")
        self._style = style
        self._channels_last = channels_last

    def _partner(self, x: Any) -> Any:
        """The partners of the rows of ``x`` (a new tensor)."""
        torch = torch_module()
        return torch.roll(x, 1, 0) if self._style == "torchvision" else x.flip(0)

    def __call__(self, x: Any, params: dict[str, Any] | None, inplace: bool = False) -> Any:
        """``x`` (``[N, C, H, W]``, or ``[N, H, W, C]`` with ``channels_last``) mixed by the draw
        ``params`` (``{"cutmix", "lam", "area"}``; ``None``: unmixed). ``inplace``: ``x`` may be
        overwritten (a tensor of the caller's own, such as the normaliser's output)."""
        if params is None or x.shape[0] < 2 or float(params["lam"]) >= 1.0:
            return x
        torch = torch_module()
        area = params.get("area") if params["cutmix"] else None
        if area is not None:
            y0, y1, x0, x1 = (int(v) for v in area)
            rows, cols = slice(y0, y1), slice(x0, x1)
            box = (slice(None), rows, cols) if self._channels_last else (slice(None), slice(None), rows, cols)
            out = x if inplace else x.clone()
            out[box] = self._partner(x[box])  # the partners' box is a copy, made before the write
            return out
        lam = float(params["lam"])
        l0, l1 = lam, 1.0 - lam  # python floats: torch uses them as scalars of the tensor's dtype
        if x.dtype == torch.uint8:
            f = x.to(torch.float32)
            other = self._partner(f).mul_(l1)
            return f.mul_(l0).add_(other).round_().clamp_(0, 255).to(torch.uint8)
        # Separate products and sum, each rounded to x's dtype (as the host does).
        other = self._partner(x).mul_(l1)
        own = x.mul_(l0) if inplace else x.mul(l0)
        return own.add_(other)


class BatchIterator:
    """Yields one converted tensor per exported view of each native batch; keeps no reference
    to a batch it has handed out, so a batch returns to the pool as soon as the caller drops
    its tensors."""

    def __init__(self, native: Any, convert: Callable[[Any], Any], views: Callable[[Any], tuple[Any, ...]],
                 first: Callable[[Any], Any] | None = None,
                 mix: Callable[[Any, Any], Any] | None = None) -> None:
        self._native = native
        self._convert = convert
        self._views = views
        self._first = first
        self._mix = mix
        track(self)

    def __iter__(self) -> BatchIterator:
        return self

    def _images(self, images: Any, b: Any) -> Any:
        """The first view after ``first`` (the normaliser), then ``mix`` (given the native
        batch ``b``, for its draw)."""
        if self._first is not None:
            images = self._first(images)
        if self._mix is not None:
            images = self._mix(images, b)
        return images

    def __next__(self) -> tuple[Any, ...]:
        b = self._native.__next__()
        out = tuple(self._convert(v) for v in self._views(b))
        if self._first is not None or self._mix is not None:
            out = (self._images(out[0], b),) + out[1:]
        return out

    def close(self) -> None:
        """Stops the iteration now; every worker thread is joined."""
        self._native.close()


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
        native = self._base()
        seed, epoch, next_batch = native.state()
        elastic = native.elastic_json()
        state: dict[str, Any] = {
            "version": 2 if elastic is None else 3, "seed": seed, "epoch": epoch, "next_batch": next_batch,
            "batches_per_epoch": len(self), "rank": self.rank, "world_size": self.world_size,
            "fingerprint": json.loads(native.fingerprint_json())}
        if elastic is not None:
            state["elastic"] = json.loads(elastic)
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


__all__ = ["BatchIterator", "LoaderBase", "Mixer", "Normalizer", "native_device", "close_live_iterations",
           "normalize_table", "track", "converter", "device_ordinal", "gpu_present",
           "local_rank", "process_group"]
