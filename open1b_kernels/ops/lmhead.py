"""The bf16 LM-head GEMM and its two gradient GEMMs, on int8 tensor cores (Ozaki-style).

    ozaki_mm(a, b)[r, c] ~= sum_k a[r, k] * b[c, k]     a: (R, K), b: (C, K), fp32 out

Forward: ``logits = ozaki_mm(h, w)`` (h (M, 2048) bf16, w (V, 2048) bf16); backward:
``dh = ozaki_mm(dlogits, w.t())`` (contraction over V) and ``dw = ozaki_mm(dlogits.t(),
h.t())`` (contraction over M). Operands may be bf16 or fp32, with any strides.

Arithmetic (identical on both paths; every step is integer arithmetic until one final
rounding). S = ``slices`` is 3 (default) or 2; the text gives S = 3 and [S = 2]:
1. Slicing, per row of each operand (along the contraction dimension), from the float32
   bits of each element (bf16 is widened exactly): M = the 24-bit significand (implicit
   bit for normals; subnormals use exponent field 1), e = max(exponent field, 1),
   E = max_k e over the row. X = M >> min(E - e + 24 - 7S, 31): a 7S-bit magnitude
   (21 [14]), truncated toward zero, so x ~= sign * X * 2^(E - 126 - 7S). Slices
   a_i = (X >> 7(S - i)) & 127, i = 1..S, each carrying the sign: int8 values in
   [-127, 127] with X = sum_i a_i 2^(7(S - i)) exactly. Every element within 13 [6]
   binades of its row maximum keeps all of a bf16's 8 significant bits.
2. Products: the slice pairs with level L = i + j <= S + 1 (six [three]) are int8 x int8
   -> int32 dot products (tensor cores); pairs of one level share an int32 accumulator,
   flushed into int64 every K_CHUNK = 32,768 contraction steps (3 * 127^2 * 32,768 <
   2^31: no overflow), as T += sum_L acc_L * 2^(7(S + 1 - L)) (acc2 * 2^14 + acc3 * 2^7 +
   acc4 [acc2 * 2^7 + acc3]). Integer sums are exact, so T does not depend on the order
   (tile shapes, chunking, CPU vs GPU) nor on how the pairs are grouped (the CPU's pair
   route: ``open1b_kernels.ops.lmhead_pairs``). K <= MAX_K keeps |T| < 2^53.
3. One rounding: out = fp32_rne( float64(T) * 2^(Ea[r] + Eb[c] - 259 - 7S) ); the float64
   conversion and the power-of-two multiply are exact, so out is T's exact value rounded
   once to nearest even (overflow -> inf, subnormal results rounded once, IEEE).

Error bound (tested against float64): with Sa = 2^(Ea - 126) > max|a[r, :]| and
Sb = 2^(Eb - 126) > max|b[c, :]|, truncation costs < 2^-7S * Sa (resp. Sb) per element and the
dropped levels < 127^2 * (2 * 2^-35 + 2^-42) [127^2 * 2^-28] * Sa * Sb per product, so
|out - exact| <= K * 2^-(7S - 2) * Sa * Sb + 2^-24 * |exact|   (2^-19 [2^-12]).
Measured relative (Frobenius) error on Gaussian data at K = 2,048: S = 3: 8e-7 (logits),
3e-6 to 5e-6 (gradients, whose fp32 dlogits lose bits below 2^-21 of the row maximum);
S = 2: 5e-4, about what rounding the logits to bf16 costs. Speed trade: S = 3 costs six
int8 tensor-core products per output tile, S = 2 three (about 2x faster); the default is
the accurate one.

Zero results are +0.0. Non-finite inputs: a row or column holding inf/NaN yields NaN for
that whole row/column of the output (never a partial, backend-dependent value).

The CPU path in files beside this one: ``lmhead_slices`` (step 1's slicer and the slices'
store), ``lmhead_plan`` (one plan of the products for every route), ``lmhead_int``,
``lmhead_pairs`` and ``lmhead_float`` (one route per CPU class: ``open1b_kernels.int8.route``),
``lmhead_rowsparse`` (a sparse slice's products row by row), ``lmhead_sparse`` (one pair with
a sparse slice, by VNNI), ``lmhead_check`` (what catches a wrong T), and their C loops
``_lmhead_slices.c``, ``_lmhead_sums.c``, ``_lmhead_rowsparse.c``, ``_lmhead_sparse.c``.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from open1b_kernels.int8.gemm import bf16_operand
from open1b_kernels.int8.route import CHECKED, int_gemm_route
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import release, scratch
from open1b_kernels.ops import lmhead_float, lmhead_int, lmhead_pairs
from open1b_kernels.ops.lmhead_plan import K_CHUNK
from open1b_kernels.ops.lmhead_slices import LevelSlices, slice_rows

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.int8.gemm import grouped_tile

SLICES = 3  # default int8 slices per operand (2 is the faster, less accurate option)
MAX_K = 11_000_000  # K * 3 * 127^2 * (2^14 + 2^7 + 1) < 2^53: T exact in float64
CPU_SLICE_ELEMS = 1 << 22  # elements per row block of the CPU slicer (bounds temporaries)
# S = 3 on the float route: T as one float64 GEMM of 14-bit heads plus one float32 GEMM of
# two slice pairs (``lmhead_float.head_form``), the work of four float32 GEMMs of length K
# instead of six; False runs the six slice products level by level (the same bits; tests)
CPU_S3_TWO_GEMMS = True
# A product with at most NARROW_C output columns whose ``a`` is a transposed view (the
# weight gradient dlogits^T h at a small model width) runs on the integer route as
# ``ozaki_mm_cpu(b, a).t()``: the library's int8 GEMM then reads the wide operand in its
# natural (K, N) layout instead of as a transposed A with a leading dimension of the whole
# vocabulary (demo head's weight gradient, M 1,024 x N 128: 386-467 -> 584-624 GOP/s on the
# Zen 4 host; at Open-1B's 2,048 columns both run at ~825 GOP/s, so wide products keep
# their orientation). The same bits: T is the same integer, and 2^Ea * 2^(Eb - bias)
# against 2^Eb * 2^(Ea - bias) are exact float64 multiplies before the one rounding.
NARROW_C = 512

# Three int32 level accumulators live in registers: a 128 x 64 tile over 8 warps fits
# them in 255 registers with no stack when the contraction is one K_CHUNK (Triton 3.6,
# compiled offline for sm_90; 128 x 128 spills 800 bytes). On the first GPU run (H200,
# 2026-12-04) the head's forward and backward ran at 0.21-0.39x of torch's bf16 mm with
# an int64 total live through the loop and spilled, bit-identical to the CPU
# (benchmarks/HISTORY.md, "On an NVIDIA H200").
GPU_BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8,
              "num_warps": 8, "num_stages": 3}
# A contraction longer than K_CHUNK (dh = dlogits @ w contracts over the vocabulary) keeps
# an int64 total through the loop: at 128 x 64 Triton 3.6 spilled it (184-byte stack);
# 64 x 64 over 8 warps holds it in 168 registers (compiled offline for sm_90).
GPU_BLOCKS_LONG_K = {**GPU_BLOCKS, "BLOCK_M": 64}
INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4}
SLICE_BR, SLICE_BK = 32, 128


# ------------------------------------------------------------------- CPU references
def exp_bias(slices: int) -> int:
    """The power of two of step 3: out = T * 2^(Ea + Eb - exp_bias(S)); 280 for S = 3."""
    return 259 + 7 * slices


def slice_rows_cpu(x: torch.Tensor, slices: int = SLICES, out_name: str | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, K) float -> (int8 slices (S, R, K), row exponents E (R,) int32); see step 1.
    Integer and bit operations only; ``lmhead_slices.slice_rows`` runs the same loop compiled
    (for a transposed view in its storage's layout: the slices are then transposed views too).
    ``out_name``: write the compiled loop's slices into that scratch buffer (reused memory:
    a weight's 0.8 GB of slices cost more in page faults than in slicing) - for a caller
    that drops them before it returns (``ozaki_mm_cpu``)."""
    out = scratch(out_name, (slices * x.numel(),), torch.int8) if out_name else None
    fast = slice_rows(x, slices, out)
    if fast is not None:
        return fast
    r, k = x.shape
    out = torch.empty((slices, r, k), dtype=torch.int8)
    big = torch.ones((r,), dtype=torch.int32)
    if k == 0:
        return out, big
    rows = max(1, CPU_SLICE_ELEMS // k)
    for r0 in range(0, r, rows):
        xb = x[r0:r0 + rows]
        if x.dtype == torch.bfloat16:  # exact widening from the bits (top half of float32)
            b = xb.contiguous().view(torch.int16).to(torch.int32) << 16
        else:
            b = xb.contiguous().view(torch.int32)
        ef = (b >> 23) & 0xFF
        man = (b & 0x7FFFFF) | ((ef != 0).to(torch.int32) << 23)  # implicit bit for normals
        e = ef.clamp_(min=1)
        eb = e.amax(dim=1)
        mag = man >> (eb[:, None] - e + (24 - 7 * slices)).clamp_(max=31)  # 7*S bits
        neg = b >> 31  # -1 for negative elements, else 0: (p ^ neg) - neg == sign * p
        for i in range(slices):
            part = (mag >> (7 * (slices - 1 - i))) & 127
            out[i, r0:r0 + rows] = ((part ^ neg) - neg).to(torch.int8)
        big[r0:r0 + rows] = eb
    return out, big


def _pow2_f64(p: torch.Tensor) -> torch.Tensor:
    return ((p.to(torch.int64) + 1023) << 52).view(torch.float64)


def combine_cpu(t: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor,
                slices: int = SLICES) -> torch.Tensor:
    """out = fp32_rne(float64(T) * 2^(Ea + Eb - bias)), NaN where a row/col was non-finite."""
    y = t.to(torch.float64) * _pow2_f64(ea[:, None] + eb[None, :] - exp_bias(slices))
    y = y.to(torch.float32)
    bad = (ea[:, None] == 255) | (eb[None, :] == 255)
    return torch.where(bad, torch.full_like(y, float("nan")), y)


def _level_slices(x: torch.Tensor, slices: int, name: str, descending: bool) -> LevelSlices:
    """``x``'s slices in the level-ready layout: by the compiled slicer, or (without it) the
    torch slicer's planes arranged so - the same values either way."""
    got = LevelSlices.make(x, slices, name, descending)
    return got if got is not None else LevelSlices.from_planes(*slice_rows_cpu(x, slices),
                                                               name, descending)


def ozaki_mm_cpu(a: torch.Tensor, b: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """CPU reference of ``ozaki_mm``: T of step 2 computed exactly, then ``combine_cpu``'s
    rounding, blocked so the temporaries stay small.

    Both operands are sliced into the level-ready layout (``open1b_kernels.ops.lmhead_slices``);
    one plan per row block of ``a`` (``lmhead_plan``: which slices run compacted, row by
    row or dense), then T from the route's products: the checked int8 GEMM on the "int"
    and "amx" routes (``lmhead_int.int_blocks``: the definition's levels), the pair GEMM's wide int64
    terms on the "pairs" route (``lmhead_pairs.pair_blocks``: two a slices against one b
    slice per product, a third less work) or float GEMMs of the slices on the float route
    (``lmhead_float.float_blocks``, also the integer routes' fallback) - the same integer
    every way, checked by ``lmhead_check``.
    ``fp32(T * 2^(Ea - bias_a) * 2^(Eb - bias_b))`` then equals ``combine_cpu``'s
    ``fp32(float64(T) * 2^(Ea + Eb - bias))``: the power-of-two multiplies are exact in
    float64, and one rounding to float32 follows."""
    _check(a, b, slices)
    route = int_gemm_route() if a.device.type == "cpu" else "float"
    if route in CHECKED and _narrow_transposed(a, b):
        return ozaki_mm_cpu(b, a, slices).t().contiguous()
    r, k = a.shape
    c = b.shape[0]
    if r and c and k:
        sa, sb = (_level_slices(a, slices, "lmhead.slices_a", False),
                  _level_slices(b, slices, "lmhead.slices_b", True))
        ea, eb = sa.exps, sb.exps
    else:
        _, ea = slice_rows_cpu(a, slices)
        _, eb = slice_rows_cpu(b, slices)
    # not zeroed: every path below writes every block (a failed integer route's float
    # recomputation included). Zeroing had been kept against scattered first-touch page
    # faults; measured on the Zen 4 host, A/B in one process: with freed memory kept
    # (open1b_train.memory.allocator) the zeroing was 3.5 of the demo head's 29 ms forward, with
    # fresh pages and at a 1,024 x 32,768 block neither way was faster
    out = torch.empty((r, c), dtype=torch.float32)
    if not (r and c):
        return out
    if not k:
        return combine_cpu(torch.zeros((r, c), dtype=torch.int64), ea, eb, slices)
    bias = exp_bias(slices)
    rowf = _pow2_f64(ea)                                 # 2^Ea, exact
    colf = _pow2_f64(eb - bias)                          # 2^(Eb - bias), exact
    done = (lmhead_pairs.pair_blocks(sa, sb, rowf, colf, out, slices) if route == "pairs"
            else route in CHECKED and lmhead_int.int_blocks(sa, sb, rowf, colf, out, slices))
    if not done:
        lmhead_float.float_blocks(sa, sb, rowf, colf, out, slices, CPU_S3_TWO_GEMMS)
    return _non_finite(out, ea, eb)


def _non_finite(out: torch.Tensor, ea: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
    """``out`` with NaN in every row of ``a`` and column of ``b`` that held inf/NaN
    (exponent field 255): the whole row/column, whichever route computed the rest."""
    bad_r, bad_c = ea == 255, eb == 255
    if bool(bad_r.any()) or bool(bad_c.any()):
        out[bad_r[:, None] | bad_c[None, :]] = float("nan")
    return out


def _narrow_transposed(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True for a product that runs faster as ``(b @ a^T)^T`` (see NARROW_C): ``a`` a
    transposed view, at most NARROW_C output columns, and fewer than its rows (so the
    swapped call never swaps back)."""
    c, r = b.shape[0], a.shape[0]
    return a.stride(0) == 1 and a.shape[1] > 1 and c <= NARROW_C and c < r


def _check(a: torch.Tensor, b: torch.Tensor, slices: int) -> None:
    if slices not in (2, 3):
        raise ValueError(f"slices must be 2 or 3, got {slices}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need a (R, K) and b (C, K) with the same K, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    for t in (a, b):
        if t.dtype not in (torch.bfloat16, torch.float32):
            raise TypeError(f"ozaki_mm takes bf16 or fp32 operands, got {t.dtype}")
    if a.shape[1] > MAX_K:
        raise ValueError(f"K = {a.shape[1]} > MAX_K = {MAX_K}: the int64 sum could exceed "
                         "2^53; split K")


# ------------------------------------------------------------------- Triton kernels
if HAVE_TRITON:

    @triton.jit
    def _f32_bits(ptrs, mask, IS_BF16: tl.constexpr):
        """The float32 bit pattern of each element (bf16 widened exactly from its bits)."""
        if IS_BF16:
            return tl.load(ptrs, mask=mask, other=0).to(tl.int32) << 16
        else:
            return tl.load(ptrs, mask=mask, other=0.0).to(tl.int32, bitcast=True)

    @triton.jit
    def _row_exp_kernel(x_ptr, e_ptr, R, K, stride_r, stride_k, IS_BF16: tl.constexpr,
                        BR: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        big = tl.full((BR,), 1, dtype=tl.int32)
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            b = _f32_bits(x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k,
                          (rows[:, None] < R) & (cols[None, :] < K), IS_BF16)
            e = (b >> 23) & 0xFF
            big = tl.maximum(big, tl.max(e, axis=1))  # integer max: any order is exact
        tl.store(e_ptr + rows, big, mask=rows < R)

    @triton.jit
    def _slice_kernel(x_ptr, e_ptr, s_ptr, R, K, stride_r, stride_k, IS_BF16: tl.constexpr,
                      SL: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        cols = tl.program_id(1) * BK + tl.arange(0, BK)
        mask = (rows[:, None] < R) & (cols[None, :] < K)
        b = _f32_bits(x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k,
                      mask, IS_BF16)
        ef = (b >> 23) & 0xFF
        man = tl.where(ef == 0, b & 0x7FFFFF, (b & 0x7FFFFF) | 0x800000)
        e = tl.maximum(ef, 1)
        big = tl.load(e_ptr + rows, mask=rows < R, other=1)
        mag = man >> tl.minimum(big[:, None] - e + (24 - 7 * SL), 31)
        neg = b >> 31  # -1 for negative elements, else 0: (p ^ neg) - neg == sign * p
        off = rows[:, None].to(tl.int64) * K + cols[None, :]
        plane = R.to(tl.int64) * K
        for i in tl.static_range(SL):
            part = (mag >> (7 * (SL - 1 - i))) & 127
            tl.store(s_ptr + i * plane + off, ((part ^ neg) - neg).to(tl.int8), mask=mask)

    @triton.jit
    def _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, c0, c1, SL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """T's part over contraction steps [c0, c1) as int64: the level accumulators in
        int32 (no overflow within K_CHUNK), shifted together once at the end."""
        acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        acc4 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(c0, c1, BLOCK_K):
            kk = k0 + rk
            am = (rm[:, None] < M) & (kk[None, :] < K)
            bm = (rn[None, :] < N) & (kk[:, None] < K)
            a1 = tl.load(a_rows + kk[None, :], mask=am, other=0)
            a2 = tl.load(a_rows + pa + kk[None, :], mask=am, other=0)
            b1 = tl.load(b_cols + kk[:, None], mask=bm, other=0)
            b2 = tl.load(b_cols + pb + kk[:, None], mask=bm, other=0)
            acc2 += tl.dot(a1, b1, out_dtype=tl.int32)
            acc3 += tl.dot(a1, b2, out_dtype=tl.int32)
            acc3 += tl.dot(a2, b1, out_dtype=tl.int32)
            if SL == 3:
                a3 = tl.load(a_rows + 2 * pa + kk[None, :], mask=am, other=0)
                b3 = tl.load(b_cols + 2 * pb + kk[:, None], mask=bm, other=0)
                acc4 += tl.dot(a1, b3, out_dtype=tl.int32)
                acc4 += tl.dot(a2, b2, out_dtype=tl.int32)
                acc4 += tl.dot(a3, b1, out_dtype=tl.int32)
        if SL == 3:
            return (acc2.to(tl.int64) << 14) + (acc3.to(tl.int64) << 7) + acc4.to(tl.int64)
        else:
            return (acc2.to(tl.int64) << 7) + acc3.to(tl.int64)

    @triton.jit
    def _ozaki_kernel(a_ptr, b_ptr, ea_ptr, eb_ptr, c_ptr, M, N, K, SL: tl.constexpr,
                      K_CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, ONE_CHUNK: tl.constexpr):
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        pa = M.to(tl.int64) * K  # slice plane strides
        pb = N.to(tl.int64) * K
        a_rows = a_ptr + rm[:, None].to(tl.int64) * K
        b_cols = b_ptr + rn[None, :].to(tl.int64) * K
        if ONE_CHUNK:   # K <= K_CHUNK (the head's 2,048; a vocabulary of tokens is not):
            # no int64 total live through the main loop (it spilled registers at S = 3)
            t = _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, 0, K, SL,
                            BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            t = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int64)
            for c0 in range(0, K, K_CHUNK):
                t += _level_sums(a_rows, b_cols, pa, pb, rm, rn, rk, M, N, K, c0,
                                 tl.minimum(c0 + K_CHUNK, K), SL, BLOCK_M, BLOCK_N, BLOCK_K)
        ea = tl.load(ea_ptr + rm, mask=rm < M, other=1)
        eb = tl.load(eb_ptr + rn, mask=rn < N, other=1)
        p = (ea[:, None] + eb[None, :] - (259 + 7 * SL)).to(tl.int64)  # exp_bias(SL)
        scale = ((p + 1023) << 52).to(tl.float64, bitcast=True)
        y = (t.to(tl.float64) * scale).to(tl.float32)
        y = tl.where((ea[:, None] == 255) | (eb[None, :] == 255), float("nan"), y)
        tl.store(c_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], y,
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def slice_rows_triton(x: torch.Tensor, slices: int = SLICES) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton path of ``slice_rows_cpu`` (any input strides)."""
    r, k = x.shape
    e = torch.empty((r,), dtype=torch.int32, device=x.device)
    s = torch.empty((slices, r, k), dtype=torch.int8, device=x.device)
    if r == 0:
        return s, e
    bk = 64 if interpreting() else 256
    xk, is_bf16 = bf16_operand(x)
    _row_exp_kernel[(triton.cdiv(r, SLICE_BR),)](xk, e, r, k, x.stride(0), x.stride(1),
                                                 IS_BF16=is_bf16, BR=SLICE_BR, BK=bk,
                                                 **LAUNCH_OPTIONS)
    if k:
        grid = (triton.cdiv(r, SLICE_BR), triton.cdiv(k, SLICE_BK))
        _slice_kernel[grid](xk, e, s, r, k, x.stride(0), x.stride(1), IS_BF16=is_bf16,
                            SL=slices, BR=SLICE_BR, BK=SLICE_BK, **LAUNCH_OPTIONS)
    return s, e


def ozaki_mm_triton(a: torch.Tensor, b: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """Triton path of ``ozaki_mm``."""
    _check(a, b, slices)
    sa, ea = slice_rows_triton(a, slices)
    sb, eb = slice_rows_triton(b, slices)
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=torch.float32, device=a.device)
    if m == 0 or n == 0:
        return c
    cfg = dict(INTERPRET_BLOCKS if interpreting() else
               GPU_BLOCKS if k <= K_CHUNK else GPU_BLOCKS_LONG_K)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _ozaki_kernel[grid](sa, sb, ea, eb, c, m, n, k, SL=slices, K_CHUNK=K_CHUNK,
                        ONE_CHUNK=k <= K_CHUNK, **cfg, **LAUNCH_OPTIONS)
    return c


def ozaki_mm(a: torch.Tensor, b: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """``a @ b.T`` for bf16/fp32 (R, K) and (C, K), fp32 out, same bits on every backend."""
    if use_triton(a):
        return ozaki_mm_triton(a, b, slices)
    return ozaki_mm_cpu(a, b, slices)


# ------------------------------------------------------------------- the op
def lmhead_forward(h: torch.Tensor, w: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """logits (M, V) fp32 = h (M, K) @ w (V, K)^T."""
    logits = ozaki_mm(h, w, slices)
    release("lmhead.")  # the CPU path's slice buffers: the backward slices other operands
    return logits


def lmhead_backward(dlogits: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                    slices: int = SLICES):
    """(dh (M, K) fp32, dw (V, K) fp32) for upstream dlogits (M, V) fp32 or bf16."""
    grads = ozaki_mm(dlogits, w.t(), slices), ozaki_mm(dlogits.t(), h.t(), slices)
    release("lmhead.")  # the CPU path's slice buffers (GBs at a full vocabulary): a step's
    return grads        # last use of them - the optimizer and the layers need the memory


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(505)
    m = scaled(16_384, scale, 16)
    v = scaled(128_256, scale, 16)
    h = torch.randn(m, 2_048, generator=g).to(torch.bfloat16)
    w = (torch.randn(v, 2_048, generator=g) * 0.02).to(torch.bfloat16)
    dl = (torch.randn(m, v, generator=g) * 1e-5)
    return tuple(t.to(device) for t in (h, w, dl))


GPU_CHECKS = [
    GpuCheck(
        name="lmhead.fwd",
        make_inputs=_make,
        run=lambda a: (lmhead_forward(a[0], a[1]),),
        torch_baseline=lambda a: (torch.mm(a[0], a[1].t()).float(),),
        cost=lambda a: Cost(flops=2.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s: f"bf16 ({scaled(16_384, s, 16)}x2048) @ (2048x{scaled(128_256, s, 16)})"
                           " -> fp32 vs torch.mm bf16",
        parity_scale=0.0625, bench_scale=0.5, bound="compute",
    ),
    GpuCheck(
        name="lmhead.fwd_2slices",
        make_inputs=_make,
        run=lambda a: (lmhead_forward(a[0], a[1], slices=2),),
        torch_baseline=lambda a: (torch.mm(a[0], a[1].t()).float(),),
        cost=lambda a: Cost(flops=2.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s: f"2-slice variant, bf16 ({scaled(16_384, s, 16)}x2048) @ "
                           f"(2048x{scaled(128_256, s, 16)}) -> fp32 vs torch.mm bf16",
        parity_scale=0.0625, bench_scale=0.5, bound="compute",
    ),
    GpuCheck(
        name="lmhead.bwd",
        make_inputs=_make,
        run=lambda a: lmhead_backward(a[2], a[0], a[1]),
        torch_baseline=lambda a: (torch.mm(a[2].bfloat16(), a[1]),
                                  torch.mm(a[2].bfloat16().t(), a[0])),
        cost=lambda a: Cost(flops=4.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s: f"dh, dw of the LM head at ({scaled(16_384, s, 16)}, 2048, "
                           f"{scaled(128_256, s, 16)}) vs 2x torch.mm bf16",
        parity_scale=0.0625, bench_scale=0.5, bound="compute",
    ),
]
