"""The deterministic collectives of a data-parallel step, over virtual ranks.

Both reproduce, element for element, the reduction order of the single-process Algorithm 1
(``open1b_train.step``); they only decide which process computes which elements.

``reduce_scatter`` - within each replica, over its S shards. The flat gradient is cut into
S slices of whole parameters (``Layout.shards``); virtual rank (r, s) receives slice s of
every shard's gradient (an all-to-all: pure data movement) and sums the S contributions in
ascending shard order, ``p = g_0; p = p + g_1; ...``, then multiplies by fp32(1/S).

``all_reduce`` - over the R replicas, for each slice: the butterfly inside each
power-of-two block of replicas (``treefold.blocks``: R written as powers of two, largest
first), where at level l replica r pairs with r XOR 2^l and the sum is ``lower + upper``
(the lower replica on the left) - run as recursive halving then recursive doubling, so a
replica moves and adds only the part of the vector it keeps at each level (ring-like
traffic), with exactly the per-element tree of exchanging whole partials; then every
replica receives each other block's result and folds the blocks left to right, largest
(lowest) first, and multiplies by fp32(1/R). That is exactly ``TreeFold.result()``.

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
        if size > 1:
            cur.update(_block_butterfly(cur, start, size, ex, like))
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
    if inv != 1.0:             # R > 1: every tensor in cur is this function's own
        for t in cur.values():
            t.mul_(inv)
    return cur


def _block_butterfly(cur: dict[int, torch.Tensor], start: int, size: int, ex: Exchange,
                     like) -> dict[int, torch.Tensor]:
    """The butterfly of replicas [start, start + size) (a power of two) as recursive halving
    then recursive doubling: the same tree per element as exchanging whole partials - at
    level l replica r pairs with r XOR 2^l and ``lower + upper`` - but each level moves and
    adds only the part of the vector a replica keeps, so the traffic is 2 (size-1)/size of
    the vector, like a ring, instead of log2(size) whole vectors. Returns the block's sum on
    every member, each in a new tensor.

    No large temporaries: a halving level adds into the buffer the partner's part arrived
    in (``lower + upper`` either way round), and the doubling receives each part straight
    into its place in the result. A partner in the same process hands over its own tensor,
    which is never written to."""
    pl, S = ex.pl, ex.pl.shards
    mine = [v for v in pl.local if start <= pl.rep(v) < start + size]
    n = {pl.shard(v): cur[v].shape[0] for v in mine}        # partners share their shard

    def rel(v: int) -> int:
        return pl.rep(v) - start

    def partner(v: int, level: int) -> int:
        return pl.vrank(start + (rel(v) ^ level), pl.shard(v))

    def seg(v: int, levels: int) -> tuple[int, int]:
        """The part of the vector v keeps after the halving levels below ``levels``."""
        return _segment(n[pl.shard(v)], rel(v), levels)

    def remote(v: int, level: int) -> bool:
        return pl.host(partner(v, level)) != pl.rank

    msgs_at = {}
    level = 1
    while level < size:
        msgs_at[level] = [(pl.vrank(r, s), pl.vrank(start + ((r - start) ^ level), s))
                          for s in range(S) for r in range(start, start + size)]
        level *= 2
    levels = list(msgs_at)
    val = {v: cur[v] for v in mine}        # v's partial sum over seg(v, level)
    for level in levels:                   # halving: a reduce-scatter inside the block
        def payload(src, dst, level=level):
            lo, _ = seg(src, level)        # src holds seg(src, level); dst keeps seg(dst, 2l)
            a, b = seg(dst, 2 * level)
            return val[src][a - lo:b - lo]

        def recv_like(src, dst, level=level):
            a, b = seg(dst, 2 * level)
            return torch.empty(b - a, dtype=torch.float32, device=like(src, dst).device)

        got = ex.run(msgs_at[level], payload, recv_like)
        nv = {}
        for v in mine:
            lo, _ = seg(v, level)
            a, b = seg(v, 2 * level)
            own, other = val[v][a - lo:b - lo], got[(partner(v, level), v)]
            lower = rel(v) & level == 0
            if remote(v, level):           # other is our receive buffer: sum into it
                nv[v] = torch.add(own, other, out=other) if lower else other.add_(own)
            else:
                nv[v] = own + other if lower else other + own
        val.update(nv)
    full = {v: torch.empty(n[pl.shard(v)], dtype=torch.float32, device=val[v].device)
            for v in mine}
    for v in mine:
        a, b = seg(v, 2 * levels[-1])
        full[v][a:b].copy_(val[v])
    for level in reversed(levels):         # doubling: an all-gather inside the block
        def recv_into(src, dst, level=level):
            a, b = seg(src, 2 * level)     # src holds seg(src, 2l) in full[src]
            return full[dst][a:b]

        def send(src, dst, level=level):
            a, b = seg(src, 2 * level)
            return full[src][a:b]

        got = ex.run(msgs_at[level], send, recv_into)
        for v in mine:
            w = partner(v, level)
            a, b = seg(w, 2 * level)
            part = got[(w, v)]
            if part.data_ptr() != full[v][a:b].data_ptr():   # not received in place
                full[v][a:b].copy_(part)
    return full


def _segment(n: int, rel: int, levels: int) -> tuple[int, int]:
    """[lo, hi) of an n-vector that the replica at ``rel`` in its block keeps after the
    halving levels 1, 2, 4, ... below ``levels``: at level l the lower of the pair keeps the
    first half (rounded down) of what it held, the upper the rest."""
    lo, hi = 0, n
    lv = 1
    while lv < levels:
        mid = lo + (hi - lo) // 2
        lo, hi = (lo, mid) if rel & lv == 0 else (mid, hi)
        lv *= 2
    return lo, hi


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
