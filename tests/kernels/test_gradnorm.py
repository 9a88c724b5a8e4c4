"""Global grad norm and clipping: CPU == Triton bit for bit; both == the pairwise tree in
its exact order (on inputs where other orders give other bits); accuracy against float64."""
import numpy as np
import pytest
import torch

from open1b_kernels.ops import gradnorm
from open1b_kernels.core.backend import force
from open1b_kernels.core.reduce import tree_sum_cpu
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


# ------------------------------------------------ the pairwise tree, in its exact order
# A reference written from the docstrings (open1b_kernels/ops/gradnorm.py,
# open1b_kernels/core/reduce.py): zero-pad
# to a power of two, add adjacent pairs level by level, one float32 add each; per tensor,
# then over the per-tensor sums in list order; sqrt correctly rounded.
def _tree(x: np.ndarray) -> np.float32:
    s = np.asarray(x, dtype=np.float32).reshape(-1)
    if s.size > 1:
        s = np.concatenate([s, np.zeros((1 << (s.size - 1).bit_length()) - s.size, np.float32)])
    while s.size > 1:
        s = s[0::2] + s[1::2]
    return s[0]


def _sequential(x) -> np.float32:
    total = np.float32(0.0)
    for e in np.asarray(x, dtype=np.float32).reshape(-1):
        total = np.float32(total + e)
    return total


def _norm(total) -> np.float32:
    return np.float32(np.sqrt(np.float64(total)))


def _reference(gs: list[torch.Tensor], combine=_tree) -> np.float32:
    return _norm(_tree(np.array([combine(t.numpy().reshape(-1) ** 2) for t in gs],
                                np.float32)))


# Five squares whose pairwise tree keeps the three small ones together until they are big
# enough to survive meeting 1.0 and then 1.0 again: ((1 + 4u) + (u + u)) + 1 = 2 + 2^-21
# (u = 2^-24, half an ulp of 1), while a running sum loses each u to a tie-to-even (2 + 2^-22)
# and the reversed tree loses one (2 + 2^-22); the norms differ by one ulp.
PATTERN = [1.0, 2.0**-11, 2.0**-12, 2.0**-12, 1.0]


def _spread(stride: int, n: int) -> torch.Tensor:
    """PATTERN at elements 0, stride, 2*stride, ...: with stride = CHUNK one per chunk."""
    t = torch.zeros(n)
    t[torch.arange(len(PATTERN)) * stride] = torch.tensor(PATTERN)
    return t


def _chunk_partials(t: torch.Tensor) -> np.ndarray:
    flat = t.numpy().reshape(-1)
    return np.array([_tree(flat[i:i + gradnorm.CHUNK] ** 2)
                     for i in range(0, flat.size, gradnorm.CHUNK)], np.float32)


ORDER_CASES = {
    # across 4,096-element chunks: the tree over the chunk partials
    "chunks": [_spread(gradnorm.CHUNK, 4 * gradnorm.CHUNK + 1)],
    # inside one chunk: the tree over adjacent elements
    "elements": [_spread(1, 37)],
    # across the list: the tree over the per-tensor sums, in list order
    "tensors": [torch.tensor([x]) for x in PATTERN],
}


@pytest.mark.parametrize("case", sorted(ORDER_CASES))
def test_inputs_tell_the_tree_from_other_orders(case):
    gs = ORDER_CASES[case]
    want = _reference(gs)
    if case == "chunks":
        parts = _chunk_partials(gs[0])
        others = [_norm(_sequential(parts)), _norm(_tree(parts[::-1].copy()))]
    elif case == "elements":
        sq = gs[0].numpy() ** 2
        others = [_norm(_sequential(sq)), _norm(_tree(sq[::-1].copy()))]
    else:
        per = np.array([_tree(t.numpy() ** 2) for t in gs], np.float32)
        others = [_norm(_sequential(per)), _norm(_tree(per[::-1].copy()))]
    assert want == np.float32(np.sqrt(2.0 + 2.0**-21))
    assert all(o != want for o in others), (want, others)


def _check_exact_order(backend):
    cases = [*ORDER_CASES.values(), grads(0.5, seed=4), [g * 1e-20 for g in grads(1.0, 5)]]
    for gs in cases:
        with force(backend):
            norm = gradnorm.grad_norm(gs)
            clipped = [t.clone() for t in gs]
            norm2 = gradnorm.clip_grads_(clipped)
        want = torch.tensor(_reference(gs))
        assert torch.equal(norm.view(torch.int32), want.view(torch.int32))
        assert torch.equal(norm2.view(torch.int32), want.view(torch.int32))


def test_cpu_norm_is_the_exact_tree():
    _check_exact_order("cpu")


@needs_triton
def test_triton_norm_is_the_exact_tree():
    _check_exact_order("triton")


@pytest.mark.parametrize("chunks", [5, 13, 37, 100, 1025])
def test_cpu_slabs_of_chunk_partials_equal_the_one_shot_tree(chunks, monkeypatch):
    """The CPU path's bounded-memory form (CHUNK partials slab by slab, then their tree) is
    bitwise the one-shot tree of g*g, as the Triton path's chunk partials are."""
    from open1b_kernels.core.reduce import tree_sum_cpu
    from open1b_kernels.ops import gradnorm

    monkeypatch.setattr(gradnorm, "CPU_SLAB", 4 * gradnorm.CHUNK)
    g = torch.Generator().manual_seed(chunks)
    n = chunks * gradnorm.CHUNK
    x = torch.randn(n, generator=g) * torch.rand(n, generator=g) ** 8
    assert torch.equal(gradnorm._sum_squares(x), tree_sum_cpu(x * x, 0))
