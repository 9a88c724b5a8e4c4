"""The straight-through estimator (STE) of the W8A8 linear's quantizer
(open1b_kernels/int8/quantize.py) with its LSQ step term, for the linear's backward
(open1b_kernels/int8/linear.py).

- ``ste(g, x, s)``: the gradient passes where -127 <= v <= 127 (v = x / s before
  rounding, IEEE division; a zero step divides by 1), zero outside; with ``want_term`` also
  the LSQ term ``g * t``, t = rne(v) - v inside and the clamp bound (-127 or 127) outside.
  Every float step is one IEEE binary32 operation, round-to-nearest-even, never fused.
- ``ste_term_sum_cpu``: the CPU backward's form - dx and the term's pairwise tree sum
  (``open1b_kernels.core.reduce``), the term summed block by block of the tree as it is
  made (``_ste.c``'s ``ste_sums``), never written: the same adds in the same order.

The CPU path uses ``torch.round`` for ``rne`` (the same values up to the sign of a zero,
which the term t cannot show: see ``ste_cpu``); the compiled loops (``_ste.c``) do the torch
code's operations element by element; the Triton kernel is the GPU's.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.reduce import LOOPS as REDUCE_LOOPS
from open1b_kernels.core.reduce import TREE_BLOCK, next_pow2, tree_of_partials, tree_sum_cpu
from open1b_kernels.int8.gemm import bf16_operand, bf16_rne
from open1b_kernels.int8.quantize import BLOCK_K, BLOCK_R, LOOPS, Q_MAX, safe_step

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.int8.gemm import bf16_rne_bits, load_f32
    from open1b_kernels.int8.quantize import RND_K

# ``ste_term_sum_cpu`` in one compiled pass (``ste_sums`` in _ste.c: each aligned block of
# the term's tree summed as it is made) - False: the STE's term written, then summed by
# ``tree_sum_cpu`` (the same bits; the benchmark's side by side).
FUSED_STE = True


def ste_cpu(g: torch.Tensor, x: torch.Tensor, step: torch.Tensor, want_term: bool,
            out_bf16: bool):
    """STE mask (and LSQ term g * dv/ds) of the quantizer at (x, step); see the module
    docstring."""
    if out_bf16:                       # the same operations in one compiled pass
        fast = _ste_compiled(g, x, safe_step(step.reshape(-1)), want_term)
        if fast is not None:
            return fast
    v = x.to(torch.float32) / safe_step(step.reshape(-1, 1))
    inside = (v >= -Q_MAX) & (v <= Q_MAX)
    dx = torch.where(inside, g, 0.0)
    dx = bf16_rne(dx) if out_bf16 else dx
    if not want_term:
        return dx, None
    vc = v.clamp(-Q_MAX, Q_MAX)
    # t = rne(vc) - v inside, vc outside. round(vc) - v equals (vc + RND - RND) - v even
    # for a zero rne: -0 - (-0) = +0 - (-0) = +0 and -0 - v = +0 - v for v != 0.
    t = torch.where(inside, vc.round().sub_(v), vc)
    return dx, t.mul_(g)


def ste_term_sum_cpu(g: torch.Tensor, x: torch.Tensor, step: torch.Tensor):
    """(bf16 dx, the LSQ term's pairwise tree sum as a 0-d float32): ``ste_cpu(g, x, step,
    True, True)`` with ``tree_sum_cpu`` of its term flattened in place of the term - what a
    linear's backward needs for its scale's gradient. Compiled, one pass by aligned blocks
    of the tree, each block's term summed while it is in cache (the term's R x K floats
    never written and read back); the same operations, so the same bits."""
    fast = _ste_sums_compiled(g, x, safe_step(step.reshape(-1)))
    if fast is not None:
        return fast
    dx, term = ste_cpu(g, x, step, True, True)
    return dx, tree_sum_cpu(term.reshape(-1), 0)


def _loop_operands(g: torch.Tensor, x: torch.Tensor, div: torch.Tensor):
    """(R, C, the loops' leading arguments: g, x, whether x is bf16, div, whether div is per
    row) for contiguous (R, C) float32 ``g`` and bf16/float32 ``x`` on the CPU with ``div``
    the safe step per row (R,) or for all (1,), or None where they do not fit the loops."""
    if (g.device.type != "cpu" or g.dtype != torch.float32
            or x.dtype not in (torch.bfloat16, torch.float32) or g.dim() != 2
            or g.shape != x.shape or not (g.is_contiguous() and x.is_contiguous())):
        return None
    r, c = g.shape
    d = div.reshape(-1).to(torch.float32).contiguous()
    if d.numel() not in (1, r):
        return None
    xs = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
    return r, c, (g.reshape(-1).numpy(), xs.reshape(-1).numpy(), x.dtype == torch.bfloat16,
                  d.numpy(), d.numel() == r and r != 1)


def _ste_compiled(g: torch.Tensor, x: torch.Tensor, div: torch.Tensor, want_term: bool):
    """``ste_cpu`` with bf16 dx by the compiled loop - the same float32 operations (division,
    comparisons, clamp, round half to even, subtraction, product): (dx bf16, term float32
    or None), or None when the loop is unavailable or the operands do not fit it."""
    got = _loop_operands(g, x, div) if LOOPS.available() else None
    if got is None:
        return None
    r, c, lead = got
    dx = torch.empty((r, c), dtype=torch.bfloat16)
    term = torch.empty((r, c)) if want_term else torch.empty(0)
    args = (*lead, dx.view(torch.int16).reshape(-1).numpy(), term.reshape(-1).numpy())
    parallel(lambda lo, hi, p: LOOPS.ste(*args, r, c, lo, hi, p), r, grain=16)
    return dx, (term if want_term else None)


def _ste_sums_compiled(g: torch.Tensor, x: torch.Tensor, div: torch.Tensor):
    """``ste_term_sum_cpu`` by the compiled loop (``ste_sums``: the blocks of the term's tree
    that hold values, cut among the threads; the padding's blocks sum to +0.0 as
    ``tree_blocks`` gives them), then the tree over the blocks' partials; None where a loop
    is unavailable or the operands do not fit (fewer than one block of values)."""
    fits = FUSED_STE and LOOPS.available() and REDUCE_LOOPS.available()
    got = _loop_operands(g, x, div) if fits and g.numel() >= TREE_BLOCK else None
    if got is None:
        return None
    r, c, lead = got
    n = r * c
    dx = torch.empty((r, c), dtype=torch.bfloat16)
    partials = torch.zeros(next_pow2(n) // TREE_BLOCK, dtype=torch.float32)
    args = (*lead, dx.view(torch.int16).reshape(-1).numpy(), partials.numpy())
    parallel(lambda lo, hi, p: LOOPS.ste_sums(*args, r, c, TREE_BLOCK, lo, hi, p),
             -(-n // TREE_BLOCK), grain=8)
    return dx, tree_of_partials(partials)


if HAVE_TRITON:

    @triton.jit
    def _ste_kernel(g_ptr, x_ptr, s_ptr, dx_ptr, t_ptr, R, K, s_stride,
                    WANT_TERM: tl.constexpr, OUT_BF16: tl.constexpr, IS_BF16: tl.constexpr,
                    BR: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        cols = tl.program_id(1) * BK + tl.arange(0, BK)
        mask = (rows[:, None] < R) & (cols[None, :] < K)
        off = rows[:, None].to(tl.int64) * K + cols[None, :]
        g = tl.load(g_ptr + off, mask=mask, other=0.0)
        x = load_f32(x_ptr + off, mask, 0.0, IS_BF16)
        s = tl.load(s_ptr + rows * s_stride, mask=rows < R, other=1.0)
        s = tl.where(s == 0.0, 1.0, s)
        v = tl.div_rn(x, s[:, None])
        inside = (v >= -127.0) & (v <= 127.0)
        dx = tl.where(inside, g, 0.0)
        if OUT_BF16:
            tl.store(dx_ptr + off, bf16_rne_bits(dx), mask=mask)
        else:
            tl.store(dx_ptr + off, dx, mask=mask)
        if WANT_TERM:
            vc = tl.minimum(tl.maximum(v, -127.0), 127.0)
            t = tl.where(inside, ((vc + RND_K) - RND_K) - v, vc)
            tl.store(t_ptr + off, g * t, mask=mask)


def ste(g: torch.Tensor, x: torch.Tensor, step: torch.Tensor, want_term: bool,
        out_bf16: bool):
    """(masked gradient, LSQ term or None) for contiguous (R, K) g (fp32) and x."""
    if not use_triton(g):
        return ste_cpu(g, x, step, want_term, out_bf16)
    r, k = g.shape
    dx = torch.empty((r, k), dtype=torch.bfloat16 if out_bf16 else torch.float32,
                     device=g.device)
    t = torch.empty((r, k), dtype=torch.float32, device=g.device) if want_term else dx
    if dx.numel():
        s = step.reshape(-1).to(torch.float32)
        xk, is_bf16 = bf16_operand(x.contiguous())
        grid = (triton.cdiv(r, BLOCK_R), triton.cdiv(k, BLOCK_K))
        _ste_kernel[grid](g, xk, s, dx.view(torch.int16) if out_bf16 else dx, t, r, k,
                          0 if s.numel() == 1 else 1, WANT_TERM=want_term, OUT_BF16=out_bf16,
                          IS_BF16=is_bf16, BR=BLOCK_R, BK=BLOCK_K, **LAUNCH_OPTIONS)
    return dx, (t if want_term else None)
