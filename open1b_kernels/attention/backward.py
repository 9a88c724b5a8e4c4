"""Attention backward: deterministic, not quantized, same bits on the CPU and in Triton.

Given the forward's bf16 inputs q, k, v, its bf16 output o, its fp32 lse and the bf16
upstream gradient do (shapes as in ``open1b_kernels.attention.forward``), with SCALE, the masks and the
score arithmetic of the forward:

- ``Drow_i = tree(fp32(do_i) * fp32(o_i))`` over the head dim (each product is exact: two
  bf16 significands fit in fp32; the pairwise tree of ``open1b_kernels.core.reduce``).
- Per visible (i, j): ``s_ij`` recomputed bit-identically to the forward;
  ``p_ij = exp(s_ij - lse_i)``; ``dp_ij = fp32(do_i . v_j)`` (exact fixed-point product,
  rounded once); ``ds_ij = p_ij * (dp_ij - Drow_i)``; masked pairs have p = ds = 0.
- The three gradient products take bf16 operands, as a bf16 flash backward does:
  ``p16 = bf16(p)``, ``ds16 = bf16(ds)`` (round to nearest even). Each BLOCK_M x BLOCK_N tile
  product is exact (``open1b_kernels.attention.fixed``; p16/ds16 rows sliced over the tile,
  q/do/k columns sliced per block) and rounded once to fp32. Tiles are accumulated in fp32
  in a fixed order:
    dQ_i  = bf16(SCALE * sum over key blocks kb ascending (band of the query block) of
            [ds16 K]_tile)
    dK_j  = bf16(SCALE * sum over query heads h of the group ascending, then query blocks
            qb ascending (those that can see key block kb), of [ds16^T Q]_tile)
    dV_j  = bf16(sum in the same order of [p16^T dO]_tile)
  (the GQA reduction over the group's query heads is part of that fixed order).
No atomics, no float dot: dQ is computed by its own kernel (one program per query block)
and dK/dV by another (one program per key block), so every sum has one owner and one order.
The inputs' fixed-point slicing and Drow are integer ops and single IEEE elementwise torch
ops, exactly specified on any device, so the Triton path runs that same torch code on the GPU.
Subnormals kept; inputs must be finite (see ``open1b_kernels.attention.fixed``).

Known property: a column group (e.g. K's column d over one key block) shares one exponent,
so the low bits of dQ_i can depend on the magnitude of a key in i's block that i cannot see
(truncation of values below 2^-13 of the group max, <= 2^-20 relative). The forward has no
such path: its output row i depends only on the keys and values row i can see (tested).
"""

from __future__ import annotations

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.attention import compiled
from open1b_kernels.attention.tiles import (
    BLOCK_M,
    BLOCK_N,
    block_band,
    blocked_rows,
    check_inputs,
    column_values,
    pad_rows,
    row_delta,
    scores_cpu,
    sliced_rows,
    softmax_scale,
    visible,
)
from open1b_kernels.attention.fixed import (
    digits,
    exact_matmul,
    fixed_point,
    fixed_row_values,
)
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.attention.tiles import tl_band, tl_query_block, tl_visible
    from open1b_kernels.attention.fixed import tl_exact_dot, tl_exact_to_f32, tl_fixed_point, tl_to_bf16
    from open1b_kernels.core.mathfn import exp_tl


def query_band(kb, window: int | None, n_qb: int):
    """Query blocks [lo, hi] that can see key block ``kb`` (same formula in the kernel)."""
    lo = kb * BLOCK_N // BLOCK_M
    if window is None:
        hi = kb * 0 + (n_qb - 1)
    else:
        hi = (kb * BLOCK_N + BLOCK_N - 2 + window) // BLOCK_M
    if isinstance(hi, torch.Tensor):
        return lo, torch.clamp(hi, max=n_qb - 1)
    return lo, min(hi, n_qb - 1)


def _unblock(x: torch.Tensor, seq: int) -> torch.Tensor:
    b, h, n, blk, d = x.shape
    return x.reshape(b, h, n * blk, d)[:, :, :seq].contiguous()


def _probs_and_ds(s, vis, lse, dp, drow):
    """p and ds of one tile (shared by the dQ and dK/dV loops of the CPU reference)."""
    p = torch.where(vis, mathfn.exp(torch.where(vis, s - lse, 0.0)), 0.0)
    return p, p * (dp - drow)


def backward_cpu(q, k, v, o, lse, do, window: int | None):
    """CPU reference of the backward: (dq, dk, dv) in bf16, shapes of q, k, v - by the
    compiled tile loops of ``open1b_kernels.attention.compiled`` where built (the same bits), else
    by ``backward_reference``."""
    check_inputs(q, k, v, window)
    if compiled.available() and q.device.type == "cpu":
        return compiled.backward(q, k, v, o, lse, do, window)
    return backward_reference(q, k, v, o, lse, do, window)


def backward_reference(q, k, v, o, lse, do, window: int | None):
    """The backward's definition in torch: (dq, dk, dv) in bf16, shapes of q, k, v.

    Query heads go in groups of one head per KV head (h = 0 .. group - 1, each group's KV
    heads are then the KV heads themselves: no GQA copies). For each group the dQ loop
    computes every visible tile's p and ds once and keeps them as bf16 (what all three
    products take); the dK/dV loop reads them back transposed instead of recomputing the
    scores, dO V^T and the exponentials: s, dp, p and ds of a tile are the same values seen
    from either side (the exact products are symmetric, the rest is elementwise), so the
    bits are those of recomputing them, and every sum keeps the order of the module
    docstring (dQ: key blocks ascending; dK/dV: heads ascending, then query blocks)."""
    check_inputs(q, k, v, window)
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = softmax_scale(d)
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    drow = pad_rows(row_delta(o, do), BLOCK_M, 0.0)
    lse_b = pad_rows(lse, BLOCK_M, 0.0)
    q64, do64 = blocked_rows(q, BLOCK_M), blocked_rows(do, BLOCK_M)
    k64, v64 = blocked_rows(k, BLOCK_N), blocked_rows(v, BLOCK_N)
    qc64, doc64, kc64 = column_values(q, BLOCK_M), column_values(do, BLOCK_M), column_values(k, BLOCK_N)
    qrows = torch.arange(n_qb)[:, None] * BLOCK_M + torch.arange(BLOCK_M)  # (n_qb, BM)
    krows = torch.arange(n_kb)[:, None] * BLOCK_N + torch.arange(BLOCK_N)  # (n_kb, BN)

    # The dQ loop's tiles: query block qb visits key blocks lo[qb] .. hi[qb]; tile (qb, kb)
    # is kept in slot first[qb] + kb - lo[qb]; one more slot of zeros stands for a tile the
    # dK/dV loop's band reaches but no query of it can see (p = ds = 0 there).
    lo, hi = block_band(torch.arange(n_qb), window, n_kb)
    width = hi - lo + 1
    first = torch.cumsum(width, 0) - width
    n_tiles = int(width.sum())
    qlo, qhi = query_band(torch.arange(n_kb), window, n_qb)
    acc_dq = torch.zeros((b, hq, n_qb, BLOCK_M, d))
    acc_dk = torch.zeros((b, hkv, n_kb, BLOCK_N, d))
    acc_dv = torch.zeros((b, hkv, n_kb, BLOCK_N, d))
    p16 = torch.zeros((b, hkv, n_tiles + 1, BLOCK_M, BLOCK_N), dtype=torch.bfloat16)
    ds16 = torch.zeros_like(p16)
    for h in range(group):
        sel = torch.arange(hkv) * group + h  # query head h of every group
        q64_h, do64_h, qc64_h, doc64_h = q64[:, sel], do64[:, sel], qc64[:, sel], doc64[:, sel]
        lse_h, drow_h = lse_b[:, sel], drow[:, sel]

        # dQ: per query block, key blocks of its band in ascending order.
        dq_h = torch.zeros((b, hkv, n_qb, BLOCK_M, d))
        for r in range(int((hi - lo).max()) + 1):
            act = torch.nonzero(lo + r <= hi).squeeze(1)  # query blocks still inside their band
            kb = lo[act] + r
            rows = qrows[act]
            vis = visible(rows, krows[kb], s, window) & (rows < s).unsqueeze(-1)
            sc = scores_cpu(q64_h[:, :, act], k64[:, :, kb], scale)
            dp = exact_matmul(do64_h[:, :, act], v64[:, :, kb].transpose(-1, -2))
            p, ds = _probs_and_ds(sc, vis, lse_h[:, :, act].unsqueeze(-1),
                                  dp, drow_h[:, :, act].unsqueeze(-1))
            slots = first[act] + r
            p16[:, :, slots] = p.to(torch.bfloat16)
            ds16[:, :, slots] = ds.to(torch.bfloat16)
            dq_h[:, :, act] += exact_matmul(fixed_row_values(ds16[:, :, slots]), kc64[:, :, kb])
        acc_dq[:, sel] = dq_h

        # dK, dV: per key block, query blocks ascending (this head after the ones before).
        for r in range(int((qhi - qlo).max()) + 1):
            act = torch.nonzero(qlo + r <= qhi).squeeze(1)  # key blocks with query blocks left
            qb = qlo[act] + r
            seen = (act >= lo[qb]) & (act <= hi[qb])
            slots = torch.where(seen, first[qb] + act - lo[qb], n_tiles)
            pt = p16[:, :, slots].transpose(-1, -2)     # p^T, ds^T: (.., BN, BM)
            dst = ds16[:, :, slots].transpose(-1, -2)
            acc_dv[:, :, act] += exact_matmul(fixed_row_values(pt), doc64_h[:, :, qb])
            acc_dk[:, :, act] += exact_matmul(fixed_row_values(dst), qc64_h[:, :, qb])
    dq = _unblock((acc_dq * scale).to(torch.bfloat16), s)
    dk = _unblock((acc_dk * scale).to(torch.bfloat16), s)
    dv = _unblock(acc_dv.to(torch.bfloat16), s)
    return dq, dk, dv


if HAVE_TRITON:

    @triton.jit
    def _load3(ptr, plane, off):
        return tl.load(ptr + off), tl.load(ptr + plane + off), tl.load(ptr + 2 * plane + off)

    @triton.jit
    def _half_product(acc, a0, a1, a2, ea, cd, ec, plane, c_off, e_col):
        """acc + fp32 of the exact product of a tile's row digits with half of the column
        digits (``cd``, ``ec`` already offset to that half)."""
        c0, c1, c2 = _load3(cd, plane, c_off)
        return acc + tl_exact_to_f32(tl_exact_dot(a0, a1, a2, c0, c1, c2), ea, tl.load(ec + e_col))

    @triton.jit
    def _tiles_kernel(
        qd,
        eq,
        kd,
        ek,
        vd,
        ev,
        dod,
        edo,
        lse_ptr,
        drow_ptr,
        p_ptr,
        ds_ptr,
        first_ptr,
        n_tiles,
        seq,
        window,
        scale,
        q_plane,
        k_plane,
        n_kb,
        HQ: tl.constexpr,
        GROUP: tl.constexpr,
        D: tl.constexpr,
        SQP: tl.constexpr,
        SKP: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
    ):
        # Program (qb, b * HQ + h): every tile of one query block's band - the scores and
        # dO V^T recomputed exactly, p and ds - left as p16 and ds16 in the tile's slot
        # ((BM, BN), rows the queries) for the product kernels. Only the two exact products
        # and the elementwise work live here: with the dK/dV products in the same kernel
        # it spilled (a 624-byte stack, 445 local-memory instructions, sm_90).
        qb, bh, bk, rows = tl_query_block(HQ, GROUP, BM)
        rd = tl.arange(0, D)
        rn = tl.arange(0, BN)
        r_off = (bh * SQP + rows[:, None]).to(tl.int64) * D + rd[None, :]  # (BM, D)
        q0, q1, q2 = _load3(qd, q_plane, r_off)
        o0, o1, o2 = _load3(dod, q_plane, r_off)
        eqr = tl.load(eq + bh * SQP + rows)
        edor = tl.load(edo + bh * SQP + rows)
        lse = tl.load(lse_ptr + bh * seq + rows, mask=rows < seq, other=0.0)
        drow = tl.load(drow_ptr + bh * seq + rows, mask=rows < seq, other=0.0)
        tile = tl.arange(0, BM)[:, None] * BN + rn[None, :]
        lo, hi = tl_band(qb, window, n_kb, BM, BN, HAS_WINDOW)
        base = bh * n_tiles + tl.load(first_ptr + qb) - lo
        for kb in range(lo, hi + 1):
            cols = kb * BN + rn
            kt_off = (bk * SKP + cols[None, :]).to(tl.int64) * D + rd[:, None]  # (D, BN)
            k0, k1, k2 = _load3(kd, k_plane, kt_off)
            sc = tl_exact_to_f32(tl_exact_dot(q0, q1, q2, k0, k1, k2), eqr,
                                 tl.load(ek + bk * SKP + cols)) * scale
            v0, v1, v2 = _load3(vd, k_plane, kt_off)
            dp = tl_exact_to_f32(tl_exact_dot(o0, o1, o2, v0, v1, v2), edor,
                                 tl.load(ev + bk * SKP + cols))
            vis = tl_visible(rows, cols, seq, window, HAS_WINDOW) & (rows < seq)[:, None]
            p = tl.where(vis, exp_tl(tl.where(vis, sc - lse[:, None], 0.0)), 0.0)
            slot = (base + kb).to(tl.int64) * (BM * BN) + tile
            tl.store(ds_ptr + slot, tl_to_bf16(p * (dp - drow[:, None])).to(tl.int16, bitcast=True))
            tl.store(p_ptr + slot, tl_to_bf16(p).to(tl.int16, bitcast=True))

    @triton.jit
    def _dkv_kernel(
        tiles_ptr,
        tile_plane,
        first_ptr,
        n_tiles,
        cd,
        ec,
        c_plane,
        e_plane,
        out_ptr,
        out_plane,
        seq,
        window,
        scale,
        n_qb,
        n_kb,
        HQ: tl.constexpr,
        GROUP: tl.constexpr,
        D: tl.constexpr,
        SQP: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
    ):
        # Program (kb, b * HKV + hk, which): dV (which 0: p16^T dO) or dK (which 1: ds16^T Q,
        # times the scale) of one key block, from the tiles the tiles kernel left; query heads
        # of the group ascending, then the query blocks that can see this key block
        # ascending. One product a program: holding dK's and dV's accumulators and both
        # tiles' digits together spilled (a 312-byte stack, sm_90).
        kb = tl.program_id(0)
        bk = tl.program_id(1)
        which = tl.program_id(2)
        tiles_ptr += which * tile_plane          # p16 or ds16
        cd += which * (3 * c_plane)              # dO's or Q's column digits ...
        ec += which * e_plane                    # ... and their exponents
        hkv = HQ // GROUP
        cols = kb * BN + tl.arange(0, BN)
        rm = tl.arange(0, BM)
        rn = tl.arange(0, BN)
        # by halves of the head dim: an exact product's int64 and int32 tiles are
        # (BN, D / 2), which keeps the kernel within its registers (column d's value
        # depends only on column d's digits: the same integers as the whole product)
        rh = tl.arange(0, D // 2)
        acc_a = tl.zeros([BN, D // 2], tl.float32)
        acc_b = tl.zeros([BN, D // 2], tl.float32)
        qlo = kb * BN // BM
        qhi = n_qb - 1
        if HAS_WINDOW:
            qhi = tl.minimum((kb * BN + BN - 2 + window) // BM, n_qb - 1)
        t_tile = rm[None, :] * BN + rn[:, None]  # element (key j, query i) of a tile: its T
        for h in range(GROUP):
            bh = (bk // hkv) * HQ + (bk % hkv) * GROUP + h
            for qb in range(qlo, qhi + 1):
                rows = qb * BM + rm
                lo, hi = tl_band(qb, window, n_kb, BM, BN, HAS_WINDOW)
                # a key block the band of query block qb does not reach has no slot: its
                # p and ds are zero (no query of qb sees it), read as zeros
                slot = (bh * n_tiles + tl.load(first_ptr + qb) + kb - lo).to(tl.int64)
                bits = tl.load(tiles_ptr + slot * (BM * BN) + t_tile,
                               mask=t_tile < tl.where(kb <= hi, BM * BN, 0), other=0)
                c_off = (bh * SQP + rows[:, None]).to(tl.int64) * D + rh[None, :]  # (BM, D/2)
                e_col = (bh * (SQP // BM) + qb) * D + rh
                t0, t1, t2, et = tl_fixed_point(bits.to(tl.bfloat16, bitcast=True), 1)
                acc_a = _half_product(acc_a, t0, t1, t2, et, cd, ec, c_plane, c_off, e_col)
                acc_b = _half_product(acc_b, t0, t1, t2, et, cd + D // 2, ec + D // 2,
                                      c_plane, c_off, e_col)
        mult = tl.where(which == 1, scale, 1.0)  # dK's scale; dV's 1.0 is exact
        keep = (cols < seq)[:, None]
        out_off = which * out_plane + (bk * seq + cols[:, None]).to(tl.int64) * D + rh[None, :]
        tl.store(out_ptr + out_off, tl_to_bf16(acc_a * mult), mask=keep)
        tl.store(out_ptr + out_off + D // 2, tl_to_bf16(acc_b * mult), mask=keep)

    @triton.jit
    def _dq_kernel(
        ds_ptr,
        first_ptr,
        n_tiles,
        kcd,
        ekc,
        dq_ptr,
        seq,
        window,
        scale,
        k_plane,
        n_kb,
        HQ: tl.constexpr,
        GROUP: tl.constexpr,
        D: tl.constexpr,
        SKP: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        HAS_WINDOW: tl.constexpr,
    ):
        # Program (qb, b * HQ + h): dQ of one query block, key blocks of its band ascending,
        # from the ds16 tiles the tiles kernel left (the same values as recomputing them).
        qb, bh, bk, rows = tl_query_block(HQ, GROUP, BM)
        rd = tl.arange(0, D)
        tile = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
        acc = tl.zeros([BM, D], tl.float32)
        lo, hi = tl_band(qb, window, n_kb, BM, BN, HAS_WINDOW)
        base = bh * n_tiles + tl.load(first_ptr + qb) - lo
        for kb in range(lo, hi + 1):
            bits = tl.load(ds_ptr + (base + kb).to(tl.int64) * (BM * BN) + tile)
            s0, s1, s2, eds = tl_fixed_point(bits.to(tl.bfloat16, bitcast=True), 1)
            cols = kb * BN + tl.arange(0, BN)
            c_off = (bk * SKP + cols[:, None]).to(tl.int64) * D + rd[None, :]  # (BN, D)
            c0, c1, c2 = _load3(kcd, k_plane, c_off)
            ekcol = tl.load(ekc + (bk * n_kb + kb) * D + rd)
            acc = acc + tl_exact_to_f32(tl_exact_dot(s0, s1, s2, c0, c1, c2), eds, ekcol)
        dq = tl_to_bf16(acc * scale)
        tl.store(
            dq_ptr + (bh * seq + rows[:, None]).to(tl.int64) * D + rd[None, :],
            dq,
            mask=(rows < seq)[:, None],
        )


# Warps per program of the backward kernels on a GPU (the interpreter ignores them): the
# dK/dV kernel holds two (BN, D) fp32 accumulators (by halves) and a tile's digits and
# int64 products; at 4 warps Triton 3.6 spilled them to a 2-3 KB stack.
DKV_WARPS = 8
DKV_STAGES = 2
TILES_WARPS = 4
DQ_WARPS = 4


def _col_digits(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    n_int, e = fixed_point(x, 2, block)
    return digits(n_int).contiguous(), e.contiguous()


def _tile_slots(n_qb: int, n_kb: int, window: int | None, device) -> tuple[torch.Tensor, int]:
    """Where each query block's band of (BM, BN) tiles starts among one head's tiles, and
    the tiles per head (the CPU reference's slots: ``backward_reference``)."""
    lo, hi = block_band(torch.arange(n_qb), window, n_kb)
    width = hi - lo + 1
    first = torch.cumsum(width, 0) - width
    return first.to(torch.int32).to(device), int(width.sum())


def backward_triton(q, k, v, o, lse, do, window: int | None):
    """The Triton path of the backward (same bits as ``backward_cpu``), in three kernels as
    the CPU reference's loops: the tiles kernel computes every visible tile's p and ds once
    (per query block, the band's key blocks) and leaves p16 and ds16; the dK/dV kernel (per
    key block) and the dQ kernel (per query block) take their products from those tiles -
    9 int8 products a tile each instead of recomputing the scores and dO V^T (18 more)."""
    check_inputs(q, k, v, window)
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    qd, eq = sliced_rows(q, BLOCK_M)
    dod, edo = sliced_rows(do, BLOCK_M)
    kd, ek = sliced_rows(k, BLOCK_N)
    vd, ev = sliced_rows(v, BLOCK_N)
    drow = row_delta(o, do).contiguous()
    lse = lse.contiguous()
    win = window if window is not None else 0
    shape = {
        "HQ": hq,
        "GROUP": hq // hkv,
        "D": d,
        "BM": BLOCK_M,
        "BN": BLOCK_N,
        "HAS_WINDOW": window is not None,
    }
    scale = softmax_scale(d)
    first, n_tiles = _tile_slots(n_qb, n_kb, window, q.device)
    tiles = torch.empty((2, b * hq * n_tiles, BLOCK_M, BLOCK_N), dtype=torch.int16,
                        device=q.device)                                  # p16, ds16
    p16, ds16 = tiles
    _tiles_kernel[(n_qb, b * hq)](
        qd, eq, kd, ek, vd, ev, dod, edo, lse, drow, p16, ds16, first, n_tiles, s, win, scale,
        qd[0].numel(), kd[0].numel(), n_kb, SQP=n_qb * BLOCK_M, SKP=n_kb * BLOCK_N,
        num_warps=TILES_WARPS, **shape, **LAUNCH_OPTIONS,
    )
    del qd, eq, dod, edo, vd, ev
    # dO's and Q's column digits and exponents side by side: the dK/dV kernel's which = 0, 1
    docd, edoc = _col_digits(do, BLOCK_M)
    qcd, eqc = _col_digits(q, BLOCK_M)
    cd, ec = torch.stack((docd, qcd)), torch.stack((edoc, eqc))
    del docd, edoc, qcd, eqc
    dkv = torch.empty((2, *k.shape), dtype=k.dtype, device=k.device)      # dV, dK
    _dkv_kernel[(n_kb, b * hkv, 2)](
        tiles, tiles[0].numel(), first, n_tiles, cd, ec, cd[0, 0].numel(), ec[0].numel(), dkv,
        dkv[0].numel(), s, win, scale, n_qb, n_kb, SQP=n_qb * BLOCK_M, num_warps=DKV_WARPS,
        num_stages=DKV_STAGES, **shape, **LAUNCH_OPTIONS,
    )
    dv, dk = dkv
    del cd, ec   # p16 is half of ``tiles``: freed with ds16, after the dQ kernel
    kcd, ekc = _col_digits(k, BLOCK_N)
    dq = torch.empty_like(q)
    _dq_kernel[(n_qb, b * hq)](
        ds16, first, n_tiles, kcd, ekc, dq, s, win, scale, kd[0].numel(), n_kb,
        SKP=n_kb * BLOCK_N, num_warps=DQ_WARPS, **shape, **LAUNCH_OPTIONS,
    )
    return dq, dk, dv


def attention_backward(q, k, v, o, lse, do, window: int | None = None):
    """Backward: (dq, dk, dv) bf16; Triton on CUDA, CPU reference else."""
    for name, t in (("o", o), ("do", do)):
        if t.dtype != torch.bfloat16 or t.shape != q.shape:
            raise ValueError(
                f"{name} must be bf16 of q's shape {tuple(q.shape)}, got {t.dtype} {tuple(t.shape)}"
            )
    if lse.dtype != torch.float32 or lse.shape != q.shape[:3]:
        raise ValueError(
            f"lse must be fp32 of shape {tuple(q.shape[:3])}, got {lse.dtype} {tuple(lse.shape)}"
        )
    if use_triton(q):
        return backward_triton(q, k, v, o, lse, do, window)
    return backward_cpu(q, k, v, o, lse, do, window)
