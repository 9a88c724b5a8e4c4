"""SwiGLU on the fused gate|up projection: y = silu(gate) * up, forward and backward.

Layout: h is (..., 2F) with gate = h[..., :F] and up = h[..., F:] (Open-1B: F = 5,632, the
output of the one fused gate|up GEMM); y is (..., F).

Arithmetic (float32 from the bf16 inputs, IEEE round-to-nearest-even, never fused;
exp is ``open1b_kernels.core.mathfn``'s):
    e = exp(-g);  den = e + 1;  s = g / den;  y = s * u            y rounded once to h's dtype
Backward, given dy (..., F):
    sig = 1 / den;  dsilu = sig * ((g * (1 - sig)) + 1)
    d_up = dy * s;  d_gate = (dy * u) * dsilu                       dh = [d_gate | d_up]
Subnormals IEEE. For finite g far below zero, exp(-g) overflows to inf and s = -0.0,
sig = 0, dsilu = -0.0 or 0.0 (finite, the right limits). g = -inf gives NaN (inf * 0);
NaN propagates (payloads are not part of the contract).
"""
from __future__ import annotations

import torch

from open1b_kernels.core import mathfn
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import cast_tl, exp_tl, widen_tl

BLOCK = 1024
LOOPS = Loops("open1b_kernels.ops._opsc")    # the CPU reference compiled: _swiglu.c


def _split(h: torch.Tensor) -> int:
    if h.shape[-1] % 2:
        raise ValueError(f"swiglu expects the fused gate|up (..., 2F), got last dim {h.shape[-1]}")
    return h.shape[-1] // 2


# ------------------------------------------------------------------ CPU reference
def _fwd_elems(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    gf, uf = g.to(torch.float32), u.to(torch.float32)
    den = mathfn.exp(-gf) + 1.0
    return ((gf / den) * uf).to(g.dtype)


def _bwd_elems(dy: torch.Tensor, g: torch.Tensor, u: torch.Tensor):
    gf, uf, dyf = g.to(torch.float32), u.to(torch.float32), dy.to(torch.float32)
    den = mathfn.exp(-gf) + 1.0
    s = gf / den
    sig = torch.ones_like(den) / den
    dsilu = sig * ((gf * (1.0 - sig)) + 1.0)
    return ((dyf * uf) * dsilu).to(g.dtype), (dyf * s).to(g.dtype)


def swiglu_fwd_cpu(h: torch.Tensor) -> torch.Tensor:
    f = _split(h)
    fast = _swiglu_compiled(h)                              # the same operations, compiled
    if fast is not None:
        return fast
    return mathfn.map_chunks(_fwd_elems, h[..., :f], h[..., f:])


def swiglu_bwd_cpu(dy: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    f = _split(h)
    fast = _swiglu_compiled(h, dy) if dy.shape == (*h.shape[:-1], f) else None
    if fast is not None:
        return fast
    d_gate, d_up = mathfn.map_chunks(_bwd_elems, dy, h[..., :f], h[..., f:])
    return torch.cat([d_gate, d_up], dim=-1)


def _swiglu_compiled(h: torch.Tensor, dy: torch.Tensor | None = None) -> torch.Tensor | None:
    """``open1b_kernels.ops.swiglu``'s CPU forward (dy None: y (..., F)) or backward (dh (..., 2F))
    for bf16 h (..., 2F) and dy (..., F) by the compiled rows - the same float32 operations
    in the same order - or None when the loop is unavailable or a dtype does not fit."""
    if (not LOOPS.available() or h.device.type != "cpu" or h.dtype != torch.bfloat16
            or (dy is not None and dy.dtype != torch.bfloat16) or h.shape[-1] % 2):
        return None
    f = h.shape[-1] // 2
    hc = h.contiguous()
    r = hc.numel() // max(2 * f, 1)
    shape = (*h.shape[:-1], f if dy is None else 2 * f)
    out = torch.empty(shape, dtype=torch.bfloat16)
    d = (flat(dy.contiguous().view(torch.int16)) if dy is not None
         else none(torch.int16))
    args = (flat(hc.view(torch.int16)), d, flat(out.view(torch.int16)), r, f)
    parallel(lambda lo, hi, p: LOOPS.swiglu(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 8 // max(f, 1)))
    return out


# ------------------------------------------------------------------ Triton
if HAVE_TRITON:

    @triton.jit
    def _swiglu_kernel(h_ptr, dy_ptr, out_ptr, F, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
        # Program (row, column block): a 2-D grid, so no per-element integer division.
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = col < F
        idx = row * F + col
        goff = row * (2 * F) + col
        g = widen_tl(tl.load(h_ptr + goff, mask=mask, other=0.0))
        u = widen_tl(tl.load(h_ptr + goff + F, mask=mask, other=0.0))
        den = exp_tl(-g) + 1.0
        s = tl.div_rn(g, den)
        if BACKWARD:
            dy = widen_tl(tl.load(dy_ptr + idx, mask=mask, other=0.0))
            sig = tl.div_rn(tl.full((BLOCK,), 1.0, tl.float32), den)
            dsilu = sig * ((g * (1.0 - sig)) + 1.0)
            tl.store(out_ptr + goff, cast_tl((dy * u) * dsilu, out_ptr.dtype.element_ty), mask=mask)
            tl.store(out_ptr + goff + F, cast_tl(dy * s, out_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(out_ptr + idx, cast_tl(s * u, out_ptr.dtype.element_ty), mask=mask)


def swiglu_fwd(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of the fused (..., 2F) ``h``: (..., F) in h's dtype."""
    if not use_triton(h):
        return swiglu_fwd_cpu(h)
    f = _split(h)
    hc = h.contiguous()
    y = torch.empty(*h.shape[:-1], f, dtype=h.dtype, device=h.device)
    grid = (y.numel() // f, triton.cdiv(f, BLOCK))
    _swiglu_kernel[grid](hc, hc, y, f, BACKWARD=False, BLOCK=BLOCK, **LAUNCH_OPTIONS)
    return y


def swiglu_bwd(dy: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Gradient with respect to the fused ``h``: (..., 2F) = [d_gate | d_up] in h's dtype."""
    if not use_triton(h):
        return swiglu_bwd_cpu(dy, h)
    f = _split(h)
    hc, dyc = h.contiguous(), dy.contiguous()
    dh = torch.empty_like(hc)
    grid = (dyc.numel() // f, triton.cdiv(f, BLOCK))
    _swiglu_kernel[grid](hc, dyc, dh, f, BACKWARD=True, BLOCK=BLOCK, **LAUNCH_OPTIONS)
    return dh


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(17)
    t = scaled(16_384, scale, 16)
    h = (torch.randn(t, 11_264, generator=g) * 2.0).to(torch.bfloat16)
    dy = torch.randn(t, 5_632, generator=g).to(torch.bfloat16)
    return (h.to(device), dy.to(device))


def _baseline(a):
    h, dy = a
    hr = h.detach().requires_grad_(True)
    g, u = hr.chunk(2, dim=-1)
    y = torch.nn.functional.silu(g) * u
    y.backward(dy)
    return (y, hr.grad)


GPU_CHECKS = [
    GpuCheck(
        name="swiglu.fwd_bwd",
        make_inputs=_make,
        run=lambda a: (swiglu_fwd(a[0]), swiglu_bwd(a[1], a[0])),
        torch_baseline=_baseline,
        # fwd reads h (2F), writes y (F); bwd reads h (2F) and dy (F), writes dh (2F)
        cost=lambda a: Cost(flops=20 * a[1].numel(), bytes=8 * a[1].numel() * a[0].element_size()),
        describe=lambda s: f"bf16 h ({scaled(16_384, s, 16)}, 11264) -> (.., 5632), fwd+bwd",
    ),
]
