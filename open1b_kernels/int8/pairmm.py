"""The exact int8 GEMM in int16 pairs (``open1b_kernels/int8/_pairmm.c``): int32 ``a @ b.T``
at the integer speed of an x86-64 CPU with AVX2 and no int8 dot-product instruction.

The C file says why it is exact (int32 sums of int8 products below 2^31 for K <= MAX_K,
in any order) and why it is faster there than float32 GEMMs of the same integers; the
route that picks it is ``open1b_kernels.int8.route``. Both operands are packed once into
pair panels (scratch buffers reused across calls), then C's row panels are cut between the
threads: each thread sums its own rows, so the result does not depend on the cut.

For the LM head (``open1b_kernels.ops.lmhead_pairs``) the same register block also runs
*wide* A operands - two int8 slices of one element as the int16 128 x + low - and several
products at once into one int64 sum (``pack`` with ``low``, ``product_add``), optionally
rounded in the kernel (``round_block``'s operations).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.core.mathc import Loops, flat
from open1b_kernels.core.pieces import parallel, row_pieces
from open1b_kernels.core.workspace import scratch

LOOPS = Loops("open1b_kernels.int8._int8c")    # the pair GEMM: _pairmm.c

MR, NR = 6, 16     # the C file's register block: A's panels of rows, B's of columns
MAX_K = 131_071    # int32 sums of K products of at most 2^14


def available() -> bool:
    """True when the extension is built, this CPU runs it (x86-64 with AVX2) and it is not
    switched off (OPEN1B_MATHC=0 switches off every compiled loop)."""
    return LOOPS.available() and LOOPS.pair_cpu()


def source(x: torch.Tensor, gap: int = 0) -> tuple[torch.Tensor, int, int]:
    """(a contiguous 1-D int8 tensor spanning ``x``'s elements - and ``gap`` bytes more -,
    line stride, k stride) for ``x`` (int8, lines x K) with a unit stride on either side -
    row-major, a transposed view, or a block of either (a column block of a transposed
    view has neither layout whole: copying it cost more than the pair GEMM at the demo
    head's weight gradient); else a row-major copy (only without ``gap``)."""
    lines, k = x.shape
    sl, sk = x.stride()
    if not (sk == 1 or sl == 1) or min(sl, sk) < 0:
        x = x.contiguous()
        sl, sk = k, 1
    span = (lines - 1) * sl + (k - 1) * sk + 1 + gap
    flat_view = torch.empty(0, dtype=torch.int8).set_(x.untyped_storage(), x.storage_offset(),
                                                      (span,), (1,))
    return flat_view, sl, sk


@dataclass(frozen=True, eq=False)
class Packed:
    """An operand packed into pair panels (``pack``): ``lines`` x ``k`` values, ``wide``
    when each is 128 x + low of two int8 slices."""
    words: torch.Tensor
    lines: int
    k: int
    width: int
    wide: bool


def _wide_gap(x: torch.Tensor, low: torch.Tensor) -> int:
    """The byte distance from ``x`` to ``low`` when ``low`` is ``x`` moved by a positive
    distance in the same storage (two slices of one store); else 0."""
    if (low.stride() != x.stride()
            or low.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()):
        return 0
    gap = low.storage_offset() - x.storage_offset()
    return gap if gap > 0 and (x.stride(0) == 1 or x.stride(1) == 1) else 0


def pack(x: torch.Tensor, width: int, name: str, low: torch.Tensor | None = None) -> Packed:
    """``x`` (int8, lines x K: row-major, transposed or a block of either) packed into pair
    panels of ``width`` lines (MR: the A side, NR: the B side) in the scratch buffer
    ``name``; with ``low`` (int8, x's shape), the wide operand 128 x + low - exact in int16,
    and refused (ValueError) where a value is -128 (slices lie in [-127, 127]). ``low``
    is read in place where it lies at a fixed distance after ``x`` in one storage (slice
    i + 1 after slice i of one store), else both are copied side by side."""
    lines, k = x.shape
    if x.dtype != torch.int8 or x.device.type != "cpu" or not 1 <= k:
        raise ValueError(f"pack needs an int8 CPU (lines, K >= 1) matrix, got {x.dtype} "
                         f"{tuple(x.shape)} on {x.device}")
    gap = 0
    if low is not None:
        if low.dtype != torch.int8 or low.shape != x.shape:
            raise ValueError(f"pack: low must be int8 {tuple(x.shape)}, got {low.dtype} "
                             f"{tuple(low.shape)}")
        gap = _wide_gap(x, low)
        if not gap:
            both = torch.stack([x, low])                          # (2, lines, K): gap lines K
            x, gap = both[0], lines * k
    src, sl, sk = source(x, gap)
    panels = -(-lines // width)
    out = scratch(name, (panels * ((k + 1) // 2) * width,), torch.int32)
    xs, o = flat(src).view("int8"), flat(out)
    parallel(lambda lo, hi, p: LOOPS.pack(xs, o, sl, sk, lines, k, width, lo, hi, p, gap),
             panels, grain=max(1, 4096 // max(k, 1)))
    return Packed(out, lines, k, width, low is not None)


def product_add(terms: list[tuple[Packed, Packed, int]], out: torch.Tensor,
                start: bool = False, rounding: tuple | None = None) -> None:
    """``out`` (contiguous int64 (M, N)) += sum over ``terms`` (a, b, shift) of 2^shift
    a @ b.T (with ``start``: ``out`` = the sum, its contents never read), exactly
    (``_pairmm.c``, product64: each term's K block in int32, its sum in int64), for
    packed A sides (width MR) of M lines and B sides (NR) of N, all of one K. The caller
    keeps ``out`` below 2^63. With ``rounding`` = (rowf, colf, out32, c0, rows, cols) -
    ``round_block``'s arguments - the finished sum is rounded as ``round_block`` would
    round ``out`` (the same bits and sums) while each block is still in registers, and
    not stored: for the last product of a block. Needs ``available()``."""
    m, n = out.shape
    k = terms[0][0].k
    for a, b, shift in terms:
        if (a.width, b.width, a.lines, b.lines, a.k, b.k) != (MR, NR, m, n, k, k) or b.wide:
            raise ValueError(f"product_add: a term of ({a.lines}, {a.k}) x ({b.lines}, {b.k}) "
                             f"does not fit out {(m, n)} (or a wide B side)")
    if out.dtype != torch.int64 or not out.is_contiguous():
        raise ValueError("product_add: out must be contiguous int64")
    if not (m and n):
        return
    ts = [(flat(a.words), flat(b.words), int(a.wide), shift) for a, b, shift in terms]
    cn = flat(out)
    panels = -(-m // MR)
    if rounding is None:
        parallel(lambda lo, hi, p: LOOPS.product64(ts, cn, m, n, k, start, lo, hi, p),
                 panels, grain=16)
        return
    rowf, colf, o, c0, rows, cols = rounding
    fixed = (flat(rowf.contiguous()), flat(colf.contiguous()), flat(o), flat(rows))
    cols += row_pieces(panels, n, panels // 16, lambda lo, hi, parts, p: LOOPS.product64(
        ts, cn, m, n, k, start, lo, hi, p, (*fixed, parts, o.shape[1], c0)))


def round_block(t: torch.Tensor, rowf: torch.Tensor, colf: torch.Tensor, out: torch.Tensor,
                c0: int, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """``out[:, c0:c0 + C]`` = fp32((T * rowf[r]) * colf[c]) for the int64 T (R, C) (below
    2^53: exact in float64), and T's row sums added into ``rows`` (R,) and its column sums
    into ``cols`` (C,) - int64, modulo 2^64. Rows split among the torch threads."""
    r, c = t.shape
    args = (flat(t), flat(rowf.contiguous()), flat(colf.contiguous()), flat(out), flat(rows))
    cols += row_pieces(r, c, r // 16, lambda lo, hi, parts, p: LOOPS.round(
        *args, parts, r, c, out.shape[1], c0, lo, hi, p))


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
    ap, bp = pack(a, MR, "pairmm.a").words, pack(b, NR, "pairmm.b").words
    ap_n, bp_n, cn = flat(ap), flat(bp), flat(c)
    parallel(lambda lo, hi, p: LOOPS.product(ap_n, bp_n, cn, m, n, k, lo, hi, p),
             -(-m // MR), grain=16)
    return c
