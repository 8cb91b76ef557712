#!/usr/bin/env python3
"""Language-model data loaders side by side: text to packed token batches, same files, same tokenizer.

Every contender reads the ``text`` field of the same JSON Lines files (``--data``; default the four
Wikipedia shards ``/work/shared/text/wiki-en-2015-*.jsonl.zst``, 8,203 articles, 26.6 M GPT-2 tokens),
tokenizes it with the same ``tokenizer.json`` (``--tokenizer``, default GPT-2), appends EOS
(``<|endoftext|>``) to every document, and packs by concatenation into rows of ``--seq-len`` tokens
(labels = the next token), ``--batch-size`` rows per batch, no shuffling:

- ``datasets``: ``load_dataset("json", data_files=..., split="train")`` (reads the .zst itself), then
  ``.map(tokenize, batched=True, num_proc=--workers)`` with a ``tokenizers.Tokenizer`` (``encode_batch_fast``,
  no ``transformers``), then a run_clm-style ``group`` map (concatenate, cut rows of seq_len + 1 tokens
  overlapping by one), then ``DataLoader(ds.with_format("torch"), num_workers=--hf-loader-workers)``.
  The maps are timed too, with a fresh, empty cache folder per run (deleted after it).
- ``iterable``: a ``torch.utils.data.IterableDataset`` that streams the JSONL (``zstandard``), tokenizes
  ``--tok-batch`` documents per call and packs, in ``DataLoader(num_workers=--workers)`` processes; each
  worker takes every n-th file (when the files divide evenly) or else every n-th document.
- ``floor``: the tokenizer alone, one core (``RAYON_NUM_THREADS=1``, ``TOKENIZERS_PARALLELISM=false``):
  all documents decoded into memory first (not timed), then ``encode_batch_fast`` on batches of
  ``--tok-batch`` documents. Its tokens per CPU-second is what a loader can at best reach per core.
- ``floor-alt``: the floor again, in the interpreter ``--python floor-alt=PYTHON`` names (another
  environment, so another version of ``tokenizers`` beside the first: 1.0 beside 0.23, say). Its
  report carries the version. ``--python`` runs any contender with another interpreter
  (``tiktoken=PYTHON`` where ``tiktoken`` lives elsewhere).
- ``stoker-cache``: an epoch of ``stoker.TokenLoader(cache)`` from the token cache that ``stoker tokenize``
  wrote from the same files before the rounds (not timed): what every epoch after the first costs.
- ``stoker-autocache``: two epochs of one ``stoker.TokenLoader(files, tokenizer=..., cache=DIR)`` with an
  empty automatic token cache (a new folder per run): the first tokenizes and fills it, the second reads
  every document's tokens from it. Each epoch's CPU seconds are measured apart (the loader's construction
  in neither): their ratio per token is what the cache saves on every epoch after the first.
- ``tiktoken``: OpenAI's ``tiktoken`` with the ranks, pattern and EOS of the same ``tokenizer.json``
  (byte-level BPE files only; ids equal to ``tokenizers``' for GPT-2), one core, ``encode_ordinary``
  per document over the documents already in memory, like the floor: the fastest exact BPE we know.
- ``stoker-tokenizer``: ``stoker.Tokenizer(tokenizer).encode_batch(batch, add_eos=True, threads=--workers,
  format="flat")`` on batches of ``--tok-batch`` documents already in memory: the floor's work on stoker's
  encoder, as a user's own Ray Data, Spark or Dask job calls it.
- ``stoker``: ``stoker.TokenLoader(files, tokenizer=..., seq_len=..., batch_size=..., pack="concat",
  threads=--workers, output="numpy")``, ``for batch in loader``. Skipped, with a message, where the
  installed stoker has no ``TokenLoader``.

Labels differ in one detail: stoker's are -100 after each document's last token (EOS), the others' label
across the boundary, as run_clm does; the tokens are the same. ``datasets``, ``iterable`` and ``floor`` run
with ``TOKENIZERS_PARALLELISM=false`` and ``RAYON_NUM_THREADS=1`` (their parallelism is their worker
processes); stoker gets the environment unchanged.

Each contender runs in its own process; the rounds are interleaved (a b c d a b c d ...) and medians
are reported, with ratios paired within a round. Measured per run:

- wall seconds: from the start of the work (before ``load_dataset`` / the loader is built / the first
  encode call; imports and, for the floor, reading the documents come before) to the last batch,
  with the worker processes joined;
- CPU seconds of the process tree: ``getrusage(RUSAGE_CHILDREN)`` in this script, before and after the
  child exits (it includes every worker the child joined), minus what the child had used when its clock
  started (interpreter start, imports; the floor's reading of the documents). Once it has printed its
  result the child ends with ``os._exit`` (the interpreter's teardown costs 0.5-0.7 CPU-s after
  ``import torch``, no loader's work), unless a process it started is still there (``unreaped``: then it
  exits normally, so that its atexit handlers join them). The child's own view (``RUSAGE_SELF +
  RUSAGE_CHILDREN`` from start to last batch) is kept as ``cpu_s_inprocess``, the whole process's as
  ``process_cpu_s``;
- tokens delivered (input_ids in the batches, less padding; the floor: tokens encoded, EOS included),
  tokens per wall second and per CPU-second, CPU-seconds per million tokens;
- time to first batch (``datasets``: including loading and both maps; floor: its first encode call);
- peak memory of the process tree: the sum of ``VmRSS`` over the child and its descendants, sampled
  every 50 ms from /proc, and the sum of PSS (shared pages split between processes, fairer to forked
  workers) sampled every 0.5 s.

Ratios (paired per round, then the median): stoker vs floor tokens per CPU-second, stoker vs iterable
(tokens per CPU-second and per wall second), stoker vs datasets (the same, and time to first batch).

Dependencies (PyTorch for the DataLoader contenders; stoker installed with ``pip install .``)::

    python3 -m pip install datasets tokenizers zstandard torch

Command used for BENCHMARKS.md::

    python3 benches/compare_text.py --runs 3 --out benches/results/text.json

Smoke test (about 15 s on 2 cores): ``python3 benches/compare_text.py --docs 200 --runs 1 --data
/work/shared/text/wiki-en-2015-AA.jsonl.zst --out /tmp/results-text-smoke.json``. ``--docs N`` first
writes the first N documents (in file order) to temporary .jsonl.zst shards, one per input file (not
timed), and every contender reads those.
"""

import argparse
import glob
import io
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_torchvision import tree_pids as scan_tree_pids  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/text")
CONTENDERS = {"a": "datasets", "b": "iterable", "c": "floor", "d": "stoker", "e": "stoker-cache",
              "f": "stoker-autocache", "g": "tiktoken", "h": "stoker-tokenizer"}
SINGLE_CORE_ENV = {"TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}


def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def children_cpu():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return c.ru_utime + c.ru_stime


# ---------------------------------------------------------------- process tree, /proc

_HAVE_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def tree_pids(pid):
    """pid and all its descendants: /proc/<pid>/task/*/children where the kernel has it, else
    compare_torchvision's scan of /proc for parent ids."""
    if not _HAVE_CHILDREN_FILES:
        return scan_tree_pids(pid)
    out, stack = [], [pid]
    while stack:
        q = stack.pop()
        out.append(q)
        for f in glob.glob(f"/proc/{q}/task/*/children"):
            try:
                with open(f) as fh:
                    stack.extend(int(x) for x in fh.read().split())
            except OSError:
                pass
    return out


def _status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_rss(pids):
    return sum(_status_kib(p, "VmRSS:") for p in pids) * 1024


def tree_pss(pids):
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            pass
    return total


def run_tree(cmd, env):
    """Runs cmd; returns (stdout, stderr, returncode, wall, tree CPU seconds, peak RSS, peak PSS, processes seen).
    The CPU time is this process's RUSAGE_CHILDREN delta: it runs nothing else meanwhile."""
    c0, t0 = children_cpu(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak = {"rss": 0, "pss": 0, "procs": 0}
    done = threading.Event()

    def sample():
        n = 0
        while not done.is_set():
            pids = tree_pids(proc.pid)
            peak["rss"] = max(peak["rss"], tree_rss(pids))
            peak["procs"] = max(peak["procs"], len(pids))
            if n % 10 == 0:
                peak["pss"] = max(peak["pss"], tree_pss(pids))
            n += 1
            done.wait(0.05)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = proc.communicate()
    done.set()
    t.join()
    return (out, err, proc.returncode, time.perf_counter() - t0, children_cpu() - c0, peak["rss"], peak["pss"],
            peak["procs"])


def unreaped_children():
    """Processes this one started and has not joined (their CPU time would be lost)."""
    return [p for p in tree_pids(os.getpid()) if p != os.getpid()]


# ---------------------------------------------------------------- reading the documents

def open_lines(path):
    """The lines of a JSONL file, plain, .gz or .zst."""
    path = str(path)
    if path.endswith(".zst"):
        import zstandard

        fh = open(path, "rb")
        reader = zstandard.ZstdDecompressor().stream_reader(fh, closefd=True)
        return io.TextIOWrapper(reader, encoding="utf-8", newline="\n")
    if path.endswith(".gz"):
        import gzip

        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, encoding="utf-8", newline="\n")


def iter_texts(path, key="text"):
    with open_lines(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)[key]


def eos_of(tok, name, path=None):
    """The id of token ``name``; from the file at ``path`` where the tokenizer has no ``token_to_id``
    (``tokenizers`` 1.0)."""
    if not hasattr(tok, "token_to_id"):
        j = json.loads(Path(path).read_text())
        found = [a["id"] for a in j.get("added_tokens", []) if a["content"] == name]
        eos = found[0] if found else j["model"]["vocab"].get(name)
    else:
        eos = tok.token_to_id(name)
    if eos is None:
        raise SystemExit(f"EOS token {name!r} is not in the tokenizer (pass --eos)")
    return eos


def encoder(tok):
    return getattr(tok, "encode_batch_fast", tok.encode_batch)


def drain(loader, t0):
    """Iterates ``loader`` to its end: ``(seconds to the first batch, rows, input_ids values)``.
    Its iterator is dropped before this returns (DataLoader workers are joined)."""
    first = None
    tokens = rows = 0
    it = iter(loader)
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        ids = batch["input_ids"]
        rows += ids.shape[0]
        tokens += int(ids.numel() if hasattr(ids, "numel") else ids.size)
    del it
    return first, rows, tokens


def stop(t0, c0):
    """Stops the child's clocks: (wall seconds, CPU seconds) since t0 and c0."""
    return time.perf_counter() - t0, cpu() - c0


def report(clocks, c0, **kw):
    """Prints the child's result line, then ends the process at once where no child process is left: the
    interpreter's teardown (0.5-0.7 CPU-s once torch is imported) is no loader's cost."""
    unreaped = unreaped_children()
    print(json.dumps({"seconds": clocks[0], "cpu_s_inprocess": clocks[1], "cpu_before": c0,
                      "unreaped": len(unreaped), **kw}), flush=True)
    sys.stderr.flush()
    if not unreaped:
        os._exit(0)


# ---------------------------------------------------------------- contenders (child mode)

def run_datasets(args):
    from itertools import chain

    import datasets
    import torch
    from tokenizers import Tokenizer

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    tok = Tokenizer.from_file(str(args.tokenizer))
    eos, L = eos_of(tok, args.eos), args.seq_len
    encode = encoder(tok)

    def tokenize(batch):
        return {"input_ids": [e.ids + [eos] for e in encode(batch["text"], add_special_tokens=False)]}

    def group(batch):
        c = list(chain.from_iterable(batch["input_ids"]))
        n = max(len(c) - 1, 0) // L
        return {"input_ids": [c[i * L:(i + 1) * L] for i in range(n)],
                "labels": [c[i * L + 1:(i + 1) * L + 1] for i in range(n)]}

    c0, t0 = cpu(), time.perf_counter()
    ds = datasets.load_dataset("json", data_files=[str(f) for f in args.data], split="train",
                               cache_dir=str(args.cache_dir), keep_in_memory=False)
    load_s = time.perf_counter() - t0
    ds = ds.map(tokenize, batched=True, batch_size=args.tok_batch, num_proc=args.workers,
                remove_columns=ds.column_names, keep_in_memory=False)
    ds = ds.map(group, batched=True, num_proc=args.workers, remove_columns=ds.column_names, keep_in_memory=False)
    maps_s = time.perf_counter() - t0
    loader = torch.utils.data.DataLoader(ds.with_format("torch"), batch_size=args.batch_size,
                                         num_workers=args.hf_loader_workers)
    first, rows, tokens = drain(loader, t0)
    clocks = stop(t0, c0)
    report(clocks, c0, tokens=tokens, rows=rows, first_batch_s=first, load_s=load_s, prepare_s=maps_s,
           cache_bytes=sum(f.stat().st_size for f in Path(args.cache_dir).rglob("*") if f.is_file()))


def run_iterable(args):
    import numpy as np
    import torch
    from tokenizers import Tokenizer

    class PackedText(torch.utils.data.IterableDataset):
        def __init__(self, files, tokenizer, eos_name, seq_len, tok_batch):
            self.files, self.tokenizer, self.eos_name = [str(f) for f in files], str(tokenizer), eos_name
            self.seq_len, self.tok_batch = seq_len, tok_batch

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            k, n = (info.id, info.num_workers) if info is not None else (0, 1)
            by_file = len(self.files) % n == 0
            tok = Tokenizer.from_file(self.tokenizer)
            encode, eos = encoder(tok), np.array([eos_of(tok, self.eos_name)], dtype=np.int32)
            L = self.seq_len
            tail = np.empty(0, dtype=np.int32)

            def texts():
                i = 0
                for f in self.files[k::n] if by_file else self.files:
                    for text in iter_texts(f):
                        if by_file or i % n == k:
                            yield text
                        i += 1

            def pack(batch):
                nonlocal tail
                parts = [tail]
                for e in encode(batch, add_special_tokens=False):
                    parts.append(np.array(e.ids, dtype=np.int32))
                    parts.append(eos)
                c = np.concatenate(parts)
                rows = max(len(c) - 1, 0) // L
                for i in range(rows):
                    x = torch.from_numpy(c[i * L:(i + 1) * L + 1])
                    yield {"input_ids": x[:-1], "labels": x[1:]}
                tail = c[rows * L:]

            batch = []
            for text in texts():
                batch.append(text)
                if len(batch) == self.tok_batch:
                    yield from pack(batch)
                    batch = []
            if batch:
                yield from pack(batch)

    ds = PackedText(args.data, args.tokenizer, args.eos, args.seq_len, args.tok_batch)
    c0, t0 = cpu(), time.perf_counter()
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)
    first, rows, tokens = drain(loader, t0)
    clocks = stop(t0, c0)
    report(clocks, c0, tokens=tokens, rows=rows, first_batch_s=first,
           split="file" if len(args.data) % max(args.workers, 1) == 0 else "document")


def run_floor(args):
    from tokenizers import Tokenizer

    texts = [t for f in args.data for t in iter_texts(f)]
    tok = Tokenizer.from_file(str(args.tokenizer))
    eos_of(tok, args.eos, args.tokenizer)
    encode = encoder(tok)
    c0, t0 = cpu(), time.perf_counter()
    first = None
    tokens = 0
    for s in range(0, len(texts), args.tok_batch):
        batch = texts[s:s + args.tok_batch]
        tokens += sum(len(e.ids) for e in encode(batch, add_special_tokens=False)) + len(batch)  # + EOS
        if first is None:
            first = time.perf_counter() - t0
    clocks = stop(t0, c0)
    import tokenizers

    report(clocks, c0, tokens=tokens, documents=len(texts), first_batch_s=first,
           text_bytes=sum(len(t.encode()) for t in texts), call=encode.__name__, version=tokenizers.__version__)


def tiktoken_encoding(path, eos):
    """A ``tiktoken.Encoding`` with the byte-level BPE vocabulary, pre-tokenizer pattern and EOS of the
    ``tokenizer.json`` at ``path`` (ranks = ids, as in GPT-2's files)."""
    import tiktoken

    j = json.loads(Path(path).read_text())
    chars = {}
    n = 0
    for b in range(256):  # GPT-2's bytes_to_unicode
        if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    ranks = {bytes(chars[c] for c in tok): i for tok, i in j["model"]["vocab"].items()}
    pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    eos_id = next(a["id"] for a in j["added_tokens"] if a["content"] == eos)
    return tiktoken.Encoding("from-tokenizer-json", pat_str=pat, mergeable_ranks=ranks,
                             special_tokens={eos: eos_id})


def run_tiktoken(args):
    texts = [t for f in args.data for t in iter_texts(f)]
    enc = tiktoken_encoding(args.tokenizer, args.eos)
    c0, t0 = cpu(), time.perf_counter()
    first = None
    tokens = 0
    for t in texts:
        tokens += len(enc.encode_ordinary(t)) + 1  # + EOS
        if first is None:
            first = time.perf_counter() - t0
    clocks = stop(t0, c0)
    report(clocks, c0, tokens=tokens, documents=len(texts), first_batch_s=first,
           text_bytes=sum(len(t.encode()) for t in texts), call="encode_ordinary")


def run_stoker_tokenizer(args):
    """``stoker.Tokenizer.encode_batch`` on the documents in memory, batches of ``--tok-batch``
    (EOS added by the call), ``--workers`` threads: the floor's work on stoker's encoder."""
    import stoker

    texts = [t for f in args.data for t in iter_texts(f)]
    tok = stoker.Tokenizer(str(args.tokenizer), eos_token=args.eos)
    c0, t0 = cpu(), time.perf_counter()
    first = None
    tokens = 0
    for s in range(0, len(texts), args.tok_batch):
        ids, _ = tok.encode_batch(texts[s:s + args.tok_batch], add_eos=True, threads=args.workers, format="flat")
        tokens += len(ids)
        if first is None:
            first = time.perf_counter() - t0
    clocks = stop(t0, c0)
    report(clocks, c0, tokens=tokens, documents=len(texts), first_batch_s=first,
           text_bytes=sum(len(t.encode()) for t in texts), call="Tokenizer.encode_batch", engine=tok.engine)


def run_stoker(args, cache=None, autocache=None):
    """stoker over the text, or (``cache``) over the token cache ``stoker tokenize`` wrote before
    the rounds (not timed), or (``autocache``) over the text with its automatic token cache filled
    before the rounds."""
    import stoker

    c0, t0 = cpu(), time.perf_counter()
    if autocache is not None:
        loader = stoker.TokenLoader([str(f) for f in args.data], tokenizer=str(args.tokenizer), seq_len=args.seq_len,
                                    batch_size=args.batch_size, pack="concat", threads=args.workers, output="numpy",
                                    eos_token=args.eos, cache=str(autocache))
        epochs = []
        for e in range(2):
            loader.set_epoch(e)
            ce, te = cpu(), time.perf_counter()
            first_e, _, n = drain(loader, te)
            epochs.append({"cpu_s": cpu() - ce, "wall_s": time.perf_counter() - te, "tokens": n,
                           "first_batch_s": first_e})
        clocks = stop(t0, c0)
        stats = loader.stats()
        tokens = sum(e["tokens"] for e in epochs) - stats.get("padding_tokens", 0)
        return report(clocks, c0, tokens=tokens, first_batch_s=epochs[0]["first_batch_s"],
                      documents=stats.get("documents"),
                      threads=loader.threads, epochs=epochs, cache=loader.report()["cache"])
    if cache is None:
        loader = stoker.TokenLoader([str(f) for f in args.data], tokenizer=str(args.tokenizer), seq_len=args.seq_len,
                                    batch_size=args.batch_size, pack="concat", threads=args.workers, output="numpy",
                                    eos_token=args.eos)
    else:
        loader = stoker.TokenLoader(str(cache), seq_len=args.seq_len, batch_size=args.batch_size, pack="concat",
                                    threads=args.workers, output="numpy")
    first, rows, tokens = drain(loader, t0)
    clocks = stop(t0, c0)
    stats = loader.stats()
    tokens -= stats.get("padding_tokens", 0)
    report(clocks, c0, tokens=tokens, rows=rows, first_batch_s=first, documents=stats.get("documents"),
           threads=loader.threads, stats=stats)


RUNNERS = {"datasets": run_datasets, "iterable": run_iterable, "floor": run_floor, "floor-alt": run_floor,
           "stoker": run_stoker,
           "stoker-cache": lambda args: run_stoker(args, cache=args.token_cache),
           "stoker-autocache": lambda args: run_stoker(args, autocache=args.auto_cache), "tiktoken": run_tiktoken,
           "stoker-tokenizer": run_stoker_tokenizer}


# ---------------------------------------------------------------- parent

def write_subset(files, docs, folder):
    """The first `docs` documents of `files` as .jsonl.zst shards, as many as there are files."""
    import zstandard

    lines = []
    for f in files:
        with open_lines(f) as fh:
            for line in fh:
                if line.strip():
                    lines.append(line if line.endswith("\n") else line + "\n")
                    if len(lines) == docs:
                        break
        if len(lines) == docs:
            break
    per = -(-len(lines) // len(files))
    out = []
    for i in range(len(files)):
        part = lines[i * per:(i + 1) * per]
        if part:
            p = Path(folder) / f"subset-{i:02d}.jsonl.zst"
            p.write_bytes(zstandard.ZstdCompressor(level=3).compress("".join(part).encode()))
            out.append(p)
    return out, len(lines)


def machine():
    from importlib import metadata

    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    versions = {}
    for pkg in ["stoker", "datasets", "tokenizers", "torch", "zstandard", "pyarrow", "numpy"]:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu_model": model,
            "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "platform": platform.platform(), "python": platform.python_version(), "versions": versions,
            "loadavg_at_start": os.getloadavg()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, nargs="+", default=sorted(SHARED.glob("wiki-en-2015-*.jsonl.zst")),
                    help="JSONL files (.jsonl, .jsonl.gz, .jsonl.zst) with a 'text' field")
    ap.add_argument("--tokenizer", type=Path, default=SHARED / "tokenizer-gpt2.json")
    ap.add_argument("--eos", default="<|endoftext|>", help="the token appended to every document")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--tok-batch", type=int, default=256, help="documents per tokenizer call (a, b, c)")
    ap.add_argument("--workers", type=int, default=2,
                    help="datasets num_proc, DataLoader num_workers of the iterable, stoker threads")
    ap.add_argument("--hf-loader-workers", type=int, default=0,
                    help="DataLoader num_workers over the mapped dataset (transformers' Trainer default: 0)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--docs", type=int, help="only the first N documents (smoke tests)")
    ap.add_argument("--contenders", default="a,b,c,d,e",
                    help="comma-separated: a=datasets, b=iterable, c=floor, d=stoker, e=stoker-cache (an epoch "
                         "from the token cache `stoker tokenize` wrote first), f=stoker-autocache (an epoch "
                         "from the automatic token cache an untimed epoch filled first), g=tiktoken, "
                         "h=stoker-tokenizer (stoker.Tokenizer.encode_batch on the documents in memory); letters "
                         "or names")
    ap.add_argument("--out", type=Path, default=ROOT / "benches" / "results" / "text.json")
    ap.add_argument("--python", action="append", default=[], metavar="CONTENDER=PYTHON",
                    help="run that contender with another interpreter (its own packages), e.g. "
                         "floor-alt=/venv-tokenizers-1.0/bin/python to put two versions of tokenizers side by side")
    ap.add_argument("--runner", choices=sorted(RUNNERS), help=argparse.SUPPRESS)
    ap.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--token-cache", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--auto-cache", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.runner:
        return RUNNERS[args.runner](args)

    pythons = dict(p.split("=", 1) for p in args.python)
    names = []
    for c in args.contenders.split(","):
        c = c.strip()
        name = CONTENDERS.get(c, c)
        if name not in RUNNERS:
            ap.error(f"unknown contender {c!r}: expected a-g or {', '.join(RUNNERS)}")
        names.append(name)
    if not args.data:
        ap.error("no data files (--data)")
    for p in [*args.data, args.tokenizer]:
        if not p.is_file():
            ap.error(f"not a file: {p}")

    skipped = {}
    if any(n.startswith("stoker") for n in names):
        check = subprocess.run([sys.executable, "-c", "import stoker; stoker.TokenLoader"], capture_output=True,
                               text=True)
        if check.returncode != 0:
            reason = (check.stderr.strip().splitlines() or ["?"])[-1]
            skipped["stoker"] = f"stoker.TokenLoader is not available in {sys.executable}: {reason}"
            print(f"SKIPPING stoker: {skipped['stoker']}", file=sys.stderr)
            names = [n for n in names if not n.startswith("stoker")]
    if not names:
        raise SystemExit("nothing to run")

    summary = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine()}
    tmp = Path(tempfile.mkdtemp(prefix="stoker-compare-text-"))
    try:
        files, docs = list(args.data), None
        if args.docs:
            files, docs = write_subset(args.data, args.docs, tmp)
            print(f"--docs {args.docs}: the first {docs} documents, in {len(files)} shard(s) under {tmp}",
                  file=sys.stderr)
        for p in [*files, args.tokenizer]:  # into the page cache
            with open(p, "rb") as f:
                while f.read(1 << 20):
                    pass
        base = [sys.executable, str(Path(__file__).resolve()), "--data", *map(str, files), "--tokenizer",
                str(args.tokenizer), "--eos", args.eos, "--seq-len", str(args.seq_len), "--batch-size",
                str(args.batch_size), "--tok-batch", str(args.tok_batch), "--workers", str(args.workers),
                "--hf-loader-workers", str(args.hf_loader_workers)]
        if "stoker-cache" in names:
            token_cache = tmp / "token-cache"
            cli = "import sys, stoker._stoker as s; sys.exit(s.cli_main(sys.argv))"
            made = subprocess.run([sys.executable, "-c", cli, "tokenize", *map(str, files), "--tokenizer",
                                   str(args.tokenizer), "--threads", str(args.workers), str(token_cache)],
                                  capture_output=True, text=True)
            if made.returncode != 0:
                raise SystemExit(f"stoker tokenize failed: {made.stderr}")
            print(made.stdout.strip(), file=sys.stderr)
            base_cache = ["--token-cache", str(token_cache)]
        else:
            base_cache = []
        summary["config"] = {
            "data": [str(p) for p in args.data], "docs": args.docs, "documents_used": docs,
            "files_read": [str(p) for p in files], "tokenizer": str(args.tokenizer), "eos": args.eos,
            "seq_len": args.seq_len, "batch_size": args.batch_size, "tok_batch": args.tok_batch,
            "workers": args.workers, "hf_loader_workers": args.hf_loader_workers, "runs": args.runs,
            "contenders": names, "single_core_env": SINGLE_CORE_ENV}
        runs = {n: [] for n in names}
        failed = {}
        for r in range(args.runs):
            for name in names:
                if name in failed:
                    continue
                env = dict(os.environ)
                if not name.startswith("stoker"):
                    env.update(SINGLE_CORE_ENV)
                cmd = [pythons.get(name, sys.executable), *base[1:], *base_cache, "--runner", name]
                cache = None
                if name == "stoker-autocache":
                    cache = Path(tempfile.mkdtemp(prefix="auto-cache-", dir=tmp))
                    cmd += ["--auto-cache", str(cache)]
                if name == "datasets":
                    cache = Path(tempfile.mkdtemp(prefix="hf-cache-", dir=tmp))
                    cmd += ["--cache-dir", str(cache)]
                    env.update({"HF_DATASETS_CACHE": str(cache), "HF_HOME": str(cache / "home"),
                                "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                                "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"})
                out, err, rc, wall, tree_cpu, rss, pss, procs = run_tree(cmd, env)
                if cache is not None:
                    shutil.rmtree(cache, ignore_errors=True)
                if rc != 0:
                    failed[name] = f"exit {rc}: " + "\n".join(err.strip().splitlines()[-15:])
                    print(f"run {r + 1} {name} FAILED ({failed[name]})", file=sys.stderr)
                    continue
                j = json.loads(out.strip().splitlines()[-1])
                cpu_s = tree_cpu - j.pop("cpu_before")
                rec = {"wall_s": j.pop("seconds"), "cpu_s": cpu_s, "tokens": j.pop("tokens"), **j,
                       "process_wall_s": wall, "process_cpu_s": tree_cpu, "peak_rss_tree": rss,
                       "peak_pss_tree": pss, "max_processes": procs}
                rec["tokens_per_s"] = rec["tokens"] / rec["wall_s"]
                rec["tokens_per_cpu_s"] = rec["tokens"] / cpu_s
                rec["cpu_s_per_million_tokens"] = cpu_s / rec["tokens"] * 1e6
                runs[name].append(rec)
                if "epochs" in rec:
                    e0, e1 = rec["epochs"]
                    per_token = [e["cpu_s"] / e["tokens"] for e in (e0, e1)]
                    rec["first_vs_cached_epoch_cpu_per_token"] = per_token[0] / per_token[1]
                    print(f"run {r + 1} {name}: epoch 1 (tokenizing) {e0['cpu_s']:.2f} CPU-s, epoch 2 (cache) "
                          f"{e1['cpu_s']:.3f} CPU-s: {rec['first_vs_cached_epoch_cpu_per_token']:.1f}x cheaper per "
                          f"token", file=sys.stderr)
                print(f"run {r + 1} {name:8s} {rec['tokens']:>11,} tokens {rec['wall_s']:7.2f} s "
                      f"{rec['cpu_s']:7.2f} CPU-s {rec['tokens_per_cpu_s'] / 1e6:6.3f} M tok/CPU-s  first batch "
                      f"{rec['first_batch_s']:6.2f} s  RSS {rss / 2**20:7.1f} MiB"
                      + (f"  UNREAPED {rec['unreaped']}" if rec["unreaped"] else ""), file=sys.stderr)
        summary["machine"]["loadavg_at_end"] = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    keys = ["wall_s", "cpu_s", "tokens", "tokens_per_s", "tokens_per_cpu_s", "cpu_s_per_million_tokens",
            "first_batch_s", "peak_rss_tree", "peak_pss_tree", "process_cpu_s"]
    medians = {n: {k: statistics.median(x[k] for x in rs) for k in keys} for n, rs in runs.items() if rs}

    def paired(a, b, key, invert=False):
        if not runs.get(a) or not runs.get(b) or len(runs[a]) != len(runs[b]):
            return None
        return statistics.median((y[key] / x[key]) if invert else (x[key] / y[key])
                                 for x, y in zip(runs[a], runs[b], strict=True))

    ratios = {
        "stoker_vs_floor_tokens_per_cpu_s": paired("stoker", "floor", "tokens_per_cpu_s"),
        "stoker_vs_floor-alt_tokens_per_cpu_s": paired("stoker", "floor-alt", "tokens_per_cpu_s"),
        "stoker-tokenizer_vs_floor_tokens_per_cpu_s": paired("stoker-tokenizer", "floor", "tokens_per_cpu_s"),
        "stoker-tokenizer_vs_floor-alt_tokens_per_cpu_s": paired("stoker-tokenizer", "floor-alt", "tokens_per_cpu_s"),
        "stoker_vs_iterable_tokens_per_cpu_s": paired("stoker", "iterable", "tokens_per_cpu_s"),
        "stoker_vs_iterable_tokens_per_s": paired("stoker", "iterable", "tokens_per_s"),
        "stoker_vs_datasets_tokens_per_cpu_s": paired("stoker", "datasets", "tokens_per_cpu_s"),
        "stoker_vs_datasets_tokens_per_s": paired("stoker", "datasets", "tokens_per_s"),
        "stoker_vs_datasets_first_batch_s": paired("stoker", "datasets", "first_batch_s"),
        "iterable_vs_floor_tokens_per_cpu_s": paired("iterable", "floor", "tokens_per_cpu_s"),
        "stoker_cache_vs_stoker_tokens_per_cpu_s": paired("stoker-cache", "stoker", "tokens_per_cpu_s"),
        "stoker_autocache_vs_stoker_tokens_per_cpu_s": paired("stoker-autocache", "stoker", "tokens_per_cpu_s"),
        "stoker_vs_tiktoken_tokens_per_cpu_s": paired("stoker", "tiktoken", "tokens_per_cpu_s"),
        "tiktoken_vs_floor_tokens_per_cpu_s": paired("tiktoken", "floor", "tokens_per_cpu_s"),
        "datasets_vs_floor_tokens_per_cpu_s": paired("datasets", "floor", "tokens_per_cpu_s"),
    }
    if runs.get("stoker-autocache"):
        ratios["autocache_first_vs_cached_epoch_cpu_per_token"] = statistics.median(
            x["first_vs_cached_epoch_cpu_per_token"] for x in runs["stoker-autocache"])
    summary.update({"runs": runs, "medians": medians, "ratios": {k: v for k, v in ratios.items() if v is not None},
                    "skipped": skipped, "failed": failed})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2))

    print(f"\n{docs if docs else 'all'} documents from {len(args.data)} file(s), {args.tokenizer.name}, seq_len "
          f"{args.seq_len}, batch {args.batch_size}, workers/threads {args.workers}; medians of {args.runs} "
          f"interleaved runs\n")
    print("| contender | wall s | CPU s (tree) | tokens | tokens/s | tokens/CPU-s | CPU-s per M tokens "
          "| first batch s | peak RSS tree | peak PSS tree |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, m in medians.items():
        print(f"| {n} | {m['wall_s']:.2f} | {m['cpu_s']:.2f} | {m['tokens']:,.0f} | {m['tokens_per_s']:,.0f} | "
              f"{m['tokens_per_cpu_s']:,.0f} | {m['cpu_s_per_million_tokens']:.3f} | {m['first_batch_s']:.3f} | "
              f"{m['peak_rss_tree'] / 2**20:.0f} MiB | {m['peak_pss_tree'] / 2**20:.0f} MiB |")
    if summary["ratios"]:
        print("\nratios (paired per round, median):")
        for k, v in summary["ratios"].items():
            print(f"  {k}: {v:.3f}x")
    for n, why in {**skipped, **failed}.items():
        print(f"\n{n}: {'skipped' if n in skipped else 'FAILED'}: {why}")
    print(f"\nwrote {args.out}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
