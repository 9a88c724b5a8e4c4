"""Global grad norm and clipping: CPU == Triton bit for bit; accuracy against float64."""
import pytest
import torch

from kernels import gradnorm
from kernels.backend import force
from kernels.reduce import tree_sum_cpu
from tests.kernels.support import needs_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def grads(scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(37, 5), (5000,), (3, 3000), (1,), (9001,)]
    return [torch.randn(*s, generator=g) * scale for s in shapes]


@needs_triton
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e-21, 1e19])
def test_triton_matches_cpu_bitwise(scale):
    base = grads(scale)
    base[1][:10] = torch.randint(1, 1 << 23, (10,), dtype=torch.int32).view(torch.float32)
    out = {}
    for backend in ("cpu", "triton"):
        gs = [t.clone() for t in base]
        with force(backend):
            norm = gradnorm.clip_grads_(gs)
            norm2 = gradnorm.grad_norm(base)
        out[backend] = [norm, norm2, *gs]
    for a, b in zip(out["cpu"], out["triton"]):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_definition_tree_of_per_tensor_trees():
    gs = grads(0.5, seed=1)
    per = torch.stack([tree_sum_cpu(t.reshape(-1) * t.reshape(-1), 0) for t in gs])
    want = torch.sqrt(tree_sum_cpu(per, 0).double()).float()
    assert torch.equal(gradnorm.grad_norm(gs), want)


def test_accuracy_and_clipping_against_float64():
    gs = grads(0.05, seed=2)
    ref = torch.sqrt(sum((t.double() ** 2).sum() for t in gs))
    norm = gradnorm.clip_grads_(gs)
    assert abs(norm.double() - ref) <= 1e-6 * ref
    assert abs(gradnorm.grad_norm(gs).double() - 1.0) < 1e-5  # clipped to max_norm 1.0


def test_small_norm_leaves_bits_unchanged():
    gs = grads(1e-4, seed=3)
    before = [t.clone() for t in gs]
    gradnorm.clip_grads_(gs)
    assert all(torch.equal(a, b) for a, b in zip(gs, before))


def test_rejects_non_float32():
    with pytest.raises(TypeError, match="float32"):
        gradnorm.grad_norm([torch.ones(3, dtype=torch.bfloat16)])
