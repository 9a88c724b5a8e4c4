"""The LM head's slice products on the library's integer route (``open1b_kernels.ops.lmhead``,
step 2): which int8 GEMMs one output block runs, and T from them (the pair route groups the
same pairs differently: ``open1b_kernels.ops.pair_products``).

T = sum over the slice pairs (i, j) with i + j <= S + 1 of ``a_i . b_j`` weighted by
2^(7(S + 1 - i - j)). Integer sums are exact, so any grouping of the pairs and any subset of
the contraction that holds every nonzero term gives the same T. Two groupings are used:

- **Levels** (the definition's): per level L, its pairs side by side along K, one GEMM in
  contraction chunks of K_CHUNK (p * K_CHUNK * 127^2 < 2^31 for a level's p <= 3 pairs:
  int32 never overflows).
- **Compacted slices.** A slice of ``a`` that is zero in most contraction columns of a row
  block runs its pairs over only the columns where some row of the block has a nonzero:
  a gathered (rows, K') operand against the same columns of each b_j. The logits gradient
  is the case this is for. Slice 1 of an element is nonzero only when its exponent is
  within 6 of the row's largest (step 1), so only for magnitudes above 2^-7 of the row's
  largest. A row of dlogits = p - onehot(target) (times 1/M) has its largest magnitude at
  least 1 - p_target and its magnitudes sum to 2 (1 - p_target) (the z-loss adds a small
  multiple of p), so at most 2 * 128 = 256 of its elements can have a nonzero slice 1 - at
  any point of training, among the vocabulary's 128,256 columns (measured on the demo at
  initialization: 1 per row, 961-967 columns for a block of 1,024 rows of 8,192). So dh =
  dlogits W runs the pairs of slice 1 - three of six for S = 3 - over ~1% of K.
  Slices are tried in order and the first one not sparse enough (more than COMPACT_MAX of
  K in the union) stops the search: lower slices are denser in every distribution seen.

**Row-sparse slices** (``row_sparse``): after the compacted ones, a slice of ``a`` with few
nonzeros in every row of a block but nonzeros in most columns across its rows - slice 2 of
the logits gradient in dh = dlogits W (~420 of 128,256 a row at initialization, more than
half the vocabulary over 1,024 rows) - runs its pairs row by row
(``open1b_kernels.int8.rowsparse``: each nonzero times the weighted sum of b's slices at its
k, into an int64 part of T), on both integer routes.

The exactness guard (``check_sums``) takes T's own row and column sums - whatever grouping
computed T - against the definition's pairs and weights: ``sum_i a_i @ (sum_j w_ij
colsum(b_j))`` for the rows and the same for b for the columns, so a product dropped,
doubled, or given the wrong weight or operand fails it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.core import mathc
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8 import rowsparse
from open1b_kernels.int8.checksum import _sum_dtype
from open1b_kernels.int8.route import int_mm_unchecked, record_failure
from open1b_kernels.ops.slices import LevelSlices, level_copy

K_CHUNK = 32_768  # int32 level accumulators flushed into int64 this often
INT_ROW_BLOCK = 1024  # output rows per block of the CPU integer route
INT_COL_BLOCK = 4096  # output columns per block (int64 T: 32 MB)
# Below SHORT_K contraction steps the blocks are SHORT_BLOCKS (rows, columns): each output
# element then costs fewer multiply-adds than the bytes of its level products written and
# read again, and 512 x 2,048 blocks keep those in cache (measured on the demo's head,
# K = 128: 22.9 -> 19.2 ms per forward; at K = 256 - the weight gradient of 256 tokens -
# they were 5% slower, so the line is there; the same bits either way: blocks only change
# where T is summed, never its integer value)
SHORT_K, SHORT_BLOCKS = 256, (512, 2048)
# A slice of ``a`` whose nonzero columns (over a row block) are at most this share of K runs
# compacted; gathering its operands costs O((rows + cols) K') against the GEMMs' O(rows cols
# K') that it saves at the dropped columns
COMPACT_MAX = 0.5
# A slice with at most this share of nonzeros over a block's rows runs row by row
# (``rowsparse``): a nonzero costs each of its b slices' C columns at ~7 G multiply-adds/s
# (memory-bound: one row of each b slice from a matrix that does not fit the cache), a
# product dropped from the dense plan K x C per row at the GEMM's rate, so for slice 2 (two
# b slices, two level pairs or one wide product dropped) the two meet near 1/40 on both the
# Zen 3's pair route and the Zen 4's int8 GEMM (140 and ~400 G/s against ~7 and ~10)
ROW_SPARSE_MAX = 1 / 64
# Rows apart of the rows whose nonzeros estimate a slice's share (``row_sparse``): the choice
# changes which exact grouping computes T, never T, and counting a whole 1,024-row block of
# the demo's logits gradient (a strided view of the slice store) took 3-6 ms, twice a demo
# step - every 16th row costs a sixteenth of that
ROW_SPARSE_SAMPLE = 16


def levels(slices: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(level L, its slice pairs (i, j) with i + j = L) for L = 2 .. S + 1."""
    return [(lvl, [(i, lvl - i) for i in range(1, lvl) if i <= slices and lvl - i <= slices])
            for lvl in range(2, slices + 2)]


@dataclass(frozen=True, eq=False)
class Product:
    """One int8 GEMM of a block: ``a``'s slices side by side along K against ``b``'s paired
    ones, over the contraction range [k0, k1) or (compacted) the columns ``cols``."""
    a: tuple[int, ...]
    b: tuple[int, ...]
    weight: float
    k0: int = 0
    k1: int = 0
    cols: torch.Tensor | None = None


def nonzero_cols(sa: LevelSlices, i: int, rows: slice) -> torch.Tensor:
    """The contraction columns where slice ``i`` of ``rows`` has a nonzero, ascending (int64)."""
    plane = sa[i - 1][rows].view(torch.uint8)      # nonzero int8 <=> nonzero byte
    return torch.nonzero(plane.amax(0)).flatten()


def compacted(sa: LevelSlices, rows: slice, slices: int) -> dict[int, torch.Tensor]:
    """{slice i: its nonzero columns over ``rows``} for the leading slices of ``a`` with at
    most COMPACT_MAX of K nonzero, tried in order until the first that is not. A union of
    fewer than two columns is padded with zero columns (the library's GEMM needs K >= 2)."""
    k = sa.shape[2]
    out: dict[int, torch.Tensor] = {}
    if k < 2:
        return out
    for i in range(1, slices + 1):
        cols = nonzero_cols(sa, i, rows)
        if cols.numel() > COMPACT_MAX * k:
            break
        if cols.numel() < 2:
            cols = torch.unique(torch.cat([cols, torch.tensor([0, 1])]))
        out[i] = cols
    return out


def weight_shift(slices: int, i: int, j: int) -> int:
    """log2 of w_ij = 2^(7(S + 1 - i - j))."""
    return 7 * (slices + 1 - i - j)


def row_sparse(sa: LevelSlices, sb: LevelSlices, rows: slice, slices: int,
               skip: set[int]) -> list[int]:
    """The slices of ``a`` after the compacted ones (``skip``), in order while they last,
    with at most ROW_SPARSE_MAX of their elements over ``rows`` nonzero (estimated from every
    ROW_SPARSE_SAMPLE-th row): their pairs run
    row by row (``rows_sparse_add``). None of them where the extension is missing or a or b
    is not read in place there: a's slices need their rows contiguous and b's the contraction
    as their rows (dh = dlogits W has both; the forward's b, the weight, and the weight
    gradient's a, dlogits^T, do not)."""
    if not (rowsparse.available() and rowsparse.fits(sa[0][rows]) and rowsparse.fits(sb[0].t())):
        return []
    out = []
    for i in range(1, slices + 1):
        if i in skip:
            continue
        plane = sa[i - 1][rows][::ROW_SPARSE_SAMPLE]
        if torch.count_nonzero(plane) > ROW_SPARSE_MAX * plane.numel():
            break
        out.append(i)
    return out


def rows_sparse_add(sa: LevelSlices, sb: LevelSlices, rows: slice, cols: slice, slices: int,
                    sparse: list[int], t: torch.Tensor) -> None:
    """Every pair (i, j) of the row-sparse slices i in ``sparse`` (``rows`` of a, ``cols``
    of b) with its weight, added into the int64 ``t``."""
    for i in sparse:
        rowsparse.rows_add(sa[i - 1][rows], [(sb[j - 1][cols].t(), weight_shift(slices, i, j))
                                             for j in range(1, slices + 2 - i)], t)


def check_sums(sa: LevelSlices, sb: LevelSlices, rows_got: torch.Tensor,
               cols_got: torch.Tensor, slices: int, what: str) -> bool:
    """T's row and column sums (``rows_got``, ``cols_got``) against the definition's
    (module docstring): exact in float64 while every value is below 2^53 (|T| < 2^28 K),
    else int64 modulo 2^64. On a mismatch the failure is recorded (the process moves to the
    float route) and False returned: the caller recomputes."""
    r, c, k = rows_got.numel(), cols_got.numel(), sa.shape[2]
    dt = _sum_dtype(k << 14, r, c)
    col_a = [x.to(dt) for x in sa.col_sums()]
    col_b = [x.to(dt) for x in sb.col_sums()]

    def w(i: int, j: int) -> int:
        return 1 << weight_shift(slices, i, j)

    # every pair (i, j) once with its weight, whatever grouping computed T
    v_a = [sum(col_b[j - 1] * w(i, j) for j in range(1, slices + 2 - i))
           for i in range(1, slices + 1)]
    v_b = [sum(col_a[i - 1] * w(i, j) for i in range(1, slices + 2 - j))
           for j in range(1, slices + 1)]
    if torch.equal(rows_got.to(dt), sa.mv(v_a)) and torch.equal(cols_got.to(dt), sb.mv(v_b)):
        return True
    record_failure(f"checksum failed on the LM head's {what} ({r}x{k}x{c})")
    return False


def chunks(k: int) -> list[tuple[int, int]]:
    """[k0, k1) ranges of at most K_CHUNK covering [0, k), of equal length within one: never
    a one-column tail (the library's GEMM needs K >= 2, and a refused layout would send the
    whole product to the float route)."""
    n = -(-k // K_CHUNK)
    return [(k * i // n, k * (i + 1) // n) for i in range(n)]


def block_products(slices: int, k: int, sparse: dict[int, torch.Tensor],
                   by_rows: frozenset[int] | set[int] = frozenset()) -> list[Product]:
    """The GEMMs of one block: every level's pairs whose a slice is neither compacted nor
    row-sparse (``by_rows``), per contraction chunk, then each compacted slice's pairs over
    its columns (in chunks of at most K_CHUNK: one pair per GEMM, so int32 holds them)."""
    out = []
    for lvl, pairs in levels(slices):
        dense = [(i, j) for i, j in pairs if i not in sparse and i not in by_rows]
        if dense:
            weight = float(1 << (7 * (slices + 1 - lvl)))
            out += [Product(tuple(i for i, _ in dense), tuple(j for _, j in dense), weight,
                            k0, k1) for k0, k1 in chunks(k)]
    for i, cols in sparse.items():
        for c0, c1 in chunks(cols.numel()):
            part = cols[c0:c1]
            out += [Product((i,), (j,), float(1 << (7 * (slices + 1 - i - j))), cols=part)
                    for j in range(1, slices + 2 - i)]
    return out


def operand(s: LevelSlices, which: tuple[int, ...], rows: slice, p: Product, whole: bool,
            name: str) -> torch.Tensor:
    """The (n, K_p) operand of ``p`` for the rows ``rows`` of ``s``: a view of the
    level-ready store where ``which`` lies side by side there and ``p`` spans the whole
    contraction (``whole``), a chunk's copy (``level_copy``), or the gathered columns."""
    if p.cols is not None:
        return s.gather(which[0], rows, p.cols, name)
    if whole:
        view = s.run(which, rows)
        if view is not None:
            return view
    return level_copy(s, list(which), rows, p.k0, p.k1, name)


def int_blocks(sa: LevelSlices, sb: LevelSlices, rowf: torch.Tensor, colf: torch.Tensor,
               out: torch.Tensor, slices: int) -> bool:
    """T of step 2 by the library's int8 GEMM (``open1b_kernels.int8.route``'s "int" route, picked
    on CPUs with an int8 dot-product instruction, where it ran 2.8-4.3x a float32 GEMM on the
    Zen 4 and 6-9x on the Zen 5), per
    output block the products of ``block_products`` (and the row-sparse slices' pairs, into
    an int64 part of T), added into an exact float64 T with their weights and rounded once
    into ``out`` (``fp32(T * rowf[r] * colf[c])``) - exact integers, so the float path's bits.

    Checked as every integer-route result is, but once per call instead of per block: T's
    row and column sums, accumulated over the output blocks, against the definition's
    (``check_sums``) - S exact matrix-vector products per operand (O((R + C) K S)) against
    the GEMMs' O(R C K S (S + 1) / 2). On a mismatch the failure is counted, the process
    switches to the float route and False is returned: the caller recomputes ``out``. False
    too (not a fault) where the library refuses a layout.
    """
    r, c = out.shape
    k = sa.shape[2]
    compiled = mathc.has("levels_round_weighted")
    rows_got = torch.zeros(r, dtype=torch.int64)
    cols_got = torch.zeros(c, dtype=torch.int64)
    whole = k <= K_CHUNK
    row_block, col_block = SHORT_BLOCKS if k < SHORT_K else (INT_ROW_BLOCK, INT_COL_BLOCK)
    once = r <= row_block
    plans: dict[int, tuple] = {}         # per row block: (its products, its row-sparse slices)
    for c0 in range(0, c, col_block):
        cs = slice(c0, c0 + col_block)
        # with one row block each b operand is used once: built when used, into one buffer
        # (all of them at once are twice the slices: 1.6 GB for the head weight's
        # transpose); with several, a level's chunk operand is kept for the column block
        kept: dict[tuple, torch.Tensor] = {}
        for r0 in range(0, r, row_block):
            rs = slice(r0, r0 + row_block)
            nr, nc = min(r, r0 + row_block) - r0, min(c, c0 + col_block) - c0
            if r0 not in plans:
                found = compacted(sa, rs, slices)
                by_rows = row_sparse(sa, sb, rs, slices, set(found))
                plans[r0] = (block_products(slices, k, found, set(by_rows)), by_rows)
            products, by_rows = plans[r0]
            accs = scratch("lmhead.accs", (len(products), nr, nc), torch.int32)
            gathered = None
            for n, p in enumerate(products):
                if p.cols is not None:
                    if gathered is None or gathered[0] is not p.cols:   # one per slice chunk
                        gathered = (p.cols, operand(sa, p.a, rs, p, whole, "lmhead.gather_a"))
                    al = gathered[1]
                    bl = operand(sb, p.b, cs, p, whole, "lmhead.gather_b")
                else:
                    al = operand(sa, p.a, rs, p, whole, "lmhead.op_a")
                    if once:
                        bl = operand(sb, p.b, cs, p, whole, "lmhead.op_b")
                    else:
                        key = (p.b, p.k0)
                        if key not in kept:
                            kept[key] = operand(sb, p.b, cs, p, whole, f"lmhead.op_b{len(kept)}")
                        bl = kept[key]
                if int_mm_unchecked(al, bl, out=accs[n]) is None:
                    return False                # a layout the library refuses: not a fault
            base = None
            if by_rows:
                base = scratch("lmhead.rows_t", (nr, nc), torch.int64).zero_()
                rows_sparse_add(sa, sb, rs, cs, slices, by_rows, base)
            weights = [p.weight for p in products]
            if compiled:
                mathc.levels_round(accs, weights, rowf[rs], colf[cs], out[rs], c0,
                                   rows_got[rs], cols_got[cs], base)
                continue
            # T exactly in float64 (integers below 2^53) and in int64 modulo 2^64 (its sums)
            t = torch.zeros((nr, nc), dtype=torch.float64) if base is None else base.double()
            u = torch.zeros((nr, nc), dtype=torch.int64) if base is None else base.clone()
            for acc, weight in zip(accs, weights):
                t.add_(acc, alpha=weight)
                u.add_(acc.to(torch.int64) * int(weight))
            rows_got[rs] += u.sum(1)
            cols_got[cs] += u.sum(0)
            out[rs, cs] = t.mul_(rowf[rs, None]).mul_(colf[None, cs])
    return check_sums(sa, sb, rows_got, cols_got, slices, "slice products")
