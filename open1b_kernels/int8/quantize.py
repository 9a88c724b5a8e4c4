"""Symmetric int8 quantizers of the W8A8 linear (open1b_kernels/int8/linear.py): codes for a given
step, the per-row absmax step and the fused rotate-then-quantize of the backward (their
straight-through estimator with its LSQ step term: open1b_kernels/int8/ste.py).

Q = 127 (levels -127..127). Every float step is one IEEE binary32 operation,
round-to-nearest-even, never fused; ``rne(v)`` is ``(v + 1.5*2^23) - 1.5*2^23`` (exact
ties-to-even for |v| < 2^22).
- ``quantize(x, s)``: ``v = x / s`` (IEEE division, ``tl.div_rn``),
  ``q = rne(clamp(v, -127, 127))`` as int8; a zero step gives q = 0 (an all-zero row).
  ``s`` is per row (R,) or per tensor (1,).
- ``row_absmax_step(x)``: ``s_row = rn(max|row| * INV_127)``, INV_127 = fp32(1/127)
  (max is exact in any order, so one definition serves every device).
- ``rotate_quantize(t)``: open1b_kernels.int8.hadamard's rotation of each row (block 256, zero-padded
  to a multiple of 256), then ``row_absmax_step`` and ``quantize``. On the GPU the three
  are one kernel (the rotated float32 tensor never reaches memory); the bits are those
  of the separate ops.

CPU paths use ``torch.round`` for ``rne`` (IEEE roundToIntegralTiesToEven: the same values
up to the sign of a zero, which no int8 code can show) and skip a
clamp only where it provably changes nothing. ``rotate_quantize_dim0_cpu`` is the CPU
layout of ``rotate_quantize`` the linear's backward uses: it rotates along dim 0 in L2-sized
tiles, so no weight-sized transpose is copied; the dX product's gradient rows go through
``open1b_kernels.int8.rotrows.rotate_quantize_rows_cpu``, one row at a time in cache.

Subnormals kept (IEEE). Inputs and steps must be finite: non-finite values give
unspecified int8 codes, which is outside the parity contract.
"""
from __future__ import annotations

import math

import torch

from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from open1b_kernels.int8.hadamard import hadamard, hadamard_dim0_cpu_, inv_sqrt, padded_width
from open1b_kernels.int8.gemm import bf16_operand
from open1b_kernels.core.workspace import scratch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.int8.hadamard import rotated_block
    from open1b_kernels.int8.gemm import load_f32

Q_MAX = 127
RND = 12582912.0  # 1.5 * 2^23
INV_127 = 0.007874015718698502  # fp32(1/127), bits 0x3C010204
HADAMARD_BLOCK = 256
BLOCK_R, BLOCK_K = 32, 128  # elementwise tiles (rows x columns)
ROT_ROWS = 16  # rows per program of the fused rotate+quantize kernel on the GPU
SLAB = 1 << 19  # elements per row slab of the CPU weight passes (2 MB of float32: one L2)
# The compiled rotation's tiles: one block of B rows by STRIP columns (128 KB of float32)
# stays in L2 through the fill, the log2(B) butterfly stages, the scale and the extremes;
# a 2 MB tile went through the stages from L3 (measured, 2 cores: 2.15 -> 1.08 ms for a
# (768, 2,048) bf16 gradient, 9.1 -> 5.8 ms for (4,096, 2,048); columns are independent and
# each column still meets its rows in ascending order, so the same bits)
STRIP = 128
# The fused columns' pass (``rotq_codes`` in _quantize.c): one strip of columns at a time,
# all its rows rotated into a buffer of at most STRIP_BYTES - half this core's L2, so that
# the strip and the source lines it reads stay there through the steps and the codes: the
# float32 copy of the whole matrix never reaches memory. Measured on the AMX Xeon (2 MB of
# L2 a core; benchmarks.kernels.stages): the weight gradient's rotation of gate|up's
# gradient 2.7x. False: the tiles and the codes' sweep (the same bits; tests, and the
# benchmark's side by side).
FUSED_COLS = True


def _l2_bytes(default: int = 1 << 20) -> int:
    """This core's L2 in bytes (Linux's cache description), else ``default``."""
    base = "/sys/devices/system/cpu/cpu0/cache/index2/"
    try:
        with open(base + "level") as f:
            if f.read().strip() != "2":
                return default
        with open(base + "size") as f:
            size = f.read().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        return default


STRIP_BYTES = _l2_bytes() // 2
FLT_MIN = 2.0 ** -126  # smallest normal float32
LOOPS = Loops("open1b_kernels.int8._int8c")    # the CPU passes compiled: _quantize.c

if HAVE_TRITON:
    RND_K = tl.constexpr(RND)
    INV_127_K = tl.constexpr(INV_127)


def safe_step(s: torch.Tensor) -> torch.Tensor:
    """The divisor for step ``s``: 1 where s == 0 (its codes are then 0 or tiny)."""
    return torch.where(s == 0, torch.ones_like(s), s)


def codes_(v: torch.Tensor, clamp: bool = True, out: torch.Tensor | None = None
           ) -> torch.Tensor:
    """int8 ``rne(clamp(v, -127, 127))`` of float32 ``v``, clamping and rounding v in place
    (into ``out`` when given). ``clamp=False`` only where the caller has shown |v| < 127.5:
    then the clamp cannot change the rounded value.

    ``torch.round`` is IEEE roundToIntegralTiesToEven, so on |v| <= 127 it gives the values
    of ``(v + RND) - RND`` in one pass instead of two; the two differ only in the sign of
    a zero result (round(-0.3) = -0.0), which an int8 code cannot carry.
    """
    if clamp:
        v.clamp_(-Q_MAX, Q_MAX)
    v.round_()
    return v.to(torch.int8) if out is None else out.copy_(v)


# ------------------------------------------------------------------- CPU references
def quantize_cpu(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """q = rne(clamp(x / step, -127, 127)) as int8; step (R,) per row or (1,) per tensor."""
    div = safe_step(step.reshape(-1, 1))
    fast = _quantize_compiled(x, div) if x.dim() == 2 else None   # the same ops, compiled
    if fast is not None:
        return fast
    return codes_(x.to(torch.float32) / div)


def row_absmax_step_cpu(x: torch.Tensor) -> torch.Tensor:
    """Per-row step rn(max|x[r, :]| * INV_127) of a float32 (R, K) tensor."""
    return x.abs().amax(dim=1) * INV_127


# A maximum and one multiply are exact on every device (torch on CUDA included), so the
# step needs no kernel of its own; the GPU's fused rotate_quantize computes it in-kernel.
row_absmax_step = row_absmax_step_cpu


def rotate_quantize_dim0_cpu(y: torch.Tensor, name: str, fill=None):
    """``rotate_quantize(t)`` for the (R, K) tensor t whose zero-padded float32 transpose
    (Kp, R) is ``y`` (a scratch buffer, overwritten; or written tile by tile by ``fill``,
    see ``hadamard_dim0_cpu_``): codes^T (Kp, R) int8 (scratch ``name``) and steps (R,),
    the same bits."""
    c = y.shape[1]
    cmax = torch.full((c,), -math.inf)
    cmin = torch.full((c,), math.inf)

    def extremes(tile, rows, cols):  # column max and min, while the tile is in cache
        torch.maximum(cmax[cols], tile.amax(0), out=cmax[cols])
        torch.minimum(cmin[cols], tile.amin(0), out=cmin[cols])

    hadamard_dim0_cpu_(y, HADAMARD_BLOCK, fill, extremes)
    # max|y| per column = max(max y, -min y) (no |y| pass); abs_ turns the -0 an all-zero
    # column may give into the +0 of max|y|
    step = torch.maximum(cmax, cmin.neg_()).abs_().mul_(INV_127)
    # The clamp is a no-op unless a step is subnormal: for a normal s = rn(m * INV_127)
    # (m = max|y| of the column), |y| / s <= m / s <= 127 / (1 - 2^-24)^2 < 127.5; s = 0
    # means m * INV_127 < 2^-149 and the safe divisor 1 leaves |v| = |y| tiny.
    clamp = bool(((step > 0) & (step < FLT_MIN)).any())
    div = safe_step(step)
    codes = scratch(name, y.shape, torch.int8)
    rows = max(1, SLAB // c)
    for r0 in range(0, y.shape[0], rows):  # slabs: divide, round and narrow in cache
        codes_(y[r0:r0 + rows].div_(div), clamp, codes[r0:r0 + rows])
    return codes, step


def rotate_quantize_cols_cpu(s: torch.Tensor, name: str, row_scale: torch.Tensor | None = None,
                             transposed: bool = False):
    """``rotate_quantize(t)`` of the (R, K) matrix t = s^T, in the dim-0 layout of
    ``rotate_quantize_dim0_cpu``: s (K, R) - bf16 or int8, row-major or the transposed view
    of a row-major matrix; int8 times ``row_scale`` (K,) (one float32 product per element:
    a dequantized weight) when given - is rotated along dim 0, zero-padded to Kp rows.
    Returns (codes of t, transposed: (Kp, R) int8, or t's own (R, Kp) layout when
    ``transposed``; scratch ``name``) and the steps (R,): the bits of the torch steps.

    With the compiled loops, filling each tile from s (converting, transposing or scaling
    in cache), the rotation, the scale and the column extremes are one pass per L2-sized
    tile, and the codes one more - no float32 copy of s, no transposed copy of the codes.
    From a row-major source whose 64- or 32-column strips fit half the L2 (``FUSED_COLS``),
    each strip goes through once instead, its steps and codes included (``rotq_codes``):
    the float32 rotation then never reaches memory."""
    k, r = s.shape
    kp = padded_width(k, HADAMARD_BLOCK)
    if row_scale is None and s.dtype == torch.bfloat16 and s.is_contiguous():
        kind, src = 0, s
    elif row_scale is None and s.dtype == torch.bfloat16 and s.t().is_contiguous():
        kind, src = 1, s.t()
    elif s.dtype == torch.int8 and s.is_contiguous():
        kind, src = (2 if row_scale is None else 3), s
    else:
        kind, src = None, None
    if kind in (0, 2, 3) and FUSED_COLS:
        got = _rotate_codes_compiled(kind, src, row_scale, k, kp, r, name, transposed)
        if got is not None:
            return got
    y = scratch(f"{name}.y", (kp, r), torch.float32)
    cmax = torch.full((r,), -math.inf)
    cmin = torch.full((r,), math.inf)
    if kind is not None and _rotate_cols_compiled(kind, src, row_scale, k, y, HADAMARD_BLOCK,
                                              inv_sqrt(HADAMARD_BLOCK), cmax, cmin, HADAMARD_BLOCK,
                                              STRIP):
        got = _steps_compiled(cmax, cmin, INV_127)   # the operations below, one call
        if got is None:
            step = torch.maximum(cmax, cmin.neg_()).abs_().mul_(INV_127)   # as below
            got = step, safe_step(step), bool(((step > 0) & (step < FLT_MIN)).any())
        step, div, clamp = got
        codes = scratch(name, (r, kp) if transposed else (kp, r), torch.int8)
        if _codes_compiled(y, div, clamp, codes, transposed):
            return codes, step
    # the torch steps: y filled (w_hat tile by tile), then rotate_quantize_dim0_cpu
    fill = None
    if row_scale is None:
        y[:k].copy_(s)
        y[k:].zero_()
    else:
        def fill(tile, rows, cols):  # rn(s * row_scale[n]), zero rows past K
            lo, hi = rows.start, min(rows.stop, k)
            tile[:hi - lo].copy_(s[lo:hi, cols]).mul_(row_scale[lo:hi, None])
            tile[hi - lo:].zero_()
    codes, step = rotate_quantize_dim0_cpu(y, name, fill)
    return (codes.t().contiguous() if transposed else codes), step


def _quantize_compiled(x: torch.Tensor, div: torch.Tensor) -> torch.Tensor | None:
    """``quantize_cpu``'s int8 codes of a 2-D bf16 or float32 CPU tensor for the safe step
    ``div`` ((R,) per row or (1,)) by the compiled loop - the same division, clamp and
    rounding - or None when the loop is unavailable."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dim() != 2
            or x.dtype not in (torch.bfloat16, torch.float32)):
        return None
    r, c = x.shape
    d = div.reshape(-1).to(torch.float32).contiguous()
    if d.numel() not in (1, r):
        return None
    xc = x.contiguous()
    out = torch.empty((r, c), dtype=torch.int8)
    bf = x.dtype == torch.bfloat16
    args = (flat(xc.view(torch.int16) if bf else xc), bf, flat(d), flat(out), r, c)
    parallel(lambda lo, hi, p: LOOPS.quant(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // max(c, 1)))
    return out


def _rotate_cols_compiled(kind: int, src: torch.Tensor, row_scale: torch.Tensor | None,
                          valid: int, y: torch.Tensor, block: int, scale: float,
                          cmax: torch.Tensor, cmin: torch.Tensor, tile_rows: int,
                          tile_cols: int) -> bool:
    """``rotate_quantize_cols_cpu``'s fill, rotation, scale and column extremes by the compiled
    loop (see ``rotq`` in _quantize.c for the source kinds; ``src`` is the source's
    contiguous storage), columns split among the threads; False when the loop is
    unavailable."""
    if not LOOPS.available():
        return False
    r, c = y.shape
    sb, rs = _source(src, row_scale)
    if kind == 1:     # a transposed bf16 source: y filled first by one blocked transpose
        parallel(lambda lo, hi, p: LOOPS.widen_t(sb, flat(y), valid, c, r, lo * 64,
                                                 min(r, hi * 64), p), -(-r // 64), grain=4)
    args = (kind, sb, rs, valid, flat(y), r, c, block, scale, flat(cmax), flat(cmin),
            tile_rows, tile_cols)
    parallel(lambda lo, hi, p: LOOPS.rotq(*args, lo, hi, p), c, grain=16)
    return True


def _source(src: torch.Tensor, row_scale: torch.Tensor | None):
    """The compiled rotations' source arguments: the source's storage as bf16 bits or int8,
    and the row scale as float32 (an empty buffer without one)."""
    bits = src.view(torch.int16) if src.dtype == torch.bfloat16 else src
    return flat(bits), (flat(row_scale.to(torch.float32).contiguous())
                        if row_scale is not None else none())


def _strip_width(rows: int, cols: int) -> int | None:
    """The fused pass's strip: 64 or 32 columns (the wider where it fits) dividing ``cols``,
    whose ``rows`` float32 fit STRIP_BYTES; None where neither does - the tiles' path then.
    (Strips of 16 columns ran at half the tiles' speed on the Xeon.)"""
    for width in (64, 32):
        if cols % width == 0 and rows * width * 4 <= STRIP_BYTES:
            return width
    return None


def _rotate_codes_compiled(kind: int, src: torch.Tensor, row_scale: torch.Tensor | None,
                           valid: int, kp: int, r: int, name: str, transposed: bool):
    """``rotate_quantize_cols_cpu``'s (codes, steps) by the fused compiled pass (``rotq_codes``:
    per strip of columns the rotation, steps and codes in one pass through L2), strips split
    among the threads; None where the loop is unavailable or no strip fits."""
    width = _strip_width(kp, r)
    if width is None or HADAMARD_BLOCK != 256 or not LOOPS.available():
        return None
    codes = scratch(name, (r, kp) if transposed else (kp, r), torch.int8)
    step = torch.empty((r,), dtype=torch.float32)
    args = (kind, *_source(src, row_scale), valid, kp, r, width, inv_sqrt(HADAMARD_BLOCK), INV_127,
            transposed, flat(codes), flat(step))
    parallel(lambda lo, hi, p: LOOPS.rotq_codes(*args, lo, hi, p), r // width, grain=1)
    return codes, step


def _steps_compiled(cmax: torch.Tensor, cmin: torch.Tensor, inv127: float):
    """``rotate_quantize_cols_cpu``'s (step, divisor, subnormal) from the rotation's column
    extremes by the compiled loop - step = |max(cmax, -cmin)| * inv127, the divisor 1 where
    step == 0, whether a step is subnormal: the torch code's operations - or None when the
    loop is unavailable."""
    if not LOOPS.available():
        return None
    step, div = torch.empty_like(cmax), torch.empty_like(cmax)
    sub = LOOPS.rot_steps(flat(cmax), flat(cmin), flat(step), flat(div), inv127)
    return step, div, sub


def _codes_compiled(y: torch.Tensor, div: torch.Tensor, clamp: bool, out: torch.Tensor,
                    transposed: bool) -> bool:
    """int8 ``rne(clamp(y / div[col]))`` of float32 (R, C) ``y`` into ``out`` ((R, C), or
    (C, R) when ``transposed``) by the compiled loop; False when it is unavailable."""
    if not LOOPS.available():
        return False
    r, c = y.shape
    args = (flat(y), flat(div.to(torch.float32).contiguous()), clamp, flat(out), transposed, r, c)
    parallel(lambda lo, hi, p: LOOPS.codes(*args, lo, hi, p), r,
             grain=max(64, PARALLEL_MIN // max(c, 1)))
    return True


# ------------------------------------------------------------------- Triton kernels
if HAVE_TRITON:

    @triton.jit
    def _quantize_kernel(x_ptr, s_ptr, q_ptr, R, K, stride_r, stride_k, s_stride,
                         IS_BF16: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        cols = tl.program_id(1) * BK + tl.arange(0, BK)
        mask = (rows[:, None] < R) & (cols[None, :] < K)
        ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_r + cols[None, :] * stride_k
        x = load_f32(ptrs, mask, 0.0, IS_BF16)
        s = tl.load(s_ptr + rows * s_stride, mask=rows < R, other=1.0)
        s = tl.where(s == 0.0, 1.0, s)
        v = tl.div_rn(x, s[:, None])
        v = tl.minimum(tl.maximum(v, -127.0), 127.0)
        q = ((v + RND_K) - RND_K).to(tl.int8)
        tl.store(q_ptr + rows[:, None].to(tl.int64) * K + cols[None, :], q, mask=mask)

    @triton.jit
    def _rot_quant_kernel(x_ptr, q_ptr, s_ptr, R, K, KP, stride_r, stride_k, scale,
                          IS_BF16: tl.constexpr, ROWS: tl.constexpr, B: tl.constexpr,
                          LOG_B: tl.constexpr):
        # Fused hadamard -> row absmax step -> quantize: pass 1 rotates each block for the
        # row maximum, pass 2 rotates again (the same bits) and writes int8 codes, so the
        # float32 rotated tensor never reaches memory.
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        amax = tl.zeros((ROWS,), dtype=tl.float32)
        for j in range(0, KP // B):
            y = rotated_block(x_ptr, rows, j, R, K, stride_r, stride_k, scale,
                              IS_BF16, ROWS, B, LOG_B)
            amax = tl.maximum(amax, tl.max(tl.abs(y), axis=1))
        step = amax * INV_127_K
        tl.store(s_ptr + rows, step, mask=rows < R)
        div = tl.where(step == 0.0, 1.0, step)
        for j in range(0, KP // B):
            y = rotated_block(x_ptr, rows, j, R, K, stride_r, stride_k, scale,
                              IS_BF16, ROWS, B, LOG_B)
            v = tl.div_rn(y, div[:, None])
            v = tl.minimum(tl.maximum(v, -127.0), 127.0)
            cols = j * B + tl.arange(0, B)
            tl.store(q_ptr + rows[:, None].to(tl.int64) * KP + cols[None, :],
                     ((v + RND_K) - RND_K).to(tl.int8), mask=rows[:, None] < R)


# ------------------------------------------------------------------- dispatchers
def _grid(r: int, k: int):
    return (triton.cdiv(r, BLOCK_R), triton.cdiv(k, BLOCK_K))


def quantize(x: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """int8 codes of a 2-D tensor (any strides) with a per-row or per-tensor step."""
    if not use_triton(x):
        return quantize_cpu(x, step)
    r, k = x.shape
    q = torch.empty((r, k), dtype=torch.int8, device=x.device)
    if q.numel():
        s = step.reshape(-1).to(torch.float32)
        xk, is_bf16 = bf16_operand(x)
        _quantize_kernel[_grid(r, k)](xk, s, q, r, k, x.stride(0), x.stride(1),
                                      0 if s.numel() == 1 else 1, IS_BF16=is_bf16,
                                      BR=BLOCK_R, BK=BLOCK_K, **LAUNCH_OPTIONS)
    return q


def rotate_quantize(t: torch.Tensor, block: int = HADAMARD_BLOCK):
    """Hadamard-rotate the rows of 2-D ``t`` (any dtype/strides), then per-row absmax int8:
    (codes (R, padded K) int8, steps (R,) float32). Same bits as the three separate ops."""
    if not use_triton(t):
        r = hadamard(t, block)
        s = row_absmax_step(r)
        return quantize(r, s), s
    rr, k = t.shape
    kp = padded_width(k, block)
    log = block.bit_length() - 1
    q = torch.empty((rr, kp), dtype=torch.int8, device=t.device)
    s = torch.empty((rr,), dtype=torch.float32, device=t.device)
    if rr and kp:
        rows = 16 if interpreting() else ROT_ROWS
        tk, is_bf16 = bf16_operand(t)
        _rot_quant_kernel[(triton.cdiv(rr, rows),)](
            tk, q, s, rr, k, kp, t.stride(0), t.stride(1), inv_sqrt(block),
            IS_BF16=is_bf16, ROWS=rows, B=block, LOG_B=log, **LAUNCH_OPTIONS)
    elif rr:
        s.zero_()
    return q, s
