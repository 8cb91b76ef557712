"""`stoker pack SRC s3://BUCKET/PREFIX` on one machine, against a real S3-compatible server
(moto's standalone server on 127.0.0.1, `helpers.moto_s3`):

- the objects are the files of a local `stoker pack` of the same input, byte for byte (plain, and
  `--random-access --max-side`), and a loader reads the prefix back;
- a prefix that holds an earlier run is refused unless `--overwrite`, which removes that run's
  objects (and nothing else) first;
- a bad destination (a bucket that does not exist, a URL that is not one, a scheme that cannot
  be written) is an error naming it;
- a shard past 8 MiB is a multipart upload, the same bytes; a pack killed (SIGKILL) while a
  shard's parts are on their way leaves no object under the shard's name.

`stoker.ray.pack` to object storage is in test_ray.py (a Ray cluster).
"""

import json
import os
import subprocess
import sys
import time

import pytest
import stoker
from helpers import moto_s3, s3_objects

pytest.importorskip("boto3", reason="boto3/moto not installed: object-store tests skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: object-store tests skipped")


@pytest.fixture(scope="module")
def s3():
    with moto_s3(["out"]) as s:
        yield s


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "stoker.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.parametrize("mode", ["plain", "random_access"])
def test_a_pack_to_s3_is_the_local_pack_byte_for_byte(s3, bad_demo, tmp_path, mode):
    flags = ["--random-access", "--max-side", "200"] if mode == "random_access" else []
    one = cli("pack", bad_demo, tmp_path / "one", "--shard-size", "64KiB", "--json", *flags)
    assert one.returncode == 0, one.stderr
    r = cli("pack", bad_demo, f"s3://out/{mode}", "--shard-size", "64KiB", "--json", *flags)
    assert r.returncode == 0, r.stderr
    local, remote = json.loads(one.stdout), json.loads(r.stdout)
    want = files(tmp_path / "one")
    assert len([n for n in want if n.endswith(".tar")]) >= 3
    assert s3_objects(s3["client"], "out", mode) == want
    assert remote["shards"] == [f"s3://out/{mode}/{n}" for n in want if n.endswith(".tar")]
    for k in ("samples", "bytes", "reencoded", "skipped", "random_access"):
        assert remote.get(k) == local.get(k), k
    # The prefix is a dataset.
    loader = stoker.ImageLoader(f"s3://out/{mode}", 8, preset="imagenet-val", output="numpy")
    assert loader.num_samples == local["samples"] and sum(len(y) for _, y in loader) > 0


def test_an_earlier_run_is_refused_then_overwritten(s3, demo, tmp_path):
    client = s3["client"]
    r = cli("pack", demo, "s3://out/again", "--shard-size", "64KiB")
    assert r.returncode == 0, r.stderr
    client.put_object(Bucket="out", Key="again/notes.txt", Body=b"mine")
    client.put_object(Bucket="out", Key="again/deeper/x.tar", Body=b"not this run's")
    r = cli("pack", demo, "s3://out/again", "--shard-size", "128KiB")
    assert r.returncode != 0
    assert "s3://out/again already holds the output of another run" in r.stderr and "--overwrite" in r.stderr
    r = cli("pack", demo, "s3://out/again", "--shard-size", "128KiB", "--overwrite")
    assert r.returncode == 0, r.stderr
    assert "removed" in r.stdout and "from s3://out/again" in r.stdout
    one = cli("pack", demo, tmp_path / "one", "--shard-size", "128KiB")
    assert one.returncode == 0, one.stderr
    assert s3_objects(client, "out", "again") == {**files(tmp_path / "one"), "notes.txt": b"mine"}
    assert client.get_object(Bucket="out", Key="again/deeper/x.tar")["Body"].read() == b"not this run's"


def test_bad_destinations_are_named(s3, demo):
    for dst, words in [
        ("s3://no-such-bucket/x", "s3://no-such-bucket/x: cannot list"),
        ("s3:///x", "`dst`: s3:///x: not an object-store URL"),
        ("https://example.com/x", "`dst`: https://example.com/x: cannot write to https://"),
        ("s3://out/x/*.tar", "`dst`: s3://out/x/*.tar: a destination is a plain prefix"),
    ]:
        r = cli("pack", demo, dst)
        assert r.returncode != 0 and words in r.stderr, (dst, r.stderr)
    # The shards being re-packed are never the destination (--overwrite would remove them).
    r = cli("pack", demo, "s3://out/src", "--shard-size", "64KiB")
    assert r.returncode == 0, r.stderr
    r = cli("pack", "s3://out/src/shard-*.tar", "s3://out/src", "--overwrite")
    assert r.returncode != 0 and "s3://out/src: the shards being re-packed are under this prefix" in r.stderr


def test_a_shard_larger_than_one_request_is_uploaded_in_parts(s3, big_demo, tmp_path):
    """Past 8 MiB a shard is a multipart upload (each part one bounded request), completed only
    once every part is in: the same bytes."""
    one = cli("pack", big_demo, tmp_path / "one", "--shard-size", "64MiB")
    assert one.returncode == 0, one.stderr
    r = cli("pack", big_demo, "s3://out/big", "--shard-size", "64MiB")
    assert r.returncode == 0, r.stderr
    want = files(tmp_path / "one")
    assert len(want["shard-000000.tar"]) > 8 << 20
    assert s3_objects(s3["client"], "out", "big") == want
    etag = s3["client"].head_object(Bucket="out", Key="big/shard-000000.tar")["ETag"]
    assert etag.strip('"').endswith("-2"), etag  # S3 names a multipart object's parts in its ETag


def test_a_pack_killed_mid_upload_leaves_no_shard(s3, big_demo, tmp_path):
    """SIGKILL while a shard's parts are on their way (each request held 0.5 s by a proxy in
    front of the server): the upload was begun, but no object is there under the shard's name;
    a rerun with --overwrite writes it whole."""
    from s3proxy import Proxy

    client = s3["client"]
    port = int(s3["endpoint"].rsplit(":", 1)[1])
    with Proxy(port, delay_ms=500) as proxy:
        # Its local temporary folder here: a killed process cannot remove it.
        env = {**os.environ, "AWS_ENDPOINT": proxy.endpoint, "TMPDIR": str(tmp_path)}
        p = subprocess.Popen([sys.executable, "-m", "stoker.cli", "pack", str(big_demo), "s3://out/killed",
                              "--shard-size", "64MiB"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not client.list_multipart_uploads(Bucket="out", Prefix="killed/").get("Uploads"):
                assert p.poll() is None, "the pack ended before its upload began"
                assert time.monotonic() < deadline, "no upload began within 60 s"
                time.sleep(0.02)
            p.kill()
        finally:
            if p.poll() is None:
                p.kill()
            p.wait(30)
    assert "shard-000000.tar" not in s3_objects(client, "out", "killed")
    # The killed pack's folder (named with its pid) is left, then removed by the next pack.
    assert [f.name for f in tmp_path.glob(f"stoker-pack-{p.pid}-*/.*")] == [".shard-000000.tar.stoker-partial"]
    r = cli("pack", big_demo, "s3://out/killed", "--shard-size", "64MiB", "--overwrite",
            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("stoker-pack-*")), list(tmp_path.iterdir())
    one = cli("pack", big_demo, tmp_path / "one", "--shard-size", "64MiB")
    assert one.returncode == 0, one.stderr
    assert s3_objects(client, "out", "killed") == files(tmp_path / "one")
