"""The LM head's slice products on the CPU's float route (``open1b_kernels.ops.lmhead``, step
2, on CPUs without an int8 dot-product instruction): T from float GEMMs of the int8 slices.

Behind the plan (``open1b_kernels.ops.lmhead_plan``: no row-sparse slices here, and the
compacted unions verified by ``lmhead_check.verified``) the products are those of the
integer route (``level_products``): the levels' pairs side by side along K, and a sparse
slice of ``a`` compacted to its nonzero columns - T is an integer, so any grouping that
holds every nonzero term gives it. Each product runs as float32 GEMMs over contraction
chunks of SGEMM_K (a chunk's partial sums are integers below 2^24 whatever the BLAS's
order: exact), added into a float64 T with the level's power-of-two weight (exact:
|T| < 2^53, MAX_K) - a few products at a time, in one compiled pass (``_lmhead_sums.c``,
``float_sum``) that also rounds the last ones into the output (``_Sum``). For S = 3 with no
compacted slice the six pairs run as two GEMMs (``head_form``): a float64 GEMM of the
14-bit heads A = a1 2^7 + a2 and B = b1 2^7 + b2, whose
``A . B = a1.b1 2^14 + (a1.b2 + a2.b1) 2^7 + a2.b2`` holds levels 2, 3 and one pair of
level 4 (products below 2^28, sums below K 2^28 < 2^53: exact in any order), plus the
level-4 pairs a1.b3 and a3.b1 as one float32 product - the work of four float32 GEMMs of
length K instead of six.

Operands are converted chunk by chunk, per output block, from the level-ready int8 store
(``open1b_kernels.ops.lmhead_slices``) straight into float32 (or float64) scratch in the store's
own layout: rows of a transposed store stay rows, and the BLAS takes the transposed view.
The conversion per block is (rows + cols) x K elements against the GEMM's rows x cols x K
multiply-adds. Before (measured on a Zen 3 without VNNI, the demo step): the slices were
concatenated in int8 (``torch.cat``, element by element across a transposed layout) and
converted again for every level - 42% of the step.

Cost in float32-GEMM units of length K (one unit = rows x cols x K multiply-adds):
S = 3: 4 (``head_form``), 3 when slice 1 of ``a`` is compacted (the logits gradient's dh:
levels 3 and 4 without slice 1's pairs, plus three products over ~1% of K); S = 2: 3, or 1
compacted. A float64 GEMM counts two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from open1b_kernels.core.mathc import Loops, flat, none
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8.route import SGEMM_K
from open1b_kernels.ops.lmhead_check import verified
from open1b_kernels.ops.lmhead_plan import Product, level_products, plan
from open1b_kernels.ops.lmhead_slices import LevelSlices

LOOPS = Loops("open1b_kernels.ops._opsc")    # the float sums compiled: _lmhead_sums.c

ROW_BLOCK, COL_BLOCK = 1024, 512  # output blocks: the float64 T (4 MB) stays in cache
# the head product's contraction chunks: its float64 partial sums are exact at any length
# (below K 2^28 < 2^53), so the chunks only bound the converted operands (64 MB a side)
HEAD_K = 8192
A_KEPT = 64 << 20  # bytes of a row block's converted a-side chunks kept across column blocks
PARTS = 4  # a block's float32 products held before one compiled pass adds them into T


@dataclass(frozen=True)
class HeadProduct:
    """``A . B`` of the 14-bit heads (slices 1 and 2 of each side), weight 1 (level 4)."""


def head_form(k: int) -> tuple:
    """S = 3's two GEMMs over a contraction of ``k`` (module docstring)."""
    return HeadProduct(), Product((1, 3), (3, 1), 1.0, 0, k)


def _chunk(planes: list[torch.Tensor], k0: int, k1: int, u0: int, u1: int,
           dtype: torch.dtype, name: str, coef: list[float] | None = None) -> torch.Tensor:
    """Columns [u0, u1) of ``planes[q][:, k0:k1]`` side by side along K (``coef``: instead
    the sum of the planes' [k0 + u0, k0 + u1) weighted by ``coef``), as ``dtype`` in the
    scratch buffer ``name`` (None: a new tensor, for ``_kept``): (n, u1 - u0), or for
    transposed planes the transposed view of a contiguous (u1 - u0, n) - the store's
    layout, so every copy reads contiguous rows."""
    n, width = planes[0].shape[0], k1 - k0
    rows_major = planes[0].stride(-1) == 1 or n == 1
    shape = (n, u1 - u0) if rows_major else (u1 - u0, n)
    buf = scratch(name, shape, dtype) if name else torch.empty(shape, dtype=dtype)
    view = buf if rows_major else buf.t()
    if coef is not None:
        for q, (plane, w) in enumerate(zip(planes, coef)):
            src = plane[:, k0 + u0:k0 + u1]
            if q == 0:
                view.copy_(src).mul_(w)
            else:
                view.add_(src, alpha=w)
        return view
    for q, plane in enumerate(planes):
        lo, hi = max(u0, q * width), min(u1, (q + 1) * width)
        if lo < hi:
            view[:, lo - u0:hi - u0].copy_(plane[:, k0 + lo - q * width:k0 + hi - q * width])
    return view


def _planes(s: LevelSlices, which: tuple[int, ...], rows: slice, p: Product, name: str
            ) -> tuple[list[torch.Tensor], int, int]:
    """(planes, k0, k1) of one side of ``p`` over ``rows``: slice views of the store, or the
    one gathered (n, K') operand of a compacted product."""
    if p.cols is not None:
        return [s.gather(which[0], rows, p.cols, name)], 0, p.cols.numel()
    return [s[i - 1][rows] for i in which], p.k0, p.k1


class _Kept:
    """The ``a`` side's converted chunks of one row block, kept for all its column blocks
    where they fit in A_KEPT bytes (the forward: 32 MB against 251 column blocks that would
    each convert them again), else built per column block into scratch (the backward's
    dh, whose ``a`` is a whole vocabulary wide, has four column blocks at Open-1B)."""

    def __init__(self, products, nr: int, k: int) -> None:
        size = 0
        for p in products:
            if isinstance(p, HeadProduct):
                size += nr * k * 8
            elif p.cols is None:
                size += nr * len(p.a) * (p.k1 - p.k0) * 4
        self.chunks: dict | None = {} if size <= A_KEPT else None

    def get(self, key, build):
        """The chunk ``key`` ((dtype tag, what it holds...)), built by ``build(name)`` (a
        scratch name, or None to keep)."""
        if self.chunks is None:
            return build(f"lmhead.a{key[0]}")
        got = self.chunks.get(key)
        if got is None:
            got = self.chunks[key] = build(None)
        return got


class _Sum:
    """T of one output block (float64, ``t``): the float32 products of its contraction
    chunks wait in scratch, PARTS at a time, for one compiled pass that adds them with their
    weights (``_float_sum_compiled``); the last pass rounds into the output instead of storing
    T. The torch code's adds and multiplies where the loop is unavailable - exact integers
    either way (any order), so the same T and the same rounding. A head product writes T
    itself, first of its plan (``head_form``)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.weights, self.from_t = t, [], False
        self.parts = scratch("lmhead.parts", (PARTS, *t.shape), torch.float32)

    def part(self, weight: float) -> torch.Tensor:
        """The buffer the next product (weight ``weight``) is written into."""
        if len(self.weights) == PARTS:
            self._add(None)
        self.weights.append(weight)
        return self.parts[len(self.weights) - 1]

    def wrote_t(self) -> None:
        """A head product wrote (or added into) T directly."""
        self.from_t = True

    def round_into(self, out: torch.Tensor, c0: int, rowf: torch.Tensor,
                   colf: torch.Tensor) -> None:
        """``out[:, c0:c0 + C] = fp32(T * rowf[r] * colf[c])`` with the waiting products in
        T (``out``: the block's rows, contiguous)."""
        self._add((out, c0, rowf, colf))

    def _add(self, rounding: tuple | None) -> None:
        n = len(self.weights)
        if not _float_sum_compiled(self.parts[:n], self.weights, self.t, self.from_t, rounding):
            t = self.t
            if not self.from_t:
                t.zero_()
            for i, w in enumerate(self.weights):
                t.add_(self.parts[i], alpha=w)
            if rounding is not None:
                out, c0, rowf, colf = rounding
                out[:, c0:c0 + t.shape[1]] = t.mul_(rowf[:, None]).mul_(colf[None, :])
        self.weights, self.from_t = [], True


def _held(which: tuple[int, ...], k0: int, k1: int, u0: int, u1: int) -> tuple:
    """What columns [u0, u1) of the slices ``which`` side by side over [k0, k1) hold: one
    slice's column range where they lie in one slice - so the products that share a slice
    (a1 in a1.b1 and in [a1 | a2].[b2 | b1]) share its converted chunks - else the whole
    description."""
    width = k1 - k0
    q = u0 // width if width > 0 else 0
    if width > 0 and u1 <= (q + 1) * width:
        return which[q], k0 + u0 - q * width, k0 + u1 - q * width
    return which, k0, k1, u0, u1


def _accumulate(acc: _Sum, sa: LevelSlices, sb: LevelSlices, rs: slice, cs: slice,
                p, gathered: dict, kept: _Kept, first: bool) -> None:
    """T += weight * (p's GEMM over rows ``rs`` and columns ``cs``), exactly (``first``:
    a head product writes T instead of adding to it)."""
    t = acc.t
    if isinstance(p, HeadProduct):
        if not first and not acc.from_t:    # T not written yet: its buffer holds old values
            t.zero_()
            acc.wrote_t()
        a_pl, b_pl = [sa[0][rs], sa[1][rs]], [sb[0][cs], sb[1][cs]]
        k = a_pl[0].shape[1]
        for u0 in range(0, k, HEAD_K):      # float64 sums of any length are exact here
            u1 = min(k, u0 + HEAD_K)
            al = kept.get((0, id(p), u0), lambda name: _chunk(
                a_pl, 0, k, u0, u1, torch.float64, name, [128.0, 1.0]))
            bl = _chunk(b_pl, 0, k, u0, u1, torch.float64, "lmhead.f64_b", [128.0, 1.0])
            if first and u0 == 0:
                torch.mm(al, bl.t(), out=t)
            else:
                t.addmm_(al, bl.t())
            acc.wrote_t()
        return
    if p.cols is not None:          # the gathered a operand serves every column block
        if gathered.get("cols") is not p.cols:
            gathered.update(cols=p.cols, a=_planes(sa, p.a, rs, p, "lmhead.gather_a"))
        a_pl, k0, k1 = gathered["a"]
    else:
        a_pl, k0, k1 = _planes(sa, p.a, rs, p, "")
    b_pl, _, _ = _planes(sb, p.b, cs, p, "lmhead.gather_b")
    width = len(a_pl) * (k1 - k0)
    for u0 in range(0, width, SGEMM_K):
        u1 = min(width, u0 + SGEMM_K)
        if p.cols is None:
            al = kept.get((1, *_held(p.a, k0, k1, u0, u1)), lambda name: _chunk(
                a_pl, k0, k1, u0, u1, torch.float32, name))
        else:
            al = _chunk(a_pl, k0, k1, u0, u1, torch.float32, "lmhead.f32_a")
        bl = _chunk(b_pl, k0, k1, u0, u1, torch.float32, "lmhead.f32_b")
        torch.mm(al, bl.t(), out=acc.part(p.weight))


def float_blocks(sa: LevelSlices, sb: LevelSlices, rowf: torch.Tensor, colf: torch.Tensor,
                 out: torch.Tensor, slices: int, two_gemms: bool = True) -> None:
    """T of step 2 on the float route per output block of ROW_BLOCK x COL_BLOCK, then the
    rounding into ``out`` (``fp32(T * rowf[r] * colf[c])``: power-of-two multiplies, exact
    in float64, then one rounding). ``two_gemms``: S = 3 without a compacted slice runs as
    ``head_form`` (False: the six pairs by levels; the same bits, kept for tests)."""
    r, c = out.shape
    k = sa.shape[2]
    for r0 in range(0, r, ROW_BLOCK):
        rs = slice(r0, r0 + ROW_BLOCK)
        planned = verified(sa, plan(sa, sb, rs, slices, by_rows=False))
        products = (head_form(k) if slices == 3 and two_gemms and not planned.compact
                    else level_products(planned, k))
        gathered: dict = {}
        kept = _Kept(products, min(r, r0 + ROW_BLOCK) - r0, k)
        for c0 in range(0, c, COL_BLOCK):
            cs = slice(c0, c0 + COL_BLOCK)
            nr, nc = min(r, r0 + ROW_BLOCK) - r0, min(c, c0 + COL_BLOCK) - c0
            acc = _Sum(scratch("lmhead.t", (nr, nc), torch.float64))
            for n, p in enumerate(products):
                _accumulate(acc, sa, sb, rs, cs, p, gathered, kept, n == 0)
            acc.round_into(out[rs], c0, rowf[rs], colf[cs])


def _float_sum_compiled(parts: torch.Tensor, weights: list[float], t: torch.Tensor,
                        from_t: bool, rounding: tuple | None = None) -> bool:
    """The float route's sum for one output block by the compiled loop: the float32
    products ``parts`` (n, R, C) - exact integers - times their ``weights`` (powers of two)
    added in float64 to ``t`` (R, C) (from its values with ``from_t``, else from 0), exactly;
    then stored into ``t``, or with ``rounding`` = (out, c0, rowf, colf) rounded once into
    ``out[:, c0:c0 + C]`` as ``fp32((T * rowf[r]) * colf[c])`` (``t`` left as it was).
    False when the loop is unavailable. Rows split among the torch threads."""
    if not LOOPS.available():
        return False
    n, r, c = parts.shape
    w = torch.tensor(weights, dtype=torch.float64)
    if rounding is None:
        none64 = none(torch.float64)
        tail = (none64, none64, none(), False, r, c, c, 0)
    else:
        out, c0, rowf, colf = rounding
        f64 = [flat(x.to(torch.float64).contiguous()) for x in (rowf, colf)]
        tail = (*f64, flat(out), True, r, c, out.shape[1], c0)
    args = (flat(parts), n, w.numpy(), flat(t), from_t, *tail)
    parallel(lambda lo, hi, p: LOOPS.float_sum(*args, lo, hi, p), r, grain=16)
    return True
