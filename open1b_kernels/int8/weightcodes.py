"""The W8A8 linear's weight codes in one Triton pass per row: step, int8 codes, w_hat.

For w (N, K) bf16, row by row, the bits of open1b_kernels/int8/linear.py's definitions:

    sw[n]      = rn( rn(tree_sum_k |w[n, k]| * INV_K) * TWO_OVER_SQRT127 )    (weight_step)
    q_w[n, k]  = quantize(w, sw)[n, k]       rne(clamp(w / sw[n], -127, 127)), a zero
                                             step divides by 1 (quantize.py)
    w_hat[n, k] = rn(q_w[n, k] * sw[n])      float32 (the backward's dX operand)

The row's tree is reduce.py's pairwise tree over K zero-padded to P = next_pow2(K), taken
as CHUNK-element block trees (P / CHUNK of them, a power of two: the blockable tree)
then the tree over the block partials; |w| is never -0.0, so nothing about signed zeros
needs restoring. The second loop re-reads the row (from cache) for the codes.

Why a kernel of its own: the op-by-op form widened w to a float32 copy, took its absolute
value into another, reduced it in one or two tree launches, scaled the steps in two more,
then launched the quantizer - six launches and two weight-sized float32 temporaries per
call, twice per step (forward and backward), plus two more for w_hat. One launch here.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS
from open1b_kernels.core.reduce import next_pow2

if HAVE_TRITON:
    import triton.language as tl
    import triton

    from open1b_kernels.core.reduce import tree_sum_1d
    from open1b_kernels.int8.gemm import widen_bf16_bits
    from open1b_kernels.int8.quantize import RND_K

CHUNK = 4096   # elements of a row per block tree (a power of two)


if HAVE_TRITON:

    @triton.jit
    def _weight_codes_kernel(w_ptr, sw_ptr, q_ptr, hat_ptr, K, inv_k, two_over_sqrt127,
                             NCH: tl.constexpr, C: tl.constexpr, WANT_HAT: tl.constexpr):
        n = tl.program_id(0)
        row = n.to(tl.int64) * K
        idx = tl.arange(0, NCH)
        parts = tl.zeros((NCH,), tl.float32)
        for c in tl.static_range(NCH):
            cols = c * C + tl.arange(0, C)
            a = tl.abs(widen_bf16_bits(tl.load(w_ptr + row + cols, mask=cols < K, other=0)))
            parts = tl.where(idx == c, tree_sum_1d(a, C), parts)
        sw = (tree_sum_1d(parts, NCH) * inv_k) * two_over_sqrt127
        tl.store(sw_ptr + n, sw)
        div = tl.where(sw == 0.0, 1.0, sw)
        for c in tl.static_range(NCH):
            cols = c * C + tl.arange(0, C)
            mask = cols < K
            x = widen_bf16_bits(tl.load(w_ptr + row + cols, mask=mask, other=0))
            v = tl.minimum(tl.maximum(tl.div_rn(x, div), -127.0), 127.0)
            q = ((v + RND_K) - RND_K).to(tl.int8)
            tl.store(q_ptr + row + cols, q, mask=mask)
            if WANT_HAT:
                tl.store(hat_ptr + row + cols, q.to(tl.float32) * sw, mask=mask)


def weight_codes_triton(w: torch.Tensor, inv_k: float, two_over_sqrt127: float,
                        want_hat: bool = False):
    """(sw (N,) float32, q_w (N, K) int8, w_hat (N, K) float32 or None) of bf16 w."""
    if w.dtype != torch.bfloat16:
        raise TypeError(f"weight codes take a bf16 weight, got {w.dtype}")
    n, k = w.shape
    sw = torch.empty(n, dtype=torch.float32, device=w.device)
    q = torch.empty((n, k), dtype=torch.int8, device=w.device)
    hat = torch.empty((n, k), dtype=torch.float32, device=w.device) if want_hat else None
    if n and k:
        c = min(CHUNK, next_pow2(k))
        _weight_codes_kernel[(n,)](w.contiguous().view(torch.int16), sw, q,
                                   hat if want_hat else sw, k, inv_k, two_over_sqrt127,
                                   NCH=next_pow2(k) // c, C=c, WANT_HAT=want_hat,
                                   **LAUNCH_OPTIONS)
    elif n:
        sw.zero_()
    return sw, q, hat
