"""RoPE: CPU == Triton (interpreter) bit for bit; tables and rotation against float64."""
import pytest
import torch

from open1b_kernels.ops import rope
from testkit.kernels import autograd
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton, same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@needs_triton
@pytest.mark.parametrize("shape,scale,dtype", [
    ((2, 37, 3, 128), 1.0, torch.bfloat16), ((2, 37, 3, 128), 1e-39, torch.bfloat16),
    ((19, 2, 10), 1e35, torch.float32), ((19, 2, 10), 1e-39, torch.float32),
    ((1, 100, 1, 128), 1.0, torch.float32), ((5, 1, 6), 1.0, torch.bfloat16),
])
def test_triton_matches_cpu_bitwise(shape, scale, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * scale).to(dtype)
    for fn in (rope.rope_fwd, rope.rope_bwd):
        with force("cpu"):
            a = fn(x)
        with force("triton"):
            b = fn(x)
        assert same_bits(a, b)


@needs_triton
def test_long_positions_bitwise():
    # Large angles (mathfn's sincos parity covers |a| <= 9000; this runs the kernel's path).
    x = torch.ones(1, 1024, 1, 4)
    with force("cpu"):
        a = rope.rope_fwd(x)
    with force("triton"):
        b = rope.rope_fwd(x)
    assert same_bits(a, b)


def test_tables_against_float64():
    t, d = 4096, 128
    cos, sin = rope.tables(t, d)
    inv64 = 500_000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    assert ((rope.inv_freq(d).double() - inv64).abs() / inv64).max() < 1e-6
    # sin/cos of the float32 angle: mathfn accuracy.
    a32 = (torch.arange(t, dtype=torch.float32)[:, None] * rope.inv_freq(d)[None, :]).double()
    assert (cos.double() - a32.cos()).abs().max() < 1e-7
    assert (sin.double() - a32.sin()).abs().max() < 1e-7
    # Against exact angles the float32 angle rounding dominates (<= ulp(4095)/2 + freq error).
    exact = torch.arange(t, dtype=torch.float64)[:, None] * inv64[None, :]
    assert (cos.double() - exact.cos()).abs().max() < 4e-4
    assert (sin.double() - exact.sin()).abs().max() < 4e-4


def test_rotation_and_gradient_against_float64():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 64, 3, 128, generator=g)
    dy = torch.randn(2, 64, 3, 128, generator=g)
    ang = torch.arange(64, dtype=torch.float64)[:, None] * (
        500_000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128))[None, :]
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    xd = x.double().requires_grad_(True)
    x1, x2 = xd[..., :64], xd[..., 64:]
    ref = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)
    ref.backward(dy.double())
    xr = x.clone().requires_grad_(True)
    y = autograd.rope(xr)
    y.backward(dy)
    assert (y.double() - ref.detach()).abs().max() < 2e-5 * x.abs().max()
    assert (xr.grad.double() - xd.grad).abs().max() < 2e-5 * dy.abs().max()


def test_backward_inverts_forward():
    x = torch.randn(1, 50, 2, 128, dtype=torch.float32)
    assert (rope.rope_bwd(rope.rope_fwd(x)) - x).abs().max() < 1e-5


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="even"):
        rope.rope_fwd(torch.ones(2, 3, 5))
    with pytest.raises(ValueError, match="8192"):
        rope.rope_fwd(torch.ones(8193, 1, 2))


def test_token_blocking_is_bit_identical():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 300, 16, 128, generator=g).to(torch.bfloat16)  # many CPU token blocks
    cos, sin = rope.tables(300, 128)
    c, s = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    x1, x2 = xf[..., :64], xf[..., 64:]
    want = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(torch.bfloat16)
    assert torch.equal(rope.rope_fwd(x).view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("shape", [(2, 37, 3, 128), (5, 1, 6), (3, 2, 7, 4, 10)])
def test_compiled_rotation_equals_the_torch_code(shape, monkeypatch):
    """The compiled rotation (open1b_kernels/ops/_rope.c) against _rotate_cpu's torch operations
    (OPEN1B_MATHC=0), forward and backward sign, bf16 inputs over the whole range: normal,
    subnormal, zero of both signs, huge (products overflow to inf), inf and NaN (the NaN
    positions must agree; their payload is outside the contract)."""
    if not rope.LOOPS.available():
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 6)
    flat = x.reshape(-1)
    flat[:6] = torch.tensor([1e-39, -0.0, 0.0, 3e38, float("inf"), float("nan")])
    x = x.to(torch.bfloat16)
    for fn in (rope.rope_fwd, rope.rope_bwd):
        with force("cpu"):
            got = fn(x)
        monkeypatch.setenv("OPEN1B_MATHC", "0")
        with force("cpu"):
            want = fn(x)
        monkeypatch.delenv("OPEN1B_MATHC")
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan)
        assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
