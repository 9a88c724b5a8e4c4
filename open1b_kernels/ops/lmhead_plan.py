"""The LM head's plan on the CPU: how each row block of ``a`` runs its slice pairs, the same
for every route (``open1b_kernels.ops.lmhead``, step 2).

T = sum over the slice pairs (i, j) with i + j <= S + 1 of ``a_i . b_j`` weighted by
2^(7(S + 1 - i - j)) (``weight_shift``). Integer sums are exact, so any grouping of the
pairs, and any subset of the contraction that holds every nonzero term, gives the same T.
Per row block, each slice i of ``a`` runs its pairs one of three ways (``plan``):

- **Compacted** (``compacted``): a slice that is zero in most contraction columns of the
  block runs over only the columns where some row of the block has a nonzero - a gathered
  (rows, K') operand against the same columns of each b_j. The logits gradient is the case
  this is for. Slice 1 of an element is nonzero only when its exponent is within 6 of the
  row's largest (step 1), so only for magnitudes above 2^-7 of the row's largest. A row of
  dlogits = p - onehot(target) (times 1/M) has its largest magnitude at least
  1 - p_target and its magnitudes sum to 2 (1 - p_target) (the z-loss adds a small multiple
  of p), so at most 2 * 128 = 256 of its elements can have a nonzero slice 1 - at any point
  of training, among the vocabulary's 128,256 columns (measured on the demo at
  initialization: 1 per row, 961-967 columns for a block of 1,024 rows of 8,192). So
  dh = dlogits W runs the pairs of slice 1 - three of six for S = 3 - over ~1% of K.
  Slices are tried in order and the first one not sparse enough (more than COMPACT_MAX of
  K in the union) stops the search: lower slices are denser in every distribution seen. A
  block of more than ``part_rows`` rows is compacted per part (a union over fewer rows has
  fewer columns); a slice runs compacted only where every part compacts it.
- **Row by row** (``row_sparse``, after the compacted slices): a slice with few nonzeros
  in every row of the block but nonzeros in most columns across its rows - slice 2 of the
  logits gradient in dh = dlogits W, nonzero where a row gives a token more than ~2^-14 of
  its largest magnitude: ~420 of 128,256 a row at initialization, more than half the
  vocabulary over 1,024 rows - runs its pairs row by row (``lmhead_rowsparse``: each
  nonzero times the weighted sum of b's slices at its k, into an int64 part of T).
- **Dense**: every other slice, over the whole contraction - except, on the "int" route
  where the VNNI loop runs, a dense slice of ``a`` (``Plan.sparse``) or ``b`` (``sparse_b``
  of ``level_products``) with few nonzeros: its pairs run one by one (``lmhead_sparse``,
  each nonzero against the other slice's row) and add onto their level's int32 sums. The
  case: slice S of a Gaussian operand (the forward's h and w, the weight gradient's h^T)
  holds only the elements more than 2^-7 below their row's largest - 2-4% - so the lowest
  level's a_1 b_S and a_S b_1 cost a few percent of their GEMMs.

What runs behind the plan is the route's, one per CPU class (``open1b_kernels.int8.route``):
the library's int8 GEMM (``lmhead_int``) and the float route (``lmhead_float``) group the
dense pairs by level (``level_products``), the pair GEMM two a slices at a time
(``lmhead_pairs.terms``). The float route plans no row-sparse slices (that loop is integer
arithmetic, the float route the fallback that must run anywhere) and, having no checksum,
verifies its compacted unions (``lmhead_check.verified``); the integer routes' checksum
(``lmhead_check.check_sums``) covers every grouping.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.ops import lmhead_rowsparse, lmhead_sparse
from open1b_kernels.ops.lmhead_slices import LevelSlices

K_CHUNK = 32_768  # int32 level accumulators flushed into int64 this often
# A slice of ``a`` whose nonzero columns (over a row block) are at most this share of K runs
# compacted; gathering its operands costs O((rows + cols) K') against the GEMMs' O(rows cols
# K') that it saves at the dropped columns
COMPACT_MAX = 0.5
COMPACT_ROWS = 1024  # rows over which a slice's nonzero columns are gathered (pair route)
# A slice with at most this share of nonzeros over a block's rows runs row by row
# (``lmhead_rowsparse``): a nonzero costs each of its b slices' C columns at ~7 G
# multiply-adds/s (memory-bound: one row of each b slice from a matrix that does not fit the
# cache), a product dropped from the dense plan K x C per row at the GEMM's rate, so for
# slice 2 (two b slices, two level pairs or one wide product dropped) the two meet near 1/40
# on both the Zen 3's pair route and the Zen 4's int8 GEMM (140 and ~400 G/s against ~7 and
# ~10)
ROW_SPARSE_MAX = 1 / 64
# The same bound where the dense products run on AMX tiles (``int_gemm_route() == "amx"``),
# at several times the rate of the GEMMs above while a nonzero still costs a row of each b
# slice from memory: measured on the 2-core AMX Xeon VM at dh's row block (1,024 rows of
# dlogits' slice 2 against the weight's slices 1 and 2, K = 128,256), row by row against
# the two dense pairs on the tiles, their A operand's packing timed
# (``benchmarks.kernels.lmhead_levels --part rows``): 256 / 209 ms at 420 nonzeros a row
# (1/306: the head at initialization), 544 / 211 at 1,000, 979 / 211 at 2,000 - they meet
# near 1/360, the weight's slice 2 packed once more for the dense pairs (~8 ms a block)
ROW_SPARSE_MAX_TILES = 1 / 384
# Rows apart of the rows whose nonzeros estimate a slice's share (``row_sparse``): the choice
# changes which exact grouping computes T, never T, and counting a whole 1,024-row block of
# the demo's logits gradient (a strided view of the slice store) took 3-6 ms, twice a demo
# step - every 16th row costs a sixteenth of that
ROW_SPARSE_SAMPLE = 16
# A dense-planned slice with at most this share of nonzeros (sampled as above) runs each of
# its pairs as one sparse product (``lmhead_sparse``) instead of in its level's GEMM - on
# the "int" route only, where the VNNI loop runs. Measured on the Zen 4 (2 cores,
# ``benchmarks.kernels.lmhead_sparse``) at the head's blocks, one pair's GEMM ~20 ms: the
# sparse pair with its slice as the rows 2.5-2.9 ms + ~0.85 ms per 1% of nonzeros, as the
# columns (stored transposed) 3.6-4.3 ms + ~1.0-1.2 ms per 1%: even near 1/8 and 1/7;
# 1/16 keeps 1.5x or more. The slice it is for: a_S of a Gaussian operand (the head's input, its
# weight) holds only the elements more than 2^-7 below their row's largest, 2-4% of them,
# so a_1 b_S and a_S b_1 (two of the lowest level's three pairs) run 2.5-4x faster
SPARSE_MAX = 1 / 16
# The same on the pair route (``lmhead_pairs``, CPUs without VNNI: the AVX2 loop against the
# pair GEMM). Measured on the Zen 4 with the loops built as an AVX2 CPU (2 cores,
# ``benchmarks.kernels.lmhead_sparse --loop avx2 --anchor pairs``, 2026-12-06), one pair's
# GEMM 55-100 ms at the head's blocks: the sparse pair 5.5-9.1x faster at 3% nonzeros,
# 2.5-2.8x at 12.5%, 1.4-1.9x at 25% - so 1/8 keeps 2.5x or more
PAIR_SPARSE_MAX = 1 / 8


def weight_shift(slices: int, i: int, j: int) -> int:
    """log2 of w_ij = 2^(7(S + 1 - i - j))."""
    return 7 * (slices + 1 - i - j)


def levels(slices: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(level L, its slice pairs (i, j) with i + j = L) for L = 2 .. S + 1."""
    return [(lvl, [(i, lvl - i) for i in range(1, lvl) if i <= slices and lvl - i <= slices])
            for lvl in range(2, slices + 2)]


def chunks(k: int, size: int | None = None) -> list[tuple[int, int]]:
    """[k0, k1) ranges of at most ``size`` (default K_CHUNK) covering [0, k), of equal length
    within one: never a one-column tail (the library's GEMM needs K >= 2, and a refused layout
    would send the whole product to the float route)."""
    n = -(-k // (size or K_CHUNK))
    return [(k * i // n, k * (i + 1) // n) for i in range(n)]


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


def sparse_share(x: LevelSlices, i: int, rows: slice) -> float:
    """The share of nonzeros in slice ``i`` of ``rows`` (every ROW_SPARSE_SAMPLE-th row)."""
    plane = x[i - 1][rows][::ROW_SPARSE_SAMPLE]
    return float(torch.count_nonzero(plane)) / max(1, plane.numel())


def sparse_slices(x: LevelSlices, rows: slice, candidates, k: int,
                  pairs: bool = False) -> frozenset[int]:
    """Of the slices ``candidates``, those of ``rows`` with at most SPARSE_MAX nonzeros, where
    ``lmhead_sparse`` runs its VNNI loop and takes a contraction of ``k``; else none. With
    ``pairs`` (the pair route): at most PAIR_SPARSE_MAX, where its AVX2 or VNNI loop runs."""
    loops, most = (("avx2", "vnni"), PAIR_SPARSE_MAX) if pairs else (("vnni",), SPARSE_MAX)
    if not (lmhead_sparse.loop() in loops and k <= lmhead_sparse.MAX_K):
        return frozenset()
    return frozenset(i for i in candidates if sparse_share(x, i, rows) <= most)


def row_sparse(sa: LevelSlices, sb: LevelSlices, rows: slice, slices: int,
               skip: set[int] | frozenset[int], most: float | None = None) -> list[int]:
    """The slices of ``a`` after the compacted ones (``skip``), in order while they last,
    with at most ``most`` (default ROW_SPARSE_MAX) of their elements over ``rows`` nonzero
    (estimated from every ROW_SPARSE_SAMPLE-th row). None of them where the extension is
    missing or a or b is not read in place there: a's slices need their rows contiguous and
    b's the contraction as their rows (dh = dlogits W has both; the forward's b, the weight,
    and the weight gradient's a, dlogits^T, do not)."""
    if not (lmhead_rowsparse.available() and lmhead_rowsparse.fits(sa[0][rows])
            and lmhead_rowsparse.fits(sb[0].t())):
        return []
    out = []
    for i in range(1, slices + 1):
        if i in skip:
            continue
        plane = sa[i - 1][rows][::ROW_SPARSE_SAMPLE]
        if torch.count_nonzero(plane) > (most or ROW_SPARSE_MAX) * plane.numel():
            break
        out.append(i)
    return out


@dataclass(frozen=True, eq=False)
class Plan:
    """How the row block ``rows`` of ``a`` runs (module docstring): ``parts`` holds, per
    part of the block, {slice i: its nonzero columns there} for the slices compacted in that
    part; ``by_rows`` the slices run row by row."""
    rows: slice
    slices: int
    parts: tuple[tuple[slice, dict[int, torch.Tensor]], ...]
    by_rows: tuple[int, ...] = ()
    sparse: frozenset[int] = frozenset()    # dense slices whose pairs run by lmhead_sparse

    @property
    def compact(self) -> frozenset[int]:
        """The slices compacted in every part: their pairs run gathered, part by part."""
        return frozenset.intersection(*(frozenset(got) for _, got in self.parts))

    @property
    def dense(self) -> tuple[int, ...]:
        """The slices whose pairs run over the whole contraction."""
        return tuple(i for i in range(1, self.slices + 1)
                     if i not in self.compact and i not in self.by_rows)

    def columns(self) -> dict[int, torch.Tensor]:
        """{compacted slice: its columns} of a one-part plan (the int and float routes')."""
        (_, got), = self.parts
        return {i: cols for i, cols in got.items() if i in self.compact}

    def row_pairs(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """(i, [(j, log2 w_ij), ...]) for each slice i run row by row: every pair of it."""
        return [(i, [(j, weight_shift(self.slices, i, j)) for j in range(1, self.slices + 2 - i)])
                for i in self.by_rows]


def plan(sa: LevelSlices, sb: LevelSlices, rows: slice, slices: int,
         part_rows: int | None = None, by_rows: bool = True, sparse: bool = False,
         pairs: bool = False, tiles: bool = False) -> Plan:
    """The plan of the rows ``rows`` of ``a`` against ``b``: compacted slices per part of
    ``part_rows`` rows (None: the block is one part), then - with ``by_rows`` - the
    row-sparse ones (below ROW_SPARSE_MAX_TILES with ``tiles``: the dense products on AMX
    tiles), then - with ``sparse`` - the sparse slices among the dense ones (by the
    pair route's measure with ``pairs``: ``sparse_slices``)."""
    r0, r1 = rows.start, min(rows.stop, sa.shape[1])
    step = part_rows or max(1, r1 - r0)
    parts = tuple((part, compacted(sa, part, slices))
                  for part in (slice(p0, min(r1, p0 + step)) for p0 in range(r0, r1, step)))
    if not parts:
        parts = ((slice(r0, r0), {}),)
    p = Plan(rows, slices, parts)
    if by_rows:
        p = Plan(rows, slices, parts, tuple(row_sparse(
            sa, sb, rows, slices, p.compact, ROW_SPARSE_MAX_TILES if tiles else None)))
    if sparse:
        p = Plan(rows, slices, parts, p.by_rows,
                 sparse_slices(sa, slice(r0, r1), p.dense, sa.shape[2], pairs))
    return p


@dataclass(frozen=True, eq=False)
class Product:
    """One GEMM of a block by level: ``a``'s slices side by side along K against ``b``'s
    paired ones, over the contraction range [k0, k1) or (compacted) the columns ``cols``;
    or (``sparse`` "a" or "b": the side whose slice is sparse) one pair by ``lmhead_sparse``
    over the whole contraction. ``add``: its int32 sums go onto the previous product's - a
    pair of the same level, whose GEMM spanned the whole contraction, so the slot holds no
    more pairs than the level has."""
    a: tuple[int, ...]
    b: tuple[int, ...]
    weight: float
    k0: int = 0
    k1: int = 0
    cols: torch.Tensor | None = None
    sparse: str = ""
    add: bool = False


def level_products(p: Plan, k: int, sparse_b: frozenset[int] = frozenset()) -> list[Product]:
    """The GEMMs of a one-part plan, grouped by level: every level's pairs whose a slice is
    dense, per contraction chunk - less the pairs of a sparse slice of a (``p.sparse``) or
    of b (``sparse_b``), one sparse product each (int32 holds one pair over K <=
    ``lmhead_sparse.MAX_K``) - then each compacted slice's pairs over its columns (in chunks
    of at most K_CHUNK: one pair per GEMM, so int32 holds them)."""
    s, dense = p.slices, set(p.dense)
    out = []
    for lvl, pairs in levels(s):
        weight = float(1 << (7 * (s + 1 - lvl)))
        run = [(i, j) for i, j in pairs
               if i in dense and i not in p.sparse and j not in sparse_b]
        if run:
            out += [Product(tuple(i for i, _ in run), tuple(j for _, j in run), weight, k0, k1)
                    for k0, k1 in chunks(k)]
        whole = bool(run) and len(chunks(k)) == 1
        for i, j in pairs:
            side = "a" if i in p.sparse else "b" if j in sparse_b else ""
            if i in dense and side:
                out.append(Product((i,), (j,), weight, 0, k, sparse=side, add=whole))
    for i, cols in p.columns().items():
        for c0, c1 in chunks(cols.numel()):
            part = cols[c0:c1]
            out += [Product((i,), (j,), float(1 << weight_shift(s, i, j)), cols=part)
                    for j in range(1, s + 2 - i)]
    return out
