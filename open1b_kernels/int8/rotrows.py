"""The linear's dX rotation on the CPU: ``rotate_quantize`` of a bf16 gradient's rows, one
row at a time through cache (``rotq_rows`` in _rotrows.c), beside the columns' passes of
``open1b_kernels.int8.quantize`` it falls back to - the same bits."""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import PARALLEL_MIN, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8.hadamard import inv_sqrt, padded_width
from open1b_kernels.int8.quantize import (HADAMARD_BLOCK, INV_127, LOOPS,
                                          rotate_quantize_cols_cpu)


def rotate_quantize_rows_cpu(x: torch.Tensor, name: str):
    """``rotate_quantize(x)`` of a bf16 (R, K) matrix in its own layout: (codes (R, Kp)
    int8 row-major, scratch ``name``; steps (R,)) - the bits of ``rotate_quantize``.

    The linear's dX product rotates its gradient's rows; ``rotate_quantize_cols_cpu`` of
    the transposed view reaches them through a float32 transposed copy of the whole
    gradient and two more sweeps over it. With the compiled loop (``rotq_rows`` in
    _rotrows.c) each row goes once through cache instead: widened, rotated block by
    block, scaled, its extremes, its step and its codes. Else, or for another source, the
    columns' path in this layout."""
    r, k = x.shape
    kp = padded_width(k, HADAMARD_BLOCK)
    if not (LOOPS.available() and x.dtype == torch.bfloat16 and x.is_contiguous()
            and HADAMARD_BLOCK == 256 and r and k):
        return rotate_quantize_cols_cpu(x.t(), name, transposed=True)
    codes = scratch(name, (r, kp), torch.int8)
    step = torch.empty((r,), dtype=torch.float32)
    src, out, st = flat(x.view(torch.int16)), flat(codes), flat(step)
    scale = inv_sqrt(HADAMARD_BLOCK)
    parallel(lambda lo, hi, p: LOOPS.rotq_rows(src, r, k, kp, scale, INV_127, out, st, lo, hi,
                                               p),
             r, grain=max(1, PARALLEL_MIN // kp))
    return codes, step
