"""Preparing data on a Ray cluster (the ``stoker[ray]`` extra): :func:`pack`, the shards of
``stoker pack`` made by Ray tasks, byte for byte; :func:`tokenize`, the token cache of ``stoker
tokenize`` made with Ray Data and a `stoker.Tokenizer` per worker.

``import stoker`` does not import this package, and this package imports Ray only when one of
its functions runs. The command line reaches it through ``stoker pack --ray ADDRESS`` and
``stoker tokenize --ray ADDRESS`` (``python -m stoker.ray``).
"""

from ._pack import pack
from ._tokenize import tokenize

__all__ = ["pack", "tokenize"]
