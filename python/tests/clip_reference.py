"""open_clip's ``SimpleTokenizer`` (``src/open_clip/tokenizer.py`` of ``mlfoundations/open_clip``,
itself from ``openai/CLIP``, MIT License, Copyright (c) 2021 OpenAI), ported as the reference of
the caption tests: its own vocabulary construction, pattern, BPE loop, cleaning and truncation,
with two changes. The merges are read from ``tokenizer-clip.json`` (the same merges as
``bpe_simple_vocab_16e6.txt.gz``; the vocabulary built from them here must equal the file's,
which the tests check), and ``ftfy.fix_text`` is replaced by NFC alone (ftfy is not a test
dependency, and stoker does not run it: see ``crates/stoker/src/tokens/caption.rs``)."""

from __future__ import annotations

import html
import json
import unicodedata
from pathlib import Path

import regex as re


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def get_pairs(word: tuple[str, ...]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in zip(word, word[1:], strict=False)}


def basic_clean(text: str) -> str:
    text = unicodedata.normalize("NFC", text)  # open_clip: ftfy.fix_text(text), which ends with NFC
    text = html.unescape(html.unescape(text))
    return text.strip()


def whitespace_clean(text: str) -> str:
    return " ".join(text.split()).strip()


class SimpleTokenizer:
    """open_clip's tokenizer with ``clean="lower"`` (its default)."""

    def __init__(self, tokenizer_json: Path, context_length: int = 77) -> None:
        model = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split()) for m in model["merges"]]
        self.byte_encoder = bytes_to_unicode()
        vocab = list(bytes_to_unicode().values())
        vocab = vocab + [v + "</w>" for v in vocab]
        for merge in merges:
            vocab.append("".join(merge))
        special_tokens = ["<start_of_text>", "<end_of_text>"]
        vocab.extend(special_tokens)
        self.encoder = dict(zip(vocab, range(len(vocab)), strict=True))
        self.bpe_ranks = dict(zip(merges, range(len(merges)), strict=True))
        self.cache = {t: t for t in special_tokens}
        special = "|".join(special_tokens)
        self.pat = re.compile(
            special + r"""|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+""",
            re.IGNORECASE,
        )
        self.sot_token_id, self.eot_token_id = (self.encoder[t] for t in special_tokens)
        self.context_length = context_length
        #: The file's own vocabulary, for the check that this one equals it.
        self.file_vocab: dict[str, int] = model["vocab"]

    def bpe(self, token: str) -> str:
        if token in self.cache:
            return self.cache[token]
        word = tuple(token[:-1]) + (token[-1] + "</w>",)
        pairs = get_pairs(word)
        if not pairs:
            return token + "</w>"
        while True:
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word: list[str] = []
            i = 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                    new_word.extend(word[i:j])
                    i = j
                except ValueError:
                    new_word.extend(word[i:])
                    break
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
            if len(word) == 1:
                break
            pairs = get_pairs(word)
        out = " ".join(word)
        self.cache[token] = out
        return out

    def encode(self, text: str) -> list[int]:
        bpe_tokens: list[int] = []
        text = whitespace_clean(basic_clean(text)).lower()
        for token in re.findall(self.pat, text):
            token = "".join(self.byte_encoder[b] for b in token.encode("utf-8"))
            bpe_tokens.extend(self.encoder[t] for t in self.bpe(token).split(" "))
        return bpe_tokens

    def __call__(self, text: str) -> tuple[list[int], int]:
        """One row of ``context_length`` ids, padded with 0 (``SimpleTokenizer.__call__``), and
        the number of ids before the padding."""
        tokens = [self.sot_token_id] + self.encode(text) + [self.eot_token_id]
        if len(tokens) > self.context_length:
            tokens = tokens[: self.context_length]
            tokens[-1] = self.eot_token_id
        return tokens + [0] * (self.context_length - len(tokens)), len(tokens)
