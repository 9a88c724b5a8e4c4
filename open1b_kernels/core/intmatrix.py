"""Compiled CPU loops over the exact int8 GEMM's integer matrices (``open1b_kernels/core/_mathc.c``):
the exactness guard's sums (``int_sums``, ``mv_int8``), the dequantization with its sums
in the same pass (``dequant``), and the float route's widening with its operands' sums of
squares (``widen_sq``). Integer arithmetic and the dequantization's float32 operations in
their torch order: the same values as the torch code, which stays the fallback (each
function returns None where the extension is missing, disabled or the layout does not fit).
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import PARALLEL_MIN, _mathc, flat, has
from open1b_kernels.core.pieces import parallel, row_pieces


def int_sums(x: torch.Tensor, want_rows: bool = True, want_cols: bool = True):
    """(row sums (R,) or None, column sums (C,) or None) in int64 of a contiguous int32 or
    int8 (R, C) CPU matrix by the compiled loop - exact integer sums, the values of torch's
    ``x.sum(dim, dtype=torch.int64)`` - or None when the loop is unavailable or ``x`` is not
    contiguous (the caller then sums with torch)."""
    if (not has("int_sums") or x.device.type != "cpu"
            or x.dtype not in (torch.int32, torch.int8) or x.dim() != 2
            or not x.is_contiguous() or not (want_rows or want_cols)):
        return None
    r, c = x.shape
    rows = torch.empty(r if want_rows else 0, dtype=torch.int64)
    src, rr, is_int8 = flat(x), rows.numpy(), x.dtype == torch.int8
    if not want_cols:
        none = torch.empty(0, dtype=torch.int64).numpy()
        parallel(lambda lo, hi, p: _mathc.int_sums(src, is_int8, rr, none, r, c, lo, hi, p), r,
                 grain=max(1, PARALLEL_MIN // max(c, 1)))
        return rows, None
    cols = row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: _mathc.int_sums(
        src, is_int8, rr, parts, r, c, lo, hi, p))
    return (rows if want_rows else None), cols


def widen_sq(x: torch.Tensor, out: torch.Tensor, by_rows: bool) -> torch.Tensor | None:
    """``out`` (contiguous float32, ``x``'s shape) = the contiguous int8 (R, C) CPU matrix
    ``x`` widened, in one compiled pass with the exact int64 sums of squares of its rows
    (``by_rows``, (R,)) or of its columns ((C,)), which are returned; None when the loop is
    unavailable or the layouts do not fit (the caller then uses torch)."""
    if (not has("widen_sq") or x.device.type != "cpu" or x.dtype != torch.int8
            or x.dim() != 2 or not x.is_contiguous() or out.dtype != torch.float32
            or out.shape != x.shape or not out.is_contiguous()):
        return None
    r, c = x.shape
    src, y = flat(x), flat(out)
    if by_rows:
        rows = torch.empty(r, dtype=torch.int64)
        rr, none = rows.numpy(), torch.empty(0, dtype=torch.int64).numpy()
        parallel(lambda lo, hi, p: _mathc.widen_sq(src, y, rr, none, r, c, lo, hi, p), r,
                 grain=max(1, PARALLEL_MIN // max(c, 1)))
        return rows
    none = torch.empty(0, dtype=torch.int64).numpy()
    return row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: _mathc.widen_sq(
        src, y, none, parts, r, c, lo, hi, p))


def mv_int8(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """``x @ v`` in int64 for an int8 (R, K) CPU matrix - row-major or a transposed view of a
    row-major one - and an int64 vector (K,): the exactness guard's products, exact while
    every sum stays below 2^63 (the caller's bound). None when the loop is unavailable or
    the layout is neither."""
    if (not has("mv_int8") or x.device.type != "cpu"
            or x.dtype != torch.int8 or x.dim() != 2 or v.dtype != torch.int64):
        return None
    r, k = x.shape
    if x.is_contiguous():
        src, transposed = x, False
    elif x.t().is_contiguous():
        src, transposed = x.t(), True
    else:
        return None
    out = torch.empty(r, dtype=torch.int64)
    args = (src.reshape(-1).numpy(), v.contiguous().numpy(), out.numpy(), r, k, transposed)
    parallel(lambda lo, hi, p: _mathc.mv_int8(*args, lo, hi, p), r, grain=64)
    return out


def dequant(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor,
            out: torch.Tensor, sums: bool):
    """``open1b_kernels.int8.gemm.dequantize_cpu`` of int32 ``acc`` (R, C) into ``out`` (contiguous
    float32 or bfloat16, acc's shape) by the compiled loop - the same float32 operations in
    the same order - with, when ``sums``, the exactness guard's int64 (row sums, column
    sums) of acc from the same pass. Returns (rows, cols) or () without sums; None when the
    loop is unavailable or a layout does not fit (nothing was written)."""
    if (not has("dequant") or acc.dtype != torch.int32 or not acc.is_contiguous()
            or acc.dim() != 2 or out.dtype not in (torch.float32, torch.bfloat16)
            or not out.is_contiguous() or out.shape != acc.shape):
        return None
    r, c = acc.shape
    rs = row_scale.reshape(-1).to(torch.float32).contiguous()
    cs = col_scale.reshape(-1).to(torch.float32).contiguous()
    if rs.numel() not in (1, r) or cs.numel() != c:
        return None
    bf = out.dtype == torch.bfloat16
    a, o = flat(acc), flat(out.view(torch.int16) if bf else out)
    rsn, csn = rs.numpy(), cs.numpy()
    if not sums:
        none = torch.empty(0, dtype=torch.int64).numpy()
        parallel(lambda lo, hi, p: _mathc.dequant(a, rsn, csn, o, bf, none, none, r, c, lo, hi,
                                                  p),
                 r, grain=max(1, PARALLEL_MIN // max(c, 1)))
        return ()
    rows = torch.empty(r, dtype=torch.int64)
    rr = rows.numpy()
    cols = row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: _mathc.dequant(
        a, rsn, csn, o, bf, rr, parts, r, c, lo, hi, p))
    return rows, cols
