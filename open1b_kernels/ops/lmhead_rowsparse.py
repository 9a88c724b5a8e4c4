"""A sparse int8 slice's products, row by row, into an int64 sum
(``open1b_kernels/ops/_lmhead_rowsparse.c``, which says why they are exact and where they pay):

    t[r, c] += sum over the k with a[r, k] != 0 of a[r, k] * sum_j 2^shift_j * b_j[k, c]

For the LM head's logits gradient on the integer routes (``open1b_kernels.ops.lmhead_plan``
plans which slices run so; ``add_planned`` runs them): a slice with a few nonzeros in every
row but nonzeros in most columns across the rows costs a dense product of the contraction's
length there, and each nonzero's columns here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from open1b_kernels.core.mathc import Loops, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.int8.pairmm import source

if TYPE_CHECKING:
    from open1b_kernels.ops.lmhead_plan import Plan
    from open1b_kernels.ops.lmhead_slices import LevelSlices

LOOPS = Loops("open1b_kernels.ops._opsc")    # the row-by-row products: _lmhead_rowsparse.c

MAX_B = 3          # b slices per call (the C file's MAX_B)
MAX_SHIFT = 14     # the C file's bound: one nonzero's terms always fit an int32


def available() -> bool:
    """True when the extension is built and not switched off (OPEN1B_MATHC=0 switches off
    every compiled loop)."""
    return LOOPS.available()


def fits(x: torch.Tensor) -> bool:
    """Whether ``x`` (int8, 2-D) is read in place: a unit stride along dim 1, rows apart by
    at least their width."""
    return x.dim() == 2 and x.stride(1) == 1 and x.stride(0) >= x.shape[1]


def rows_add(a: torch.Tensor, bs: list[tuple[torch.Tensor, int]], t: torch.Tensor) -> int:
    """``t`` (contiguous int64 (R, C)) += the products of ``a`` (int8 (R, K)) with
    sum_j 2^shift_j b_j for ``bs`` = [(b_j int8 (K, C), shift_j), ...] (1 to 3 of them,
    shifts 0 .. 14, all with one row stride), skipping a's zeros; a and the b_j in place
    (``fits``). Rows split among the torch threads. Returns the nonzeros of ``a``. Needs
    ``available()``."""
    r, k = a.shape
    c = t.shape[1] if t.dim() == 2 else -1
    if not (a.dtype == torch.int8 and fits(a) and t.dtype == torch.int64 and t.is_contiguous()
            and t.shape == (r, c) and 1 <= len(bs) <= MAX_B
            and all(b.dtype == torch.int8 and b.shape == (k, c) and fits(b)
                    and b.stride(0) == bs[0][0].stride(0) and 0 <= s <= MAX_SHIFT
                    for b, s in bs)):
        raise ValueError(f"rows_add needs int8 a (R, K) and 1 to {MAX_B} int8 b_j (K, C) with a "
                         f"unit stride along their rows and one row stride, shifts 0..{MAX_SHIFT}, "
                         f"and a contiguous int64 t (R, C); got a {a.dtype} {tuple(a.shape)}, "
                         f"b {[(b.dtype, tuple(b.shape), b.stride(), s) for b, s in bs]}, t "
                         f"{t.dtype} {tuple(t.shape)}")
    if not (r and k and c):
        return 0
    an, tn = flat(source(a)[0]), flat(t)          # in place: ``fits`` holds for a and b
    bn = [(flat(source(b)[0]), s) for b, s in bs]
    ldb = bs[0][0].stride(0)
    seen = [0]

    def run(lo: int, hi: int, pieces: int) -> None:
        seen.append(LOOPS.rows_add(an, r, k, a.stride(0), bn, ldb, tn, c, lo, hi, pieces))

    parallel(run, r, grain=8)
    return sum(seen)


def add_planned(sa: LevelSlices, sb: LevelSlices, p: Plan, cols: slice, t: torch.Tensor) -> None:
    """Every pair (i, j) of the slices ``p`` runs row by row (its rows of a, ``cols`` of b)
    with its weight, added into the int64 ``t``."""
    for i, pairs in p.row_pairs():
        rows_add(sa[i - 1][p.rows], [(sb[j - 1][cols].t(), shift) for j, shift in pairs], t)
