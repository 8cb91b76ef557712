"""`ImageLoader`: the drop-in for ``DataLoader(ImageFolder(...))``."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterator, Mapping, Sequence

from . import _stoker
from ._args import arguments_json
from ._base import LoaderBase
from ._batches import BatchIterator
from ._device import native_device
from ._gpu import Mixer, Normalizer
from ._live import track
from ._output import converter, want_torch
from .errors import ConfigError
from .mixture import SourceIds, mixture_argument
from .transforms import BatchTransform, Transform, compile_transforms, dtype_name


def roots(root: Any) -> list[str]:
    """``root`` as the list of strings the engine reads (``stoker::source::detect`` decides
    what they name: an ImageFolder root, a pack folder, shards, globs or URLs)."""
    if isinstance(root, (list, tuple)):
        return [os.fspath(p) for p in root]
    if isinstance(root, (str, os.PathLike)):
        return [os.fspath(root)]
    raise ConfigError(f"invalid argument `root`: expected a path, a URL or a list of shards, got {root!r}")


NVJPEG_PATTERNS = ("nvidia/*/lib/libnvjpeg.so*", "nvidia/*/*/lib/libnvjpeg.so*", "torchvision.libs/libnvjpeg*.so*")


def find_nvjpeg() -> None:
    """Tells the engine where the installed wheels keep libnvjpeg (PyTorch's ``nvidia``
    packages, torchvision's bundled copy), to try before the system's library path."""
    import glob
    import sys

    found: list[str] = []
    for base in sys.path:
        if not base or not os.path.isdir(base):
            continue
        for pattern in NVJPEG_PATTERNS:
            found.extend(sorted(glob.glob(os.path.join(base, pattern))))
    _stoker.nvjpeg_candidates(found)


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
    torchvision's ``ImageFolder``; ``rank``/``world_size`` default to the initialised
    ``torch.distributed`` default group's, else the torchrun environment (``RANK``,
    ``WORLD_SIZE``; a disagreement with the group is a :class:`ConfigError`). A consumer that
    keeps batches is served while they fit in ``memory_limit`` (the pool grows; default limit a
    quarter of the available memory), then :class:`MemoryLimitError` says how much it holds.

    ``shuffle`` is ``False``, ``True`` (one global permutation per epoch; over object storage a
    shard-window order), ``"global"`` (always one global permutation) or ``"shards"`` for shard
    sources on slow storage: the shards' parts (a shard, or 64 MiB of a larger one) are permuted,
    each rank takes a run of them and shuffles it within windows of ``shard_window`` parts, so a
    reader only ever touches that many parts at a time. Shards in object storage are read in
    parts (one ranged request per part, fetched ahead in the pass's order; ``report()['storage']``
    counts requests, bytes, latency and throttling); ``shard_cache='ram'`` or
    ``shard_cache=DIRECTORY`` keeps those parts on the host (until ``shard_cache_bytes``; its
    groups are listed and cleared by ``stoker cache``), so later epochs of data that fits read no
    byte from the store.
    ``max_pixels`` (default 178956970, Pillow's decompression-bomb limit) and ``max_file_bytes``
    (default 256 MiB) are checked from headers and metadata before anything is allocated; a
    sample over them follows ``on_error`` like any bad sample. ``max_failures`` is the failure
    budget of a pass (a count, or a fraction such as ``0.05`` / ``'5%'``; default 10% of the
    epoch, at least 100): past it the iteration raises :class:`DatasetError` with the last
    reasons instead of delivering near-empty batches when storage goes away.
    ``cache='ram'`` (``/dev/shm``) or ``cache=DIRECTORY`` (local disk) keeps each image's decoded
    pixels, so it is decoded once per run: the first epoch decodes every image at full resolution
    and stores it until ``cache_bytes`` (e.g. ``'8GiB'``; default a quarter of MemAvailable for
    ``'ram'``, half the free space for a directory) is used; later epochs, and other processes
    given the same cache, read the stored pixels instead of decoding. Batches are bit-identical
    to ``cache=None, dct_scaling=False, roi=False``. ``cache_max_side=N`` stores images whose
    longer side exceeds N pixels reduced to N instead (DCT-scaled decode, then antialiased
    resampling; the crops are drawn on the original size): smaller entries and cheaper cached
    epochs, with pixels that differ slightly from full resolution; batches still do not depend
    on what the cache holds. ``report()['cache']`` counts hits, misses, bytes and the decode
    time saved. ``trace='trace.json'`` records a Chrome/Perfetto trace (open it in
    https://ui.perfetto.dev): a span per sample stage (``read``, ``decode`` or ``cache``, ``ops``)
    on each named stoker thread with the sample's index, path and batch, the consumer's ``wait``
    and ``step`` spans, batch deliveries, buffer waits, failures and CUDA copies. It keeps the last
    ``trace_events`` events (default 200000) and is written, atomically, at the end of every
    completed pass and when the loader is deleted; :meth:`save_trace` writes it on request.
    ``dct_scaling`` and ``roi`` (default on) let JPEGs be decoded at a reduced DCT scale and only
    around the crop; turning them off decodes every image whole.
    ``threads='auto'`` (the default) starts one decode thread per core of ``cpu_budget`` (cores;
    default the process's CPU allowance: affinity mask and cgroup quota) and, during the first
    epoch, lowers the number that take work to the fewest that keep the consumer from waiting;
    ``threads=N`` (or ``STOKER_NUM_THREADS``) is a fixed count. ``prefetch='auto'`` lets up to 8
    batches (within ``memory_limit``, else 1 GiB) get ahead when the consumer waits in bursts.
    Loaders in all processes on the host share its cores through a registry in ``/dev/shm``
    (``STOKER_BUDGET_FILE`` names another file, ``STOKER_SHARED_BUDGET=0`` turns sharing off);
    ``report()['tuning']`` shows the setting, the share and the tuner's decisions.

    ``device='cuda'`` (``'cuda:N'``; ``'cuda'`` is PyTorch's current device, else ``LOCAL_RANK``)
    delivers CUDA tensors: batch buffers are page-locked, each finished batch is copied on
    stoker's own CUDA stream and the consumer's current stream waits on the copy's event (no
    host synchronisation). Images cross the bus as uint8 and are normalised on the GPU into
    ``dtype`` (float32 by default; float16, bfloat16, or uint8 for none). A batch's device memory
    is reused only after its tensors are dropped and the stream they were used on has passed
    that point. ``device='auto'`` uses a GPU when there is one and otherwise delivers host
    batches (``report()['device']`` says which and why).

    ``decode='gpu'`` (with ``device='cuda'``) decodes a share of each batch (``gpu_share``,
    default 0.5) on the GPU: the decode threads read those JPEGs and draw their crops and flips
    as usual, the JPEGs cross the bus in the batch's own pinned buffer, and nvJPEG (its hardware
    JPEG engines where the GPU has them: A100, H100, H200) decodes them on stoker's stream, where
    stoker's resampler writes each crop into the batch. ``decode='auto'`` starts on the CPU and moves a
    share to the GPU only while that gives the training loop its batches sooner (the GPU's decode
    runs beside the training step), back to none when the loop is fed, and decodes on the CPU
    where GPU decode cannot run (the device note says why). nvJPEG is loaded at run time (from PyTorch's or
    torchvision's wheels, or the system). Only baseline JPEGs without EXIF rotation go to the GPU;
    a JPEG nvJPEG refuses is decoded on the CPU, so none is lost. GPU-decoded pixels differ from
    libjpeg-turbo's by nvJPEG's IDCT rounding (a few levels; the crop, resampling with any
    ``interpolation``, flip and layout are the CPU's exactly), so the CPU stays the exact default.
    ``report()['gpu_decode']`` gives the backend, the images decoded, the CPU fallbacks and the share.

    ``batch_transform=stoker.transforms.MixUp(alpha=..., num_classes=...)`` (torchvision v2),
    ``CutMix(...)`` or timm's ``Mixup(mixup_alpha, cutmix_alpha, prob, switch_prob,
    label_smoothing, num_classes)`` mixes each finished batch on stoker's threads and the loader
    yields ``(images, targets)``, ``targets`` the soft labels (float32 ``[N, num_classes]``).
    One draw per batch from the batch's own random stream (seed, epoch, rank, batch number):
    the same batches at any thread count, and after a resume; :meth:`mix_params` gives a
    batch's draw. The arithmetic is the references' (float32/float16 as torch computes it,
    uint8 as timm's fast collate: rounded half to even). With ``device='cuda'`` the soft labels
    are made on the host and copied with the batch (``targets`` is a CUDA tensor), and the
    images are mixed on the GPU with torch ops on the current stream, after their normalisation
    there, with the same arithmetic: float32/float16 batches equal the host's bit for bit
    (bfloat16 rounds each product and the sum to bfloat16). Not for :class:`PairLoader`.

    A weighted mixture of datasets: ``root={"imagenet": ("train/", 0.8), "extra": {"root":
    "extra/*.tar", "weight": 0.2, "label_offset": 1000, "exhausted": "stop"}}``. Every rank's
    positions follow one schedule in which each source's share is exact within one sample at
    every prefix (weights as written: ``0.8, 0.2`` are ``4:1``); each source is read pass after
    pass, each pass a fresh permutation, the ranks taking disjoint samples of it. A source that
    runs out starts its next pass (``exhausted='repeat'``, the default) or ends the epoch
    (``'stop'``); without a ``stop`` source an epoch is ``epoch_items`` samples over all ranks
    (default: the sources' total). ``label_offset`` shifts a source's labels (datasets with
    different class lists). Iterating then yields ``(images, labels, sources)``: ``sources`` is
    the id of each sample's source, in the order of the dict (:attr:`sources` names them).
    The state resumes exactly, and elastically on another number of ranks; a state saved with
    another mixture is refused, naming ``mixture``.
    """

    def __init__(self, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Mapping[str, Any],
                 batch_size: int = 256, *,
                 preset: str | None = None, transforms: Sequence[Transform] | None = None,
                 shuffle: bool | str = False, seed: int = 0, drop_last: bool = False, shard_window: int = 4,
                 threads: int | str = "auto", io_threads: int | None = None, prefetch: int | str = 2,
                 cpu_budget: float | None = None,
                 memory_limit: int | str | None = None, on_error: str = "skip", output: str = "auto",
                 rank: int | None = None, world_size: int | None = None, layout: str = "NCHW",
                 dtype: Any = None, apply_exif: bool = True, device: str = "cpu", max_pixels: int | None = None,
                 max_file_bytes: int | str | None = None, max_failures: int | float | str | None = None,
                 cache: str | os.PathLike[str] | None = None, cache_bytes: int | str | None = None,
                 cache_max_side: int | None = None, dct_scaling: bool = True, roi: bool = True,
                 shard_cache: str | os.PathLike[str] | None = None, shard_cache_bytes: int | str | None = None,
                 trace: str | os.PathLike[str] | None = None, trace_events: int | None = None,
                 epoch_items: int | None = None, decode: str = "cpu", gpu_share: float | None = None,
                 batch_transform: BatchTransform | None = None) -> None:
        ops: list[dict[str, Any]] | None = None
        out_dtype: str | None = None
        if transforms is not None:
            if isinstance(transforms, Transform) or not isinstance(transforms, (list, tuple)):
                raise ConfigError("invalid argument `transforms`: expected a list of stoker.transforms")
            ops, out_dtype = compile_transforms(transforms)
        # Whether batches go to a GPU, and how they are normalised there (they cross the bus as
        # uint8), is decided by the engine (stoker::args::image_config) once the device is
        # resolved; bfloat16 is passed on by name, as only the GPU side makes it.
        mix_spec = None
        if batch_transform is not None:
            if not isinstance(batch_transform, BatchTransform):
                raise ConfigError("invalid argument `batch_transform`: expected stoker.transforms.MixUp, CutMix or "
                                  f"Mixup, got {batch_transform!r}")
            mix_spec = batch_transform.spec()
        self._mixed = mix_spec is not None
        if dtype is not None:
            bf16 = str(dtype).replace("torch.", "").lower() == "bfloat16"
            out_dtype = "bfloat16" if bf16 else dtype_name(dtype)
        self._torch = want_torch(output)
        mixture = None
        if isinstance(root, Mapping):
            mixture = mixture_argument(root, "root", epoch_items)
            self._roots = []
        elif epoch_items is not None:
            raise ConfigError("invalid argument `epoch_items`: only a mixture (root={name: (root, weight)}) has one")
        else:
            self._roots = roots(root)
        self._device, self._ordinal = native_device(device)
        self._args = arguments_json(
            mixture=mixture,
            preset=preset, ops=ops, dtype=out_dtype, layout=layout, apply_exif=apply_exif,
            batch_size=batch_size, shuffle=shuffle, shard_window=shard_window, seed=seed, drop_last=drop_last,
            rank=rank, world_size=world_size, threads=threads, io_threads=io_threads, prefetch=prefetch,
            cpu_budget=cpu_budget,
            memory_limit=memory_limit, on_error=on_error, max_pixels=max_pixels, max_file_bytes=max_file_bytes,
            max_failures=max_failures, cache=os.fspath(cache) if isinstance(cache, os.PathLike) else cache,
            cache_bytes=cache_bytes, cache_max_side=cache_max_side, dct_scaling=dct_scaling, roi=roi,
            shard_cache=os.fspath(shard_cache) if isinstance(shard_cache, os.PathLike) else shard_cache,
            shard_cache_bytes=shard_cache_bytes,
            trace=os.fspath(trace) if isinstance(trace, os.PathLike) else trace, trace_events=trace_events,
            captions=getattr(self, "_captions", None), decode=decode, gpu_share=gpu_share, batch_transform=mix_spec)
        if decode != "cpu":
            find_nvjpeg()
        self._start()
        native = self._loader()
        mix = native.mixture_json()
        self._source_ids = SourceIds(mix) if mix is not None else None
        norm = json.loads(native.device_normalize_json())
        self._normalizer = Normalizer(norm["mean"], norm["std"], norm["dtype"], norm["channels_last"]) if norm else None
        # On a GPU the engine makes the soft labels and leaves the images to be mixed there,
        # after the normaliser (stoker::args::image_config decides).
        on_device = json.loads(native.device_mix_json())
        self._mixer = Mixer(on_device["style"], on_device["channels_last"]) if on_device else None
        self._to_device(native.device, output)

    def _new_native(self) -> _stoker.Loader:
        return _stoker.Loader(self._roots, self._args, self._device, self._ordinal)

    def device_report(self) -> dict[str, Any]:
        """``{requested, used, note}`` for the ``device=`` argument (as in :meth:`report`)."""
        device: dict[str, Any] = self.report()["device"]
        return device

    def report(self) -> dict[str, Any]:
        report = super().report()
        report["gpu_decode"] = json.loads(self._loader().gpu_decode_json())
        return report

    def reset_report(self) -> None:
        """Zeroes the counters of :meth:`report`; a pass still running is measured from now on
        (call it after a warm-up to report the steady state alone)."""
        self._loader().reset_report()

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

    def _device_mix(self) -> Callable[[Any, Any], Any] | None:
        """Mixes a GPU batch's images (after the normaliser) by its draw, when the engine left
        them to the GPU; ``None`` otherwise."""
        mixer = self._mixer
        if mixer is None:
            return None
        native = self._loader()
        owned = self._normalizer is not None  # the normaliser's output is a tensor of our own

        def mix(images: Any, b: Any) -> Any:
            return mixer(images, json.loads(native.mix_params_json(b.epoch, b.index)), inplace=owned)

        return mix

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        ids = self._source_ids
        mixed = self._mixed
        convert, norm, mix = converter(self._torch), self._normalizer, self._device_mix()
        if ids is None:
            return BatchIterator(self._loader().iter(), convert,
                                 lambda b: (b.images, b.targets if mixed else b.labels), norm, mix)
        return BatchIterator(self._loader().iter(), convert,
                             lambda b: (b.images, b.targets if mixed else b.labels, ids(b.indices)), norm, mix)

    def mix_params(self, epoch: int, batch: int) -> dict[str, Any] | None:
        """The MixUp/CutMix draw of batch ``batch`` of ``epoch`` (``{"cutmix", "lam", "area"}``,
        ``area`` the CutMix box ``[y0, y1, x0, x1]``, ``lam`` already corrected to its area), or
        ``None`` without ``batch_transform``: what that batch's images and targets were mixed with."""
        params: dict[str, Any] | None = json.loads(self._loader().mix_params_json(epoch, batch))
        return params

    def keys(self, indices: Sequence[int]) -> list[str]:
        """The keys of the dataset's samples ``indices`` (a batch's ``indices``): WebDataset's
        keys for shards (``KEY`` of ``KEY.jpg``), the path without its extension for a folder."""
        return self._loader().keys(list(indices))

    @property
    def sources(self) -> list[str] | None:
        """A mixture's source names, by the ids its batches carry (``None``: one dataset)."""
        return None if self._source_ids is None else self._source_ids.names

    def batches(self) -> _stoker.Iterator:
        """The raw batch iterator (``stoker._stoker.Batch`` objects with ``images``, ``labels``,
        ``indices``, ``index``), for callers that convert themselves. On a GPU these images are
        as they crossed the bus (uint8): neither normalised nor mixed (iterating the loader does
        both)."""
        it: _stoker.Iterator = track(self._loader().iter())
        return it

    @property
    def trace_path(self) -> str | None:
        """The ``trace=`` file, or ``None`` when tracing is off."""
        return self._loader().trace_path

    def save_trace(self, path: str | os.PathLike[str] | None = None) -> str:
        """Writes the trace recorded so far (the last ``trace_events`` events) to ``path``
        (default: the ``trace=`` file) now, atomically; returns the path written. Raises
        :class:`ConfigError` when the loader was made without ``trace=``."""
        return self._loader().save_trace(path)

    def __repr__(self) -> str:
        root = self._roots[0] if len(self._roots) == 1 else self._roots
        return (f"ImageLoader({root!r}, batch_size={self.batch_size}, batches={len(self)}, "
                f"threads={self.threads}, rank={self.rank}/{self.world_size}, device={self.device!r})")


class PairIterator(BatchIterator):
    """Yields each image-text pair batch as a dict: ``images``, ``input_ids``,
    ``attention_mask`` (converted views) and ``keys`` (a list of str)."""

    def __init__(self, native: Any, convert: Callable[[Any], Any], first: Callable[[Any], Any] | None,
                 keys: Callable[[list[int]], list[str]]) -> None:
        super().__init__(native, convert, lambda b: (b.images, b.input_ids, b.attention_mask), first)
        self._keys = keys

    def __iter__(self) -> PairIterator:
        return self

    def __next__(self) -> dict[str, Any]:  # type: ignore[override]
        b = self._native.__next__()
        images, input_ids, attention_mask = (self._convert(v) for v in self._views(b))
        if self._first is not None:
            images = self._first(images)
        return {"images": images, "input_ids": input_ids, "attention_mask": attention_mask,
                "keys": self._keys(b.indices)}


class PairLoader(ImageLoader):
    """Batches of image-text pairs from WebDataset shards in img2dataset's layout (``KEY.jpg``
    beside ``KEY.txt`` and ``KEY.json``, as LAION and DataComp ship them), for CLIP-style
    training.

    Iterating yields dicts: ``images`` exactly as :class:`ImageLoader` makes them from the same
    shards and arguments (``preset``, ``transforms``, ``dtype``, ``device``, ...), ``input_ids``
    and ``attention_mask`` (int32, ``[N, context_length]``) and ``keys`` (each sample's
    WebDataset key). A caption row is the start of text, the caption's ids from ``tokenizer``
    (any ``tokenizer.json`` with ``<|startoftext|>`` and ``<|endoftext|>``: CLIP's), the end of
    text, then ``pad_id``; a caption longer than ``context_length`` is cut with the end of text
    in the last place. ``clean='open_clip'`` (with ``pad_id=0``, the defaults) cleans captions as
    open_clip's tokenizer does except for ftfy; ``clean='none', pad_id=49407`` gives HuggingFace
    ``CLIPTokenizerFast(padding='max_length', truncation=True)``'s ids.

    ``caption`` says where each caption is: ``'txt'`` (``KEY.txt``, the default), ``'json'``
    (the ``caption`` field of ``KEY.json``) or ``'json:FIELD'``. Extensions match in any case.
    A sample without an image or without its caption member is not a sample (listed in
    ``report()['skipped']``); a corrupt image, a caption that is not UTF-8 or a JSON member
    without the field is a bad sample (``on_error``). The shards must be indexed by this
    version of stoker (``stoker index SHARDS``: the index lists each image's text members).
    Sharding by rank, resume (``state_dict``), ``len`` and the report are
    :class:`ImageLoader`'s; the report has a ``caption`` stage.
    """

    def __init__(self, root: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
                 batch_size: int = 256, *, tokenizer: str | os.PathLike[str], context_length: int = 77,
                 pad_id: int = 0, clean: str = "open_clip", caption: str = "txt", **kwargs: Any) -> None:
        if isinstance(root, Mapping):
            raise ConfigError("invalid argument `root`: a pair loader reads one dataset of shards, not a mixture")
        self._captions = {"tokenizer": os.fspath(tokenizer), "context_length": context_length, "pad_id": pad_id,
                          "clean": clean, "caption": caption}
        super().__init__(root, batch_size, **kwargs)

    @property
    def context_length(self) -> int:
        """Ids per caption row."""
        n = self._loader().context_length
        assert n is not None  # a pair loader's native loader has captions
        return n

    def __iter__(self) -> PairIterator:  # type: ignore[override]
        return PairIterator(self._loader().iter(), converter(self._torch), self._normalizer, self._loader().keys)

    def __repr__(self) -> str:
        root = self._roots[0] if len(self._roots) == 1 else self._roots
        return (f"PairLoader({root!r}, batch_size={self.batch_size}, batches={len(self)}, "
                f"context_length={self.context_length}, threads={self.threads}, "
                f"rank={self.rank}/{self.world_size}, device={self.device!r})")


__all__ = ["ImageLoader", "PairLoader"]
