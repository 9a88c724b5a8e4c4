"""The deterministic reduce-scatter and all-reduce against a sequential reference, bit for
bit, on random float32 gradients of odd sizes: R = 1..8 replicas x S = 1..4 shards, on one
process (every message local) and on 2 and 4 gloo processes (where they divide R * S)."""
from __future__ import annotations

import pytest
import torch

from open1b_train.distributed import collectives as C
from open1b_train.distributed.exchange import Exchange
from open1b_train.distributed.placement import Placement
from tests.train import distproc

MESHES = [(r, s) for r in range(1, 9) for s in range(1, 5)]


def _case(R: int, S: int):
    n = 4099 + 37 * R + S                            # odd sizes, uneven slices
    g = torch.Generator().manual_seed(R * 10 + S)
    grads = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-6, 6, (n,), generator=g)
             for _ in range(R * S)]
    cuts = sorted(torch.randint(0, n, (S - 1,), generator=g).tolist())
    return grads, list(zip([0] + cuts, cuts + [n]))


def check(R: int, S: int, procs: int, rank: int) -> None:
    grads, slices = _case(R, S)
    pl = Placement(R, S, procs, rank)
    ex = Exchange(pl)
    red = C.all_reduce(C.reduce_scatter({v: grads[v] for v in pl.local}, slices, ex), ex)
    want = C.all_reduce_reference(C.reduce_scatter_reference(grads, R, S, slices))
    assert sorted(red) == list(pl.local)
    for v, t in red.items():
        a, b = slices[v % S]
        assert torch.equal(t.view(torch.int32), want[a:b].view(torch.int32)), (R, S, procs, v)


@pytest.mark.parametrize("R,S", MESHES)
def test_one_process_matches_the_sequential_reference(R, S):
    check(R, S, 1, 0)


def test_the_reference_is_not_a_left_fold():
    """The check can fail: a plain left fold over replicas gives other bits here."""
    grads, slices = _case(4, 1)
    left = ((grads[0] + grads[1]) + grads[2]) + grads[3]
    assert not torch.equal(left * 0.25, C.all_reduce_reference(grads))


def _worker(rank: int, world: int) -> None:
    for R, S in MESHES:
        if (R * S) % world == 0:
            check(R, S, world, rank)


@pytest.mark.parametrize("world", [2, 4])
def test_gloo_processes_match_the_sequential_reference(world):
    distproc.run(world, _worker)
