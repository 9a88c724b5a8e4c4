"""The LM head's product on Triton (GPU, or the CPU under the interpreter): the same
arithmetic as ``open1b_kernels.ops.lmhead``'s CPU reference (its docstring: slicing, the
slice pairs' int32 level sums flushed into int64 every K_CHUNK, one rounding), computed by
tiles on int8 tensor cores.

``ozaki_mm_triton(a, b, slices, sparse_a)``: the slicer (``slice_rows_triton``) cuts both
operands and maps a's top slice by tiles; with ``sparse_a`` (dh's dlogits, whose rows' top
slice is mostly zero) the product runs the top slice's products only on the tiles the map
lists (``tile_lists``), the other slices' on every tile - the same products minus zero
ones, so the same bits (open1b_kernels/CONTRACT.md, "LM head").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from open1b_kernels.core.backend import LAUNCH_OPTIONS, interpreting
from open1b_kernels.int8.gemm import bf16_operand, grouped_tile
from open1b_kernels.ops.lmhead_plan import K_CHUNK

# Three int32 level accumulators live in registers: a 128 x 64 tile over 8 warps fits
# them in 255 registers with no stack when the contraction is one K_CHUNK (Triton 3.6;
# 3.9 keeps an 8-byte stack; compiled offline for sm_90; 128 x 128 spills 800 bytes). On
# the first GPU run (H200, 2026-12-04) the head's forward and backward ran at 0.21-0.39x
# of torch's bf16 mm with an int64 total live through the loop and spilled, bit-identical
# to the CPU (benchmarks/HISTORY.md, "On an NVIDIA H200").
GPU_BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
              "num_warps": 8, "num_stages": 3}
# A contraction longer than K_CHUNK (dh = dlogits @ w contracts over the vocabulary) keeps
# an int64 total through the loop: at 128 x 64 Triton 3.6 spilled it (184-byte stack);
# 64 x 64 over 8 warps holds it in 168 registers (compiled offline for sm_90).
GPU_BLOCKS_LONG_K = {**GPU_BLOCKS, "BLOCK_M": 64}
INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4}
SLICE_BR, SLICE_BK = 32, 128
# The slicer's tile map has one byte per SLICE_BR rows and TILE_K contraction steps (every
# config's BLOCK_K) of the top slice; a product told its ``a`` is sparse (dh's dlogits)
# runs the top slice's products only on the tiles the map lists.
TILE_K = 64


@triton.jit
def _f32_bits(ptrs, mask, IS_BF16: tl.constexpr):
    """The float32 bit pattern of each element (bf16 widened exactly from its bits)."""
    if IS_BF16:
        return tl.load(ptrs, mask=mask, other=0).to(tl.int32) << 16
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.int32, bitcast=True)


@triton.jit
def _row_exp_kernel(x_ptr, e_ptr, R, K, stride_r, stride_k, IS_BF16: tl.constexpr,
                    BR: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    big = tl.full((BR,), 1, dtype=tl.int32)
    for k0 in range(0, K, BK):
        cols = k0 + tl.arange(0, BK)
        b = _f32_bits(x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k,
                      (rows[:, None] < R) & (cols[None, :] < K), IS_BF16)
        e = (b >> 23) & 0xFF
        big = tl.maximum(big, tl.max(e, axis=1))  # integer max: any order is exact
    tl.store(e_ptr + rows, big, mask=rows < R)


@triton.jit
def _slice_kernel(x_ptr, e_ptr, s_ptr, nz_ptr, R, K, stride_r, stride_k,
                  IS_BF16: tl.constexpr, SL: tl.constexpr, BR: tl.constexpr,
                  BK: tl.constexpr, FK: tl.constexpr, MAP: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    mask = (rows[:, None] < R) & (cols[None, :] < K)
    b = _f32_bits(x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k,
                  mask, IS_BF16)
    ef = (b >> 23) & 0xFF
    man = tl.where(ef == 0, b & 0x7FFFFF, (b & 0x7FFFFF) | 0x800000)
    e = tl.maximum(ef, 1)
    big = tl.load(e_ptr + rows, mask=rows < R, other=1)
    mag = man >> tl.minimum(big[:, None] - e + (24 - 7 * SL), 31)
    neg = b >> 31  # -1 for negative elements, else 0: (p ^ neg) - neg == sign * p
    off = rows[:, None].to(tl.int64) * K + cols[None, :]
    plane = R.to(tl.int64) * K
    for i in tl.static_range(SL):
        part = (mag >> (7 * (SL - 1 - i))) & 127
        tl.store(s_ptr + i * plane + off, ((part ^ neg) - neg).to(tl.int8), mask=mask)
    if MAP:  # the top slice's tile map: a byte per BR rows and FK columns, 1 where one is nonzero
        kb = tl.program_id(1) * (BK // FK) + tl.arange(0, BK // FK)
        top = tl.where(mask & ((mag >> (7 * (SL - 1))) != 0), 1, 0)
        hit = tl.max(tl.max(tl.reshape(top, (BR, BK // FK, FK)), axis=2), axis=0)
        tl.store(nz_ptr + tl.program_id(0) * tl.cdiv(K, FK) + kb, hit.to(tl.uint8),
                 mask=kb < tl.cdiv(K, FK))


@triton.jit
def _dense_products(acc2, acc3, acc4, a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, c0, c1,
                    SL: tl.constexpr, TOP: tl.constexpr, BLOCK_K: tl.constexpr):
    """Every slice pair of level <= S + 1 over contraction steps [c0, c1), added into
    the level accumulators (int32: no overflow within K_CHUNK). TOP = False leaves out
    the products of a's top slice (``_listed_products`` runs those)."""
    for k0 in range(c0, c1, BLOCK_K):
        kk = k0 + rk
        am = (rm[:, None] < M) & (kk[None, :] < K)
        bm = (rn[None, :] < N) & (kk[:, None] < K)
        a2 = tl.load(a_rows + pa + kk[None, :], mask=am, other=0)
        b1 = tl.load(b_cols + kk[:, None], mask=bm, other=0)
        acc3 += tl.dot(a2, b1, out_dtype=tl.int32)
        if TOP or SL == 3:
            b2 = tl.load(b_cols + pb + kk[:, None], mask=bm, other=0)
        if TOP:
            a1 = tl.load(a_rows + kk[None, :], mask=am, other=0)
            acc2 += tl.dot(a1, b1, out_dtype=tl.int32)
            acc3 += tl.dot(a1, b2, out_dtype=tl.int32)
        if SL == 3:
            a3 = tl.load(a_rows + 2 * pa + kk[None, :], mask=am, other=0)
            acc4 += tl.dot(a2, b2, out_dtype=tl.int32)
            acc4 += tl.dot(a3, b1, out_dtype=tl.int32)
            if TOP:
                b3 = tl.load(b_cols + 2 * pb + kk[:, None], mask=bm, other=0)
                acc4 += tl.dot(a1, b3, out_dtype=tl.int32)
    return acc2, acc3, acc4


@triton.jit
def _listed_products(acc2, acc3, acc4, a_rows, b_cols, pb, rm, rn, rk, M, N, K, lst, lo,
                     hi, SL: tl.constexpr, BLOCK_K: tl.constexpr):
    """The products of a's top slice over the contraction blocks lst[lo:hi] only: those
    of the chunk where the tile map has a nonzero for these rows (elsewhere they are
    zero). A plain loop, no branch around a product: products under an ``if`` left the
    loads unpipelined in the sm_90 code (no cp.async); this loop keeps them."""
    for j in range(lo, hi):
        kk = tl.load(lst + j) * BLOCK_K + rk
        a1 = tl.load(a_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                     other=0)
        bm = (rn[None, :] < N) & (kk[:, None] < K)
        acc2 += tl.dot(a1, tl.load(b_cols + kk[:, None], mask=bm, other=0),
                       out_dtype=tl.int32)
        acc3 += tl.dot(a1, tl.load(b_cols + pb + kk[:, None], mask=bm, other=0),
                       out_dtype=tl.int32)
        if SL == 3:
            acc4 += tl.dot(a1, tl.load(b_cols + 2 * pb + kk[:, None], mask=bm, other=0),
                           out_dtype=tl.int32)
    return acc2, acc3, acc4


@triton.jit
def _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, c0, c1, lst, lo, hi,
                SL: tl.constexpr, SKIP: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """T's part over contraction steps [c0, c1) as int64: the level accumulators,
    shifted together once at the end. SKIP: a's top slice only on the blocks listed in
    lst[lo:hi] - the same products minus zero ones, so T is the same integer."""
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc4 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    acc2, acc3, acc4 = _dense_products(acc2, acc3, acc4, a_rows, b_cols, pa, pb, rm, rn, rk,
                                       M, N, K, c0, c1, SL, not SKIP, BLOCK_K)
    if SKIP:
        acc2, acc3, acc4 = _listed_products(acc2, acc3, acc4, a_rows, b_cols, pb, rm, rn,
                                            rk, M, N, K, lst, lo, hi, SL, BLOCK_K)
    if SL == 3:
        return (acc2.to(tl.int64) << 14) + (acc3.to(tl.int64) << 7) + acc4.to(tl.int64)
    else:
        return (acc2.to(tl.int64) << 7) + acc3.to(tl.int64)


@triton.jit
def _ozaki_kernel(a_ptr, b_ptr, ea_ptr, eb_ptr, c_ptr, lists, bounds, M, N, K,
                  SL: tl.constexpr, K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                  ONE_CHUNK: tl.constexpr, SKIP: tl.constexpr):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    pa = M.to(tl.int64) * K  # slice plane strides
    pb = N.to(tl.int64) * K
    a_rows = a_ptr + rm[:, None].to(tl.int64) * K
    b_cols = b_ptr + rn[None, :].to(tl.int64) * K
    lst = lists + pid_m * tl.cdiv(K, BLOCK_K)          # SKIP: these rows' listed blocks
    row = bounds + pid_m * (tl.cdiv(K, K_CHUNK) + 1)   # and where each chunk's start
    if ONE_CHUNK:   # K <= K_CHUNK (the head's 2,048; a vocabulary of tokens is not):
        # no int64 total live through the main loop (it spilled registers at S = 3)
        t = _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, 0, K, lst,
                        tl.load(row, mask=SKIP, other=0),
                        tl.load(row + 1, mask=SKIP, other=0),
                        SL, SKIP, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        t = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int64)
        for c0 in range(0, K, K_CHUNK):
            c = c0 // K_CHUNK
            t += _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, c0,
                             tl.minimum(c0 + K_CHUNK, K), lst,
                             tl.load(row + c, mask=SKIP, other=0),
                             tl.load(row + c + 1, mask=SKIP, other=0),
                             SL, SKIP, BLOCK_M, BLOCK_N, BLOCK_K)
    ea = tl.load(ea_ptr + rm, mask=rm < M, other=1)
    eb = tl.load(eb_ptr + rn, mask=rn < N, other=1)
    p = (ea[:, None] + eb[None, :] - (259 + 7 * SL)).to(tl.int64)  # exp_bias(SL)
    scale = ((p + 1023) << 52).to(tl.float64, bitcast=True)
    y = (t.to(tl.float64) * scale).to(tl.float32)
    y = tl.where((ea[:, None] == 255) | (eb[None, :] == 255), float("nan"), y)
    tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], y,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def slice_rows_triton(x: torch.Tensor, slices: int, tile_map: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Triton path of ``slice_rows_cpu`` (any input strides): (slices, exponents, map). With
    ``tile_map`` the map of the top slice: uint8 (ceil(R / SLICE_BR), ceil(K / TILE_K)), 1
    where slice 1 of those SLICE_BR rows and TILE_K columns holds a nonzero (``ozaki_mm_triton``
    skips the others); else None, and the slicer does not compute it."""
    r, k = x.shape
    e = torch.empty((r,), dtype=torch.int32, device=x.device)
    s = torch.empty((slices, r, k), dtype=torch.int8, device=x.device)
    nz = (torch.zeros((triton.cdiv(r, SLICE_BR), triton.cdiv(k, TILE_K)), dtype=torch.uint8,
                      device=x.device) if tile_map else None)
    if r == 0:
        return s, e, nz
    bk = 64 if interpreting() else 256
    xk, is_bf16 = bf16_operand(x)
    _row_exp_kernel[(triton.cdiv(r, SLICE_BR),)](xk, e, r, k, x.stride(0), x.stride(1),
                                                 IS_BF16=is_bf16, BR=SLICE_BR, BK=bk,
                                                 **LAUNCH_OPTIONS)
    if k:
        grid = (triton.cdiv(r, SLICE_BR), triton.cdiv(k, SLICE_BK))
        _slice_kernel[grid](xk, e, s, e if nz is None else nz, r, k, x.stride(0), x.stride(1),
                            IS_BF16=is_bf16, SL=slices, BR=SLICE_BR, BK=SLICE_BK, FK=TILE_K,
                            MAP=tile_map, **LAUNCH_OPTIONS)
    return s, e, nz


def tile_lists(nz: torch.Tensor, block_m: int, k_chunk: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The product kernel's work list from the slicer's tile map ``nz`` (row groups,
    contraction blocks): ``lists`` int32 (P, KB) - for each program's ``block_m`` rows (the
    OR of their row groups) the contraction blocks where a's top slice has a nonzero,
    ascending, first - and ``bounds`` int32 (P, chunks + 1): where each K_CHUNK's blocks
    start in that list. A sort and cumulative sums on the map's device, no host sync."""
    n_rg, n_kb = nz.shape
    group = block_m // SLICE_BR
    n_pm = -(-n_rg // group)
    per_chunk = k_chunk // TILE_K
    n_ch = max(1, -(-n_kb // per_chunk))
    hit = torch.zeros((n_pm * group, n_ch * per_chunk), dtype=torch.uint8, device=nz.device)
    hit[:n_rg, :n_kb] = nz
    hit = hit.view(n_pm, group, -1).amax(1)
    kb = torch.arange(hit.shape[1], device=nz.device)
    # a hit's key is its block, a miss's the block past every hit: the sort lists the hits first
    lists = torch.sort((1 - hit.long()) * hit.shape[1] + kb, dim=1).indices[:, :n_kb]
    bounds = torch.zeros((n_pm, n_ch + 1), dtype=torch.int32, device=nz.device)
    torch.cumsum(hit.view(n_pm, n_ch, per_chunk).sum(2, dtype=torch.int32), dim=1,
                 out=bounds[:, 1:])
    return lists.to(torch.int32).contiguous(), bounds


def ozaki_mm_triton(a: torch.Tensor, b: torch.Tensor, slices: int, sparse_a: bool = False
                    ) -> torch.Tensor:
    """Triton path of ``ozaki_mm``. ``sparse_a``: list the tiles of a's top slice that hold
    a nonzero and run only their products (``_listed_products``) - the same bits; for an ``a``
    whose top slice is mostly zero (dlogits' rows, in dh), where that saves nearly half the
    products (``benchmarks.kernels.lmhead_tiles``)."""
    m, k = a.shape
    skip = sparse_a and k > 0
    sa, ea, nz = slice_rows_triton(a, slices, tile_map=skip)
    sb, eb, _ = slice_rows_triton(b, slices)
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    if m == 0 or n == 0:
        return c
    cfg = dict(INTERPRET_BLOCKS if interpreting() else
               GPU_BLOCKS if k <= K_CHUNK else GPU_BLOCKS_LONG_K)
    lists = bounds = ea  # any tensor: the dense loop reads neither
    if skip:
        # the map's blocks are the kernel's: TILE_K steps, and a K_CHUNK flush never
        # splits a block; a program's rows are whole row groups of the map
        assert cfg["BLOCK_K"] == TILE_K and cfg["BLOCK_M"] % SLICE_BR == 0
        assert K_CHUNK % TILE_K == 0
        lists, bounds = tile_lists(nz, cfg["BLOCK_M"], K_CHUNK)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _ozaki_kernel[grid](sa, sb, ea, eb, c, lists, bounds, m, n, k, SL=slices,
                        K_CHUNK=K_CHUNK, ONE_CHUNK=k <= K_CHUNK, SKIP=skip, **cfg,
                        **LAUNCH_OPTIONS)
    return c
