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
from open1b_kernels.core.reduce import f32, tree_sum_cpu
from open1b_kernels.core.segments import log_k, segment_trees, table
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.segments import find_segment

MAX_NORM = 1.0
EPS = 1e-6
CHUNK = 4096  # power of two: chunk partials + tree over partials == the one-shot tree


def _check(grads: Sequence[torch.Tensor]) -> None:
    if len(grads) == 0:
        raise ValueError("grad_norm needs at least one gradient tensor")
    for i, g in enumerate(grads):
        if g.dtype != torch.float32:
            raise TypeError(f"gradient {i} is {g.dtype}; gradients must be float32 (SPEC 5)")
        if g.numel() == 0:
            raise ValueError(f"gradient {i} is empty; drop it from the list")


# The Triton path (open1b_kernels/core/segments.py): every tensor's chunk trees of g*g in
# one launch, the trees over each tensor's partials in one launch per level of 4,096, the
# tree over the per-tensor sums, the coefficient, and one launch that scales every tensor
# - six launches for Open-1B's 30 gradients where the per-tensor form made ~125.
if HAVE_TRITON:

    @triton.jit
    def _coef_kernel(total_ptr, norm_ptr, coef_ptr, max_norm, eps):
        total = tl.load(total_ptr)
        norm = tl.sqrt_rn(total)
        q = tl.div_rn(tl.full((), max_norm, tl.float32), norm + eps)
        coef = tl.where(q < 1.0, q, 1.0)
        tl.store(norm_ptr, norm)
        tl.store(coef_ptr, coef)

    @triton.jit
    def _scale_kernel(tab_ptr, coef_ptr, K, LOG_K: tl.constexpr, BLOCK: tl.constexpr):
        # Block pid of all tensors' blocks: x *= coef, in place (one multiply per element).
        k, j = find_segment(tab_ptr, tl.program_id(0), K, LOG_K)
        ptr = tl.load(tab_ptr + k).to(tl.pointer_type(tl.float32))
        offs = j * BLOCK + tl.arange(0, BLOCK)
        mask = offs < tl.load(tab_ptr + K + k)
        coef = tl.load(coef_ptr)
        tl.store(ptr + offs, tl.load(ptr + offs, mask=mask) * coef, mask=mask)


CPU_SLAB = 1 << 22  # elements squared at once on the CPU path (a multiple of CHUNK)


def _sum_squares(g: torch.Tensor) -> torch.Tensor:
    """The pairwise tree of g*g over g flattened (CPU reference; the Triton path sums every
    tensor of a list at once in ``_total_triton``)."""
    flat = g.reshape(-1).contiguous()
    n = flat.numel()
    if n <= CPU_SLAB or n % CHUNK:
        return tree_sum_cpu(flat * flat, 0)
    # the chunked form, bounded in memory: CHUNK partials slab by slab, then the tree over
    # the partials (the same value as the one-shot tree; tested)
    parts = torch.cat([tree_sum_cpu((s * s).reshape(-1, CHUNK), -1)
                       for s in flat.split(CPU_SLAB)])
    return tree_sum_cpu(parts, 0)


def _total_triton(flats: list[torch.Tensor]) -> torch.Tensor:
    """0-d: the tree over the per-tensor trees of g*g (contiguous flat float32 tensors)."""
    per = segment_trees(flats, square=True, block=CHUNK)
    return segment_trees([per])[0]


def _norm_coef_triton(total: torch.Tensor, max_norm: float, eps: float):
    norm, coef = torch.empty_like(total), torch.empty_like(total)
    _coef_kernel[(1,)](total, norm, coef, f32(max_norm), f32(eps), **LAUNCH_OPTIONS)
    return norm, coef


def _flats(grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [g.reshape(-1).contiguous() for g in grads]


def grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The global L2 norm (0-d float32 on the gradients' device)."""
    _check(grads)
    if use_triton(grads[0]):
        return _norm_coef_triton(_total_triton(_flats(grads)), MAX_NORM, EPS)[0]
    total = tree_sum_cpu(torch.stack([_sum_squares(g) for g in grads]), 0)
    return sqrt_rn(total)


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
    if not use_triton(grads[0]):
        total = tree_sum_cpu(torch.stack([_sum_squares(g) for g in grads]), 0)
        norm = sqrt_rn(total)
        coef = clip_coefficient(norm, max_norm, eps)
        for g in grads:
            g.mul_(coef)
        return norm
    for g in grads:
        if not g.is_contiguous():
            raise ValueError("clip_grads_ scales in place and needs contiguous gradients")
    norm, coef = _norm_coef_triton(_total_triton(_flats(grads)), max_norm, eps)
    tab, n_blocks = table([g.data_ptr() for g in grads], [g.numel() for g in grads], CHUNK,
                          grads[0].device)
    _scale_kernel[(n_blocks,)](tab, coef, len(grads), LOG_K=log_k(len(grads)), BLOCK=CHUNK,
                               **LAUNCH_OPTIONS)
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
    # torch.nn.utils.clip_grads_with_norm_ scales the ``.grad`` of the tensors it is given,
    # so called on the gradients themselves (no ``.grad``) it returns without a multiply:
    # the H200 run of 2026-12-04 timed torch's norm alone against our norm + clip (0.13x).
    # Its two steps, on the gradients: the norm, then the foreach multiply by the clamped
    # coefficient.
    grads = a[0]
    norm = torch.nn.utils.get_total_norm(grads, foreach=True)
    torch._foreach_mul_(grads, torch.clamp(MAX_NORM / (norm + EPS), max=1.0))
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
