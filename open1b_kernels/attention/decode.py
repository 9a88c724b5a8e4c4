"""One-query attention against a KV cache (decoding): the bits of ``open1b_kernels.attention.forward``'s
forward for the last row of the sequence so far.

Layout: q (B, Hq, D) - one query per sequence, the token at position pos[b]; k, v
(B, Hkv, T, D) - the cache, T > max(pos); entries past pos[b] are ignored (any finite
values). All bf16; GQA as in ``open1b_kernels.attention.forward`` (query head h reads KV head h // G).

Contract: ``attention_decode(q, k, v, pos, window)[b]`` equals bit for bit row pos[b] of
``attention_forward(Q, K, V, window)`` where Q, K, V are the full sequences of length
S = pos[b] + 1 whose last query is q[b] and whose keys/values are the cache's first S
rows. Why it can: every step of the forward's arithmetic is per query row (fixed-point Q
row exponents, the online softmax's max/sum/alpha, the per-row-and-block P quantization
exponent t) or per key row (K row exponents, V's row exponents u), so a row computed
alone is the row computed inside the block. The decode replays the forward's loop for
that row: query block qb = pos // BLOCK_M, key blocks lo .. hi of ``block_band(qb,
window, n_kb)`` with n_kb = ceil(S / BLOCK_N), in ascending order, the same visibility
mask (blocks of the band the row cannot see are still visited: they are exact no-ops
except for the sign of a zero, which visiting keeps identical). lse is not returned.

Triton: one program per (b, head); the query row is replicated over 16 tile rows (the
minimum ``tl.dot`` height) and row 0 is stored.
"""
from __future__ import annotations

import math

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.attention.tiles import _P_EXP_CAP, quantize_v, rne_int
from open1b_kernels.attention.fixed import fixed_row_values, pow2_f32
from open1b_kernels.attention.tiles import (BLOCK_M, BLOCK_N, block_band, blocked_rows,
                                     scores_cpu, sliced_rows, softmax_scale, visible)
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.reduce import tree_sum_cpu

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.attention.fixed import tl_exact_dot, tl_exact_to_f32, tl_pow2_f32, tl_to_bf16
    from open1b_kernels.attention.tiles import tl_band, tl_visible
    from open1b_kernels.core.mathfn import exp_tl
    from open1b_kernels.core.reduce import tree_sum_rows

ROWS = 16  # tile height of the Triton program (the query row, replicated)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
           window: int | None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype != torch.bfloat16:
            raise TypeError(f"attention_decode needs bf16 {name}, got {t.dtype}")
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape:
        raise ValueError(f"expected q (B, Hq, D) and k, v (B, Hkv, T, D); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d or hq % k.shape[1]:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} (GQA needs Hq "
                         f"a multiple of Hkv)")
    if pos.shape != (b,) or (b and (int(pos.min()) < 0 or int(pos.max()) >= k.shape[2])):
        raise ValueError(f"pos must be ({b},) positions inside the cache of {k.shape[2]} "
                         f"rows, got {pos.tolist()}")
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 or None (fully causal), got {window}")


def decode_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
               window: int | None) -> torch.Tensor:
    """CPU reference: out (B, Hq, D) bf16 (see the module docstring)."""
    _check(q, k, v, pos, window)
    b, hq, d = q.shape
    heads = torch.arange(hq) // (hq // k.shape[1])
    scale = softmax_scale(d)
    out = torch.empty_like(q)
    for i in range(b):
        p = int(pos[i])
        s = p + 1
        n_kb = -(-s // BLOCK_N)
        lo, hi = block_band(p // BLOCK_M, window, n_kb)
        k64 = blocked_rows(k[i:i + 1, :, :s], BLOCK_N)[0, heads]          # (Hq, n_kb, BN, D)
        v8, u = quantize_v(v[i:i + 1, :, :s])
        v8 = v8[0].reshape(-1, n_kb, BLOCK_N, d)[heads]
        u = u[0].reshape(-1, n_kb, BLOCK_N)[heads]
        q64 = fixed_row_values(q[i][:, None, :])                          # (Hq, 1, D)
        rows = torch.tensor([p])
        m = torch.full((hq, 1), -math.inf)
        l = torch.zeros((hq, 1))
        acc = torch.zeros((hq, 1, d))
        for kb in range(lo, hi + 1):      # forward_cpu's per-block step, for this one row
            cols = kb * BLOCK_N + torch.arange(BLOCK_N)
            vis = visible(rows, cols, s, window)                          # (1, BN)
            sc = torch.where(vis, scores_cpu(q64, k64[:, kb], scale), -math.inf)
            m_new = torch.maximum(m, sc.amax(dim=-1))
            m_inf = m == -math.inf
            alpha = torch.where(
                m == m_new, 1.0,
                torch.where(m_inf, 0.0,
                            mathfn.exp(torch.where(m_inf, 0.0, m) - torch.where(m_inf, 0.0, m_new))))
            shifted = torch.where(vis, sc, 0.0) - torch.where(vis, m_new.unsqueeze(-1), 0.0)
            pr = torch.where(vis, mathfn.exp(shifted), 0.0)
            pu = pr * pow2_f32(-u[:, kb]).unsqueeze(-2)
            t = torch.clamp(133 - ((pu.amax(dim=-1).view(torch.int32) >> 23) & 0xFF),
                            max=_P_EXP_CAP)
            p8 = torch.clamp(rne_int(pu * pow2_f32(t).unsqueeze(-1)), max=127.0)
            ii = p8.to(torch.float64) @ v8[:, kb].to(torch.float64)      # exact: |sum| < 2^24
            c = ii.to(torch.float32) * pow2_f32(-t).unsqueeze(-1)
            l = l * alpha + tree_sum_cpu(pr, -1)
            acc = acc * alpha.unsqueeze(-1) + c
            m = m_new
        out[i] = (acc / l.unsqueeze(-1)).to(torch.bfloat16)[:, 0]
    return out


if HAVE_TRITON:
    _RNE_K = tl.constexpr(12582912.0)
    _CAP_K = tl.constexpr(_P_EXP_CAP)

    @triton.jit
    def _decode_kernel(qd_ptr, eq_ptr, kd_ptr, ek_ptr, v8_ptr, u_ptr, pos_ptr, out_ptr,
                       window, scale, q_plane, k_plane, SKP,
                       HQ: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr,
                       BQ: tl.constexpr, BN: tl.constexpr, R: tl.constexpr,
                       HAS_WINDOW: tl.constexpr):
        # Program b * HQ + h: the one query of sequence b, head h, replicated over R rows.
        bh = tl.program_id(0)
        b = bh // HQ
        bk = b * (HQ // GROUP) + (bh % HQ) // GROUP
        p = tl.load(pos_ptr + b)
        rows = p + tl.zeros([R], tl.int32)
        rd = tl.arange(0, D)
        rn = tl.arange(0, BN)
        q_off = (bh + tl.zeros([R], tl.int32))[:, None].to(tl.int64) * D + rd[None, :]
        q0 = tl.load(qd_ptr + q_off)
        q1 = tl.load(qd_ptr + q_plane + q_off)
        q2 = tl.load(qd_ptr + 2 * q_plane + q_off)
        eq = tl.load(eq_ptr + bh + tl.zeros([R], tl.int32))
        seq = p + 1
        m = tl.full([R], float("-inf"), tl.float32)
        l = tl.zeros([R], tl.float32)
        acc = tl.zeros([R, D], tl.float32)
        lo, hi = tl_band(p // BQ, window, (seq + BN - 1) // BN, BQ, BN, HAS_WINDOW)
        for kb in range(lo, hi + 1):
            cols = kb * BN + rn
            kt_off = (bk * SKP + cols[None, :]).to(tl.int64) * D + rd[:, None]
            k0 = tl.load(kd_ptr + kt_off)
            k1 = tl.load(kd_ptr + k_plane + kt_off)
            k2 = tl.load(kd_ptr + 2 * k_plane + kt_off)
            ek = tl.load(ek_ptr + bk * SKP + cols)
            sc = tl_exact_to_f32(tl_exact_dot(q0, q1, q2, k0, k1, k2), eq, ek) * scale
            vis = tl_visible(rows, cols, seq, window, HAS_WINDOW)
            sc = tl.where(vis, sc, float("-inf"))
            m_new = tl.maximum(m, tl.max(sc, axis=1))
            m_inf = m == float("-inf")
            alpha = tl.where(
                m == m_new, 1.0,
                tl.where(m_inf, 0.0, exp_tl(tl.where(m_inf, 0.0, m) - tl.where(m_inf, 0.0, m_new))))
            shifted = tl.where(vis, sc, 0.0) - tl.where(vis, m_new[:, None], 0.0)
            pr = tl.where(vis, exp_tl(shifted), 0.0)
            pu = pr * tl_pow2_f32(-tl.load(u_ptr + bk * SKP + cols))[None, :]
            pbits = tl.max(pu, axis=1).to(tl.int32, bitcast=True)
            t = tl.minimum(133 - ((pbits >> 23) & 0xFF), _CAP_K)
            p8 = tl.minimum((pu * tl_pow2_f32(t)[:, None] + _RNE_K) - _RNE_K, 127.0).to(tl.int8)
            v8 = tl.load(v8_ptr + (bk * SKP + cols[:, None]).to(tl.int64) * D + rd[None, :])
            c = tl.dot(p8, v8, out_dtype=tl.int32).to(tl.float32) * tl_pow2_f32(-t)[:, None]
            l = l * alpha + tree_sum_rows(pr, R, BN)
            acc = acc * alpha[:, None] + c
            m = m_new
        out = tl_to_bf16(tl.div_rn(acc, l[:, None]))
        first = tl.arange(0, R) == 0
        tl.store(out_ptr + (bh + tl.zeros([R], tl.int32))[:, None].to(tl.int64) * D + rd[None, :],
                 out, mask=first[:, None])


def decode_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                  window: int | None) -> torch.Tensor:
    """The Triton path of ``attention_decode`` (same bits as ``decode_cpu``)."""
    _check(q, k, v, pos, window)
    b, hq, d = q.shape
    qd, eq = sliced_rows(q[:, :, None, :], 1)          # (3, B, Hq, 1, D), (B, Hq, 1)
    kd, ek = sliced_rows(k, BLOCK_N)                    # cache rows padded to BLOCK_N
    v8, u = quantize_v(v)
    skp = kd.shape[3]
    out = torch.empty_like(q)
    _decode_kernel[(b * hq,)](
        qd, eq, kd, ek, v8.contiguous(), u.contiguous(),
        pos.to(device=q.device, dtype=torch.int32).contiguous(), out,
        window if window is not None else 0, softmax_scale(d), qd[0].numel(), kd[0].numel(), skp,
        HQ=hq, GROUP=hq // k.shape[1], D=d, BQ=BLOCK_M, BN=BLOCK_N, R=ROWS,
        HAS_WINDOW=window is not None, **LAUNCH_OPTIONS)
    return out


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor,
                     window: int | None = None) -> torch.Tensor:
    """out (B, Hq, D) bf16: each sequence's one query against its cache (Triton on CUDA)."""
    if use_triton(q):
        return decode_triton(q, k, v, pos, window)
    return decode_cpu(q, k, v, pos, window)
