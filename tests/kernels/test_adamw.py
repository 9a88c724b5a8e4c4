"""Fused AdamW: CPU == Triton bit for bit; both == the documented formula bit for bit (m, v
and the parameter, over several steps); scalars exactly specified; float64 accuracy."""
import math

import numpy as np
import pytest
import torch

from open1b_kernels.ops import adamw
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton
from tests.kernels.support import needs_loops
from open1b_kernels.core import mathc

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


# ------------------------------------------------ the documented formula, bit for bit
# A reference written from the module docstring (open1b_kernels/CONTRACT.md section 1): host
# scalars in binary64 rounded once to float32, then every per-element operation one
# float32 IEEE op in the documented order (numpy float32, nothing fused).
F32 = np.float32
STEPS = ((1, 1e-3, 0.1), (2, 1e-3, 0.0), (3, 7e-4, 0.1), (4, 3e-4, 0.1), (1000, 4.5e-4, 0.1))


def _power(base: float, n: int) -> float:
    result = 1.0
    while n:                                   # binary exponentiation, binary64 multiplies
        if n & 1:
            result *= base
        base *= base
        n >>= 1
    return result


def _scalars(step, lr, wd, beta1=0.9, beta2=0.95, eps=1e-8):
    b1, b2 = F32(beta1), F32(beta2)
    return dict(a=F32(lr / (1.0 - _power(beta1, step))),
                r2=F32(1.0 / math.sqrt(1.0 - _power(beta2, step))),
                decay=F32(1.0 - lr * wd), b1=b1, b2=b2, c1=F32(1) - b1, c2=F32(1) - b2,
                eps=F32(eps))


def _sqrt_rn(x):
    return np.sqrt(x.astype(np.float64)).astype(np.float32)


def _v_documented(v, g, s):
    return v * s["b2"] + (g * g) * s["c2"]


def _reference_step(p, g, m, v, s, v_update=_v_documented):
    """(param, m, v) after one step, as the docstring orders it; p is a torch tensor."""
    m = m * s["b1"] + g * s["c1"]
    v = v_update(v, g, s)
    u = (m * s["a"]) / (_sqrt_rn(v) * s["r2"] + s["eps"])
    p32 = p.to(torch.float32).numpy() * s["decay"] - u
    return torch.from_numpy(p32).to(p.dtype), m, v


def _wide_state(n, seed, pdtype):
    """Random state over many binades, with subnormal, zero and huge gradients, so that
    every reordering of the per-element arithmetic changes some bits."""
    gen = torch.Generator().manual_seed(seed)
    p, g, m, v = state(n, seed, pdtype)
    g *= torch.exp2(torch.randint(-12, 12, (n,), generator=gen).float())
    g[:6] = torch.tensor([1e-40, -1e-39, 0.0, -0.0, 1e30, -3e-45])
    return p, g, m, v


def _v_alternatives(v, g, s):
    """Plausible rewrites of v's update that the reference must tell apart."""
    return {"g*(g*C2)": v * s["b2"] + g * (g * s["c2"]),
            "(C2*g)*g": v * s["b2"] + (s["c2"] * g) * g,
            "C2=f32(1-beta2)": v * s["b2"] + (g * g) * F32(1.0 - 0.95),
            "rounded once": (v.astype(np.float64) * np.float64(s["b2"])
                             + g.astype(np.float64) ** 2 * np.float64(s["c2"])).astype(F32)}


def _check_against_reference(backend, pdtype, n=3001):
    p, g, m, v = _wide_state(n, seed=4, pdtype=pdtype)
    ref_p, ref_m, ref_v = p.clone(), m.numpy().copy(), v.numpy().copy()
    gn = g.numpy()
    itype = torch.int16 if pdtype == torch.bfloat16 else torch.int32
    for step, lr, wd in STEPS:
        s = _scalars(step, lr, wd)
        with force(backend):
            adamw.adamw_step_(p, g, m, v, step, lr, wd)
        for name, alt in _v_alternatives(ref_v, gn, s).items():
            assert not np.array_equal(alt.view(np.int32), _v_documented(ref_v, gn, s)
                                      .view(np.int32)), f"inputs cannot tell {name} apart"
        ref_p, ref_m, ref_v = _reference_step(ref_p, gn, ref_m, ref_v, s)
        assert torch.equal(m.view(torch.int32), torch.from_numpy(ref_m).view(torch.int32)), step
        assert torch.equal(v.view(torch.int32), torch.from_numpy(ref_v).view(torch.int32)), step
        assert torch.equal(p.view(itype), ref_p.view(itype)), step


@pytest.mark.parametrize("pdtype", [torch.bfloat16, torch.float32])
def test_cpu_follows_the_documented_formula_bitwise(pdtype):
    _check_against_reference("cpu", pdtype)


@needs_triton
def test_triton_follows_the_documented_formula_bitwise():
    _check_against_reference("triton", torch.bfloat16, n=1500)


@needs_loops
@pytest.mark.parametrize("p_dtype", [torch.bfloat16, torch.float32])
def test_compiled_adamw_equals_the_torch_code(p_dtype, monkeypatch):
    """open1b_kernels.ops.adamw's CPU update by the compiled loop vs its torch code (the
    definition): the same parameter and moment bits, for bf16 and float32 parameters, over
    a size that splits into pieces, with zeros, subnormal and huge gradients (g * g
    overflows to inf), zero moments, a learning rate of 0 and a late step. NaN results
    (inf / inf) must agree in place; their payloads are outside the contract (the trainer
    refuses a non-finite gradient before its update)."""
    from open1b_kernels.ops import adamw

    g = torch.Generator().manual_seed(12)
    n = 3 * mathc.PARALLEL_MIN + 77
    p0 = (torch.randn(n, generator=g) * 0.05).to(p_dtype)
    grad = torch.randn(n, generator=g) * 1e-3
    grad[:6] = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 3e20, -2e25])
    m0 = torch.randn(n, generator=g) * 1e-4
    v0 = torch.rand(n, generator=g) * 1e-6
    m0[6:9], v0[6:9] = 0.0, 0.0
    for step, lr, wd in ((1, 3e-4, 0.1), (5000, 0.0, 0.0), (37, 1e-2, 0.1)):
        s = adamw.step_scalars(step, lr, wd)
        got = [t.clone() for t in (p0, m0, v0)]
        adamw.adamw_step_cpu_(got[0], grad, got[1], got[2], s)
        monkeypatch.setenv("OPEN1B_MATHC", "0")
        want = [t.clone() for t in (p0, m0, v0)]
        adamw.adamw_step_cpu_(want[0], grad, want[1], want[2], s)
        monkeypatch.setenv("OPEN1B_MATHC", "1")
        for a, b in zip(got, want):
            nan = torch.isnan(a.float())
            assert torch.equal(nan, torch.isnan(b.float()))
            bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
            assert torch.equal(a[~nan].view(bits), b[~nan].view(bits))
