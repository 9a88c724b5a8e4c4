"""Fixed-order float sums: the one reduction order every op uses, on CPU and in Triton.

The order (call it *the pairwise tree*): a sum over n elements zero-pads them with +0.0
to P = next power of two >= n, then adds adjacent pairs level by level,
``s[i] = s[2i] + s[2i+1]``, until one element is left. Every add is one IEEE binary32
add, round-to-nearest-even; nothing is fused or reassociated. ``n == 1`` returns the
element itself (no padding add; -0.0 stays -0.0).

The tree is blockable: for any power-of-two block B <= P, the first log2(B) levels are
independent sums over aligned blocks, and the remaining levels are the pairwise tree over
the block partials (again zero-padded to a power of two, which gives exactly P/B
entries). So a kernel may sum blocks of B elements and then reduce the partials
recursively and still produce the same bits as the one-shot tree: that is how the Triton
path handles long rows, and why the CPU reference never needs to know the block size.

Subnormals are kept (IEEE adds, no flush). NaN and inf propagate as IEEE adds do; the
sign of a zero result follows the tree (padding adds +0.0, so -0.0 + +0.0 = +0.0).

Device functions for kernels: ``tree_sum_rows(x, R, N)`` reduces the last axis of an
(R, N) tile and ``tree_sum_1d(x, N)`` a 1-D tile; N must be a power of two and the
caller pads with 0.0 (masked ``tl.load(..., other=0.0)``).
"""
from __future__ import annotations

import numpy as np
import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.workspace import scratch

if HAVE_TRITON:
    import triton
    import triton.language as tl

# Largest power-of-two row chunk one program reduces in registers.
MAX_BLOCK = 4096
# Rows per program when a row fits in one chunk (keeps tiny rows from wasting lanes).
ROWS_PER_PROGRAM = 4
# Values per block of the compiled tree over one vector (16 KB: in L1 through its levels).
TREE_BLOCK = 4096
LOOPS = Loops("open1b_kernels.core._corec")    # the tree compiled: _reduce.c


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    if n < 1:
        raise ValueError(f"next_pow2 needs n >= 1, got {n}")
    return 1 << (n - 1).bit_length()


def f32(v: float) -> float:
    """``v`` rounded to the nearest float32 (ties to even), as a Python float.

    Kernel scalar arguments and CPU constants go through this, so both paths start from
    the same float32 value whatever the caller passed.
    """
    return float(np.float32(v))


def reciprocal_f32(n: int) -> float:
    """The correctly rounded float32 1/n: every "mean" or "average" multiplies by this."""
    if not 0 < n < 2**24:
        raise ValueError(f"reciprocal_f32 needs an integer count in (0, 2^24), got {n}")
    return float(np.float32(1.0) / np.float32(n))


def _tree_rows_compiled(x: torch.Tensor) -> torch.Tensor | None:
    """``tree_sum_cpu(x, -1)`` of a contiguous float32 (R, N) CPU matrix (N >= 1) by the
    compiled rows - each row zero-padded to the next power of two and summed by the same
    adds in the same order - as (R,); None when the loop is unavailable or ``x`` does not
    fit (the caller sums with torch)."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 2 or not x.is_contiguous() or x.shape[1] < 1):
        return None
    r, n = x.shape
    out = torch.empty(r, dtype=torch.float32)
    src, dst = flat(x), flat(out)
    parallel(lambda lo, hi, p: LOOPS.tree_rows(src, dst, r, n, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // n))
    return out


def _tree_1d_compiled(x: torch.Tensor) -> torch.Tensor | None:
    """``tree_sum_cpu`` of a contiguous float32 CPU vector of at least TREE_BLOCK values by
    the compiled blocks (the tree's first levels inside each aligned block), then the same
    tree over the block partials - the blockable tree of the module docstring, so the same
    adds in the same order - as a 0-d tensor; None when the loop is unavailable or ``x``
    does not fit (the caller sums with torch)."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 1 or not x.is_contiguous() or x.numel() < TREE_BLOCK):
        return None
    n = x.numel()
    p = 1 << (n - 1).bit_length()
    partials = torch.empty(p // TREE_BLOCK, dtype=torch.float32)
    src, out = flat(x), flat(partials)
    parallel(lambda lo, hi, k: LOOPS.tree_blocks(src, out, n, TREE_BLOCK, lo, hi, k),
             partials.numel(), grain=8)
    return tree_of_partials(partials)


def tree_of_partials(partials: torch.Tensor) -> torch.Tensor:
    """The blockable tree's levels above its blocks: ``partials`` (float32 on the CPU, a
    power of two of them, each the tree sum of one aligned block of the zero-padded vector,
    ``tree_blocks``' form) summed by the same tree, as a 0-d tensor - the compiled loop's
    callers' (``_tree_1d_compiled``; the quantizer's STE, which sums its blocks as it makes
    them). Needs the compiled loop."""
    while partials.numel() > 1:       # P / B partials: a power of two, summed by the tree
        m = partials.numel()
        b = min(m, TREE_BLOCK)
        nxt = torch.empty(m // b, dtype=torch.float32)
        LOOPS.tree_blocks(flat(partials), flat(nxt), m, b, 0, m // b)
        partials = nxt
    return partials.reshape(())


def tree_sum_cpu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The pairwise tree sum of float32 ``x`` along ``dim`` (CPU reference, any device)."""
    if x.dtype != torch.float32:
        raise TypeError(f"tree sums are defined on float32, got {x.dtype}; convert first")
    dim = dim % x.dim()
    if x.dim() == 1:
        fast = _tree_1d_compiled(x)        # compiled blocks, the same adds in the same order
        if fast is not None:
            return fast
    elif dim == x.dim() - 1 and x.is_contiguous() and x.shape[-1] and x.numel():
        fast = _tree_rows_compiled(x.reshape(-1, x.shape[-1]))     # compiled rows, the same adds
        if fast is not None:
            return fast.reshape(x.shape[:-1])
    # Along dim 0 of a contiguous tensor every level's operands are whole contiguous
    # slices; elsewhere the summed dim goes last, where they are stride-2 gathers.
    axis = 0 if dim == 0 and x.dim() >= 2 and x.is_contiguous() else -1
    s = x if axis == 0 else x.movedim(dim, -1)
    n = s.shape[axis]
    if n == 0:
        raise ValueError("tree sum over an empty dimension is undefined; check the shape")
    pad = next_pow2(n) - n
    if pad:  # zero-padded copy in a reused buffer (a fresh cat paid page faults)
        shape = list(s.shape)
        shape[axis] = n + pad
        padded = scratch("reduce.pad", tuple(shape), torch.float32, x.device)
        padded.narrow(axis, 0, n).copy_(s)
        padded.narrow(axis, n, pad).zero_()
        s = padded
    level = 0
    while s.shape[axis] > 1:  # s[i] = s[2i] + s[2i+1] along the axis, level by level
        if axis == 0:
            pairs = s.reshape(s.shape[0] // 2, 2, *s.shape[1:])
            a, b = pairs[:, 0], pairs[:, 1]
        else:
            pairs = s.reshape(*s.shape[:-1], s.shape[-1] // 2, 2)
            a, b = pairs[..., 0], pairs[..., 1]
        # levels ping-pong between two reused buffers (open1b_kernels.core.workspace: page faults)
        s = torch.add(a, b, out=scratch(f"reduce.tree{level % 2}", a.shape, torch.float32,
                                        x.device))
        level += 1
    return s.select(axis, 0).clone()


if HAVE_TRITON:

    # Each tree level is a sum over an axis of length two: one IEEE add per pair (a + b and
    # b + a are the same bits; compiled, Triton adds the two values with no identity:
    # ``add.rn.f32`` of the pair), so it is the pairwise tree, and the compiler keeps the
    # pairs where the layout already has them (a register or a lane shuffle). The earlier
    # form - reshape to (..., 2) then ``tl.split`` - pinned each pair into one thread, so
    # every level moved the tile through shared memory; Triton 3.6 (the H200's) compiled
    # RMSNorm's (2, 2048) tile that way with a 5,680-byte stack frame and 27,784
    # instructions per thread (CONTRACT.md, "GPU cost").
    # The interpreter sums a pair with numpy as a + (0.0 + b), which differs from a + b only
    # when both are -0.0 (+0.0 instead of -0.0); such a node's subtree is all -0.0, every
    # other node is the same, and the tree's root is -0.0 exactly when every leaf is. So one
    # integer max over the leaves' bits (-0.0 is the smallest int32 pattern) restores the
    # root on the interpreter and changes nothing compiled: the same code runs on both.
    @triton.jit
    def _neg_zero_root(x, s, AXIS: tl.constexpr):
        """``s`` (a tree over ``x`` along AXIS), -0.0 where every leaf is -0.0."""
        every = tl.max(x.to(tl.int32, bitcast=True), axis=AXIS) == -2147483648
        return tl.where(every, -0.0, s)

    @triton.jit
    def tree_sum_rows(x, R: tl.constexpr, N: tl.constexpr):
        """Pairwise tree over the last axis of an (R, N) tile, N a power of two -> (R,)."""
        s = x
        for lvl in tl.static_range(24):
            if (N >> lvl) > 1:
                s = tl.sum(tl.reshape(s, (R, N >> (lvl + 1), 2)), axis=2)
        s = tl.reshape(s, (R,))
        if N > 1:
            s = _neg_zero_root(x, s, 1)
        return s

    @triton.jit
    def tree_levels_1d(x, N: tl.constexpr):
        """``tree_sum_1d`` without the -0.0 root (for callers that restore it themselves)."""
        s = x
        for lvl in tl.static_range(24):
            if (N >> lvl) > 1:
                s = tl.sum(tl.reshape(s, (N >> (lvl + 1), 2)), axis=1)
        return tl.reshape(s, ())

    @triton.jit
    def tree_sum_1d(x, N: tl.constexpr):
        """Pairwise tree over a 1-D tile of N (a power of two) elements -> scalar."""
        s = tree_levels_1d(x, N)
        if N > 1:
            s = _neg_zero_root(x, s, 0)
        return s

    @triton.jit
    def tree_sum_cols(x, R: tl.constexpr, N: tl.constexpr):
        """Pairwise tree over the first axis of an (R, N) tile, R a power of two -> (N,);
        pairs of adjacent rows, no transpose."""
        s = x
        for lvl in tl.static_range(24):
            if (R >> lvl) > 1:
                s = tl.sum(tl.reshape(s, (R >> (lvl + 1), 2, N)), axis=1)
        s = tl.reshape(s, (N,))
        if R > 1:
            s = _neg_zero_root(x, s, 0)
        return s

    @triton.jit
    def _tree_sum_cols_kernel(x_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        # Program (pid_m, pid_n) sums rows [pid_m*BM, +BM) of columns [pid_n*BN, +BN).
        n_blocks = tl.cdiv(N, BN)
        pid_m = tl.program_id(0) // n_blocks
        pid_n = tl.program_id(0) % n_blocks
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
        tl.store(out_ptr + pid_m.to(tl.int64) * N + cols, tree_sum_cols(x, BM, BN), mask=cols < N)

    @triton.jit
    def _tree_sum_rows_kernel(x_ptr, out_ptr, M, N, n_chunks,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr):
        # Program (pid_r, pid_c) sums chunk pid_c (BLOCK wide) of ROWS rows; a 1-D grid
        # (CUDA caps grid axes 1 and 2 at 65,535).
        pid = tl.program_id(0)
        pid_r = pid // n_chunks
        pid_c = pid % n_chunks
        rows = pid_r * ROWS + tl.arange(0, ROWS)
        cols = pid_c * BLOCK + tl.arange(0, BLOCK)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask, other=0.0)
        s = tree_sum_rows(x, ROWS, BLOCK)
        tl.store(out_ptr + rows.to(tl.int64) * n_chunks + pid_c, s, mask=rows < M)


def _tree_sum_rows_triton(x: torch.Tensor) -> torch.Tensor:
    """(M, N) float32 contiguous -> (M,), the pairwise tree, by recursive chunking."""
    m, n = x.shape
    if n > MAX_BLOCK:
        block, rows = MAX_BLOCK, 1
    else:
        block, rows = next_pow2(n), max(1, min(ROWS_PER_PROGRAM, MAX_BLOCK // next_pow2(n)))
    n_chunks = triton.cdiv(n, block)
    out = torch.empty((m, n_chunks), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(m, rows) * n_chunks,)
    _tree_sum_rows_kernel[grid](x, out, m, n, n_chunks, ROWS=rows, BLOCK=block, **LAUNCH_OPTIONS)
    if n_chunks == 1:
        return out[:, 0]
    return _tree_sum_rows_triton(out)


COL_BM = 64  # rows per column-sum program (power of two)
COL_BN = 64  # columns per column-sum program


def tree_sum_cols_triton(x: torch.Tensor) -> torch.Tensor:
    """(M, N) float32 contiguous -> (N,): the pairwise tree down each column, by recursive
    aligned row blocks (no transpose copy)."""
    m, n = x.shape
    if m == 1:
        return x[0]
    bm = min(COL_BM, next_pow2(m))
    out = torch.empty((triton.cdiv(m, bm), n), dtype=torch.float32, device=x.device)
    grid = (out.shape[0] * triton.cdiv(n, COL_BN),)  # 1-D: CUDA caps axes 1 and 2 at 65,535
    _tree_sum_cols_kernel[grid](x, out, m, n, BM=bm, BN=COL_BN, **LAUNCH_OPTIONS)
    return tree_sum_cols_triton(out)


def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Pairwise tree sum of float32 ``x`` along ``dim``: Triton on CUDA, CPU reference else."""
    if not use_triton(x):
        return tree_sum_cpu(x, dim)
    if x.dtype != torch.float32:
        raise TypeError(f"tree sums are defined on float32, got {x.dtype}; convert first")
    if x.shape[dim] == 0:
        raise ValueError("tree sum over an empty dimension is undefined; check the shape")
    if dim in (0, -x.dim()) and x.dim() >= 2:  # sum down the columns without transposing
        return tree_sum_cols_triton(x.reshape(x.shape[0], -1).contiguous()).reshape(x.shape[1:])
    s = x.movedim(dim, -1)
    lead = s.shape[:-1]
    if s.shape[-1] == 0:
        raise ValueError("tree sum over an empty dimension is undefined; check the shape")
    flat = s.reshape(-1, s.shape[-1]).contiguous()  # (M, N)
    return _tree_sum_rows_triton(flat).reshape(lead)


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device) -> tuple[torch.Tensor]:
    g = seeded_generator(101)
    rows = scaled(16_384, scale, 8)
    return (torch.randn(rows, 2_048, generator=g).to(device),)


GPU_CHECKS = [
    GpuCheck(
        name="reduce.tree_sum_rows",
        make_inputs=_make,
        run=lambda a: (tree_sum(a[0], -1),),
        torch_baseline=lambda a: (a[0].sum(-1),),
        cost=lambda a: Cost(flops=a[0].numel(), bytes=a[0].numel() * 4 + a[0].shape[0] * 4),
        describe=lambda s: f"fp32 ({scaled(16_384, s, 8)}, 2048) -> row sums",
    ),
]
