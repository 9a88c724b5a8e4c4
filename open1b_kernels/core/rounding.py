"""Exactly specified conversions every kernel needs, on both paths: bf16 <-> fp32 in Triton
that agree between the compiled GPU code and the interpreter, and the correctly rounded
float32 square root.

- ``widen_tl(x)``: exact widening to float32. bf16 goes by bit shift (the bf16 bits are
  the top half of the float32 bits): the interpreter's own bf16 -> fp32 cast mangles
  subnormals, the GPU's does not; the shift is right on both. CPU twin:
  ``.to(torch.float32)`` (exact).
- ``to_bf16_tl(x)``: float32 -> bf16, round to nearest even, NaN -> 0x7FC0, by integer bit
  arithmetic: the interpreter rounds ``.to(tl.bfloat16)`` half-up on the cut-off bit, so
  the two modes could disagree on ties. CPU twin: ``.to(torch.bfloat16)``.
- ``cast_tl(x, dtype)``: round float32 ``x`` to a kernel's output dtype (bf16 through
  ``to_bf16_tl``).
- ``sqrt_rn(x)``: the CPU twin of ``tl.sqrt_rn`` - the float64 root of a float32 value
  rounded to float32, which is the correctly rounded float32 root (53 >= 2*24 + 2 bits,
  so the double rounding is innocuous).
- ``add_bf16(*xs)``: the sum of bf16 tensors as the model's residual adds define it -
  exact widenings, IEEE float32 adds in order, one rounding to bf16 - by torch's operations
  (the definition, on any device) or, for two or three CPU operands, by the compiled loop
  of open1b_kernels/core/_rounding.c (the same operations: the same bits).

``open1b_kernels.core.mathfn`` re-exports the first four (where they lived first).
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel

if HAVE_TRITON:
    import triton
    import triton.language as tl


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 sqrt (CPU twin of ``tl.sqrt_rn``); see module doc."""
    if x.dtype != torch.float32:
        raise TypeError(f"sqrt_rn takes float32 tensors, got {x.dtype}; convert first")
    return torch.sqrt(x.to(torch.float64)).to(torch.float32)


LOOPS = Loops("open1b_kernels.core._corec")    # add_bf16 compiled: _rounding.c


def add_bf16(*xs: torch.Tensor) -> torch.Tensor:
    """bf16(((fp32(a) + fp32(b)) + fp32(c))...): exact widening, IEEE adds, one rounding."""
    fast = _add_bf16_compiled(xs)
    if fast is not None:
        return fast
    acc = xs[0].to(torch.float32)
    for x in xs[1:]:
        acc = acc + x.to(torch.float32)
    return acc.to(torch.bfloat16)


def _add_bf16_compiled(xs) -> torch.Tensor | None:
    """``add_bf16`` of two or three bf16 CPU tensors of one shape by the compiled loop, or
    None when it is unavailable or the operands do not fit."""
    if (not LOOPS.available() or len(xs) not in (2, 3)
            or any(x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape != xs[0].shape
                   for x in xs)):
        return None
    bits = [flat(x.contiguous().view(torch.int16)) for x in xs]
    if len(bits) == 2:
        bits.append(none(torch.int16))
    out = torch.empty(xs[0].shape, dtype=torch.bfloat16)
    o = flat(out.view(torch.int16))
    parallel(lambda lo, hi, p: LOOPS.add_bf16(*bits, o, lo, hi, p), o.shape[0],
             grain=PARALLEL_MIN)
    return out


if HAVE_TRITON:

    @triton.jit
    def to_bf16_tl(x):
        """float32 -> bfloat16, round to nearest even, NaN -> 0x7fc0 (torch's conversion).

        Integer bit arithmetic instead of ``.to(tl.bfloat16)``: the Triton interpreter
        rounds that cast half-up on the cut-off bit (not to even), so the compiled GPU
        cast and the interpreter could disagree on ties.
        """
        bits = x.to(tl.int32, bitcast=True)
        bits = bits + (((bits >> 16) & 1) + 0x7FFF)
        hi = tl.where(x != x, 0x7FC0, bits >> 16)
        return hi.to(tl.int16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def widen_tl(x):
        """Exact widening to float32 (bf16 by bit shift: the Triton interpreter's own
        bf16 -> fp32 cast mangles subnormals, the GPU's does not; this is right on both)."""
        if x.dtype == tl.bfloat16:
            return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            return x.to(tl.float32)

    @triton.jit
    def cast_tl(x, dtype: tl.constexpr):
        """Round float32 ``x`` to the output ``dtype`` (bf16 via ``to_bf16_tl``)."""
        if dtype == tl.bfloat16:
            return to_bf16_tl(x)
        else:
            return x.to(dtype)
