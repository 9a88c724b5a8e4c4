"""Fused cross-entropy + z-loss over the 128,256-token vocabulary, in one chunked pass.

    loss = mean_m [ (lse_m - x[m, t_m]) + Z * lse_m^2 ],   lse_m = log sum_j exp(x[m, j])

Inputs: logits x (M, V) float32 (bf16 is widened exactly), targets t (M,) int64 in [0, V).
Every token counts (Open-1B windows carry no padding, so there is no ignore index).
Returns (loss scalar float32, lse (M,) float32).

Arithmetic (identical on both paths; every step one IEEE binary32 operation,
round-to-nearest-even, never fused; exp/log are open1b_kernels.core.mathfn's portable functions):
- Forward, per row, over chunks of CHUNK = 4,096 columns in ascending order (the last
  chunk padded with -inf, whose exp is +0):
  ``c = max(chunk)`` (exact), ``m' = max(m, c)``, ``s = rn(rn(s * exp(m - m')) +
  tree_sum(exp(chunk - m')))`` with tree_sum the pairwise tree of open1b_kernels.core.reduce over the
  CHUNK columns; start m = -inf, s = 0 (the first rescale is exp(-inf) = 0).
  ``lse = rn(m + log(s))``; ``row = rn(rn(lse - x[t]) + rn(Z * rn(lse * lse)))``;
  ``loss = rn(tree_sum_m(row) * INV_M)``, INV_M = fp32(1) / fp32(M) (IEEE, on the host).
  Z = fp32(1e-4) = 9.99999975e-05.
- Backward (dloss a float32 scalar): ``g = rn(dloss * INV_M)``,
  ``coef = rn(1 + rn(TWO_Z * lse))`` (TWO_Z = 2 * Z exactly: d(Z lse^2)/dx = 2 Z lse p),
  ``p = exp(rn(x - lse))``, ``d = rn(p * coef)``, ``d = rn(d - 1)`` at the target column,
  ``dlogits = rn(d * g)``, float32.

Design choice (logits "never materialized twice"): the LM head materializes fp32 logits
once in the forward; this op reads them once per pass and keeps only lse (M floats); the
backward recomputes p from the saved logits and lse and writes dlogits once, which the
LM-head backward (open1b_kernels.ops.lmhead) then consumes. Callers bound memory by running the
LM head + loss over token chunks.

Subnormals kept (IEEE). NaN/inf: a NaN logit makes its row's lse NaN (mathfn returns the
canonical NaN), and so the loss; +inf logits are outside the contract. Targets are not
range-checked on the GPU path (an out-of-range target reads out of bounds); the CPU path
raises.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, interpreting, use_triton
from open1b_kernels.core.mathc import Loops, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.int8.gemm import bf16_operand
from open1b_kernels.core.mathfn import exp, log
from open1b_kernels.core.reduce import tree_sum, tree_sum_cpu
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.int8.gemm import load_f32
    from open1b_kernels.core.mathfn import exp_tl, log_tl
    from open1b_kernels.core.reduce import tree_sum_rows

CHUNK = 4_096  # vocabulary columns per online-softmax step (part of the contract)
Z_LOSS = 9.999999747378752e-05  # fp32(1e-4)
TWO_Z = 0.00019999999494757503  # 2 * fp32(1e-4), exact
ROWS_GPU, ROWS_INTERPRET = 1, 8  # rows per forward program
BWD_BLOCK = 1_024  # columns per backward program
LOOPS = Loops("open1b_kernels.ops._opsc")    # the CPU references compiled: _xent.c

if HAVE_TRITON:
    Z_LOSS_K = tl.constexpr(Z_LOSS)
    TWO_Z_K = tl.constexpr(TWO_Z)


def _inv(n: int) -> float:
    """fp32(1) / fp32(n): the IEEE float32 quotient, computed on the host."""
    f32 = torch.float32
    return float(torch.tensor(1.0, dtype=f32) / torch.tensor(float(n), dtype=f32))


def _check(x: torch.Tensor, t: torch.Tensor) -> None:
    if x.dim() != 2 or t.dim() != 1 or t.shape[0] != x.shape[0] or x.shape[0] == 0:
        raise ValueError(f"need logits (M, V) and targets (M,), M > 0; got {tuple(x.shape)} "
                         f"and {tuple(t.shape)}")
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"logits must be float32 or bfloat16, got {x.dtype}")


# ------------------------------------------------------------------- CPU references
def row_lse_cpu(x: torch.Tensor) -> torch.Tensor:
    """Online logsumexp per row over CHUNK-column chunks in ascending order."""
    fast = _lse_compiled(x, CHUNK)                     # the same operations, compiled
    if fast is not None:
        return fast
    m_rows, v = x.shape
    m = torch.full((m_rows,), float("-inf"))
    s = torch.zeros((m_rows,))
    for c0 in range(0, v, CHUNK):
        c = x[:, c0:c0 + CHUNK].to(torch.float32)
        if c.shape[1] < CHUNK:  # pad the last chunk with -inf (exp -> +0)
            c = torch.cat([c, c.new_full((m_rows, CHUNK - c.shape[1]), float("-inf"))], 1)
        mn = torch.maximum(m, c.amax(dim=1))
        cs = tree_sum_cpu(exp(c - mn[:, None]), -1)
        s = s * exp(m - mn) + cs
        m = mn
    return m + log(s)


def xent_forward_cpu(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU reference of ``xent_forward``."""
    _check(x, t)
    if t.min() < 0 or t.max() >= x.shape[1]:
        raise ValueError(f"targets must lie in [0, {x.shape[1]}), got [{int(t.min())}, "
                         f"{int(t.max())}]")
    lse = row_lse_cpu(x)
    xt = x.gather(1, t[:, None])[:, 0].to(torch.float32)
    row = (lse - xt) + Z_LOSS * (lse * lse)
    return tree_sum_cpu(row, 0) * _inv(x.shape[0]), lse


def _overwritable(x: torch.Tensor) -> bool:
    """Whether dlogits can be written over the logits ``x`` themselves: float32, contiguous."""
    return x.dtype == torch.float32 and x.is_contiguous()


def xent_backward_cpu(dloss: torch.Tensor, x: torch.Tensor, t: torch.Tensor,
                      lse: torch.Tensor, rows: int | None = None,
                      overwrite: bool = False) -> torch.Tensor:
    """CPU reference of ``xent_backward``."""
    g = dloss.reshape(()).to(torch.float32) * _inv(rows or x.shape[0])
    out = x if overwrite and _overwritable(x) else None
    fast = _grad_compiled(x, t, lse, float(g), out)    # the same operations, compiled
    if fast is not None:
        return fast
    coef = 1.0 + TWO_Z * lse
    d = exp(x.to(torch.float32) - lse[:, None]) * coef[:, None]
    hit = torch.arange(x.shape[1])[None, :] == t[:, None]
    d = torch.where(hit, d - 1.0, d)
    return d * g if out is None else torch.mul(d, g, out=out)


def _lse_compiled(x: torch.Tensor, chunk: int) -> torch.Tensor | None:
    """``row_lse_cpu`` for contiguous float32 CPU logits by the compiled rows (the same
    operations in the same order), or None when the loop is unavailable or the layout does
    not fit."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 2 or not x.is_contiguous() or x.shape[1] == 0):
        return None
    r, v = x.shape
    lse = torch.empty(r, dtype=torch.float32)
    args = (flat(x), flat(lse), r, v, chunk)
    parallel(lambda lo, hi, p: LOOPS.xent_lse(*args, lo, hi, p), r, grain=1)
    return lse


def _grad_compiled(x: torch.Tensor, t: torch.Tensor, lse: torch.Tensor, g: float,
                   out: torch.Tensor | None = None):
    """``xent_backward_cpu``'s dlogits for float32 logits by the compiled loop (the same
    float32 operations in the same order: the same bits) into ``out`` (new when None; ``x``
    itself may be given: the loop reads each row's target logit before writing the row), or
    None when the loop is unavailable or the inputs are not contiguous CPU float32/int64."""
    if (not LOOPS.available() or x.device.type != "cpu"
            or x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous()):
        return None
    r, v = x.shape
    t64 = t.to(torch.int64).contiguous()
    lse32 = lse.to(torch.float32).contiguous()
    out = torch.empty_like(x) if out is None else out
    args = (x.reshape(-1).numpy(), t64.numpy(), lse32.numpy(), g, out.reshape(-1).numpy(), r, v)
    parallel(lambda lo, hi, p: LOOPS.xent_grad(*args, lo, hi, p), r, grain=1)
    return out


# ------------------------------------------------------------------- Triton kernels
if HAVE_TRITON:

    @triton.jit
    def _xent_fwd_kernel(x_ptr, t_ptr, lse_ptr, row_ptr, M, V, stride_m, IS_BF16: tl.constexpr,
                         ROWS: tl.constexpr, CHUNK_C: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        live = rows < M
        base = x_ptr + rows[:, None].to(tl.int64) * stride_m
        m = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
        s = tl.zeros((ROWS,), dtype=tl.float32)
        for c0 in range(0, V, CHUNK_C):
            cols = c0 + tl.arange(0, CHUNK_C)
            valid = live[:, None] & (cols[None, :] < V)
            x = load_f32(base + cols[None, :], valid, float("-inf"), IS_BF16)
            x = tl.where(valid, x, float("-inf"))
            mn = tl.maximum(m, tl.max(x, axis=1))
            mn = tl.where(live, mn, 0.0)  # dead rows: keep the arithmetic finite
            cs = tree_sum_rows(exp_tl(x - mn[:, None]), ROWS, CHUNK_C)
            s = s * exp_tl(m - mn) + cs
            m = mn
        lse = m + log_tl(tl.where(live, s, 1.0))  # dead rows: no log(0)
        t = tl.load(t_ptr + rows, mask=live, other=0)
        xt = load_f32(x_ptr + rows.to(tl.int64) * stride_m + t, live, 0.0, IS_BF16)
        row = (lse - xt) + Z_LOSS_K * (lse * lse)
        tl.store(lse_ptr + rows, lse, mask=live)
        tl.store(row_ptr + rows, row, mask=live)

    @triton.jit
    def _xent_bwd_kernel(x_ptr, t_ptr, lse_ptr, g_ptr, d_ptr, M, V, stride_m,
                         IS_BF16: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < V
        x = load_f32(x_ptr + row.to(tl.int64) * stride_m + cols, mask, 0.0, IS_BF16)
        lse = tl.load(lse_ptr + row)
        t = tl.load(t_ptr + row)
        g = tl.load(g_ptr)
        coef = 1.0 + TWO_Z_K * lse
        d = exp_tl(x - lse) * coef
        d = tl.where(cols == t, d - 1.0, d)
        tl.store(d_ptr + row.to(tl.int64) * V + cols, d * g, mask=mask)


def xent_forward(x: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, lse per row) of logits (M, V) and targets (M,); see the module doc."""
    if not use_triton(x):
        return xent_forward_cpu(x, t)
    _check(x, t)
    m, v = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    t = t.contiguous()
    lse = torch.empty((m,), dtype=torch.float32, device=x.device)
    row = torch.empty((m,), dtype=torch.float32, device=x.device)
    rows = ROWS_INTERPRET if interpreting() else ROWS_GPU
    xk, is_bf16 = bf16_operand(x)
    _xent_fwd_kernel[(triton.cdiv(m, rows),)](xk, t, lse, row, m, v, x.stride(0),
                                              IS_BF16=is_bf16, ROWS=rows, CHUNK_C=CHUNK,
                                              **LAUNCH_OPTIONS)
    return tree_sum(row, 0) * _inv(m), lse


def xent_backward(dloss: torch.Tensor, x: torch.Tensor, t: torch.Tensor,
                  lse: torch.Tensor, rows: int | None = None,
                  overwrite: bool = False) -> torch.Tensor:
    """dlogits (M, V) float32 for the scalar upstream gradient ``dloss``. ``rows`` (default
    M): the rows the loss is the mean over, when ``x`` is a block of them - every row's
    dlogits depends on its own logits, lse and target and on INV_rows alone, so blocks of
    rows give the bits of the whole. ``overwrite``: the caller is done with the logits, so
    float32 contiguous ``x`` receives dlogits and is returned (no second (M, V) buffer: 2 GB
    at Open-1B's 4,096 tokens, and on the CPU its fresh pages' faults); other ``x`` are left
    alone. The same bits either way."""
    if not use_triton(x):
        return xent_backward_cpu(dloss, x, t, lse, rows, overwrite)
    _check(x, t)
    m, v = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    t = t.contiguous()
    g = (dloss.reshape(1).to(torch.float32) * _inv(rows or m)).contiguous()
    # in place, each program writes the block it read (the target's column among them)
    d = x if overwrite and _overwritable(x) else torch.empty((m, v), dtype=torch.float32,
                                                              device=x.device)
    xk, is_bf16 = bf16_operand(x)
    _xent_bwd_kernel[(m, triton.cdiv(v, BWD_BLOCK))](xk, t, lse, g, d, m, v, x.stride(0),
                                                     IS_BF16=is_bf16, BLOCK=BWD_BLOCK,
                                                     **LAUNCH_OPTIONS)
    return d


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(606)
    m = scaled(16_384, scale, 8)
    x = torch.randn(m, 128_256, generator=g) * 2.0
    t = torch.randint(0, 128_256, (m,), generator=g)
    return x.to(device), t.to(device)


def _run(a):
    x, t = a
    loss, lse = xent_forward(x, t)
    return loss, lse, xent_backward(torch.ones((), device=x.device), x, t, lse)


def _baseline(a, dtype=torch.float32):
    x = a[0].to(dtype).detach().requires_grad_(True)
    lse = torch.logsumexp(x.float(), dim=-1)
    loss = torch.nn.functional.cross_entropy(x, a[1]) + Z_LOSS * (lse * lse).mean()
    loss.backward()
    return loss, x.grad


GPU_CHECKS = [
    GpuCheck(
        name=f"xent.fwd_bwd_{label}",
        make_inputs=_make,
        run=_run,
        torch_baseline=lambda a, d=dtype: _baseline(a, d),
        cost=lambda a: Cost(flops=a[0].numel() * 40.0, bytes=a[0].numel() * 4.0 * 3),
        describe=lambda s: f"fp32 logits ({scaled(16_384, s, 8)}, 128256) loss+z-loss, fwd+bwd "
                           "vs F.cross_entropy",
        parity_scale=0.0625, bench_scale=0.5,
    )
    for label, dtype in (("vs_fp32", torch.float32), ("vs_bf16", torch.bfloat16))
]
