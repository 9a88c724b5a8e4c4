"""The LM head's int8 slicer (``open1b_kernels.ops.lmhead``, step 1) by the compiled loop of
``open1b_kernels/core/_mathc.c``: integer and bit operations only, so the values of the torch code
(``open1b_kernels.ops.lmhead.slice_rows_cpu``) in any split. Two layouts: the planes (S, R, K) of
the operand's storage, or the level-ready layout of ``open1b_kernels.ops.slices.LevelSlices``.
"""
from __future__ import annotations

import torch

from open1b_kernels.core import mathc
from open1b_kernels.core.pieces import parallel


def slice_rows(x: torch.Tensor, slices: int, out: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``open1b_kernels.ops.lmhead.slice_rows_cpu`` by the compiled loop (integer operations only, so
    the same result), or None when the loop is unavailable.

    A transposed view of a row-major matrix (a weight seen as ``w.t()``) is sliced in its
    storage's layout, one exponent per storage column, and the slices come back as the
    matching transposed views - no transposed copy of the operand or of its slices. ``out``:
    a contiguous int8 buffer of ``slices * x.numel()`` elements to write the slices into
    (reused memory: no page faults), else a new tensor."""
    if out is None:
        out = torch.empty((slices * x.numel(),), dtype=torch.int8)
    got = _slice(x, slices, out, None)
    if got is None:
        return None
    planes, exps, by_cols = got
    return (planes.transpose(1, 2) if by_cols else planes), exps


def slice_store(x: torch.Tensor, slices: int, out: torch.Tensor, descending: bool
                ) -> tuple[torch.Tensor, torch.Tensor, bool] | None:
    """``slice_rows``'s slices stored so that the slices of a level sit side by side along
    the contraction (``open1b_kernels.ops.slices.LevelSlices``): a row-major ``x`` (R, K) into
    (R, S, K) - each row's slices interleaved - and a transposed view into the planes
    (S, K, R) of its storage; ``descending``: slice S first. Returns (that storage view of
    ``out``, the exponents, whether ``x`` was sliced by storage columns), or None when the
    loop is unavailable (or built before it took a layout)."""
    if not mathc.has("SLICE_LAYOUTS"):
        return None
    return _slice(x, slices, out, descending)


def _slice(x: torch.Tensor, slices: int, out: torch.Tensor, descending: bool | None):
    """The slicer's call: planes (S, r, k) of the storage when ``descending`` is None, else
    the level-ready layout in that order. (storage view of ``out``, exponents, by_cols)."""
    if not mathc.has("slice_planes") or x.device.type != "cpu" or x.dtype not in (torch.float32,
                                                                           torch.bfloat16):
        return None
    by_cols = x.dim() == 2 and not x.is_contiguous() and x.t().is_contiguous()
    src = x.t() if by_cols else x.contiguous()
    r, k = src.shape
    if out.dtype != torch.int8 or not out.is_contiguous() or out.numel() != slices * r * k:
        raise ValueError(f"the slicer's out must be contiguous int8 with {slices * r * k} "
                         f"elements, got {out.dtype} {tuple(out.shape)}")
    bits = src.view(torch.int16 if x.dtype == torch.bfloat16 else torch.int32)
    n = k if by_cols else r
    exps = torch.empty((n,), dtype=torch.int32)
    interleave = descending is not None and not by_cols
    layout = (1 if interleave else 0) | (2 if descending else 0)
    a, o, e = bits.reshape(-1).numpy(), out.reshape(-1).numpy(), exps.numpy()
    extra = (layout,) if layout else ()      # an older build takes no layout (planes only)
    parallel(lambda lo, hi, p: mathc._mathc.slice_planes(a, x.dtype == torch.bfloat16, r, k, slices,
                                                         by_cols, o, e, lo, hi, p, *extra),
             n, grain=64 if by_cols else 1)
    return (out.view(r, slices, k) if interleave else out.view(slices, r, k)), exps, by_cols
