"""`stoker.ray` on a real Ray cluster: two nodes on this machine (`ray.cluster_utils.Cluster`,
one CPU each), against the one-machine commands, byte for byte.

- `stoker.ray.pack` (plain, `random_access` with `max_side`, shards re-packed in a shuffled
  order) writes the shards, indexes and `classes.json` of `stoker pack`, and lists the bad files
  it skips as `stoker pack --json` does;
- a worker process killed (SIGKILL) in the middle of a task, once in each stage, leaves the same
  output: Ray retries the task and the file is written again under its own name;
- a rerun writes nothing (every file's mtime unchanged);
- `stoker.ray.tokenize` writes the token cache of `stoker tokenize` (JSON Lines, zstd), the
  documents that fail counted alike;
- `stoker pack --ray ADDRESS` and `stoker tokenize --ray ADDRESS` write the same; a bad address
  is refused by `stoker::args`;
- to object storage (a real S3-compatible server, moto's, started before the nodes so that their
  workers have its endpoint and credentials): the objects are the files of `stoker pack`, with a
  task killed in each stage too; a rerun uploads nothing; a shard cut short, overwritten in
  place or without its index is found and rewritten, and only it; a bucket that does not exist
  is an error naming it.

Ray is the `stoker[ray]` extra: without it these tests skip (requirements-dev.txt installs it,
so CI runs them), but the first one, that `import stoker` imports no Ray, always runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import moto_s3, s3_objects, s3_stamps

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEXT = ROOT / "tests" / "data" / "text"
GPT2 = TEXT / "tokenizer-gpt2.json"
SAMPLE = TEXT / "wiki-sample.jsonl.zst"

try:
    import ray  # noqa: F401

    HAVE_RAY = True
except ImportError:
    HAVE_RAY = False

needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray is not installed (pip install 'stoker[ray]')")


def test_import_stoker_imports_no_ray():
    code = ("import sys, stoker, stoker.ray; assert 'ray' not in sys.modules, 'ray imported'; "
            "assert 'ray.data' not in sys.modules; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_bad_arguments_are_refused_before_any_cluster(demo, tmp_path):
    """Each names the argument or the file; no Ray is imported or started for them."""
    import stoker.ray
    from stoker.errors import ConfigError, DatasetError

    gpt2 = str(GPT2)
    for call, error, words in [
        (lambda: stoker.ray.pack(tmp_path / "nope", tmp_path / "o"), DatasetError, "nope: no such file"),
        (lambda: stoker.ray.pack(demo, tmp_path / "o", files_per_task=0), ConfigError, "`files_per_task`"),
        (lambda: stoker.ray.pack(demo, tmp_path / "o", max_side=True), ConfigError, "`max_side`"),
        (lambda: stoker.ray.pack(demo, tmp_path / "o", address="bogus"), ConfigError, "HOST:PORT"),
        (lambda: stoker.ray.pack(demo, "https://host/o"), ConfigError, "cannot write to https://"),
        (lambda: stoker.ray.tokenize([str(tmp_path / "no.jsonl")], gpt2, tmp_path / "t"), DatasetError, "no.jsonl"),
        (lambda: stoker.ray.tokenize([str(SAMPLE)], gpt2, tmp_path / "t", document="para"), ConfigError, "`document`"),
    ]:
        with pytest.raises(error, match=words):
            call()
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


@pytest.fixture(scope="module")
def s3():
    """The S3 test server (`helpers.moto_s3`, bucket `ray`), or None without moto/boto3."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError:
        yield None
        return
    with moto_s3(["ray"]) as s:
        yield s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3):
    """A head and a second node, one CPU and a 100 MB object store each; the fault hook's folder
    (`STOKER_RAY_TEST_KILL_ONCE`) and the S3 server's environment are set before the nodes start,
    so their workers see them."""
    if not HAVE_RAY:
        pytest.skip("Ray is not installed (pip install 'stoker[ray]')")
    import ray
    from ray.cluster_utils import Cluster
    from stoker.ray._cluster import KILL_ONCE_VAR

    faults = tmp_path_factory.mktemp("faults")
    os.environ[KILL_ONCE_VAR] = str(faults)
    node = {"num_cpus": 1, "object_store_memory": 100 * 2**20}
    c = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    c.add_node(**node)
    c.wait_for_nodes(timeout=120)
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, faults
    finally:
        ray.shutdown()
        c.shutdown()
        del os.environ[KILL_ONCE_VAR]


def cli(*args, timeout=300):
    r = subprocess.run([sys.executable, "-m", "stoker.cli", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    return r


def outputs(folder: pathlib.Path) -> dict[str, bytes]:
    """What `stoker pack` writes: shards, indexes, classes.json (not the `.stoker-ray` folder)."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def single_pack(src, dst, *flags):
    r = cli("pack", src, dst, "--json", "--threads", "2", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@needs_ray
@pytest.mark.parametrize("mode", ["plain", "random_access"])
def test_pack_gives_the_bytes_of_stoker_pack(cluster, bad_demo, tmp_path, mode):
    import stoker.ray

    flags = ["--random-access", "--max-side", "200"] if mode == "random_access" else []
    kw = {"random_access": True, "max_side": 200} if mode == "random_access" else {}
    one = single_pack(bad_demo, tmp_path / "one", "--shard-size", "64KiB", *flags)
    s = stoker.ray.pack(bad_demo, tmp_path / "ray", shard_size="64KiB", files_per_task=16, progress=False, **kw)
    a, b = outputs(tmp_path / "one"), outputs(tmp_path / "ray")
    assert len([n for n in a if n.endswith(".tar")]) >= 3
    assert list(a) == list(b)
    for name in a:
        assert a[name] == b[name], name
    # The bad files, listed as stoker pack lists them (path and reason, in its order).
    assert {pathlib.Path(k["path"]).name for k in one["skipped"]} >= {"zz_empty.jpg", "zz_text.jpg"}
    assert [(k["path"], k["reason"]) for k in s["skipped"]] == [(k["path"], k["reason"]) for k in one["skipped"]]
    assert (s["samples"], s["bytes"], s["reencoded"]) == (one["samples"], one["bytes"], one["reencoded"])
    if mode == "random_access":
        assert s["random_access"]["recoded"] == one["random_access"]["recoded"] > 0
        assert s["random_access"]["bytes_after"] == one["random_access"]["bytes_after"]


@needs_ray
def test_repacking_shards_shuffled_gives_the_bytes_of_stoker_pack(cluster, demo, tmp_path):
    import stoker.ray

    single_pack(demo, tmp_path / "shards", "--shard-size", "256KiB")
    flags = ["--random-access", "--shard-size", "128KiB", "--shuffle", "--seed", "5"]
    single_pack(tmp_path / "shards", tmp_path / "one", *flags)
    stoker.ray.pack(tmp_path / "shards", tmp_path / "ray", random_access=True, shard_size="128KiB", shuffle=True,
                    seed=5, files_per_task=7, progress=False)
    a, b = outputs(tmp_path / "one"), outputs(tmp_path / "ray")
    assert len(a) > 5 and a == b


@needs_ray
def test_a_killed_task_gives_the_same_bytes_and_a_rerun_writes_nothing(cluster, demo, tmp_path):
    import stoker.ray

    _, faults = cluster
    one = tmp_path / "one"
    single_pack(demo, one, "--shard-size", "64KiB")
    (faults / "armed").touch()
    try:
        s = stoker.ray.pack(demo, tmp_path / "ray", shard_size="64KiB", files_per_task=16, progress=False)
    finally:
        (faults / "armed").unlink()
    # The hook killed one worker in each stage (it leaves a marker when it does).
    assert (faults / "prepare").exists() and (faults / "write").exists()
    assert outputs(one) == outputs(tmp_path / "ray")
    assert not list((tmp_path / "ray").glob(".*partial"))
    assert s["written"] == len(s["shards"]) and s["kept"] == 0
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").rglob("*")}
    again = stoker.ray.pack(demo, tmp_path / "ray", shard_size="64KiB", files_per_task=16, progress=False)
    assert (again["written"], again["kept"]) == (0, len(s["shards"]))
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "ray").rglob("*")} == before
    # A shard removed is written again, and only it.
    victim = tmp_path / "ray" / "shard-000001.tar"
    victim.unlink()
    third = stoker.ray.pack(demo, tmp_path / "ray", shard_size="64KiB", files_per_task=16, progress=False)
    assert (third["written"], third["kept"]) == (1, len(s["shards"]) - 1)
    assert outputs(one) == outputs(tmp_path / "ray")


@needs_ray
def test_pack_refuses_another_runs_folder(cluster, demo, tmp_path):
    import stoker.ray
    from stoker.errors import ConfigError

    single_pack(demo, tmp_path / "one", "--shard-size", "64KiB")
    with pytest.raises(ConfigError, match="already holds the output of another run"):
        stoker.ray.pack(demo, tmp_path / "one", shard_size="64KiB", progress=False)
    with pytest.raises(ConfigError, match="quality"):
        stoker.ray.pack(demo, tmp_path / "x", quality=0, progress=False)


@needs_ray
def test_tokenize_gives_the_cache_of_stoker_tokenize(cluster, tmp_path):
    import stoker
    import stoker.ray

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a good line"}\n{"text": 3}\nnot json\n\n   \n{"text": "the last one"}\n')
    data = [str(SAMPLE), str(bad)]
    r = cli("tokenize", *data, "--tokenizer", GPT2, tmp_path / "one")
    assert r.returncode == 0, r.stderr
    s = stoker.ray.tokenize(data, GPT2, tmp_path / "ray", batch_size=16, progress=False)
    for name in ("tokens.bin", "index.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "ray" / name).read_bytes(), name
    one = json.loads((tmp_path / "one" / "stoker-tokens.json").read_text())
    two = json.loads((tmp_path / "ray" / "stoker-tokens.json").read_text())
    assert one.pop("failures")[0].startswith(f"{bad}:")  # the reasons' words are serde_json's vs Python's json
    assert two.pop("failures")[0].startswith(f"{bad}:2")
    assert one == two
    assert (s["documents"], s["tokens"], s["failed"]) == (one["documents"], one["tokens"], 2)
    # TokenLoader reads it.
    loader = stoker.TokenLoader(str(tmp_path / "ray"), batch_size=2, seq_len=64, output="numpy")
    assert next(iter(loader))["input_ids"].shape == (2, 64)
    # The command line's --ray: the same cache.
    r = cli("tokenize", *data, "--tokenizer", GPT2, tmp_path / "cli", "--ray", cluster[0].address)
    assert r.returncode == 0, r.stderr
    assert f"{one['documents']} documents (2 failed, skipped)" in r.stdout
    for name in ("tokens.bin", "index.bin"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name


@needs_ray
def test_cli_pack_with_ray(cluster, demo, tmp_path):
    c, _ = cluster
    single_pack(demo, tmp_path / "one", "--shard-size", "64KiB")
    r = cli("pack", demo, tmp_path / "ray", "--shard-size", "64KiB", "--ray", c.address, "--files-per-task", "32")
    assert r.returncode == 0, r.stderr
    assert "packed 96 samples" in r.stdout
    assert outputs(tmp_path / "one") == outputs(tmp_path / "ray")
    r = cli("pack", demo, tmp_path / "x", "--ray", "nowhere")
    assert r.returncode != 0 and "--ray" in r.stderr and "HOST:PORT" in r.stderr


@needs_ray
def test_tokenize_has_a_deadline(cluster, tmp_path, monkeypatch):
    """A worker that never answers is an error naming the folder when the deadline passes, not
    a hang, and nothing half-written is left."""
    import time

    import ray.cloudpickle
    import stoker.ray
    from stoker.errors import DatasetError
    from stoker.ray import _tokenize

    class Stuck(_tokenize.Encode):
        def __call__(self, batch):
            time.sleep(3600)

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(_tokenize, "Encode", Stuck)
    with pytest.raises(DatasetError, match="did not finish within 5 s"):
        stoker.ray.tokenize([str(SAMPLE)], GPT2, tmp_path / "out", timeout=5, progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_the_deadline_holds_where_sigint_is_ignored():
    """A job started in the background by a shell script (or under nohup) ignores SIGINT, so the
    deadline's interrupt of the main thread is not delivered by itself: the deadline still ends
    the block, a real SIGINT meanwhile stays ignored, and SIGINT is ignored again after it (in a
    process of its own, started with SIGINT ignored; no Ray needed)."""
    import signal
    import textwrap

    code = textwrap.dedent("""
        import os, signal, time
        from stoker.errors import DatasetError
        from stoker.ray._tokenize import _deadline
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        try:
            with _deadline(0.5, "too late"):
                os.kill(os.getpid(), signal.SIGINT)
                end = time.monotonic() + 30
                while time.monotonic() < end:  # as Ray Data's iterator waits: short sleeps
                    time.sleep(0.01)
        except DatasetError as e:
            assert str(e) == "too late", e
        else:
            raise SystemExit("the block ran to its end")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert r.returncode == 0, r.stderr


def needs_s3(s3):
    if s3 is None:
        pytest.skip("boto3/moto not installed: object-store tests skipped")
    return s3["client"]


@needs_ray
@pytest.mark.parametrize("mode", ["plain", "random_access"])
def test_pack_to_object_storage_gives_the_bytes_of_stoker_pack(cluster, s3, bad_demo, tmp_path, mode):
    import stoker.ray

    client = needs_s3(s3)
    flags = ["--random-access", "--max-side", "200"] if mode == "random_access" else []
    kw = {"random_access": True, "max_side": 200} if mode == "random_access" else {}
    one = single_pack(bad_demo, tmp_path / "one", "--shard-size", "64KiB", *flags)
    s = stoker.ray.pack(bad_demo, f"s3://ray/{mode}/", shard_size="64KiB", files_per_task=16, progress=False, **kw)
    want = outputs(tmp_path / "one")
    assert len([n for n in want if n.endswith(".tar")]) >= 3
    assert s3_objects(client, "ray", mode) == want
    assert s["shards"] == [f"s3://ray/{mode}/{n}" for n in want if n.endswith(".tar")]
    assert (s["samples"], s["bytes"], s["reencoded"]) == (one["samples"], one["bytes"], one["reencoded"])
    # Only the plan is left of the work (the staging objects are deleted).
    assert list(s3_objects(client, "ray", f"{mode}/.stoker-ray")) == ["plan.json"]


@needs_ray
def test_object_storage_killed_tasks_rerun_and_damaged_shards(cluster, s3, demo, tmp_path):
    import stoker.ray

    client = needs_s3(s3)
    _, faults = cluster
    single_pack(demo, tmp_path / "one", "--shard-size", "64KiB")
    want = outputs(tmp_path / "one")
    for marker in ("prepare", "write"):
        (faults / marker).unlink(missing_ok=True)
    (faults / "armed").touch()
    try:
        s = stoker.ray.pack(demo, "s3://ray/rerun", shard_size="64KiB", files_per_task=16, progress=False)
    finally:
        (faults / "armed").unlink()
    assert (faults / "prepare").exists() and (faults / "write").exists()
    assert s3_objects(client, "ray", "rerun") == want
    n = len(s["shards"])
    assert (s["written"], s["kept"]) == (n, 0)

    def again():
        return stoker.ray.pack(demo, "s3://ray/rerun", shard_size="64KiB", files_per_task=16, progress=False)

    # A rerun uploads nothing: every object keeps its time and ETag.
    before = s3_stamps(client, "ray", "rerun")
    r = again()
    assert (r["written"], r["kept"]) == (0, n)
    assert s3_stamps(client, "ray", "rerun") == before
    # A shard cut short, one overwritten in place (the same size) and an index removed: each
    # found and rewritten, and only they.
    key = "rerun/shard-{:06d}.tar"
    body = client.get_object(Bucket="ray", Key=key.format(1))["Body"].read()
    client.put_object(Bucket="ray", Key=key.format(1), Body=body[:-1024])
    body = bytearray(client.get_object(Bucket="ray", Key=key.format(2))["Body"].read())
    body[:512] = bytes(512)
    client.put_object(Bucket="ray", Key=key.format(2), Body=bytes(body))
    client.delete_object(Bucket="ray", Key=key.format(3) + ".idx")
    before = s3_stamps(client, "ray", "rerun")
    r = again()
    assert (r["written"], r["kept"]) == (3, n - 3)
    assert s3_objects(client, "ray", "rerun") == want
    after = s3_stamps(client, "ray", "rerun")
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed == {key.format(k) + ext for k in (1, 2, 3) for ext in ("", ".idx")}
    for marker in ("prepare", "write"):
        (faults / marker).unlink(missing_ok=True)


@needs_ray
def test_cli_pack_with_ray_to_object_storage(cluster, s3, demo, tmp_path):
    from stoker.errors import StokerError

    client = needs_s3(s3)
    c, _ = cluster
    single_pack(demo, tmp_path / "one", "--shard-size", "64KiB")
    r = cli("pack", demo, "s3://ray/cli", "--shard-size", "64KiB", "--ray", c.address, "--files-per-task", "32")
    assert r.returncode == 0, r.stderr
    assert "packed 96 samples" in r.stdout
    assert s3_objects(client, "ray", "cli") == outputs(tmp_path / "one")
    import stoker.ray

    with pytest.raises(StokerError, match="s3://no-such-bucket/x: cannot list"):
        stoker.ray.pack(demo, "s3://no-such-bucket/x", progress=False)
