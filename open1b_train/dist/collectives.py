"""The deterministic collectives of a data-parallel step, over virtual ranks.

Both reproduce, element for element, the reduction order of the single-process Algorithm 1
(``open1b_train.step``); they only decide which process computes which elements.

``reduce_scatter`` - within each replica, over its S shards. The flat gradient is cut into
S slices of whole parameters (``Layout.shards``); virtual rank (r, s) receives slice s of
every shard's gradient (an all-to-all: pure data movement) and sums the S contributions in
ascending shard order, ``p = g_0; p = p + g_1; ...``, then multiplies by fp32(1/S).

``all_reduce`` - over the R replicas, for each slice: recursive doubling (the butterfly)
inside each power-of-two block of replicas (``treefold.blocks``: R written as powers of
two, largest first), where at level l replica r exchanges its partial with r XOR 2^l and
both compute ``lower + upper`` (the lower replica on the left, so both hold the same bits);
then every replica receives each other block's result and folds the blocks left to right,
largest (lowest) first, and multiplies by fp32(1/R). That is exactly ``TreeFold.result()``.

``reduce_scatter_reference`` / ``all_reduce_reference`` compute the same on one process,
sequentially, for tests.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.reduce import reciprocal_f32
from open1b_train.dist.exchange import Exchange
from open1b_train.treefold import blocks, butterfly_reference


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
    slice times fp32(1/R)} (the same bits on every replica)."""
    pl = ex.pl
    R, S = pl.replicas, pl.shards
    cur = dict(parts)
    shape = {pl.shard(v): t for v, t in parts.items()}     # a local tensor of each shard

    def like(src: int, dst: int) -> torch.Tensor:
        return torch.empty_like(shape[pl.shard(dst)])

    for start, size in blocks(R):
        level = 1
        while level < size:                        # recursive doubling inside the block
            msgs = [(pl.vrank(r, s), pl.vrank(start + ((r - start) ^ level), s))
                    for s in range(S) for r in range(start, start + size)]
            got = ex.run(msgs, lambda src, dst: cur[src], like)
            nxt = {}
            for v in pl.local:
                r, s = pl.rep(v), pl.shard(v)
                if not start <= r < start + size:
                    continue
                other = got[(pl.vrank(start + ((r - start) ^ level), s), v)]
                lower_is_me = (r - start) & level == 0
                nxt[v] = cur[v] + other if lower_is_me else other + cur[v]
            cur.update(nxt)
            level *= 2
    bl = blocks(R)
    if len(bl) > 1:                                # fold the blocks, largest first
        msgs = []
        for r in range(R):
            for j, (start, size) in enumerate(bl):
                if not start <= r < start + size:
                    src_r = start + r % size
                    msgs.extend((pl.vrank(src_r, s), pl.vrank(r, s)) for s in range(S))
        got = ex.run(msgs, lambda src, dst: cur[src], like)
        folded = {}
        for v in pl.local:
            r, s = pl.rep(v), pl.shard(v)
            vals = []
            for start, size in bl:
                vals.append(cur[v] if start <= r < start + size
                            else got[(pl.vrank(start + r % size, s), v)])
            acc = vals[0]
            for x in vals[1:]:
                acc = acc + x
            folded[v] = acc
        cur = folded
    inv = reciprocal_f32(R)
    return {v: (t * inv if inv != 1.0 else t) for v, t in cur.items()}


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
