"""Global L2 gradient norm over a list of tensors, in a fixed order, and clipping.

Arithmetic (float32, IEEE round-to-nearest-even, never fused):
    ss[k]  = pairwise-tree sum (open1b_kernels/core/reduce.py) of g*g over tensor k, flattened row-major
    total  = pairwise-tree sum of ss[0], ..., ss[K-1] in list order
    norm   = sqrt_rn(total)
    q      = max_norm / (norm + eps)               one correctly rounded division (the factor
                                                   is a runtime value, computed once)
    coef   = q if q < 1 else 1.0                   (a select, so NaN gives 1.0 on every path)
    g      = g * coef                               every element: one multiply, no division
The list order is the caller's contract (the trainer passes parameters in model order).
The norm is returned before clipping, for the spike protocol. A multiply by coef = 1.0
is exact, so an unclipped step leaves the gradients' bits unchanged.

Subnormals IEEE. inf in any gradient gives norm = inf and coef = 0 (inf * 0 = NaN in that
tensor's inf entries); NaN gives norm NaN and coef 1.0. The trainer checks the norm before stepping.
Gradients must be float32 (the recipe reduces gradients in fp32).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathfn import sqrt_rn
from open1b_kernels.core.reduce import f32, tree_sum, tree_sum_cpu
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.reduce import tree_sum_1d

MAX_NORM = 1.0
EPS = 1e-6
CHUNK = 4096  # power of two: chunk partials + tree over partials == the one-shot tree
BLOCK = 1024


def _check(grads: Sequence[torch.Tensor]) -> None:
    if len(grads) == 0:
        raise ValueError("grad_norm needs at least one gradient tensor")
    for i, g in enumerate(grads):
        if g.dtype != torch.float32:
            raise TypeError(f"gradient {i} is {g.dtype}; gradients must be float32 (SPEC 5)")
        if g.numel() == 0:
            raise ValueError(f"gradient {i} is empty; drop it from the list")


if HAVE_TRITON:

    @triton.jit
    def _sumsq_kernel(x_ptr, out_ptr, n, CHUNK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + tl.program_id(0), tree_sum_1d(x * x, CHUNK))

    @triton.jit
    def _coef_kernel(total_ptr, norm_ptr, coef_ptr, max_norm, eps):
        total = tl.load(total_ptr)
        norm = tl.sqrt_rn(total)
        q = tl.div_rn(tl.full((), max_norm, tl.float32), norm + eps)
        coef = tl.where(q < 1.0, q, 1.0)
        tl.store(norm_ptr, norm)
        tl.store(coef_ptr, coef)

    @triton.jit
    def _scale_kernel(x_ptr, coef_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        coef = tl.load(coef_ptr)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * coef, mask=mask)


CPU_SLAB = 1 << 22  # elements squared at once on the CPU path (a multiple of CHUNK)


def _sum_squares(g: torch.Tensor) -> torch.Tensor:
    flat = g.reshape(-1).contiguous()
    if not use_triton(g):
        n = flat.numel()
        if n <= CPU_SLAB or n % CHUNK:
            return tree_sum_cpu(flat * flat, 0)
        # the Triton path's form, bounded in memory: CHUNK partials slab by slab, then the
        # tree over the partials (the same value as the one-shot tree; tested)
        parts = torch.cat([tree_sum_cpu((s * s).reshape(-1, CHUNK), -1)
                           for s in flat.split(CPU_SLAB)])
        return tree_sum_cpu(parts, 0)
    n = flat.numel()
    parts = torch.empty(triton.cdiv(n, CHUNK), dtype=torch.float32, device=g.device)
    _sumsq_kernel[(parts.numel(),)](flat, parts, n, CHUNK=CHUNK, **LAUNCH_OPTIONS)
    return tree_sum(parts, 0) if parts.numel() > 1 else parts[0]


def grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm (0-d float32 on the gradients' device)."""
    _check(grads)
    total = tree_sum(torch.stack([_sum_squares(g) for g in grads]), 0)
    if not use_triton(total):
        return sqrt_rn(total)
    norm, coef = torch.empty_like(total), torch.empty_like(total)
    _coef_kernel[(1,)](total, norm, coef, f32(MAX_NORM), f32(EPS), **LAUNCH_OPTIONS)
    return norm


def clip_coefficient(norm: torch.Tensor, max_norm: float = MAX_NORM, eps: float = EPS) -> torch.Tensor:
    """q = max_norm / (norm + eps); q if q < 1 else 1 (a NaN norm gives 1.0 on both paths)."""
    q = torch.full_like(norm, f32(max_norm)) / (norm + f32(eps))
    return torch.where(q < 1.0, q, 1.0)


def clip_grads_(grads: Sequence[torch.Tensor], max_norm: float = MAX_NORM,
                eps: float = EPS) -> torch.Tensor:
    """Scale ``grads`` in place so their global norm is at most ``max_norm``.

    Returns the pre-clip norm (0-d float32). No host synchronisation on the Triton path.
    """
    _check(grads)
    total = tree_sum(torch.stack([_sum_squares(g) for g in grads]), 0)
    if not use_triton(total):
        norm = sqrt_rn(total)
        coef = clip_coefficient(norm, max_norm, eps)
        for g in grads:
            g.mul_(coef)
        return norm
    norm, coef = torch.empty_like(total), torch.empty_like(total)
    _coef_kernel[(1,)](total, norm, coef, f32(max_norm), f32(eps), **LAUNCH_OPTIONS)
    for g in grads:
        if not g.is_contiguous():
            raise ValueError("clip_grads_ scales in place and needs contiguous gradients")
        n = g.numel()
        _scale_kernel[(triton.cdiv(n, BLOCK),)](g, coef, n, BLOCK=BLOCK, **LAUNCH_OPTIONS)
    return norm


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(23)
    shapes = [(2_048, 2_048), (512, 2_048), (11_264, 2_048), (2_048, 5_632), (2_048,)]
    n_layers = max(1, scaled(24, scale))
    grads = [1e-3 * torch.randn(*s, generator=g) for _ in range(n_layers) for s in shapes]
    return ([t.to(device) for t in grads],)


def _run(a):
    grads = a[0]
    norm = clip_grads_(grads)
    return (norm, *grads)


def _baseline(a):
    grads = a[0]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    torch.nn.utils.clip_grads_with_norm_(grads, MAX_NORM, norm, foreach=True)
    return (norm, *grads)


GPU_CHECKS = [
    GpuCheck(
        name="gradnorm.clip",
        make_inputs=_make,
        run=_run,
        torch_baseline=_baseline,
        cost=lambda a: Cost(flops=3 * sum(t.numel() for t in a[0]),
                            bytes=4 * 3 * sum(t.numel() for t in a[0])),
        describe=lambda s: f"{max(1, scaled(24, s))} layers of Open-1B linear grads (fp32), norm+clip",
        parity_scale=0.25,
        bench_scale=0.25,
        fresh=lambda a: ([t.clone() for t in a[0]],),
    ),
]
