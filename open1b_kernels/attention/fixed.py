"""Exact bf16 x bf16 matrix products from int8 pieces: the fixed-point slicing used by attention.

Every matrix product inside attention (Q K^T, dO V^T, P^T dO, dS^T Q, dS K) multiplies two
bf16 operands. A float ``tl.dot`` would sum them in an order that belongs to the hardware, so
instead each operand is turned into integers and multiplied with int8 x int8 -> int32 dots,
which are exact and therefore order-free (Ozaki-style slicing):

1. Fixed point. A *group* of bf16 values that share one contraction (a row of Q over the
   head dim, a column of a K tile over the keys of one block, ...) gets one exponent ``E``:
   the largest biased exponent in the group (subnormals and zeros count as exponent 1).
   Each value ``x = (-1)^s * m * 2^(e - 134)`` (``m`` the 8-bit significand with its
   implicit bit, ``e`` the biased exponent, >= 1) becomes the integer
   ``N = (-1)^s * trunc(m * 2^(e - E + 13))`` with ``|N| < 2^21``, so that
   ``x ~= N * 2^(E - 147)``. This is exact for every value within 2^13 of the group's
   largest one; smaller values lose low bits (truncated toward zero, error below
   ``2^-20`` of the group maximum). Only integer and bit operations are used.
2. Digits. ``N = d0 * 2^14 + d1 * 2^7 + d2`` with ``d0 = N >> 14`` (arithmetic shift) in
   [-128, 127] and ``d1, d2`` in [0, 127]: three int8 pieces.
3. Product. For a contraction of length K, ``T = sum_k Na_k * Nb_k`` is built from the nine
   int8 dots ``C_ab`` as ``sum_{a,b} C_ab << (28 - 7(a + b))`` in int64. Every int32 dot is
   below ``2^14 * K`` and ``|T| < 2^42 * K``, so the result is exact while K <= 2,048
   (T then stays below 2^53, which also makes the CPU's float64 matmul of the integers exact).
4. Back to float. ``fp32(float64(T) * 2^(Ea + Eb - 294))``: the int64 -> float64 conversion
   is exact (|T| < 2^53), the power-of-two multiply is exact in float64, and the single
   float64 -> float32 conversion rounds to nearest even (IEEE subnormals kept, overflow to
   inf). The result is the correctly rounded value of the (fixed-point) exact product.

Both paths compute the same exact value (CPU: a float64 matmul of the values N * 2^(E-147),
exact because every partial sum is an integer below 2^53 times one power of two; Triton:
the nine int8 ``tl.dot``), so the fp32 result is bit-identical whatever order either side
sums in. The slicing itself is integer torch code that the Triton path runs on the GPU.

NaN/inf policy: bf16 inf/NaN inputs are not supported (exponent 255 is treated as a finite
exponent, giving large finite garbage); attention's inputs come out of QK-norm/RoPE and
are finite. Callers that may see non-finite values must check before calling.
"""

from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON

if HAVE_TRITON:
    import triton
    import triton.language as tl

FRAC_BITS = 13  # fixed point keeps values within 2^13 of the group's largest exactly
DIGIT_BITS = 7
EXP_OFFSET = 147  # x ~= N * 2^(E - EXP_OFFSET): 127 (bias) + 7 (significand) + 13
MAX_CONTRACTION = 2048  # |T| < 2^42 * K must stay below 2^53


def fixed_point(x: torch.Tensor, dim: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integers ``N`` (int32, same shape as ``x`` padded along ``dim``) and group exponents ``E``.

    ``x`` is bf16. Along ``dim`` the values are split into consecutive groups of ``group``
    (zero-padded at the end); ``E`` has ``dim`` replaced by the number of groups.
    """
    if x.dtype != torch.bfloat16:
        raise TypeError(f"fixed_point needs a bfloat16 tensor, got {x.dtype}")
    dim = dim % x.dim()
    n = x.shape[dim]
    n_groups = -(-n // group)
    pad = n_groups * group - n
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    if pad:
        bits = torch.nn.functional.pad(bits.movedim(dim, -1), (0, pad)).movedim(-1, dim)
    shape = list(bits.shape)
    grouped = bits.reshape(shape[:dim] + [n_groups, group] + shape[dim + 1 :])
    e_eff = torch.clamp((grouped >> 7) & 0xFF, min=1)
    e_max = e_eff.amax(dim=dim + 1, keepdim=True)  # integer max: exact, order-free
    n_int = _magnitudes(grouped, e_eff, e_max)
    return n_int.reshape(shape), e_max.squeeze(dim + 1)


def _magnitudes(bits: torch.Tensor, e_eff: torch.Tensor, e_max: torch.Tensor) -> torch.Tensor:
    """Signed fixed-point integers of bf16 bit patterns (shared formula, see module doc)."""
    expo = (bits >> 7) & 0xFF
    m = torch.where(expo > 0, (bits & 0x7F) | 0x80, bits & 0x7F)
    shift = e_eff - e_max + FRAC_BITS
    # m < 2^8, so a right shift by 15 already gives 0; clamping keeps shifts defined.
    mag = (m << torch.clamp(shift, min=0)) >> torch.clamp(-shift, min=0, max=15)
    return torch.where((bits >> 15) != 0, -mag, mag)


def fixed_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``fixed_point`` with one group per row of the last dim: N (..., D), E (...)."""
    n_int, e = fixed_point(x, -1, x.shape[-1])
    return n_int, e.squeeze(-1)


def digits(n_int: torch.Tensor) -> torch.Tensor:
    """The three int8 pieces of fixed-point integers, stacked on a new leading dim."""
    d0 = n_int >> (2 * DIGIT_BITS)
    d1 = (n_int >> DIGIT_BITS) & 0x7F
    d2 = n_int & 0x7F
    return torch.stack([d0, d1, d2]).to(torch.int8)


def pow2_f64(e: torch.Tensor) -> torch.Tensor:
    """2^e as float64 built from its bits (exact; valid for -1022 <= e <= 1023)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """2^e as float32 built from its bits (exact; valid for -126 <= e <= 127)."""
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


def fixed_values(x: torch.Tensor, dim: int, group: int) -> torch.Tensor:
    """The fixed-point values ``N * 2^(E - 147)`` of bf16 ``x`` as float64, grouped along
    ``dim`` as in ``fixed_point`` (zero-padded). CPU reference form.

    Computed as ``trunc(x * 2^(147 - E)) * 2^(E - 147)`` in float64: both power-of-two
    multiplies are exact and ``trunc`` is exact, and ``x * 2^(147 - E) = m * 2^(e - E + 13)``,
    so this equals the integer formula of ``fixed_point`` (tested) at a fraction of the cost.
    """
    dim = dim % x.dim()
    n = x.shape[dim]
    n_groups = -(-n // group)
    xf = x.to(torch.float64).movedim(dim, -1)
    if n_groups * group != n:
        xf = torch.nn.functional.pad(xf, (0, n_groups * group - n))
    xf = xf.reshape(*xf.shape[:-1], n_groups, group)
    expo = (xf.to(torch.float32).view(torch.int32) >> 23) & 0xFF  # bf16 -> fp32 keeps it
    e_max = torch.clamp(expo, min=1).amax(dim=-1, keepdim=True)
    vals = torch.trunc(xf * pow2_f64(EXP_OFFSET - e_max)) * pow2_f64(e_max - EXP_OFFSET)
    return vals.reshape(*vals.shape[:-2], n_groups * group).movedim(-1, dim)


def fixed_row_values(x: torch.Tensor) -> torch.Tensor:
    """``fixed_values`` with one group per row of the last dim."""
    return fixed_values(x, -1, x.shape[-1])


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fp32 of the exact product of fixed-point values: a (..., M, K) with one exponent per
    row, b (..., K, N) with one per column (``fixed_values``). CPU reference.

    Every product is ``Na * Nb * 2^(Ea_m + Eb_n - 294)`` and every partial sum is an integer
    below 2^53 times that same power of two, so the float64 matmul is exact in any order
    (FMA or not), and the one conversion to fp32 rounds to nearest even.
    """
    if a.shape[-1] > MAX_CONTRACTION:
        raise ValueError(
            f"contraction {a.shape[-1]} exceeds {MAX_CONTRACTION}: the int64 sum may round"
        )
    return (a @ b).to(torch.float32)


if HAVE_TRITON:
    _TL_FRAC_BITS = tl.constexpr(FRAC_BITS)
    _TL_EXP_OFFSET2 = tl.constexpr(2 * EXP_OFFSET)

    @triton.jit
    def tl_fixed_point(x, AXIS: tl.constexpr):
        """Triton twin of ``fixed_point`` for one tile whose groups run along ``AXIS``
        (0 or 1); ``x`` is bf16. Returns the three int8 digit tiles and E (int32)."""
        bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        expo = (bits >> 7) & 0xFF
        e_eff = tl.maximum(expo, 1)
        e_max = tl.expand_dims(tl.max(e_eff, axis=AXIS), AXIS)
        m = tl.where(expo > 0, (bits & 0x7F) | 0x80, bits & 0x7F)
        shift = e_eff - e_max + _TL_FRAC_BITS
        mag = (m << tl.maximum(shift, 0)) >> tl.minimum(tl.maximum(-shift, 0), 15)
        n = tl.where((bits >> 15) != 0, -mag, mag)
        d0 = (n >> 14).to(tl.int8)
        d1 = ((n >> 7) & 0x7F).to(tl.int8)
        d2 = (n & 0x7F).to(tl.int8)
        return d0, d1, d2, tl.max(e_eff, axis=AXIS)

    @triton.jit
    def tl_exact_dot(a0, a1, a2, b0, b1, b2):
        """int64 ``sum_k Na[m, k] * Nb[k, n]`` from int8 digit tiles (nine exact int8 dots).

        T = g0 2^28 + g1 2^21 + g2 2^14 + g3 2^7 + g4 (g_L the sum of the digit dots of
        level L) is formed as ``(g0 << 28) + (mid << 14) + low`` with mid = g1 2^7 + g2 and
        low = g3 2^7 + g4 accumulated in int32 by the tensor cores themselves (each dot adds
        into the shifted accumulator; every partial sum of mid or low stays below 1.08e9 <
        2^31 for contractions up to 256, the largest head dim attention takes, and the
        tiles' 64 keys or queries): the same integer as the five-term sum, folded into the
        int64 tile as each part is done, so one int32 tile and one int64 tile are live
        instead of five of each - the backward's kernels spilled registers with the
        five-term form (CONTRACT.md, "GPU cost")."""
        t = tl.dot(a0, b0, out_dtype=tl.int32).to(tl.int64) << 28
        mid = tl.dot(a0, b1, out_dtype=tl.int32)
        mid = tl.dot(a1, b0, mid, out_dtype=tl.int32) << 7
        mid = tl.dot(a0, b2, mid, out_dtype=tl.int32)
        mid = tl.dot(a1, b1, mid, out_dtype=tl.int32)
        mid = tl.dot(a2, b0, mid, out_dtype=tl.int32)
        t = t + (mid.to(tl.int64) << 14)
        low = tl.dot(a1, b2, out_dtype=tl.int32)
        low = tl.dot(a2, b1, low, out_dtype=tl.int32) << 7
        low = tl.dot(a2, b2, low, out_dtype=tl.int32)
        return t + low.to(tl.int64)

    @triton.jit
    def tl_exact_to_f32(t, ea, eb):
        """fp32(float64(t) * 2^(ea[:, None] + eb[None, :] - 294)), rounded once (RNE)."""
        esum = (ea[:, None] + eb[None, :] - _TL_EXP_OFFSET2 + 1023).to(tl.int64) << 52
        return (t.to(tl.float64) * esum.to(tl.float64, bitcast=True)).to(tl.float32)

    @triton.jit
    def tl_pow2_f32(e):
        """2^e as float32 from its bits (exact for -126 <= e <= 127)."""
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def tl_to_bf16(x):
        """fp32 -> bf16 rounded to nearest even by integer bit arithmetic (finite x).

        Needed because the Triton interpreter's ``.to(tl.bfloat16)`` truncates (measured:
        2,042 of 4,096 random values differed from torch's RNE); on a GPU this gives the
        same bits as ``cvt.rn.bf16.f32``.
        """
        bits = x.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
