"""``stoker.TokenLoader``: ids against the reference ``tokenizers`` package on real Wikipedia
text and the real GPT-2 tokenizer (tests/data/text), dict batches for torch and numpy, exact
resume through ``state_dict``, checked arguments and states, bad documents named, prompt stop."""

import json
import os
import pathlib
import threading
import time

import numpy as np
import pytest
import stoker
import zstandard
from helpers import in_fork_child, llama_shaped_tokenizer, new_stoker_threads, stoker_threads, wiki_sample_texts
from tokenizers import Tokenizer

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
GPT2 = DATA / "tokenizer-gpt2.json"
SAMPLE = DATA / "wiki-sample.jsonl.zst"
EOS = 50256


@pytest.fixture(scope="module")
def texts():
    return wiki_sample_texts()


@pytest.fixture(scope="module")
def reference(texts):
    """The reference tokenizer's ids of every document, EOS after each."""
    tok = Tokenizer.from_file(str(GPT2))
    return [enc.ids + [EOS] for enc in tok.encode_batch(texts)]


@pytest.mark.wheel
def test_ids_labels_and_positions_match_the_reference(reference):
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=512, batch_size=4, threads=2, output="numpy")
    assert loader.documents == len(reference) == 60
    rows, labels, positions = [], [], []
    for b in loader:
        assert b["input_ids"].dtype == np.int32 and b["input_ids"].shape[1] == 512
        rows.append(b["input_ids"].copy())
        labels.append(b["labels"].copy())
        positions.append(b["position_ids"].copy())
        cu = b["cu_seqlens"]
        assert cu[0] == 0 and cu[-1] == b["input_ids"].size and np.all(np.diff(cu) > 0)
        assert b["max_seqlen"] == int(np.diff(cu).max())
    got = np.concatenate(rows).reshape(-1)
    stream = np.concatenate([np.array(r, dtype=np.int64) for r in reference])
    assert len(stream) - len(got) < 512, "only the epoch's tail is dropped"
    np.testing.assert_array_equal(got, stream[: len(got)])
    ends = np.cumsum([len(r) for r in reference])  # index after each document's last token
    want = stream[1 : len(got) + 1].copy()
    want[np.isin(np.arange(1, len(got) + 1), ends)] = -100
    np.testing.assert_array_equal(np.concatenate(labels).reshape(-1), want)
    pos = np.concatenate(positions).reshape(-1)
    starts = np.zeros(len(got), dtype=bool)
    starts[::512] = True
    starts[ends[ends < len(got)]] = True
    np.testing.assert_array_equal(pos == 0, starts)
    stats = loader.stats()
    assert stats["documents"] == 60 and stats["failed_documents"] == 0 and stats["tokens"] == len(got)
    report = loader.report()
    assert report["tokens"] == len(got) and report["wall_seconds"] > 0
    assert report["bottleneck"]["stage"] in {"consumer", "read", "tokenize", "pack", "handover"}
    assert report["bottleneck"]["suggestion"] and "the consumer waited" in report["bottleneck"]["reason"]
    assert report["tokenizer"]["engine"] == "stoker byte-level BPE", report["tokenizer"]
    assert stoker.TokenLoader(SAMPLE, tokenizer=GPT2).report()["bottleneck"] is None, "no iteration yet"
    assert stats["dropped_tokens"] == len(stream) - len(got)


@pytest.fixture(scope="module")
def trained(texts, tmp_path_factory):
    """Tokenizers of the kinds stoker's own BPE does not take, trained on the sample: Llama 2's
    shape (BPE with byte fallback, a ``Prepend``/``Replace`` normalizer, ``<s>`` before each
    text), BERT's WordPiece (``[CLS]``/``[SEP]`` around it) and a SentencePiece Unigram."""
    from tokenizers import BertWordPieceTokenizer, SentencePieceUnigramTokenizer

    root = tmp_path_factory.mktemp("trained")
    (root / "llama.json").write_text(llama_shaped_tokenizer(texts))
    wordpiece = BertWordPieceTokenizer(lowercase=True)
    wordpiece.train_from_iterator(texts, vocab_size=3000)
    wordpiece.save(str(root / "wordpiece.json"))
    unigram = SentencePieceUnigramTokenizer()
    unigram.train_from_iterator(texts, vocab_size=3000, special_tokens=["<unk>", "</s>"], unk_token="<unk>")
    unigram.save(str(root / "unigram.json"))
    return {"llama": (root / "llama.json", "</s>"), "wordpiece": (root / "wordpiece.json", "[SEP]"),
            "unigram": (root / "unigram.json", "</s>")}


@pytest.mark.parametrize("kind", ["llama", "wordpiece", "unigram"])
def test_tokenizers_1_0_files_give_the_reference_ids(texts, trained, kind):
    """The kinds stoker's own BPE does not take run on `tokenizers` 1.0, admitted per file
    (tokens::tokenizer_v1), with the ids of the Python package (0.23) on every document."""
    path, eos_name = trained[kind]
    tok = Tokenizer.from_file(str(path))
    eos = tok.token_to_id(eos_name)
    stream = np.concatenate([np.array(e.ids + [eos], dtype=np.int64) for e in tok.encode_batch(texts)])
    loader = stoker.TokenLoader(SAMPLE, tokenizer=path, seq_len=256, batch_size=4, threads=2, output="numpy")
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    assert len(stream) - len(got) < 4 * 256
    np.testing.assert_array_equal(got, stream[: len(got)])
    assert loader.report()["tokenizer"]["engine"] == "tokenizers 1.0", loader.report()["tokenizer"]


def test_a_tokenizer_object_and_bos(reference):
    tok = Tokenizer.from_file(str(GPT2))
    loader = stoker.TokenLoader(SAMPLE, tokenizer=tok, seq_len=4096, batch_size=2, pack="best_fit", add_bos=True,
                                bos_token="<|endoftext|>", output="numpy")
    assert loader.special_ids() == {"bos": EOS, "eos": EOS, "pad": EOS}
    labeled = starts = 0
    for b in loader:
        ids, pos, lab = b["input_ids"], b["position_ids"], b["labels"]
        labeled += int((lab != -100).sum())
        # Segments that start with BOS and predict something: each document's first piece (a
        # padding segment starts with the pad id, EOS here, but predicts nothing).
        starts += int(((pos == 0) & (ids == EOS) & (lab != -100)).sum())
    assert starts == len(reference)
    # Every token has a label but each document's last (a split document's pieces carry on).
    assert labeled == sum(len(r) + 1 for r in reference) - len(reference)
    stats = loader.stats()
    assert stats["padding_tokens"] > 0 and stats["split_documents"] > 0


def test_torch_batches_and_a_training_step(reference):
    torch = pytest.importorskip("torch")
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256, batch_size=4, shuffle=True, seed=3,
                                output="torch")
    b = next(iter(loader))
    assert isinstance(b["input_ids"], torch.Tensor) and b["input_ids"].dtype == torch.int32
    emb = torch.nn.Embedding(50257, 8)
    head = torch.nn.Linear(8, 50257)
    logits = head(emb(b["input_ids"].long()))
    loss = torch.nn.functional.cross_entropy(logits.view(-1, 50257), b["labels"].long().view(-1), ignore_index=-100)
    loss.backward()
    assert torch.isfinite(loss)


def test_state_dict_resumes_bit_for_bit():
    def make():
        return stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=1024, batch_size=2, shuffle=True, seed=7,
                                  pack="best_fit", pack_window=8, threads=2, output="numpy")

    loader = make()
    loader.set_epoch(2)
    it = iter(loader)
    first = [next(it)["input_ids"].copy() for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    rest = [b["input_ids"].copy() for b in it]
    again = make()
    again.load_state_dict(state)
    resumed = [b["input_ids"].copy() for b in again]
    assert len(first) == 5 and len(resumed) == len(rest) > 3
    for a, b in zip(resumed, rest):
        np.testing.assert_array_equal(a, b)


def test_elastic_resume_from_two_ranks_to_three(reference):
    from collections import Counter

    def make(rank, world):
        loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256, batch_size=2, shuffle=True, seed=1,
                                    shuffle_window=8, rank=rank, world_size=world, output="numpy")
        loader.set_epoch(1)
        return loader

    seen = Counter()
    states = []
    for rank, steps in ((0, 3), (1, 11)):
        loader = make(rank, 2)
        it = iter(loader)
        for _ in range(steps):
            seen.update(next(it)["input_ids"].reshape(-1).tolist())
        it.close()
        states.append(json.loads(json.dumps(loader.state_dict())))
    for rank in range(3):
        loader = make(rank, 3)
        loader.load_state_dict(states)
        it = iter(loader)
        first = next(it)
        seen.update(first["input_ids"].reshape(-1).tolist())
        if rank == 0:  # the new ranks' own states resume on the same ranks
            again = make(0, 3)
            again.load_state_dict(loader.state_dict())
            np.testing.assert_array_equal(next(iter(again))["input_ids"], next(it)["input_ids"])
            loader.load_state_dict(states)
            it = iter(loader)
            next(it)
        for b in it:
            seen.update(b["input_ids"].reshape(-1).tolist())
    everything = Counter(t for r in reference for t in r)
    assert not seen - everything, "no token delivered more often than the documents hold it"
    missing = sum((everything - seen).values())
    assert missing < 3 * 256, "only the new ranks' tails are dropped"
    with pytest.raises(stoker.ConfigError, match="no state of rank 1 of the saved run's 2 ranks"):
        make(0, 3).load_state_dict(states[:1])


@pytest.mark.parametrize("pack", ["concat", "best_fit"])
def test_elastic_resumes_chain_two_to_three_to_two_ranks(reference, pack):
    from collections import Counter

    def make(rank, world):
        loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256, batch_size=2, shuffle=True, seed=4,
                                    pack=pack, pack_window=8, rank=rank, world_size=world, output="numpy")
        loader.set_epoch(2)
        return loader

    def take(loader, steps, seen, states, rank):
        it = iter(loader)
        for _ in range(steps):
            seen.update(next(it)["input_ids"].reshape(-1).tolist())
        it.close()
        states.append(json.loads(json.dumps(loader.state_dict())))  # through JSON, as a checkpoint

    seen, first, second = Counter(), [], []
    for rank in range(2):
        take(make(rank, 2), 2 + 5 * rank, seen, first, rank)
    for rank in range(3):
        loader = make(rank, 3)
        loader.load_state_dict(first)
        take(loader, 1 + 2 * rank, seen, second, rank)
    assert all("elastic" in st for st in second)
    for rank in range(2):
        loader = make(rank, 2)
        loader.load_state_dict(second)
        for b in loader:
            seen.update(b["input_ids"].reshape(-1).tolist())
    del seen[EOS]  # EOS ends every document, and pads best-fit rows
    everything = Counter(t for r in reference for t in r if t != EOS)
    assert not seen - everything, "no token delivered more often than the documents hold it"
    missing = sum((everything - seen).values())
    if pack == "best_fit":
        assert missing == 0, f"every token exactly once ({missing} missing)"
    else:
        assert missing < 2 * 256, f"only the new ranks' tails are dropped ({missing} missing)"


def test_arguments_and_states_are_checked(tmp_path):
    with pytest.raises(stoker.ConfigError, match="`pack`: expected 'concat' or 'best_fit'"):
        stoker.TokenLoader(SAMPLE, tokenizer=GPT2, pack="greedy")
    with pytest.raises(stoker.ConfigError, match="`seq_len`"):
        stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=0)
    with pytest.raises(stoker.ConfigError, match="`tokenizer`: text needs a tokenizer"):
        stoker.TokenLoader(SAMPLE)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": 3}}')
    with pytest.raises(stoker.ConfigError, match=f"`tokenizer`: {bad}: not a valid tokenizer.json"):
        stoker.TokenLoader(SAMPLE, tokenizer=bad)
    with pytest.raises(stoker.ConfigError, match="`eos_token`"):
        stoker.TokenLoader(SAMPLE, tokenizer=GPT2, eos_token="</s>")
    with pytest.raises(stoker.ConfigError, match="unknown format"):
        stoker.TokenLoader(DATA / "README.md", tokenizer=GPT2)
    with pytest.raises(stoker.ConfigError, match="`bogus`: unknown argument"):
        stoker._stoker.TokenLoader([str(SAMPLE)], json.dumps({"tokenizer": str(GPT2), "bogus": 1}))
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=128)
    state = loader.state_dict()
    other = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256)
    with pytest.raises(stoker.ConfigError, match=r"state\['fingerprint'\]\['seq_len'\]"):
        other.load_state_dict(state)
    with pytest.raises(stoker.ConfigError, match=r"state\['cursor'\]"):
        loader.load_state_dict({**state, "cursor": -1})


def test_bad_documents_are_skipped_counted_or_raised(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_bytes(b'{"text": "fine"}\n{"text": "broken\n{"id": 1}\n{"text": "\xff"}\n{"text": "also fine"}\n')
    loader = stoker.TokenLoader(p, tokenizer=GPT2, seq_len=2, batch_size=1, output="numpy")
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    tok = Tokenizer.from_file(str(GPT2))
    want = tok.encode("fine").ids + [EOS] + tok.encode("also fine").ids + [EOS]
    np.testing.assert_array_equal(got, want[: len(got)])
    assert loader.stats()["failed_documents"] == 3
    strict = stoker.TokenLoader(p, tokenizer=GPT2, seq_len=2, batch_size=1, on_bad_document="raise")
    with pytest.raises(stoker.DecodeError, match=r"bad\.jsonl: line 2: not a JSON object"):
        list(strict)


def test_stoker_tokenize_writes_a_cache_the_loader_reads(tmp_path):
    out = tmp_path / "cache"
    rc = stoker._stoker.cli_main(["stoker", "tokenize", str(SAMPLE), "--tokenizer", str(GPT2), str(out)])
    assert rc == 0
    meta = json.loads((out / "stoker-tokens.json").read_text())
    assert meta["documents"] == 60 and meta["failed"] == 0 and meta["token_bytes"] == 2
    kw = dict(seq_len=512, batch_size=4, output="numpy")
    from_text = [b["input_ids"].copy() for b in stoker.TokenLoader(SAMPLE, tokenizer=GPT2, **kw)]
    cached = stoker.TokenLoader(out, **kw)
    assert len(cached) == len(from_text)
    for a, b in zip(from_text, cached):
        np.testing.assert_array_equal(a, b["input_ids"])
    # Writing into a folder that holds something is refused; nothing is overwritten.
    assert stoker._stoker.cli_main(["stoker", "tokenize", str(SAMPLE), "--tokenizer", str(GPT2), str(out)]) == 1


@pytest.mark.wheel
def test_parquet_written_by_pyarrow(tmp_path, texts, reference):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(len(texts))), "content": texts})
    pq.write_table(table, tmp_path / "wiki.parquet", row_group_size=7, compression="snappy")
    loader = stoker.TokenLoader(tmp_path / "wiki.parquet", tokenizer=GPT2, text_key="content", seq_len=512,
                                batch_size=4, output="numpy")
    assert loader.documents == 60
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    stream = np.concatenate([np.array(r, dtype=np.int64) for r in reference])
    np.testing.assert_array_equal(got, stream[: len(got)])
    with pytest.raises(stoker.DecodeError, match="no column `text`"):
        list(stoker.TokenLoader(tmp_path / "wiki.parquet", tokenizer=GPT2, on_bad_document="raise"))


def test_token_files_and_folders(tmp_path, reference):
    flat = np.concatenate([np.array(r, dtype=np.uint16) for r in reference[:10]])
    flat.tofile(tmp_path / "train.bin")
    np.save(tmp_path / "more.npy", flat.astype(np.uint32))
    loader = stoker.TokenLoader(tmp_path, seq_len=1000, batch_size=3, eos_id=EOS, output="numpy")
    assert loader.documents == 20
    with pytest.raises(TypeError, match="no length"):
        len(stoker.TokenLoader(SAMPLE, tokenizer=GPT2))
    assert len(loader) == sum(1 for _ in loader.batches())
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    both = np.concatenate([flat, flat]).astype(np.int64)  # more.npy before train.bin: the same tokens
    np.testing.assert_array_equal(got, both[: len(got)])
    with pytest.raises(stoker.ConfigError, match="token files are already tokenized"):
        stoker.TokenLoader(tmp_path / "train.bin", tokenizer=GPT2)


def test_webdataset_tar_shards_with_txt_or_json_members(tmp_path, texts, reference):
    import io
    import tarfile

    def member(tar, name, data):
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))

    # Two shards of .txt samples (with .json metadata beside, not documents), one gzipped, and
    # one shard of .json samples with the text under "content".
    with tarfile.open(tmp_path / "a-000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for i, t in enumerate(texts[:25]):
            member(tar, f"doc{i:04d}.txt", t.encode())
            member(tar, f"doc{i:04d}.json", json.dumps({"id": i}).encode())
    with tarfile.open(tmp_path / "a-001.tar.gz", "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for i, t in enumerate(texts[25:50], 25):
            member(tar, f"long/{'x' * 120}/doc{i:04d}.txt", t.encode())  # pax long names
    with tarfile.open(tmp_path / "a-002.tar", "w") as tar:
        for i, t in enumerate(texts[50:], 50):
            member(tar, f"doc{i:04d}.json", json.dumps({"content": t}).encode())
    loader = stoker.TokenLoader(str(tmp_path / "a-*.tar*"), tokenizer=GPT2, text_key="content", seq_len=512,
                                batch_size=4, output="numpy")
    assert loader.documents == 60
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in loader])
    stream = np.concatenate([np.array(r, dtype=np.int64) for r in reference])
    assert len(stream) - len(got) < 512
    np.testing.assert_array_equal(got, stream[: len(got)])
    # Text formats mix in one loader: the first shard, then the rest as JSON Lines and a text file.
    (tmp_path / "b-rest.jsonl").write_text("".join(json.dumps({"content": t}) + "\n" for t in texts[25:59]))
    (tmp_path / "c-last.txt").write_text(texts[59])
    mixed = stoker.TokenLoader([tmp_path / "a-000.tar", tmp_path / "b-rest.jsonl", tmp_path / "c-last.txt"],
                               tokenizer=GPT2, text_key="content", seq_len=512, batch_size=4, output="numpy")
    assert mixed.documents == 60
    got = np.concatenate([b["input_ids"].reshape(-1).copy() for b in mixed])
    np.testing.assert_array_equal(got, stream[: len(got)])
    assert len(stream) - len(got) < 512
    with pytest.raises(stoker.ConfigError, match="mixes formats"):
        stoker.TokenLoader([tmp_path / "b-rest.jsonl", tmp_path / "x.bin"], tokenizer=GPT2)
    # A member that is not UTF-8 is a counted skip naming the shard and the member.
    with tarfile.open(tmp_path / "bad.tar", "w") as tar:
        member(tar, "ok.txt", b"fine text")
        member(tar, "bad.txt", b"\xff\xfe not utf-8")
    bad = stoker.TokenLoader(tmp_path / "bad.tar", tokenizer=GPT2, seq_len=2, batch_size=1, output="numpy")
    assert sum(1 for _ in bad) > 0
    assert bad.stats()["failed_documents"] == 1
    with pytest.raises(stoker.DecodeError, match=r"bad\.tar.*member 2.*not UTF-8"):
        list(stoker.TokenLoader(tmp_path / "bad.tar", tokenizer=GPT2, seq_len=2, batch_size=1,
                                on_bad_document="raise"))


def test_document_indexes_are_stored_and_reused_until_the_file_changes(tmp_path):
    import subprocess

    store = tmp_path / "store"
    data = tmp_path / "wiki.jsonl.zst"
    data.write_bytes(SAMPLE.read_bytes())
    first = [b["input_ids"].copy() for b in stoker.TokenLoader(data, tokenizer=GPT2, seq_len=256, batch_size=2,
                                                                index_cache=store, output="numpy")]
    entries = list(store.glob("*.idx"))
    assert len(entries) == 1
    # The stored index is what a second open reads: same batches.
    again = [b["input_ids"].copy() for b in stoker.TokenLoader(data, tokenizer=GPT2, seq_len=256, batch_size=2,
                                                                index_cache=str(store), output="numpy")]
    assert all(np.array_equal(a, b) for a, b in zip(first, again)) and len(first) == len(again)
    # A rewritten file is indexed again (the old entry describes another file): 30 documents.
    raw = zstandard.ZstdDecompressor().stream_reader(SAMPLE.open("rb")).read()
    data.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(raw.splitlines()[:30])))
    assert stoker.TokenLoader(data, tokenizer=GPT2, index_cache=store).documents == 30
    assert stoker.TokenLoader(data, tokenizer=GPT2, index_cache=store).documents == 30
    # index_cache=False stores nothing; a bad value is named.
    stoker.TokenLoader(data, tokenizer=GPT2, index_cache=False)
    assert len(list(store.glob("*.idx"))) == 1
    with pytest.raises(stoker.ConfigError, match="index_cache"):
        stoker.TokenLoader(data, tokenizer=GPT2, index_cache=3)
    # `stoker cache indexes` lists and clears them.
    cli = pathlib.Path(__file__).resolve().parents[2] / "target" / "release" / "stoker"
    if cli.exists():
        out = subprocess.run([str(cli), "cache", "indexes", "--dir", str(store)], capture_output=True, text=True,
                             check=True).stdout
        assert "1 index(es)" in out and "fresh" in out and str(data) in out, out
        data.unlink()
        out = subprocess.run([str(cli), "cache", "indexes", "--dir", str(store), "--clear", "--stale"],
                             capture_output=True, text=True, check=True).stdout
        assert "removed 1 index(es)" in out, out
        assert not list(store.glob("*.idx"))


def test_a_trace_of_reading_tokenizing_packing_and_waiting(tmp_path, reference):
    path = tmp_path / "trace.json"
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=512, batch_size=4, threads=2, trace=path,
                                output="numpy")
    assert loader.trace_path == str(path)
    batches = sum(1 for _ in loader)
    doc = json.loads(path.read_text())  # written when the pass completed
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    evs = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    reads = [e for e in evs if e["name"] == "read"]
    assert sorted(e["args"]["document"] for e in reads) == list(range(60))
    chunks = [e for e in evs if e["name"] == "tokenize"]
    assert sum(e["args"]["documents"] for e in chunks) == 60
    assert sum(e["args"]["tokens"] for e in chunks) == sum(len(r) for r in reference)
    assert {threads[e["tid"]] for e in chunks} <= {"stoker-tokenize-0", "stoker-tokenize-1"}
    assert [e["args"]["batch"] for e in evs if e["name"] == "pack"] == list(range(batches))
    # The consumer's side is the shell's, as for every kind: a wait and a delivery per batch.
    assert [e["args"]["batch"] for e in evs if e["name"] == "deliver"] == list(range(batches))
    assert [e["args"]["batch"] for e in evs if e["name"] == "wait"] == list(range(batches))
    # A small ring keeps the last events; save_trace writes on demand; no trace, no file.
    small = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=512, batch_size=4, trace=tmp_path / "t2.json",
                               trace_events=10, output="numpy")
    for _ in small:
        pass
    other = json.loads(pathlib.Path(small.save_trace(tmp_path / "t3.json")).read_text())
    assert len([e for e in other["traceEvents"] if e["ph"] != "M"]) == 10
    assert other["otherData"]["dropped_events"] >= 60 + batches * 2 - 10
    with pytest.raises(stoker.ConfigError, match="tracing is off"):
        stoker.TokenLoader(SAMPLE, tokenizer=GPT2).save_trace(tmp_path / "no.json")
    with pytest.raises(stoker.ConfigError, match="folder"):
        stoker.TokenLoader(SAMPLE, tokenizer=GPT2, trace=tmp_path)


def _megatron_index(path, sizes, dtype_code, bounds):
    """A Megatron ``.idx`` as megatron.core.datasets.indexed_dataset's _IndexWriter writes it."""
    itemsize = {8: 2, 4: 4}[dtype_code]
    pointers = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * itemsize
    with open(path, "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], dtype=np.uint64).tobytes())
        f.write(bytes([dtype_code]))
        f.write(np.array([len(sizes)], dtype=np.uint64).tobytes())
        f.write(np.array([len(bounds)], dtype=np.uint64).tobytes())
        f.write(np.array(sizes, dtype=np.int32).tobytes())
        f.write(pointers.tobytes())
        f.write(np.array(bounds, dtype=np.int64).tobytes())


def test_megatron_indexed_dataset(tmp_path, reference):
    docs = reference[:12]
    for name, dtype, code in [("u16_text_document", np.uint16, 8), ("i32_text_document", np.int32, 4)]:
        np.concatenate([np.array(r, dtype=dtype) for r in docs]).tofile(tmp_path / f"{name}.bin")
        _megatron_index(tmp_path / f"{name}.idx", [len(r) for r in docs], code, list(range(len(docs) + 1)))
        # No eos_id given: the index alone gives the documents (positions restart at each).
        loader = stoker.TokenLoader(tmp_path / f"{name}.bin", seq_len=256, batch_size=2, output="numpy")
        assert loader.documents == 12
        ids, pos = [], []
        for b in loader:
            ids.append(b["input_ids"].reshape(-1).copy())
            pos.append(b["position_ids"].reshape(-1).copy())
        got, positions = np.concatenate(ids), np.concatenate(pos)
        stream = np.concatenate([np.array(r, dtype=np.int64) for r in docs])
        np.testing.assert_array_equal(got, stream[: len(got)])
        starts = np.zeros(len(got), dtype=bool)
        starts[::256] = True
        ends = np.cumsum([len(r) for r in docs])
        starts[ends[ends < len(got)]] = True
        np.testing.assert_array_equal(positions == 0, starts, err_msg=name)
    # An index that does not describe its .bin is an error naming it.
    _megatron_index(tmp_path / "u16_text_document.idx", [len(r) + 50 for r in docs], 8, list(range(13)))
    with pytest.raises(stoker.DecodeError, match="u16_text_document.bin.*truncated"):
        stoker.TokenLoader(tmp_path / "u16_text_document.bin", seq_len=64)


def test_closing_an_iteration_stops_every_thread_promptly():
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=128, batch_size=1, threads=3, prefetch=1,
                                infinite=True, output="numpy")
    before = stoker_threads()
    it = iter(loader)
    next(it)
    # Reader, 3 tokenizers, packer. A thread names itself once it first runs (a loaded machine
    # may hand over the first batch before the last tokenizer has), so its name is waited for.
    deadline = time.monotonic() + 30
    while len(stoker_threads() - before) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(stoker_threads() - before) >= 5
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 5
    assert new_stoker_threads(before) == set()
    # Infinite: goes past the end of the first epoch's documents.
    it = iter(loader)
    n = sum(1 for _, _ in zip(range(3000), it))
    assert n == 3000
    it.close()
    assert loader.state_dict()["cursor_epoch"] >= 1
    assert threading.active_count() >= 1


def _torchrun(tmp_path, script_text, *args):
    """Runs ``script_text`` on 2 local ranks under torchrun with ``args`` and an output path
    last; returns what rank 0 wrote there (JSON)."""
    import socket
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(script_text)
    out = tmp_path / "out.json"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(port), str(script), *map(str, args), str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


TORCHRUN_SCRIPT = r'''
import json, os, sys
from datetime import timedelta
import numpy as np
import torch
import torch.distributed as dist
import stoker

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
loader = stoker.TokenLoader(sys.argv[1], seq_len=96, batch_size=3, eos_id=50256, shuffle=True, seed=4,
                            pack="best_fit", pack_window=4, output="torch")
assert (loader.rank, loader.world_size) == (rank, world)
rows, steps = [], 0
for batch in loader:
    # A collective every step, as DDP's gradient all-reduce: unequal batch counts would hang here.
    flag = torch.ones(1)
    dist.all_reduce(flag)
    assert flag.item() == world
    rows.extend(r.tolist() for r in batch["input_ids"])
    steps += 1
everyone = [None] * world
dist.all_gather_object(everyone, {"steps": steps, "len": len(loader), "rows": rows})
if rank == 0:
    with open(sys.argv[-1], "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
'''


def test_two_ranks_under_torchrun_have_equal_batches_and_disjoint_rows(tmp_path, reference):
    pytest.importorskip("torch")

    flat = np.concatenate([np.array(r, dtype=np.uint16) for r in reference[:12]])
    flat.tofile(tmp_path / "train.bin")
    ranks = _torchrun(tmp_path, TORCHRUN_SCRIPT, tmp_path / "train.bin")
    assert ranks[0]["steps"] == ranks[1]["steps"] == ranks[0]["len"] == ranks[1]["len"] > 3
    rows0 = {tuple(row) for row in ranks[0]["rows"]}
    rows1 = {tuple(row) for row in ranks[1]["rows"]}
    assert not rows0 & rows1, "the ranks' rows are disjoint"


EVEN_SCRIPT = r'''
import json, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import stoker

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
out = {}
for even in (None, False):
    loader = stoker.TokenLoader(sys.argv[1], tokenizer=sys.argv[2], seq_len=64, batch_size=2, even_batches=even,
                                output="torch")
    steps = 0
    for batch in loader:
        if even is None:
            flag = torch.ones(1)  # DDP's gradient all-reduce: unequal counts would hang here
            dist.all_reduce(flag)
        steps += 1
    out[str(even)] = steps
everyone = [None] * world
dist.all_gather_object(everyone, out)
if rank == 0:
    with open(sys.argv[-1], "w") as f:
        json.dump(everyone, f)
dist.destroy_process_group()
'''


def test_raw_text_ranks_stop_together_under_torch_distributed(tmp_path, texts):
    """Over raw text the batch counts are known only once tokenized: the ranks agree at each
    step and stop together; without that (even_batches=False) their counts differ here."""
    pytest.importorskip("torch")

    # Round-robin sharding gives rank 0 the even documents: long ones; rank 1 short ones.
    short = "A short document, a few words long. " * 4
    lines = [json.dumps({"text": texts[i // 2] if i % 2 == 0 else short}) for i in range(40)]
    (tmp_path / "uneven.jsonl").write_text("\n".join(lines) + "\n")
    ranks = _torchrun(tmp_path, EVEN_SCRIPT, tmp_path / "uneven.jsonl", GPT2)
    assert ranks[0]["False"] > ranks[1]["False"] >= 1, ranks
    assert ranks[0]["None"] == ranks[1]["None"] == ranks[1]["False"], ranks
    with pytest.raises(stoker.ConfigError, match="even_batches"):
        iter(stoker.TokenLoader(tmp_path / "uneven.jsonl", tokenizer=GPT2, world_size=2, rank=0, even_batches=True))
    with pytest.raises(stoker.ConfigError, match="even_batches"):
        stoker.TokenLoader(tmp_path / "uneven.jsonl", tokenizer=GPT2, even_batches="yes")


def test_a_fork_child_continues_the_parents_position():
    loader = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256, batch_size=2, shuffle=True, seed=2,
                                output="numpy")
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    it.close()
    saved = loader.state_dict()
    loader.load_state_dict(saved)  # a restored position, still to be resumed: the child inherits it
    expected = [b["input_ids"].copy() for b in _fresh_resumed(saved)]
    # The child's rebuilt native loader resumes where the parent's would.
    got = in_fork_child(lambda: [b["input_ids"].tolist() for b in loader])
    assert len(got) == len(expected) > 3
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(np.array(a, dtype=np.int32), b)


def _fresh_resumed(state):
    fresh = stoker.TokenLoader(SAMPLE, tokenizer=GPT2, seq_len=256, batch_size=2, shuffle=True, seed=2,
                               output="numpy")
    fresh.load_state_dict(state)
    return fresh


def test_token_cache_is_shared_by_processes_and_cleared_by_the_cli(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "cache"
    kw = dict(tokenizer=GPT2, seq_len=256, batch_size=4, shuffle=True, seed=3, output="numpy")
    want = [b["input_ids"].copy() for b in stoker.TokenLoader(SAMPLE, **kw)]
    # Another process tokenizes the documents once and stores them.
    fill = ("import stoker, sys; l = stoker.TokenLoader(sys.argv[1], tokenizer=sys.argv[2], cache=sys.argv[3]); "
            "n = sum(1 for _ in l); print(l.report()['cache']['misses'])")
    r = subprocess.run([sys.executable, "-c", fill, str(SAMPLE), str(GPT2), str(root)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["60"], r.stderr
    # This process reads every document's tokens from the cache: the same batches, no tokenizing.
    loader = stoker.TokenLoader(SAMPLE, cache=root, **kw)
    got = [b["input_ids"].copy() for b in loader]
    assert len(got) == len(want)
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    c = loader.report()["cache"]
    assert (c["hits"], c["misses"], c["documents_cached"], c["verify_failures"]) == (60, 0, 60, 0), c
    assert 0 < c["used_bytes"] <= c["budget_bytes"]
    listed = json.loads(subprocess.run([sys.executable, "-m", "stoker.cli", "cache", "--dir", str(root), "--json"],
                                       capture_output=True, text=True, timeout=60, check=True).stdout)
    (group,) = listed["groups"]
    assert group["kind"] == "tokens" and group["in_use"] and group["samples"] == 60, group
    assert group["dir"] == c["dir"] and group["bytes"] == c["used_bytes"]
    # In use: `stoker cache clear` leaves it; once the loader is gone, it removes it.
    clear = [sys.executable, "-m", "stoker.cli", "cache", "--dir", str(root), "clear", "--all", "--json"]
    done = json.loads(subprocess.run(clear, capture_output=True, text=True, timeout=60, check=True).stdout)
    assert (len(done["removed"]), len(done["in_use"])) == (0, 1)
    del loader
    import gc

    gc.collect()
    done = json.loads(subprocess.run(clear, capture_output=True, text=True, timeout=60, check=True).stdout)
    assert (len(done["removed"]), len(done["in_use"])) == (1, 0)
    assert not pathlib.Path(c["dir"]).exists()
    with pytest.raises(stoker.ConfigError, match="cache_bytes.*needs cache"):
        stoker.TokenLoader(SAMPLE, cache_bytes="1GiB", **kw)
