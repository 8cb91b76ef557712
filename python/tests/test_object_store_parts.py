"""Shards in object storage read in parts (issue 45): a real S3 server (moto's standalone server
on 127.0.0.1) behind the test proxy (``s3proxy.py``), which delays requests, answers some with
``503 SlowDown`` and counts every request. The shards are the 320-image demo packed into shards
of 1 MiB: each shard is one part (a part holds at most 64 MiB), so an epoch is one ranged GET per
shard this loader reads, whatever the number of samples."""

import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import stoker

boto3 = pytest.importorskip("boto3", reason="boto3/moto not installed: object-store tests skipped")
pytest.importorskip("moto.server", reason="moto[server] not installed: object-store tests skipped")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from helpers import S3_ENV, environ  # noqa: E402
from s3proxy import Proxy, start_moto  # noqa: E402

BATCH = 32


@pytest.fixture(scope="module")
def store(big_demo, tmp_path_factory):
    import subprocess

    shards = tmp_path_factory.mktemp("partshards")
    subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(big_demo), str(shards), "--shard-size", "1MiB"],
                   check=True, capture_output=True, timeout=300)
    moto, port = start_moto()
    proxy = Proxy(port).start()
    try:
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", aws_access_key_id="test",
                              aws_secret_access_key="test", region_name="us-east-1")
        client.create_bucket(Bucket="parts")
        for p in sorted(shards.iterdir()):
            client.upload_file(str(p), "parts", f"train/{p.name}")
        with environ({"AWS_ENDPOINT": proxy.endpoint, **S3_ENV}):
            yield {"proxy": proxy, "shards": shards, "tars": sorted(shards.glob("*.tar"))}
    finally:
        proxy.stop()
        moto.terminate()
        moto.wait(10)


def loader(root, **kw):
    args = dict(preset="imagenet-val", dtype="uint8", output="numpy", shuffle=True, seed=3, threads=2)
    args.update(kw)
    return stoker.ImageLoader(root, BATCH, **args)


def epoch(ld):
    """Indices and a digest of every batch."""
    out = []
    for b in ld.batches():
        out.append((list(b.indices), hash(np.from_dlpack(b.images).tobytes())))
    return out


def test_an_epoch_is_one_ranged_get_per_part_and_equals_the_local_order(store):
    proxy = store["proxy"]
    remote = loader("s3://parts/train/")
    proxy.reset_counts()
    got = epoch(remote)
    counts = proxy.counts()
    # shuffle=True over object storage: a shard-window order of 4 parts, the same batches as
    # that order over the local copy.
    assert got == epoch(loader(str(store["shards"]), shuffle="shards", shard_window=4))
    assert sorted(i for idx, _ in got for i in idx) == list(range(320))
    shards = len(store["tars"])
    assert shards >= 8
    assert counts["ranged_gets"] == counts["gets"] == shards, counts
    s = remote.report()["storage"]
    assert (s["part_requests"], s["direct_reads"], s["part_reads"]) == (shards, 0, 320), s
    assert s["part_bytes"] <= sum(p.stat().st_size for p in store["tars"])
    assert s["streamed_share"] == 1.0 and s["requests_per_sample"] == pytest.approx(shards / 320)
    # The demo packed in its folder's order is sorted by class: the report says what that does.
    assert "share a class" in s["note"] and "stoker pack --shuffle" in s["note"]
    assert "storage:" in remote.report_text()
    # The next epoch reads every part once more, no more.
    proxy.reset_counts()
    remote.set_epoch(1)
    assert sorted(i for idx, _ in epoch(remote) for i in idx) == list(range(320))
    assert proxy.counts()["gets"] == shards


def test_latency_costs_no_request_and_changes_no_batch(store):
    proxy = store["proxy"]
    plain = epoch(loader("s3://parts/train/", seed=4))
    proxy.set(delay_ms=50)
    try:
        slow = loader("s3://parts/train/", seed=4)
        proxy.reset_counts()
        assert epoch(slow) == plain
        assert proxy.counts()["gets"] == len(store["tars"])
        assert slow.report()["storage"]["latency_p50_ms"] >= 50
    finally:
        proxy.set(delay_ms=0)


def test_throttling_is_retried_counted_and_loses_nothing(store):
    proxy = store["proxy"]
    ref = epoch(loader("s3://parts/train/", seed=6))
    throttled = loader("s3://parts/train/", seed=6)
    proxy.reset_counts()
    proxy.set(error_rate=0.3)
    try:
        got = epoch(throttled)
    finally:
        proxy.set(error_rate=0.0)
    counts = proxy.counts()
    assert got == ref
    report = throttled.report()
    assert report["skipped_count"] == 0
    assert report["storage"]["throttled"] == counts["errors_injected"] > 0, (report["storage"], counts)
    assert report["storage"]["part_requests"] == len(store["tars"])


def test_four_ranks_read_their_own_bytes_equal_batches_and_disjoint_samples(store):
    world = 4
    total = sum(p.stat().st_size for p in store["tars"])
    seen, lens, fetched = [], [], []
    for rank in range(world):
        ld = loader("s3://parts/train/", rank=rank, world_size=world, drop_last=True)
        got = epoch(ld)
        lens.append(len(got))
        seen += [i for idx, _ in got for i in idx]
        s = ld.report()["storage"]
        assert s["direct_reads"] == 0, s
        fetched.append(s["part_bytes"])
    assert lens == [320 // world // BATCH] * world
    assert len(seen) == len(set(seen)) == 320 // world // BATCH * BATCH * world
    # Each rank downloads its share (its run of parts), not a slice of every part: at most 1.05x
    # its samples' bytes (each sample with its tar header and .cls member, 1.5-2 KiB).
    sizes = [m.size for t in store["tars"] for m in tarfile.open(t).getmembers() if m.name.endswith(".jpg")]
    assert len(sizes) == 320
    for rank, got in enumerate(fetched):
        mine = seen[rank * len(seen) // world:(rank + 1) * len(seen) // world]
        share = sum(sizes[i] + 2048 for i in mine)
        assert got <= 1.05 * share, (rank, got, share)
    assert sum(fetched) <= total, (fetched, total)


def test_resume_is_exact_over_object_storage(store):
    full = loader("s3://parts/train/", seed=8)
    ref = epoch(full)
    first = loader("s3://parts/train/", seed=8)
    it = first.batches()
    for _ in range(3):
        next(it)
    state = first.state_dict()
    del it
    again = loader("s3://parts/train/", seed=8)
    again.load_state_dict(state)
    assert epoch(again) == ref[3:]


def test_a_shuffled_pack_mixes_classes_within_a_window(store, big_demo, tmp_path):
    import subprocess

    out = tmp_path / "shuffled"
    subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(big_demo), str(out), "--shard-size", "1MiB",
                    "--shuffle", "--seed", "1"], check=True, capture_output=True, timeout=300)
    client = boto3.client("s3", endpoint_url=store["proxy"].endpoint, aws_access_key_id="test",
                          aws_secret_access_key="test", region_name="us-east-1")
    for p in sorted(out.iterdir()):
        client.upload_file(str(p), "parts", f"shuffled/{p.name}")
    ld = loader("s3://parts/shuffled/", preset="imagenet-val")
    labels = [np.from_dlpack(b.labels).tolist() for b in ld.batches()]
    assert ld.report()["storage"]["note"] is None
    # Every batch of the first epoch holds several classes (the demo has 7).
    assert all(len(set(b)) >= 4 for b in labels), labels


def test_a_shard_cache_serves_later_epochs_and_stoker_cache_lists_and_clears_it(store, tmp_path):
    import subprocess
    import time

    proxy = store["proxy"]
    shards = len(store["tars"])
    cache = tmp_path / "shard-cache"
    ref = loader("s3://parts/train/", seed=9)
    ref_batches = [epoch(ref)]
    ref.set_epoch(1)
    ref_batches.append(epoch(ref))
    ld = loader("s3://parts/train/", seed=9, shard_cache=cache, shard_cache_bytes="1GiB")
    proxy.reset_counts()
    assert epoch(ld) == ref_batches[0]
    assert proxy.counts()["gets"] == shards
    # The parts are stored by threads of their own: wait (bounded) until every one is.
    deadline = time.monotonic() + 60
    while ld.report()["storage"]["cache"]["stored"] < shards:
        assert time.monotonic() < deadline, ld.report()["storage"]
        time.sleep(0.05)
    proxy.reset_counts()
    ld.set_epoch(1)
    assert epoch(ld) == ref_batches[1]
    assert proxy.counts()["gets"] == 0, "a later epoch reads no byte from the store"
    s = ld.report()["storage"]
    assert s["cache_parts"] == shards and s["cache"]["hits"] == shards, s
    assert "shard cache" in ld.report_text()
    listed = subprocess.run([sys.executable, "-m", "stoker.cli", "cache", "list", "--dir", str(cache), "--json"],
                            check=True, capture_output=True, text=True, timeout=60).stdout
    assert "shard parts" in listed
    del ld
    subprocess.run([sys.executable, "-m", "stoker.cli", "cache", "clear", "--all", "--dir", str(cache)], check=True,
                   capture_output=True, timeout=60)
    assert not [p for p in cache.iterdir() if not p.name.startswith(".")]
    with pytest.raises(stoker.ConfigError, match="shard_cache"):
        loader(str(store["shards"]), shard_cache=cache)
