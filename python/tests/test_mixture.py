"""Weighted mixtures of image datasets: exact shares at every prefix, the sources' own pixels
and labels, resume at every batch, elastic 4 -> 3, and a state of another mixture refused."""

import json

import numpy as np
import pytest
import stoker

BS = 6


def mixed(demo, weights=(0.25, 0.75), exhausted="repeat", rank=0, world=1, epoch_items=72, **kw):
    return stoker.ImageLoader(
        {"a": (demo, weights[0]), "b": {"root": str(demo), "weight": weights[1], "label_offset": 7,
                                          "exhausted": exhausted}},
        BS, preset="imagenet-val", shuffle=True, seed=3, output="numpy", threads=2, rank=rank, world_size=world,
        epoch_items=epoch_items, **kw)


@pytest.fixture(scope="module")
def reference(demo):
    """Every demo image as the single-dataset loader makes it, by index, and its label."""
    loader = stoker.ImageLoader(demo, 32, preset="imagenet-val", output="numpy", threads=2)
    images, labels = zip(*[(x.copy(), y.copy()) for x, y in loader])
    return np.concatenate(images), np.concatenate(labels)


def test_a_mixture_has_exact_shares_and_each_sources_own_pixels_and_labels(demo, reference):
    loader = mixed(demo)
    assert loader.sources == ["a", "b"]
    assert len(loader) == 72 // BS
    it = loader.batches()
    indices = [list(b.indices) for b in it]
    counts = np.zeros(2)
    seen = set()
    for b, (images, labels, sources) in enumerate(loader):
        for k, (idx, s) in enumerate(zip(indices[b], sources)):
            counts[s] += 1
            n = counts.sum()
            assert abs(counts[0] - 0.25 * n) < 1 and abs(counts[1] - 0.75 * n) < 1, (b, counts)
            i = int(idx) - (0 if s == 0 else 96)
            assert (s, i) not in seen, "no sample twice in a pass of its source"
            seen.add((s, i))
            np.testing.assert_array_equal(images[k], reference[0][i])
            assert labels[k] == reference[1][i] + (0 if s == 0 else 7)
    assert counts.tolist() == [18, 54]
    report = loader.report()
    sources = report["mixture"]["sources"]
    # Over the loader's life: the raw pass that took the indices, and this one.
    assert [s["items"] for s in sources] == [36, 108] and [s["share"] for s in sources] == [0.25, 0.75]
    assert all(s["seconds_per_item"] > 0 for s in sources)
    assert "source b: 108 samples (75.0%, share 75.0%)" in loader.report_text()
    assert stoker.ImageLoader(demo, BS, preset="imagenet-val").report()["mixture"] is None


def test_the_same_batches_whatever_the_thread_count(demo):
    def run(threads):
        loader = stoker.ImageLoader({"a": (demo, 0.25), "b": {"root": str(demo), "weight": 0.75, "label_offset": 7}},
                                    BS, preset="imagenet-train", shuffle=True, seed=3, output="numpy",
                                    threads=threads, epoch_items=36)
        return [(x.tobytes(), y.tolist(), s.tolist()) for x, y, s in loader]

    assert run(1) == run(3)


def test_resume_at_every_batch_gives_the_rest_of_the_epoch(demo):
    def run(loader):
        return [(list(map(int, y)), list(map(int, s))) for _, y, s in loader]

    whole = run(mixed(demo))
    for k in range(len(whole)):
        loader = mixed(demo)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        again = mixed(demo)
        again.load_state_dict(state)
        assert run(again) == whole[k:], k


def test_a_state_of_another_mixture_is_refused_naming_it(demo):
    loader = mixed(demo)
    state = loader.state_dict()
    with pytest.raises(stoker.ConfigError, match="mixture"):
        mixed(demo, weights=(0.5, 0.5)).load_state_dict(state)
    with pytest.raises(stoker.ConfigError, match="mixture"):
        stoker.ImageLoader(demo, BS, preset="imagenet-val").load_state_dict(state)


def test_an_elastic_resume_from_four_ranks_to_three_takes_each_remaining_sample_once(demo):
    def indices(loader, n=None):
        it = iter(loader.batches())
        got = []
        for b in it:
            got += [int(i) for i in b.indices]
            if n is not None and len(got) >= n * BS:
                break
        it.close()
        return got

    before, states = [], []
    for r in range(4):
        loader = mixed(demo, rank=r, world=4, epoch_items=96)
        before += indices(loader, 2)
        states.append(loader.state_dict())
    after = []
    for r in range(3):
        loader = mixed(demo, rank=r, world=3, epoch_items=96)
        loader.load_state_dict(states)
        after += indices(loader)
    assert len(before) == 48 and len(after) == 48
    both = before + after
    assert len(set(both)) == len(both), "no sample twice"


def test_a_stop_source_ends_the_epoch_after_its_pass(demo):
    loader = mixed(demo, weights=(0.5, 0.5), exhausted="stop", epoch_items=None)
    got = [int(s) for _, _, ss in loader for s in ss]
    assert got.count(1) == 96 and abs(got.count(0) - 96) <= 1
    assert len(loader) == -(-len(got) // BS)


def test_bad_mixtures_name_the_source_and_field(demo):
    for sources, says in [
        ({"a": (demo, 0)}, "mixture source 'a': weight"),
        ({"a": {"root": str(demo), "weight": 1, "labels": 3}}, "unknown field `labels`"),
        ({"a": {"root": str(demo), "weight": 1, "exhausted": "never"}}, "repeat or stop"),
        ({"a": (demo,)}, "expected \\(root, weight\\)"),
        ({}, "has no source"),
    ]:
        with pytest.raises(stoker.ConfigError, match=says):
            stoker.ImageLoader(sources, BS, preset="imagenet-val")
    with pytest.raises(stoker.ConfigError, match="epoch_items"):
        stoker.ImageLoader(demo, BS, epoch_items=10)


def arrays(rank=0, world=1, epoch_items=300, weights=(3, 7), tmp=None, **kw):
    a = (np.arange(100, dtype=np.int64), np.arange(100, dtype=np.float32) * 2)
    b = (1000 + np.arange(50, dtype=np.int64), (1000 + np.arange(50, dtype=np.float32)) * 2)
    if tmp is not None:  # the second source's first column read from a .npy file
        np.save(tmp / "b.npy", b[0])
        b = (str(tmp / "b.npy"), b[1])
    return stoker.ArrayLoader({"a": (a, weights[0]), "b": {"arrays": b, "weight": weights[1]}}, batch_size=8,
                              shuffle=True, seed=1, rank=rank, world_size=world, output="numpy", threads=2,
                              epoch_items=epoch_items, **kw)


def test_an_array_mixture_gathers_each_sources_rows_with_exact_shares(tmp_path):
    loader = arrays(tmp=tmp_path)
    assert loader.sources == ["a", "b"] and len(loader) == 300 // 8 + 1
    counts, per_pass = np.zeros(2), {0: [], 1: []}
    for x, y, s in loader:
        np.testing.assert_array_equal(y, x * 2)
        np.testing.assert_array_equal(s, (x >= 1000).astype(np.int64))
        for v, src in zip(x, s):
            counts[src] += 1
            n = counts.sum()
            assert abs(counts[1] - 0.7 * n) < 1, counts
            per_pass[src].append(int(v))
    assert counts.tolist() == [90, 210]
    assert [s["items"] for s in loader.report()["mixture"]["sources"]] == [90, 210]
    # b (50 rows) was read 4.2 times: each full pass is a permutation, each a new one.
    passes = [per_pass[1][k:k + 50] for k in range(0, 200, 50)]
    assert all(sorted(p) == list(range(1000, 1050)) for p in passes)
    assert len({tuple(p) for p in passes}) == 4


def test_an_array_mixture_resumes_at_every_batch_and_elastically():
    whole = [x.tolist() for x, _, _ in arrays()]
    for k in range(0, len(whole), 7):
        loader = arrays()
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        again = arrays()
        again.load_state_dict(state)
        assert [x.tolist() for x, _, _ in again] == whole[k:], k
    before, states = [], []
    for r in range(4):
        loader = arrays(rank=r, world=4, epoch_items=320, drop_last=True)
        it = iter(loader)
        before += [v for _ in range(3) for v in next(it)[0].tolist()]
        it.close()
        states.append(loader.state_dict())
    after = []
    for r in range(3):
        loader = arrays(rank=r, world=3, epoch_items=320, drop_last=True)
        loader.load_state_dict(states)
        after += [v for x, _, _ in loader for v in x.tolist()]
    # 4 ranks x 3 batches x 8 = 96 taken; 224 remain: 3 ranks take 9 batches each (216).
    assert len(before) == 96 and len(after) == 216
    a_rows = [v for v in before + after if v < 1000]
    assert len(set(a_rows)) == len(a_rows), "a (100 rows) is not exhausted: no row twice"


def test_array_mixture_sources_must_match():
    x = np.zeros(4, dtype=np.int64)
    with pytest.raises(stoker.ConfigError, match="same number of arrays"):
        stoker.ArrayLoader({"a": ((x, x), 1), "b": ((x,), 1)})
    with pytest.raises(stoker.ConfigError, match="source 1: array 0 is"):
        stoker.ArrayLoader({"a": ((x,), 1), "b": ((x.astype(np.float32),), 1)})
