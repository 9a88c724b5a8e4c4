"""Fused AdamW: CPU == Triton bit for bit; scalars exactly specified; float64 accuracy."""
import math

import pytest
import torch

from kernels import adamw
from kernels.backend import force
from tests.kernels.support import needs_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def state(n, seed=0, pdtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    p = (0.02 * torch.randn(n, generator=g)).to(pdtype)
    grad = 1e-3 * torch.randn(n, generator=g)
    m = 1e-4 * torch.randn(n, generator=g)
    v = (1e-4 * torch.randn(n, generator=g)) ** 2
    return p, grad, m, v


@needs_triton
@pytest.mark.parametrize("pdtype", [torch.bfloat16, torch.float32])
def test_triton_matches_cpu_bitwise(pdtype):
    p0, g, m0, v0 = state(3001, pdtype=pdtype)
    g[:6] = torch.tensor([1e-40, -1e-39, 0.0, -0.0, 1e30, -3e-45])
    out = {}
    for backend in ("cpu", "triton"):
        p, m, v = p0.clone(), m0.clone(), v0.clone()
        with force(backend):
            for step, wd in ((1, 0.1), (2, 0.0), (1000, 0.1)):
                adamw.adamw_step_(p, g, m, v, step, 4.5e-4, wd)
        out[backend] = (p, m, v)
    for a, b in zip(out["cpu"], out["triton"]):
        itype = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(a.view(itype), b.view(itype))


def test_step_scalars_are_exactly_specified():
    s = adamw.step_scalars(3, 4.5e-4, 0.1)
    b1t = 0.9 * 0.9 * 0.9  # binary exponentiation of 3 = 0.9 * (0.9 * 0.9)
    assert s.a == float(torch.tensor(4.5e-4 / (1.0 - 0.9 * (0.9 * 0.9)), dtype=torch.float32))
    assert abs(s.a - 4.5e-4 / (1 - b1t)) <= 1e-7 * s.a
    assert s.r2 == float(torch.tensor(1.0 / math.sqrt(1.0 - 0.95 * (0.95 * 0.95)), dtype=torch.float32))
    assert s.c1 == 1.0 - s.b1 and s.c2 == 1.0 - s.b2
    with pytest.raises(ValueError, match="from 1"):
        adamw.step_scalars(0, 1e-3, 0.1)


def test_accuracy_against_float64_adamw():
    p, g, m, v = state(4096, seed=1, pdtype=torch.float32)
    p64, m64, v64 = p.double(), m.double(), v.double()
    for step in (1, 2, 3):
        adamw.adamw_step_(p, g, m, v, step, 1e-3, 0.1)
        g64 = g.double()
        m64 = 0.9 * m64 + 0.1 * g64
        v64 = 0.95 * v64 + 0.05 * g64 * g64
        denom = (v64 / (1 - 0.95 ** step)).sqrt() + 1e-8
        p64 = p64 * (1 - 1e-3 * 0.1) - 1e-3 * (m64 / (1 - 0.9 ** step)) / denom
    assert ((m.double() - m64).abs() / m64.abs().max()).max() < 1e-6
    assert ((v.double() - v64).abs() / v64.abs().max()).max() < 1e-6
    assert ((p.double() - p64).abs()).max() < 1e-6 * p64.abs().max()


def test_matches_torch_adamw_update_direction():
    p, g, m, v = state(2048, seed=2, pdtype=torch.float32)
    m.zero_()
    v.zero_()
    tp = p.clone().requires_grad_(True)
    tp.grad = g.clone()
    torch.optim.AdamW([tp], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1).step()
    adamw.adamw_step_(p, g, m, v, 1, 1e-3, 0.1)
    assert (p - tp.detach()).abs().max() < 1e-6


def test_bf16_param_rounded_once():
    p, g, m, v = state(1024, seed=3)
    p32 = p.float()
    m2, v2 = m.clone(), v.clone()
    adamw.adamw_step_(p, g, m, v, 5, 1e-3, 0.1)
    adamw.adamw_step_(p32, g, m2, v2, 5, 1e-3, 0.1)
    assert torch.equal(p, p32.to(torch.bfloat16))
