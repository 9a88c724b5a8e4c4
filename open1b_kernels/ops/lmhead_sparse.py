"""One LM-head slice pair with a sparse slice, as an int32 product
(``open1b_kernels/ops/_lmhead_sparse.c``, which says why it is exact):

    out = s @ d        s: int8 (n_s, K) mostly zeros, d: int8 (K, n_d), out: int32

each operand row-major or a transposed view, as the slices' stores hold them. For the integer
route's lowest level (``open1b_kernels.ops.lmhead_plan``): a_1 b_S and a_S b_1, where a_S or
b_S holds only the elements more than 2^-7 below their row's largest. Measured on the Zen 4
(2 cores, ``python -m benchmarks.kernels.lmhead_sparse``): the VNNI loop runs a nonzero's
columns at ~1/4 of the int8 GEMM's multiply-add rate, so a pair pays below SPARSE_MAX of its
sparse slice nonzero; the plain loop (no VNNI) runs far slower and is never planned - it is
the reference the tests hold the VNNI loop to, and what runs if asked. The AVX2 loop (x86-64
with AVX2 and no VNNI: the pair route's CPUs) sums a quad's products with ``vpmaddubsw`` and
``vpmaddwd``; the pair route plans it (``open1b_kernels.ops.lmhead_pairs``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from open1b_kernels.core.mathc import Loops, flat, span
from open1b_kernels.core.pieces import parallel

if TYPE_CHECKING:     # annotations only: the slices' module does not need this one
    from open1b_kernels.ops.lmhead_slices import LevelSlices

LOOPS = Loops("open1b_kernels.ops._opsc")    # the sparse products: _lmhead_sparse.c

MAX_K = 65_536      # the C file's bound: K * 128^2 <= 2^30, each sign's sums in int32
WIDTH = 256         # the C loop's dense columns per block (the pieces' unit)


LOOP_NAMES = {"auto": 0, "plain": 1, "avx2": 2, "vnni": 3}   # the C file's loop argument


def loop() -> str:
    """The loop ``sparse_mm`` runs here by default: "vnni", "avx2" or "plain" (or "none"
    where the loops are not available)."""
    if not LOOPS.available():
        return "none"
    return {v: k for k, v in LOOP_NAMES.items()}[int(LOOPS.sparse_loop())]


def _one_unit(x: torch.Tensor) -> bool:
    """2-D with a unit stride on one side and its lines apart by at least their length."""
    return x.dim() == 2 and ((x.stride(1) == 1 and x.stride(0) >= x.shape[1])
                             or (x.stride(0) == 1 and x.stride(1) >= x.shape[0]))


@dataclass(frozen=True, eq=False)
class SparseRows:
    """The nonzeros of an int8 (rows, K) slice in the loop's form (``sparse_rows``): made
    once, multiplied against several dense blocks."""
    quads: bytes
    rows: int
    k: int


def sparse_rows(s: torch.Tensor) -> SparseRows:
    """The nonzeros of int8 ``s`` (n_s, K), read in place along whichever of its strides is
    1; 1 <= K <= MAX_K. Needs ``LOOPS.available()``."""
    n_s, k = s.shape
    if not (s.dtype == torch.int8 and _one_unit(s) and 1 <= k <= MAX_K):
        raise ValueError(f"sparse_mm needs int8 s (n_s, K) with a unit stride on one side, "
                         f"1 <= K <= {MAX_K}; got s {s.dtype} {tuple(s.shape)} {s.stride()}")
    pieces = max(1, min(torch.get_num_threads(), n_s // 64))
    return SparseRows(LOOPS.sparse_quads(flat(span(s)), n_s, k, *s.stride(), pieces), n_s, k)


def sparse_mm(s: torch.Tensor | SparseRows, d: torch.Tensor, out: torch.Tensor,
              add: bool = False, loop: str = "auto") -> torch.Tensor:
    """``out`` (int32 (n_s, n_d)) = ``s @ d`` (``add``: added to ``out``, int32 wrapping),
    skipping the zeros of ``s``: int8 ``s`` (n_s, K) - or its ``sparse_rows``, made once for
    several products - and ``d`` (K, n_d), each read in place along whichever of its strides
    is 1 (a row-major matrix or a transposed view), as is ``out`` - a transposed view of an
    (n_d, n_s) buffer stores the product transposed; 1 <= K <= MAX_K. ``loop``: "auto" (the
    best this CPU runs), or "plain", "avx2" or "vnni" by name (the same integers; a loop the
    CPU cannot run is refused). Returns ``out``. Needs ``LOOPS.available()``."""
    if loop not in LOOP_NAMES:
        raise ValueError(f"sparse_mm: loop must be one of {', '.join(LOOP_NAMES)}, got {loop!r}")
    rows = s if isinstance(s, SparseRows) else sparse_rows(s)
    n_s, k = rows.rows, rows.k
    n_d = d.shape[1] if d.dim() == 2 else -1
    if not (d.dtype == torch.int8 and out.dtype == torch.int32 and _one_unit(d)
            and _one_unit(out) and d.shape[0] == k and tuple(out.shape) == (n_s, n_d)):
        raise ValueError(f"sparse_mm needs int8 d (K, n_d) and an int32 out (n_s, n_d), each "
                         f"with a unit stride on one side, for s ({n_s}, {k}); got d {d.dtype} "
                         f"{tuple(d.shape)} {d.stride()}, out {out.dtype} {tuple(out.shape)} "
                         f"{out.stride()}")
    if not (n_s and n_d):
        return out
    dn, on = flat(span(d)), flat(span(out))

    def run(lo: int, hi: int, pieces: int) -> None:
        LOOPS.sparse_mm(rows.quads, n_s, k, dn, n_d, *d.stride(), on, *out.stride(), lo, hi,
                        pieces, int(add), LOOP_NAMES[loop])

    parallel(run, -(-n_d // WIDTH), grain=1)
    return out


def pair_mm(sa: LevelSlices, sb: LevelSlices, i: int, j: int, rs: slice, cs: slice, side: str, made: dict,
            out: torch.Tensor, add: bool = False) -> torch.Tensor:
    """``out`` (int32 (rows, cols)) = (``add``: +=) a_i b_j^T of the rows ``rs`` of the slices
    ``sa`` and the columns ``cs`` of ``sb`` (``lmhead_slices.LevelSlices``), one LM-head slice
    pair whose ``side`` ("a" or "b") is the sparse one, each slice read in place - as the
    product itself or, with b's side sparse, its transpose. The sparse side's nonzeros are
    made once per block of it and kept in ``made`` (a row block of a meets every column block,
    and back: the integer and pair routes' caches, keyed (side, slice, first row))."""
    a, b = sa[i - 1][rs], sb[j - 1][cs]
    key = (side, i, rs.start) if side == "a" else (side, j, cs.start)
    if key not in made:
        made[key] = sparse_rows(a if side == "a" else b)
    if side == "a":
        return sparse_mm(made[key], b.t(), out, add=add)
    sparse_mm(made[key], a.t(), out.t(), add=add)
    return out


