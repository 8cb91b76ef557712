"""Shards in object storage, read from a real S3-compatible server (moto's standalone server,
from PyPI) that the test starts on 127.0.0.1 and stops at the end."""

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import stoker

boto3 = pytest.importorskip("boto3", reason="boto3/moto not installed: object-store tests skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: object-store tests skipped")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(demo, tmp_path_factory):
    shards = tmp_path_factory.mktemp("s3shards")
    subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(shards), "--shard-size", "1MiB"],
                   check=True, capture_output=True)
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail("the S3 test server did not start")
                time.sleep(0.1)
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                              region_name="us-east-1")
        client.create_bucket(Bucket="data")
        for p in sorted(shards.iterdir()):
            client.upload_file(str(p), "data", f"train/{p.name}", ExtraArgs={"ACL": "public-read"})
        env = {"AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test",
               "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        yield {"endpoint": endpoint, "shards": shards, "client": client}
    finally:
        for k, v in locals().get("old", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.terminate()
        server.wait(10)


def batches(root, **kw):
    loader = stoker.ImageLoader(root, 16, preset="imagenet-train", shuffle=True, seed=5, output="numpy",
                                io_threads=4, **kw)
    return loader, [(x.copy(), y.copy()) for x, y in loader]


def test_s3_shards_give_the_same_batches_as_local_shards(s3):
    _, local = batches(str(s3["shards"] / "shard-*.tar"))
    loader, remote = batches("s3://data/train/shard-*.tar")
    assert loader.classes and len(remote) == len(local) == 6
    for (a, la), (b, lb) in zip(local, remote, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    report = loader.report()
    assert report["skipped_count"] == 0
    # Shard-aware shuffling works the same remotely.
    a = [i for b in stoker.ImageLoader("s3://data/train/shard-*.tar", 8, preset="imagenet-val", shuffle="shards",
                                       shard_window=2, output="numpy").batches() for i in b.indices]
    assert sorted(a) == list(range(96))


def test_a_bucket_prefix_is_a_pack_folder(s3):
    _, local = batches(str(s3["shards"]))
    for prefix in ("s3://data/train", "s3://data/train/"):
        loader, remote = batches(prefix)
        assert loader.classes and len(remote) == len(local)
        for (a, la), (b, lb) in zip(local, remote, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(la, lb)


def test_plain_https_style_url(s3):
    url = f"{s3['endpoint']}/data/train/shard-000000.tar"
    loader = stoker.ImageLoader(url, 8, preset="imagenet-val", output="numpy")
    assert sum(len(y) for _, y in loader) == loader.num_samples > 0


def test_object_store_errors_name_the_object(s3):
    with pytest.raises(stoker.DatasetError, match="no object matches"):
        stoker.ImageLoader("s3://data/train/nothing-*.tar", 4, preset="imagenet-val")
    s3["client"].put_object(Bucket="data", Key="lonely/x.tar", Body=b"\0" * 1024)
    with pytest.raises(stoker.DatasetError, match=r"s3://data/lonely/x\.tar\.idx: cannot read the shard index"):
        stoker.ImageLoader("s3://data/lonely/x.tar", 4, preset="imagenet-val")
    with pytest.raises(stoker.ConfigError, match="unsupported URL scheme"):
        stoker.ImageLoader("ftp://host/x.tar", 4, preset="imagenet-val")
