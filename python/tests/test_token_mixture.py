"""Token mixtures, row by row: each source's rows are its own loader's rows in order, shares exact
at every prefix, a tiny source repeats with fresh passes, resume at every batch, and a state of
another mixture refused."""

import json
from pathlib import Path

import numpy as np
import pytest
import stoker

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
    assert [s["rows"] for s in report["sources"]] == [36, 12]
    assert report["slowest"]["source"] in ("wiki", "tiny")


def test_a_token_mixture_resumes_at_every_batch(tiny):
    whole = rows_of(mixture(tiny))
    for k in range(12):
        loader = mixture(tiny)
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        it.close()
        again = mixture(tiny)
        again.load_state_dict(state)
        assert rows_of(again) == whole[4 * k:], k


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


def test_bad_token_mixtures_are_named(tiny):
    with pytest.raises(stoker.ConfigError, match="epoch_items"):
        stoker.TokenLoader({"a": (AA, 1)}, **ARGS)
    with pytest.raises(stoker.ConfigError, match="repeat"):
        stoker.TokenLoader({"a": {"data": AA, "weight": 1, "exhausted": "stop"}}, epoch_items=8, **ARGS)
    with pytest.raises(stoker.ConfigError, match="mixture source 'a'"):
        stoker.TokenLoader({"a": (str(Path(tiny).with_name("missing.jsonl")), 1)}, epoch_items=8, **ARGS)
