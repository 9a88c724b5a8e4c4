"""Exact int8 x int8 -> int32 GEMM ("NT": both operands K-contiguous), with an optional
exactly specified dequantization epilogue.

    acc[m, n] = sum_k a[m, k] * b[n, k]            a: (M, K) int8, b: (N, K) int8

Arithmetic contract:
- The products and sums are integer arithmetic, so ``acc`` is exact and independent of
  the reduction order (tensor-core ``tl.dot`` on the GPU; on the CPU float32 GEMMs over
  contraction chunks short enough that every partial sum is an exact integer, see
  ``exact_int_mm_cpu``)
  *as long as no int32 partial sum can overflow*: |a|, |b| <= 128 gives |a*b| <= 2^14, so
  every partial sum is bounded by K * 2^14 and K <= MAX_K = 131,071 keeps it below 2^31.
  Larger K is rejected (split K yourself and add the int32 results in int64).
- Dequantization epilogue (when scales are given), every step one IEEE binary32 rounding,
  round-to-nearest-even, never fused::

      y[m, n] = rn( rn( float(acc[m, n]) * row_scale[m] ) * col_scale[n] )

  ``float(acc)`` is the int32 -> fp32 conversion, which rounds to nearest even once
  |acc| > 2^24 (``cvt.rn.f32.s32`` on the GPU, the same on x86); the conversion to a bf16
  output is one more round-to-nearest-even, done with integer bit operations on both
  paths (``bf16_rne``): the Triton interpreter's ``.to(tl.bfloat16)`` is not
  round-to-nearest-even, even with ``fp_downcast_rounding="rtne"`` (measured, Triton 3.9:
  -41.4437 -> -41.25), so it cannot be the definition.
  A NaN becomes the bf16 NaN 0x7FC0. ``row_scale`` may have one element (per-tensor).
  Likewise the interpreter widens bf16 *subnormals* wrongly, so kernels that read bf16
  tensors load their int16 bits (``bf16_operand``) and widen with ``widen_bf16_bits``
  (exact: the bf16 bits are the top half of the float32 bits).
- Subnormals: kept (IEEE multiply; no flush-to-zero). NaN/inf: only through the scales;
  they propagate as IEEE multiplies do (NaN payload bits are not part of the contract).
"""
from __future__ import annotations

import torch

from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel, row_pieces
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8 import pairmm, route
from open1b_kernels.int8.checksum import SlabCheck, checksum_ok
from open1b_kernels.int8.route import MAX_K, exact_int_mm_cpu

if HAVE_TRITON:
    import triton
    import triton.language as tl


# Tile shapes: GPU (tensor cores, int8 mma) and interpreter (numpy: few, larger programs).
GPU_BLOCKS = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 128, "GROUP_M": 8,
              "num_warps": 8, "num_stages": 4}
INTERPRET_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 4}

_OUT_DTYPES = (torch.int32, torch.float32, torch.bfloat16)
LOOPS = Loops("open1b_kernels.int8._int8c")    # the CPU epilogue compiled: _gemm.c
# On the "amx" route the dequantization runs inside the tile product, per 32 x 32 block in
# cache (``amxmm.product_dequant``); False writes the int32 product and dequantizes it in a
# second pass (``_dequant_compiled``) - the same bits (tests), kept to measure against
FUSED_DEQUANT = True


def _check(a: torch.Tensor, b: torch.Tensor, row_scale, col_scale, out_dtype) -> None:
    if a.dtype != torch.int8 or b.dtype != torch.int8:
        raise TypeError(f"int8 GEMM needs int8 operands, got {a.dtype} and {b.dtype}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need a (M, K) and b (N, K) with the same K, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    if a.shape[1] > MAX_K:
        raise ValueError(f"K = {a.shape[1]} > MAX_K = {MAX_K}: an int32 partial sum could "
                         "overflow; split K and add the int32 results in int64")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {_OUT_DTYPES}, got {out_dtype}")
    if (row_scale is None) != (col_scale is None):
        raise ValueError("give both row_scale and col_scale, or neither")
    if row_scale is None and out_dtype != torch.int32:
        raise ValueError(f"out_dtype {out_dtype} needs scales; without them the result is int32")
    if row_scale is not None:
        if row_scale.dtype != torch.float32 or col_scale.dtype != torch.float32:
            raise TypeError(f"scales must be float32, got {row_scale.dtype}, {col_scale.dtype}")
        if row_scale.numel() not in (1, a.shape[0]) or col_scale.numel() != b.shape[0]:
            raise ValueError(f"row_scale needs 1 or {a.shape[0]} elements and col_scale "
                             f"{b.shape[0]}, got {row_scale.numel()} and {col_scale.numel()}")
        if out_dtype == torch.int32:
            raise ValueError("with scales the output is float32 or bfloat16, not int32")


def bf16_rne(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bfloat16, round to nearest even by bit arithmetic (NaN -> 0x7FC0)."""
    fast = _bf16_rne_compiled(x)           # the same bit arithmetic, compiled
    if fast is not None:
        return fast
    b = x.contiguous().view(torch.int32)
    # (b + 0x7FFF + ((b >> 16) & 1)) >> 16, in place on one temporary (int32 adds commute);
    # carries into the exponent give +-inf
    r = (b >> 16).bitwise_and_(1).add_(0x7FFF).add_(b).bitwise_right_shift_(16)
    r.masked_fill_(torch.isnan(x), 0x7FC0)
    return r.to(torch.int16).view(torch.bfloat16)


def _bf16_rne_compiled(x: torch.Tensor) -> torch.Tensor | None:
    """``bf16_rne`` (float32 -> bf16, round to nearest even by bit arithmetic, NaN ->
    0x7FC0) by the compiled loop, or None when unavailable."""
    if not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    src = x.contiguous()
    out = torch.empty(src.shape, dtype=torch.bfloat16)
    a, b = src.reshape(-1).numpy(), out.reshape(-1).view(torch.int16).numpy()
    n = a.shape[0]
    parallel(lambda lo, hi, p: LOOPS.bf16_rne(a[lo:hi], b[lo:hi], p), n, grain=PARALLEL_MIN)
    return out


def bf16_operand(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """What a kernel should load for ``x``: its int16 bits if bf16 (then widen them with
    ``widen_bf16_bits``), else ``x`` itself; and whether it was bf16."""
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16), True
    return x, False


def dequantize_cpu(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor,
                   out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``rn(rn(float(acc) * row_scale[m]) * col_scale[n])`` then RNE to ``out_dtype``.

    ``out`` (float32, acc's shape) receives the float32 result instead of a new tensor.
    """
    y = acc.to(torch.float32) if out is None else out.copy_(acc)  # int32 -> fp32, RNE
    y.mul_(row_scale.reshape(-1, 1)).mul_(col_scale.reshape(1, -1))  # in place: same bits
    return bf16_rne(y) if out_dtype == torch.bfloat16 else y


def _dequant_compiled(acc: torch.Tensor, row_scale: torch.Tensor, col_scale: torch.Tensor,
                      out: torch.Tensor, sums: bool):
    """``dequantize_cpu`` of int32 ``acc`` (R, C) into ``out`` (contiguous float32 or bfloat16,
    acc's shape) by the compiled loop - the same float32 operations in the same order -
    with, when ``sums``, the exactness guard's int64 (row sums, column sums) of acc from the
    same pass. Returns (rows, cols) or () without sums; None when the loop is unavailable or
    a layout does not fit (nothing was written)."""
    if (not LOOPS.available() or acc.dtype != torch.int32 or not acc.is_contiguous()
            or acc.dim() != 2 or out.dtype not in (torch.float32, torch.bfloat16)
            or not out.is_contiguous() or out.shape != acc.shape):
        return None
    r, c = acc.shape
    rs = row_scale.reshape(-1).to(torch.float32).contiguous()
    cs = col_scale.reshape(-1).to(torch.float32).contiguous()
    if rs.numel() not in (1, r) or cs.numel() != c:
        return None
    bf = out.dtype == torch.bfloat16
    a, o = flat(acc), flat(out.view(torch.int16) if bf else out)
    rsn, csn = rs.numpy(), cs.numpy()
    if not sums:
        empty = none(torch.int64)
        parallel(lambda lo, hi, p: LOOPS.dequant(a, rsn, csn, o, bf, empty, empty, r, c, lo, hi,
                                                 p),
                 r, grain=max(1, PARALLEL_MIN // max(c, 1)))
        return ()
    rows = torch.empty(r, dtype=torch.int64)
    rr = rows.numpy()
    cols = row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: LOOPS.dequant(
        a, rsn, csn, o, bf, rr, parts, r, c, lo, hi, p))
    return rows, cols


def _checked_dequant(a: torch.Tensor, b: torch.Tensor, row_scale: torch.Tensor,
                     col_scale: torch.Tensor, y: torch.Tensor, b_tiles):
    """A checked route's product of ``a`` and ``b`` dequantized into ``y``, with the int32
    product's (row sums, column sums) for the check; None (nothing written) where the
    library refuses a layout or the compiled loop a shape. On "amx" (``FUSED_DEQUANT``) the
    tiles dequantize each block while it is in cache - no int32 product in memory, and the
    sums are those of the values dequantized; else the product goes to a reused buffer (it
    is only read here: page faults) and the compiled dequantization takes the sums in its
    pass."""
    tiles = b_tiles is not None and route.int_gemm_route() == "amx"
    if route.int_gemm_route() == "amx" and FUSED_DEQUANT:
        return route._amx_dequant_mm(a, b_tiles if tiles else b, row_scale, col_scale, y)
    try:
        acc = route._raw_int_mm(a, b_tiles if tiles else b.t(),
                                out=scratch("gemm.acc", (a.shape[0], b.shape[0]), torch.int32))
    except RuntimeError:        # a layout or shape the library refuses: not a fault
        return None
    return _dequant_compiled(acc, row_scale, col_scale, y, sums=True)


def exact_dequant_cpu(a: torch.Tensor, b: torch.Tensor, row_scale: torch.Tensor,
                      col_scale: torch.Tensor, out_dtype: torch.dtype,
                      out: torch.Tensor | None = None, slabs: SlabCheck | None = None,
                      b_tiles=None) -> torch.Tensor:
    """``dequantize_cpu(exact_int_mm_cpu(a, b, slabs=slabs), row_scale, col_scale,
    out_dtype, out)``: the same bits, and the same checks. On the integer route the check's
    row and column sums of the int32 product are taken in the dequantization's own pass
    (``_dequant_compiled``: one read of the product instead of four or five), and the result is
    returned only after the check passed; a failed check is counted, switches the process
    to the float route and recomputes, as ``exact_int_mm_cpu`` does. ``out``: a contiguous
    float32 destination (out_dtype float32 only). ``b_tiles``: ``b`` packed already for the
    "amx" route (``amxmm.pack``: one b shared by several slabs), used on that route only."""
    m, n = a.shape[0], b.shape[0]
    if (m and n and a.shape[1] and route.int_gemm_route() == "pairs"
            and (out is None or out_dtype == torch.float32)):
        # the exact product into a reused buffer, then the compiled dequantization (no
        # check: the pair GEMM is exact by construction, open1b_kernels.int8.route)
        acc = pairmm.pair_mm(a, b, out=scratch("gemm.acc", (m, n), torch.int32))
        y = out if out is not None else torch.empty((m, n), dtype=out_dtype)
        if _dequant_compiled(acc, row_scale, col_scale, y, sums=False) is not None:
            return y
        return dequantize_cpu(acc, row_scale, col_scale, out_dtype, out=out)
    if (m and n and a.shape[1] > 1 and route.int_gemm_route() in route.CHECKED
            and LOOPS.available()
            and (out is None or out_dtype == torch.float32)):
        y = out if out is not None else torch.empty((m, n), dtype=out_dtype)
        sums = _checked_dequant(a, b, row_scale, col_scale, y, b_tiles)
        if sums is not None:
            if (slabs.rows_ok(None, a, sums) if slabs is not None
                    else checksum_ok(None, a, b, sums)):
                return y
            route.record_failure(f"checksum failed on a {m}x{a.shape[1]}x{n} GEMM")
    if m and n and route.int_gemm_route() == "float" and (out is None
                                                          or out_dtype == torch.float32):
        # one float32 GEMM whose values are the exact integers (below 2^24): the float32
        # that dequantize_cpu converts the int32 product to, without the int32 round trip
        y = out if out is not None else torch.empty((m, n), dtype=torch.float32)
        acc = route.float_mm(a, b, y)
        if acc is None:
            y.mul_(row_scale.reshape(-1, 1)).mul_(col_scale.reshape(1, -1))
            return bf16_rne(y) if out_dtype == torch.bfloat16 else y
        return dequantize_cpu(acc, row_scale, col_scale, out_dtype, out=out)
    return dequantize_cpu(exact_int_mm_cpu(a, b, slabs=slabs), row_scale, col_scale,
                          out_dtype, out=out)


def int8_mm_cpu(a: torch.Tensor, b: torch.Tensor, row_scale=None, col_scale=None,
                out_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """CPU reference: an exact integer GEMM (``exact_int_mm_cpu``) plus the epilogue."""
    _check(a, b, row_scale, col_scale, out_dtype)
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0 or k == 0:
        acc = torch.zeros((m, n), dtype=torch.int32)
    elif row_scale is not None:
        return exact_dequant_cpu(a, b, row_scale, col_scale, out_dtype)
    else:
        acc = exact_int_mm_cpu(a, b)
    if row_scale is None:
        return acc
    return dequantize_cpu(acc, row_scale, col_scale, out_dtype)


if HAVE_TRITON:

    @triton.jit
    def bf16_rne_bits(y):
        """float32 tile -> int16 tile holding the round-to-nearest-even bfloat16 bits."""
        b = y.to(tl.int32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, 0x7FC0, r)
        return r.to(tl.int16)

    @triton.jit
    def widen_bf16_bits(v):
        """int16 tile of bf16 bits -> the exactly equal float32 tile (subnormals kept)."""
        return (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)

    @triton.jit
    def load_f32(ptrs, mask, other, IS_BF16: tl.constexpr):
        """float32 tile of a tensor passed through ``bf16_operand``: bf16 bits widened
        exactly (masked lanes +0; the interpreter widens bf16 subnormals wrongly), any
        other float dtype converted (masked lanes ``other``)."""
        if IS_BF16:
            return widen_bf16_bits(tl.load(ptrs, mask=mask, other=0))
        else:
            return tl.load(ptrs, mask=mask, other=other).to(tl.float32)

    @triton.jit
    def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        """(row tile, column tile) of this program in grouped order, so that GROUP_M row
        tiles reuse the same b tiles from L2 (shared by every tiled GEMM kernel)."""
        pid = tl.program_id(0)
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        group = GROUP_M * num_n
        first_m = (pid // group) * GROUP_M
        size_m = tl.minimum(num_m - first_m, GROUP_M)
        return first_m + (pid % group) % size_m, (pid % group) // size_m

    @triton.jit
    def _int8_mm_kernel(a_ptr, b_ptr, c_ptr, rs_ptr, cs_ptr, M, N, K,
                        stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
                        rs_stride,
                        DEQUANT: tl.constexpr, OUT_BF16: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)

        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        a_rows = a_ptr + rm[:, None].to(tl.int64) * stride_am
        b_cols = b_ptr + rn[None, :].to(tl.int64) * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + rk
            a = tl.load(a_rows + kk[None, :] * stride_ak,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0)
            b = tl.load(b_cols + kk[:, None] * stride_bk,
                        mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
            acc += tl.dot(a, b, out_dtype=tl.int32)  # exact: see MAX_K

        out_mask = (rm[:, None] < M) & (rn[None, :] < N)
        c_off = rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
        if DEQUANT:
            rs = tl.load(rs_ptr + rm * rs_stride, mask=rm < M, other=0.0)
            cs = tl.load(cs_ptr + rn, mask=rn < N, other=0.0)
            y = acc.to(tl.float32) * rs[:, None]  # cvt.rn.f32.s32, then mul.rn
            y = y * cs[None, :]
            if OUT_BF16:
                tl.store(c_ptr + c_off, bf16_rne_bits(y), mask=out_mask)
            else:
                tl.store(c_ptr + c_off, y, mask=out_mask)
        else:
            tl.store(c_ptr + c_off, acc, mask=out_mask)


def int8_mm_triton(a: torch.Tensor, b: torch.Tensor, row_scale=None, col_scale=None,
                   out_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """Launch the Triton kernel (any strides; the output is contiguous)."""
    _check(a, b, row_scale, col_scale, out_dtype)
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    c_store = c.view(torch.int16) if out_dtype == torch.bfloat16 else c
    cfg = dict(INTERPRET_BLOCKS if interpreting() else GPU_BLOCKS)
    dequant = row_scale is not None
    rs = row_scale.reshape(-1) if dequant else c
    cs = col_scale.reshape(-1) if dequant else c
    rs_stride = 0 if (dequant and rs.numel() == 1 and m > 1) else 1
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    _int8_mm_kernel[grid](a, b, c_store, rs, cs, m, n, k,
                          a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                          c.stride(0), c.stride(1), rs_stride,
                          DEQUANT=dequant, OUT_BF16=out_dtype == torch.bfloat16,
                          **cfg, **LAUNCH_OPTIONS)
    return c


def int8_mm(a: torch.Tensor, b: torch.Tensor, row_scale: torch.Tensor | None = None,
            col_scale: torch.Tensor | None = None,
            out_dtype: torch.dtype = torch.int32) -> torch.Tensor:
    """``a @ b.T`` exactly in int32, or dequantized with the epilogue in the module doc.

    a: (M, K) int8, b: (N, K) int8; row_scale (M,) or (1,) and col_scale (N,) float32.
    Triton on CUDA tensors (or when forced), the CPU reference otherwise: same bits.
    """
    if use_triton(a):
        return int8_mm_triton(a, b, row_scale, col_scale, out_dtype)
    return int8_mm_cpu(a, b, row_scale, col_scale, out_dtype)


# ---------------------------------------------------------------- GPU check registry
# Open-1B projection shapes (tokens x in -> out): fused gate|up, down, attention q/o, k/v.
SHAPES = {"gate_up": (16_384, 2_048, 11_264), "down": (16_384, 5_632, 2_048),
          "attn_qo": (16_384, 2_048, 2_048), "attn_kv": (16_384, 2_048, 512)}


def _make_inputs(shape: tuple[int, int, int]):
    def make(scale: float, device):
        g = seeded_generator(202)
        m, k, n = scaled(shape[0], scale, 16), shape[1], shape[2]
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
        xa = torch.randn(m, k, generator=g).to(torch.bfloat16)
        xb = torch.randn(n, k, generator=g).to(torch.bfloat16)
        return tuple(t.to(device) for t in (a, b, xa, xb))
    return make


def _check_entry(label: str, shape: tuple[int, int, int]) -> GpuCheck:
    return GpuCheck(
        name=f"int8_gemm.{label}",
        make_inputs=_make_inputs(shape),
        run=lambda t: (int8_mm(t[0], t[1]),),
        torch_baseline=lambda t: (torch.mm(t[2], t[3].t()),),
        cost=lambda t: Cost(
            flops=2.0 * t[0].shape[0] * t[0].shape[1] * t[1].shape[0],
            bytes=t[0].numel() + t[1].numel() + 4.0 * t[0].shape[0] * t[1].shape[0]),
        describe=lambda s, sh=shape: f"int8 ({scaled(sh[0], s, 16)}x{sh[1]}) @ ({sh[1]}x{sh[2]}) "
                                     "-> int32 vs torch.mm bf16",
        parity_scale=0.25, bound="compute",
    )


GPU_CHECKS = [_check_entry(label, shape) for label, shape in SHAPES.items()]
