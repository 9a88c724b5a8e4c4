"""The deterministic collectives of a data-parallel step, over virtual ranks.

Both reproduce, element for element, the reduction order of the single-process Algorithm 1
(``open1b_train.step``); they only decide which process computes which elements.

``reduce_scatter`` - within each replica, over its S shards. The flat gradient is cut into
S slices of whole parameters (``Layout.shards``); virtual rank (r, s) receives slice s of
every shard's gradient (an all-to-all: pure data movement) and sums the S contributions in
ascending shard order, ``p = g_0; p = p + g_1; ...``, then multiplies by fp32(1/S).

``all_reduce`` - over the R replicas, for each slice: the slice is cut into R pieces;
replica j receives piece j of every replica's partial (an all-to-all: pure data movement),
folds the R pieces in replica order with ``TreeFold`` - the butterfly inside each
power-of-two block of replicas (at level l replica r pairs with r XOR 2^l, ``lower +
upper``), the blocks folded left to right, largest first - and multiplies by fp32(1/R);
then every replica receives every reduced piece (an all-gather, pure data movement: each
owner broadcasts its piece over the shard's replica group where every process runs one
virtual rank and R > 2, else one all-to-all). Each
element is reduced by exactly the tree a butterfly all-reduce gives it, on one process
instead of across log2(R) exchanges: two rounds of messages for any R, and each replica
sends 2(R-1)/R of the slice, as a ring all-reduce does.

``reduce_scatter_reference`` / ``all_reduce_reference`` compute the same on one process,
sequentially, for tests.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from open1b_kernels.core.reduce import reciprocal_f32
from open1b_train.distributed.exchange import Exchange
from open1b_train.reduction.treefold import TreeFold, butterfly_reference


def reduce_scatter(grads: Mapping[int, torch.Tensor], slices: list[tuple[int, int]],
                   ex: Exchange) -> dict[int, torch.Tensor]:
    """{local v: full flat gradient} -> {local v: slice shard(v) of its replica's shard sum
    times fp32(1/S)}."""
    pl = ex.pl
    S = pl.shards
    msgs = [(pl.vrank(r, a), pl.vrank(r, b)) for r in range(pl.replicas) for b in range(S)
            for a in range(S)]
    got = ex.run(msgs, lambda src, dst: grads[src][slice(*slices[pl.shard(dst)])],
                 lambda src, dst: torch.empty(slices[pl.shard(dst)][1] - slices[pl.shard(dst)][0],
                                              dtype=torch.float32,
                                              device=next(iter(grads.values())).device))
    inv = reciprocal_f32(S)
    out = {}
    for v in pl.local:
        r = pl.rep(v)
        acc = got[(pl.vrank(r, 0), v)].clone()
        for a in range(1, S):                      # ascending shard order
            acc.add_(got[(pl.vrank(r, a), v)])
        if inv != 1.0:
            acc.mul_(inv)
        out[v] = acc
    return out


def all_reduce(parts: Mapping[int, torch.Tensor], ex: Exchange) -> dict[int, torch.Tensor]:
    """{local v: replica partial of slice shard(v)} -> {local v: the replicas' fold of that
    slice times fp32(1/R)} (the same bits on every replica; new tensors)."""
    pl = ex.pl
    R, S = pl.replicas, pl.shards
    if R == 1:
        return dict(parts)
    n = {pl.shard(v): t.shape[0] for v, t in parts.items()}   # partners share their shard

    def piece(v_slice: int, v_piece: int) -> slice:
        """Replica rep(v_piece)'s piece of the slice virtual rank v_slice holds."""
        m, j = n[pl.shard(v_slice)], pl.rep(v_piece)
        return slice(j * m // R, (j + 1) * m // R)

    def empty(k: int) -> torch.Tensor:
        return torch.empty(k, dtype=torch.float32, device=next(iter(parts.values())).device)

    # 1. every replica's piece j of slice s to replica (j, s): pure data movement
    msgs = [(pl.vrank(r, s), pl.vrank(j, s)) for s in range(S) for j in range(R)
            for r in range(R)]
    got = ex.run(msgs, lambda src, dst: parts[src][piece(src, dst)],
                 lambda src, dst: empty(piece(dst, dst).stop - piece(dst, dst).start))
    # 2. the fold of the R pieces in replica order, exactly TreeFold's, then the reciprocal
    inv = reciprocal_f32(R)
    red = {}
    for v in pl.local:
        fold = TreeFold()
        for r in range(R):
            fold.push(got[(pl.vrank(r, pl.shard(v)), v)])
        red[v] = fold.result().mul_(inv)           # R >= 2: result() is a new tensor
    del got
    # 3. every reduced piece to every replica, straight into its place
    full = {v: empty(n[pl.shard(v)]) for v in pl.local}
    if pl.procs == pl.virtual and R > 2:
        # one virtual rank per process: each piece broadcast by its owner over the shard's
        # replica group (an all-to-all would pack R copies of the piece: 4 gloo processes,
        # 64 MiB, 0.71x -> 0.98x gloo's all-reduce); with 2 replicas the all-to-all moves
        # one piece each way in place and was faster (512 MiB: 1.33x vs 0.91x)
        (v,) = pl.local
        s = pl.shard(v)
        full[v][piece(v, v)].copy_(red[v])
        group = ex.replica_group(s)
        works = [dist.broadcast(full[v][piece(v, pl.vrank(j, s))], group=group,
                                src=pl.host(pl.vrank(j, s)), async_op=True) for j in range(R)]
        for w in works:
            w.wait()
        return full
    # else one all-to-all; pieces from other processes arrive in place where they can
    msgs = [(pl.vrank(j, s), pl.vrank(r, s)) for s in range(S) for r in range(R)
            for j in range(R)]
    got = ex.run(msgs, lambda src, dst: red[src], lambda src, dst: full[dst][piece(dst, src)])
    for (src, dst), t in got.items():
        place = full[dst][piece(dst, src)]
        if t.data_ptr() != place.data_ptr():       # not received in place
            place.copy_(t)
    return full


# ----------------------------------------------------------------------------- references

def reduce_scatter_reference(grads: list[torch.Tensor], R: int, S: int,
                             slices: list[tuple[int, int]]) -> list[torch.Tensor]:
    """Replica partials (full flat) of all R replicas, sequentially: Algorithm 1 step 2."""
    inv = reciprocal_f32(S)
    out = []
    for r in range(R):
        acc = grads[r * S].clone()
        for a in range(1, S):
            acc = acc + grads[r * S + a]
        out.append(acc * inv if inv != 1.0 else acc)
    return out


def all_reduce_reference(partials: list[torch.Tensor]) -> torch.Tensor:
    inv = reciprocal_f32(len(partials))
    g = butterfly_reference(partials)
    return g * inv if inv != 1.0 else g
