"""Pinned batch digests: the exact bytes stoker delivers for fixed inputs and seeds, written down
once (the image and array digests from main at 3ddf101, the token digests from main at 4f8717d)
so that any change of layout, reliability fix or refactor that alters a single byte of a batch
fails here.

Inputs are made by stoker itself (`make_demo`, deterministic) and by NumPy's seeded generator;
the shard case packs the demo with `stoker pack`. The token cases read a JSON Lines file made
from tests/data/text/wiki-sample.jsonl.zst (each article's title and first two paragraphs) with
the GPT-2 tokenizer there, and a nanoGPT `.bin` of the same articles' ids from the reference
`tokenizers` package. To print the digests of the installed package instead of checking them:
`STOKER_PRINT_DIGESTS=1 pytest -s python/tests/test_digests.py`. Digests are SHA-256 of every
batch's images/columns and labels (for tokens: input_ids, labels, position_ids and cu_seqlens)
in delivery order."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import stoker
import zstandard
from helpers import digest

TEXT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
GPT2 = TEXT / "tokenizer-gpt2.json"
EOS = 50256

PINNED = {
    "train": "1d8c3e65f6386b8791f2f241f854ff7ec1b475152b3edff65d804a3b0fa414f5",
    "val": "2ab3344f1e520b9a667a74b740c336481031a995e616e5202aed643db7e01f74",
    "train-uint8-nhwc": "5c16cddd4418cc7a4be3757a7658fd49edf26007f16b8494174838541bb5406b",
    "val-float16": "68180204dda167c963609baae87411a8b0ae145d159134c13db42e3a02a97ba8",
    "train-rank1of2-epoch3": "9514678e87ca4b91b5911ebb23cd9d6e1d8d2ba8d3382a50f22a2326283a1447",
    "cached-train": "119b13b97ad65244239a9b07d9f88d41dbefb297d73f0cd1be3640cb1b91177d",
    "shards-train": "1d8c3e65f6386b8791f2f241f854ff7ec1b475152b3edff65d804a3b0fa414f5",
    "arrays": "c4898376b2926bad0c7b443cea057d6285fb8a81eeffce2d8c34bab5f07139c3",
    "arrays-resumed": "cb35ce843cb8a204915bad5a89dd40152390c2b0198e62a1768995a7a140bb46",
    "tokens-concat": "47e89edfae767b6453dcc30b5286fd5018b5d623aeac4e607fb9f67359b4c643",
    "tokens-best-fit": "2a0a26288efe43e4fad92d689889d9448103b6e5244b26bbe4d4d3b5fa06dae4",
    "tokens-cache": "47e89edfae767b6453dcc30b5286fd5018b5d623aeac4e607fb9f67359b4c643",
    "tokens-resumed": "a987f238263d6cebfe183ee65941b9be7ee688b49709943a38a3883e73ee5af0",
    "tokens-elastic": "9982c117c99de41ef6c705c0b669d0a3b60ae64591aa1ae50a42dfb1072b496b",
    "tokens-elastic-best-fit": "c090faccb840b02a4065c6926b8cd742a0d8446b1caab6aa9148b00a6ba9371e",
    "tokens-bin": "47e89edfae767b6453dcc30b5286fd5018b5d623aeac4e607fb9f67359b4c643",
}
TOKEN_CASES = [name for name in PINNED if name.startswith("tokens")]


@pytest.fixture(scope="module")
def shards(demo, tmp_path_factory):
    out = tmp_path_factory.mktemp("pinned-shards") / "packed"
    r = subprocess.run([sys.executable, "-m", "stoker.cli", "pack", str(demo), str(out), "--shard-size", "1MiB"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def image_case(name, demo, shards, tmp_path):
    kw = dict(batch_size=16, shuffle=True, seed=7, output="numpy", threads=2)
    if name == "train":
        return stoker.ImageLoader(demo, preset="imagenet-train", **kw)
    if name == "val":
        return stoker.ImageLoader(demo, preset="imagenet-val", **{**kw, "shuffle": False})
    if name == "train-uint8-nhwc":
        return stoker.ImageLoader(demo, preset="imagenet-train", dtype="uint8", layout="NHWC", **kw)
    if name == "val-float16":
        return stoker.ImageLoader(demo, preset="imagenet-val", dtype="float16", **kw)
    if name == "train-rank1of2-epoch3":
        loader = stoker.ImageLoader(demo, preset="imagenet-train", rank=1, world_size=2, drop_last=True, **kw)
        loader.set_epoch(3)
        return loader
    if name == "cached-train":
        return stoker.ImageLoader(demo, preset="imagenet-train", cache=tmp_path / "cache", **kw)
    if name == "shards-train":
        return stoker.ImageLoader(shards, preset="imagenet-train", **kw)
    raise AssertionError(name)


def array_case(name):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((500, 3, 7)).astype(np.float32)
    y = rng.integers(0, 1000, 500)
    loader = stoker.ArrayLoader(x, y, batch_size=48, shuffle=True, seed=5, output="numpy", threads=2)
    if name == "arrays-resumed":
        it = iter(loader)
        for _ in range(4):
            next(it)
        state = loader.state_dict()
        del it
        loader = stoker.ArrayLoader(x, y, batch_size=48, shuffle=True, seed=5, output="numpy", threads=1)
        loader.load_state_dict(state)
    return loader


@pytest.mark.parametrize("name", [name for name in PINNED if name not in TOKEN_CASES])
def test_batches_are_the_pinned_bytes(name, demo, shards, tmp_path):
    loader = array_case(name) if name.startswith("arrays") else image_case(name, demo, shards, tmp_path)
    got = digest(loader)
    if name == "cached-train":
        # The cache's second pass (pixels read from the entries) gives the same bytes.
        assert digest(loader) == got
    if name == "shards-train":
        # Shards packed from the folder give the folder's batches.
        assert got == PINNED["train"]
    if os.environ.get("STOKER_PRINT_DIGESTS"):
        print(f'\n    "{name}": "{got}",')
        return
    assert got == PINNED[name], f"{name}: batches changed"


@pytest.fixture(scope="module")
def articles():
    """The sample's 60 articles, each cut to its title and first two paragraphs (9 to 481 GPT-2
    tokens with EOS, 11,219 in all): documents shorter and longer than a row."""
    with (TEXT / "wiki-sample.jsonl.zst").open("rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f).read()
    docs = [json.loads(line) for line in raw.decode().splitlines() if line]
    return [{"id": d["id"], "text": "\n".join(d["text"].split("\n")[:4])} for d in docs]


@pytest.fixture(scope="module")
def corpus(articles, tmp_path_factory):
    """The articles as uncompressed JSON Lines (shuffled document by document)."""
    path = tmp_path_factory.mktemp("pinned-text") / "wiki.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in articles), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def token_file(articles, tmp_path_factory):
    """The articles' ids from the reference tokenizer, EOS after each, as a nanoGPT uint16 .bin."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(GPT2)).encode_batch([d["text"] for d in articles])
    path = tmp_path_factory.mktemp("pinned-tokens") / "wiki.bin"
    np.concatenate([np.array(e.ids + [EOS], dtype=np.uint16) for e in ids]).tofile(path)
    return path


def hash_tokens(h, batches, steps=None):
    """Adds `steps` batches (all when None) of `batches` to `h`; returns how many were added."""
    n = 0
    for b in batches:
        for field in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            h.update(np.ascontiguousarray(b[field]).tobytes())
        n += 1
        if n == steps:
            break
    return n


def token_digest(loader):
    h = hashlib.sha256()
    hash_tokens(h, loader)
    return h.hexdigest()


def token_loader(data, **kw):
    args = dict(tokenizer=GPT2, seq_len=128, batch_size=4, shuffle=True, seed=7, threads=2, output="numpy",
                index_cache=False)
    return stoker.TokenLoader(data, **{**args, **kw})


def elastic_digest(corpus, pack, steps, world):
    """Ranks 0 and 1 of 2 deliver `steps` batches each and save their states (through JSON, as a
    checkpoint); `world` new ranks load every state and deliver the rest of the epoch."""
    kw = dict(pack=pack, pack_window=16) if pack == "best_fit" else dict(pack=pack)

    def make(rank, world_size):
        loader = token_loader(corpus, rank=rank, world_size=world_size, **kw)
        loader.set_epoch(1)
        return loader

    h = hashlib.sha256()
    states = []
    for rank, n in enumerate(steps):
        loader = make(rank, 2)
        it = iter(loader)
        assert hash_tokens(h, it, n) == n
        it.close()
        states.append(json.loads(json.dumps(loader.state_dict())))
    for rank in range(world):
        loader = make(rank, world)
        loader.load_state_dict(states)
        assert hash_tokens(h, loader) > 0
    return h.hexdigest()


def token_case(name, corpus, token_file, tmp_path):
    if name == "tokens-concat":
        return token_digest(token_loader(corpus, pack="concat"))
    if name == "tokens-best-fit":
        return token_digest(token_loader(corpus, pack="best_fit", pack_window=16))
    if name == "tokens-cache":
        loader = token_loader(corpus, pack="concat", cache=tmp_path / "token-cache")
        first = token_digest(loader)
        assert loader.report()["cache"]["misses"] == 60
        # The second pass reads every document's ids from the cache: the same bytes.
        got = token_digest(loader)
        assert loader.report()["cache"]["hits"] == 60
        assert got == first
        return got
    if name == "tokens-resumed":
        kw = dict(pack="best_fit", pack_window=16)
        loader = token_loader(corpus, **kw)
        loader.set_epoch(1)
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = json.loads(json.dumps(loader.state_dict()))
        rest = hashlib.sha256()
        assert hash_tokens(rest, it) > 3
        resumed = token_loader(corpus, threads=1, **kw)
        resumed.load_state_dict(state)
        got = token_digest(resumed)
        # The resumed loader delivers what the first one went on to deliver.
        assert got == rest.hexdigest()
        return got
    if name == "tokens-elastic":
        return elastic_digest(corpus, "concat", steps=(2, 5), world=3)
    if name == "tokens-elastic-best-fit":
        return elastic_digest(corpus, "best_fit", steps=(3, 1), world=1)
    if name == "tokens-bin":
        return token_digest(token_loader(token_file, tokenizer=None, eos_id=EOS, pack="concat"))
    raise AssertionError(name)


@pytest.mark.parametrize("name", TOKEN_CASES)
def test_token_batches_are_the_pinned_bytes(name, corpus, token_file, tmp_path):
    got = token_case(name, corpus, token_file, tmp_path)
    if name in ("tokens-cache", "tokens-bin"):
        # Ids read from the token cache, or from a token file of the reference tokenizer's ids
        # (the same documents, so the same order), give the batches of the text.
        assert got == PINNED["tokens-concat"]
    if os.environ.get("STOKER_PRINT_DIGESTS"):
        print(f'\n    "{name}": "{got}",')
        return
    assert got == PINNED[name], f"{name}: batches changed"
