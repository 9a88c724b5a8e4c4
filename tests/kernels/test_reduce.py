"""The pairwise tree: CPU == Triton (interpreter) bit for bit, blockable, accurate."""
import pytest
import torch

from open1b_kernels.core import reduce
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton
from tests.kernels.support import needs_loops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def naive_tree(values: list[float]) -> torch.Tensor:
    """The definition, spelled out on Python lists of float32 0-d tensors."""
    s = [torch.tensor(v, dtype=torch.float32) for v in values]
    if len(s) == 1:
        return s[0]
    while len(s) & (len(s) - 1):
        s.append(torch.tensor(0.0))
    while len(s) > 1:
        s = [s[i] + s[i + 1] for i in range(0, len(s), 2)]
    return s[0]


def test_cpu_tree_matches_the_definition():
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 3, 5, 8, 13, 64, 100):
        x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 5)
        assert torch.equal(reduce.tree_sum_cpu(x, 0).view(torch.int32),
                           naive_tree(x.tolist()).view(torch.int32))
    assert reduce.tree_sum_cpu(torch.tensor([-0.0]), 0).view(torch.int32).item() == -2**31
    assert reduce.tree_sum_cpu(torch.tensor([-0.0, -0.0, -0.0]), 0).view(torch.int32).item() == 0


@pytest.mark.parametrize("compiled", [True, False])
def test_row_trees_match_the_definition(compiled, monkeypatch):
    """Trees along the last dim of a contiguous matrix (the compiled rows, or the torch
    levels with OPEN1B_MATHC=0) against the definition row by row: widths that are and are
    not powers of two, one column, signed zeros (the +0 padding turns -0 + -0 + -0 into +0),
    infinities, NaN, subnormals, a 3-D tensor."""
    if compiled and not reduce.LOOPS.available():
        pytest.skip("the compiled loops are not built")
    if not compiled:
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    g = torch.Generator().manual_seed(6)
    for n in (1, 3, 8, 100, 384, 1000):
        x = torch.randn(9, n, generator=g) * torch.exp(torch.randn(9, n, generator=g) * 5)
        x[1] = -0.0
        x[2, 0] = float("inf")
        x[3, -1] = float("nan")
        x[4] = 1e-42
        x[5, ::2] = float("-inf")
        got = reduce.tree_sum_cpu(x, -1)
        for r in range(9):
            want = naive_tree(x[r].tolist())
            assert (torch.equal(got[r:r + 1].view(torch.int32), want.view(1).view(torch.int32))
                or (want.isnan() and got[r].isnan())), (n, r)
    y = torch.randn(2, 3, 37, generator=g)
    assert torch.equal(reduce.tree_sum_cpu(y, -1), torch.stack(
        [torch.stack([naive_tree(y[i, j].tolist()) for j in range(3)]) for i in range(2)]))


def test_tree_is_blockable():
    # First log2(B) levels over aligned blocks, then the tree over block partials.
    g = torch.Generator().manual_seed(4)
    x = torch.randn(7, 1000, generator=g) * 1e3
    partials = reduce.tree_sum_cpu(torch.nn.functional.pad(x, (0, 24)).reshape(7, 8, 128), -1)
    assert torch.equal(reduce.tree_sum_cpu(partials, -1), reduce.tree_sum_cpu(x, -1))


@needs_triton
@pytest.mark.parametrize("shape,dim", [((3, 1), -1), ((5, 7), -1), ((2, 4096), -1), ((3, 5000), -1),
                                       ((1, 9001), -1), ((6, 33), 0), ((4, 3, 17), 1),
                                       ((700, 3, 5), 0)])
def test_triton_matches_cpu_bitwise(shape, dim):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 20)
    x.view(-1)[::7] = torch.randint(1, 1 << 23, ((x.numel() + 6) // 7,), generator=g,
                                    dtype=torch.int32).view(torch.float32)  # subnormals
    with force("cpu"):
        a = reduce.tree_sum(x, dim)
    with force("triton"):
        b = reduce.tree_sum(x, dim)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_accuracy_against_float64():
    g = torch.Generator().manual_seed(6)
    x = torch.rand(64, 4096, generator=g)  # positive terms: error bound log2(n) * eps * sum
    err = (reduce.tree_sum_cpu(x, -1).double() - x.double().sum(-1)).abs() / x.double().sum(-1)
    assert err.max() <= 12 * 2**-24


def test_reciprocal_and_errors():
    assert reduce.reciprocal_f32(2048) == 2.0**-11
    assert reduce.reciprocal_f32(3) == float(torch.tensor(1.0) / torch.tensor(3.0))
    with pytest.raises(ValueError, match="got 0"):
        reduce.reciprocal_f32(0)
    with pytest.raises(TypeError, match="float32"):
        reduce.tree_sum_cpu(torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("shape,dim", [((3, 5), -1), ((6, 4), 0), ((2, 3, 7), 1), ((9,), 0)])
def test_the_cpu_tree_sum_keeps_a_tensor_on_its_own_device(shape, dim):
    """tree_sum_cpu and attention's row delta run on either device (the GPU path calls them on
    CUDA tensors): their reused scratch buffers must not be CPU memory there. The meta device
    takes every branch a CUDA tensor takes (a CPU buffer raised 'found at least two devices'
    on the first GPU run)."""
    from open1b_kernels.attention.tiles import row_delta

    x = torch.empty(shape, device="meta")
    out = reduce.tree_sum_cpu(x, dim)
    assert out.device.type == "meta"
    assert out.shape == tuple(n for i, n in enumerate(shape) if i != dim % len(shape))
    o = torch.empty(2, 4, 64, 16, dtype=torch.bfloat16, device="meta")
    assert row_delta(o, o).shape == (2, 4, 64) and row_delta(o, o).device.type == "meta"


@needs_loops
def test_compiled_tree_sum_equals_the_torch_tree(monkeypatch):
    """open1b_kernels.core.reduce's pairwise tree of a long vector by the compiled blocks and the
    tree over their partials vs the torch levels: the same bits for lengths at, past and far
    from a power of two (padding inside the last block and whole padded blocks), with
    cancelling magnitudes (the order shows in the result), signed zeros, subnormals and
    inf; shorter vectors stay on the torch code."""
    from open1b_kernels.core import reduce

    g = torch.Generator().manual_seed(13)
    for n in (reduce.TREE_BLOCK, reduce.TREE_BLOCK + 1, 3 * reduce.TREE_BLOCK + 5,
              (1 << 20) + 3, 2_564_096):
        x = torch.randn(n, generator=g) * torch.pow(10.0, torch.randint(-20, 20, (n,),
                                                                         generator=g).float())
        x[:4] = torch.tensor([-0.0, 1e-45, -3e-39, 1e30])
        got = reduce.tree_sum_cpu(x, 0)
        monkeypatch.setenv("OPEN1B_MATHC", "0")
        want = reduce.tree_sum_cpu(x, 0)
        monkeypatch.setenv("OPEN1B_MATHC", "1")
        assert got.shape == want.shape == ()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), n
        assert float(got) != float(x.double().sum())          # the order matters here
    x = torch.full((2 * reduce.TREE_BLOCK,), -0.0)
    assert torch.equal(reduce.tree_sum_cpu(x, 0).view(torch.int32),
                       torch.tensor(-0.0).view(torch.int32))
    inf = torch.zeros(reduce.TREE_BLOCK + 9)
    inf[7] = float("inf")
    assert reduce.tree_sum_cpu(inf, 0) == float("inf")
    assert reduce._tree_1d_compiled(torch.ones(100)) is None            # short: the torch tree


@needs_triton
@pytest.mark.parametrize("n", [2, 3, 4, 8, 64, 4096, 5000])
def test_a_tree_of_negative_zeros_is_negative_zero_on_both_paths(n):
    # The interpreter sums a pair as a + (0.0 + b) (numpy), which turns -0.0 + -0.0 into
    # +0.0; the kernels restore the root from the leaves' bits. Rows of all -0.0 (a power
    # of two or not: padding adds +0.0), next to rows where -0.0 meets +0.0 or cancels.
    x = torch.full((4, n), -0.0)
    x[1, 0] = 0.0
    x[2, :2] = torch.tensor([2.0**-149, -(2.0**-149)])
    x[3, -1] = -1.0
    with force("cpu"):
        a = reduce.tree_sum(x, -1)
    with force("triton"):
        b = reduce.tree_sum(x, -1)
        c = reduce.tree_sum(x.t().contiguous(), 0)
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    assert torch.equal(a.view(torch.int32), c.view(torch.int32))
    assert a.view(torch.int32)[0] == (-(2**31) if n & (n - 1) == 0 else 0)
