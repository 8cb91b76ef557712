"""``stoker._stoker.encode_captions`` (the engine's ``CaptionEncoder``) against the two references
of CLIP captions, on the real CLIP tokenizer (``tests/data/text/tokenizer-clip.json``): the
``tokenizers`` package with truncation and padding to 77 (HuggingFace ``CLIPTokenizerFast``
semantics, padded with 49407) and open_clip's ``SimpleTokenizer`` ported in ``clip_reference.py``
(HTML references replaced, padded with 0), over a few hundred Wikipedia sentences and captions
chosen to break things."""

import json
import pathlib

import numpy as np
import pytest
import stoker
import zstandard
from clip_reference import SimpleTokenizer
from stoker import _stoker
from tokenizers import Tokenizer

DATA = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "text"
CLIP = DATA / "tokenizer-clip.json"
SOT, EOT = 49406, 49407

#: Captions that differ between cleanings, scripts and lengths.
TRICKY = [
    "a photo of a cat",
    "A Photo  of\ta\nDOG.",
    "Tom &amp; Jerry",
    "&quot;quoted&quot; &#39;single&#39; &lt;b&gt;",
    "fish &amp;amp; chips &amp;quot;x&amp;quot;",
    "&ampx &eacute &notin; &#x80; &#1; &#xD800; &nosuch;",
    "caf\u00c3\u00a9 au lait",  # mojibake: ftfy would repair it, neither reference here does
    "café cafe\u0301 Straße",
    "\U0001f431 cat \U0001f600 \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "東京タワーの夜景",
    "Москва ΟΔΟΣ σοφός",
    "مرحبا بالعالم",
    "it's they're I'M we'VE",
    "",
    "   ",
    " \u3000\u00a0\x1c leading and trailing \u2028 ",
    "word " * 100,
    "x" * 500,
    "1234567890 " * 10,
    "!!!???... ---",
]


@pytest.fixture(scope="module")
def sentences():
    """About 200 sentences of real Wikipedia text, some longer than 77 tokens."""
    raw = zstandard.ZstdDecompressor().stream_reader((DATA / "wiki-sample.jsonl.zst").open("rb")).read()
    out = []
    for line in raw.decode().splitlines()[:12]:
        text = json.loads(line)["text"]
        out += [s.strip() for s in text.replace("\n", " ").split(". ") if s.strip()][:20]
    assert len(out) >= 200
    return out[:220]


def rows(captions, **kw):
    ids, mask = _stoker.encode_captions(str(CLIP), captions, **kw)
    n = kw.get("context_length", 77)
    return np.frombuffer(ids, "<i4").reshape(-1, n), np.frombuffer(mask, "<i4").reshape(-1, n)


def test_the_reference_vocabulary_is_the_files():
    ref = SimpleTokenizer(CLIP)
    renamed = {"<start_of_text>": "<|startoftext|>", "<end_of_text>": "<|endoftext|>"}
    assert {renamed.get(k, k): v for k, v in ref.encoder.items()} == ref.file_vocab
    assert len(ref.encoder) == 49408 and (ref.sot_token_id, ref.eot_token_id) == (SOT, EOT)


def test_huggingface_semantics(sentences):
    hf = Tokenizer.from_file(str(CLIP))
    hf.enable_truncation(77)
    hf.enable_padding(length=77, pad_id=EOT, pad_token="<|endoftext|>")
    captions = sentences + TRICKY
    want = hf.encode_batch(captions)
    ids, mask = rows(captions, pad_id=EOT, clean="none")
    for i, w in enumerate(want):
        assert ids[i].tolist() == w.ids, captions[i]
        assert mask[i].tolist() == w.attention_mask, captions[i]
    long = [i for i, w in enumerate(want) if sum(w.attention_mask) == 77]
    assert len(long) >= 5 and all(ids[i, 76] == EOT for i in long)


def test_open_clip_semantics(sentences):
    ref = SimpleTokenizer(CLIP)
    captions = sentences + TRICKY
    ids, mask = rows(captions, pad_id=0, clean="open_clip")
    differ = []
    for i, text in enumerate(captions):
        want, n = ref(text)
        if ids[i].tolist() != want or mask[i].tolist() != [1] * n + [0] * (77 - n):
            differ.append(text)
    assert differ == []
    # The two cleanings do differ: on the HTML references and on a final capital sigma.
    hf_ids, _ = rows(TRICKY, pad_id=0, clean="none")
    changed = {TRICKY[i] for i in range(len(TRICKY)) if hf_ids[i].tolist() != ids[len(sentences) + i].tolist()}
    assert "Tom &amp; Jerry" in changed and "Москва ΟΔΟΣ σοφός" in changed and "a photo of a cat" not in changed


def test_bytes_empty_and_other_lengths():
    ids, mask = rows([b"a photo of a cat", "", "a photo of a cat"], context_length=8, pad_id=EOT, clean="none")
    assert ids.tolist() == [
        [SOT, 320, 1125, 539, 320, 2368, EOT, EOT],
        [SOT, EOT, EOT, EOT, EOT, EOT, EOT, EOT],
        [SOT, 320, 1125, 539, 320, 2368, EOT, EOT],
    ]
    assert mask.tolist() == [[1] * 7 + [0], [1, 1] + [0] * 6, [1] * 7 + [0]]
    ids, _ = rows(["a photo of a cat"], context_length=4)
    assert ids.tolist() == [[SOT, 320, 1125, EOT]]


def test_bad_captions_and_options_are_named():
    with pytest.raises(stoker.DecodeError, match=r"captions\[1\].*not UTF-8"):
        rows([b"fine", b"caf\xe9"])
    with pytest.raises(stoker.ConfigError, match=r"captions\[0\]: expected str or bytes, got int"):
        rows([3])
    for kw, arg in [
        ({"context_length": 1}, "context_length"),
        ({"context_length": 70000}, "context_length"),
        ({"pad_id": -1}, "pad_id"),
        ({"pad_id": 49408}, "pad_id"),
        ({"clean": "ftfy"}, "clean"),
    ]:
        with pytest.raises(stoker.ConfigError, match=f"`{arg}`"):
            rows(["x"], **kw)
    with pytest.raises(stoker.ConfigError, match="<\\|startoftext\\|>"):
        _stoker.encode_captions(str(DATA / "tokenizer-gpt2.json"), ["x"])
