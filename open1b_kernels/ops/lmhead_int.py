"""The LM head's slice products on the library's integer route (``open1b_kernels.ops.lmhead``,
step 2; ``open1b_kernels.int8.route``'s "int" route, picked on CPUs with an int8 dot-product
instruction): T from ``torch._int_mm`` GEMMs of the int8 slices, per output block.

Behind the plan (``open1b_kernels.ops.lmhead_plan``), the dense pairs run grouped by level
(``level_products``): per level L its pairs side by side along K, one GEMM in contraction
chunks of K_CHUNK (p * K_CHUNK * 127^2 < 2^31 for a level's p <= 3 pairs: int32 never
overflows); a compacted slice's pairs run over its gathered columns, a row-sparse slice's
row by row into an int64 part of T (``lmhead_rowsparse``), a sparse dense-planned slice's
pairs one by one onto their level's int32 sums (``lmhead_sparse``, VNNI CPUs). One
compiled pass per block (``_lmhead_sums.c``, ``levels_round_weighted``) adds the int32 products with their
power-of-two weights into T - exact in float64 below 2^53 - rounds T once into the output
and takes T's row and column sums, which ``lmhead_check.check_sums`` compares with the
definition's once per call. On the AMX tiles a block of dense level products over the whole
contraction (the forward's, the weight gradient's: ``fused``) runs as one call that does
the same per 32 x 32 block while its levels' sums are in cache (``amxmm.product_levels``):
the int32 products are never written - the same bits, the same sums checked.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import Loops, flat, none
from open1b_kernels.core.pieces import row_pieces
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8 import amxmm
from open1b_kernels.int8.route import int_gemm_route, int_mm_unchecked
from open1b_kernels.ops import lmhead_plan, lmhead_rowsparse, lmhead_sparse
from open1b_kernels.ops.lmhead_check import check_sums
from open1b_kernels.ops.lmhead_plan import Product, level_products, plan, sparse_slices
from open1b_kernels.ops.lmhead_slices import LevelSlices, level_copy

LOOPS = Loops("open1b_kernels.ops._opsc")    # the level sums compiled: _lmhead_sums.c
INT_ROW_BLOCK = 1024  # output rows per block of the CPU integer route
INT_COL_BLOCK = 4096  # output columns per block (int64 T: 32 MB)
# Below SHORT_K contraction steps the blocks are SHORT_BLOCKS (rows, columns): each output
# element then costs fewer multiply-adds than the bytes of its level products written and
# read again, and 512 x 2,048 blocks keep those in cache (measured on the demo's head,
# K = 128: 22.9 -> 19.2 ms per forward; at K = 256 - the weight gradient of 256 tokens -
# they were 5% slower, so the line is there; the same bits either way: blocks only change
# where T is summed, never its integer value)
SHORT_K, SHORT_BLOCKS = 256, (512, 2048)


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
    """T of step 2 by the library's int8 GEMM (where it ran 2.8-4.3x a float32 GEMM on the
    Zen 4 and 6-9x on the Zen 5), per output block the products of ``level_products`` (and
    the row-sparse slices' pairs, into an int64 part of T), added into an exact float64 T
    with their weights and rounded once into ``out`` (``fp32(T * rowf[r] * colf[c])``) -
    exact integers, so the float path's bits.

    Checked as every integer-route result is, but once per call instead of per block: T's
    row and column sums, accumulated over the output blocks, against the definition's
    (``check_sums``). On a mismatch the failure is counted, the process switches to the
    float route and False is returned: the caller recomputes ``out``. False too (not a
    fault) where the library refuses a layout.
    """
    r, c = out.shape
    k = sa.shape[2]
    rows_got = torch.zeros(r, dtype=torch.int64)
    cols_got = torch.zeros(c, dtype=torch.int64)
    whole = k <= lmhead_plan.K_CHUNK
    row_block, col_block = SHORT_BLOCKS if k < SHORT_K else (INT_ROW_BLOCK, INT_COL_BLOCK)
    once = r <= row_block
    tiles = int_gemm_route() == "amx"
    # sparse pairs on the VNNI route only: the tiles' GEMM runs ~4x VNNI's rate, and there the
    # sparse pair loses at the lowest level's 2-4% of nonzeros (measured on the AMX Xeon,
    # benchmarks.kernels.lmhead_sparse --anchor amx: 0.38-0.75x the tile GEMM at 3%, about
    # even only at 1% with the sparse slice as the rows)
    sparse = not tiles
    sparse_b = (sparse_slices(sb, slice(0, c), range(1, slices + 1), k) if sparse
                else frozenset())
    plans: dict[int, tuple] = {}         # per row block: (its plan, its products)
    made: dict[tuple, object] = {}       # the sparse slices' nonzeros (``sparse_product``)
    for c0 in range(0, c, col_block):
        cs = slice(c0, c0 + col_block)
        # with one row block each b operand of the library's GEMM is used once: built when
        # used, into one buffer (all of them at once are twice the slices: 1.6 GB for the
        # head weight's transpose); with several, a level's chunk operand is kept for the
        # column block - on the tiles each chunk's run of slices, packed once (``tile_b``)
        kept: dict[tuple, torch.Tensor] = {}
        made = {key: got for key, got in made.items() if key[0] == "a"}  # b's: this block's
        for r0 in range(0, r, row_block):
            rs = slice(r0, r0 + row_block)
            nr, nc = min(r, r0 + row_block) - r0, min(c, c0 + col_block) - c0
            if r0 not in plans:
                p = plan(sa, sb, rs, slices, sparse=sparse, tiles=tiles)
                plans[r0] = (p, level_products(p, k, sparse_b))
            p, products = plans[r0]
            runs = a_windows(sa, products, rs, k) if tiles and whole else {}
            if tiles and fused(p, products):
                levels = [(runs.get(q.a) or amxmm.pack(operand(sa, q.a, rs, q, whole,
                                                               f"lmhead.lv_a{n}"),
                                                       False, f"lmhead.lv_pa{n}"),
                           tile_b(sb, q, products, cs, whole, kept),
                           int(q.weight).bit_length() - 1)
                          for n, q in enumerate(products)]
                got_r, got_c = amxmm.product_levels(levels, rowf[rs], colf[cs], out[rs, cs])
                rows_got[rs] += got_r
                cols_got[cs] += got_c
                continue
            slots = [q for q in products if not q.add]     # one int32 product each
            accs = scratch("lmhead.accs", (len(slots), nr, nc), torch.int32)
            gathered = None
            n = -1
            for q in products:
                n += not q.add
                if q.sparse:
                    sparse_product(sa, sb, q, rs, cs, accs[n], made)
                    continue
                if q.cols is not None:
                    if gathered is None or gathered[0] is not q.cols:   # one per slice chunk
                        gathered = (q.cols, operand(sa, q.a, rs, q, whole, "lmhead.gather_a"))
                    al = gathered[1]
                    bl = operand(sb, q.b, cs, q, whole, "lmhead.gather_b")
                else:
                    al = runs.get(q.a) or operand(sa, q.a, rs, q, whole, "lmhead.op_a")
                    if once:
                        bl = operand(sb, q.b, cs, q, whole, "lmhead.op_b")
                    elif tiles:
                        bl = tile_b(sb, q, products, cs, whole, kept)
                    else:
                        key = (q.b, q.k0)
                        if key not in kept:
                            kept[key] = operand(sb, q.b, cs, q, whole, f"lmhead.op_b{len(kept)}")
                        bl = kept[key]
                if int_mm_unchecked(al, bl, out=accs[n]) is None:
                    return False                # a layout the library refuses: not a fault
            base = None
            if p.by_rows:
                base = scratch("lmhead.rows_t", (nr, nc), torch.int64).zero_()
                lmhead_rowsparse.add_planned(sa, sb, p, cs, base)
            weights = [q.weight for q in slots]
            if _levels_round_compiled(accs, weights, rowf[rs], colf[cs], out[rs], c0,
                                      rows_got[rs], cols_got[cs], base):
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


def fused(p, products: list[Product]) -> bool:
    """Whether a row block's products run as one tile call with the levels' epilogue
    (``amxmm.product_levels``): dense level products over the whole contraction only - no
    row-sparse part of T, no compacted, sparse or chunk-added product - and at most
    ``amxmm.MAX_LEVELS`` of them (the forward's and the weight gradient's blocks)."""
    return (not p.by_rows and 1 <= len(products) <= amxmm.MAX_LEVELS
            and all(q.cols is None and not q.sparse and not q.add for q in products))


def tile_b(sb: LevelSlices, q: Product, products: list[Product], cols: slice, whole: bool,
           kept: dict) -> amxmm.Packed:
    """``q``'s B operand on the tiles: a window (``amxmm.window``) of its contraction chunk's
    run of b slices - the store positions the chunk's dense products read, packed once and
    kept for the column block's row blocks (``kept``, by chunk) - so the forward's level
    runs [w3|w2|w1], [w2|w1], [w1] of the head weight's slices are packed once instead of
    three times, half the bytes packed and kept; its own packing where its slices are not
    one run of the store or the window cannot be read so."""
    at, key = sb.run_at(q.b), ("run", q.k0, q.k1)
    if at is not None and key not in kept:
        runs = [r for r in (sb.run_at(p.b) for p in products if p.cols is None
                            and not p.sparse and (p.k0, p.k1) == (q.k0, q.k1)) if r is not None]
        lo, hi = min(r.start for r in runs), max(r.stop for r in runs)
        run = (sb.span(slice(lo, hi), cols) if whole else
               level_copy(sb, sb.slices_at(slice(lo, hi)), cols, q.k0, q.k1, "lmhead.op_b"))
        kept[key] = (amxmm.pack(run, True, f"lmhead.op_b{len(kept)}"), lo)
    if at is not None:
        packed, lo = kept[key]
        width = q.k1 - q.k0
        got = amxmm.window(packed, (at.start - lo) * width, (at.stop - at.start) * width)
        if got is not None:
            return got
    own = ("own", q.b, q.k0)
    if own not in kept:
        kept[own] = amxmm.pack(operand(sb, q.b, cols, q, whole, "lmhead.op_b"), True,
                               f"lmhead.op_b{len(kept)}")
    return kept[own]


def a_windows(sa: LevelSlices, products: list[Product], rows: slice, k: int
              ) -> dict[tuple[int, ...], amxmm.Packed]:
    """The tiles' A operands of a row block's dense products over the whole contraction,
    where more than one would be packed: the slices they span packed once, each product's
    run a window of it (``amxmm.window``) - the weight gradient's level runs [a1], [a1|a2],
    [a1|a2|a3] of dlogits' transposed slices packed once instead of three times. Empty
    where the span is read in place (row-major, no packing to save) or is one product's."""
    at = {q.a: sa.run_at(q.a) for q in products if q.cols is None and not q.sparse}
    at = {which: got for which, got in at.items() if got is not None}
    if len(at) < 2:
        return {}
    lo, hi = min(g.start for g in at.values()), max(g.stop for g in at.values())
    span = sa.span(slice(lo, hi), rows)
    if span.stride(1) == 1 and k % 64 == 0:         # read in place by the tiles: nothing packed
        return {}
    whole = amxmm.pack(span, False, "lmhead.op_a_span")
    got = {which: amxmm.window(whole, (g.start - lo) * k, (g.stop - g.start) * k)
           for which, g in at.items()}
    return {which: w for which, w in got.items() if w is not None}


def sparse_product(sa: LevelSlices, sb: LevelSlices, q: Product, rs: slice, cs: slice,
                   acc: torch.Tensor, made: dict) -> None:
    """``acc`` (int32 (rows, cols)) = (``q.add``: +=) a_i b_j^T of the rows ``rs`` and
    columns ``cs`` for the one pair of ``q``, the zeros of its sparse side skipped
    (``lmhead_sparse.pair_mm``, its nonzeros kept in ``made``)."""
    lmhead_sparse.pair_mm(sa, sb, q.a[0], q.b[0], rs, cs, q.sparse, made, acc, add=q.add)


def _levels_round_compiled(accs: torch.Tensor, weights: list[float], rowf: torch.Tensor,
                           colf: torch.Tensor, out: torch.Tensor, c0: int, rows: torch.Tensor,
                           cols: torch.Tensor, base: torch.Tensor | None = None) -> bool:
    """One output block by the compiled loop: the int32 products ``accs`` (n, R, C) summed
    with their ``weights`` (powers of two) onto ``base`` (an int64 (R, C) part of T computed
    elsewhere, or None) into an exact float64 T, rounded once into ``out[:, c0:c0 + C]`` as
    ``fp32((T * rowf[r]) * colf[c])``, and T's row and column sums added into ``rows`` (R,)
    and ``cols`` (C,) int64 modulo 2^64 (the check's sums) - exact integer arithmetic and
    one rounding, so the torch code's values. False when the loop is unavailable. Rows split
    among the torch threads, each with its own column sums."""
    if not LOOPS.available():
        return False
    n, r, c = accs.shape
    w = torch.tensor(weights, dtype=torch.float64)
    args = (flat(accs), n, w.numpy(), flat(rowf.contiguous()), flat(colf.contiguous()),
            flat(out), flat(rows))
    tail = flat(base) if base is not None else none(torch.int64)
    cols += row_pieces(r, c, r // 16, lambda lo, hi, parts, p: LOOPS.levels_round_weighted(
        *args, parts, tail, r, c, out.shape[1], c0, lo, hi, p))
    return True
