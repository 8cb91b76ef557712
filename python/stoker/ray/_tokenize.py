"""`stoker.ray.tokenize`: a corpus tokenized on a Ray cluster into the token cache `stoker
tokenize` writes (``tokens.bin``, ``index.bin``, ``stoker-tokens.json``), which `TokenLoader`
reads.

Ray Data reads the files (JSON Lines and text as lines, split at ``\\n`` as stoker splits them,
``.gz``/``.zst`` included; Parquet by its text column), ``map_batches`` runs a callable class
holding one `stoker.Tokenizer` per worker (``batch_format="pyarrow"``), and the driver writes the
ids in the input's order (``preserve_order``): the same documents, in the same order, with the
same ids as ``stoker tokenize``. The description is written by the engine's own writer.
"""

from __future__ import annotations

import _thread
import contextlib
import importlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import _stoker
from ..errors import DatasetError
from ..tokenizer import Tokenizer
from ._cluster import connect, import_ray


def _kind(path: str) -> str:
    """``jsonl``, ``text`` or ``parquet``, from the name, as stoker reads it."""
    name = path.removesuffix(".gz").removesuffix(".zst")
    if path.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".json", ".ndjson")):
        return "jsonl"
    if name.endswith((".txt", ".text")):
        return "text"
    raise DatasetError(f"{path}: stoker.ray.tokenize reads JSON Lines, text and Parquet (.jsonl, .txt, .parquet, "
                       "optionally .gz or .zst)")


def _lines_datasource(whole: bool) -> Any:
    """A Ray Data source of a file's lines, split at ``\\n`` only (``read_text`` also splits at
    ``\\r``, U+2028, ...), with the lines of ASCII whitespace left out, as stoker's reader does,
    or (``whole``) of the whole file as one row; each row is ``(bytes, file, line number)``."""
    base: Any = importlib.import_module("ray.data.datasource").FileBasedDatasource

    class Lines(base):  # type: ignore[misc]
        def _read_stream(self, f: Any, path: str) -> Any:
            pa: Any = importlib.import_module("pyarrow")

            data = f.readall()
            if whole:
                yield pa.table({"line": pa.array([data], pa.large_binary()), "file": [path], "line_no": [0]})
                return
            lines, files, numbers = [], [], []
            for n, line in enumerate(data.split(b"\n"), 1):
                if line.strip(b" \t\n\r\x0b\x0c"):
                    lines.append(line)
                    files.append(path)
                    numbers.append(n)
                if len(lines) >= 8192:
                    yield pa.table({"line": pa.array(lines, pa.large_binary()), "file": files, "line_no": numbers})
                    lines, files, numbers = [], [], []
            yield pa.table({"line": pa.array(lines, pa.large_binary()), "file": files, "line_no": numbers})

    return Lines


class Encode:
    """The ``map_batches`` class: one `stoker.Tokenizer` per worker; a batch of rows (a pyarrow
    table) to ``ids`` (``large_list<uint32>``) and ``error`` (the reason a document failed, or
    null: it is then empty in the cache, as ``stoker tokenize`` keeps it)."""

    def __init__(self, tokenizer: Tokenizer, kind: str, text_key: str, max_document_bytes: int) -> None:
        self.tokenizer, self.kind, self.key, self.max = tokenizer, kind, text_key, max_document_bytes

    def _text(self, row: Any, where: str) -> tuple[str, str | None]:
        """The text of one row, or ``("", why)``."""
        raw = row if isinstance(row, (bytes, str)) else b""
        size = len(raw) if isinstance(raw, bytes) else len(raw.encode("utf-8", "surrogatepass"))
        if size > self.max:
            return "", f"{where}: a document of {size} bytes, more than max_document_bytes ({self.max}): skipped"
        try:
            if self.kind == "jsonl":
                obj = json.loads(raw)
                text = obj.get(self.key) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    return "", f"{where}: no string under key {self.key!r}"
                return text, None
            return (raw.decode("utf-8") if isinstance(raw, bytes) else raw), None
        except (ValueError, UnicodeDecodeError) as e:
            return "", f"{where}: {e}"

    def __call__(self, batch: Any) -> Any:
        pa: Any = importlib.import_module("pyarrow")

        if self.kind == "parquet":
            rows = batch.column(self.key).to_pylist()
            wheres = ["row" for _ in rows]
        else:
            rows = batch.column("line").to_pylist()
            wheres = [f"{f}:{n}" if n else f
                      for f, n in zip(batch.column("file").to_pylist(), batch.column("line_no").to_pylist())]
        texts: list[str] = []
        errors: list[str | None] = []
        for row, where in zip(rows, wheres):
            if row is None:
                texts.append("")
                errors.append(f"{where}: no text")
                continue
            t, e = self._text(row, where)
            texts.append(t)
            errors.append(e)
        ids = self.tokenizer.encode_batch(texts, threads=1, format="arrow")
        return pa.table({"ids": ids, "error": pa.array(errors, pa.string())})


def tokenize(inputs: str | os.PathLike[str] | list[str | os.PathLike[str]], tokenizer: str | os.PathLike[str],
             out: str | os.PathLike[str], *, text_key: str | None = None, document: str | None = None,
             max_document_bytes: int | None = None, address: str | None = None, batch_size: int = 1024,
             concurrency: int | None = None, timeout: float = 3600.0, progress: bool = True) -> dict[str, Any]:
    """Tokenizes ``inputs`` (files, globs or folders of JSON Lines, text or Parquet, expanded as
    ``stoker tokenize`` expands them) with ``tokenizer`` (a ``tokenizer.json``) into the new token
    cache folder ``out`` (absent or empty), on the Ray cluster at ``address`` (as in
    :func:`stoker.ray.pack`). ``text_key``, ``document`` (``"line"``/``"file"`` for text) and
    ``max_document_bytes`` are ``stoker tokenize``'s, checked by its rules. ``concurrency``
    workers (default: the cluster's CPUs) each hold one `stoker.Tokenizer`; ``batch_size``
    documents per call. The whole run must end within ``timeout`` seconds (each batch is waited
    for at most that long).

    Returns the summary: ``files``, ``documents``, ``tokens``, ``failed``, ``failures`` (the
    first reasons), ``bytes`` (of ``tokens.bin``), ``seconds``.
    """
    t0 = time.monotonic()
    paths = [os.fspath(p) for p in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs)]
    opts: dict[str, Any] = {"text_key": text_key, "document": document, "max_document_bytes": max_document_bytes}
    files, key, lines, max_bytes = _stoker.tokenize_job(paths, os.fspath(tokenizer),
                                                        **{k: v for k, v in opts.items() if v is not None})
    for path in files:
        _kind(path)
        if "://" not in path and not os.path.isfile(path):
            raise DatasetError(f"{path}: no such file or folder")
    out_dir = Path(out)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise DatasetError(f"{out_dir}: exists and is not empty: give a new folder for the cache")
    width = _stoker.token_bytes(os.fspath(tokenizer))
    tok = Tokenizer(os.fspath(tokenizer))
    ray = connect(address)
    rd = import_ray().data
    ctx = rd.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = progress
    if concurrency is None:
        concurrency = max(1, int(ray.cluster_resources().get("CPU", 1)))
    ds = None
    for kind, group in _runs(files):
        # A read task takes a quarter of a CPU and a tokenizer the rest, so that a node of one
        # CPU runs both (with a whole CPU each, the tokenizers hold every CPU and the reads wait).
        if kind == "parquet":
            part = rd.read_parquet(group, columns=[key], num_cpus=0.25)
        else:
            part = rd.read_datasource(_lines_datasource(kind == "text" and not lines)(group),
                                      num_cpus=0.25)
        part = part.map_batches(Encode, fn_constructor_args=(tok, kind, key, max_bytes), batch_format="pyarrow",
                                batch_size=batch_size, compute=rd.ActorPoolStrategy(size=concurrency),
                                num_cpus=0.75)
        ds = part if ds is None else ds.union(part)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if width == 2 else np.uint32
    docs = n_tokens = failed = 0
    failures: list[str] = []
    try:
        with open(out_dir / "tokens.bin.tmp", "wb") as tf, open(out_dir / "index.bin.tmp", "wb") as xf, \
                _deadline(timeout, f"{out_dir}: the tokenization did not finish within {timeout:.0f} s"):
            xf.write(np.zeros(1, np.uint64).tobytes())
            if ds is not None:
                for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                    ids_col = batch.column("ids").combine_chunks()
                    flat = np.asarray(ids_col.values.to_numpy(zero_copy_only=False), dtype=np.uint32)
                    offsets = np.asarray(ids_col.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
                    tf.write(flat.astype(dtype).tobytes() if width == 2 else flat.tobytes())
                    xf.write((offsets[1:] - offsets[0] + n_tokens).astype(np.uint64).tobytes())
                    for e in batch.column("error").to_pylist():
                        if e is not None:
                            failed += 1
                            if len(failures) < 100:
                                failures.append(e)
                    docs += len(offsets) - 1
                    n_tokens += int(offsets[-1] - offsets[0])
            for f in (tf, xf):
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        # Nothing half-written is left: the folder is as it was given (empty).
        for name in ("tokens.bin.tmp", "index.bin.tmp"):
            (out_dir / name).unlink(missing_ok=True)
        raise
    for name in ("tokens.bin", "index.bin"):
        os.replace(out_dir / f"{name}.tmp", out_dir / name)
    _stoker.write_token_cache_meta(os.fspath(out_dir), os.fspath(tokenizer), files, key, docs, n_tokens, failed,
                                   failures[:100])
    return {"files": len(files), "documents": docs, "tokens": n_tokens, "failed": failed, "failures": failures[:100],
            "bytes": n_tokens * width, "seconds": round(time.monotonic() - t0, 3)}


@contextlib.contextmanager
def _deadline(seconds: float, message: str) -> Iterator[None]:
    """Raises `DatasetError(message)` in this (the main) thread if the block is still running
    after ``seconds``: a pipeline that waits on a lost worker does not hang the caller.

    The deadline interrupts the main thread (Ray Data's iterator then shuts its executor down),
    and again every second until the block has ended: one interrupt can be lost, where it lands
    in code that swallows it (a ``__del__``, say). None is sent once the block has ended, and
    one sent just before is absorbed here.

    A process that ignores SIGINT (a job started in the background by a shell script, or under
    ``nohup``) gets no interrupt from ``interrupt_main``: for the block, SIGINT then has a
    handler that raises only for the deadline's interrupt (a real Ctrl-C stays ignored), and is
    ignored again after it."""
    done = threading.Event()
    fired = threading.Event()
    lock = threading.Lock()

    def on_sigint(signum: int, frame: Any) -> None:
        if fired.is_set():
            raise KeyboardInterrupt

    ignored = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
    if ignored:
        signal.signal(signal.SIGINT, on_sigint)

    def watch() -> None:
        wait = seconds
        while not done.wait(wait):
            with lock:
                if done.is_set():
                    return
                fired.set()
                _thread.interrupt_main()
            wait = 1.0

    def end() -> None:
        with lock:
            done.set()
        if fired.is_set():
            _absorb_interrupt()

    t = threading.Thread(target=watch, daemon=True, name="stoker-ray-deadline")
    t.start()
    try:
        yield
    except KeyboardInterrupt:
        if fired.is_set():
            end()
            raise DatasetError(message) from None
        raise
    finally:
        end()
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _absorb_interrupt() -> None:
    """Lets an interrupt that the deadline sent, and that has not been raised yet, be raised and
    dropped here (a call into Python code is where a pending one is raised)."""
    try:
        (lambda: None)()
    except KeyboardInterrupt:
        pass


def _runs(files: list[str]) -> list[tuple[str, list[str]]]:
    """The files in order, in runs of one kind."""
    runs: list[tuple[str, list[str]]] = []
    for f in files:
        kind = _kind(f)
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(f)
        else:
            runs.append((kind, [f]))
    return runs
