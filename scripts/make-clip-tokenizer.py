#!/usr/bin/env python3
"""Builds CLIP's text tokenizer as a HuggingFace `tokenizer.json` from OpenAI's BPE file.

    python scripts/make-clip-tokenizer.py bpe_simple_vocab_16e6.txt.gz tests/data/text/tokenizer-clip.json

Where each piece comes from:

- The merges: `bpe_simple_vocab_16e6.txt.gz`, as open_clip ships it (`mlfoundations/open_clip`,
  `src/open_clip/bpe_simple_vocab_16e6.txt.gz`, a copy of `openai/CLIP`'s
  `clip/bpe_simple_vocab_16e6.txt.gz`, MIT License, Copyright (c) 2021 OpenAI). Its first line is
  a version comment; open_clip's `SimpleTokenizer.__init__` keeps lines `[1 : 49152 - 256 - 2 + 1]`,
  48,894 merges, and so does this script.
- The vocabulary, as `SimpleTokenizer.__init__` builds it (`src/open_clip/tokenizer.py`): the 256
  byte characters of `bytes_to_unicode()` (GPT-2's byte-to-character table), the same 256 with
  `</w>` appended, each merge's two sides joined, then the two special tokens: 49,408 ids, with
  49406 and 49407 the start and end of text. open_clip names these `<start_of_text>` and
  `<end_of_text>`; HuggingFace's `openai/clip-vit-base-patch32` names them `<|startoftext|>` and
  `<|endoftext|>`, and this file follows HuggingFace (the ids are the same).
- The pipeline, as HuggingFace `transformers` builds `CLIPTokenizerFast`'s: `CLIPConverter` in
  `src/transformers/convert_slow_tokenizer.py` (v4) and `CLIPTokenizer.__init__` in
  `src/transformers/models/clip/tokenization_clip.py` (v5, 5.24.0 read) agree on it. A BPE model
  with `</w>` as its end-of-word suffix, no continuing-subword prefix, `<|endoftext|>` as the
  unknown token; the normalizer NFC, then every run of whitespace replaced by one space (`\\s+`),
  then lowercase; the pre-tokenizer CLIP's regex (`PATTERN` below: v5's, which lists the two
  special tokens first as open_clip's does; v4's lacks them, which changes nothing since added
  tokens are split out before it runs) keeping the matches and dropping what lies between them,
  then the byte-level mapping (no prefix space); the post-processor `RobertaProcessing` putting
  `<|startoftext|>` before and `<|endoftext|>` after the ids; the byte-level decoder. The two
  special tokens are added tokens (`special`, `normalized: false`), as v5 builds them.

What this tokenizer does not do, as HuggingFace's fast tokenizer does not: open_clip's
`basic_clean` (`ftfy.fix_text`, then `html.unescape` twice) before encoding. stoker's caption
encoder (`crates/stoker/src/tokens/caption.rs`) does the HTML part when asked (`clean="open_clip"`).

Needs only the `tokenizers` package. The output is deterministic (vocabulary in id order, merges
in rank order), so rebuilding gives the same bytes.
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

#: The special tokens, by HuggingFace's names, with their ids.
SOT, EOT = "<|startoftext|>", "<|endoftext|>"
#: CLIP's pre-tokenizer pattern: open_clip's `SimpleTokenizer.pat` with HuggingFace's names of the
#: special tokens, as `transformers`' `CLIPTokenizer` writes it.
PATTERN = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table of a printable character for each byte (as open_clip's `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def vocab_and_merges(bpe_gz: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocabulary and merges exactly as open_clip's `SimpleTokenizer.__init__` makes them."""
    lines = gzip.open(bpe_gz).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    if len(merges) != 48894 or any(len(m) != 2 for m in merges):
        raise SystemExit(f"{bpe_gz}: expected 48894 merges of two symbols each")
    chars = list(bytes_to_unicode().values())
    tokens = chars + [c + "</w>" for c in chars] + ["".join(m) for m in merges] + [SOT, EOT]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != 49408:
        raise SystemExit(f"{bpe_gz}: the vocabulary has {len(vocab)} distinct tokens, not 49408")
    return vocab, merges  # type: ignore[return-value]


def build(bpe_gz: Path) -> Tokenizer:
    """The tokenizer, as `transformers`' `CLIPConverter.converted` builds it."""
    vocab, merges = vocab_and_merges(bpe_gz)
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="</w>",
            fuse_unk=False,
            unk_token=EOT,
        )
    )
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.RobertaProcessing(
        (EOT, vocab[EOT]), (SOT, vocab[SOT]), add_prefix_space=False, trim_offsets=False
    )
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in (SOT, EOT)])
    if tok.token_to_id(SOT) != 49406 or tok.token_to_id(EOT) != 49407 or tok.get_vocab_size() != 49408:
        raise SystemExit("the special tokens did not keep ids 49406 and 49407")
    return tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("bpe_gz", type=Path, help="bpe_simple_vocab_16e6.txt.gz (open_clip or openai/CLIP)")
    ap.add_argument("out", type=Path, help="the tokenizer.json to write")
    a = ap.parse_args()
    tok = build(a.bpe_gz)
    # Compact JSON (no indentation): about 1.7 MB, the same bytes on every run.
    j = json.loads(tok.to_str())
    a.out.write_text(json.dumps(j, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    back = Tokenizer.from_file(str(a.out))
    print(
        f"{a.out}: {a.out.stat().st_size} bytes, vocab {back.get_vocab_size()}, "
        f"'a photo of a cat' -> {back.encode('a photo of a cat').ids}"
    )


if __name__ == "__main__":
    main()
