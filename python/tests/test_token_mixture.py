"""Token mixtures, row by row: each source's rows are its own loader's rows in order, shares exact
at every prefix, a tiny source repeats with fresh passes, resume at every batch, and a state of
another mixture refused."""

import json
from pathlib import Path

import numpy as np
import pytest
import stoker
from stoker.text import TokenMixture

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
GPT2 = str(DATA / "tokenizer-gpt2.json")
AA = str(DATA / "wiki-sample.jsonl.zst")  # 60 Wikipedia articles
ARGS = dict(tokenizer=GPT2, seq_len=64, batch_size=4, shuffle=True, seed=1, threads=2, output="numpy")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Three short documents: a source that runs out many times in one epoch."""
    path = tmp_path_factory.mktemp("tiny") / "tiny.jsonl"
    docs = ["The cat sat on the mat. " * 6, "A quick brown fox jumps over the lazy dog. " * 5, "Hello world! " * 9]
    path.write_text("".join(json.dumps({"body": d}) + "\n" for d in docs))
    return str(path)


def mixture(tiny, weights=(0.75, 0.25), epoch_items=48, **kw):
    sources = {"wiki": (AA, weights[0]), "tiny": {"data": tiny, "weight": weights[1], "text_key": "body"}}
    return stoker.TokenLoader(sources, epoch_items=epoch_items, **ARGS, **kw)


def rows_of(batches):
    """Each row as (source, input_ids, labels, position_ids, segment lengths)."""
    out = []
    for b in batches:
        cu = b["cu_seqlens"]
        for r in range(len(b["input_ids"])):
            ends = cu[(cu > r * 64) & (cu <= (r + 1) * 64)] - r * 64
            segs = np.diff(np.concatenate([[0], ends])).tolist()
            src = int(b["sources"][r]) if "sources" in b else 0
            out.append((src, b["input_ids"][r].tolist(), b["labels"][r].tolist(), b["position_ids"][r].tolist(), segs))
    return out


def test_each_sources_rows_are_its_own_loaders_in_order_with_exact_shares(tiny):
    loader = mixture(tiny)
    assert loader.sources == ["wiki", "tiny"] and len(loader) == 12
    got = rows_of(loader)
    assert len(got) == 48
    counts = np.zeros(2)
    for n, row in enumerate(got, 1):
        counts[row[0]] += 1
        assert abs(counts[1] - 0.25 * n) < 1, (n, counts)
    wiki = rows_of(stoker.TokenLoader(AA, **ARGS))[:36]
    assert [r[1:] for r in got if r[0] == 0] == [r[1:] for r in wiki]
    # The tiny source (three documents) goes on into its next passes: the same rows as its own
    # loader run on through epochs (infinite).
    own = stoker.TokenLoader(tiny, text_key="body", infinite=True, **ARGS)
    it = iter(own)
    tiny_rows = rows_of([next(it) for _ in range(3)])[:12]
    it.close()
    assert [r[1:] for r in got if r[0] == 1] == [r[1:] for r in tiny_rows]
    report = loader.report()
    assert [s["items"] for s in report["mixture"]["sources"]] == [36, 12] and report["samples"] == 48
    assert [s["name"] for s in report["stages"][:2]] == ["source wiki", "source tiny"]
    assert report["bottleneck"]["stage"] in ("consumer", "source wiki", "source tiny")
    assert "source tiny: 12 rows (25.0%, share 25.0%)" in loader.report_text()
    assert loader.stats()["tiny"]["rows"] >= 12


def test_a_mixture_is_a_token_loader_of_its_own_class(tiny):
    """``TokenLoader(data={...})`` makes a ``TokenMixture``: still a ``TokenLoader``, with the
    mixture's answers where they differ (length, sources, no trace)."""
    mix, one = mixture(tiny), stoker.TokenLoader(AA, **ARGS)
    assert type(mix) is TokenMixture and isinstance(mix, stoker.TokenLoader)
    assert type(one) is stoker.TokenLoader and one.sources is None
    assert len(mix) == 48 // ARGS["batch_size"] and mix.sources == ["wiki", "tiny"] and mix.trace_path is None
    with pytest.raises(stoker.ConfigError, match="records no trace"):
        mix.save_trace()


def test_a_token_mixture_resumes_at_every_batch(tiny):
    loader = mixture(tiny, epoch_items=32)
    whole, states = [], [json.loads(json.dumps(loader.state_dict()))]
    for b in loader:
        whole += rows_of([b])
        states.append(json.loads(json.dumps(loader.state_dict())))
    again = mixture(tiny, epoch_items=32)
    for k, state in enumerate(states[:-1]):
        again.load_state_dict(state)
        assert rows_of(again) == whole[4 * k:], k


def test_a_token_mixtures_report_says_which_device_it_uses(tiny):
    # Every loader kind's report names the device asked for and the one used (compose.rs).
    for device in ("cpu", "auto"):
        loader = mixture(tiny, device=device)
        next(iter(loader))
        want = {"requested": device, "used": "cpu"}
        got = loader.report()["device"]
        assert {k: got[k] for k in want} == want, got


def test_epochs_start_new_passes_and_other_mixtures_states_are_refused(tiny):
    loader = mixture(tiny)
    first = rows_of(loader)
    loader.set_epoch(1)
    second = rows_of(loader)
    assert [r[0] for r in first] == [r[0] for r in second], "the same schedule every epoch"
    assert first != second, "each source starts a new pass"
    state = loader.state_dict()
    with pytest.raises(stoker.ConfigError, match="mixture"):
        mixture(tiny, weights=(0.5, 0.5)).load_state_dict(state)
    with pytest.raises(stoker.ConfigError, match="mixture"):
        mixture(tiny, epoch_items=96).load_state_dict(state)
    # Without its fingerprint a state says nothing of its mixture: refused, not taken as this one's.
    bare = {k: v for k, v in state.items() if k != "fingerprint"}
    with pytest.raises(stoker.ConfigError, match=r"state`: has no 'fingerprint'"):
        mixture(tiny, weights=(0.5, 0.5)).load_state_dict(bare)


def test_bad_token_mixtures_are_named(tiny):
    with pytest.raises(stoker.ConfigError, match="epoch_items"):
        stoker.TokenLoader({"a": (AA, 1)}, **ARGS)
    with pytest.raises(stoker.ConfigError, match="`infinite`"):
        stoker.TokenLoader({"a": (AA, 1)}, epoch_items=8, infinite=True, **ARGS)
    with pytest.raises(stoker.ConfigError, match="`trace`"):
        stoker.TokenLoader({"a": (AA, 1)}, epoch_items=8, trace=str(Path(tiny).with_name("t.json")), **ARGS)
    loader = stoker.TokenLoader({"a": (AA, 1), "b": {"data": tiny, "weight": 1, "text_key": "body"}}, epoch_items=8,
                                **ARGS)
    assert loader.trace_path is None and loader.documents == 60 + 3
    with pytest.raises(stoker.ConfigError, match="mixture source 'a'"):
        stoker.TokenLoader({"a": (str(Path(tiny).with_name("missing.jsonl")), 1)}, epoch_items=8, **ARGS)


def token_file(path, first, n, every):
    """A nanoGPT-style ``.bin`` (uint16) of `n` distinct ids from `first`, a document ending (EOS
    0) after every `every` ids: every id appears once, so a row delivered twice shows."""
    ids = []
    for k, t in enumerate(range(first, first + n)):
        ids.append(t)
        if k % every == every - 1:
            ids.append(0)
    np.array(ids, dtype=np.uint16).tofile(path)
    return str(path)


def test_a_token_mixture_continues_from_four_ranks_on_three_without_a_row_twice(tmp_path):
    a = token_file(tmp_path / "a.bin", 1, 12000, 37)
    b = token_file(tmp_path / "b.bin", 30000, 8000, 53)

    def ranks(world, rank):
        return stoker.TokenLoader({"a": (a, 0.6), "b": (b, 0.4)}, token_bytes=2, eos_id=0, seq_len=32, batch_size=4,
                                  shuffle=True, seed=2, rank=rank, world_size=world, threads=1, output="numpy",
                                  epoch_items=240)

    rows = [0, 0]

    def ids(batch, when):
        rows[when] += len(batch["input_ids"])
        x = batch["input_ids"]
        return [(int(s), int(t)) for s, row in zip(batch["sources"], x) for t in row if t != 0]

    before, states = [], []
    for r in range(4):
        loader = ranks(4, r)
        assert len(loader) == 15
        it = iter(loader)
        for _ in range(5):
            before += ids(next(it), 0)
        it.close()
        states.append(json.loads(json.dumps(loader.state_dict())))
    after, lens = [], set()
    for r in range(3):
        loader = ranks(3, r)
        loader.load_state_dict(states)
        lens.add(len(loader))
        after += [t for batch in loader for t in ids(batch, 1)]
    # 4 ranks x 5 batches x 4 rows = 80 rows delivered; the other 160 rows of the epoch go to 3 ranks
    # (53 each: 13 full batches and one of 1 row), a continued epoch of 14 batches.
    assert lens == {14} and rows == [80, 159]
    tokens = [t for _, t in before + after]
    assert len(tokens) == len(set(tokens)), "no token (no row) delivered twice"
    assert all((t < 30000) == (s == 0) for s, t in before + after), "each row's source is its ids' file"
    # The states of the three continue the run again exactly: the third rank resumed alone.
    with pytest.raises(stoker.ConfigError, match="same batch"):
        ranks(3, 0).load_state_dict([states[0], {**states[1], "next_batch": 4}] + states[2:])


def test_a_token_mixture_is_the_same_whatever_the_thread_count(tiny):
    one, four = ({**ARGS, "threads": n} for n in (1, 4))
    sources = {"wiki": (AA, 0.75), "tiny": {"data": tiny, "weight": 0.25, "text_key": "body"}}
    assert rows_of(stoker.TokenLoader(sources, epoch_items=48, **one)) == rows_of(
        stoker.TokenLoader(sources, epoch_items=48, **four))


def test_a_stop_source_ends_the_epoch_after_its_one_pass(tiny, tmp_path):
    """exhausted='stop': the small source is read once per epoch; the epoch ends at the row the
    schedule asks of it after its pass ran out, so it delivered exactly its own loader's rows of
    one pass, and the wiki source its share up to there; a new epoch starts both afresh."""
    small = tmp_path / "small.jsonl"
    small.write_text(Path(tiny).read_text() * 8)  # 24 short documents
    small = str(small)
    sources = {"wiki": (AA, 0.75), "small": {"data": small, "weight": 0.25, "text_key": "body", "exhausted": "stop"}}
    loader = stoker.TokenLoader(sources, **ARGS)
    with pytest.raises(TypeError):
        len(loader)
    alone = rows_of(stoker.TokenLoader(small, text_key="body", **ARGS))
    first = rows_of(loader)
    tiny_rows = [r[1:] for r in first if r[0] == 1]
    assert tiny_rows == [r[1:] for r in alone] and len(tiny_rows) >= 3
    # The last row is wiki's or tiny's last; the shares held at every prefix until then.
    counts = np.cumsum([[r[0] == 0, r[0] == 1] for r in first], axis=0)
    n = np.arange(1, len(first) + 1)
    assert np.all(np.abs(counts[:, 1] - n / 4) < 1)
    loader.set_epoch(1)
    again = rows_of(loader)
    assert len([r for r in again if r[0] == 1]) == len(alone)
    # A bound given too: the epoch ends at epoch_items rows when that comes first.
    short = stoker.TokenLoader(sources, epoch_items=8, **ARGS)
    assert len(rows_of(short)) == 8
    # Resume inside the epoch continues it exactly.
    resumed = stoker.TokenLoader(sources, **ARGS)
    it = iter(resumed)
    next(it)
    state = json.loads(json.dumps(resumed.state_dict()))
    it.close()
    other = stoker.TokenLoader(sources, **ARGS)
    other.load_state_dict(state)
    assert rows_of(other) == first[4:]


GLOO_SCRIPT = r"""
import json, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import stoker
from stoker.text import TokenMixture

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
wiki, small, gpt2, out = sys.argv[1:5]
sources = {"wiki": (wiki, 0.75), "small": {"data": small, "weight": 0.25, "text_key": "body", "exhausted": "stop"}}
loader = stoker.TokenLoader(sources, tokenizer=gpt2, seq_len=64, batch_size=4, shuffle=True, seed=1, threads=1,
                            output="torch")
assert (loader.rank, loader.world_size) == (rank, world)
rows, steps = [], 0
for batch in loader:
    flag = torch.ones(1)
    dist.all_reduce(flag)  # DDP's gradient all-reduce: unequal step counts would hang here
    rows += [(int(s), r.tolist()) for s, r in zip(batch["sources"], batch["input_ids"])]
    steps += 1
everyone = [None] * world
dist.all_gather_object(everyone, {"steps": steps, "rows": rows})
if rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
"""


def test_ranks_of_a_stop_mixture_agree_under_torch_distributed(tiny, tmp_path):
    """Two torchrun ranks (gloo) over a mixture whose small source stops it: the sources' rows
    split by document differ per rank, yet both ranks take the same steps (a collective each
    step), each its own disjoint rows, the same schedule of sources."""
    pytest.importorskip("torch")
    from test_tokens import _torchrun

    small = tmp_path / "small.jsonl"
    small.write_text(Path(tiny).read_text() * 8)
    ranks = _torchrun(tmp_path, GLOO_SCRIPT, AA, small, GPT2)
    assert ranks[0]["steps"] == ranks[1]["steps"] > 1
    # One schedule: the same sources row for row (a last batch may end earlier on one rank).
    common = min(len(k["rows"]) for k in ranks)
    assert [s for s, _ in ranks[0]["rows"][:common]] == [s for s, _ in ranks[1]["rows"][:common]]
    wiki = [{tuple(r) for s, r in k["rows"] if s == 0} for k in ranks]
    assert not wiki[0] & wiki[1]
