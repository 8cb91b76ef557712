"""Elastic resume of the image and array loaders: the states of every rank of a run saved on W
ranks continue the epoch on W' ranks, each remaining sample delivered exactly once (up to the
documented remainder), the next epoch a normal one."""

import json
from collections import Counter

import numpy as np
import pytest
import stoker
from helpers import in_fork_child

N = 1003  # rows: not a multiple of any batch count below, so every remainder rule is exercised
BS = 16
EPOCH = 2


def rows(rank, world, drop_last=False, shuffle=True, batch_size=BS):
    loader = stoker.ArrayLoader(np.arange(N), batch_size=batch_size, shuffle=shuffle, seed=7, drop_last=drop_last,
                                rank=rank, world_size=world, output="numpy", threads=1)
    loader.set_epoch(EPOCH)
    return loader


def take(loader, n):
    """Indices of the first `n` batches of a new iteration, and the loader's state after them
    (through JSON, as a checkpoint would keep it)."""
    it = iter(loader)
    got = [int(i) for _ in range(n) for i in next(it)[0]]
    it.close()
    return got, json.loads(json.dumps(loader.state_dict()))


def drain(loader):
    return [int(i) for (b,) in loader for i in b]


def saved_run(world, steps, drop_last=False, shuffle=True):
    """`world` ranks, rank r delivering `steps[r]` batches: (indices delivered, states)."""
    delivered, states = [], []
    for rank in range(world):
        got, state = take(rows(rank, world, drop_last, shuffle), steps[rank])
        delivered += got
        states.append(state)
    return delivered, states


def check_once(before, after, new_world, drop_last):
    """Every row of the epoch delivered once, before or after the resume, up to the remainder
    the docstring names: with drop_last the last R % (W' * BS) of the R remaining rows are not
    delivered; without it fewer than W' rows are delivered twice (padding), after the resume."""
    assert len(set(before)) == len(before), "the saved ranks delivered no row twice"
    assert not set(before) & set(after), "no row delivered before the resume is delivered again"
    remaining = N - len(before)
    counts = Counter(after)
    if drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(after) == remaining - remaining % (new_world * BS)
    else:
        assert set(before) | set(after) == set(range(N)), "every row delivered"
        extra = len(after) - remaining
        assert 0 <= extra < new_world
        assert sum(c - 1 for c in counts.values()) == extra


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(("old", "new", "steps"), [(4, 3, [5, 5, 5, 5]), (2, 5, [9, 7]), (3, 1, [4, 0, 6])])
def test_array_states_of_w_ranks_continue_on_w_prime(old, new, steps, drop_last, shuffle):
    before, states = saved_run(old, steps, drop_last, shuffle)
    assert len(before) == sum(steps) * BS
    after, lens = [], set()
    for rank in range(new):
        loader = rows(rank, new, drop_last, shuffle)
        loader.load_state_dict(list(reversed(states)))  # any order
        got = drain(loader)
        lens.add(len(loader))
        assert len(got) == len(loader) * BS or not drop_last
        after += got
        # The next epoch is a normal epoch of the new ranks.
        loader.set_epoch(EPOCH + 1)
        normal = rows(rank, new, drop_last, shuffle)
        normal.set_epoch(EPOCH + 1)
        assert len(loader) == len(normal)
        assert drain(loader) == drain(normal)
    assert len(lens) == 1, "every new rank has the same number of batches"
    check_once(before, after, new, drop_last)


def test_without_shuffle_the_remainder_keeps_dataset_order():
    # 4 ranks delivered one batch of 16 each (rank r: rows r, r + 4, ..., r + 60): rows 0..63.
    # The rest, 64..1002, is dealt to 3 ranks: rank r takes positions r, r + 3, ... of it.
    before, states = saved_run(4, [1, 1, 1, 1], shuffle=False)
    assert sorted(before) == list(range(64))
    loader = rows(1, 3, shuffle=False)
    loader.load_state_dict(states)
    got = drain(loader)
    assert got[:5] == [65, 68, 71, 74, 77]
    assert got == list(range(65, N, 3))  # 939 rows on 3 ranks: 313 each, 20 batches
    assert len(loader) == 20


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_state_inside_a_continued_epoch_resumes_it_exactly(drop_last):
    _, states = saved_run(4, [3, 3, 3, 3], drop_last)
    ref = rows(1, 3, drop_last)
    ref.load_state_dict(states)
    full = drain(ref)
    a = rows(1, 3, drop_last)
    a.load_state_dict(states)
    head, mid = take(a, 4)
    assert head == full[: len(head)]
    assert mid["version"] == 3 and mid["next_batch"] == 4 and mid["world_size"] == 3
    assert mid["elastic"] == [{"world_size": 4, "next_batch": [3, 3, 3, 3]}]
    assert mid["batches_per_epoch"] == len(a) == len(ref)
    b = rows(1, 3, drop_last)
    b.load_state_dict(mid)
    assert len(b) == len(ref)
    assert drain(b) == full[len(head):]
    # A new iteration that resumes nothing runs the whole epoch as a normal one.
    normal = rows(1, 3, drop_last)
    assert drain(b) == drain(normal)
    assert "elastic" not in b.state_dict() and b.state_dict()["version"] == 2


@pytest.mark.parametrize("drop_last", [False, True])
def test_states_of_a_continued_epoch_continue_again(drop_last):
    # 4 ranks -> 3 ranks (which save again mid-epoch) -> 2 ranks.
    before, states = saved_run(4, [4, 4, 4, 4], drop_last)
    middle = []
    for rank, steps in enumerate([3, 5, 3]):
        loader = rows(rank, 3, drop_last)
        loader.load_state_dict(states)
        got, state = take(loader, steps)
        before += got
        middle.append(state)
    assert middle[0]["elastic"] == middle[2]["elastic"]
    after = []
    for rank in range(2):
        loader = rows(rank, 2, drop_last)
        loader.load_state_dict(middle)
        after += drain(loader)
        assert len(loader.state_dict()["elastic"]) == 2
    check_once(before, after, 2, drop_last)


def test_bad_lists_are_refused_naming_the_field():
    _, states = saved_run(4, [2, 2, 2, 2])
    loader = rows(0, 3)

    def refused(lst, match):
        with pytest.raises(stoker.ConfigError, match=match):
            loader.load_state_dict(lst)

    refused([], "empty list")
    refused(states[:3], r"no state of rank 3 of the saved run's 4 ranks")
    refused(states[:3] + [states[1]], r"`state\[3\]\['fingerprint'\]\['rank'\]`: rank 1 appears twice")
    refused([states[0], 5], r"`state\[1\]`: expected a dict from state_dict\(\), got 5")
    other_epoch = dict(states[2], epoch=5)
    refused(states[:2] + [other_epoch, states[3]], r"`state\[2\]\['epoch'\]`: is 5, state\[0\] has 2")
    other_seed = dict(states[3], seed=8)
    refused(states[:3] + [other_seed], r"`state\[3\]\['seed'\]`")
    too_far = dict(states[1], next_batch=999)
    refused([states[0], too_far] + states[2:], "rank 1 of 4 delivered next_batch=999")
    # A run of another batch size (its fingerprint differs from this loader's in more than ranks).
    _, other = saved_run(2, [1, 1])
    small = rows(0, 3, batch_size=8)
    with pytest.raises(stoker.ConfigError, match=r"`state\[0\]\['fingerprint'\]\['batch_size'\]`: saved with "
                                                 r"batch_size=16, this loader has batch_size=8"):
        small.load_state_dict(other)
    # The refused lists changed nothing: the loader runs its own normal epoch.
    assert drain(loader) == drain(rows(0, 3))
    # An elastic state's fields are checked too.
    loader.load_state_dict(states)
    _, mid = take(loader, 1)
    with pytest.raises(stoker.ConfigError, match=r"`state\['elastic'\]\[0\]\['next_batch'\]`: has 3 values"):
        rows(0, 3).load_state_dict(dict(mid, elastic=[{"world_size": 4, "next_batch": [2, 2, 2]}]))
    with pytest.raises(stoker.ConfigError, match=r"`state\['version'\]`: a state with 'elastic' is version 3"):
        rows(0, 3).load_state_dict(dict(mid, version=2))
    with pytest.raises(stoker.ConfigError, match="has no 'elastic'"):
        rows(0, 3).load_state_dict({k: v for k, v in mid.items() if k != "elastic"})


def test_a_fork_child_continues_an_elastic_epoch():
    _, states = saved_run(2, [5, 5])
    loader = rows_loaded(states)
    expected = rows_loaded(states)
    n = len(expected)
    expected = drain(expected)
    # The child's rebuilt native loader has the elastic epoch still to resume.
    got, child_len = in_fork_child(lambda: [drain(loader), len(loader)])
    assert got == expected and child_len == n


def rows_loaded(states):
    loader = rows(0, 3)
    loader.load_state_dict(states)
    return loader


@pytest.mark.parametrize("drop_last", [False, True])
def test_image_loader_states_continue_on_other_ranks(demo, drop_last):
    def make(rank, world):
        loader = stoker.ImageLoader(demo, 4, preset="imagenet-val", shuffle=True, seed=5, rank=rank,
                                    world_size=world, drop_last=drop_last, output="numpy", threads=1)
        loader.set_epoch(1)
        return loader

    before, states = [], []
    for rank, steps in ((0, 3), (1, 2)):
        loader = make(rank, 2)
        it = loader.batches()
        for _ in range(steps):
            before.extend(next(it).indices)
        it.close()
        states.append(json.loads(json.dumps(loader.state_dict())))
    after = []
    for rank in range(3):
        loader = make(rank, 3)
        loader.load_state_dict(states)
        got = [i for b in loader.batches() for i in b.indices]
        assert len(loader) == -(-len(got) // 4)
        after += got
    # 96 images, 20 delivered, 76 remaining on 3 ranks of batches of 4: drop_last delivers 72
    # (6 batches each); otherwise 78 (26 each, 2 repeated).
    remaining = 96 - len(before)
    assert not set(before) & set(after) and len(set(before)) == len(before) == 20
    if drop_last:
        assert len(set(after)) == len(after) == remaining - remaining % 12 == 72
    else:
        assert set(before) | set(after) == set(range(96)) and len(after) == 78

    # A state inside the continued epoch resumes its pixels bit for bit.
    ref = make(2, 3)
    ref.load_state_dict(states)
    full = [(x.copy(), y.copy()) for x, y in ref]
    a = make(2, 3)
    a.load_state_dict(states)
    it = iter(a)
    next(it)
    next(it)
    it.close()
    mid = json.loads(json.dumps(a.state_dict()))
    b = make(2, 3)
    b.load_state_dict(mid)
    rest = [(x.copy(), y.copy()) for x, y in b]
    assert len(rest) == len(full) - 2 > 0
    for (x, y), (rx, ry) in zip(rest, full[2:], strict=True):
        np.testing.assert_array_equal(x, rx)
        np.testing.assert_array_equal(y, ry)
