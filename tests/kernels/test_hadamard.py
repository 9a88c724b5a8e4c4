"""Walsh-Hadamard rotation: bit parity (interpreter vs CPU reference), orthonormality and
accuracy against a float64 Hadamard matrix, exactness on integer inputs."""
from __future__ import annotations

import math

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.int8.hadamard import hadamard, hadamard_cpu, padded_width
from tests.kernels.support import needs_interpreter


def _h64(block: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < block:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(block)


def _ref64(x: torch.Tensor, block: int) -> torch.Tensor:
    r, k = x.shape
    kp = padded_width(k, block)
    xp = torch.zeros(r, kp, dtype=torch.float64)
    xp[:, :k] = x.double()
    return (xp.reshape(r, kp // block, block) @ _h64(block)).reshape(r, kp)


def _inputs(r, k, g, kind):
    x = torch.randn(r, k, generator=g)
    if kind == "wide":  # magnitudes 1e-40 (subnormal) .. 1e30 in one row
        x = x * 10.0 ** torch.randint(-40, 31, (r, k), generator=g)
    elif kind == "subnormal":
        x = x * 1e-41
    elif kind == "bf16":
        x[0] = x[0] * 1e-39  # bf16 subnormals (the interpreter widens them wrongly)
        x = x.to(torch.bfloat16)
    return x


@needs_interpreter
@pytest.mark.parametrize("r,k,block,kind", [
    (5, 300, 256, "normal"), (70, 64, 16, "wide"), (3, 4, 4, "normal"),
    (33, 1000, 64, "subnormal"), (9, 200, 64, "bf16"),
])
def test_parity(r, k, block, kind):
    g = torch.Generator().manual_seed(r * k)
    x = _inputs(r, k, g, kind)
    with backend.force("cpu"):
        ref = hadamard(x, block)
    with backend.force("triton"):
        got = hadamard(x, block)
        got_t = hadamard(x.t().contiguous().t(), block)  # column-major input
    assert torch.equal(ref.view(torch.int32), got.view(torch.int32))
    assert torch.equal(ref.view(torch.int32), got_t.view(torch.int32))


@pytest.mark.parametrize("block", [4, 64, 256])
def test_accuracy_vs_float64(block):
    # each of log2(B) butterfly stages rounds once: |err| <= log2(B) * 2^-24 * ||x_block||_1
    g = torch.Generator().manual_seed(block)
    x = torch.randn(16, 3 * block - 5, generator=g)
    y = hadamard_cpu(x, block).double()
    ref = _ref64(x, block)
    xp = torch.zeros(16, y.shape[1], dtype=torch.float64)
    xp[:, :x.shape[1]] = x.double().abs()
    l1 = xp.reshape(16, -1, block).sum(-1, keepdim=True).expand(-1, -1, block).reshape(y.shape)
    bound = math.log2(block) * 2.0**-24 * l1 / math.sqrt(block)
    assert ((y - ref).abs() <= bound).all()


def test_exact_on_int8_values_and_involution():
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (8, 512), dtype=torch.int8, generator=g)
    y = hadamard_cpu(q)
    assert torch.equal(y.double(), _ref64(q, 256))  # every butterfly sum is exact
    assert torch.equal(hadamard_cpu(y), q.float())  # H/16 is its own inverse, exactly here


def test_rotation_preserves_gemm():
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(6, 700, generator=g), torch.randn(5, 700, generator=g)
    rot = hadamard_cpu(a).double() @ hadamard_cpu(b).double().t()
    exact = a.double() @ b.double().t()
    assert torch.allclose(rot, exact, rtol=0, atol=1e-4)


def test_rejects_non_power_of_four_block():
    with pytest.raises(ValueError, match="power of four"):
        hadamard(torch.zeros(2, 8), 8)


def test_compiled_dim0_stages_give_the_torch_bits(monkeypatch):
    # the compiled butterflies (open1b_kernels/int8/_hadamard.c) against the torch stage loop, on
    # subnormal, huge (overflowing to inf), signed-zero and ordinary values, several tiles
    from open1b_kernels.int8 import hadamard as hd
    if not hd.LOOPS.available():
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(9)
    x = torch.randn(512, 300, generator=g) * torch.exp(torch.randn(512, 300, generator=g) * 8)
    x[0, :5] = torch.tensor([1e-40, -0.0, 3e38, -3e38, 0.0])
    monkeypatch.setattr(hd, "DIM0_TILE", 256 * 64)
    fast = hd.hadamard_dim0_cpu_(x.clone())
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    slow = hd.hadamard_dim0_cpu_(x.clone())
    assert torch.equal(fast.view(torch.int32), slow.view(torch.int32))
