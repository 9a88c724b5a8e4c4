"""The exact int8 GEMM in int16 pairs (``open1b_kernels/int8/_pairmm.c``): int32 ``a @ b.T``
at the integer speed of an x86-64 CPU with AVX2 and no int8 dot-product instruction.

The C file says why it is exact (int32 sums of int8 products below 2^31 for K <= MAX_K,
in any order) and why it is faster there than float32 GEMMs of the same integers; the
route that picks it is ``open1b_kernels.int8.route``. Both operands are packed once into
pair panels (scratch buffers reused across calls), then C's row panels are cut between the
threads: each thread sums its own rows, so the result does not depend on the cut.
"""
from __future__ import annotations

import os

import torch

from open1b_kernels.core.mathc import flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.workspace import scratch

try:
    from open1b_kernels.int8 import _pairmm
except ImportError:  # pragma: no cover - the extension is optional
    _pairmm = None

MR, NR = 6, 16     # the C file's register block: A's panels of rows, B's of columns
MAX_K = 131_071    # int32 sums of K products of at most 2^14


def available() -> bool:
    """True when the extension is built, this CPU runs it (x86-64 with AVX2) and it is not
    switched off (OPEN1B_MATHC=0 switches off every compiled loop)."""
    return (_pairmm is not None and os.environ.get("OPEN1B_MATHC", "1") != "0"
            and _pairmm.available())


def _source(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(a contiguous 1-D int8 tensor spanning ``x``'s elements, line stride, k stride) for
    ``x`` (int8, lines x K) with a unit stride on either side - row-major, a transposed
    view, or a block of either (a column block of a transposed view has neither layout
    whole: copying it cost more than the pair GEMM at the demo head's weight gradient);
    else a row-major copy."""
    lines, k = x.shape
    sl, sk = x.stride()
    if not (sk == 1 or sl == 1) or min(sl, sk) < 0:
        x = x.contiguous()
        sl, sk = k, 1
    span = (lines - 1) * sl + (k - 1) * sk + 1
    flat_view = torch.empty(0, dtype=torch.int8).set_(x.untyped_storage(), x.storage_offset(),
                                                      (span,), (1,))
    return flat_view, sl, sk


def _pack(x: torch.Tensor, width: int, name: str) -> torch.Tensor:
    lines, k = x.shape
    src, sl, sk = _source(x)
    panels = -(-lines // width)
    out = scratch(name, (panels * ((k + 1) // 2) * width,), torch.int32)
    xs, o = flat(src).view("int8"), flat(out)
    parallel(lambda lo, hi, p: _pairmm.pack(xs, o, sl, sk, lines, k, width, lo, hi, p), panels,
             grain=max(1, 4096 // max(k, 1)))
    return out


def pair_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact int32 ``a @ b.T`` of int8 (M, K) and (N, K) CPU matrices (row-major or
    transposed views), 1 <= K <= MAX_K, into ``out`` (contiguous int32 (M, N)) when given.
    Needs ``available()``."""
    m, k = a.shape
    n = b.shape[0]
    if (a.dtype != torch.int8 or b.dtype != torch.int8 or b.shape[1] != k
            or a.device.type != "cpu" or b.device.type != "cpu"):
        raise ValueError(f"pair_mm needs int8 (M, K) and (N, K) CPU matrices, got {a.dtype} "
                         f"{tuple(a.shape)} on {a.device} and {b.dtype} {tuple(b.shape)} "
                         f"on {b.device}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"pair_mm: K = {k} outside [1, {MAX_K}] (int32 sums stay exact)")
    c = out if out is not None else torch.empty((m, n), dtype=torch.int32)
    if out is not None and (out.dtype != torch.int32 or out.shape != (m, n)
                            or not out.is_contiguous()):
        raise ValueError(f"pair_mm: out must be contiguous int32 {(m, n)}")
    if not (m and n):
        return c
    ap, bp = _pack(a, MR, "pairmm.a"), _pack(b, NR, "pairmm.b")
    ap_n, bp_n, cn = flat(ap), flat(bp), flat(c)
    parallel(lambda lo, hi, p: _pairmm.product(ap_n, bp_n, cn, m, n, k, lo, hi, p),
             -(-m // MR), grain=16)
    return c
