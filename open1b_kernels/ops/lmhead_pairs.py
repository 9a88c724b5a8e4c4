"""The LM head's slice products on the pair route (``open1b_kernels.int8.pairmm``): T of
``open1b_kernels.ops.lmhead``'s step 2 with a third less multiply-add work, summed in one
int64 block in the kernel.

T = sum over the slice pairs (i, j) with i + j <= S + 1 of w_ij a_i . b_j, w_ij =
2^(7(S + 1 - i - j)). The pairs (i, j) and (i + 1, j) have weights in the ratio 128, so
both are one product of b_j with the *wide* operand 128 a_i + a_(i+1): an integer of at
most 14 bits, which the pair GEMM multiplies at its int8 rate (it widens int8 to int16
anyway; ``_pairmm.c``, product64, says why the sums stay exact). Per b slice j, the a
slices i = 1 .. S + 1 - j that the plan (``open1b_kernels.ops.lmhead_plan``) runs dense go
in consecutive twos (``terms``): for S = 3, b_1 meets (a_1, a_2) wide and a_3, b_2 meets
(a_1, a_2) wide, b_3 meets a_1 - four products of length K where the level grouping
(``level_products``, the int and float routes') runs six; with slice 1 compacted (the
logits gradient, in both of its products) two where it runs three. A block's products all
add into one int64 T inside the kernel (``product_add``: each 6 x 16 register block once
per K block, not one int32 plane per level, the first K block stored instead of T zeroed),
and the block's last product rounds T into the output while each register block is
finished (no pass over T; a block with a compacted or a row-sparse slice, whose products
come last, is rounded by ``round_block`` - the same operations).

A slice with few nonzeros (``lmhead_plan.PAIR_SPARSE_MAX``: slice 3 of a Gaussian operand,
2-4% - the forward's h and weight, the weight gradient's h) runs its pairs by the sparse
loop (``lmhead_sparse``, its AVX2 path here) instead: b's always, a's where that drops a dense
product (slice 3 alone of j = 1, not a slice inside a wide one) - the forward's four products
become two and two sparse pairs, added into T before it is rounded (``_sparse_into``).

The plan's compacted slices are gathered per part of COMPACT_ROWS rows of a T block; its
row-sparse slices (slice 2 of the logits gradient in dh = dlogits W) run row by row
(``open1b_kernels.ops.lmhead_rowsparse``): the Open-1B head's dh at 1,024 tokens went from
three dense products of the vocabulary's length to one (4.6 -> 2.8 s on the Zen 3 host, the
same bits).

Packing: an operand is packed once per block and contraction chunk, and kept where it is
used again (``PACK_CACHE``): the a side's packs across the column blocks of its rows (the
forward: 4,096 hidden states against the vocabulary's column blocks), the b side's across
the row blocks (the weight gradient: the vocabulary's rows against the hidden states).
The contraction runs in chunks of at most PACK_K, so one pack stays tens of MB.

The exactness check is the int route's (``lmhead_check.check_sums``), taken on T: T's row
sums against ``sum_i a_i @ (sum_j w_ij colsum(b_j))`` and its column sums against the same for
b - the definition's pairs and weights, whatever the grouping, so a product dropped,
doubled, or given the wrong weight or operand fails it (tested). On a mismatch the failure
is recorded and the caller recomputes on the float route.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8 import pairmm
from open1b_kernels.ops import lmhead_rowsparse, lmhead_sparse
from open1b_kernels.ops.lmhead_check import check_sums
from open1b_kernels.ops.lmhead_plan import (COMPACT_ROWS, chunks, plan, sparse_slices,
                                            weight_shift)
from open1b_kernels.ops.lmhead_slices import LevelSlices

PACK_K = 8192            # contraction chunk of one pack (T sums across chunks in int64)
T_BLOCK = 1 << 23        # elements of one int64 T block (64 MB)
ROW_BLOCK = 4096         # rows of a T block (its columns: T_BLOCK / rows)
PACK_CACHE = 256 << 20   # bytes of one side's packs kept for later blocks
# Below SHORT_K contraction steps an output element costs fewer multiply-adds than T's
# bytes going to memory and back; blocks of SHORT_BLOCKS (rows, columns) keep T in cache
# (the demo head's forward, K = 128, measured with the first block stored instead of a
# zeroing pass: 81 -> 76 ms per call)
SHORT_K, SHORT_BLOCKS = 256, (512, 2048)


@dataclass(frozen=True)
class Term:
    """One product of a block: a slice ``a`` = (i,) of the a side, or (i, i + 1) for the
    wide 128 a_i + a_(i+1), against b slice ``j``, weighted 2^``shift``."""
    a: tuple[int, ...]
    j: int
    shift: int


def terms(slices: int, skip: frozenset[int] | set[int] = frozenset(),
          skip_b: frozenset[int] | set[int] = frozenset()) -> list[Term]:
    """The products covering every pair (i, j), i + j <= S + 1, whose a slice i is not in
    ``skip`` and whose b slice j is not in ``skip_b`` exactly once: per j, the a slices in
    consecutive twos (wide) and the last one alone."""
    out = []
    for j in range(1, slices + 1):
        if j in skip_b:
            continue
        ia = [i for i in range(1, slices + 2 - j) if i not in skip]
        n = 0
        while n < len(ia):
            i = ia[n]
            if n + 1 < len(ia) and ia[n + 1] == i + 1:      # w_ij = 128 w_(i+1)j
                out.append(Term((i, i + 1), j, weight_shift(slices, i + 1, j)))
                n += 2
            else:
                out.append(Term((i,), j, weight_shift(slices, i, j)))
                n += 1
    return out


class _Packs:
    """One side's packs by key (its operand, then where it lies), kept for later blocks
    while ``keep``; otherwise dropped after each use (``drop``) and written into one
    buffer per operand."""

    def __init__(self, side: str, width: int, keep: bool) -> None:
        self.side, self.width, self.keep, self.got = side, width, keep, {}

    def get(self, key: tuple, make) -> pairmm.Packed:
        if key not in self.got:
            tag = ".".join(map(str, key)) if self.keep else str(key[0])
            x, low = make()
            self.got[key] = pairmm.pack(x, self.width, f"lmhead.pack_{self.side}{tag}", low)
        return self.got[key]

    def drop(self) -> None:
        if not self.keep:
            self.got.clear()


def _a_operand(sa: LevelSlices, a: tuple[int, ...], rows: slice, k0: int, k1: int):
    x = sa[a[0] - 1][rows, k0:k1]
    return x, (sa[a[1] - 1][rows, k0:k1] if len(a) == 2 else None)


def _gathered(sa: LevelSlices, sb: LevelSlices, rows: slice, cs: slice, i: int,
              cols: torch.Tensor, slices: int, t: torch.Tensor) -> None:
    """The pairs of a's compacted slice ``i`` over its nonzero columns ``cols`` (``rows``
    of a, ``cs`` of b) added into ``t``."""
    for g0, g1 in chunks(cols.numel(), PACK_K):
        part = cols[g0:g1]
        ga = pairmm.pack(sa.gather(i, rows, part, "lmhead.gather_a"), pairmm.MR,
                         "lmhead.pack_ga")
        group = [(ga, pairmm.pack(sb.gather(j, cs, part, "lmhead.gather_b"), pairmm.NR,
                                  f"lmhead.pack_gb{j}"), weight_shift(slices, i, j))
                 for j in range(1, slices + 2 - i)]
        pairmm.product_add(group, t)


def _sparse_pairs(p, slices: int, sparse_b: frozenset[int]) -> tuple[frozenset[int],
                                                                      list[tuple[int, int, str]]]:
    """The a slices of ``p.sparse`` worth running sparse - those whose leaving the dense
    products drops one (a slice between two others only splits a wide product) - and the
    pairs (i, j, sparse side) the sparse loop runs: every pair of a dense a slice i with a
    sparse slice on either side (a's taken first)."""
    skip = set(p.compact) | set(p.by_rows)
    sparse_a: set[int] = set()
    for i in sorted(p.sparse):
        if len(terms(slices, skip | sparse_a | {i}, sparse_b)) < len(
                terms(slices, skip | sparse_a, sparse_b)):
            sparse_a.add(i)
    pairs = [(i, j, "a" if i in sparse_a else "b") for i in p.dense
             for j in range(1, slices + 2 - i) if i in sparse_a or j in sparse_b]
    return frozenset(sparse_a), pairs


def _sparse_into(sa: LevelSlices, sb: LevelSlices, pairs: list[tuple[int, int, str]],
                 rs: slice, cs: slice, slices: int, t: torch.Tensor, made: dict) -> None:
    """``t`` (int64) += the sparse ``pairs`` of the rows ``rs`` and columns ``cs``, each by
    ``lmhead_sparse`` into int32 sums - the pairs of one weight into one buffer while int32
    holds them (each pair at most K 2^14) - added with their weights. The sparse side's
    nonzeros are made once per block of it and kept in ``made``."""
    if not pairs:
        return
    k = sa.shape[2]
    per_buffer = max(1, ((1 << 31) - 1) // (k << 14))
    by_shift: dict[int, list[tuple[int, int, str]]] = {}
    for i, j, side in pairs:
        by_shift.setdefault(weight_shift(slices, i, j), []).append((i, j, side))
    acc = scratch("lmhead.sparse_acc", tuple(t.shape), torch.int32)
    for shift, group in by_shift.items():
        for g0 in range(0, len(group), per_buffer):
            for n, (i, j, side) in enumerate(group[g0:g0 + per_buffer]):
                lmhead_sparse.pair_mm(sa, sb, i, j, rs, cs, side, made, acc, add=n > 0)
            t.add_(acc, alpha=1 << shift)


def pair_blocks(sa: LevelSlices, sb: LevelSlices, rowf: torch.Tensor, colf: torch.Tensor,
                out: torch.Tensor, slices: int) -> bool:
    """T by the pair GEMM's wide products (module docstring), rounded into ``out`` as
    ``fp32(T * rowf[r] * colf[c])`` per block; True when the check holds, else the
    failure is recorded and False returned (the caller recomputes ``out``)."""
    r, c = out.shape
    k = sa.shape[2]
    rb, cb = (min(r, SHORT_BLOCKS[0]), min(c, SHORT_BLOCKS[1])) if k < SHORT_K else (
        min(r, ROW_BLOCK), min(c, max(pairmm.NR, T_BLOCK // min(r, ROW_BLOCK) // pairmm.NR
                                      * pairmm.NR)))
    kc = chunks(k, PACK_K)
    rows_got = torch.zeros(r, dtype=torch.int64)
    cols_got = torch.zeros(c, dtype=torch.int64)
    # b's packs kept across row blocks when there are several and all of them fit
    b_side = _Packs("b", pairmm.NR, r > rb and c * k * slices * 2 <= PACK_CACHE)
    # b's sparse slices, over all its rows (the weight's slice 3 in the forward)
    sparse_b = sparse_slices(sb, slice(0, c), range(1, slices + 1), k, pairs=True)
    made: dict[tuple, lmhead_sparse.SparseRows] = {}
    for r0 in range(0, r, rb):
        rs = slice(r0, r0 + rb)
        nr = min(r, r0 + rb) - r0
        # compacted per COMPACT_ROWS rows (a union over fewer rows has fewer columns); the
        # slices compacted in every part leave the dense products, and so do the sparse
        # ones' pairs (a's slice 3 in the forward, h's in the weight gradient)
        p = plan(sa, sb, rs, slices, part_rows=COMPACT_ROWS, sparse=True, pairs=True)
        sparse_a, sparse = _sparse_pairs(p, slices, sparse_b)
        made = {key: got for key, got in made.items() if key[0] == "b"}   # a's: this block's
        dense = terms(slices, p.compact | set(p.by_rows) | sparse_a, sparse_b)
        wide_ops = {t.a for t in dense}
        a_side = _Packs("a", pairmm.MR, c > cb and nr * k * len(wide_ops) * 2 <= PACK_CACHE)
        for c0 in range(0, c, cb):
            cs = slice(c0, c0 + cb)
            nc = min(c, c0 + cb) - c0
            t = scratch("lmhead.pair_t", (nr, nc), torch.int64)
            rounding = (rowf[rs], colf[cs], out[rs], c0, rows_got[rs], cols_got[cs])
            if not dense:             # every slice compacted or row-sparse: no dense product
                t.zero_()
            for n, (k0, k1) in enumerate(kc if dense else []):
                group = [(a_side.get((t_.a, n), lambda t_=t_: _a_operand(sa, t_.a, rs, k0, k1)),
                          b_side.get((t_.j, c0, n), lambda t_=t_: (sb[t_.j - 1][cs, k0:k1], None)),
                          t_.shift) for t_ in dense]
                # the block's last product rounds T in the kernel (no pass over T)
                last = n == len(kc) - 1 and not (p.compact or p.by_rows or sparse)
                pairmm.product_add(group, t, start=n == 0, rounding=rounding if last else None)
                a_side.drop()
                b_side.drop()
            for part, got in p.parts:
                tp = t[part.start - r0:part.stop - r0]
                for i in sorted(p.compact):
                    _gathered(sa, sb, part, cs, i, got[i], slices, tp)
            lmhead_rowsparse.add_planned(sa, sb, p, cs, t)
            _sparse_into(sa, sb, sparse, rs, cs, slices, t, made)
            if p.compact or p.by_rows or sparse or not dense:
                pairmm.round_block(t, *rounding)
    return check_sums(sa, sb, rows_got, cols_got, slices, "pair products")
