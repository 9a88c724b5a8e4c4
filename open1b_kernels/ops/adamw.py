"""Fused AdamW of the Open-1B recipe: bf16 parameters, fp32 gradients and moments.

Host scalars (computed once per step from Python floats, i.e. IEEE binary64 add/sub/mul/
div/sqrt, which are exactly specified on every platform; each result rounded to float32):
    b1t    = beta1^step, b2t = beta2^step    by binary exponentiation (binary64 multiplies;
                                             never libm pow)
    A      = float32(lr / (1 - b1t))          step size with bias correction 1
    R2     = float32(1 / sqrt(1 - b2t))       reciprocal of sqrt(bias correction 2)
    DECAY  = float32(1 - lr * weight_decay)   decoupled weight decay factor
    B1, B2 = float32(beta1), float32(beta2); C1 = 1 - B1, C2 = 1 - B2 (float32, exact)
    EPS    = float32(eps)
Per element (float32, each op rounded to nearest even, never fused):
    p  = float32(param)                       bf16 -> fp32 is exact
    m  = m * B1 + g * C1
    v  = v * B2 + (g * g) * C2
    u  = (m * A) / (sqrt_rn(v) * R2 + EPS)    the only division: by a per-element value
    p  = p * DECAY - u
    param = bf16(p)                           the one rounding to bf16 per step
This is torch.optim.AdamW's update (decay first, then m_hat / (sqrt(v_hat) + eps))
with every division by a constant replaced by a multiply by its precomputed float32
reciprocal. Subnormals IEEE; NaN/inf propagate (the trainer checks the gradient norm).
Updates are in place on (param, m, v).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.mathfn import map_chunks, sqrt_rn
from open1b_kernels.core.reduce import f32
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import cast_tl, widen_tl

BLOCK = 1024
LOOPS = Loops("open1b_kernels.ops._opsc")    # the CPU update compiled: _adamw.c


@dataclass(frozen=True)
class AdamWConfig:
    """Open-1B defaults (docs/TRAINING.md, "One optimizer step")."""

    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not 0.0 <= b < 1.0:
                raise ValueError(f"AdamWConfig.{name} must be in [0, 1), got {b}")
        if not self.eps > 0.0:
            raise ValueError(f"AdamWConfig.eps must be positive, got {self.eps}")
        if self.weight_decay < 0.0:
            raise ValueError(f"AdamWConfig.weight_decay must be >= 0, got {self.weight_decay}")


@dataclass(frozen=True)
class StepScalars:
    """The float32 scalars of one step (see the module docstring), shared by both paths."""

    a: float
    r2: float
    decay: float
    b1: float
    b2: float
    c1: float
    c2: float
    eps: float


def _pow_int(base: float, n: int) -> float:
    """base^n by binary exponentiation with binary64 multiplies (exactly specified)."""
    result, b = 1.0, base
    while n:
        if n & 1:
            result *= b
        b *= b
        n >>= 1
    return result


def step_scalars(step: int, lr: float, weight_decay: float, cfg: AdamWConfig = AdamWConfig()) -> StepScalars:
    """Float32 scalars for optimizer step ``step`` (1-based) at learning rate ``lr``."""
    if step < 1:
        raise ValueError(f"AdamW steps are numbered from 1, got {step}")
    if not lr >= 0.0:
        raise ValueError(f"learning rate must be >= 0, got {lr}")
    b1 = f32(cfg.beta1)
    b2 = f32(cfg.beta2)
    bc1 = 1.0 - _pow_int(cfg.beta1, step)
    bc2 = 1.0 - _pow_int(cfg.beta2, step)
    return StepScalars(
        a=f32(lr / bc1),
        r2=f32(1.0 / math.sqrt(bc2)),
        decay=f32(1.0 - lr * weight_decay),
        b1=b1, b2=b2,
        c1=f32(1.0 - b1),  # exact: b1 is within a factor 2 of 1 (Sterbenz), so no rounding
        c2=f32(1.0 - b2),
        eps=f32(cfg.eps),
    )


def adamw_step_cpu_(param, grad, m, v, s: StepScalars) -> None:
    """CPU reference: update (param, m, v) in place (elementwise, evaluated in chunks), by
    the compiled loop (``_adamw.c``) where it is built (the same operations in
    the same order: one pass instead of a dozen) - the torch code below is the definition."""
    if _update_compiled(param, grad, m, v, s):
        return

    def update(p, g, m_, v_):
        m_ = m_ * s.b1 + g * s.c1
        v_ = v_ * s.b2 + (g * g) * s.c2
        u = (m_ * s.a) / (sqrt_rn(v_) * s.r2 + s.eps)
        return (p.to(torch.float32) * s.decay - u).to(p.dtype), m_, v_

    p_new, m_new, v_new = map_chunks(update, param, grad, m, v)
    param.copy_(p_new)
    m.copy_(m_new)
    v.copy_(v_new)


if HAVE_TRITON:

    @triton.jit
    def _adamw_kernel(p_ptr, g_ptr, m_ptr, v_ptr, n, a, r2, decay, b1, b2, c1, c2, eps,
                      BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        p = widen_tl(tl.load(p_ptr + offs, mask=mask))
        g = tl.load(g_ptr + offs, mask=mask)
        m = tl.load(m_ptr + offs, mask=mask)
        v = tl.load(v_ptr + offs, mask=mask)
        m = m * b1 + g * c1
        v = v * b2 + (g * g) * c2
        u = tl.div_rn(m * a, tl.sqrt_rn(v) * r2 + eps)
        p = p * decay - u
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(p_ptr + offs, cast_tl(p, p_ptr.dtype.element_ty), mask=mask)


def _update_compiled(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
          scalars) -> bool:
    """``adamw_step_cpu_``'s update of contiguous CPU tensors in place - bf16 or float32
    ``param``, float32 ``grad``, ``m``, ``v`` - by the compiled loop (the same float32
    operations in the same order); False when the loop is unavailable or a layout does not
    fit (nothing was written). ``scalars``: the step's ``StepScalars``."""
    if (not LOOPS.available() or param.device.type != "cpu"
            or param.dtype not in (torch.bfloat16, torch.float32)
            or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (grad, m, v))
            or not all(t.is_contiguous() for t in (param, grad, m, v))
            or not param.numel() == grad.numel() == m.numel() == v.numel()):
        return False
    n = param.numel()
    bf = param.dtype == torch.bfloat16
    args = (flat(param.view(torch.int16) if bf else param), bf, flat(grad), flat(m), flat(v),
            scalars.a, scalars.r2, scalars.decay, scalars.b1, scalars.b2, scalars.c1,
            scalars.c2, scalars.eps, n)
    parallel(lambda lo, hi, p: LOOPS.adamw(*args, lo, hi, p), n, grain=PARALLEL_MIN // 4)
    return True


def adamw_step_(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                step: int, lr: float, weight_decay: float,
                cfg: AdamWConfig = AdamWConfig()) -> None:
    """One fused AdamW step on one parameter tensor, in place on (param, m, v)."""
    if grad.dtype != torch.float32 or m.dtype != torch.float32 or v.dtype != torch.float32:
        raise TypeError(f"grad, m, v must be float32, got {grad.dtype}, {m.dtype}, {v.dtype}")
    if not (param.shape == grad.shape == m.shape == v.shape):
        raise ValueError(f"shape mismatch: param {tuple(param.shape)}, grad {tuple(grad.shape)}, "
                         f"m {tuple(m.shape)}, v {tuple(v.shape)}")
    s = step_scalars(step, lr, weight_decay, cfg)
    if not use_triton(param):
        adamw_step_cpu_(param, grad, m, v, s)
        return
    for name, t in (("param", param), ("m", m), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"adamw_step_ updates {name} in place and needs it contiguous")
    n = param.numel()
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        param, grad.contiguous(), m, v, n, s.a, s.r2, s.decay, s.b1, s.b2, s.c1, s.c2, s.eps,
        BLOCK=BLOCK, **LAUNCH_OPTIONS)


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(29)
    n = scaled(1_608_000_000 // 8, scale, 1024)  # an eighth of Open-1B's parameters
    p = (0.02 * torch.randn(n, generator=g)).to(torch.bfloat16)
    grad = 1e-3 * torch.randn(n, generator=g)
    m = 1e-4 * torch.randn(n, generator=g)
    v = (1e-4 * torch.randn(n, generator=g)) ** 2
    return tuple(t.to(device) for t in (p, grad, m, v))


def _fresh(a):
    p, grad, m, v = a[:4]
    return (p.clone(), grad, m.clone(), v.clone(), p.to(torch.float32))


def _run(a):
    p, grad, m, v = a[:4]
    adamw_step_(p, grad, m, v, step=1000, lr=4.5e-4, weight_decay=0.1)
    return (p, m, v)


def _baseline(a):
    # Stock fused AdamW kernel; it needs one dtype, so it updates an fp32 copy of the params.
    _, grad, m, v, p32 = a
    step = torch.tensor(1000.0, device=p32.device)
    torch._fused_adamw_([p32], [grad], [m], [v], [], [step], lr=4.5e-4, beta1=0.9, beta2=0.95,
                        weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
    return (p32, m, v)


GPU_CHECKS = [
    GpuCheck(
        name="adamw.step",
        make_inputs=_make,
        run=_run,
        torch_baseline=_baseline,
        # reads p (bf16), g, m, v (fp32); writes p, m, v
        cost=lambda a: Cost(flops=16 * a[0].numel(), bytes=a[0].numel() * (2 + 12 + 2 + 8)),
        describe=lambda s: f"{scaled(1_608_000_000 // 8, s, 1024)} params bf16 + fp32 g/m/v",
        parity_scale=0.125,
        bench_scale=1.0,
        fresh=_fresh,
        notes="baseline updates fp32 params (torch's fused kernel needs one dtype)",
    ),
]
