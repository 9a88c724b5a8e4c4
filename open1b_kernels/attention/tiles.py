"""Attention's tiling, shared by the forward (``open1b_kernels.attention.forward``) and the backward
(``open1b_kernels.attention.backward``): block sizes, which key blocks a query block visits, the
visibility mask, the softmax scale, input checks and the fixed-point row layouts.

Block sizes are part of the arithmetic definition (the online softmax steps over key
blocks of BLOCK_N), so both passes and both backends take them from here.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from open1b_kernels.core.backend import HAVE_TRITON
from open1b_kernels.attention.fixed import (digits, exact_matmul, fixed_row_values, fixed_rows,
                                     fixed_values, pow2_f32)
from open1b_kernels.core.reduce import tree_sum_cpu

BLOCK_M = 64  # query rows per block (both paths)
BLOCK_N = 64  # keys per block: the online-softmax step and the int8 P V quantization block


def softmax_scale(head_dim: int) -> float:
    """fp32(fp64(1 / fp64(sqrt(D)))): the exactly specified softmax scale (a Python float)."""
    return float(np.float32(1.0 / math.sqrt(head_dim)))


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None) -> None:
    """Validate shapes, dtypes and the window; errors name the bad value."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.bfloat16:
            raise TypeError(
                f"attention needs bf16 {name}, got {t.dtype}; cast with .to(torch.bfloat16)"
            )
        if t.dim() != 4:
            raise ValueError(
                f"{name} must be (batch, heads, seq, head_dim), got shape {tuple(t.shape)}"
            )
    b, hq, s, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[2:] != (s, d):
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (B, Hkv, S, D) "
            f"for q {tuple(q.shape)}"
        )
    if hq % k.shape[1] != 0:
        raise ValueError(f"query heads {hq} must be a multiple of KV heads {k.shape[1]}")
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {d}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 or None (fully causal), got {window}")


def block_band(qb: int | torch.Tensor, window: int | None, n_kb: int):
    """Key blocks [lo, hi] that query block ``qb`` must visit (same formula in the kernels)."""
    first_key = qb * BLOCK_M - window + 1 if window is not None else qb * 0
    if isinstance(first_key, torch.Tensor):
        lo = torch.clamp(first_key, min=0) // BLOCK_N
        hi = torch.clamp((qb * BLOCK_M + BLOCK_M - 1) // BLOCK_N, max=n_kb - 1)
    else:
        lo = max(first_key, 0) // BLOCK_N
        hi = min((qb * BLOCK_M + BLOCK_M - 1) // BLOCK_N, n_kb - 1)
    return lo, hi


def visible(rows: torch.Tensor, cols: torch.Tensor, seq: int, window: int | None) -> torch.Tensor:
    """Mask (..., BM, BN) of visible (query, key) pairs."""
    i, j = rows.unsqueeze(-1), cols.unsqueeze(-2)
    vis = (j <= i) & (j < seq)
    if window is not None:
        vis = vis & (j > i - window)
    return vis


def scores_cpu(q64: torch.Tensor, k64: torch.Tensor, scale: float) -> torch.Tensor:
    """fp32 scaled scores from fixed-point row values Q (.., BM, D) and K (.., BN, D)."""
    return exact_matmul(q64, k64.transpose(-1, -2)) * scale


def blocked_rows(x: torch.Tensor, block: int) -> torch.Tensor:
    """Fixed-point row values of x (B, H, S, D) as float64 (B, H, n_blocks, block, D)."""
    b, h, s, d = x.shape
    n_blocks = -(-s // block)
    x64 = torch.nn.functional.pad(fixed_row_values(x), (0, 0, 0, n_blocks * block - s))
    return x64.reshape(b, h, n_blocks, block, d)


def sliced_rows(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits (3, B, H, S_pad, D) int8 and exponents (B, H, S_pad) of x's rows over D,
    with S padded by zero rows (exponent 1) to a multiple of ``block``. Exact integer ops."""
    s = x.shape[2]
    pad = -(-s // block) * block - s
    n_int, e = fixed_rows(x)
    n_int = torch.nn.functional.pad(n_int, (0, 0, 0, pad))
    e = torch.nn.functional.pad(e, (0, pad), value=1)
    return digits(n_int).contiguous(), e.contiguous()


_RNE_MAGIC = 12582912.0  # 1.5 * 2^23: (x + M) - M rounds |x| < 2^22 to an integer, half-even
_P_EXP_CAP = 126  # 2^t and 2^-t stay normal fp32 numbers
assert 127 * 127 * BLOCK_N < 2**24, "the CPU's float32 P V product must stay exact"


def rne_int(x: torch.Tensor) -> torch.Tensor:
    """Round float32 |x| < 2^22 to the nearest integer, ties to even (two IEEE adds)."""
    return (x + _RNE_MAGIC) - _RNE_MAGIC


def quantize_v(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 V (B, H, n_kb*BLOCK_N, D) and row exponents u (B, H, n_kb*BLOCK_N), per key row.

    Per key row (not per block) so that a query's output never depends on keys it cannot
    see. Exact ops only (abs, max, bit fields, power-of-two multiply, rne), so it runs as-is
    on either device and both paths share it. Padded rows are zero with u = 126.
    """
    s = v.shape[2]
    vf = torch.nn.functional.pad(v.float(), (0, 0, 0, -(-s // BLOCK_N) * BLOCK_N - s))
    vmax = vf.abs().amax(dim=-1)  # (B, H, S_pad); max is exact
    u = torch.clamp(133 - ((vmax.view(torch.int32) >> 23) & 0xFF), max=_P_EXP_CAP)
    v8 = torch.clamp(rne_int(vf * pow2_f32(u).unsqueeze(-1)), -127, 127)
    return v8.to(torch.int8), u.to(torch.int32)


def row_delta(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """Drow = tree(fp32(do) * fp32(o)) over the head dim (exact ops; runs on either device)."""
    return tree_sum_cpu(do.float() * o.float(), -1)


def column_values(x: torch.Tensor, block: int) -> torch.Tensor:
    """Fixed-point values of x's columns within sequence blocks: (B, H, n, block, D) float64."""
    x64 = fixed_values(x, 2, block)
    b, h, sp, d = x64.shape
    return x64.reshape(b, h, sp // block, block, d)


def pad_rows(x: torch.Tensor, block: int, value: float) -> torch.Tensor:
    """(B, H, S) -> (B, H, n, block), padded with ``value``."""
    b, h, s = x.shape
    n_blocks = -(-s // block)
    return torch.nn.functional.pad(x, (0, n_blocks * block - s), value=value).reshape(
        b, h, n_blocks, block
    )


if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def tl_query_block(HQ: tl.constexpr, GROUP: tl.constexpr, BM: tl.constexpr):
        """The program (qb, b * HQ + h) of a per-query-block kernel: its query block qb, its
        head bh = b * HQ + h, that head's KV head bk = b * (HQ / GROUP) + h // GROUP, and its
        rows qb * BM + [0, BM)."""
        qb = tl.program_id(0)
        bh = tl.program_id(1)
        bk = (bh // HQ) * (HQ // GROUP) + (bh % HQ) // GROUP
        return qb, bh, bk, qb * BM + tl.arange(0, BM)

    @triton.jit
    def tl_band(qb, window, n_kb, BM: tl.constexpr, BN: tl.constexpr, HAS_WINDOW: tl.constexpr):
        """Key blocks [lo, hi] of query block qb (same formula as ``block_band``)."""
        lo = 0
        if HAS_WINDOW:
            lo = tl.maximum(qb * BM - window + 1, 0) // BN
        hi = tl.minimum((qb * BM + BM - 1) // BN, n_kb - 1)
        return lo, hi

    @triton.jit
    def tl_visible(rows, cols, seq, window, HAS_WINDOW: tl.constexpr):
        vis = (cols[None, :] <= rows[:, None]) & (cols[None, :] < seq)
        if HAS_WINDOW:
            vis = vis & (cols[None, :] > rows[:, None] - window)
        return vis
