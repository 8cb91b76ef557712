"""Shards in object storage, read from a real S3-compatible server (moto's standalone server,
from PyPI) that the test starts on 127.0.0.1 and stops at the end."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest
import stoker
from helpers import moto_s3

boto3 = pytest.importorskip("boto3", reason="boto3/moto not installed: object-store tests skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: object-store tests skipped")


@pytest.fixture(scope="module")
def s3(demo, tmp_path_factory):
    shards = tmp_path_factory.mktemp("s3shards")
    subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(shards), "--shard-size", "1MiB"],
                   check=True, capture_output=True)
    with moto_s3(["data"]) as s:
        for p in sorted(shards.iterdir()):
            s["client"].upload_file(str(p), "data", f"train/{p.name}", ExtraArgs={"ACL": "public-read"})
        yield {**s, "shards": shards}


def batches(root, **kw):
    kw = {"shuffle": True, **kw}
    loader = stoker.ImageLoader(root, 16, preset="imagenet-train", seed=5, output="numpy", io_threads=4, **kw)
    return loader, [(x.copy(), y.copy()) for x, y in loader]


@pytest.mark.wheel
def test_s3_shards_give_the_same_batches_as_local_shards(s3):
    # Over object storage shuffle=True is a shard-window order (4 parts a window): the same
    # batches as that order of the local copy; shuffle="global" is the local shuffle=True.
    _, local = batches(str(s3["shards"] / "shard-*.tar"), shuffle="shards", shard_window=4)
    loader, remote = batches("s3://data/train/shard-*.tar")
    _, local_global = batches(str(s3["shards"] / "shard-*.tar"))
    _, remote_global = batches("s3://data/train/shard-*.tar", shuffle="global")
    assert loader.classes and len(remote) == len(local) == len(local_global) == len(remote_global) == 6
    for (a, la), (b, lb) in [*zip(local, remote, strict=True), *zip(local_global, remote_global, strict=True)]:
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    report = loader.report()
    assert report["skipped_count"] == 0
    # Shard-aware shuffling works the same remotely.
    a = [i for b in stoker.ImageLoader("s3://data/train/shard-*.tar", 8, preset="imagenet-val", shuffle="shards",
                                       shard_window=2, output="numpy").batches() for i in b.indices]
    assert sorted(a) == list(range(96))


def test_a_bucket_prefix_is_a_pack_folder(s3):
    _, local = batches(str(s3["shards"]), shuffle="shards", shard_window=4)
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


@pytest.mark.wheel
def test_text_in_object_storage_gives_the_reference_tokens(s3, tmp_path):
    """JSON Lines (plain and .zst) and a tar shard of .txt members read from S3: the same token
    stream as the reference tokenizer over the same documents; a missing object is named."""
    import io
    import json
    import pathlib
    import tarfile

    import zstandard
    from tokenizers import Tokenizer

    data = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
    raw = zstandard.ZstdDecompressor().stream_reader((data / "wiki-sample.jsonl.zst").open("rb")).read()
    lines = [line for line in raw.splitlines() if line]
    texts = [json.loads(line)["text"] for line in lines]
    client = s3["client"]
    client.put_object(Bucket="data", Key="text/part-0.jsonl", Body=b"\n".join(lines[:20]) + b"\n")
    client.put_object(Bucket="data", Key="text/part-1.jsonl.zst",
                      Body=zstandard.ZstdCompressor().compress(b"\n".join(lines[20:40])))
    shard = io.BytesIO()
    with tarfile.open(fileobj=shard, mode="w") as tar:
        for i, t in enumerate(texts[40:]):
            info = tarfile.TarInfo(f"doc{i:03d}.txt")
            info.size = len(t.encode())
            tar.addfile(info, io.BytesIO(t.encode()))
    client.put_object(Bucket="data", Key="shards/part-2.tar", Body=shard.getvalue())
    tok = Tokenizer.from_file(str(data / "tokenizer-gpt2.json"))
    stream = np.concatenate([np.array(e.ids + [50256], dtype=np.int64) for e in tok.encode_batch(texts)])
    loader = stoker.TokenLoader("s3://data/text/part-*", tokenizer=data / "tokenizer-gpt2.json", seq_len=512,
                                batch_size=4, output="numpy")
    assert loader.documents == 40
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    after = sum(len(e.ids) + 1 for e in tok.encode_batch(texts[:40]))  # tokens of the 40 JSON documents
    assert 0 <= after - len(got) < 512
    np.testing.assert_array_equal(got, stream[: len(got)])
    tail = stoker.TokenLoader("s3://data/shards/part-2.tar",
                              tokenizer=data / "tokenizer-gpt2.json", seq_len=64, batch_size=4, output="numpy")
    rest = np.concatenate([b["input_ids"].reshape(-1).copy() for b in tail])
    np.testing.assert_array_equal(rest, stream[after: after + len(rest)])
    assert len(stream) - after - len(rest) < 64 * 4
    # Shuffled, the same tokens in another order: every document exactly once.
    shuffled = stoker.TokenLoader("s3://data/text/part-*", tokenizer=data / "tokenizer-gpt2.json", seq_len=512,
                                  batch_size=4, shuffle=True, seed=3, output="numpy")
    assert sum(b["input_ids"].size for b in shuffled) == len(got)
    assert shuffled.stats()["documents"] == 40
    with pytest.raises(stoker.StokerError, match="s3://data/text/nothing.jsonl"):
        stoker.TokenLoader("s3://data/text/nothing.jsonl", tokenizer=data / "tokenizer-gpt2.json")


@pytest.mark.wheel
def test_image_text_pairs_in_object_storage_equal_the_local_pairs(s3, tmp_path):
    """PairLoader over S3 shards: the captions are read with the images (a ranged read each,
    header-checked), and batches equal those of the same shards on disk."""
    root = pathlib.Path(__file__).resolve().parents[2]
    pairs = tmp_path / "pairs"
    subprocess.run([sys.executable, str(root / "scripts" / "make-pairs.py"), str(pairs), "--shards", "2",
                    "--per-shard", "10"], check=True, capture_output=True)
    for p in sorted(pairs.glob("*.tar*")):
        s3["client"].upload_file(str(p), "data", f"pairs/{p.name}")
    kw = dict(tokenizer=root / "tests" / "data" / "text" / "tokenizer-clip.json", preset="imagenet-val",
              dtype="uint8", output="numpy", seed=1)

    def run(glob, **more):
        loader = stoker.PairLoader(glob, 4, **kw, **more)
        return loader, [(b["keys"], b["images"].copy(), b["input_ids"].copy()) for b in loader]

    # shuffle=True over object storage: a shard-window order (4 parts a window).
    _, local = run(str(pairs / "*.tar"), shuffle="shards", shard_window=4)
    loader, remote = run("s3://data/pairs/*.tar", shuffle=True)
    assert len(remote) == len(local) >= 3
    for (ka, a, ia), (kb, b, ib) in zip(local, remote, strict=True):
        assert ka == kb
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ia, ib)
    assert any("no caption" in s["reason"] for s in loader.report()["skipped"])
