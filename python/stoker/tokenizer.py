"""`Tokenizer`: batches of texts to token ids on stoker's tokenizer, outside the GIL."""

from __future__ import annotations

import importlib
import os
from typing import Any, Iterable, Literal, overload

import numpy as np
import numpy.typing as npt

from . import _stoker
from .errors import ConfigError
from .text import _tokenizer

_FORMATS = ("numpy", "arrow", "flat")


class Tokenizer:
    """A ``tokenizer.json`` (HuggingFace ``tokenizers`` format) that encodes batches of texts on
    worker threads with the GIL released, with the ids of the ``tokenizers`` package.

    ``tokenizer`` is the file's path, its bytes, or a ``tokenizers.Tokenizer`` (or a
    ``transformers`` fast tokenizer, by its backend). The encoder is the one ``TokenLoader``
    uses: stoker's own byte-level BPE where it reproduces the file exactly (GPT-2's, GPT-NeoX's,
    Llama 3's, Qwen2's kind), else ``tokenizers`` 1.0 where a probe finds it gives 0.22's ids
    (Llama 2's, WordPiece, Unigram), else the ``tokenizers`` crate 0.22; :attr:`engine` says
    which and :attr:`engine_reason` why. ``bos_token``/``eos_token`` name the tokens
    ``add_bos``/``add_eos`` add (default: the first of the usual names the vocabulary has,
    ``<s>``, ``<|endoftext|>``, ... as ``TokenLoader`` finds them).

    Picklable: a pickle carries the file's bytes (not its path), so the tokenizer travels to
    Ray or multiprocessing workers that do not have the file, and rebuilds the same encoder
    there. Safe after ``fork()``: each call makes its worker threads and joins them before it
    returns, so no thread of stoker's is left between calls, and a forked child rebuilds its
    encoder from the file's bytes on first use (nothing its parent's threads were doing is
    inherited).
    """

    def __init__(self, tokenizer: str | os.PathLike[str] | bytes | Any, *, bos_token: str | None = None,
                 eos_token: str | None = None) -> None:
        if isinstance(tokenizer, (bytes, bytearray)):
            self._native = _stoker.Tokenizer(bytes(tokenizer), bos_token, eos_token)
            return
        path, json = _tokenizer(tokenizer)
        if json is not None:
            self._native = _stoker.Tokenizer(json.encode(), bos_token, eos_token, "<tokenizer object>")
        elif path is not None:
            self._native = _stoker.Tokenizer(path, bos_token, eos_token)
        else:
            raise ConfigError("invalid argument `tokenizer`: expected a tokenizer.json path, its bytes, a "
                              "tokenizers.Tokenizer or a transformers fast tokenizer, got None")

    @overload
    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = ..., add_eos: bool = ...,
                     add_special_tokens: bool = ..., threads: int | str | None = ...,
                     format: Literal["numpy"] = ...) -> list[npt.NDArray[np.uint32]]: ...

    @overload
    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = ..., add_eos: bool = ...,
                     add_special_tokens: bool = ..., threads: int | str | None = ...,
                     format: Literal["flat"]) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]: ...

    @overload
    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = ..., add_eos: bool = ...,
                     add_special_tokens: bool = ..., threads: int | str | None = ...,
                     format: Literal["arrow"]) -> Any: ...

    def encode_batch(self, texts: Iterable[str], *, add_bos: bool = False, add_eos: bool = False,
                     add_special_tokens: bool = False, threads: int | str | None = "auto",
                     format: str = "numpy") -> Any:
        """The ids of each text, in order: by default those of ``tokenizers``'
        ``encode_batch(texts, add_special_tokens=False)``; ``add_special_tokens=True`` keeps the
        ids the file's post-processor puts around a text (Llama 2's ``<s>``, BERT's
        ``[CLS]``/``[SEP]``), as ``tokenizers`` does by default; ``add_bos``/``add_eos`` put
        :attr:`bos_id` before / :attr:`eos_id` after each text's ids, as ``TokenLoader`` does.

        The texts are encoded on ``threads`` threads made for the call (``"auto"``/``None``:
        ``STOKER_NUM_THREADS`` when set, else the process's CPU allowance; never more than there
        are chunks of ~64 KiB of text), in contiguous chunks, so the ids are the same whatever
        the count; the GIL is released meanwhile and Ctrl-C stops the call within ~50 ms.

        ``format``: ``"numpy"``, a list of one ``uint32`` array per text (views of one array);
        ``"arrow"``, a ``pyarrow.LargeListArray`` of ``uint32`` (pyarrow is imported only
        then); ``"flat"``, ``(ids, offsets)``: every text's ids end to end (``uint32``) and
        where each text's start (``int64``, one more than there are texts). A text the
        tokenizer cannot encode raises ``DecodeError`` naming the file and the text's index.
        """
        if format not in _FORMATS:
            raise ConfigError(f"invalid argument `format`: expected 'numpy', 'arrow' or 'flat', got {format!r}")
        if isinstance(texts, (str, bytes)):
            raise ConfigError(f"invalid argument `texts`: expected a list of str, got a {type(texts).__name__} "
                              "(encode() takes one text)")
        batch = texts if isinstance(texts, list) else list(texts)
        raw_ids, raw_offsets = self._native.encode_batch(batch, add_bos, add_eos, add_special_tokens, threads)
        ids = np.frombuffer(raw_ids, dtype=np.uint32)
        offsets = np.frombuffer(raw_offsets, dtype=np.int64)
        if format == "flat":
            return ids, offsets
        if format == "arrow":
            pa: Any = importlib.import_module("pyarrow")
            return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(ids))
        return np.split(ids, offsets[1:-1]) if len(batch) else []

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
               add_special_tokens: bool = False) -> npt.NDArray[np.uint32]:
        """The ids of one text (``uint32``), as :meth:`encode_batch` gives them, on the calling
        thread with the GIL released."""
        if not isinstance(text, str):
            raise ConfigError(f"invalid argument `text`: expected a str, got {type(text).__name__}")
        ids, _ = self.encode_batch([text], add_bos=add_bos, add_eos=add_eos, add_special_tokens=add_special_tokens,
                                   threads=1, format="flat")
        return ids

    @property
    def engine(self) -> str:
        """The encoder the file got: ``"stoker byte-level BPE"``, ``"tokenizers 1.0"`` or
        ``"tokenizers"`` (the crate, 0.22)."""
        return self._native.engine[0]

    @property
    def engine_reason(self) -> str:
        """Why the file got its encoder."""
        return self._native.engine[1]

    @property
    def vocab_size(self) -> int:
        """The vocabulary size, added tokens included."""
        return self._native.vocab_size

    @property
    def bos_id(self) -> int | None:
        """The id ``add_bos`` adds (``None``: the tokenizer has none; ``add_bos`` then raises)."""
        return self._native.bos_id

    @property
    def eos_id(self) -> int | None:
        """The id ``add_eos`` adds (``None``: the tokenizer has none; ``add_eos`` then raises)."""
        return self._native.eos_id

    @property
    def origin(self) -> str:
        """The file the tokenizer came from (``<bytes>`` or ``<tokenizer object>`` when it was
        not given as a path), as errors name it."""
        return self._native.origin

    def __reduce__(self) -> tuple[Any, ...]:
        return _from_native, (self._native,)

    def __repr__(self) -> str:
        return f"stoker.Tokenizer({self.origin!r}, engine={self.engine!r}, vocab_size={self.vocab_size})"


def _from_native(native: _stoker.Tokenizer) -> Tokenizer:
    """A `Tokenizer` around an unpickled native one (which carries the file's bytes)."""
    t = Tokenizer.__new__(Tokenizer)
    t._native = native
    return t
