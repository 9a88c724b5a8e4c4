"""LM head (Ozaki int8 slicing): bit parity of forward and both gradient GEMMs
(interpreter vs CPU reference), exact slicing, the stated error bound against float64,
the int32 -> int64 chunk flush, and the non-finite policy."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.ops import lmhead_float as fp
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops.lmhead import (lmhead_backward, lmhead_forward, ozaki_mm, ozaki_mm_cpu,
                            slice_rows_cpu)
from testkit.kernels.autograd import lmhead
from tests.kernels.support import needs_interpreter


def _case(m, k, v, seed, kind="normal"):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, k, generator=g)
    w = torch.randn(v, k, generator=g) * 0.02
    dl = torch.randn(m, v, generator=g) * 1e-4
    if kind == "wide":
        h = h * 10.0 ** torch.randint(-30, 10, (m, k), generator=g)
        h[0, :4] = torch.tensor([3e-39, -0.0, 1e30, 0.0])  # subnormal, signed zero, huge
        h[1] = 0.0  # an all-zero row
        w[2] = w[2] * 1e-38  # a row of tiny / subnormal weights
        dl[:, 0] = dl[:, 0] * 1e20
    return h.to(torch.bfloat16), w.to(torch.bfloat16), dl


def _bound(a: torch.Tensor, b: torch.Tensor, exact: torch.Tensor, slices: int) -> torch.Tensor:
    """|out - exact| <= K 2^-(7S-2) Sa Sb + 2^-24 |exact|, Sa = 2^(Ea - 126) (module doc)."""
    _, ea = slice_rows_cpu(a, slices)
    _, eb = slice_rows_cpu(b, slices)
    sa = torch.pow(2.0, ea.double() - 126)
    sb = torch.pow(2.0, eb.double() - 126)
    k_term = a.shape[1] * 2.0 ** -(7 * slices - 2)
    return k_term * sa[:, None] * sb[None, :] + 2.0**-24 * exact.abs()


@needs_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("m,k,v,kind,slices", [
    (33, 70, 45, "normal", 3), (16, 300, 100, "wide", 3), (1, 5, 3, "normal", 3),
    (20, 90, 37, "wide", 2),
])
def test_parity_forward_backward(m, k, v, kind, slices):
    h, w, dl = _case(m, k, v, m * k, kind)
    outs = {}
    for path in ("cpu", "triton"):
        with backend.force(path):
            outs[path] = (lmhead_forward(h, w, slices), *lmhead_backward(dl, h, w, slices))
    for name, ref, got in zip(("logits", "dh", "dw"), outs["cpu"], outs["triton"]):
        assert torch.equal(ref.view(torch.int32), got.view(torch.int32)), name


@needs_interpreter
def test_parity_across_chunk_flushes(monkeypatch):
    # a tiny K_CHUNK makes the kernel flush its int32 level accumulators into int64 often;
    # the exact integer result, hence the bits, must not change
    h, w, dl = _case(8, 200, 40, 3)
    with backend.force("cpu"):
        ref = lmhead_backward(dl, h, w)
    from open1b_kernels.ops import lmhead_triton as lmt
    monkeypatch.setattr(lmt, "K_CHUNK", 64)
    with backend.force("triton"):
        got = lmhead_backward(dl, h, w)
    with backend.force("cpu"):
        got_cpu = lmhead_backward(dl, h, w)
    for r, g, c in zip(ref, got, got_cpu):
        assert torch.equal(r.view(torch.int32), g.view(torch.int32))
        assert torch.equal(r.view(torch.int32), c.view(torch.int32))


@pytest.mark.parametrize("slices", [2, 3])
def test_slices_reconstruct_bf16_exactly(slices):
    # every bf16 element within 7S - 8 binades of its row maximum is represented exactly
    g = torch.Generator().manual_seed(1)
    sign = torch.randint(0, 2, (16, 64), generator=g) * 2.0 - 1.0
    span = 7 * slices - 8
    binade = 2.0 ** torch.randint(-span + 1, 1, (16, 64), generator=g)
    x = (sign * (1.0 + torch.rand(16, 64, generator=g)) * binade).to(torch.bfloat16)
    x[:, 0] = 1.5  # the row maximum's binade is 0
    s, e = slice_rows_cpu(x, slices)
    assert s.shape[0] == slices and s.abs().max() <= 127
    mag = sum(s[i].long() * 2 ** (7 * (slices - 1 - i)) for i in range(slices))
    back = mag.double() * torch.pow(2.0, e.double() - 126 - 7 * slices)[:, None]
    assert torch.equal(back, x.double())


@pytest.mark.parametrize("kind,slices", [("normal", 3), ("wide", 3), ("normal", 2),
                                         ("wide", 2)])
def test_error_bound_vs_float64(kind, slices):
    h, w, dl = _case(24, 256, 80, 5, kind)
    logits = lmhead_forward(h, w, slices).double()
    dh, dw = lmhead_backward(dl, h, w, slices)
    for got, a, b in ((logits, h, w), (dh, dl, w.t()), (dw, dl.t(), h.t())):
        exact = a.double() @ b.double().t()
        finite = exact.abs() < 2.0**127  # beyond float32's range the result is +-inf
        assert torch.isinf(got[~finite]).all()
        assert ((got.double() - exact).abs() <= _bound(a, b, exact, slices))[finite].all()
    if kind == "normal":  # typical relative error, far inside the bound
        exact = h.double() @ w.double().t()
        rel = ((logits - exact).norm() / exact.norm()).item()
        assert rel < (1e-6 if slices == 3 else 2e-3)


def test_non_finite_rows_give_nan_rows():
    h, w, _ = _case(4, 16, 6, 2)
    h[1, 3] = float("inf")
    w[4, 0] = float("nan")
    out = ozaki_mm_cpu(h, w)
    bad = torch.zeros_like(out, dtype=torch.bool)
    bad[1, :] = True
    bad[:, 4] = True
    assert torch.equal(torch.isnan(out), bad)


def test_autograd_wrapper_matches_functional():
    h, w, dl = _case(6, 32, 10, 7)
    h3 = h.reshape(2, 3, 32).clone().requires_grad_(True)
    wp = w.clone().requires_grad_(True)
    logits = lmhead(h3, wp, 3)
    logits.backward(dl.reshape(2, 3, 10))
    dh, dw = lmhead_backward(dl, h, w)
    assert torch.equal(logits.reshape(6, 10), lmhead_forward(h, w))
    assert torch.equal(h3.grad.reshape(6, 32), dh.to(torch.bfloat16))
    assert torch.equal(wp.grad, dw.to(torch.bfloat16))


def test_rejects_bad_operands():
    with pytest.raises(ValueError, match="same K"):
        ozaki_mm(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(TypeError):
        ozaki_mm(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="slices"):
        ozaki_mm(torch.zeros(2, 3), torch.zeros(2, 3), slices=4)


@pytest.mark.parametrize("kind", ["normal", "wide", "extreme"])
def test_cpu_two_gemm_form_equals_the_six_products(monkeypatch, kind):
    # S = 3 on the CPU computes T as a float64 GEMM of 14-bit heads plus one float32 GEMM
    # of two slice pairs; it must give the bits of the six slice products level by level,
    # across row and column blocks and SGEMM_K chunks (small blocks force all of them)
    if kind == "extreme":   # every slice at +-127: the largest |T| per contraction step
        g = torch.Generator().manual_seed(7)
        sgn = torch.randint(0, 2, (40, 2500), generator=g) * 2.0 - 1.0
        h = (sgn * (2.0 - 2.0 ** -7)).to(torch.bfloat16)
        w = (-sgn[:23] * (2.0 - 2.0 ** -7)).to(torch.bfloat16)
        dl = torch.randn(40, 23, generator=g)
    else:
        h, w, dl = _case(40, 2500, 23, 11, kind)
    monkeypatch.setattr(fp, "ROW_BLOCK", 16)
    monkeypatch.setattr(fp, "COL_BLOCK", 8)
    outs = {}
    for two in (True, False):
        monkeypatch.setattr(lm, "CPU_S3_TWO_GEMMS", two)
        with backend.force("cpu"):
            outs[two] = (lmhead_forward(h, w, 3), *lmhead_backward(dl, h, w, 3))
    for name, a, b in zip(("logits", "dh", "dw"), outs[True], outs[False]):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name
