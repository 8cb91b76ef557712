"""The iterator of image and array batches: a converted tensor per exported view."""

from __future__ import annotations

from typing import Any, Callable

from ._live import track


class BatchIterator:
    """Yields one converted tensor per exported view of each native batch; keeps no reference
    to a batch it has handed out, so a batch returns to the pool as soon as the caller drops
    its tensors."""

    def __init__(self, native: Any, convert: Callable[[Any], Any], views: Callable[[Any], tuple[Any, ...]],
                 first: Callable[[Any], Any] | None = None,
                 mix: Callable[[Any, Any], Any] | None = None) -> None:
        self._native = native
        self._convert = convert
        self._views = views
        self._first = first
        self._mix = mix
        track(self)

    def __iter__(self) -> BatchIterator:
        return self

    def _images(self, images: Any, b: Any) -> Any:
        """The first view after ``first`` (the normaliser), then ``mix`` (given the native
        batch ``b``, for its draw)."""
        if self._first is not None:
            images = self._first(images)
        if self._mix is not None:
            images = self._mix(images, b)
        return images

    def __next__(self) -> tuple[Any, ...]:
        b = self._native.__next__()
        out = tuple(self._convert(v) for v in self._views(b))
        if self._first is not None or self._mix is not None:
            out = (self._images(out[0], b),) + out[1:]
        return out

    def close(self) -> None:
        """Stops the iteration now; every worker thread is joined."""
        self._native.close()


__all__ = ["BatchIterator"]
