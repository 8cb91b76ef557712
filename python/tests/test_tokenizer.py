"""``stoker.Tokenizer``: ids against the reference ``tokenizers`` package (0.23) on real Wikipedia
text, on each of stoker's encoders (its byte-level BPE on GPT-2's file, ``tokenizers`` 1.0 on
Llama 2's kind, the 0.22 crate on a byte-level file with a prefix space), and on thousands of
hostile strings; framing (BOS/EOS, the post-processor's tokens), thread counts, output formats,
pickling (into a ``spawn`` child too), ``fork()``, errors and Ctrl-C.

Llama 2's real file is read from the development machine's ``shared/text`` when it is there (a
clean clone skips those cases, saying so); a Llama 2-shaped tokenizer trained on the sample runs
everywhere."""

import json
import multiprocessing
import os
import pathlib
import pickle
import random
import shutil
import sys
import textwrap

import numpy as np
import pytest
import stoker
from helpers import (
    in_fork_child,
    llama_shaped_tokenizer,
    new_stoker_threads,
    run_bounded,
    stoker_threads,
    wiki_sample_texts,
)
from tokenizers import Tokenizer as Reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "text"
GPT2 = DATA / "tokenizer-gpt2.json"
SAMPLE = DATA / "wiki-sample.jsonl.zst"
SHARED_LLAMA2 = ROOT.parent / "shared" / "text" / "tokenizer-llama2.json"
EOS = 50256


@pytest.fixture(scope="module")
def texts():
    return wiki_sample_texts()


@pytest.fixture(scope="module")
def files(texts, tmp_path_factory):
    """A ``tokenizer.json`` for each of stoker's encoders: GPT-2's (stoker's byte-level BPE),
    GPT-2's with ``add_prefix_space`` (a byte-level file the fast path does not take: the
    ``tokenizers`` crate 0.22), a Llama 2-shaped BPE trained on the sample (byte fallback,
    ``Prepend``/``Replace`` normalizer, ``<s>`` before each text: ``tokenizers`` 1.0), and the real
    Llama 2 file where the machine has it."""
    root = tmp_path_factory.mktemp("tokenizers")
    spec = json.loads(GPT2.read_text())
    spec["pre_tokenizer"]["add_prefix_space"] = True
    (root / "gpt2-prefix.json").write_text(json.dumps(spec))
    (root / "llama-shaped.json").write_text(llama_shaped_tokenizer(texts))
    return {"gpt2": GPT2, "gpt2-prefix": root / "gpt2-prefix.json", "llama-shaped": root / "llama-shaped.json",
            "llama2": SHARED_LLAMA2}


ENGINES = {"gpt2": "stoker byte-level BPE", "gpt2-prefix": "tokenizers", "llama-shaped": "tokenizers 1.0",
           "llama2": "tokenizers 1.0"}


def _path(files, kind):
    path = files[kind]
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (the development machine's shared/text has it)")
    return path


def _reference_ids(path, texts, add_special_tokens=False):
    ref = Reference.from_file(str(path))
    return [e.ids for e in ref.encode_batch(texts, add_special_tokens=add_special_tokens)]


def _assert_ids(got, want, texts):
    assert len(got) == len(want) == len(texts)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == np.uint32
        if g.tolist() != w:
            pytest.fail(f"text {i} ({texts[i][:60]!r}...): stoker {g.tolist()[:20]} != tokenizers {w[:20]}")


@pytest.mark.parametrize("kind", list(ENGINES))
def test_ids_equal_tokenizers_on_wikipedia(texts, files, kind):
    path = _path(files, kind)
    tok = stoker.Tokenizer(path)
    assert tok.engine == ENGINES[kind], (tok.engine, tok.engine_reason)
    assert tok.vocab_size == Reference.from_file(str(path)).get_vocab_size(with_added_tokens=True)
    _assert_ids(tok.encode_batch(texts, threads=3), _reference_ids(path, texts), texts)
    # With the post-processor's tokens (Llama 2's `<s>`), as tokenizers' default.
    _assert_ids(tok.encode_batch(texts, add_special_tokens=True), _reference_ids(path, texts, True), texts)


@pytest.mark.parametrize("kind", ["gpt2", "llama-shaped"])
def test_bos_and_eos_frame_each_text(texts, files, kind):
    tok = stoker.Tokenizer(files[kind])
    want = _reference_ids(files[kind], texts)
    bos, eos = tok.bos_id, tok.eos_id
    assert (bos, eos) == ((EOS, EOS) if kind == "gpt2" else (1, 2))
    got = tok.encode_batch(texts, add_bos=True, add_eos=True)
    _assert_ids(got, [[bos] + w + [eos] for w in want], texts)
    _assert_ids(tok.encode_batch(texts, add_eos=True), [w + [eos] for w in want], texts)
    one = tok.encode(texts[3], add_bos=True)
    assert one.tolist() == [bos] + want[3]
    named = stoker.Tokenizer(files[kind], bos_token="<unk>" if kind != "gpt2" else "<|endoftext|>")
    assert named.bos_id == (0 if kind != "gpt2" else EOS)
    with pytest.raises(stoker.ConfigError, match=r"`eos_token`.*not a token of .*"):
        stoker.Tokenizer(files[kind], eos_token="<no such token>")


def test_a_tokenizer_without_bos_refuses_add_bos(files, tmp_path):
    spec = json.loads(GPT2.read_text())
    spec["added_tokens"] = []
    del spec["model"]["vocab"]["<|endoftext|>"]
    path = tmp_path / "no-specials.json"
    path.write_text(json.dumps(spec))
    tok = stoker.Tokenizer(path)
    assert tok.bos_id is None and tok.eos_id is None
    assert tok.encode("hi there").tolist() == Reference.from_file(str(GPT2)).encode("hi there").ids
    with pytest.raises(stoker.ConfigError, match=r"`bos_token`: the tokenizer has no known BOS token"):
        tok.encode_batch(["hi"], add_bos=True)
    with pytest.raises(stoker.ConfigError, match=r"`eos_token`"):
        tok.encode("hi", add_eos=True)


def test_thread_counts_and_formats_give_the_same_ids(texts):
    tok = stoker.Tokenizer(GPT2)
    # Many texts of every size, so that the batch is cut into many chunks.
    rng = random.Random(1)
    batch = [t[: rng.randrange(len(t) + 1)] for t in texts for _ in range(20)] + ["", " ", "\n"]
    one = tok.encode_batch(batch, threads=1, add_eos=True)
    for threads in (2, 4, 7, "auto", None):
        many = tok.encode_batch(batch, threads=threads, add_eos=True)
        assert [a.tolist() for a in many] == [a.tolist() for a in one], threads
    ids, offsets = tok.encode_batch(batch, add_eos=True, format="flat")
    assert ids.dtype == np.uint32 and offsets.dtype == np.int64 and offsets[0] == 0 and len(offsets) == len(batch) + 1
    np.testing.assert_array_equal(ids, np.concatenate(one))
    arrow = tok.encode_batch(batch, add_eos=True, format="arrow")
    import pyarrow as pa

    assert isinstance(arrow, pa.LargeListArray) and arrow.type.value_type == pa.uint32()
    assert arrow.to_pylist() == [a.tolist() for a in one]
    assert tok.encode_batch([]) == [] and len(tok.encode_batch([], format="arrow")) == 0
    assert tok.encode_batch(iter(["a b", "c"]))[1].tolist() == tok.encode("c").tolist()


def test_a_tokenizer_object_or_bytes(texts):
    ref = Reference.from_file(str(GPT2))
    want = [e.ids for e in ref.encode_batch(texts[:5], add_special_tokens=False)]
    for given, origin in [(ref, "<tokenizer object>"), (GPT2.read_bytes(), "<bytes>"),
                          (bytearray(GPT2.read_bytes()), "<bytes>"), (str(GPT2), str(GPT2))]:
        tok = stoker.Tokenizer(given)
        assert tok.origin == origin and tok.engine == "stoker byte-level BPE"
        assert [a.tolist() for a in tok.encode_batch(texts[:5])] == want
    assert "stoker byte-level BPE" in repr(tok)


def test_arguments_are_checked():
    tok = stoker.Tokenizer(GPT2)
    for kw, arg in [({"threads": 0}, "threads"), ({"threads": "many"}, "threads"), ({"add_bos": "yes"}, "add_bos"),
                    ({"add_special_tokens": 1}, "add_special_tokens"), ({"format": "torch"}, "format")]:
        with pytest.raises(stoker.ConfigError, match=rf"invalid argument `{arg}`"):
            tok.encode_batch(["a"], **kw)
    with pytest.raises(stoker.ConfigError, match=r"`texts`: expected a list of str, got a str"):
        tok.encode_batch("a text")
    with pytest.raises(TypeError):
        tok.encode_batch(["a", 3])
    with pytest.raises(stoker.ConfigError, match=r"`tokenizer`: /no/such/tokenizer.json"):
        stoker.Tokenizer("/no/such/tokenizer.json")
    with pytest.raises(stoker.ConfigError, match=r"<bytes>: not a valid tokenizer.json"):
        stoker.Tokenizer(b'{"model": 3}')
    with pytest.raises(stoker.ConfigError, match=r"`tokenizer`: expected a tokenizer.json path"):
        stoker.Tokenizer(3.5)
    with pytest.raises(stoker.ConfigError, match=r"`tokenizer`: expected a tokenizer.json path.*got None"):
        stoker.Tokenizer(None)
    with pytest.raises(stoker.ConfigError, match=r"`tokenizer`: expected the path of a tokenizer.json"):
        stoker._stoker.Tokenizer(3.5)


def test_a_text_the_tokenizer_rejects_names_the_file_and_the_text(tmp_path):
    from tokenizers import models, pre_tokenizers

    ref = Reference(models.WordLevel({"a": 0, "b": 1}, unk_token="[UNK]"))
    ref.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "wordlevel.json"
    ref.save(str(path))
    tok = stoker.Tokenizer(path)
    assert tok.encode_batch(["a b", "b"], threads=2)[0].tolist() == [0, 1]
    with pytest.raises(stoker.DecodeError, match=r"wordlevel.json: cannot encode text 1 of the batch: .*UNK"):
        tok.encode_batch(["a", "a c", "b", "zz"], threads=2)


def _rebuilt_ids(blob, texts):
    """In a child process: the unpickled tokenizer's engine and ids."""
    tok = pickle.loads(blob)
    return tok.engine, [a.tolist() for a in tok.encode_batch(texts)]


def test_pickle_carries_the_file_not_its_path(texts, files, tmp_path):
    path = tmp_path / "tokenizer.json"
    shutil.copy(files["llama-shaped"], path)
    tok = stoker.Tokenizer(path, eos_token="</s>")
    blob = pickle.dumps(tok)
    path.unlink()
    back = pickle.loads(blob)
    assert (back.engine, back.origin, back.eos_id, back.vocab_size) == (tok.engine, str(path), 2, tok.vocab_size)
    want = [a.tolist() for a in tok.encode_batch(texts[:10], add_eos=True)]
    assert [a.tolist() for a in back.encode_batch(texts[:10], add_eos=True)] == want
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        engine, got = pool.apply(_rebuilt_ids, (blob, texts[:10]))
    assert engine == tok.engine and got == [w[:-1] for w in want]
    # The native class pickles the same way.
    native = pickle.loads(pickle.dumps(tok._native))
    assert native.origin == str(path) and native.json_bytes() == files["llama-shaped"].read_bytes()


def test_no_thread_is_left_and_a_fork_child_encodes(texts, files):
    tok = stoker.Tokenizer(GPT2)
    before = stoker_threads()
    want = [a.tolist() for a in tok.encode_batch(texts, threads=4)]
    assert not new_stoker_threads(before), "a thread outlived the call"
    assert in_fork_child(lambda: [a.tolist() for a in tok.encode_batch(texts, threads=4)]) == want
    # A tokenizers-1.0 file, whose encoder keeps scratch shared between threads, too.
    llama = stoker.Tokenizer(files["llama-shaped"])
    assert llama.engine == "tokenizers 1.0"
    want = [a.tolist() for a in llama.encode_batch(texts, threads=4)]
    assert in_fork_child(lambda: [a.tolist() for a in llama.encode_batch(texts, threads=4)]) == want


def test_ctrl_c_stops_a_long_call():
    # Measured against the same call uninterrupted in the same child (a quarter of it, timed
    # first), so a loaded machine slows both alike: the Ctrl-C at 0.1 s must end the call well
    # before half of its own length.
    script = textwrap.dedent("""
        import signal, sys, threading, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, sys.argv[2])
        import stoker
        from helpers import new_stoker_threads, stoker_threads
        tok = stoker.Tokenizer(sys.argv[1])
        # ~47 MB of words, twice (~1 s on two threads of the development machine).
        words = [f"w{i} x{i * 7919 % 100003} " for i in range(800000)]
        texts = ["".join(words[j: j + 2000]) for j in range(0, len(words), 2000)] * 2
        t0 = time.monotonic()
        tok.encode_batch(texts[: len(texts) // 4], threads=2)
        whole = 4 * (time.monotonic() - t0)
        before = stoker_threads()
        threading.Timer(0.1, lambda: signal.raise_signal(signal.SIGINT)).start()
        t0 = time.monotonic()
        try:
            tok.encode_batch(texts, threads=2)
            print("completed", time.monotonic() - t0, whole)
        except KeyboardInterrupt:
            print("interrupted", time.monotonic() - t0, whole, len(new_stoker_threads(before)))
    """)
    # The subject is the interrupt, not memory: the texts and their copies take ~0.5 GiB.
    out = run_bounded([sys.executable, "-c", script, str(GPT2), str(pathlib.Path(__file__).parent)], timeout=120,
                      peak_rss=3 << 29)
    assert out.returncode == 0, out.stderr
    what, seconds, whole, *left = out.stdout.split()
    assert what == "interrupted", f"the call ended before the Ctrl-C ({seconds} s of {whole}): make the batch longer"
    assert float(seconds) < 0.1 + float(whole) / 2 and left == ["0"], out.stdout


def _hostile(rng):
    """A string of what tokenizers trip on: every Unicode plane (no surrogates), control
    characters, runs of spaces, tabs and newlines, emoji sequences, combining marks, contractions,
    digits and special tokens' text."""
    def any_char():
        while True:
            c = rng.choice([rng.randrange(0x80), rng.randrange(0x800), rng.randrange(0x10000),
                            rng.randrange(0x110000)])
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)

    pieces = [
        lambda: any_char(),
        lambda: "".join(any_char() for _ in range(rng.randrange(1, 12))),
        lambda: rng.choice([" ", "\t", "\n", "\r\n", "\u3000", "\xa0"]) * rng.randrange(1, 300),
        lambda: chr(rng.choice([*range(0x20), 0x7F, 0x85, 0x2028, 0x2029, 0x200B, 0xFEFF, 0xFFFE, 0xFFFF])),
        lambda: rng.choice(["\U0001F600", "\U0001F469\u200D\U0001F4BB", "\U0001F44D\U0001F3FD", "\u2764\uFE0F",
                            "\U0001F1FA\U0001F1F8", "\U0001F9D1\u200D\U0001F91D\u200D\U0001F9D1"]),
        lambda: rng.choice("aeiouAZ") + "".join(chr(0x300 + rng.randrange(0x70)) for _ in range(rng.randrange(1, 6))),
        lambda: rng.choice(["'s", "'ll", "'VE", "n't", "'d ", " 's", "''", "'"]),
        lambda: str(rng.randrange(10 ** rng.randrange(1, 30))),
        lambda: rng.choice(["<|endoftext|>", "<s>", "</s>", "<unk>", "<0x41>", "▁", "Ġ", "<|endoftext|"]),
        lambda: rng.choice(["Hello", " world", "ελληνικά", " русский", "中文字符", " עברית", "العربية", "🦀 rust"]),
        lambda: "".join(rng.choice("ab ") for _ in range(rng.randrange(1, 50))),
    ]
    return "".join(rng.choice(pieces)() for _ in range(rng.randrange(0, 24)))


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-prefix", "llama-shaped", "llama2"])
def test_hostile_strings_give_the_reference_ids(files, kind):
    """A seeded property test: thousands of generated strings, ids equal to ``tokenizers``'
    (the seed and the failing string are in the message)."""
    path = _path(files, kind)
    tok = stoker.Tokenizer(path)
    seed = int(os.environ.get("STOKER_FUZZ_SEED", "48"))
    rng = random.Random(seed)
    batch = [_hostile(rng) for _ in range(3000)]
    want = _reference_ids(path, batch)
    got = tok.encode_batch(batch, threads=4)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.tolist() == w, f"seed {seed}, string {i}: {batch[i]!r}"
    with_specials = _reference_ids(path, batch[:500], True)
    assert [g.tolist() for g in tok.encode_batch(batch[:500], add_special_tokens=True)] == with_specials
