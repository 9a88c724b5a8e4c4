"""Causal attention with GQA and a sliding window: same bits on the CPU and in Triton.

Layout as ``torch.nn.functional.scaled_dot_product_attention``: q (B, Hq, S, D), k and v
(B, Hkv, S, D), all bf16, Hq a multiple of Hkv (query head h reads KV head h // (Hq/Hkv)).
Query i sees key j iff ``j <= i`` and, with a window w, ``j > i - w`` (w = None: fully causal).

Forward arithmetic (the CPU reference replays it op for op; block sizes BLOCK_M x BLOCK_N
are part of the definition):

- Scores: ``s_ij = fp32(q_i . k_j) * SCALE`` where ``q_i . k_j`` is the exact fixed-point
  product of ``open1b_kernels.attention.fixed`` (Q rows and K rows sliced over the head dim into
  int8 pieces, int32 dots, rounded once to fp32) and ``SCALE = fp32(1 / sqrt(D))`` computed
  on the host in float64 (CPython's sqrt and division are correctly rounded) then rounded.
- Online softmax over key blocks of BLOCK_N, in ascending block order, only over the blocks
  that intersect query block [qb*BLOCK_M, qb*BLOCK_M + BLOCK_M)'s causal/window band. Per
  block, with masked scores set to -inf: ``m' = max(m, rowmax(s))`` (max is exact);
  ``alpha = 1 if m == m' else (0 if m == -inf else exp(m - m'))``;
  ``p = exp(s - m')`` on visible entries, 0 elsewhere; ``l = l * alpha + tree(p)`` with the
  pairwise tree of ``open1b_kernels.core.reduce``; exp and log are
  ``open1b_kernels.core.mathfn``'s portable ones.
- P V in int8. V is quantized once per key row j (so a query's output never depends on a
  key it cannot see): ``u_j = min(133 - expo(max_d |v_jd|), 126)``,
  ``v8_jd = clamp(rne(v_jd * 2^u_j), -127, 127)``. Its scale is folded into p, which is then
  quantized per query row and block: ``pu_ij = p_ij * 2^-u_j``,
  ``t_i = min(133 - expo(max_j pu_ij), 126)`` (so ``max pu * 2^t`` lies in [64, 128)),
  ``p8_ij = min(rne(pu_ij * 2^t_i), 127)``. Here ``rne`` = add then subtract 1.5 * 2^23
  (round half to even for |x| < 2^22), ``expo`` = the biased fp32 exponent field, and the
  power-of-two multiplies are exact unless a result is subnormal (then IEEE rounding). The
  block product ``I = p8 @ v8`` is an exact int32 dot (|I| < 127^2 * BLOCK_N < 2^24, so
  fp32(I) is exact), dequantized as ``c = fp32(I) * 2^-t``; ``acc = acc * alpha + c``.
- Output ``bf16(div_rn(acc, l))`` (round to nearest even) and ``lse = m + log(l)`` (fp32).

Accuracy (measured, tests/kernels/test_attention.py): output error vs float64 up to 1.3%
(mean 0.1%) of max|v| - the int8 P V; lse within 1e-5 relative.

Every float op is one IEEE binary32 (or the stated binary64) operation, round to nearest
even, never fused (launches pass ``enable_fp_fusion=False``); IEEE subnormals are kept on
both paths. NaN/inf: inputs must be finite (see ``attention_fixed``); each row sees at least
its own key, so ``l >= 1`` and no division by zero or log(0) occurs.
The backward lives in ``open1b_kernels.attention.backward``.
"""

from __future__ import annotations

import math

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.attention import compiled
from open1b_kernels.attention.backward import attention_backward
from open1b_kernels.attention.fixed import pow2_f32
from open1b_kernels.attention.tiles import (_P_EXP_CAP, _RNE_MAGIC, BLOCK_M, BLOCK_N, block_band,
                                     blocked_rows, check_inputs, quantize_v, rne_int,
                                     scores_cpu, sliced_rows, softmax_scale, visible)
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.reduce import tree_sum_cpu
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.attention.fixed import tl_exact_dot, tl_exact_to_f32, tl_pow2_f32, tl_to_bf16
    from open1b_kernels.attention.tiles import tl_band, tl_query_block, tl_visible
    from open1b_kernels.core.reduce import tree_sum_rows

def forward_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU reference of the forward: (out bf16 (B, Hq, S, D), lse fp32 (B, Hq, S)), by the
    compiled tile loops of ``open1b_kernels.attention.compiled`` where built (the same bits), else
    by ``forward_reference``."""
    check_inputs(q, k, v, window)
    if compiled.available() and q.device.type == "cpu":
        return compiled.forward(q, k, v, window)
    return forward_reference(q, k, v, window)


def forward_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's definition in torch: (out bf16 (B, Hq, S, D), lse fp32 (B, Hq, S)).

    Vectorized over batch, heads and query blocks; the loop runs over a query block's
    band position r, so query block qb handles key block lo(qb) + r exactly when the
    kernel's loop does (blocks whose band is exhausted sit the step out).
    """
    check_inputs(q, k, v, window)
    b, hq, s, d = q.shape
    group = hq // k.shape[1]
    scale = softmax_scale(d)
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    heads = torch.arange(hq) // group
    q64 = blocked_rows(q, BLOCK_M)
    k64 = blocked_rows(k, BLOCK_N)[:, heads]
    v8, u = quantize_v(v)
    v8, u = v8.reshape(b, -1, n_kb, BLOCK_N, d)[:, heads], u.reshape(b, -1, n_kb, BLOCK_N)[:, heads]

    qbs = torch.arange(n_qb)
    lo, hi = block_band(qbs, window, n_kb)
    rows = qbs[:, None] * BLOCK_M + torch.arange(BLOCK_M)  # (n_qb, BM)
    m = torch.full((b, hq, n_qb, BLOCK_M), -math.inf)
    l = torch.zeros((b, hq, n_qb, BLOCK_M))
    acc = torch.zeros((b, hq, n_qb, BLOCK_M, d))
    for r in range(int((hi - lo).max()) + 1):
        act = torch.nonzero(lo + r <= hi).squeeze(1)  # query blocks still inside their band
        kb = lo[act] + r
        cols = kb[:, None] * BLOCK_N + torch.arange(BLOCK_N)  # (n_act, BN)
        vis = visible(rows[act], cols, s, window)  # (n_act, BM, BN)
        sc = scores_cpu(q64[:, :, act], k64[:, :, kb], scale)
        sc = torch.where(vis, sc, -math.inf)
        m_old = m[:, :, act]
        m_new = torch.maximum(m_old, sc.amax(dim=-1))
        m_inf = m_old == -math.inf
        alpha = torch.where(
            m_old == m_new,
            1.0,
            torch.where(
                m_inf,
                0.0,
                mathfn.exp(torch.where(m_inf, 0.0, m_old) - torch.where(m_inf, 0.0, m_new)),
            ),
        )
        # masked lanes subtract 0 - 0 instead of -inf - -inf (same bits where visible)
        shifted = torch.where(vis, sc, 0.0) - torch.where(vis, m_new.unsqueeze(-1), 0.0)
        p = torch.where(vis, mathfn.exp(shifted), 0.0)
        pu = p * pow2_f32(-u[:, :, kb]).unsqueeze(-2)  # V's row scales folded into P
        t = torch.clamp(133 - ((pu.amax(dim=-1).view(torch.int32) >> 23) & 0xFF), max=_P_EXP_CAP)
        p8 = torch.clamp(rne_int(pu * pow2_f32(t).unsqueeze(-1)), max=127.0)
        # exact in float32: every partial sum is an integer below 127^2 * BLOCK_N < 2^24,
        # so any summation order the BLAS picks gives the same (exact) value
        ii = p8 @ v8[:, :, kb].to(torch.float32)
        c = ii * pow2_f32(-t).unsqueeze(-1)
        l[:, :, act] = l[:, :, act] * alpha + tree_sum_cpu(p, -1)
        acc[:, :, act] = acc[:, :, act] * alpha.unsqueeze(-1) + c
        m[:, :, act] = m_new
    out = (acc / l.unsqueeze(-1)).to(torch.bfloat16).reshape(b, hq, n_qb * BLOCK_M, d)[:, :, :s]
    lse = (m + mathfn.log(l)).reshape(b, hq, n_qb * BLOCK_M)[:, :, :s]
    return out.contiguous(), lse.contiguous()


if HAVE_TRITON:
    from open1b_kernels.core.mathfn import exp_tl, log_tl

    _RNE_K = tl.constexpr(_RNE_MAGIC)
    _CAP_K = tl.constexpr(_P_EXP_CAP)

    @triton.jit
    def _fwd_kernel(
        qd_ptr,
        eq_ptr,
        kd_ptr,
        ek_ptr,
        v8_ptr,
        u_ptr,
        out_ptr,
        lse_ptr,
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
        # Program (qb, b * HQ + h): one query block of one head, over its band of key blocks.
        qb, bh, bk, rows = tl_query_block(HQ, GROUP, BM)
        rd = tl.arange(0, D)
        rn = tl.arange(0, BN)
        q_off = (bh * SQP + rows[:, None]).to(tl.int64) * D + rd[None, :]
        q0 = tl.load(qd_ptr + q_off)
        q1 = tl.load(qd_ptr + q_plane + q_off)
        q2 = tl.load(qd_ptr + 2 * q_plane + q_off)
        eq = tl.load(eq_ptr + bh * SQP + rows)
        m = tl.full([BM], float("-inf"), tl.float32)
        l = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        lo, hi = tl_band(qb, window, n_kb, BM, BN, HAS_WINDOW)
        for kb in range(lo, hi + 1):
            cols = kb * BN + rn
            kt_off = (bk * SKP + cols[None, :]).to(tl.int64) * D + rd[:, None]  # (D, BN): K^T
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
                m == m_new,
                1.0,
                tl.where(m_inf, 0.0, exp_tl(tl.where(m_inf, 0.0, m) - tl.where(m_inf, 0.0, m_new))),
            )
            shifted = tl.where(vis, sc, 0.0) - tl.where(vis, m_new[:, None], 0.0)
            p = tl.where(vis, exp_tl(shifted), 0.0)
            pu = p * tl_pow2_f32(-tl.load(u_ptr + bk * SKP + cols))[None, :]
            pbits = tl.max(pu, axis=1).to(tl.int32, bitcast=True)
            t = tl.minimum(133 - ((pbits >> 23) & 0xFF), _CAP_K)
            p8 = tl.minimum((pu * tl_pow2_f32(t)[:, None] + _RNE_K) - _RNE_K, 127.0).to(tl.int8)
            v8 = tl.load(v8_ptr + (bk * SKP + cols[:, None]).to(tl.int64) * D + rd[None, :])
            c = tl.dot(p8, v8, out_dtype=tl.int32).to(tl.float32) * tl_pow2_f32(-t)[:, None]
            l = l * alpha + tree_sum_rows(p, BM, BN)
            acc = acc * alpha[:, None] + c
            m = m_new
        keep = rows < seq
        # padded rows past the sequence may see no key with a window (l = 0); never stored
        out = tl_to_bf16(tl.div_rn(acc, tl.where(keep, l, 1.0)[:, None]))
        tl.store(
            out_ptr + (bh * seq + rows[:, None]).to(tl.int64) * D + rd[None, :],
            out,
            mask=keep[:, None],
        )
        tl.store(lse_ptr + bh * seq + rows, m + log_tl(l), mask=keep)


def forward_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton path of the forward (same bits as ``forward_cpu``)."""
    check_inputs(q, k, v, window)
    b, hq, s, d = q.shape
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    qd, eq = sliced_rows(q, BLOCK_M)
    kd, ek = sliced_rows(k, BLOCK_N)
    v8, u = quantize_v(v)
    out = torch.empty((b, hq, s, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((b, hq, s), dtype=torch.float32, device=q.device)
    _fwd_kernel[(n_qb, b * hq)](
        qd,
        eq,
        kd,
        ek,
        v8.contiguous(),
        u.contiguous(),
        out,
        lse,
        s,
        window if window is not None else 0,
        softmax_scale(d),
        qd[0].numel(),
        kd[0].numel(),
        n_kb,
        HQ=hq,
        GROUP=hq // k.shape[1],
        D=d,
        SQP=n_qb * BLOCK_M,
        SKP=n_kb * BLOCK_N,
        BM=BLOCK_M,
        BN=BLOCK_N,
        HAS_WINDOW=window is not None,
        **LAUNCH_OPTIONS,
    )
    return out, lse


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out bf16 (B, Hq, S, D), lse fp32 (B, Hq, S)); Triton on CUDA, the CPU reference else."""
    if use_triton(q):
        return forward_triton(q, k, v, window)
    return forward_cpu(q, k, v, window)


# ---------------------------------------------------------------- GPU check registry

_OPEN1B = {"batch": 4, "seq": 4096, "hq": 16, "hkv": 4, "dim": 128}


def _make_inputs(window: int | None):
    def make(scale: float, device):
        g = seeded_generator(4096 if window is None else window)
        b, hq, hkv, d = _OPEN1B["batch"], _OPEN1B["hq"], _OPEN1B["hkv"], _OPEN1B["dim"]
        s = scaled(_OPEN1B["seq"], scale, BLOCK_M)
        q, do = (torch.randn(b, hq, s, d, generator=g).to(torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(b, hkv, s, d, generator=g).to(torch.bfloat16) for _ in range(2))
        return {
            "q": q.to(device),
            "k": k.to(device),
            "v": v.to(device),
            "do": do.to(device),
            "window": window,
        }

    return make


def _run(a):
    out, lse = attention_forward(a["q"], a["k"], a["v"], a["window"])
    return (out, lse) + tuple(
        attention_backward(a["q"], a["k"], a["v"], out, lse, a["do"], a["window"])
    )


def _sdpa(a):
    """Stock PyTorch: SDPA forward + backward in bf16 (flash when fully causal; with a window
    a boolean mask and repeated KV heads, which SDPA serves with its memory-efficient kernel)."""
    q, k, v = (a[n].detach().requires_grad_() for n in ("q", "k", "v"))
    f = torch.nn.functional.scaled_dot_product_attention
    if a["window"] is None:
        out = f(q, k, v, is_causal=True, enable_gqa=True)
    else:
        s, group = q.shape[2], q.shape[1] // k.shape[1]
        i = torch.arange(s, device=q.device)
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - a["window"])
        out = f(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=mask)
    out.backward(a["do"])
    return out, q.grad, k.grad, v.grad


def _cost(a):
    b, hq, s, d = a["q"].shape
    w = a["window"] or s
    pairs = sum(min(i + 1, w) for i in range(s))
    # forward 2 matmuls, backward 5 (incl. the recomputed scores): 2 flops per multiply-add
    return Cost(
        flops=7 * 2 * b * hq * pairs * d, bytes=2 * (4 * a["q"].numel() + 3 * 2 * a["k"].numel())
    )


def _describe(window):
    return lambda s: (
        f"B4 x S{scaled(_OPEN1B['seq'], s, BLOCK_M)} x 16/4 heads x D128, "
        f"{'window ' + str(window) if window else 'fully causal'}, fwd+bwd"
    )


GPU_CHECKS = [
    GpuCheck(
        name=f"attention.fwd_bwd_{'w' + str(w) if w else 'causal'}",
        make_inputs=_make_inputs(w),
        run=_run,
        torch_baseline=_sdpa,
        cost=_cost,
        describe=_describe(w),
        # the CPU reference's cost grows with the square of the sequence: fully causal at
        # S = 512 (eight blocks each way) takes seconds where S = 1,024 outlasted a lease
        parity_scale=0.25 if w else 0.125,
        bound="compute",
        notes="outputs: out, lse, dq, dk, dv; baseline SDPA bf16 fwd+bwd",
    )
    for w in (512, None)
]
