"""Small helpers shared by the tests."""

import contextlib
import hashlib
import json
import os
import pathlib
import resource
import subprocess
import tempfile
import time

import numpy as np
import pytest

#: Address space a bounded child may map: an allocation sized from a hostile header fails in
#: the child (a clear error or an abort the test sees) instead of exhausting the machine.
ADDRESS_SPACE = 4 << 30
#: Peak resident memory a bounded child may reach. The reliability cases load ~100 small images
#: with batches of 8-16 (well under 50 MiB of buffers); an interpreter with NumPy and stoker
#: uses ~100 MiB; one that imports torch 520 MiB here and 903 MiB on the CI machine, so a
#: bounded child never asks for torch output (a loader imports torch when it is made). A hostile
#: size that got past a limit (a 10^10-pixel image, a terabyte file read whole) would be far
#: above it.
PEAK_RSS = 768 << 20


def stoker_threads() -> set[int]:
    """Thread ids of this process's threads named by stoker (`stoker-decode-0`, `stoker-io-1`,
    `stoker-transfer`, ...). Tests compare these sets rather than total counts: other code
    (PyTorch, the interpreter, a test's own timers) starts and stops threads of its own."""
    tids = set()
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                if f.read().startswith("stoker-"):
                    tids.add(int(t))
        except OSError:  # gone between the listing and the read
            pass
    return tids


#: How long a joined thread may still be listed in `/proc/self/task`: `pthread_join` returns
#: when the kernel clears the thread's tid, a moment before the task is released, and on a
#: loaded machine that moment stretches. Joining is what the tests check; the listing only
#: catches up with it.
SETTLE = 0.5


def new_stoker_threads(before: set[int], within: float = SETTLE) -> set[int]:
    """stoker's threads that were not running at `before` (see `stoker_threads`), once there
    are none or `within` seconds have passed, whichever is first (see `SETTLE`)."""
    deadline = time.monotonic() + within
    while (new := stoker_threads() - before) and time.monotonic() < deadline:
        time.sleep(0.01)
    return new


def _limit_address_space(limit: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def run_bounded(args: list[str], timeout: float, *, env: dict[str, str] | None = None,
                address_space: int = ADDRESS_SPACE, peak_rss: int = PEAK_RSS,
                hang: str = "hung") -> subprocess.CompletedProcess[str]:
    """Runs `args` with an address-space limit and a timeout, and fails the test if it hangs
    (message `hang`) or if its own peak RSS (from `wait4`, this child only) passes `peak_rss`.
    The exit status is returned for the caller to check."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(args, stdout=out, stderr=err, env=env,
                             preexec_fn=lambda: _limit_address_space(address_space))
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                p.returncode = -9
                err.seek(0)
                pytest.fail(f"{hang} for {timeout} s: {args}\nstderr: {err.read().decode(errors='replace')[-4000:]}")
            time.sleep(0.02)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        r = subprocess.CompletedProcess(args, p.returncode, out.read().decode(errors="replace"),
                                        err.read().decode(errors="replace"))
    peak = usage.ru_maxrss * 1024
    assert peak < peak_rss, f"peak RSS {peak >> 20} MiB >= {peak_rss >> 20} MiB: {args}\n{r.stderr[-2000:]}"
    return r


def digest(loader):
    """SHA-256 of every batch's images and labels in delivery order."""
    h = hashlib.sha256()
    for images, labels in loader:
        h.update(np.ascontiguousarray(images).tobytes())
        h.update(np.asarray(labels).tobytes())
    return h.hexdigest()


def in_fork_child(work):
    """Runs ``work()`` in a ``fork()`` child and returns its JSON-serialisable result (the child
    exits at once, whatever happens; a failure there gives the parent no result to decode)."""
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.write(w, json.dumps(work()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def in_python_child(module: str, check: str, *args: str, timeout: float = 600) -> str:
    """Runs ``module.check(*args)`` (a test module of this folder) in a fresh Python process and
    fails the test with its output if it raises. For checks against torchvision or timm: their
    imports (~200 MiB beside torch) stay out of the pytest process, whose size every later
    ``fork()``ed child starts with (``run_bounded`` bounds those children's peak RSS)."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import {module}; {module}.{check}(*sys.argv[1:])"
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{module}.{check}{args} failed:\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    return r.stdout


#: The committed text sample of the token tests: the real GPT-2 tokenizer and 60 Wikipedia
#: articles (tests/data/text/README.md).
TEXT_DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "text"


def wiki_sample_texts() -> list[str]:
    """The texts of the committed Wikipedia sample, in file order."""
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader((TEXT_DATA / "wiki-sample.jsonl.zst").open("rb")).read()
    return [json.loads(line)["text"] for line in raw.decode().splitlines() if line]


def llama_shaped_tokenizer(texts: list[str]) -> str:
    """A ``tokenizer.json`` of Llama 2's shape trained on ``texts`` (BPE with byte fallback, a
    ``Prepend``/``Replace`` normalizer, ``<s>`` before each text): a file stoker's own BPE does
    not take, which runs on ``tokenizers`` 1.0. Trained on words (a whole document as one word
    takes ~10x longer); Llama 2's file has no pre-tokenizer, so the saved one has none either."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    llama = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    llama.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    llama.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    llama.pre_tokenizer = pre_tokenizers.Split("\u2581", "merged_with_next")
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    llama.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=3000, special_tokens=specials))
    llama.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    spec = json.loads(llama.to_str())
    spec["pre_tokenizer"] = None
    return json.dumps(spec)


#: The environment stoker's S3 client reads for the test server (`moto_s3`), besides the endpoint.
S3_ENV = {"AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
          "AWS_REGION": "us-east-1"}


@contextlib.contextmanager
def moto_s3(buckets=()):
    """A real S3-compatible server (moto's standalone server, from PyPI) on 127.0.0.1 with
    `buckets` made, and the environment stoker reads for it (`AWS_ENDPOINT`, `AWS_ALLOW_HTTP`,
    credentials, region) set in this process until the end (processes started meanwhile inherit
    it). Yields `{"endpoint", "client"}` (a boto3 client)."""
    import boto3
    from s3proxy import start_moto

    try:
        server, port = start_moto()
    except RuntimeError:
        pytest.fail("the S3 test server did not start")
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                              region_name="us-east-1")
        for b in buckets:
            client.create_bucket(Bucket=b)
        with environ({"AWS_ENDPOINT": endpoint, **S3_ENV}):
            yield {"endpoint": endpoint, "client": client}
    finally:
        server.terminate()
        server.wait(10)


@contextlib.contextmanager
def environ(env):
    """`env` set in this process's environment until the end, then each variable as it was."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def s3_objects(client, bucket: str, prefix: str) -> dict[str, bytes]:
    """The objects directly under `prefix` (not deeper), by name, with their bytes, sorted: what
    `stoker pack` writes to a prefix, as `{p.name: p.read_bytes()}` is for a folder."""
    listing = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/", Delimiter="/")
    names = sorted(o["Key"].rsplit("/", 1)[1] for o in listing.get("Contents", []))
    return {n: client.get_object(Bucket=bucket, Key=f"{prefix}/{n}")["Body"].read() for n in names}


def s3_stamps(client, bucket: str, prefix: str) -> dict[str, tuple]:
    """Every object under `prefix` (at any depth) with its last-modified time and ETag: an upload
    changes the time even when the bytes are the same."""
    listing = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")
    return {o["Key"]: (o["LastModified"], o["ETag"]) for o in listing.get("Contents", [])}
