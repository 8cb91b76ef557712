"""`ImageLoader`: the drop-in for ``DataLoader(ImageFolder(...))``."""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Sequence

from . import _stoker
from ._base import BatchIterator, LoaderBase, Normalizer, check_device, converter
from .errors import ConfigError
from .transforms import Transform, compile_transforms, dtype_name

_PRESETS = ("imagenet-train", "imagenet-val")
_OUTPUTS = ("auto", "torch", "numpy")
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12, "tib": 2**40}

def parse_bytes(value: int | str | None, name: str = "memory_limit") -> int | None:
    """Bytes from an int or a string like '2GiB', '512MB', '1.5G'."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(f"invalid argument `{name}`: expected bytes (int) or a size like '2GiB', got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", value)
        if not m or m.group(2).lower() not in _UNITS:
            raise ConfigError(f"invalid argument `{name}`: cannot read {value!r}; use bytes or a size like "
                              "'2GiB', '512MB' (units B, KB, KiB, MB, MiB, GB, GiB, TB, TiB)")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise ConfigError(f"invalid argument `{name}`: expected bytes (int) or a size like '2GiB', got {value!r}")
    if n <= 0:
        raise ConfigError(f"invalid argument `{name}`: must be positive, got {value!r}")
    return n


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ConfigError(f"invalid environment variable {name}={v!r}: expected an integer") from None


def _resolve_root(root: Any) -> tuple[str, list[str] | None]:
    """(root, None) for an ImageFolder directory; (first shard, shard list) for shards."""
    import glob

    if isinstance(root, (list, tuple)):
        shards = [os.fspath(p) for p in root]
        if not shards:
            raise ConfigError("invalid argument `root`: the list of shards is empty")
        return shards[0], shards
    path = os.fspath(root)
    if "://" in path:
        return path, [path]  # object storage: stoker lists and matches globs itself
    if os.path.isdir(path):
        return path, None
    if any(c in path for c in "*?["):
        shards = sorted(glob.glob(path))
        if not shards:
            raise ConfigError(f"invalid argument `root`: no file matches {path!r}")
        return shards[0], shards
    if path.endswith(".tar"):
        return path, [path]
    return path, None


def _positive_int(name: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"invalid argument `{name}`: expected a positive integer, got {value!r}")
    return value


def _want_torch(output: str) -> bool:
    if output == "numpy":
        return False
    try:
        import torch  # noqa: F401
    except ImportError:
        if output == "torch":
            raise ConfigError("invalid argument `output`: 'torch' needs PyTorch installed; "
                              "use output='numpy'") from None
        return False
    return True


class ImageLoader(LoaderBase):
    """Batches of decoded, transformed images from an ImageFolder tree (``ROOT/CLASS/IMAGE``).

    Iterating yields ``(images, labels)``: torch tensors (``output='torch'``) or NumPy arrays
    (``output='numpy'``; ``'auto'`` picks torch when importable), zero-copy views of stoker's
    batch buffers. A buffer returns to the pool when every tensor/array viewing it is released.

    ``root`` is an ImageFolder directory, or indexed WebDataset tar shards (made by ``stoker pack``
    or indexed by ``stoker index``): a ``.tar`` path, a glob such as ``"shards/train-*.tar"``, a
    list of shard paths, or the same in object storage (``"s3://bucket/train/shard-*.tar"``,
    ``gs://``, ``az://``, ``http(s)://``; credentials and endpoints from the usual environment
    variables such as ``AWS_ENDPOINT`` and ``AWS_ACCESS_KEY_ID``). Class indices follow
    torchvision's ``ImageFolder``; ``rank``/``world_size`` default to the torchrun environment
    (``RANK``, ``WORLD_SIZE``).

    ``shuffle`` is ``False``, ``True`` (one global permutation per epoch) or ``"shards"`` for shard
    sources on slow storage: the shards are permuted and samples are shuffled within windows of
    ``shard_window`` shards, so a reader only ever touches that many shards at a time.
    ``threads='auto'`` uses the process's CPU allowance (affinity mask and cgroup quota;
    ``STOKER_NUM_THREADS`` overrides it).

    ``device='cuda'`` (``'cuda:N'``; ``'cuda'`` is PyTorch's current device, else ``LOCAL_RANK``)
    delivers CUDA tensors: batch buffers are page-locked, each finished batch is copied on
    stoker's own CUDA stream and the consumer's current stream waits on the copy's event (no
    host synchronisation). Images cross the bus as uint8 and are normalised on the GPU into
    ``dtype`` (float32 by default; float16, bfloat16, or uint8 for none). A batch's device memory
    is reused only after its tensors are dropped and the stream they were used on has passed
    that point. ``device='auto'`` uses a GPU when there is one and otherwise delivers host
    batches (``report()['device']`` says which and why).
    """

    def __init__(self, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], batch_size: int = 256, *,
                 preset: str | None = None, transforms: Sequence[Transform] | None = None,
                 shuffle: bool | str = False, seed: int = 0, drop_last: bool = False, shard_window: int = 4,
                 threads: int | str = "auto", io_threads: int | None = None, prefetch: int = 2,
                 memory_limit: int | str | None = None, on_error: str = "skip", output: str = "auto",
                 rank: int | None = None, world_size: int | None = None, layout: str = "NCHW",
                 dtype: Any = None, apply_exif: bool = True, device: str = "cpu") -> None:
        if preset is not None and transforms is not None:
            raise ConfigError("invalid arguments `preset` and `transforms`: give one, not both")
        if preset is None and transforms is None:
            raise ConfigError("invalid argument `preset`: give preset='imagenet-train' or 'imagenet-val', "
                              "or an explicit transforms=[...] list")
        if preset is not None:
            if preset not in _PRESETS:
                raise ConfigError(f"invalid argument `preset`: {preset!r}; allowed: {', '.join(_PRESETS)}")
            spec = json.loads(_stoker.preset_json(preset))
            ops, out_dtype = spec["ops"], spec["dtype"]
        else:
            if isinstance(transforms, Transform) or not isinstance(transforms, (list, tuple)):
                raise ConfigError("invalid argument `transforms`: expected a list of stoker.transforms")
            ops, out_dtype = compile_transforms(transforms)
        # Normalise in torch (on the GPU) when batches go to a GPU: the engine then writes uint8.
        ordinal, torch_norm = check_device(device)
        bf16 = dtype is not None and str(dtype).replace("torch.", "").lower() == "bfloat16"
        if bf16 and not torch_norm:
            raise ConfigError("invalid argument `dtype`: bfloat16 is produced on the GPU; use device='cuda' "
                              "(or float16/float32 on the CPU)")
        if dtype is not None:
            out_dtype = "bfloat16" if bf16 else dtype_name(dtype)
            if out_dtype == "uint8":
                ops = [o for o in ops if o["op"] != "Normalize"]
        self._normalizer: Normalizer | None = None
        if torch_norm:
            if output == "numpy":
                raise ConfigError(f"invalid argument `output`: device={device!r} delivers torch tensors; "
                                  "use output='torch' or 'auto'")
            if out_dtype != "uint8":
                import torch

                norm = [o for o in ops if o["op"] == "Normalize"]
                mean, std = (norm[-1]["mean"], norm[-1]["std"]) if norm else ([0.0] * 3, [1.0] * 3)
                self._normalizer = Normalizer(mean, std, getattr(torch, out_dtype), layout.upper() == "NHWC")
                ops = [o for o in ops if o["op"] != "Normalize"]
                out_dtype = "uint8"
        if not isinstance(layout, str) or layout.upper() not in ("NCHW", "NHWC"):
            raise ConfigError(f"invalid argument `layout`: {layout!r}; allowed: NCHW, NHWC")
        if on_error not in ("skip", "raise"):
            raise ConfigError(f"invalid argument `on_error`: {on_error!r}; allowed: skip, raise")
        if output not in _OUTPUTS:
            raise ConfigError(f"invalid argument `output`: {output!r}; allowed: {', '.join(_OUTPUTS)}")
        _positive_int("batch_size", batch_size)
        _positive_int("prefetch", prefetch)
        _positive_int("io_threads", io_threads, allow_none=True)
        if threads == "auto":
            n_threads = None
        else:
            n_threads = _positive_int("threads", threads)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"invalid argument `seed`: expected a non-negative integer, got {seed!r}")
        if rank is None:
            rank = _env_int("RANK") or 0
        if world_size is None:
            world_size = _env_int("WORLD_SIZE") or 1
        _positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigError(f"invalid argument `rank`: must be in 0..{world_size - 1} (world_size={world_size}), "
                              f"got {rank!r}")
        if shuffle not in (True, False, "global", "shards"):
            raise ConfigError(f"invalid argument `shuffle`: {shuffle!r}; allowed: False, True, 'global', 'shards'")
        _positive_int("shard_window", shard_window)
        self._root, self._shards = _resolve_root(root)
        self._torch = _want_torch("torch" if torch_norm else output)
        self._device, self._ordinal = device, ordinal
        self._config = {
            "sampler": {"batch_size": batch_size, "shuffle": bool(shuffle), "seed": seed,
                        "drop_last": bool(drop_last), "rank": rank, "world_size": world_size,
                        "shard_window": shard_window if shuffle == "shards" else None},
            "transform": {"ops": ops, "dtype": out_dtype, "layout": layout.upper(), "apply_exif": bool(apply_exif)},
            "threads": n_threads,
            "io_threads": io_threads,
            "prefetch": prefetch,
            "memory_limit": parse_bytes(memory_limit),
            "on_error": on_error,
            "dct_scaling": True,
            "roi": True,
        }
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self._start()
        #: This process's GPU index on its node (torchrun's ``LOCAL_RANK``; 0 when unset).
        self.local_rank = _env_int("LOCAL_RANK") or 0

    def _new_native(self) -> _stoker.Loader:
        return _stoker.Loader(self._root, json.dumps(self._config), self._shards, self._device, self._ordinal)

    @property
    def device(self) -> str:
        """Where batches are delivered: ``'cpu'`` or ``'cuda:N'``."""
        return self._loader().device

    def _loader(self) -> _stoker.Loader:
        native: _stoker.Loader = self._base()  # type: ignore[assignment]
        return native

    @property
    def classes(self) -> list[str]:
        """Class names, in label order."""
        return self._loader().classes

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Class name to label, as torchvision's ``ImageFolder.class_to_idx``."""
        return {c: i for i, c in enumerate(self._loader().classes)}

    @property
    def num_samples(self) -> int:
        """Samples in the dataset (all ranks)."""
        return self._loader().num_samples

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return BatchIterator(self._loader().iter(), converter(self._torch), lambda b: (b.images, b.labels),
                             self._normalizer)

    def batches(self) -> _stoker.Iterator:
        """The raw batch iterator (``stoker._stoker.Batch`` objects with ``images``, ``labels``,
        ``indices``, ``index``), for callers that convert themselves."""
        return self._loader().iter()

    def report(self) -> dict[str, Any]:
        """Telemetry: per-stage counters, starvation, the bottleneck verdict, skipped files."""
        report: dict[str, Any] = json.loads(self._loader().report_json())
        return report

    def report_text(self) -> str:
        """The human summary with the stage table and the bottleneck verdict."""
        return self._loader().report_text()

    def __repr__(self) -> str:
        return (f"ImageLoader({self._root!r}, batch_size={self.batch_size}, batches={len(self)}, "
                f"threads={self.threads}, rank={self.rank}/{self.world_size}, device={self.device!r})")


__all__ = ["ImageLoader", "parse_bytes"]
