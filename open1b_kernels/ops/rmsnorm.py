"""RMSNorm over the last dimension (with gain), and the gain-free per-head QK-norm.

Arithmetic (float32 throughout, IEEE round-to-nearest-even, no fused multiply-add):
    x    = float32(input)                               (bf16 -> fp32 is exact)
    ss   = pairwise-tree sum of x*x over D               (open1b_kernels/core/reduce.py order)
    rstd = 1 / sqrt_rn(ss * RD + eps)                    RD = float32(1/D), eps = float32(eps)
    xhat = x * rstd
    y    = xhat * float32(gain)       (or xhat without gain), rounded once to the input dtype
Backward, given dy (same shape as x) and the saved rstd:
    dxhat = dy * gain                                    (or dy)
    dot   = pairwise-tree sum of dxhat * xhat over D
    dx    = (dxhat - xhat * (dot * RD)) * rstd            rounded once to x's dtype
    dgain = pairwise-tree sum over all rows of dy * xhat  (float32; the kernel sums aligned
            power-of-two row blocks, then the tree over the block partials: same order)
Subnormals are IEEE on both paths. NaN/inf propagate as the IEEE ops above dictate
(an inf in a row makes ss = inf, rstd = 0, and inf * 0 = NaN in that row's xhat); NaN
payloads are not part of the contract.

Public API: ``rmsnorm(x, gain, eps)`` and ``qk_norm(x, eps)`` (autograd), the functional
``rmsnorm_fwd`` / ``rmsnorm_bwd`` (used by audit replay), and ``GPU_CHECKS``.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.mathfn import sqrt_rn
from open1b_kernels.core.reduce import f32, next_pow2, reciprocal_f32, tree_sum_cpu
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import scratch

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import cast_tl, widen_tl
    from open1b_kernels.core.reduce import tree_sum_cols, tree_sum_cols_triton, tree_sum_rows

EPS = 1e-6
MAX_D = 16_384  # one row lives in registers; Open-1B uses D = 2048 and head dim 128
TILE = 4096  # elements per program: ROWS = TILE // BLOCK_D rows at a time
LOOPS = Loops("open1b_kernels.ops._opsc")    # the CPU reference compiled: _rmsnorm.c


def _check(x: torch.Tensor, gain: torch.Tensor | None) -> int:
    d = x.shape[-1]
    if not 0 < d <= MAX_D:
        raise ValueError(f"rmsnorm: last dimension must be in (0, {MAX_D}], got {d}")
    if gain is not None and tuple(gain.shape) != (d,):
        raise ValueError(f"rmsnorm: gain must have shape ({d},), got {tuple(gain.shape)}")
    return d


# ------------------------------------------------------------------ CPU reference
def rmsnorm_fwd_cpu(x, gain, eps):
    d = _check(x, gain)
    fast = _rms_fwd_compiled(x, gain, reciprocal_f32(d), f32(eps))   # the same ops, compiled
    if fast is not None:
        return fast
    xf = x.to(torch.float32)
    ss = tree_sum_cpu(xf * xf, -1)
    rstd = torch.ones_like(ss) / sqrt_rn(ss * reciprocal_f32(d) + f32(eps))
    y = xf * rstd[..., None]
    if gain is not None:
        y = y * gain.to(torch.float32)
    return y.to(x.dtype), rstd


def rmsnorm_bwd_cpu(dy, x, gain, rstd):
    d = _check(x, gain)
    prod = scratch("rmsnorm.prod", tuple(x.shape), torch.float32) if gain is not None else None
    dx = _rms_bwd_compiled(dy, x, gain, rstd, reciprocal_f32(d), prod)    # the same ops, compiled
    if dx is not None:
        return dx, (tree_sum_cpu(prod.reshape(-1, d), 0) if gain is not None else None)
    xhat = x.to(torch.float32) * rstd[..., None]
    dyf = dy.to(torch.float32)
    dxhat = dyf * gain.to(torch.float32) if gain is not None else dyf
    dot = tree_sum_cpu(dxhat * xhat, -1)
    dx = (dxhat - xhat * (dot * reciprocal_f32(d))[..., None]) * rstd[..., None]
    dgain = None
    if gain is not None:
        dgain = tree_sum_cpu((dyf * xhat).reshape(-1, d), 0)
    return dx.to(x.dtype), dgain


def _rms_ok(x: torch.Tensor, gain: torch.Tensor | None) -> bool:
    return (LOOPS.available() and x.device.type == "cpu" and x.dtype == torch.bfloat16
            and (gain is None or gain.dtype in (torch.bfloat16, torch.float32)))


def _gain32(gain: torch.Tensor | None):
    if gain is None:
        return none()
    return gain.to(torch.float32).contiguous().numpy()


def _rms_fwd_compiled(x: torch.Tensor, gain: torch.Tensor | None, rd: float, eps: float):
    """``rmsnorm_fwd_cpu`` for bf16 x by the compiled loop (the same float32 operations in the
    same order, the pairwise tree for the row sums): (y, rstd), or None when the loop is
    unavailable or x is not bf16."""
    if not _rms_ok(x, gain):
        return None
    d = x.shape[-1]
    xc = x.contiguous()
    r = xc.numel() // d
    y = torch.empty_like(xc)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32)
    args = (flat(xc.view(torch.int16)), _gain32(gain), rd, eps, flat(y.view(torch.int16)),
            flat(rstd), r, d)
    parallel(lambda lo, hi, p: LOOPS.rms_fwd(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // d))
    return y, rstd


def _rms_bwd_compiled(dy: torch.Tensor, x: torch.Tensor, gain: torch.Tensor | None,
                      rstd: torch.Tensor, rd: float, prod: torch.Tensor | None):
    """``rmsnorm_bwd_cpu``'s dx (bf16) for bf16 x by the compiled loop, writing the gain
    gradient's terms dy * xhat into ``prod`` (float32, x's shape) when given; None when the
    loop is unavailable or a dtype does not fit."""
    if not _rms_ok(x, gain) or dy.dtype not in (torch.bfloat16, torch.float32):
        return None
    d = x.shape[-1]
    xc, dyc = x.contiguous(), dy.contiguous()
    r = xc.numel() // d
    dx = torch.empty_like(xc)
    bf = dyc.dtype == torch.bfloat16
    pr = flat(prod) if prod is not None else none()
    args = (flat(dyc.view(torch.int16) if bf else dyc), bf, flat(xc.view(torch.int16)),
            _gain32(gain), flat(rstd.to(torch.float32).contiguous()), rd,
            flat(dx.view(torch.int16)), pr, r, d)
    parallel(lambda lo, hi, p: LOOPS.rms_bwd(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // d))
    return dx


# ------------------------------------------------------------------ Triton
if HAVE_TRITON:

    @triton.jit
    def _fwd_kernel(x_ptr, g_ptr, y_ptr, rstd_ptr, M, D, rd, eps,
                    HAS_GAIN: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        rmask = rows < M
        mask = rmask[:, None] & (cols[None, :] < D)
        offs = rows[:, None].to(tl.int64) * D + cols[None, :]
        x = widen_tl(tl.load(x_ptr + offs, mask=mask, other=0.0))
        ss = tree_sum_rows(x * x, ROWS, BLOCK_D)
        rstd = tl.div_rn(tl.full((ROWS,), 1.0, tl.float32), tl.sqrt_rn(ss * rd + eps))
        y = x * rstd[:, None]
        if HAS_GAIN:
            g = widen_tl(tl.load(g_ptr + cols, mask=cols < D, other=0.0))
            y = y * g[None, :]
        tl.store(y_ptr + offs, cast_tl(y, y_ptr.dtype.element_ty), mask=mask)
        tl.store(rstd_ptr + rows, rstd, mask=rmask)

    @triton.jit
    def _bwd_kernel(dy_ptr, x_ptr, g_ptr, rstd_ptr, dx_ptr, part_ptr, M, D, rd,
                    HAS_GAIN: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK_D)
        rmask = rows < M
        mask = rmask[:, None] & (cols[None, :] < D)
        offs = rows[:, None].to(tl.int64) * D + cols[None, :]
        x = widen_tl(tl.load(x_ptr + offs, mask=mask, other=0.0))
        dy = widen_tl(tl.load(dy_ptr + offs, mask=mask, other=0.0))
        rstd = tl.load(rstd_ptr + rows, mask=rmask, other=0.0)
        xhat = x * rstd[:, None]
        if HAS_GAIN:
            g = widen_tl(tl.load(g_ptr + cols, mask=cols < D, other=0.0))
            dxhat = dy * g[None, :]
            # dgain: this program's ROWS rows summed down the columns (the first levels of
            # the tree over all rows; ROWS is a power of two and programs are aligned).
            part = tree_sum_cols(dy * xhat, ROWS, BLOCK_D)
            tl.store(part_ptr + tl.program_id(0).to(tl.int64) * D + cols, part, mask=cols < D)
        else:
            dxhat = dy
        dot = tree_sum_rows(dxhat * xhat, ROWS, BLOCK_D)
        dx = (dxhat - xhat * (dot * rd)[:, None]) * rstd[:, None]
        tl.store(dx_ptr + offs, cast_tl(dx, dx_ptr.dtype.element_ty), mask=mask)


def _layout(d: int) -> tuple[int, int]:
    block_d = next_pow2(d)
    return block_d, max(1, TILE // block_d)


def rmsnorm_fwd(x: torch.Tensor, gain: torch.Tensor | None, eps: float = EPS):
    """(y, rstd): y in x's dtype, rstd float32 of shape x.shape[:-1]."""
    if not use_triton(x):
        return rmsnorm_fwd_cpu(x, gain, eps)
    d = _check(x, gain)
    xc = x.contiguous()
    m = xc.numel() // d
    y = torch.empty_like(xc)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    block_d, rows = _layout(d)
    g = gain.contiguous() if gain is not None else xc
    _fwd_kernel[(triton.cdiv(m, rows),)](
        xc, g, y, rstd, m, d, reciprocal_f32(d), f32(eps),
        HAS_GAIN=gain is not None, ROWS=rows, BLOCK_D=block_d, **LAUNCH_OPTIONS)
    return y, rstd


def rmsnorm_bwd(dy: torch.Tensor, x: torch.Tensor, gain: torch.Tensor | None, rstd: torch.Tensor):
    """(dx, dgain): dx in x's dtype, dgain float32 (None without gain)."""
    if not use_triton(x):
        return rmsnorm_bwd_cpu(dy, x, gain, rstd)
    d = _check(x, gain)
    xc, dyc = x.contiguous(), dy.contiguous()
    m = xc.numel() // d
    dx = torch.empty_like(xc)
    block_d, rows = _layout(d)
    n_prog = triton.cdiv(m, rows)
    parts = torch.empty((n_prog, d), dtype=torch.float32, device=x.device) if gain is not None else dx
    g = gain.contiguous() if gain is not None else xc
    _bwd_kernel[(n_prog,)](
        dyc, xc, g, rstd.contiguous(), dx, parts, m, d, reciprocal_f32(d),
        HAS_GAIN=gain is not None, ROWS=rows, BLOCK_D=block_d, **LAUNCH_OPTIONS)
    dgain = tree_sum_cols_triton(parts) if gain is not None else None
    return dx, dgain


# ---------------------------------------------------------------- GPU check registry
def _make(kind: str):
    def make(scale: float, device):
        g = seeded_generator(11)
        t = scaled(16_384, scale, 16)
        shape = (t, 2_048) if kind == "rmsnorm" else (t, 16, 128)
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        dy = torch.randn(*shape, generator=g).to(torch.bfloat16)
        gain = (1.0 + 0.1 * torch.randn(shape[-1], generator=g)).to(torch.bfloat16)
        return (x.to(device), gain.to(device) if kind == "rmsnorm" else None, dy.to(device))
    return make


def _run(a):
    x, gain, dy = a
    y, rstd = rmsnorm_fwd(x, gain)
    dx, dgain = rmsnorm_bwd(dy, x, gain, rstd)
    return (y, dx) if dgain is None else (y, dx, dgain)


def _baseline(a):
    x, gain, dy = a
    xr = x.detach().requires_grad_(True)
    gr = gain.detach().requires_grad_(True) if gain is not None else None
    y = torch.nn.functional.rms_norm(xr, (x.shape[-1],), gr, EPS)
    y.backward(dy)
    return (y, xr.grad) if gr is None else (y, xr.grad, gr.grad)


def _cost(a):
    x = a[0]
    # fwd reads x, writes y; bwd reads x, dy, writes dx (bf16); rstd written + read.
    return Cost(flops=12 * x.numel(), bytes=5 * x.numel() * x.element_size() + 8 * (x.numel() // x.shape[-1]))


GPU_CHECKS = [
    GpuCheck(name="rmsnorm.fwd_bwd", make_inputs=_make("rmsnorm"), run=_run,
             torch_baseline=_baseline, cost=_cost,
             describe=lambda s: f"bf16 ({scaled(16_384, s, 16)}, 2048) + gain, fwd+bwd"),
    GpuCheck(name="rmsnorm.qk_norm_fwd_bwd", make_inputs=_make("qk"), run=_run,
             torch_baseline=_baseline, cost=_cost,
             describe=lambda s: f"bf16 ({scaled(16_384, s, 16)}, 16, 128) no gain, fwd+bwd"),
]
