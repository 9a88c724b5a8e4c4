"""Embedding: gather exact; backward CPU == Triton bit for bit, equal to per-token trees."""
import pytest
import torch

from open1b_kernels.ops import embedding
from tests.kernels import autograd
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
