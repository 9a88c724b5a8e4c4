"""Rotary position embedding (RoPE), theta 500,000, rotate-half convention, fwd + bwd.

Layout: x is (..., T, H, D) (batch dims, tokens, heads, head dim; Open-1B: D = 128);
token t has position t. Pairs are (i, i + D/2) for i < D/2 (the Llama / HF "rotate_half"
convention).

Tables (float32, built only from exact ops and ``open1b_kernels.core.mathfn``):
    lt       = mathfn.log(float32(theta))
    inv_f[i] = mathfn.exp(-((float32(i) * float32(2 / D)) * lt))   (i * 2/D exact for D = 2^k)
    a[t, i]  = float32(t) * inv_f[i]                      one rounding (t < 2^24 is exact)
    cos, sin = mathfn.sincos(a)
The Triton kernel computes the same values inline (no table in memory). The float32 angle
carries the usual float32 position error (half an ulp of t * inv_f: <= 2.5e-4 rad at
t = 4095), like any float32 RoPE table; sin/cos of that angle are accurate to ~1e-7.

Rotation (float32, each product rounded, then one add/sub; never fused):
    y1 = x1 * cos - x2 * sin        y2 = x2 * cos + x1 * sin
rounded once to x's dtype. Backward is the rotation by -a: the same code with sin negated
(bit-identical to dx1 = dy1*cos + dy2*sin, dx2 = dy2*cos - dy1*sin, since negation and
a - (-b) = a + b are exact). Subnormals IEEE; NaN/inf propagate through the products.
"""
from __future__ import annotations

import functools

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.reduce import f32, next_pow2
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import cast_tl, exp_tl, log_tl, sincos_tl, widen_tl

THETA = 500_000.0
MAX_T = 8192  # angles stay inside mathfn.sincos's stated accuracy domain |a| <= 8192
BLOCK_T = 16
LOOPS = Loops("open1b_kernels.ops._opsc")    # the CPU rotation compiled: _rope.c


def _check(x: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() < 3:
        raise ValueError(f"rope expects (..., T, H, D), got shape {tuple(x.shape)}")
    t, h, d = x.shape[-3:]
    if d % 2:
        raise ValueError(f"rope head dim must be even, got {d}")
    if t > MAX_T:
        raise ValueError(f"rope supports up to {MAX_T} positions (sincos accuracy domain), got {t}")
    return t, h, d


def inv_freq(d: int, theta: float = THETA) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies exp(-(2i/D) * log(theta)) from mathfn."""
    lt = mathfn.log(torch.tensor([f32(theta)], dtype=torch.float32))
    frac = torch.arange(d // 2, dtype=torch.float32) * f32(2.0 / d)
    return mathfn.exp(-(frac * lt))


def tables(t: int, d: int, theta: float = THETA) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (T, D/2) float32: the RoPE tables (CPU reference)."""
    angle = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq(d, theta)[None, :]
    return mathfn.sincos(angle)[::-1]


@functools.lru_cache(maxsize=8)
def _tables_cached(t: int, d: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``tables`` kept per (T, D, theta) for the CPU rotation, which only reads them: a step
    rotates q and k in every layer, forward and backward, with the same tables (their
    software sincos cost ~5 ms of a demo step)."""
    return tables(t, d, theta)


def _rotate_cpu(x: torch.Tensor, theta: float, sign: float) -> torch.Tensor:
    t, h, d = _check(x)
    cos, sin = _tables_cached(t, d, float(theta))
    fast = _rotate_compiled(x, cos, sin, sign) if x.numel() else None
    if fast is not None:           # the compiled rows: the same operations in the same order
        return fast
    cos, sin = cos[:, None, :], sin[:, None, :] * sign  # (T, 1, D/2) broadcast over heads
    step = max(1, mathfn.CPU_CHUNK // (h * d))  # token blocks: temporaries stay in cache
    out = torch.empty_like(x)
    for t0 in range(0, t, step):
        xf = x[..., t0:t0 + step, :, :].to(torch.float32)
        c, s = cos[t0:t0 + step], sin[t0:t0 + step]
        x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
        out[..., t0:t0 + step, :, : d // 2] = (x1 * c - x2 * s).to(x.dtype)
        out[..., t0:t0 + step, :, d // 2:] = (x2 * c + x1 * s).to(x.dtype)
    return out


if HAVE_TRITON:

    @triton.jit
    def _rope_kernel(x_ptr, y_ptr, T, H, D, frac_step, theta, sign,
                     BLOCK_T: tl.constexpr, BLOCK_HALF: tl.constexpr):
        # Program (seq, t-block): BLOCK_T tokens x all heads; sin/cos computed once per tile.
        seq = tl.program_id(0)
        tb = tl.program_id(1)
        half = D // 2
        ts = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        cols = tl.arange(0, BLOCK_HALF)
        frac = cols.to(tl.float32) * frac_step
        lt = log_tl(tl.full((BLOCK_HALF,), theta, tl.float32))
        inv = exp_tl(-(frac * lt))
        angle = ts.to(tl.float32)[:, None] * inv[None, :]
        sn, cs = sincos_tl(angle)
        sn = sn * sign
        mask = (ts[:, None] < T) & (cols[None, :] < half)
        base = seq.to(tl.int64) * T * H * D
        for h in range(H):
            offs = base + (ts[:, None].to(tl.int64) * H + h) * D + cols[None, :]
            x1 = widen_tl(tl.load(x_ptr + offs, mask=mask, other=0.0))
            x2 = widen_tl(tl.load(x_ptr + offs + half, mask=mask, other=0.0))
            y1 = x1 * cs - x2 * sn
            y2 = x2 * cs + x1 * sn
            tl.store(y_ptr + offs, cast_tl(y1, y_ptr.dtype.element_ty), mask=mask)
            tl.store(y_ptr + offs + half, cast_tl(y2, y_ptr.dtype.element_ty), mask=mask)


def _rotate_compiled(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float
                     ) -> torch.Tensor | None:
    """``_rotate_cpu`` for bf16 x (..., T, H, D) with the float32 tables (T, D/2) by the
    compiled rows - the same float32 operations in the same order - or None when the loop is
    unavailable or a dtype or sign does not fit."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.bfloat16
            or cos.dtype != torch.float32 or sin.dtype != torch.float32
            or sign not in (1.0, -1.0)):
        return None
    t, h, d = x.shape[-3:]
    xc = x.contiguous()
    r = xc.numel() // max(d, 1)
    out = torch.empty_like(xc)
    args = (flat(xc.view(torch.int16)), flat(cos.contiguous()), flat(sin.contiguous()),
            float(sign), flat(out.view(torch.int16)), r, t, h, d // 2)
    parallel(lambda lo, hi, p: LOOPS.rope(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // max(d, 1)))
    return out


def _rotate(x: torch.Tensor, theta: float, sign: float) -> torch.Tensor:
    if not use_triton(x):
        return _rotate_cpu(x, theta, sign)
    t, h, d = _check(x)
    xc = x.contiguous()
    y = torch.empty_like(xc)
    n_seq = xc.numel() // (t * h * d)
    grid = (n_seq, triton.cdiv(t, BLOCK_T))
    _rope_kernel[grid](xc, y, t, h, d, f32(2.0 / d), f32(theta), sign,
                       BLOCK_T=BLOCK_T, BLOCK_HALF=max(1, next_pow2(d // 2)), **LAUNCH_OPTIONS)
    return y


def rope_fwd(x: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """Rotate (..., T, H, D) by position: y in x's dtype."""
    return _rotate(x, theta, 1.0)


def rope_bwd(dy: torch.Tensor, theta: float = THETA) -> torch.Tensor:
    """Gradient of ``rope_fwd``: the rotation by minus the angle."""
    return _rotate(dy, theta, -1.0)


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(13)
    b = max(1, scaled(4, scale))
    q = torch.randn(b, 4_096, 16, 128, generator=g).to(torch.bfloat16)
    return (q.to(device),)


def _torch_rope(x):
    # Stock HF-style rotate_half RoPE in the input dtype with a float32 table.
    t, d = x.shape[-3], x.shape[-1]
    inv = 1.0 / (THETA ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.arange(t, device=x.device, dtype=torch.float32)[:, None] * inv[None, :]
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(x.dtype)[:, None, :], emb.sin().to(x.dtype)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


GPU_CHECKS = [
    GpuCheck(
        name="rope.fwd",
        make_inputs=_make,
        run=lambda a: (rope_fwd(a[0]),),
        torch_baseline=lambda a: (_torch_rope(a[0]),),
        cost=lambda a: Cost(flops=6 * a[0].numel(), bytes=2 * a[0].numel() * a[0].element_size()),
        describe=lambda s: f"bf16 q ({max(1, scaled(4, s))}, 4096, 16, 128)",
    ),
]
