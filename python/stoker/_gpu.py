"""What the GPU side does to image batches with torch ops: normalising uint8 batches through the
engine's own table, and MixUp/CutMix with the host's arithmetic."""

from __future__ import annotations

from typing import Any, Sequence

from ._output import torch_module
from .errors import ConfigError


def normalize_table(mean: Sequence[float], std: Sequence[float]) -> Any:
    """The engine's normalisation table (``stoker::ops::normalize_table``, the CPU path's own
    values): for channel ``c`` and byte ``v``, ``(v / 255 - mean[c]) / std[c]`` in float32 with
    true division. A ``(3, 256)`` float32 NumPy array."""
    import numpy as np

    from . import _stoker

    raw = _stoker.normalize_table([float(m) for m in mean], [float(s) for s in std])
    table: Any = np.frombuffer(raw, dtype="<f4").reshape(3, 256).copy()
    return table


class Normalizer:
    """uint8 images to normalised ``dtype`` with torch ops, on the tensor's device and the
    current stream. This is how batches that crossed the bus as uint8 are normalised on the GPU.

    Bit-identical to host batches by construction: the engine normalises through a table of
    ``(v / 255 - mean) / std`` per channel and byte value; this looks the bytes up in the same
    table (:func:`normalize_table`, float32 arithmetic on the host), so no device arithmetic is
    involved (CUDA's division by a scalar multiplies by the reciprocal, 1 ulp off for some
    values). float16/bfloat16 are the float32 values rounded to nearest even, as on the CPU."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], dtype: Any, channels_last: bool) -> None:
        self._table = normalize_table(mean, std)
        self._dtype = str(dtype).replace("torch.", "")  # a name or a torch dtype
        self._channels_last = channels_last
        self._consts: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, x: Any) -> Any:
        torch = torch_module()

        c = self._consts.get(x.device)
        if c is None:
            channels = self._table.shape[0]
            shape = (1, 1, 1, -1) if self._channels_last else (1, -1, 1, 1)
            table = torch.from_numpy(self._table.reshape(-1).copy()).to(x.device)
            offsets = (torch.arange(channels, dtype=torch.int32) * 256).reshape(shape).to(x.device)
            c = self._consts[x.device] = (table, offsets)
        table, offsets = c
        # Flat index of (channel, byte) into the table: an exact gather, no arithmetic on floats.
        index = x.to(torch.int32).add_(offsets)
        y = table.index_select(0, index.reshape(-1)).reshape(x.shape)
        return y if self._dtype == "float32" else y.to(getattr(torch, self._dtype))


class Mixer:
    """MixUp/CutMix of a batch's images with torch ops, on the tensor's device and the current
    stream: how batches bound for a GPU are mixed there, after the :class:`Normalizer` (or raw,
    for ``dtype=uint8``). The engine draws each batch's mix and makes its soft labels on the host
    (``stoker::image::ops::mix``); this applies the draw (``Loader.mix_params``) to the images
    with the host's arithmetic exactly, so a GPU batch equals the host batch bit for bit:

    - float32 ``x * lam + partner * (1 - lam)``, ``lam`` and ``1 - lam`` float32 scalars, each
      product and the sum rounded to float32 (two ``mul`` and an ``add``: no fused multiply-add);
      float16/bfloat16 the same with each result rounded to that dtype;
    - uint8: the float32 value above rounded half to even, clamped to 0..255;
    - CutMix copies the box ``area = [y0, y1, x0, x1]`` from the partner (exact);
    - partner: ``style='torchvision'`` rolls the batch by one (``i`` takes ``i - 1``, the first
      the last), ``'timm'`` flips it (``i`` takes ``n - 1 - i``).

    A batch of fewer than two samples, or a draw with ``lam >= 1``, is returned unchanged."""

    def __init__(self, style: str, channels_last: bool) -> None:
        if style not in ("torchvision", "timm"):
            raise ConfigError(f"invalid argument `batch_transform`: unknown mixing style {style!r}")
        self._style = style
        self._channels_last = channels_last

    def _partner(self, x: Any) -> Any:
        """The partners of the rows of ``x`` (a new tensor)."""
        torch = torch_module()
        return torch.roll(x, 1, 0) if self._style == "torchvision" else x.flip(0)

    def __call__(self, x: Any, params: dict[str, Any] | None, inplace: bool = False) -> Any:
        """``x`` (``[N, C, H, W]``, or ``[N, H, W, C]`` with ``channels_last``) mixed by the draw
        ``params`` (``{"cutmix", "lam", "area"}``; ``None``: unmixed). ``inplace``: ``x`` may be
        overwritten (a tensor of the caller's own, such as the normaliser's output)."""
        if params is None or x.shape[0] < 2 or float(params["lam"]) >= 1.0:
            return x
        torch = torch_module()
        area = params.get("area") if params["cutmix"] else None
        if area is not None:
            y0, y1, x0, x1 = (int(v) for v in area)
            rows, cols = slice(y0, y1), slice(x0, x1)
            box = (slice(None), rows, cols) if self._channels_last else (slice(None), slice(None), rows, cols)
            out = x if inplace else x.clone()
            out[box] = self._partner(x[box])  # the partners' box is a copy, made before the write
            return out
        lam = float(params["lam"])
        l0, l1 = lam, 1.0 - lam  # python floats: torch uses them as scalars of the tensor's dtype
        if x.dtype == torch.uint8:
            f = x.to(torch.float32)
            other = self._partner(f).mul_(l1)
            return f.mul_(l0).add_(other).round_().clamp_(0, 255).to(torch.uint8)
        # Separate products and sum, each rounded to x's dtype (as the host does).
        other = self._partner(x).mul_(l1)
        own = x.mul_(l0) if inplace else x.mul(l0)
        return own.add_(other)


__all__ = ["Mixer", "Normalizer", "normalize_table"]
