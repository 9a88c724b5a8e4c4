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
result is bit-identical to ``reduce.tree_sum_cpu`` of its rows. The index bookkeeping is
integer arithmetic shared by both paths; each level's adds run in a Triton kernel on
CUDA and as torch float32 adds on the CPU. IEEE subnormals kept; NaN/inf propagate.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.reduce import next_pow2
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator

if HAVE_TRITON:
    import triton
    import triton.language as tl

BLOCK_ROWS = 8
BLOCK_D = 256


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
    def _level_kernel(cur_ptr, left_ptr, flags_ptr, out_ptr, n_new, D,
                      BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
        # flags: bit 0 = the group is still longer than one (add), bit 1 = a right partner exists.
        rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        rmask = rows < n_new
        mask = rmask[:, None] & (cols[None, :] < D)
        left = tl.load(left_ptr + rows, mask=rmask, other=0)
        flags = tl.load(flags_ptr + rows, mask=rmask, other=0)
        add = (flags & 1) != 0
        has_right = (flags & 2) != 0
        a = tl.load(cur_ptr + left[:, None] * D + cols[None, :], mask=mask, other=0.0)
        b = tl.load(cur_ptr + (left + 1)[:, None] * D + cols[None, :],
                    mask=mask & has_right[:, None], other=0.0)
        out = tl.where(add[:, None], a + b, a)
        tl.store(out_ptr + rows[:, None].to(tl.int64) * D + cols[None, :], out, mask=mask)


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


def embedding_bwd(dy: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """dW (vocab, D) float32: per-token pairwise tree sums of dy rows in position order."""
    _check(ids, vocab)
    d = dy.shape[-1]
    flat = ids.reshape(-1).long()
    if dy.numel() // d != flat.numel():
        raise ValueError(f"dy has {dy.numel() // d} rows but ids has {flat.numel()} tokens")
    triton_path = use_triton(dy)
    sorted_ids, order = torch.sort(flat, stable=True)
    uniq, lengths = torch.unique_consecutive(sorted_ids, return_counts=True)
    cur = dy.reshape(-1, d)[order].to(torch.float32).contiguous()  # (N, D) grouped by id
    starts = torch.cumsum(lengths, 0) - lengths
    levels = (next_pow2(int(lengths.max())) - 1).bit_length() if lengths.numel() else 0
    for _ in range(levels):
        left, flags, lengths, starts = _level_plan(lengths, starts)
        if triton_path:
            out = torch.empty(left.numel(), d, dtype=torch.float32, device=dy.device)
            grid = (triton.cdiv(left.numel(), BLOCK_ROWS), triton.cdiv(d, BLOCK_D))
            _level_kernel[grid](cur, left.contiguous(), flags.contiguous(), out, left.numel(), d,
                                BLOCK_ROWS=BLOCK_ROWS, BLOCK_D=BLOCK_D, **LAUNCH_OPTIONS)
            cur = out
        else:
            has_right = (flags & 2) != 0
            a = cur[left]
            b = torch.where(has_right[:, None], cur[torch.where(has_right, left + 1, left)], 0.0)
            cur = torch.where(((flags & 1) != 0)[:, None], a + b, a)
    dw = torch.zeros(vocab, d, dtype=torch.float32, device=dy.device)
    dw[uniq] = cur  # one row per id: an assignment, not an accumulation
    return dw


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
