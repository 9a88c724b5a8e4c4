"""Token embedding: forward gather, deterministic backward without scatter-add.

Forward: y[t] = W[ids[t]] (a copy: exact in any dtype).

Backward: dW[v] = the pairwise tree sum (open1b_kernels/core/reduce.py order) of dy[t] as float32
over the positions t with ids[t] == v, taken in ascending t; rows of W no token used are
+0.0. Nothing depends on thread timing: positions are grouped by a *stable* sort of the
ids (the permutation is unique, so every sort implementation returns the same one), and
each group is reduced level by level:

    level step, per group of current length m > 1:
        new[i] = cur[2i] + (cur[2i+1] if 2i+1 < m else +0.0),   i < ceil(m/2)
    groups of length 1 are carried unchanged.

Padding with +0.0 at the odd end of a level is exactly the pairwise tree over the group
zero-padded to a power of two (zero + zero = +0.0 at every padded node), so a group's
result is bit-identical to ``reduce.tree_sum_cpu`` of its rows. That level form is the CPU
reference (integer bookkeeping, torch float32 adds). IEEE subnormals kept; NaN/inf propagate.

The Triton path is one kernel after the sort, with no host synchronisation: over the
sorted positions, the first position of each id's group (its end by a binary search of
the sorted ids, ``torch.searchsorted``) sums the group's rows CHUNK_ROWS at a
time (each chunk the tree's first levels over aligned rows, ``reduce.tree_sum_cols``) and
merges the chunk partials with a binary counter - a register per tree level holding a
left subtree until its right sibling arrives - over the group's chunk count padded to a
power of two with zero chunks: the same tree, the same adds, written straight into dW's
row (rows no token used keep the +0.0 of a zero fill: no scatter). (A group
shorter than a chunk is the one place the chunk's zero padding reaches past the group's
own power of two: its root is restored to -0.0 when the group is a power of two of -0.0s,
reduce.py's rule.) The level form launched ~10 torch operations and a kernel per level,
with host synchronisations, then scattered the groups into a zero-filled dW
(CONTRACT.md, "GPU cost").
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.reduce import next_pow2
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.reduce import tree_sum_cols
    from open1b_kernels.int8.gemm import bf16_operand, load_f32

BLOCK_ROWS = 8
BLOCK_D = 256
CHUNK_ROWS = 16   # rows of a group summed at once (a power of two: the blockable tree)
MAX_LEVELS = 16   # binary-counter registers: groups of up to CHUNK_ROWS * 2^15 tokens


def _check(ids: torch.Tensor, vocab: int) -> None:
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"token ids must be int32 or int64, got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got range "
                         f"[{int(ids.min())}, {int(ids.max())}]")


# ------------------------------------------------------------------ forward
if HAVE_TRITON:

    @triton.jit
    def _gather_kernel(w_ptr, ids_ptr, y_ptr, n, D, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        rmask = rows < n
        mask = rmask[:, None] & (cols[None, :] < D)
        tok = tl.load(ids_ptr + rows, mask=rmask, other=0).to(tl.int64)
        vals = tl.load(w_ptr + tok[:, None] * D + cols[None, :], mask=mask)
        tl.store(y_ptr + rows[:, None].to(tl.int64) * D + cols[None, :], vals, mask=mask)

    @triton.jit
    def _merge(c, carry, acc, active, LVL: tl.constexpr):
        """One binary-counter level after chunk ``c``: a set bit means ``acc`` holds the left
        subtree, so the sum goes up; a clear bit parks the carry in ``acc`` and stops."""
        bit = ((c >> LVL) & 1) == 1
        return (tl.where(active & bit, acc + carry, carry), tl.where(active & ~bit, carry, acc),
                active & bit)

    @triton.jit
    def _group_row(dy_ptr, order_ptr, start, n, t, cols, D, DY_BF16: tl.constexpr,
                   B: tl.constexpr, BLOCK_D: tl.constexpr, LEVELS: tl.constexpr):
        """The tree of the group's rows (positions order[start:start + n], n >= 1) over
        ``cols``: chunks of B rows, merged by the binary counter over 2^t chunks."""
        cmask = cols < D
        zero = tl.zeros((BLOCK_D,), tl.float32)
        a0, a1, a2, a3, a4, a5, a6, a7 = zero, zero, zero, zero, zero, zero, zero, zero
        a8, a9, a10, a11, a12, a13, a14, a15 = zero, zero, zero, zero, zero, zero, zero, zero
        for c in range(0, 1 << t):
            rows = c * B + tl.arange(0, B)
            rmask = rows < n                      # past the group: the padding's zero chunks
            idx = tl.load(order_ptr + start + rows, mask=rmask, other=0)
            m2 = rmask[:, None] & cmask[None, :]
            x = load_f32(dy_ptr + idx[:, None] * D + cols[None, :], m2, 0.0, DY_BF16)
            s = tree_sum_cols(x, B, BLOCK_D)
            every = tl.max(tl.where(m2, x.to(tl.int32, bitcast=True), -2147483648),
                           axis=0) == -2147483648
            s = tl.where(every & (n < B) & ((n & (n - 1)) == 0), -0.0, s)
            active = c >= 0
            s, a0, active = _merge(c, s, a0, active, 0)
            if LEVELS > 1:
                s, a1, active = _merge(c, s, a1, active, 1)
            if LEVELS > 2:
                s, a2, active = _merge(c, s, a2, active, 2)
            if LEVELS > 3:
                s, a3, active = _merge(c, s, a3, active, 3)
            if LEVELS > 4:
                s, a4, active = _merge(c, s, a4, active, 4)
            if LEVELS > 5:
                s, a5, active = _merge(c, s, a5, active, 5)
            if LEVELS > 6:
                s, a6, active = _merge(c, s, a6, active, 6)
            if LEVELS > 7:
                s, a7, active = _merge(c, s, a7, active, 7)
            if LEVELS > 8:
                s, a8, active = _merge(c, s, a8, active, 8)
            if LEVELS > 9:
                s, a9, active = _merge(c, s, a9, active, 9)
            if LEVELS > 10:
                s, a10, active = _merge(c, s, a10, active, 10)
            if LEVELS > 11:
                s, a11, active = _merge(c, s, a11, active, 11)
            if LEVELS > 12:
                s, a12, active = _merge(c, s, a12, active, 12)
            if LEVELS > 13:
                s, a13, active = _merge(c, s, a13, active, 13)
            if LEVELS > 14:
                s, a14, active = _merge(c, s, a14, active, 14)
            if LEVELS > 15:
                s, a15, active = _merge(c, s, a15, active, 15)
        # after the last chunk (2^t - 1: t set bits) the root is parked at level t
        root = tl.where(t == 0, a0, a1)
        for lvl in tl.static_range(2, 16):
            if LEVELS > lvl:
                root = tl.where(t == lvl, [a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13,
                                           a14, a15][lvl - 2], root)
        return root

    @triton.jit
    def _dw_kernel(dy_ptr, order_ptr, ids_ptr, ends_ptr, dw_ptr, D, n_dblocks,
                   DY_BF16: tl.constexpr, B: tl.constexpr, BLOCK_D: tl.constexpr,
                   LEVELS: tl.constexpr):
        # Program i over the sorted positions: the first position of each id's group writes
        # that id's row of dW, column block by column block; the others do nothing (one
        # program per token rather than per (token, column block): most exit at once).
        i = tl.program_id(0)
        v = tl.load(ids_ptr + i)
        first = tl.where(i > 0, tl.load(ids_ptr + tl.maximum(i - 1, 0)), -1) != v
        n = tl.load(ends_ptr + i) - i
        chunks = (n + B - 1) // B
        t = 0                                   # log2 of the chunk count's power of two
        while (1 << t) < chunks:
            t += 1
        for db in range(0, tl.where(first, n_dblocks, 0)):
            cols = db * BLOCK_D + tl.arange(0, BLOCK_D)
            root = _group_row(dy_ptr, order_ptr, i, n, t, cols, D, DY_BF16, B, BLOCK_D, LEVELS)
            tl.store(dw_ptr + v.to(tl.int64) * D + cols, root, mask=cols < D)


def embedding_fwd(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """W[ids]: (*ids.shape, D) in W's dtype."""
    vocab, d = weight.shape
    _check(ids, vocab)
    if not use_triton(weight):
        return weight[ids.reshape(-1).long()].reshape(*ids.shape, d)
    flat = ids.reshape(-1).contiguous()
    n = flat.numel()
    y = torch.empty(n, d, dtype=weight.dtype, device=weight.device)
    grid = (triton.cdiv(n, BLOCK_ROWS), triton.cdiv(d, BLOCK_D))
    _gather_kernel[grid](weight.contiguous(), flat, y, n, d,
                         BLOCK_ROWS=BLOCK_ROWS, BLOCK_D=BLOCK_D, **LAUNCH_OPTIONS)
    return y.reshape(*ids.shape, d)


# ------------------------------------------------------------------ backward
def _level_plan(lengths: torch.Tensor, starts: torch.Tensor):
    """Integer bookkeeping of one level: (left index, flags, new lengths, new starts)."""
    new_len = torch.where(lengths > 1, (lengths + 1) // 2, lengths)
    new_starts = torch.cumsum(new_len, 0) - new_len
    group = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), new_len)
    i = torch.arange(group.numel(), device=lengths.device) - new_starts[group]
    m = lengths[group]
    left = starts[group] + 2 * i
    flags = (m > 1).to(torch.int32) | ((2 * i + 1 < m).to(torch.int32) << 1)
    return left, flags, new_len, new_starts


def embedding_bwd_cpu(dy: torch.Tensor, flat: torch.Tensor, vocab: int) -> torch.Tensor:
    """The reference: groups reduced level by level (module docstring)."""
    d = dy.shape[-1]
    sorted_ids, order = torch.sort(flat, stable=True)
    uniq, lengths = torch.unique_consecutive(sorted_ids, return_counts=True)
    cur = dy.reshape(-1, d)[order].to(torch.float32).contiguous()  # (N, D) grouped by id
    starts = torch.cumsum(lengths, 0) - lengths
    levels = (next_pow2(int(lengths.max())) - 1).bit_length() if lengths.numel() else 0
    for _ in range(levels):
        left, flags, lengths, starts = _level_plan(lengths, starts)
        has_right = (flags & 2) != 0
        a = cur[left]
        b = torch.where(has_right[:, None], cur[torch.where(has_right, left + 1, left)], 0.0)
        cur = torch.where(((flags & 1) != 0)[:, None], a + b, a)
    dw = torch.zeros(vocab, d, dtype=torch.float32, device=dy.device)
    dw[uniq] = cur  # one row per id: an assignment, not an accumulation
    return dw


def counter_levels(tokens: int) -> int:
    """Binary-counter levels the kernel needs for a group of up to ``tokens`` rows."""
    chunks = max(1, -(-tokens // CHUNK_ROWS))
    return (chunks - 1).bit_length() + 1


def embedding_bwd_triton(dy: torch.Tensor, flat: torch.Tensor, vocab: int) -> torch.Tensor:
    """The one-kernel Triton path (module docstring): the same bits as the reference."""
    d = dy.shape[-1]
    n = flat.numel()
    levels = counter_levels(n)
    if levels > MAX_LEVELS:
        raise ValueError(f"{n} tokens > {CHUNK_ROWS << (MAX_LEVELS - 1)}: split the batch")
    sorted_ids, order = torch.sort(flat, stable=True)
    ends = torch.searchsorted(sorted_ids, sorted_ids, right=True)   # each group's end
    dw = torch.zeros(vocab, d, dtype=torch.float32, device=dy.device)  # rows no token used
    if d == 0:
        return dw
    block_d = min(BLOCK_D, next_pow2(d))
    n_d = -(-d // block_d)
    rows, is_bf16 = bf16_operand(dy.reshape(-1, d).contiguous())
    _dw_kernel[(n,)](rows, order, sorted_ids, ends, dw, d, n_d, DY_BF16=is_bf16,
                           B=CHUNK_ROWS, BLOCK_D=block_d, LEVELS=levels, **LAUNCH_OPTIONS)
    return dw


def embedding_bwd(dy: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """dW (vocab, D) float32: per-token pairwise tree sums of dy rows in position order."""
    _check(ids, vocab)
    d = dy.shape[-1]
    flat = ids.reshape(-1).long()
    if dy.numel() // max(d, 1) != flat.numel():
        raise ValueError(f"dy has {dy.numel() // max(d, 1)} rows but ids has {flat.numel()} tokens")
    if use_triton(dy) and flat.numel():
        return embedding_bwd_triton(dy, flat, vocab)
    return embedding_bwd_cpu(dy, flat, vocab)


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    g = seeded_generator(19)
    t, v = scaled(16_384, scale, 16), 128_256
    # Zipf-like ids so frequent tokens form long groups, as in real text.
    ids = (torch.rand(t, generator=g) ** 4 * v).long().clamp_max(v - 1)
    w = (0.02 * torch.randn(v, 2_048, generator=g)).to(torch.bfloat16)
    dy = torch.randn(t, 2_048, generator=g).to(torch.bfloat16)
    return (w.to(device), ids.to(device), dy.to(device))


def _baseline(a):
    w, ids, dy = a
    wr = w.detach().requires_grad_(True)
    y = torch.nn.functional.embedding(ids, wr)
    y.backward(dy)
    return (y, wr.grad)


GPU_CHECKS = [
    GpuCheck(
        name="embedding.fwd_bwd",
        make_inputs=_make,
        run=lambda a: (embedding_fwd(a[0], a[1]), embedding_bwd(a[2], a[1], a[0].shape[0])),
        torch_baseline=_baseline,
        cost=lambda a: Cost(flops=a[2].numel(),
                            bytes=a[2].numel() * 2 * 3 + a[0].shape[0] * a[0].shape[1] * 4),
        describe=lambda s: f"V 128256 x 2048 bf16, {scaled(16_384, s, 16)} tokens, fwd+bwd",
    ),
]
