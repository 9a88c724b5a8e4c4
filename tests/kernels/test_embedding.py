"""Embedding: gather exact; backward CPU == Triton bit for bit, equal to per-token trees."""
import pytest
import torch

from open1b_kernels.ops import embedding
from testkit.kernels import autograd
from open1b_kernels.core.backend import force
from open1b_kernels.core.reduce import tree_sum_cpu
from tests.kernels.support import needs_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def make(v, d, shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    ids = (torch.rand(*shape, generator=g) ** 3 * v).long()  # skewed: long groups
    w = torch.randn(v, d, generator=g).to(torch.bfloat16)
    dy = (torch.randn(*shape, d, generator=g) * scale).to(torch.bfloat16)
    return w, ids, dy


@needs_triton
@pytest.mark.parametrize("v,d,shape,scale", [(50, 33, (3, 41), 1.0), (7, 256, (129,), 1e-38),
                                             (1000, 5, (2, 9), 1e30)])
def test_triton_matches_cpu_bitwise(v, d, shape, scale):
    w, ids, dy = make(v, d, shape, scale=scale)
    dy.view(-1)[:3] = torch.tensor([-0.0, -0.0, -0.0], dtype=torch.bfloat16)
    out = {}
    for backend in ("cpu", "triton"):
        with force(backend):
            out[backend] = (embedding.embedding_fwd(w, ids), embedding.embedding_bwd(dy, ids, v))
    assert torch.equal(out["cpu"][0].view(torch.int16), out["triton"][0].view(torch.int16))
    assert torch.equal(out["cpu"][1].view(torch.int32), out["triton"][1].view(torch.int32))


def test_backward_is_the_per_token_tree_in_position_order():
    w, ids, dy = make(40, 16, (300,), seed=1)
    dy32 = dy.float() * torch.exp(torch.randn(300, 16) * 10)  # wide magnitudes: order matters
    dw = embedding.embedding_bwd(dy32, ids, 40)
    for tok in range(40):
        rows = dy32[ids == tok]
        want = tree_sum_cpu(rows, 0) if len(rows) else torch.zeros(16)
        assert torch.equal(dw[tok].view(torch.int32), want.view(torch.int32)), tok


def test_independent_of_batch_layout():
    w, ids, dy = make(30, 8, (4, 25), seed=2)
    a = embedding.embedding_bwd(dy, ids, 30)
    b = embedding.embedding_bwd(dy.reshape(100, 8), ids.reshape(100), 30)
    assert torch.equal(a, b)


def test_accuracy_against_float64_and_autograd():
    w, ids, dy = make(64, 32, (5, 200), seed=3)
    wr = w.float().requires_grad_(True)
    y = autograd.embedding(wr, ids)
    assert torch.equal(y, w.float()[ids])
    dy32 = dy.float() * 1.37
    y.backward(dy32)
    ref = torch.zeros(64, 32, dtype=torch.float64).index_add_(
        0, ids.reshape(-1), dy32.reshape(-1, 32).double())
    assert ((wr.grad.double() - ref).abs()).max() <= 1e-5 * ref.abs().max()


def test_out_of_range_ids_are_named():
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        embedding.embedding_fwd(torch.ones(10, 4), torch.tensor([3, 10]))


@needs_triton
@pytest.mark.parametrize("n_tok,dtype", [(700, torch.float32), (517, torch.bfloat16)])
def test_triton_long_groups_are_the_per_token_tree(n_tok, dtype):
    # One token fills 40% of the positions (25+ chunks of 16 rows: the binary counter runs
    # 6 levels over a chunk count padded to 32), others a few; magnitudes spread over 60
    # binades so that any other order of the adds (a running sum of the chunk partials, a
    # tree over another padding) gives other bits.
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, 9, (n_tok,), generator=g)
    ids[torch.rand(n_tok, generator=g) < 0.4] = 0
    dy = (torch.randn(n_tok, 5, generator=g) * torch.exp(torch.randn(n_tok, 5, generator=g) * 20))
    dy = dy.to(dtype)
    with force("triton"):
        dw = embedding.embedding_bwd(dy, ids, 12)
    for tok in range(12):
        rows = dy.float()[ids == tok]
        want = tree_sum_cpu(rows, 0) if len(rows) else torch.zeros(5)
        assert torch.equal(dw[tok].view(torch.int32), want.view(torch.int32)), tok
    running = torch.zeros(5)
    for r in dy.float()[ids == 0]:
        running = running + r
    assert not torch.equal(running, dw[0])   # the order is visible in these bits


@needs_triton
def test_triton_signed_zeros_nan_and_inf_as_the_cpu():
    # groups of -0.0 of lengths 1, 2, 3, 4, 16 and 17 (a power of two keeps -0.0: no padding
    # add), a group with a NaN and one with +inf and -inf
    lengths = {0: 1, 1: 2, 2: 3, 3: 4, 4: 16, 5: 17, 6: 3, 7: 2}
    ids = torch.cat([torch.full((n,), t) for t, n in lengths.items()])
    ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(8))]
    dy = torch.full((ids.numel(), 3), -0.0)
    dy[(ids == 6).nonzero()[0], 1] = float("nan")
    dy[(ids == 7).nonzero()[:, 0], 2] = torch.tensor([float("inf"), float("-inf")])
    out = {}
    for backend in ("cpu", "triton"):
        with force(backend):
            out[backend] = embedding.embedding_bwd(dy, ids, 9)
    a, b = out["cpu"], out["triton"]
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    assert torch.equal(a.nan_to_num().view(torch.int32), b.nan_to_num().view(torch.int32))
    assert b[[0, 1, 3, 4], 0].view(torch.int32).tolist() == [-(2**31)] * 4
    assert b[[2, 5], 0].view(torch.int32).tolist() == [0, 0]
