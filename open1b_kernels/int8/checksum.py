"""Exact checksums of integer GEMM results (the per-result half of ``open1b_kernels.int8.gemm``'s
exactness guard; the start-up probe and the route decision stay there).

``acc = a @ b.T`` of int8 operands is checked by its row and column sums against
``a @ colsum(b)`` and ``rowsum(a) @ b``, computed exactly: in float64 through the BLAS while
every value is an integer below 2^53 (``_sum_dtype``), else in int64.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel, row_pieces


def _sum_dtype(k: int, m: int, n: int) -> torch.dtype:
    """float64 when every checksum value is an integer below 2^53 - |a|, |b| <= 2^7, so a
    row sum of acc or of a @ colsum(b) is at most 2^14 K max(M, N) - else int64. float64
    sums of such integers are exact in any order, and its matrix-vector products run in the
    BLAS (torch's int64 ones do not: they cost more than the VNNI GEMM they check)."""
    return torch.float64 if (k * max(m, n, 1)) << 14 < 1 << 53 else torch.int64


CHECK_ELEMS = 1 << 18  # int8 elements widened per piece of a checksum product (L2-sized)
LOOPS = Loops("open1b_kernels.int8._int8c")    # the sums compiled: _checksum.c


def _sums_compiled(x: torch.Tensor, want_rows: bool = True, want_cols: bool = True):
    """(row sums (R,) or None, column sums (C,) or None) in int64 of a contiguous int32 or
    int8 (R, C) CPU matrix by the compiled loop - exact integer sums, the values of torch's
    ``x.sum(dim, dtype=torch.int64)`` - or None when the loop is unavailable or ``x`` is not
    contiguous (the caller then sums with torch)."""
    if (not LOOPS.available() or x.device.type != "cpu"
            or x.dtype not in (torch.int32, torch.int8) or x.dim() != 2
            or not x.is_contiguous() or not (want_rows or want_cols)):
        return None
    r, c = x.shape
    rows = torch.empty(r if want_rows else 0, dtype=torch.int64)
    src, rr, is_int8 = flat(x), rows.numpy(), x.dtype == torch.int8
    if not want_cols:
        empty = none(torch.int64)
        parallel(lambda lo, hi, p: LOOPS.int_sums(src, is_int8, rr, empty, r, c, lo, hi, p), r,
                 grain=max(1, PARALLEL_MIN // max(c, 1)))
        return rows, None
    cols = row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: LOOPS.int_sums(
        src, is_int8, rr, parts, r, c, lo, hi, p))
    return (rows if want_rows else None), cols


def _mv_compiled(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """``x @ v`` in int64 for an int8 (R, K) CPU matrix - row-major or a transposed view of a
    row-major one - and an int64 vector (K,): the exactness guard's products, exact while
    every sum stays below 2^63 (the caller's bound). None when the loop is unavailable or
    the layout is neither."""
    if (not LOOPS.available() or x.device.type != "cpu"
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
    parallel(lambda lo, hi, p: LOOPS.mv_int8(*args, lo, hi, p), r, grain=64)
    return out


def row_col_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact int64 (row sums, column sums) of an integer matrix: one compiled pass
    (``_sums_compiled``) where available, else torch's two reductions."""
    fast = _sums_compiled(x)
    if fast is not None:
        return fast
    return x.sum(1, dtype=torch.int64), x.sum(0, dtype=torch.int64)


def col_sums(x: torch.Tensor) -> torch.Tensor:
    """Exact int64 column sums of an integer matrix (row-major or a transposed view)."""
    fast = _sums_compiled(x, want_rows=False)
    if fast is None and x.dim() == 2:
        # a transposed view: its storage's row sums (and no column sums)
        fast = _sums_compiled(x.t(), want_cols=False)
        if fast is not None:
            return fast[0]
    return fast[1] if fast is not None else x.sum(0, dtype=torch.int64)


def _mv(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x (R, K) int8 (any strides) @ v (K,) in v's dtype, exact (``_sum_dtype``), widening x
    a block at a time so the widened copy stays in cache: blocks of whole rows when x is
    row-major (each row's sum done in one product), of columns when it is a transposed
    view (the rows of its storage), so every block is read contiguously."""
    r, k = x.shape
    fast = _mv_compiled(x, v.to(torch.int64)) if x.dtype == torch.int8 else None
    if fast is not None:      # exact int64 sums (the values of v are integers): the same values
        return fast.to(v.dtype)
    if x.stride(-1) == 1 or k <= 1:
        out = torch.empty(r, dtype=v.dtype)
        step = max(1, CHECK_ELEMS // max(k, 1))
        for r0 in range(0, r, step):
            out[r0:r0 + step] = torch.mv(x[r0:r0 + step].to(v.dtype), v)
        return out
    out = torch.zeros(r, dtype=v.dtype)
    step = max(1, CHECK_ELEMS // max(r, 1))
    for k0 in range(0, k, step):
        out += torch.mv(x[:, k0:k0 + step].to(v.dtype), v[k0:k0 + step])
    return out


def checksum_ok(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, sums=None) -> bool:
    """Exact row and column sums of ``acc`` = a @ b.T against ``a @ colsum(b)`` and
    ``rowsum(a) @ b`` (exact: ``_sum_dtype``). O((M + N) K) work. ``sums``: acc's int64
    (row sums, column sums) when the caller already has them (the compiled dequantization
    of ``open1b_kernels.int8.gemm``)."""
    dt = _sum_dtype(a.shape[1], a.shape[0], b.shape[0])
    bs = col_sums(b).to(dt)                                # (K,)
    as_ = col_sums(a).to(dt)                               # (K,)
    acc_rows, acc_cols = sums if sums is not None else row_col_sums(acc)
    return bool(torch.equal(acc_rows.to(dt), _mv(a, bs))
                and torch.equal(acc_cols.to(dt), _mv(b, as_)))


class SlabCheck:
    """The checksum of many GEMMs ``acc_i = a_i @ b.T`` that share one (large) b - the row
    slabs of a weight gradient - at O(M K + M N) per slab instead of ``checksum_ok``'s
    O((M + N) K): each slab's row sums against ``a_i @ colsum(b)`` (colsum(b) once), and
    the columns once over all slabs: ``sum_i colsum(acc_i) == b @ sum_i colsum(a_i)``
    (``columns_ok``, O(N K) once). A caller that gets False from ``columns_ok`` records the
    failure (``route.record_failure``) and recomputes every slab on the float route."""

    def __init__(self, b: torch.Tensor, m_total: int) -> None:
        self.b, self.dt = b, _sum_dtype(b.shape[1], m_total, b.shape[0])
        self.bs = col_sums(b).to(self.dt)
        self.acc_cols = torch.zeros(b.shape[0], dtype=torch.int64)
        self.a_cols = torch.zeros(b.shape[1], dtype=torch.int64)

    def rows_ok(self, acc: torch.Tensor, a: torch.Tensor, sums=None) -> bool:
        """This slab's rows (``sums``: acc's (row, column) sums if already taken)."""
        acc_rows, acc_cols = sums if sums is not None else row_col_sums(acc)
        if not torch.equal(acc_rows.to(self.dt), _mv(a, self.bs)):
            return False
        self.acc_cols += acc_cols
        self.a_cols += col_sums(a)
        return True

    def columns_ok(self) -> bool:
        """The columns of all slabs checked so far (the caller records a failure)."""
        return torch.equal(self.acc_cols.to(self.dt), _mv(self.b, self.a_cols.to(self.dt)))
