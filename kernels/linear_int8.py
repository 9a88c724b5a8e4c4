"""The W8A8 quantization-aware linear of Open-1B (SPEC section 4): y = x_hat @ w_hat^T.

Shapes: x (M, K) bf16 (leading dims flattened by the autograd wrapper), w (N, K) bf16,
s_x a one-element float32 tensor (the trainable per-tensor LSQ activation step, > 0).
Q = 127 (symmetric int8 levels -127..127, so |q*q| <= 2^14 and kernels.int8_gemm's K bound
holds). Every float step below is one IEEE binary32 operation, round-to-nearest-even,
never fused; ``rne(v)`` is ``(v + 1.5*2^23) - 1.5*2^23`` (exact ties-to-even for |v| < 2^22).

Forward
1. Weight step, re-pinned every call (not trained; no gradient flows into it):
   ``sw[n] = rn( rn(tree_sum_k |w[n,k]| * INV_K) * TWO_OVER_SQRT127 )`` where tree_sum is
   kernels.reduce's pairwise tree, INV_K = fp32(1) / fp32(K) (IEEE division on the host)
   and TWO_OVER_SQRT127 = 0x3E35BB09 = 0.177471295, the correctly rounded float32 of
   2/sqrt(127) (tests check it against a 60-digit computation).
2. Quantize: ``v = x / s`` (IEEE division, ``tl.div_rn``), ``q = rne(clamp(v, -127, 127))``
   as int8; a zero step gives q = 0 (an all-zero weight row). x uses s_x, w uses sw[n].
3. ``acc = q_x @ q_w^T`` exact in int32 (kernels.int8_gemm), then
   ``y = bf16_rne( rn( rn(float(acc) * s_x) * sw[n] ) )`` (int32 -> fp32 conversion rounds
   to nearest even above 2^24, identically on both paths; tested).

Backward (straight-through estimator, LSQ): with G = dL/dy (bf16),
- rotations: kernels.hadamard (block 256, orthonormal, along each GEMM's contraction dim);
  then per-row absmax int8 quantization ``s_row = rn(max|row| * INV_127)`` (INV_127 =
  fp32(1/127)), ``q = rne(clamp(row / s_row, -127, 127))`` (s_row = 0 -> q = 0). On the
  GPU the three steps are one kernel (``rotate_quantize``: the rotated float32 tensor
  never reaches memory); the values are the same as the separate ops, bit for bit.
- dX_hat (M, K) = G @ w_hat, contraction over N: rotate G's rows (M, N) and w_hat^T's
  rows (K, N), w_hat = rn(q_w * sw[n]) in fp32; quantize each per row; int8 GEMM with
  ``dX_hat = rn(rn(float(acc) * sG[m]) * sW[k])`` in fp32.
- dW (N, K) = G^T @ x_hat, contraction over M: rotate G^T's rows (N, M) and q_x^T's rows
  (K, M) (integer inputs: this rotation is exact); quantize per row; int8 GEMM with
  ``dW = rn(rn(float(acc) * sG[n]) * rn(sQ[k] * s_x))`` in fp32.
- STE clipping range: the gradient passes where -127 <= v <= 127 (v = x/s before
  rounding), zero outside: ``dx = bf16_rne(where(inside, dX_hat, 0))``,
  ``dw = where(inside_w, dW, 0)`` (float32; the autograd wrapper's dw is cast to w's dtype
  by autograd - call ``linear_int8_backward`` for the float32 gradient).
- LSQ step gradient: ``ds = rn(tree_sum(rn(dX_hat * t)) * g)`` over all M*K elements in
  row-major order, t = rne(v) - v inside and the clamp bound (-127 or 127) outside,
  g = fp32(1 / sqrt(M*K*127)) computed in double on the host.

CPU path (``linear_int8_forward_cpu`` / ``linear_int8_backward_cpu``, what ``force("cpu")``
and the autograd wrapper run): the same bits as the steps above, computed in an order that
suits memory - the forward's int8 codes are kept for the backward, rotations run along
dim 0 in L2-sized tiles (``hadamard.hadamard_dim0_cpu_``), weight-sized passes in row
slabs, intermediates in ``kernels.workspace``, ``rne`` as ``torch.round`` (the same value
up to the sign of a zero, which neither an int8 code nor the term t can show), and a clamp
skipped only where it provably changes nothing. tests/kernels/test_linear_int8_cpu.py
checks it against the steps written out literally.

Subnormals kept (IEEE). NaN/inf policy: inputs and steps must be finite (the trainer's
gradient-norm check stops non-finite steps); non-finite values give unspecified int8
codes, which is outside the parity contract. Tokens M <= int8_gemm.MAX_K (dW contracts
over M).
"""
from __future__ import annotations

import math

import torch

from kernels.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from kernels.hadamard import hadamard, hadamard_dim0_cpu_, padded_width
from kernels.int8_gemm import (MAX_K, bf16_operand, bf16_rne, dequantize_cpu, exact_int_mm_cpu,
                               int8_mm, int8_mm_cpu)
from kernels.reduce import tree_sum, tree_sum_cpu
from kernels.registry import Cost, GpuCheck, scaled, seeded_generator
from kernels.workspace import scratch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from kernels.hadamard import rotated_block
    from kernels.int8_gemm import bf16_rne_bits, load_f32

Q_MAX = 127
RND = 12582912.0  # 1.5 * 2^23
TWO_OVER_SQRT127 = 0.17747129499912262  # float32 bits 0x3E35BB09
INV_127 = 0.007874015718698502  # fp32(1/127), bits 0x3C010204
HADAMARD_BLOCK = 256
BLOCK_R, BLOCK_K = 32, 128  # elementwise tiles (rows x columns)
ROT_ROWS = 16  # rows per program of the fused rotate+quantize kernel on the GPU
SLAB = 1 << 19  # elements per row slab of the CPU weight passes (2 MB of float32: one L2)
FLT_MIN = 2.0 ** -126  # smallest normal float32

if HAVE_TRITON:
    RND_K = tl.constexpr(RND)
    INV_127_K = tl.constexpr(INV_127)


def _safe(s: torch.Tensor) -> torch.Tensor:
    return torch.where(s == 0, torch.ones_like(s), s)


def _codes_(v: torch.Tensor, clamp: bool = True, out: torch.Tensor | None = None
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
    return _codes_(x.to(torch.float32) / _safe(step.reshape(-1, 1)))


def row_absmax_step_cpu(x: torch.Tensor) -> torch.Tensor:
    """Per-row step rn(max|x[r, :]| * INV_127) of a float32 (R, K) tensor."""
    return x.abs().amax(dim=1) * INV_127


def ste_cpu(g: torch.Tensor, x: torch.Tensor, step: torch.Tensor, want_term: bool,
            out_bf16: bool):
    """STE mask (and LSQ term g * dv/ds) of the quantizer at (x, step); see module doc."""
    v = x.to(torch.float32) / _safe(step.reshape(-1, 1))
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
    def _row_absmax_kernel(x_ptr, s_ptr, R, K, BR: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BR + tl.arange(0, BR)
        amax = tl.zeros((BR,), dtype=tl.float32)
        for k0 in range(0, K, BK):
            cols = k0 + tl.arange(0, BK)
            x = tl.load(x_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
                        mask=(rows[:, None] < R) & (cols[None, :] < K), other=0.0)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))  # max is exact in any order
        tl.store(s_ptr + rows, amax * INV_127_K, mask=rows < R)

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


if HAVE_TRITON:

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
            tk, q, s, rr, k, kp, t.stride(0), t.stride(1), 2.0 ** -(log // 2),
            IS_BF16=is_bf16, ROWS=rows, B=block, LOG_B=log, **LAUNCH_OPTIONS)
    elif rr:
        s.zero_()
    return q, s


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


def row_absmax_step(x: torch.Tensor) -> torch.Tensor:
    """Per-row int8 step rn(max|row| * INV_127) of a contiguous float32 (R, K) tensor."""
    if not use_triton(x):
        return row_absmax_step_cpu(x)
    r, k = x.shape
    s = torch.empty((r,), dtype=torch.float32, device=x.device)
    if r:
        bk = 64 if interpreting() else 256
        _row_absmax_kernel[(triton.cdiv(r, BLOCK_R),)](x, s, r, k, BR=BLOCK_R, BK=bk,
                                                       **LAUNCH_OPTIONS)
    return s


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
        _ste_kernel[_grid(r, k)](g, xk, s, dx.view(torch.int16) if out_bf16 else dx, t, r, k,
                                 0 if s.numel() == 1 else 1, WANT_TERM=want_term,
                                 OUT_BF16=out_bf16, IS_BF16=is_bf16, BR=BLOCK_R, BK=BLOCK_K,
                                 **LAUNCH_OPTIONS)
    return dx, (t if want_term else None)


# ------------------------------------------------------------------- the op
def _inv_k(k: int) -> float:
    one = torch.tensor(1.0, dtype=torch.float32)
    kf = torch.tensor(float(k), dtype=torch.float32)  # float32 IEEE division, on the host
    return float(one / kf)


def weight_step(w: torch.Tensor) -> torch.Tensor:
    """Per-output-channel step sw[n] = rn(rn(tree_sum|w[n]| * INV_K) * TWO_OVER_SQRT127)."""
    mean = tree_sum(w.to(torch.float32).abs(), -1) * _inv_k(w.shape[1])
    return mean * TWO_OVER_SQRT127


def _check(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> None:
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"need x (M, K) and w (N, K), got {tuple(x.shape)} and {tuple(w.shape)}")
    if s_x.numel() != 1 or s_x.dtype != torch.float32:
        raise ValueError(f"s_x must be a one-element float32 tensor, got {s_x.dtype} "
                         f"with {s_x.numel()} elements")
    if x.shape[0] > MAX_K:
        raise ValueError(f"{x.shape[0]} tokens > {MAX_K}: the dW GEMM contracts over tokens "
                         "and could overflow int32; split the batch")


# The CPU path below gives the bits of the reference steps above (quantize_cpu,
# weight_step, rotate_quantize, int8_mm, ste; tests/kernels/test_linear_int8.py compares
# them) in an order that suits memory: weight-sized intermediates live in kernels.workspace,
# the forward's codes are kept for the backward, and every rotation runs along dim 0
# (hadamard_dim0_cpu_), so no weight-sized transpose is ever copied.
def weight_codes_cpu(w: torch.Tensor):
    """(q_w, sw, outside): quantize_cpu(w, sw) int8 (N, K), sw = weight_step(w) (N,), and
    the bool (N, K) positions where w / sw leaves [-127, 127] (None when there are none).

    Rows are independent, so w goes through in slabs of rows that stay in L2 from the
    float32 widening to the int8 codes.
    """
    n, k = w.shape
    q = torch.empty((n, k), dtype=torch.int8)
    sw = torch.empty((n,), dtype=torch.float32)
    outside = None
    inv_k, rows = _inv_k(k), max(1, SLAB // max(k, 1))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        wf = scratch("linear.w", (r1 - r0, k), torch.float32).copy_(w[r0:r1])
        a = torch.abs(wf, out=scratch("linear.w_abs", (r1 - r0, k), torch.float32))
        s = tree_sum_cpu(a, -1).mul_(inv_k).mul_(TWO_OVER_SQRT127)
        sw[r0:r1] = s
        div = _safe(s)
        # max_k |w[n, k] / s| = rn(max_k |w[n, k]| / s): a correctly rounded division by
        # s > 0 is monotone and sign-symmetric, so one division per row says whether any
        # element is clipped (almost never: the step is ~22 mean|w| / 127 wide).
        clipped = not bool((a.amax(1).div_(div) <= Q_MAX).all())
        v = wf.div_(div.reshape(-1, 1))
        if clipped:
            if outside is None:
                outside = torch.zeros((n, k), dtype=torch.bool)
            torch.logical_not((v >= -Q_MAX) & (v <= Q_MAX), out=outside[r0:r1])
        _codes_(v, clamp=clipped, out=q[r0:r1])
    return q, sw, outside


def _rotate_quantize_dim0_cpu(y: torch.Tensor, name: str, fill=None):
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
    div = _safe(step)
    codes = scratch(name, y.shape, torch.int8)
    rows = max(1, SLAB // c)
    for r0 in range(0, y.shape[0], rows):  # slabs: divide, round and narrow in cache
        _codes_(y[r0:r0 + rows].div_(div), clamp, codes[r0:r0 + rows])
    return codes, step


def _padded_t(name: str, t: torch.Tensor) -> torch.Tensor:
    """float32 scratch (Kp, R) holding t (R, K) transposed, zero rows below K."""
    kp = padded_width(t.shape[1], HADAMARD_BLOCK)
    y = scratch(name, (kp, t.shape[0]), torch.float32)
    y[: t.shape[1]].copy_(t.t())
    y[t.shape[1]:].zero_()
    return y


def _dw_cpu(qa: torch.Tensor, qb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
            outside: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """where(inside_w, rn(rn(float(qa @ qb^T) * sa[n]) * sb[k]), 0) as ``dtype`` (float32,
    or rounded from it by ``copy_``, the conversion ``.to`` and autograd use).

    In slabs of rows: each slab's int32 GEMM, dequantization, mask and rounding run while
    the slab sits in L2, so the weight-sized int32 and float32 intermediates never reach
    memory (1.7x faster than whole-tensor passes for the gate|up weight, 2-core VM).
    """
    n, k = qa.shape[0], qb.shape[0]
    dw = torch.empty((n, k), dtype=dtype)
    rows = max(16, SLAB // max(k, 1))
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        acc = exact_int_mm_cpu(qa[r0:r1], qb, out=scratch("linear.dw_acc", (r1 - r0, k),
                                                           torch.int32))
        direct = dtype == torch.float32
        d = dw[r0:r1] if direct else scratch("linear.dw", (r1 - r0, k), torch.float32)
        dequantize_cpu(acc, sa[r0:r1], sb, torch.float32, out=d)
        if outside is not None:
            d.masked_fill_(outside[r0:r1], 0.0)  # = where(inside_w, dW, +0)
        if not direct:
            dw[r0:r1].copy_(d)
    return dw


def linear_int8_forward_cpu(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor):
    """(y, codes): the forward's y and the codes ``linear_int8_backward_cpu`` reuses."""
    _check(x, w, s_x)
    sx = s_x.reshape(1).to(torch.float32)
    q_w, sw, outside = weight_codes_cpu(w)
    q_x = quantize_cpu(x, sx)
    return int8_mm_cpu(q_x, q_w, sx, sw, torch.bfloat16), (q_x, q_w, sw, outside)


def linear_int8_backward_cpu(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                             s_x: torch.Tensor, codes=None, dw_dtype=torch.float32):
    """``linear_int8_backward`` on the CPU; ``codes`` from ``linear_int8_forward_cpu``
    (recomputed when None), dw returned in ``dw_dtype`` (float32 rounded by ``.to``)."""
    _check(x, w, s_x)
    m, k = x.shape
    n = w.shape[0]
    sx = s_x.reshape(1).to(torch.float32)
    if codes is None:
        codes = (quantize_cpu(x, sx), *weight_codes_cpu(w))
    q_x, q_w, sw, outside = codes
    dy = dy.to(torch.bfloat16)
    # dX_hat = G @ w_hat, contraction over N: rotate w_hat^T's rows = w_hat's columns
    def w_hat(tile, rows, cols):  # rn(q_w * sw[n]), zero rows past N
        lo, hi = rows.start, min(rows.stop, n)
        tile[:hi - lo].copy_(q_w[lo:hi, cols]).mul_(sw[lo:hi, None])
        tile[hi - lo:].zero_()

    wt = scratch("linear.rot_w", (padded_width(n, HADAMARD_BLOCK), k), torch.float32)
    qb, sb = _rotate_quantize_dim0_cpu(wt, "linear.codes_w", w_hat)              # (Np, K)
    qa, sa = _rotate_quantize_dim0_cpu(_padded_t("linear.rot_g", dy), "linear.codes_g")
    dx_hat = dequantize_cpu(exact_int_mm_cpu(qa.t(), qb.t()), sa, sb, torch.float32)
    # dW = G^T @ x_hat = s_x * (G^T @ q_x): contraction over M
    qa2, sa2 = _rotate_quantize_dim0_cpu(_padded_t("linear.rot_g", dy.t()), "linear.codes_g")
    qb2, sb2 = _rotate_quantize_dim0_cpu(_padded_t("linear.rot_x", q_x.t()), "linear.codes_x")
    dw = _dw_cpu(qa2.t().contiguous(), qb2.t(), sa2, sb2 * sx, outside, dw_dtype)
    dx, term = ste_cpu(dx_hat, x, sx, want_term=True, out_bf16=True)
    g = float(torch.tensor(1.0 / math.sqrt(m * k * Q_MAX), dtype=torch.float32))
    ds = tree_sum_cpu(term.reshape(-1), 0) * g
    return dx, dw, ds.reshape(s_x.shape)


def linear_int8_forward(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """y (M, N) bf16 = dequant(q_x @ q_w^T); see the module docstring for every rounding."""
    _check(x, w, s_x)
    if not use_triton(x):
        return linear_int8_forward_cpu(x, w, s_x)[0]
    sx = s_x.reshape(1).to(torch.float32)
    sw = weight_step(w)
    return int8_mm(quantize(x, sx), quantize(w, sw), sx, sw, torch.bfloat16)


def linear_int8_backward(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                         s_x: torch.Tensor, codes=None, dw_dtype=torch.float32):
    """(dx bf16 (M, K), dw (N, K), ds float32 like s_x) for upstream dy (M, N); dw is the
    float32 result, rounded to ``dw_dtype`` when that is narrower. ``codes``: what
    ``linear_int8_forward_cpu`` returned, reused by the CPU path (others recompute)."""
    _check(x, w, s_x)
    m, k = x.shape
    if not use_triton(x) and min(m, k, w.shape[0]):
        return linear_int8_backward_cpu(dy, x, w, s_x, codes, dw_dtype)
    sx = s_x.reshape(1).to(torch.float32)
    sw = weight_step(w)
    q_w = quantize(w, sw)
    q_x = quantize(x, sx)
    dy = dy.to(torch.bfloat16)
    w_hat = q_w.to(torch.float32) * sw.reshape(-1, 1)  # (N, K), one rounding per element
    # dX_hat = G @ w_hat: contraction over N.
    qa, sa = rotate_quantize(dy)                       # (M, Np)
    qb, sb = rotate_quantize(w_hat.t())                # (K, Np)
    dx_hat = int8_mm(qa, qb, sa, sb, torch.float32)  # (M, K)
    # dW = G^T @ x_hat = s_x * (G^T @ q_x): contraction over M.
    qa2, sa2 = rotate_quantize(dy.t())                 # (N, Mp)
    qb2, sb2 = rotate_quantize(q_x.t())                # (K, Mp)
    dw_raw = int8_mm(qa2, qb2, sa2, sb2 * sx, torch.float32)  # (N, K)
    dx, term = ste(dx_hat, x, sx, want_term=True, out_bf16=True)
    dw, _ = ste(dw_raw, w, sw, want_term=False, out_bf16=False)
    g = float(torch.tensor(1.0 / math.sqrt(m * k * Q_MAX), dtype=torch.float32))
    ds = tree_sum(term.reshape(-1), 0) * g
    return dx, dw.to(dw_dtype), ds.reshape(s_x.shape)


class LinearInt8Function(torch.autograd.Function):
    """autograd wrapper: ``LinearInt8Function.apply(x (..., K), w (N, K), s_x)``."""

    @staticmethod
    def forward(ctx, x, w, s_x):
        x2 = x.reshape(-1, x.shape[-1])
        if use_triton(x2):
            y, codes = linear_int8_forward(x2, w, s_x), ()
        else:  # keep the CPU forward's codes: the backward needs the same ones
            y, codes = linear_int8_forward_cpu(x2, w, s_x)
        ctx.save_for_backward(x, w, s_x, *codes)
        return y.reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x, w, s_x, *codes = ctx.saved_tensors
        # dw straight in w's dtype: the rounding autograd would apply, minus a copy
        dx, dw, ds = linear_int8_backward(dy.reshape(-1, w.shape[0]), x.reshape(-1, x.shape[-1]),
                                          w, s_x, tuple(codes) or None, dw_dtype=w.dtype)
        return dx.reshape(x.shape), dw, ds


def linear_int8(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """Differentiable W8A8 linear: x (..., K) bf16, w (N, K) bf16, s_x (1,) float32."""
    return LinearInt8Function.apply(x, w, s_x)


# ---------------------------------------------------------------- GPU check registry
SHAPES = {"gate_up": (16_384, 2_048, 11_264), "down": (16_384, 5_632, 2_048),
          "attn_qo": (16_384, 2_048, 2_048), "attn_kv": (16_384, 2_048, 512)}


def _make(shape):
    def make(scale: float, device):
        g = seeded_generator(404)
        m, k, n = scaled(shape[0], scale, 16), shape[1], shape[2]
        x = torch.randn(m, k, generator=g).to(torch.bfloat16)
        w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
        dy = (torch.randn(m, n, generator=g) * 1e-3).to(torch.bfloat16)
        s_x = torch.tensor([4.0 / 127], dtype=torch.float32)
        return tuple(t.to(device) for t in (x, w, s_x, dy))
    return make


def _run(a):
    x, w, s_x, dy = a
    return (linear_int8_forward(x, w, s_x), *linear_int8_backward(dy, x, w, s_x))


def _baseline(a):
    x, w, _, dy = a
    x = x.detach().requires_grad_(True)
    w = w.detach().requires_grad_(True)
    y = torch.nn.functional.linear(x, w)
    y.backward(dy)
    return y, x.grad, w.grad


GPU_CHECKS = [
    GpuCheck(
        name=f"linear_int8.{label}_fwd_bwd",
        make_inputs=_make(shape),
        run=_run,
        torch_baseline=_baseline,
        cost=lambda a: Cost(flops=6.0 * a[0].shape[0] * a[0].shape[1] * a[1].shape[0]),
        describe=lambda s, sh=shape: f"W8A8 ({scaled(sh[0], s, 16)}x{sh[1]}) -> {sh[2]} fwd+bwd "
                                     "vs F.linear bf16 fwd+bwd",
        parity_scale=0.125, bound="compute",
    )
    for label, shape in SHAPES.items()
]
