"""The W8A8 quantization-aware linear of Open-1B: y = x_hat @ w_hat^T.

Shapes: x (M, K) bf16 (leading dims flattened by the autograd wrapper), w (N, K) bf16,
s_x a one-element float32 tensor (the trainable per-tensor LSQ activation step, > 0).
The quantizers (int8 codes, absmax steps, rotate-then-quantize, straight-through
estimator) are open1b_kernels/int8/quantize.py; Q = 127, so |q*q| <= 2^14 and open1b_kernels.int8.gemm's K
bound holds. Every float step below is one IEEE binary32 operation, round-to-nearest-even,
never fused; ``rne`` and the quantizers are defined in open1b_kernels/int8/quantize.py.

Forward
1. Weight step, re-pinned every call (not trained; no gradient flows into it):
   ``sw[n] = rn( rn(tree_sum_k |w[n,k]| * INV_K) * TWO_OVER_SQRT127 )`` where tree_sum is
   open1b_kernels.core.reduce's pairwise tree, INV_K = fp32(1) / fp32(K) (IEEE division on the host)
   and TWO_OVER_SQRT127 = 0x3E35BB09 = 0.177471295, the correctly rounded float32 of
   2/sqrt(127) (tests check it against a 60-digit computation).
2. Quantize: ``q_x = quantize(x, s_x)`` per tensor, ``q_w = quantize(w, sw)`` per row.
3. ``acc = q_x @ q_w^T`` exact in int32 (open1b_kernels.int8.gemm), then
   ``y = bf16_rne( rn( rn(float(acc) * s_x) * sw[n] ) )`` (int32 -> fp32 conversion rounds
   to nearest even above 2^24, identically on both paths; tested).

Backward (straight-through estimator, LSQ): with G = dL/dy (bf16),
- rotations: open1b_kernels.int8.hadamard (block 256, orthonormal, along each GEMM's contraction dim)
  then per-row absmax int8 codes: ``rotate_quantize``.
- dX_hat (M, K) = G @ w_hat, contraction over N: rotate G's rows (M, N) and w_hat^T's
  rows (K, N), w_hat = rn(q_w * sw[n]) in fp32; quantize each per row; int8 GEMM with
  ``dX_hat = rn(rn(float(acc) * sG[m]) * sW[k])`` in fp32.
- dW (N, K) = G^T @ x_hat, contraction over M: rotate G^T's rows (N, M) and q_x^T's rows
  (K, M) (integer inputs: this rotation is exact); quantize per row; int8 GEMM with
  ``dW = rn(rn(float(acc) * sG[n]) * rn(sQ[k] * s_x))`` in fp32.
- STE clipping range (``ste``): ``dx = bf16_rne(where(inside, dX_hat, 0))``,
  ``dw = where(inside_w, dW, 0)`` (float32; the autograd wrapper's dw is cast to w's dtype
  by autograd - call ``linear_int8_backward`` for the float32 gradient).
- LSQ step gradient: ``ds = rn(tree_sum(rn(dX_hat * t)) * g)`` over all M*K elements in
  row-major order, t the STE's term, g = fp32(1 / sqrt(M*K*127)) computed in double on
  the host.

CPU path (``linear_int8_forward_cpu`` / ``linear_int8_backward_cpu``, what ``force("cpu")``
and the autograd wrapper run): the same bits as the steps above, computed in an order that
suits memory - the forward's int8 codes are kept for the backward, rotations run along
dim 0 in L2-sized tiles (``quantize.rotate_quantize_dim0_cpu``) or, for dX's gradient, row
by row (``rotrows.rotate_quantize_rows_cpu``), weight-sized passes in row slabs,
intermediates in ``open1b_kernels.core.workspace``. tests/kernels/test_linear_int8_cpu.py
checks it against the steps written out literally.

Subnormals kept (IEEE). NaN/inf policy: inputs and steps must be finite (the trainer's
gradient-norm check stops non-finite steps); non-finite values give unspecified int8
codes, which is outside the parity contract. Tokens: M <= MAX_TOKENS = 130,816 on every
path (dW contracts over M padded to a multiple of 256, within int8_gemm.MAX_K).
"""
from __future__ import annotations

import math

import torch

from open1b_kernels.core.backend import use_triton
from open1b_kernels.int8 import amxmm
from open1b_kernels.int8.checksum import SlabCheck
from open1b_kernels.int8.gemm import MAX_K, exact_dequant_cpu, int8_mm, int8_mm_cpu
from open1b_kernels.int8.route import CHECKED, int_gemm_route, record_failure
from open1b_kernels.int8 import stegemm, weightmemo
from open1b_kernels.int8.rotrows import rotate_quantize_rows_cpu
from open1b_kernels.int8.weightcodes import weight_codes_triton
# The quantizers live in open1b_kernels/int8/quantize.py; re-exported so that callers keep importing
# them from the op that uses them.
from open1b_kernels.int8.quantize import (BLOCK_K, BLOCK_R, FLT_MIN, HADAMARD_BLOCK, INV_127,  # noqa: F401
                              Q_MAX, RND, ROT_ROWS, SLAB, codes_, quantize, quantize_cpu,
                              rotate_quantize, rotate_quantize_cols_cpu,
                              rotate_quantize_dim0_cpu, row_absmax_step,
                              row_absmax_step_cpu, safe_step)
from open1b_kernels.int8.ste import ste, ste_cpu, ste_term_sum_cpu  # noqa: F401
from open1b_kernels.core.reduce import tree_sum, tree_sum_cpu
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import scratch

TWO_OVER_SQRT127 = 0.17747129499912262  # float32 bits 0x3E35BB09
# The dW GEMM contracts over the tokens after the Hadamard rotation has zero-padded them to
# a multiple of HADAMARD_BLOCK, and every rotated entry may be nonzero: the padded count
# must stay within the int8 GEMM's exact range. One limit, checked once in ``_check`` for
# both paths (the CPU path would otherwise accept what the Triton path refuses).
MAX_TOKENS = MAX_K // HADAMARD_BLOCK * HADAMARD_BLOCK  # 130,816
# Elements per row slab of the weight gradient's GEMM (32 MB of int32). Not an L2-sized
# SLAB: the integer GEMM's rate falls with the slab's rows (Zen 4, 2 cores: dW of the down
# projection, 2,048 x 4,096 x 5,632, ran at 430 GOP/s in slabs of 93 rows, 815 whole),
# which costs more than the dequantization gains from a slab in cache (the down
# projection's backward 0.56 -> 0.43 s, gate|up's 0.81 -> 0.73 s, A/B medians).
DW_SLAB = 1 << 23


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
    if x.shape[0] > MAX_TOKENS:
        raise ValueError(f"{x.shape[0]} tokens > MAX_TOKENS = {MAX_TOKENS}: the weight "
                         "gradient contracts over the tokens (padded to a multiple of "
                         f"{HADAMARD_BLOCK}) and its int32 sums could overflow; split the "
                         "batch into calls of at most MAX_TOKENS tokens")


# The CPU path below gives the bits of the reference steps above (quantize_cpu,
# weight_step, rotate_quantize, int8_mm, ste; tests/kernels/test_linear_int8.py compares
# them) in an order that suits memory: weight-sized intermediates live in open1b_kernels.core.workspace,
# the forward's codes are kept for the backward, and every rotation runs along dim 0
# (rotate_quantize_dim0_cpu), so no weight-sized transpose is ever copied.
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
        div = safe_step(s)
        # max_k |w[n, k] / s| = rn(max_k |w[n, k]| / s): a correctly rounded division by
        # s > 0 is monotone and sign-symmetric, so one division per row says whether any
        # element is clipped (almost never: the step is ~22 mean|w| / 127 wide).
        clipped = not bool((a.amax(1).div_(div) <= Q_MAX).all())
        v = wf.div_(div.reshape(-1, 1))
        if clipped:
            if outside is None:
                outside = torch.zeros((n, k), dtype=torch.bool)
            torch.logical_not((v >= -Q_MAX) & (v <= Q_MAX), out=outside[r0:r1])
        codes_(v, clamp=clipped, out=q[r0:r1])
    return q, sw, outside


def _dw_cpu(qa: torch.Tensor, qb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
            outside: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """where(inside_w, rn(rn(float(qa @ qb^T) * sa[n]) * sb[k]), 0) as ``dtype`` (float32,
    or rounded from it by ``copy_``, the conversion ``.to`` and autograd use).

    In slabs of ``DW_SLAB`` elements: each slab's int32 GEMM, then its dequantization, mask
    and rounding, so no weight-sized int32 intermediate is held.
    """
    n, k = qa.shape[0], qb.shape[0]
    dw = torch.empty((n, k), dtype=dtype)
    rows = max(16, DW_SLAB // max(k, 1))
    # the integer route checks each slab's rows and all slabs' columns at the end: one
    # O(N K) column pass instead of one per slab (which cost more than the GEMMs)
    check = SlabCheck(qb, n) if int_gemm_route() in CHECKED else None
    # on the tiles, qb is packed into their order once for every slab
    tiles = amxmm.pack(qb, True, "linear.dw_tiles") if int_gemm_route() == "amx" else None
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        direct = dtype == torch.float32
        d = dw[r0:r1] if direct else scratch("linear.dw", (r1 - r0, k), torch.float32)
        exact_dequant_cpu(qa[r0:r1], qb, sa[r0:r1], sb, torch.float32, out=d, slabs=check,
                          b_tiles=tiles)
        if outside is not None:
            d.masked_fill_(outside[r0:r1], 0.0)  # = where(inside_w, dW, +0)
        if not direct:
            dw[r0:r1].copy_(d)
    if check is not None and not check.columns_ok():
        record_failure(f"column checksum failed over the slabs of a {qb.shape[0]}x"
                       f"{qb.shape[1]} weight gradient")              # now on the float route
        return _dw_cpu(qa, qb, sa, sb, outside, dtype)
    return dw


def linear_int8_forward_cpu(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor):
    """(y, codes): the forward's y and the codes ``linear_int8_backward_cpu`` reuses."""
    _check(x, w, s_x)
    sx = s_x.reshape(1).to(torch.float32)
    q_w, sw, outside = weightmemo.get(w, "codes", lambda: weight_codes_cpu(w))
    q_x = quantize_cpu(x, sx)
    return int8_mm_cpu(q_x, q_w, sx, sw, torch.bfloat16), (q_x, q_w, sw, outside)


def linear_int8_backward_cpu(dy: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                             s_x: torch.Tensor, codes=None, dw_dtype=torch.float32):
    """``linear_int8_backward`` on the CPU; ``codes`` from ``linear_int8_forward_cpu``
    (recomputed when None), dw returned in ``dw_dtype`` (float32 rounded by ``.to``)."""
    _check(x, w, s_x)
    m, k = x.shape
    sx = s_x.reshape(1).to(torch.float32)
    if codes is None:
        codes = (quantize_cpu(x, sx),
                 *weightmemo.get(w, "codes", lambda: weight_codes_cpu(w)))
    q_x, q_w, sw, outside = codes
    dy = dy.to(torch.bfloat16).contiguous()
    # dX_hat = G @ w_hat, contraction over N: rotate w_hat^T's rows = w_hat's columns,
    # w_hat = rn(q_w * sw[n]); and G's rows, each in one pass through cache, their codes
    # row-major - the layout every route's GEMM takes as it is. w_hat's codes are the
    # weight's alone: made once per step inside weightmemo.held() (kept as a copy: the
    # rotation writes a reused buffer)
    qb, sb = weightmemo.get(
        w, "dx_codes", lambda: rotate_quantize_cols_cpu(q_w, "linear.codes_w", row_scale=sw),
        keep=lambda v: (v[0].clone(), v[1].clone()))                                # (Np, K)
    qa, sa = rotate_quantize_rows_cpu(dy, "linear.codes_g")                       # (M, Np)
    dx_hat = exact_dequant_cpu(qa, qb.t(), sa, sb, torch.float32)
    # dW = G^T @ x_hat = s_x * (G^T @ q_x): contraction over M; G^T's codes in (N, Mp)
    qa2, sa2 = rotate_quantize_cols_cpu(dy, "linear.codes_g", transposed=True)
    qb2, sb2 = rotate_quantize_cols_cpu(q_x, "linear.codes_x")                    # (Mp, K)
    dw = _dw_cpu(qa2, qb2.t(), sa2, sb2 * sx, outside, dw_dtype)
    # dx and the tree sum of the LSQ term (ste_cpu's term, summed as tree_sum_cpu sums it
    # flattened) in one pass: the term's M x K floats are never written
    dx, term_sum = ste_term_sum_cpu(dx_hat, x, sx)
    g = float(torch.tensor(1.0 / math.sqrt(m * k * Q_MAX), dtype=torch.float32))
    ds = term_sum * g
    return dx, dw, ds.reshape(s_x.shape)


def linear_int8_forward(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """y (M, N) bf16 = dequant(q_x @ q_w^T); see the module docstring for every rounding."""
    _check(x, w, s_x)
    if not use_triton(x):
        return linear_int8_forward_cpu(x, w, s_x)[0]
    sx = s_x.reshape(1).to(torch.float32)
    sw, q_w, _ = _weight_codes(w)
    return int8_mm(quantize(x, sx), q_w, sx, sw, torch.bfloat16)


def _weight_codes(w: torch.Tensor, want_hat: bool = False):
    """(sw, q_w, w_hat or None) on the Triton path: one fused pass for a bf16 weight
    (open1b_kernels/int8/weightcodes.py), else the op-by-op definition."""
    if w.dtype == torch.bfloat16 and w.shape[1]:
        return weight_codes_triton(w, _inv_k(w.shape[1]), TWO_OVER_SQRT127, want_hat)
    sw = weight_step(w)
    q_w = quantize(w, sw)
    return sw, q_w, (q_w.to(torch.float32) * sw.reshape(-1, 1) if want_hat else None)


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
    sw, _, w_hat = _weight_codes(w, want_hat=True)   # w_hat (N, K): one rounding each
    q_x = quantize(x, sx)
    dy = dy.to(torch.bfloat16)
    # dX_hat = G @ w_hat: contraction over N.
    qa, sa = rotate_quantize(dy)                       # (M, Np)
    qb, sb = rotate_quantize(w_hat.t())                # (K, Np)
    # dW = G^T @ x_hat = s_x * (G^T @ q_x): contraction over M.
    qa2, sa2 = rotate_quantize(dy.t())                 # (N, Mp)
    qb2, sb2 = rotate_quantize(q_x.t())                # (K, Mp)
    dw_raw = int8_mm(qa2, qb2, sa2, sb2 * sx, torch.float32)  # (N, K)
    if x.dtype == torch.bfloat16 and stegemm.fits(m, k):
        # dX_hat, its STE and the LSQ term's row-segment trees in the GEMM's epilogue
        # (open1b_kernels/int8/stegemm.py): neither dX_hat nor term reaches memory
        dx, term_sum = stegemm.ste_gemm(qa, qb, sa, sb, x, sx)
    else:
        dx_hat = int8_mm(qa, qb, sa, sb, torch.float32)  # (M, K)
        dx, term = ste(dx_hat, x, sx, want_term=True, out_bf16=True)
        term_sum = tree_sum(term.reshape(-1), 0)
    dw, _ = ste(dw_raw, w, sw, want_term=False, out_bf16=False)
    g = float(torch.tensor(1.0 / math.sqrt(m * k * Q_MAX), dtype=torch.float32))
    ds = term_sum * g
    return dx, dw.to(dw_dtype), ds.reshape(s_x.shape)


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
