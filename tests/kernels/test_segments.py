"""Segmented trees (open1b_kernels/core/segments.py): one launch over many tensors gives
each tensor's pairwise tree bit for bit, whatever the block, the pass count or the list."""
import pytest
import torch

from open1b_kernels.core import segments
from open1b_kernels.core.backend import force
from open1b_kernels.core.reduce import tree_sum_cpu
from tests.kernels.support import needs_triton

LENGTHS = [1, 2, 3, 4, 7, 8, 9, 16, 31, 33, 64, 65, 200, 1]


def _values(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 10.0 ** torch.randint(-30, 30, (n,), generator=g)
    x[::7] = torch.randint(1, 1 << 23, (x[::7].numel(),), dtype=torch.int32).view(torch.float32)
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@needs_triton
@pytest.mark.parametrize("block", [4, 8, 64])
@pytest.mark.parametrize("square", [False, True])
def test_each_segment_is_its_own_tree(block, square):
    ts = [_values(n, i) for i, n in enumerate(LENGTHS)]
    with force("triton"):
        got = segments.segment_trees(ts, square=square, block=block)
    want = torch.stack([tree_sum_cpu(t * t if square else t, 0) for t in ts])
    assert torch.equal(_bits(got), _bits(want))


@needs_triton
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 12, 16])
def test_a_root_of_negative_zero_stays_negative_zero(n):
    # a block padded past the segment's power of two would add +0.0 above its root: the
    # tree of n copies of -0.0 is -0.0 exactly when n is a power of two (no padding add)
    ts = [torch.full((n,), -0.0), torch.tensor([1.0, -1.0]), torch.full((3,), -0.0)]
    with force("triton"):
        got = segments.segment_trees(ts, block=16)
    want = torch.stack([tree_sum_cpu(t, 0) for t in ts])
    assert torch.equal(_bits(got), _bits(want))
    assert _bits(got)[0] == (_bits(torch.tensor(-0.0)) if n & (n - 1) == 0 else 0)


@needs_triton
def test_many_segments_find_their_blocks():
    # 300 segments: the binary search over the block table places every block
    ts = [torch.full((n,), float(i + 1)) for i, n in enumerate([1 + (i * 37) % 50 for i in range(300)])]
    with force("triton"):
        got = segments.segment_trees(ts, block=8)
    assert torch.equal(got, torch.stack([tree_sum_cpu(t, 0) for t in ts]))


def test_tables_are_kept_for_the_same_list():
    a = segments.table([0, 10], [10, 5], 4, "cpu")
    assert segments.table([0, 10], [10, 5], 4, "cpu")[0] is a[0]
    assert a[1] == 3 + 2 and a[0].tolist() == [0, 10, 10, 5, 0, 3, 5]


def test_table_refuses_empty_segments():
    with pytest.raises(ValueError, match="length >= 1"):
        segments.table([0], [0], 4, "cpu")
