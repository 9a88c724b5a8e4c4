"""SwiGLU: CPU == Triton (interpreter) bit for bit; accuracy against float64."""
import pytest
import torch

from open1b_kernels.ops import swiglu
from testkit.kernels import autograd
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton, same_bits
from tests.kernels.support import needs_loops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@needs_triton
@pytest.mark.parametrize("shape,scale,dtype", [
    ((7, 74), 5.0, torch.bfloat16), ((3, 5, 22), 1e-39, torch.bfloat16),
    ((2, 2048), 100.0, torch.float32), ((1, 2), 1e30, torch.float32),
])
def test_triton_matches_cpu_bitwise(shape, scale, dtype):
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(*shape, generator=g) * scale).to(dtype)
    h.view(-1)[:4] = torch.tensor([float("inf"), -0.0, 1e-40, -200.0]).to(dtype)[: h.numel()]
    dy = torch.randn(*shape[:-1], shape[-1] // 2, generator=g).to(dtype)
    out = {}
    for backend in ("cpu", "triton"):
        with force(backend):
            out[backend] = (swiglu.swiglu_fwd(h), swiglu.swiglu_bwd(dy, h))
    for a, b in zip(out["cpu"], out["triton"]):
        assert same_bits(a, b)


def test_accuracy_against_float64():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 512, generator=g) * 4
    dy = torch.randn(64, 256, generator=g)
    hd = h.double().requires_grad_(True)
    gate, up = hd.chunk(2, -1)
    ref = torch.nn.functional.silu(gate) * up
    ref.backward(dy.double())
    hr = h.clone().requires_grad_(True)
    y = autograd.swiglu(hr)
    y.backward(dy)
    assert ((y.double() - ref.detach()).abs() / ref.detach().abs().clamp_min(1e-3)).max() < 1e-6
    # The gate gradient passes through zero (silu' vanishes near -1.28): error vs the scale.
    assert (hr.grad.double() - hd.grad).abs().max() < 1e-6 * hd.grad.abs().max()


def test_large_negative_gate_gives_finite_limits():
    h = torch.tensor([[-200.0, -1e30, 3.0, 3.0]])
    y = swiglu.swiglu_fwd(h)
    dh = swiglu.swiglu_bwd(torch.ones(1, 2), h)
    assert torch.isfinite(y).all() and torch.isfinite(dh).all()
    assert y.abs().max() == 0.0


def test_odd_width_is_rejected():
    with pytest.raises(ValueError, match="2F"):
        swiglu.swiglu_fwd(torch.ones(2, 5))


@needs_loops
def test_compiled_swiglu_equals_torch(monkeypatch):
    """open1b_kernels.ops.swiglu's CPU forward and backward by the compiled rows against the torch
    code: gates far below zero (exp overflows: s = -0, sig = 0), large and subnormal
    values, zeros of both signs, inf and NaN (NaN where torch has NaN: payloads are outside
    the contract), rows split among threads."""
    from open1b_kernels.ops.swiglu import swiglu_bwd_cpu, swiglu_fwd_cpu

    g = torch.Generator().manual_seed(12)
    h = torch.randn(301, 2 * 700, generator=g) * 10.0 ** torch.randint(-3, 3, (301, 1400),
                                                                       generator=g).float()
    h[0, :8] = torch.tensor([-200.0, -88.0, 90.0, 1e-40, -0.0, 0.0, float("inf"),
                             float("nan")])
    h[1, :3] = torch.tensor([-float("inf"), 3e38, -3e38])
    h = h.to(torch.bfloat16)
    dy = (torch.randn(301, 700, generator=g) * 2).to(torch.bfloat16)
    got = swiglu_fwd_cpu(h), swiglu_bwd_cpu(dy, h)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = swiglu_fwd_cpu(h), swiglu_bwd_cpu(dy, h)
    for a, b in zip(got, want):
        nan = b.isnan()
        assert a.shape == b.shape and bool(nan.any()) and torch.equal(a.isnan(), nan)
        assert torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))
