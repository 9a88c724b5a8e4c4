"""RoPE at explicit positions: the rotation of ``open1b_kernels.ops.rope`` for tokens that are not at
0 .. T-1 (one-token decoding with a KV cache: the new token of sequence b sits at pos[b]).

Layout: x is (N, H, D) (tokens, heads, head dim), ``pos`` (N,) integer positions in
[0, rope.MAX_T). The arithmetic is ``open1b_kernels.ops.rope``'s, element for element:
    angle[n, i] = float32(pos[n]) * inv_f[i]          one rounding (pos < 2^24 is exact)
    cos, sin    = mathfn.sincos(angle)
    y1 = x1 * cos - x2 * sin        y2 = x2 * cos + x1 * sin    (float32, never fused)
rounded once to x's dtype - so token n gets exactly the bits ``rope_fwd`` gives the token at
position pos[n] of a sequence (tests/kernels/test_rope_at.py checks it on both paths).
"""
from __future__ import annotations

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.reduce import f32, next_pow2
from open1b_kernels.ops.rope import MAX_T, THETA, inv_freq

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import cast_tl, exp_tl, log_tl, sincos_tl, widen_tl

BLOCK_T = 16


def _check(x: torch.Tensor, pos: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() != 3:
        raise ValueError(f"rope_at expects x (N, H, D), got shape {tuple(x.shape)}")
    n, h, d = x.shape
    if d % 2:
        raise ValueError(f"rope head dim must be even, got {d}")
    if pos.shape != (n,):
        raise ValueError(f"rope_at expects pos of shape ({n},), got {tuple(pos.shape)}")
    if n and (int(pos.min()) < 0 or int(pos.max()) >= MAX_T):
        raise ValueError(f"rope positions must lie in [0, {MAX_T}), got "
                         f"{int(pos.min())}..{int(pos.max())}")
    return n, h, d


def rope_at_cpu(x: torch.Tensor, pos: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """CPU reference of ``rope_at``."""
    _, _, d = _check(x, pos)
    angle = pos.cpu().to(torch.float32)[:, None] * inv_freq(d, theta)[None, :]
    sin, cos = mathfn.sincos(angle)
    c, s = cos[:, None, :].to(x.device), sin[:, None, :].to(x.device)  # (N, 1, D/2)
    xf = x.to(torch.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    out = torch.empty_like(x)
    out[..., : d // 2] = (x1 * c - x2 * s).to(x.dtype)
    out[..., d // 2:] = (x2 * c + x1 * s).to(x.dtype)
    return out


if HAVE_TRITON:

    @triton.jit
    def _rope_at_kernel(x_ptr, pos_ptr, y_ptr, N, H, D, frac_step, theta,
                        BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr):
        # Program t-block: BLOCK_T tokens x all heads (open1b_kernels.ops.rope's tile, positions loaded).
        tb = tl.program_id(0)
        half = D // 2
        ts = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, BLOCK_HALF)
        ps = tl.load(pos_ptr + ts, mask=ts < N, other=0)
        frac = cols.to(tl.float32) * frac_step
        lt = log_tl(tl.full((BLOCK_HALF,), theta, tl.float32))
        inv = exp_tl(-(frac * lt))
        angle = ps.to(tl.float32)[:, None] * inv[None, :]
        sn, cs = sincos_tl(angle)
        mask = (ts[:, None] < N) & (cols[None, :] < half)
        for h in range(H):
            offs = (ts[:, None].to(tl.int64) * H + h) * D + cols[None, :]
            x1 = widen_tl(tl.load(x_ptr + offs, mask=mask, other=0.0))
            x2 = widen_tl(tl.load(x_ptr + offs + half, mask=mask, other=0.0))
            y1 = x1 * cs - x2 * sn
            y2 = x2 * cs + x1 * sn
            tl.store(y_ptr + offs, cast_tl(y1, y_ptr.dtype.element_ty), mask=mask)
            tl.store(y_ptr + offs + half, cast_tl(y2, y_ptr.dtype.element_ty), mask=mask)


def rope_at(x: torch.Tensor, pos: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """Rotate token n of x (N, H, D) by position pos[n]; y in x's dtype (Triton on CUDA)."""
    if not use_triton(x):
        return rope_at_cpu(x, pos, theta)
    n, h, d = _check(x, pos)
    xc = x.contiguous()
    y = torch.empty_like(xc)
    p = pos.to(device=x.device, dtype=torch.int32).contiguous()
    _rope_at_kernel[(triton.cdiv(n, BLOCK_T),)](
        xc, p, y, n, h, d, f32(2.0 / d), f32(theta),
        BLOCK_T=BLOCK_T, BLOCK_HALF=max(1, next_pow2(d // 2)), **LAUNCH_OPTIONS)
    return y
