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

The Triton path's dh (``sparse_a``) runs the top slice's products only on the tiles where
dlogits' top slice has a nonzero (the slicer's tile map): the same products minus zero ones.

Zero results are +0.0. Non-finite inputs: a row or column holding inf/NaN yields NaN for
that whole row/column of the output (never a partial, backend-dependent value).

The Triton path: ``lmhead_triton``. The CPU path in files beside this one:
``lmhead_slices`` (step 1's slicer and the slices' store), ``lmhead_plan`` (one plan of the
products for every route), ``lmhead_int``, ``lmhead_pairs`` and ``lmhead_float`` (one route
per CPU class: ``open1b_kernels.int8.route``), ``lmhead_rowsparse`` (a sparse slice's
products row by row), ``lmhead_sparse`` (one pair with a sparse slice, by VNNI),
``lmhead_check`` (what catches a wrong T), and their C loops ``_lmhead_slices.c``,
``_lmhead_sums.c``, ``_lmhead_rowsparse.c``, ``_lmhead_sparse.c``.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, use_triton
from open1b_kernels.int8 import weightmemo
from open1b_kernels.int8.route import CHECKED, int_gemm_route
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import release, scratch
from open1b_kernels.ops import lmhead_float, lmhead_int, lmhead_pairs
from open1b_kernels.ops.lmhead_slices import LevelSlices, slice_rows

if HAVE_TRITON:
    from open1b_kernels.ops.lmhead_triton import ozaki_mm_triton

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


def _level_slices(x: torch.Tensor, slices: int, name: str | None, descending: bool
                  ) -> LevelSlices:
    """``x``'s slices in the level-ready layout: by the compiled slicer, or (without it) the
    torch slicer's planes arranged so - the same values either way. ``name``: the scratch
    buffer, or None for a buffer of their own."""
    got = LevelSlices.make(x, slices, name, descending)
    return got if got is not None else LevelSlices.from_planes(*slice_rows_cpu(x, slices),
                                                               name, descending)


def _weight_slices(b: torch.Tensor, weight: torch.Tensor, slices: int) -> LevelSlices:
    """The b side's slices where ``b`` is ``weight`` or its transpose: outside
    ``weightmemo.held()`` sliced as any operand; inside it, sliced into a buffer of their
    own by the step's first window and reused by its others (``weightmemo``: keyed by the
    weight, its version and which way ``b`` reads it; a weight written in place is sliced
    again). At Open-1B's head both ways are 1.6 GB of int8, counted in the resident
    plan's estimate (``open1b_train.memory.memplan``); measured at 4,096 tokens, a window
    then skips ~0.23 s of slicing and ~0.1 s of its checks' column sums
    (benchmarks/HISTORY.md)."""
    ways = {"rows": weight, "cols": weight.t()}
    way = next((n for n, v in ways.items() if b.data_ptr() == v.data_ptr()
                and b.shape == v.shape and b.stride() == v.stride()), None)
    if way is None:
        raise ValueError(f"ozaki_mm: weight= must be b itself or its transpose, got b "
                         f"{tuple(b.shape)} strides {b.stride()} for a weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}")
    if not weightmemo.active():
        return _level_slices(b, slices, "lmhead.slices_b", True)
    return weightmemo.get(weight, f"lmhead.slices{slices}.{way}",
                          lambda: _level_slices(b, slices, None, True))


def ozaki_mm_cpu(a: torch.Tensor, b: torch.Tensor, slices: int = SLICES,
                 weight: torch.Tensor | None = None) -> torch.Tensor:
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
    float64, and one rounding to float32 follows.

    ``weight``: ``b`` is this weight or its transpose (the head's ``w``): inside
    ``weightmemo.held()`` its slices (and their column sums) are made by a step's first
    window and reused by the others while the weight is unchanged (``_weight_slices``)."""
    _check(a, b, slices)
    route = int_gemm_route() if a.device.type == "cpu" else "float"
    if route in CHECKED and _narrow_transposed(a, b):
        return ozaki_mm_cpu(b, a, slices).t().contiguous()
    r, k = a.shape
    c = b.shape[0]
    if r and c and k:
        sa = _level_slices(a, slices, "lmhead.slices_a", False)
        sb = (_weight_slices(b, weight, slices) if weight is not None
              else _level_slices(b, slices, "lmhead.slices_b", True))
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


def ozaki_mm(a: torch.Tensor, b: torch.Tensor, slices: int = SLICES,
             sparse_a: bool = False, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b.T`` for bf16/fp32 (R, K) and (C, K), fp32 out, same bits on every backend.
    ``sparse_a``: a hint for the Triton path (``ozaki_mm_triton``); ``weight``: ``b`` is
    that weight or its transpose (``ozaki_mm_cpu``); the bits do not change."""
    _check(a, b, slices)
    if use_triton(a):
        return ozaki_mm_triton(a, b, slices, sparse_a)
    return ozaki_mm_cpu(a, b, slices, weight)


# ------------------------------------------------------------------- the op
def lmhead_forward(h: torch.Tensor, w: torch.Tensor, slices: int = SLICES) -> torch.Tensor:
    """logits (M, V) fp32 = h (M, K) @ w (V, K)^T."""
    logits = ozaki_mm(h, w, slices, weight=w)
    release("lmhead.")  # the CPU path's slice buffers: the backward slices other operands
    return logits


def lmhead_backward(dlogits: torch.Tensor, h: torch.Tensor, w: torch.Tensor,
                    slices: int = SLICES, sparse_dlogits: bool = True):
    """(dh (M, K) fp32, dw (V, K) fp32) for upstream dlogits (M, V) fp32 or bf16.
    ``sparse_dlogits``: dh's product lists dlogits' nonzero top-slice tiles (``ozaki_mm``'s
    ``sparse_a``; the same bits either way)."""
    # dlogits' rows have a mostly zero top slice (probabilities far below the row's largest
    # entry); its columns, which dw slices, do not (benchmarks.kernels.lmhead_tiles)
    grads = (ozaki_mm(dlogits, w.t(), slices, sparse_a=sparse_dlogits, weight=w),
             ozaki_mm(dlogits.t(), h.t(), slices))
    release("lmhead.")  # the CPU path's slice buffers (GBs at a full vocabulary): a step's
    return grads        # last use of them - the optimizer and the layers need the memory


# ---------------------------------------------------------------- GPU check registry
def _vocab(scale: float) -> int:
    """The checks' vocabulary: Open-1B's scaled, at least 40,000 - dh's contraction then
    spans two K_CHUNKs at the parity and PTX scales too (its int64 flush and each chunk's
    listed tiles compiled and compared)."""
    return max(scaled(128_256, scale, 16), 40_000)


def _make(scale: float, device):
    g = seeded_generator(505)
    m = scaled(16_384, scale, 16)
    v = _vocab(scale)
    h = torch.randn(m, 2_048, generator=g).to(torch.bfloat16)
    w = (torch.randn(v, 2_048, generator=g) * 0.02).to(torch.bfloat16)
    # the cross-entropy's dlogits, (softmax - onehot) / M, of logits as Open-1B's head
    # gives them at initialization (std 0.02 * sqrt(2,048) = 0.905): what the backward
    # meets in training, its rows' top slices mostly zero (benchmarks.kernels.lmhead_tiles)
    dl = torch.softmax(torch.randn(m, v, generator=g) * 0.905, dim=1)
    dl[torch.arange(m), torch.randint(0, v, (m,), generator=g)] -= 1.0
    return tuple(t.to(device) for t in (h, w, dl.div_(m)))


GPU_CHECKS = [
    GpuCheck(
        name="lmhead.fwd",
        make_inputs=_make,
        run=lambda a: (lmhead_forward(a[0], a[1]),),
        torch_baseline=lambda a: (torch.mm(a[0], a[1].t()).float(),),
        cost=lambda a: Cost(flops=2.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s: f"bf16 ({scaled(16_384, s, 16)}x2048) @ (2048x{_vocab(s)})"
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
                           f"(2048x{_vocab(s)}) -> fp32 vs torch.mm bf16",
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
                           f"{_vocab(s)}), dh listing dlogits' nonzero top-slice "
                           "tiles, vs 2x torch.mm bf16",
        parity_scale=0.0625, bench_scale=0.5, bound="compute",
    ),
    GpuCheck(
        name="lmhead.bwd_dense",
        make_inputs=_make,
        run=lambda a: lmhead_backward(a[2], a[0], a[1], sparse_dlogits=False),
        torch_baseline=lambda a: (torch.mm(a[2].bfloat16(), a[1]),
                                  torch.mm(a[2].bfloat16().t(), a[0])),
        cost=lambda a: Cost(flops=4.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s: "lmhead.bwd with every top-slice tile multiplied (its A/B) at "
                           f"({scaled(16_384, s, 16)}, 2048, {_vocab(s)})",
        parity_scale=0.0625, bench_scale=0.5, bound="compute",
    ),
]
