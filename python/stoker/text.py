"""`TokenLoader`: language-model batches, tokenized and packed on stoker's threads."""

from __future__ import annotations

import atexit
import json
import os
import sys
from typing import Any, Callable, Iterator, Mapping

from . import _stoker
from ._args import arguments_json
from ._base import LoaderBase
from ._device import native_device, process_group
from ._live import track
from ._output import converter, want_torch
from .errors import ConfigError, DatasetError
from .mixture import mixture_argument

_FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens")


def _paths(data: Any) -> list[str]:
    if isinstance(data, (list, tuple)):
        return [os.fspath(p) for p in data]
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)]
    raise ConfigError(f"invalid argument `data`: expected a path, a glob, a folder or a list of them, "
                      f"got {type(data).__name__}")


def _tokenizer(tokenizer: Any) -> tuple[str | None, str | None]:
    """``(path, json)``: a ``tokenizer.json`` path, or the JSON of a ``tokenizers.Tokenizer`` or
    of a ``transformers`` fast tokenizer's backend (the same format)."""
    if tokenizer is None:
        return None, None
    if isinstance(tokenizer, (str, os.PathLike)):
        return os.fspath(tokenizer), None
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    to_str = getattr(backend, "to_str", None)
    if to_str is None:
        raise ConfigError("invalid argument `tokenizer`: expected a tokenizer.json path, a tokenizers.Tokenizer "
                          f"or a transformers fast tokenizer, got {type(tokenizer).__name__}")
    return None, str(to_str())


class TokenLoader(LoaderBase):
    """Batches for causal language models from text or token files, tokenized and packed on
    stoker's Rust threads: no worker processes, no Python per document, no tokenized copy of the
    corpus written first.

    ``data``: JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``; the text under ``text_key``),
    Parquet (``.parquet``; the text in the string column ``text_key``, read a row group at a time),
    plain text (``.txt``, optionally compressed; a document per file, or per line with
    ``document='line'``), WebDataset tar shards (``.txt`` members, or ``.json`` members with the
    text under ``text_key``), or pre-tokenized token files (nanoGPT-style ``.bin`` of uint16, or uint32
    with ``token_bytes=4``, or a 1-D ``.npy``; documents end at ``eos_id``; or Megatron's ``.bin``
    beside its ``.idx``): a path, a glob, a folder, an object-store URL (``s3://``, ``gs://``,
    ``az://``, ``http(s)://``; text, tar shards and uncompressed token files) or a list of them; or a token cache folder
    written by ``stoker tokenize`` (read instead of the text, the same batches). Text formats
    mix in one loader; token files and token caches are one kind per loader. ``tokenizer``: a
    ``tokenizer.json`` path, a ``tokenizers.Tokenizer`` or a ``transformers`` fast tokenizer
    (text only).

    Each batch is a dict of ``input_ids``, ``labels`` (the next token in the document; -100 after a
    document's last token and on padding), ``position_ids`` (restarting at each document and at each
    row's start) as ``[batch_size, seq_len]`` int32 tensors, ``cu_seqlens`` (int32 boundaries of
    every segment over the flattened batch, padding a segment of its own, for FlashAttention's
    variable-length kernels) and ``max_seqlen``. ``pack='concat'`` joins documents (each followed by
    EOS with ``add_eos``) and cuts rows: nothing is padded, only the epoch's tail is dropped.
    ``pack='best_fit'`` places whole documents into rows by best-fit decreasing over blocks of
    ``pack_window`` documents (longer ones are split) and pads.

    ``shuffle`` permutes documents per epoch (``seed``, ``set_epoch``); compressed files are read as
    streams, so they are shuffled by file and within windows of ``shuffle_window`` documents.
    ``rank``/``world_size`` (by default the initialised ``torch.distributed`` group's, else
    torchrun's environment) give each rank every
    ``world_size``-th document; over token files and token caches every rank delivers the same
    number of batches (``len(loader)``), so DDP never waits at an epoch's end. Over raw text the
    counts are known only once tokenized: under ``torch.distributed`` with several ranks, every
    iteration then agrees on each step through a tiny all-reduce on a CPU (gloo) group
    (``even_batches``, on by default there), so all ranks stop at the first step where any rank
    has no batch left (the other ranks' remaining rows of that epoch are not delivered);
    ``even_batches=False`` turns it off, ``True`` requires it.
    Tokenizing first (``stoker tokenize``) gives exactly equal counts with no collective. ``state_dict()``
    saves the exact position (the document and the tokens of it already used); ``load_state_dict``
    continues bit for bit. ``infinite=True`` goes on into the next epoch's order instead of ending
    (step-based training). A bad document (invalid JSON or UTF-8, a missing key, longer than
    ``max_document_bytes``) is skipped and counted in :meth:`stats`; ``on_bad_document='raise'``
    raises it, naming the file and line.

    The document index of each file (built by one pass over it when the loader opens) is stored
    in ``index_cache`` (default: ``STOKER_INDEX_DIR``, else ``~/.cache/stoker/doc-index``;
    ``False``: not stored) and reused while the file is unchanged (its length, time, inode and
    first and last 64 KiB are checked); ``stoker cache indexes`` lists and clears them.

    ``cache='ram'`` (``/dev/shm``) or ``cache=DIRECTORY`` tokenizes each document once: its token
    ids are stored (2 bytes a token for vocabularies up to 65,536) until ``cache_bytes`` (default a
    quarter of MemAvailable for ``'ram'``, half the free disk for a directory; shared with every
    other stoker cache group under the same root, idle ones evicted least recently used first),
    and later epochs, and other processes reading the same files with the same tokenizer, read
    them instead of reading and tokenizing the text; the batches are identical. The cache is
    keyed by the files (path, size, time, inode, first and last 64 KiB, document index) and the
    tokenizer's JSON, so changed files or another tokenizer never get stale ids; every stored
    document is checked against its hash when read. ``report()['cache']`` counts hits, misses and
    bytes; ``stoker cache`` lists and clears the groups (idle ``'ram'`` groups go after
    ``STOKER_CACHE_TTL``, default 1 hour).

    ``threads='auto'`` (the default) starts a tokenizer thread per core of ``cpu_budget`` (default the
    process's CPU allowance) and, over the first 512 batches, settles on the fewest that keep the
    training step from waiting (fewer when the step is slow: the cores go back to the trainer and to
    other processes sharing the host's CPU budget); ``report()['tuning']`` lists the decisions. A
    number fixes the count.

    ``device='cuda'`` (``'cuda:N'``, ``'auto'``) delivers every array as a CUDA tensor: the batch
    buffers are page-locked and copied on stoker's own stream, as for ``ImageLoader`` (the
    consumer's stream waits on the copy through DLPack; no host synchronisation).

    A weighted mixture of sources, row by row: ``data={"web": ("web/*.jsonl.zst", 0.7), "code":
    {"data": "code/*.parquet", "weight": 0.2, "text_key": "content"}, "books": ("books/", 0.1)}``
    with ``epoch_items`` rows (sequences) per epoch over all ranks. Each row comes from one
    source: the rows of every rank follow one schedule in which each source's share is exact
    within one row at every prefix, so its share of the tokens is too (weights as written:
    ``0.7, 0.2, 0.1`` are ``7:2:1``). Each source is a loader of its own (its files, its
    ``text_key``, the other arguments shared) that starts a new pass of its documents at every
    epoch and goes on to the next pass when it runs out (``exhausted='repeat'``), or, with
    ``exhausted='stop'``, is read once per epoch and ends the epoch when its pass runs out (at
    most ``epoch_items`` rows, which is then optional); as over raw text, that end is known only
    once tokenized, so ``len()`` raises ``TypeError`` and the ranks agree at each step
    (``even_batches``) and stop together. Batches carry
    ``sources`` (each row's source id, in the order of the dict; :attr:`sources` names them) and
    ``report()`` counts each source's rows against its share and names the source whose rows cost
    the most time. The state resumes exactly; a state of another mixture is refused, naming
    ``mixture``.
    """

    def __init__(self, data: Any, *, tokenizer: Any = None, seq_len: int = 2048, batch_size: int = 8,
                 pack: str = "concat", pack_window: int | None = None, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, infinite: bool = False, shuffle_window: int | None = None,
                 threads: int | str = "auto", prefetch: int = 2, memory_limit: int | str | None = None,
                 cpu_budget: float | None = None,
                 rank: int | None = None, world_size: int | None = None, text_key: str = "text",
                 document: str = "file", token_bytes: int | None = None, add_bos: bool = False,
                 add_eos: bool = True, bos_token: str | None = None, eos_token: str | None = None,
                 eos_id: int | None = None, pad_id: int | None = None, on_bad_document: str = "skip",
                 max_failures: int | None = None, max_document_bytes: int | str | None = None,
                 index_cache: str | os.PathLike[str] | bool | None = None, device: str = "cpu",
                 even_batches: bool | None = None, trace: str | os.PathLike[str] | None = None,
                 trace_events: int | None = None, cache: str | os.PathLike[str] | None = None,
                 cache_bytes: int | str | None = None, output: str = "auto", epoch_items: int | None = None) -> None:
        if even_batches not in (None, True, False):
            raise ConfigError(f"invalid argument `even_batches`: expected True, False or None, got {even_batches!r}")
        self._even = even_batches
        self._paths, self._mixture = self._data(data, epoch_items)
        path, self._tokenizer_json = _tokenizer(tokenizer)
        self._args = arguments_json(
            tokenizer=path, seq_len=seq_len, batch_size=batch_size, pack=pack, pack_window=pack_window,
            shuffle=shuffle, seed=seed, drop_last=drop_last, infinite=infinite, shuffle_window=shuffle_window,
            threads=threads, prefetch=prefetch, memory_limit=memory_limit, cpu_budget=cpu_budget, rank=rank,
            world_size=world_size,
            text_key=text_key, document=document, token_bytes=token_bytes, add_bos=add_bos, add_eos=add_eos,
            bos_token=bos_token, eos_token=eos_token, eos_id=eos_id, pad_id=pad_id, on_bad_document=on_bad_document,
            max_failures=max_failures, max_document_bytes=max_document_bytes,
            index_cache=_index_cache(index_cache), trace=None if trace is None else os.fspath(trace),
            trace_events=trace_events, cache=os.fspath(cache) if isinstance(cache, os.PathLike) else cache,
            cache_bytes=cache_bytes, mixture=self._mixture)
        self._device, self._ordinal = native_device(device)
        self._torch = want_torch(output)
        self._start()
        self._to_device(self._loader().device, output)

    def __new__(cls, data: Any = None, **kwargs: Any) -> TokenLoader:
        """A mixture (``data`` a dict of sources) is a :class:`TokenMixture`, a ``TokenLoader``
        that says only how it differs; anything else a plain ``TokenLoader``."""
        if cls is TokenLoader and isinstance(data, Mapping):
            cls = TokenMixture
        return super().__new__(cls)

    def _data(self, data: Any, epoch_items: int | None) -> tuple[list[str], dict[str, Any] | None]:
        """``(paths, mixture)``: the files of one source (a mixture's sources are its own)."""
        if epoch_items is not None:
            raise ConfigError("invalid argument `epoch_items`: only a mixture ({name: (data, weight)}) has one")
        return _paths(data), None

    def _new_native(self) -> Any:
        return _stoker.TokenLoader(self._paths, self._args, self._tokenizer_json, self._device, self._ordinal)

    def _adopt(self, old: Any, new: Any) -> None:
        state = json.loads(old.state_json())
        new.set_epoch(state["epoch"])
        if old.resume_pending:
            new.load_state_json(json.dumps(state))

    def _loader(self) -> _stoker.TokenLoader:
        native: _stoker.TokenLoader = self._base()  # type: ignore[assignment]
        return native

    def __iter__(self) -> Iterator[dict[str, Any]]:
        native = self._loader()
        sync = None
        if self._even is not False and native.batches_per_epoch is None and not json.loads(self._args).get("infinite"):
            sync = _even_batches(native.world_size, required=bool(self._even))
        return _TokenBatches(native.iter(), self._torch, sync)

    def batches(self) -> _stoker.TokenIterator:
        """The raw iterator of ``stoker._stoker.TokenBatch`` objects."""
        return self._loader().iter()

    def __len__(self) -> int:
        """Batches per epoch on this rank: known before tokenizing for token files (every rank
        has the same count) and for mixtures (``epoch_items`` rows); text is counted only once
        tokenized, so ``len()`` raises ``TypeError`` there (as for an ``IterableDataset``)."""
        n = self._loader().batches_per_epoch
        if n is None:
            raise TypeError("TokenLoader over text (or infinite) has no length before it is tokenized")
        return n

    @property
    def sources(self) -> list[str] | None:
        """A mixture's source names, by the ``sources`` ids of its rows (``None``: one source)."""
        return None

    @property
    def documents(self) -> int:
        """Documents in the data (all ranks)."""
        return self._loader().documents

    @property
    def seq_len(self) -> int:
        """Tokens per row."""
        return self._loader().seq_len

    def special_ids(self) -> dict[str, int | None]:
        """``{bos, eos, pad}``: the ids stoker adds and pads with."""
        bos, eos, pad = self._loader().special_ids()
        return {"bos": bos, "eos": eos, "pad": pad}

    def stats(self) -> dict[str, Any]:
        """Counters over the loader's life: documents (failed ones too), tokens, padding, split
        documents, dropped tail tokens, rows, bytes read, seconds per stage. A mixture's are
        per source: ``{name: counters}``."""
        stats: dict[str, Any] = json.loads(self._loader().stats_json())
        return stats

    def report(self) -> dict[str, Any]:
        """The report of every loader (see :meth:`LoaderBase.report`) with :meth:`stats`, the
        ``tokenizer`` (``{path, engine, why}``) and the token ``cache``. Its ``bottleneck``,
        ``{stage, reason, suggestion}``, names the stage that limits the rate (``consumer`` when
        the training step does: the loader keeps up; ``read``, ``tokenize``, ``pack``, or
        ``handover`` for batches too small) and what to change; it is ``None`` before the first
        iteration. A mixture's report has a stage per source (``source NAME``), ``mixture``
        (each source's rows against its share, and its time per row), ``counts`` (each source's
        counters) and a ``bottleneck`` that names the source whose rows take the most time when
        the consumer waits."""
        return super().report()

    @property
    def trace_path(self) -> str | None:
        """The ``trace=`` file, or ``None`` when tracing is off (a mixture records none)."""
        return self._loader().trace_path

    def save_trace(self, path: str | os.PathLike[str] | None = None) -> str:
        """Writes the trace recorded so far (the last ``trace_events`` events: spans of reading
        each document, tokenizing each chunk, packing each batch and the consumer's waits; Chrome
        trace format, for ``chrome://tracing`` or Perfetto) to ``path`` (default: the ``trace=``
        file, also written when a pass completes and when the loader is dropped) now; returns
        the path written."""
        return self._loader().save_trace(path)

    def state_dict(self) -> dict[str, Any]:
        """The exact position: epoch, batches delivered, and where the next row starts (the
        document of this rank's order and the tokens or rows of it already used), with the
        ``fingerprint`` of what it is valid for."""
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Restores a :meth:`state_dict`: the next iteration continues bit for bit. A state of
        another dataset, tokenizer, packing or sharding is refused, naming the field.

        Given the list of every rank's state (``dist.all_gather_object``), the run continues on
        this loader's ranks, however many: every document that no saved rank had finished goes to
        exactly one new rank (a partly used one without its used tokens, for ``pack='concat'``; for
        ``pack='best_fit'`` the documents of each saved rank's current block are tokenized again
        to find those its delivered rows held). The new ranks' own states chain the same way
        (4 -> 3 -> 2 ranks within one epoch)."""
        super().load_state_dict(state)


class TokenMixture(TokenLoader):
    """A weighted mixture of token sources (``TokenLoader(data={name: (data, weight), ...})``
    makes one; see :class:`TokenLoader`): what differs from one source, and only that. Its
    state, epochs and ranks are the ``TokenLoader``'s."""

    def _data(self, data: Any, epoch_items: int | None) -> tuple[list[str], dict[str, Any] | None]:
        return [], mixture_argument(data, "data", epoch_items)

    def _new_native(self) -> Any:
        return _stoker.TokenMixLoader(self._args, self._tokenizer_json, self._device, self._ordinal)

    def _mix(self) -> _stoker.TokenMixLoader:
        native: _stoker.TokenMixLoader = self._base()  # type: ignore[assignment]
        return native

    def __iter__(self) -> Iterator[dict[str, Any]]:
        mix = self._mix()
        # Every rank has the same batches (epoch_items rows), unless a source that stops the
        # mixture ends it: known once tokenized, so the ranks agree at each step.
        sync = _even_batches(mix.world_size, required=bool(self._even)) if mix.stops and self._even is not False \
            else None
        return _TokenBatches(mix.iter(), self._torch, sync, mixed=True)

    def __len__(self) -> int:
        """Batches per epoch on this rank (``epoch_items`` rows over all ranks)."""
        return len(self._mix())

    @property
    def sources(self) -> list[str] | None:
        """The source names, by the ``sources`` ids of the rows."""
        return [s["name"] for s in json.loads(self._mix().sources_json())]

    def stats(self) -> dict[str, Any]:
        """Each source's counters (see :meth:`TokenLoader.stats`): ``{name: counters}``."""
        report = self.report()
        return {s["name"]: c for s, c in zip(report["mixture"]["sources"], report["counts"])}

    @property
    def trace_path(self) -> str | None:
        """``None``: a mixture records no trace yet."""
        return None

    def save_trace(self, path: str | os.PathLike[str] | None = None) -> str:
        """Refused: a mixture records no trace yet."""
        raise ConfigError("invalid argument `trace`: a token mixture records no trace yet")


def _index_cache(value: Any) -> str | bool | None:
    """``index_cache`` for the engine: a path as text, ``False``, or ``None`` (the default)."""
    if value is None or value is True:
        return None
    if value is False:
        return False
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    raise ConfigError(f"invalid argument `index_cache`: expected a directory or False, got {value!r}")


_GLOO: Any = None


def _forget_gloo() -> None:
    global _GLOO
    _GLOO = None


# What a rank has at a step, agreed on by a MIN all-reduce: the smallest wins.
_FAILED, _DONE, _HAVE = 0, 1, 2


def _even_batches(world_size: int, required: bool) -> Callable[[int], int] | None:
    """A function every rank calls once per step with what it has (``_HAVE`` a batch, ``_DONE``
    none left, ``_FAILED`` its loader raised); it returns the least of every rank's (a MIN
    all-reduce on a CPU gloo group, so no GPU stream is synchronised). ``None`` where there is
    nothing to agree with (no initialised ``torch.distributed``, or one rank)."""
    global _GLOO
    torch = sys.modules.get("torch")
    group_ranks = process_group()
    if torch is None or group_ranks is None or world_size == 1:
        if required and world_size > 1:
            raise ConfigError("invalid argument `even_batches`: True needs torch.distributed initialised "
                              f"(world_size={world_size})")
        return None
    dist = torch.distributed
    if group_ranks[1] != world_size:
        raise ConfigError(f"invalid argument `world_size`: the loader has {world_size} ranks, torch.distributed "
                          f"{group_ranks[1]}")
    group = None  # the default group, when it is a gloo one (no reference to it kept here)
    if dist.get_backend() != "gloo":
        if _GLOO is None:
            _GLOO = dist.new_group(backend="gloo")
            # Let go of it before the interpreter's teardown: a process group destroyed then
            # (after destroy_process_group) can abort the process.
            atexit.register(_forget_gloo)
        group = _GLOO

    def agree(have: int) -> int:
        flag = torch.tensor([have], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        return int(flag.item())

    return agree


class _TokenBatches:
    """Yields each native batch as a dict of converted tensors; keeps no reference to a batch
    it has handed out. With ``sync``, every rank tells the others at each step what it has, and
    all stop together: at the end when one rank has no batch left, and with an error when one
    rank's loader failed (that rank raises its own error, every other one a
    :class:`DatasetError` saying so), so no rank is left waiting in a collective."""

    def __init__(self, native: Any, torch_output: bool, sync: Callable[[int], int] | None = None,
                 mixed: bool = False) -> None:
        self._native = native
        self._mixed = mixed
        self._convert = converter(torch_output)
        self._sync = sync
        self._done = False
        track(self)

    def __iter__(self) -> _TokenBatches:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._done:
            raise StopIteration
        if self._sync is None:
            b = self._native.__next__()
        else:
            got: _stoker.TokenBatch | None = None
            failure: Exception | None = None
            try:
                got = self._native.__next__()
            except StopIteration:
                pass
            except Exception as e:  # noqa: BLE001 - told to the other ranks, then raised
                failure = e
            have = _FAILED if failure is not None else _HAVE if got is not None else _DONE
            agreed = self._sync(have)
            if failure is not None:
                self._done = True
                raise failure
            if agreed != _HAVE:
                self._done = True
                del got
                self._native.close()
                if agreed == _FAILED:
                    raise DatasetError("another rank's TokenLoader failed at this step (its own error says why); "
                                       "this rank stops too, so that no rank waits in a collective")
                raise StopIteration
            assert got is not None
            b = got
        out: dict[str, Any] = {name: self._convert(b.field(name)) for name in _FIELDS}
        out["max_seqlen"] = b.max_seqlen
        if self._mixed:
            out["sources"] = self._convert(b.field("sources"))
        return out

    def close(self) -> None:
        """Stops the iteration now; every thread is joined."""
        self._native.close()


__all__ = ["TokenLoader", "TokenMixture"]
