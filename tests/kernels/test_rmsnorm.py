"""RMSNorm / QK-norm: CPU == Triton (interpreter) bit for bit; accuracy against float64."""
import pytest
import torch

from open1b_kernels.ops import rmsnorm
from testkit.kernels import autograd
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton, same_bits
from tests.kernels.support import needs_loops

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def both_paths(x, gain, dy):
    out = {}
    for backend in ("cpu", "triton"):
        with force(backend):
            y, rstd = rmsnorm.rmsnorm_fwd(x, gain)
            dx, dg = rmsnorm.rmsnorm_bwd(dy, x, gain, rstd)
        out[backend] = (y, rstd, dx, dg)
    return out["cpu"], out["triton"]


def make(shape, scale, dtype, gain, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * scale).to(dtype)
    dy = torch.randn(*shape, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(dtype) if gain else None
    return x, w, dy


@needs_triton
@pytest.mark.parametrize("shape,gain,scale,dtype", [
    ((7, 37), True, 1.0, torch.bfloat16), ((7, 37), True, 1e30, torch.float32),
    ((7, 37), False, 1e-38, torch.bfloat16), ((3, 5, 128), False, 1.0, torch.bfloat16),
    ((3, 5, 128), False, 1e-38, torch.float32), ((2, 2048), True, 1.0, torch.bfloat16),
    ((1, 1), True, 1.0, torch.float32), ((33, 3, 130), False, 1e20, torch.bfloat16),
    ((300, 64), True, 1.0, torch.bfloat16),  # several programs: dgain block partials
])
def test_triton_matches_cpu_bitwise(shape, gain, scale, dtype):
    x, w, dy = make(shape, scale, dtype, gain)
    for a, b in zip(*both_paths(x, w, dy)):
        assert same_bits(a, b)


@needs_triton
def test_subnormal_rows_bitwise():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 1 << 23, (5, 64), generator=g, dtype=torch.int32).view(torch.float32)
    x[::2] = -x[::2]
    x[1, :3] = torch.tensor([0.0, -0.0, float("inf")])
    dy = torch.randn(5, 64, generator=g)
    for a, b in zip(*both_paths(x, torch.ones(64), dy)):
        assert same_bits(a, b)


def reference64(x, gain, dy, eps=rmsnorm.EPS):
    x = x.double().requires_grad_(True)
    gd = gain.double().requires_grad_(True) if gain is not None else None
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
    y = y * gd if gd is not None else y
    y.backward(dy.double())
    return y.detach(), x.grad, gd.grad if gd is not None else None


@pytest.mark.parametrize("gain", [True, False])
def test_accuracy_against_float64(gain):
    x, w, dy = make((64, 2048) if gain else (64, 16, 128), 3.0, torch.float32, gain, seed=2)
    y, rstd = rmsnorm.rmsnorm_fwd(x, w)
    dx, dg = rmsnorm.rmsnorm_bwd(dy, x, w, rstd)
    ry, rdx, rdg = reference64(x, w, dy)
    assert ((y.double() - ry).abs() / ry.abs().max()).max() < 1e-6
    assert ((dx.double() - rdx).abs() / rdx.abs().max()).max() < 1e-6
    if gain:
        assert ((dg.double() - rdg).abs() / rdg.abs().max()).max() < 1e-6


def test_autograd_wrapper_matches_functional():
    x, w, dy = make((4, 6, 32), 1.0, torch.float32, True, seed=3)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = autograd.rmsnorm(xr, wr)
    y.backward(dy)
    fy, rstd = rmsnorm.rmsnorm_fwd(x, w)
    fdx, fdg = rmsnorm.rmsnorm_bwd(dy, x, w, rstd)
    assert torch.equal(y, fy) and torch.equal(xr.grad, fdx) and torch.equal(wr.grad, fdg)
    q = x.clone().requires_grad_(True)
    autograd.qk_norm(q).backward(dy)
    assert torch.equal(q.grad, rmsnorm.rmsnorm_bwd(dy, x, None, rmsnorm.rmsnorm_fwd(x, None)[1])[0])


def test_bad_gain_shape_is_named():
    with pytest.raises(ValueError, match=r"gain must have shape \(8,\)"):
        rmsnorm.rmsnorm_fwd(torch.ones(2, 8), torch.ones(7))


@needs_loops
@pytest.mark.parametrize("d", [2048, 300, 1])
@pytest.mark.parametrize("with_gain", [True, False])
@pytest.mark.parametrize("dy_dtype", [torch.bfloat16, torch.float32])
def test_compiled_rmsnorm_equals_torch(d, with_gain, dy_dtype, monkeypatch):
    """open1b_kernels.ops.rmsnorm's CPU forward and backward by the compiled rows against the torch
    code (OPEN1B_MATHC=0): the same bits for dx, y, rstd and the gain gradient - a row width
    that is not a power of two (the tree's zero padding), one of width 1, a row holding inf
    (NaN row), an all-zero row, subnormals and large values, threads splitting the rows."""
    from open1b_kernels.ops.rmsnorm import rmsnorm_bwd_cpu, rmsnorm_fwd_cpu

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 67, d, generator=g) * 10.0 ** torch.randint(-20, 20, (2, 67, d),
                                                                    generator=g).float()
    x[0, 3, 0], x[0, 4] = float("inf"), 0.0
    x[1, 5, :1] = 1e-40
    x = x.to(torch.bfloat16)
    dy = (torch.randn(2, 67, d, generator=g) * 3).to(dy_dtype)
    gain = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16) if with_gain else None

    def run():
        y, rstd = rmsnorm_fwd_cpu(x, gain, 1e-6)
        dx, dgain = rmsnorm_bwd_cpu(dy, x, gain, rstd)
        return y, rstd, dx, dgain

    got = run()
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = run()
    assert bool(want[0].isnan().any())                    # the inf row is in the case
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        bits = torch.int16 if b.dtype == torch.bfloat16 else torch.int32
        assert a.dtype == b.dtype and a.shape == b.shape
        # NaN payloads are outside rmsnorm's contract (torch's own bf16 conversion gives
        # 0xFFFF in its vector loop and 0x7FC0 in its scalar one): NaN where torch has NaN
        nan = b.isnan()
        assert torch.equal(a.isnan(), nan)
        assert torch.equal(a[~nan].view(bits), b[~nan].view(bits))
