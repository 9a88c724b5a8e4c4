"""TreeFold reproduces the cluster's butterfly bit for bit, with O(log R) partials."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from open1b_train.reduction.treefold import TreeFold, blocks, butterfly_reference


def _parts(r: int, n: int = 1001) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(r)
    # wide magnitudes so that a different pairing changes bits
    return [torch.randn(n, generator=g) * 10.0 ** torch.randint(-8, 8, (n,), generator=g)
            for _ in range(r)]


@pytest.mark.parametrize("r", range(1, 17))
def test_fold_equals_butterfly_bitwise(r):
    parts = _parts(r)
    fold = TreeFold()
    for p in parts:
        fold.push(p.clone())
    got, want = fold.result(), butterfly_reference(parts)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    assert fold.peak <= int(math.log2(r)) + 1


def test_pairing_matters():
    """The test above can fail: a plain left fold gives other bits for these inputs."""
    parts = _parts(4)
    left = ((parts[0] + parts[1]) + parts[2]) + parts[3]
    assert not torch.equal(left, butterfly_reference(parts))


def test_blocks_largest_first():
    assert blocks(1) == [(0, 1)]
    assert blocks(6) == [(0, 4), (4, 2)]
    assert blocks(7) == [(0, 4), (4, 2), (6, 1)]


def test_spill_keeps_dormant_partials_out_of_memory(tmp_path):
    parts = _parts(11)
    spilled = []

    def spill(t):
        path = tmp_path / f"p{len(spilled)}.npy"
        np.save(path, t.numpy())
        spilled.append(path)
        return lambda: torch.from_numpy(np.load(path, allow_pickle=False))

    fold = TreeFold(spill)
    for p in parts:
        fold.push(p.clone())
        assert fold.resident <= 1
    assert spilled
    assert torch.equal(fold.result(), butterfly_reference(parts))
