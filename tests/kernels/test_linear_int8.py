"""W8A8 linear: bit parity of forward and backward (interpreter vs CPU reference), the
exactly specified constants and dequantization, and accuracy against float64."""
from __future__ import annotations

import math
import re
import struct
from decimal import Decimal, getcontext

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.int8.gemm import bf16_rne
from open1b_kernels.int8.hadamard import padded_width
from open1b_kernels.int8.gemm import MAX_K
from open1b_kernels.int8.linear import (HADAMARD_BLOCK, INV_127, MAX_TOKENS, TWO_OVER_SQRT127,
                                 linear_int8_backward, linear_int8_forward, quantize_cpu,
                                 weight_step)
from testkit.kernels.autograd import linear_int8
from tests.kernels.support import bits, needs_interpreter


def _case(m, k, n, seed, kind="normal"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g) * 0.02
    dy = torch.randn(m, n, generator=g)
    if kind == "extreme":
        x[0] = x[0] * 1e-39  # subnormal activations
        x[1] = x[1] * 50.0  # far beyond the clip range
        w[0] = 0.0  # zero weight row: step 0, codes 0
        w[1, 1:] = 1e-30  # one outlier: clipped weight codes
        dy[2] = dy[2] * 1e-30
    step = torch.tensor([3.0 / 127])
    if kind == "tiny":  # subnormal activations and step: codes, products, dw all tiny
        x = x * 1e-38
        step = torch.tensor([3e-38 / 127])
    return x.to(torch.bfloat16), w.to(torch.bfloat16), step, dy.to(torch.bfloat16)


def test_constants_are_correctly_rounded():
    getcontext().prec = 60
    for value, exact in ((TWO_OVER_SQRT127, Decimal(2) / Decimal(127).sqrt()),
                         (INV_127, Decimal(1) / Decimal(127))):
        f = torch.tensor(value, dtype=torch.float32)
        assert float(f) == value  # float32-exact literal
        lo, hi = torch.nextafter(f, torch.tensor(0.0)), torch.nextafter(f, torch.tensor(1.0))
        err = abs(Decimal(value) - exact)
        assert err < abs(Decimal(float(lo)) - exact) and err < abs(Decimal(float(hi)) - exact)
    assert struct.unpack("<I", struct.pack("<f", TWO_OVER_SQRT127))[0] == 0x3E35BB09


@needs_interpreter
@pytest.mark.parametrize("m,k,n,kind", [(33, 70, 45, "normal"), (20, 300, 17, "extreme"),
                                        (5, 16, 260, "normal"), (18, 40, 24, "tiny"),
                                        # K a multiple of the tile: the fused STE GEMM
                                        # (open1b_kernels/int8/stegemm.py)
                                        (37, 64, 29, "normal"), (20, 96, 40, "extreme"),
                                        (18, 32, 24, "tiny")])
def test_parity_forward_backward(m, k, n, kind):
    x, w, s, dy = _case(m, k, n, m + k + n, kind)
    outs = {}
    for path in ("cpu", "triton"):
        with backend.force(path):
            outs[path] = (linear_int8_forward(x, w, s), *linear_int8_backward(dy, x, w, s))
    for name, ref, got in zip(("y", "dx", "dw", "ds"), outs["cpu"], outs["triton"]):
        assert ref.dtype == got.dtype and ref.shape == got.shape, name
        assert torch.equal(bits(ref), bits(got)), name


def test_forward_is_the_specified_dequantization():
    x, w, s, _ = _case(40, 96, 24, 1)
    sw = weight_step(w)
    acc = quantize_cpu(x, s).long() @ quantize_cpu(w, sw).long().t()  # exact, int64
    spec = bf16_rne((acc.to(torch.float64).to(torch.float32) * s) * sw[None, :])
    assert torch.equal(bits(linear_int8_forward(x, w, s)), bits(spec))
    # the weight step: 2 * mean|w| / sqrt(127), within 3 roundings of the exact value
    exact = 2 * w.double().abs().mean(1) / math.sqrt(127)
    assert ((sw.double() - exact).abs() <= 4 * 2.0**-24 * exact).all()


def _references(x, w, s, dy):
    """float64 STE/LSQ references built from the quantized operands."""
    sw = weight_step(w)
    x_hat = quantize_cpu(x, s).double() * s.double()
    w_hat = quantize_cpu(w, sw).double() * sw.double()[:, None]
    v = x.float() / s  # the contract's float32 quotient decides the clip range
    inside = (v >= -127) & (v <= 127)
    vw = w.float() / torch.where(sw == 0, 1.0, sw)[:, None]
    dx_hat = dy.double() @ w_hat
    t = torch.where(inside, torch.round(v.clamp(-127, 127)) - v, v.clamp(-127, 127)).double()
    g = 1.0 / math.sqrt(x.numel() * 127)
    return {"y": x_hat @ w_hat.t(), "dx": dx_hat * inside,
            "dw": (dy.double().t() @ x_hat) * ((vw >= -127) & (vw <= 127)),
            "ds": g * (dx_hat * t).sum(), "ds_l1": g * (dx_hat * t).abs().sum()}


def test_accuracy_vs_float64():
    x, w, s, dy = _case(256, 512, 384, 9)
    y = linear_int8_forward(x, w, s)
    dx, dw, ds = linear_int8_backward(dy, x, w, s)
    ref = _references(x, w, s, dy)
    # forward: exact integer GEMM, then 3 float32 roundings and one bf16 rounding (the
    # absolute term covers the float64 reference's own rounding where acc == 0)
    assert ((y.double() - ref["y"]).abs() <= 2.0**-8 * ref["y"].abs() + 1e-12).all()

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()
    # int8 gradients after the Hadamard rotation: ~1-2% relative (Frobenius) error
    assert rel(dx, ref["dx"]) < 0.03
    assert rel(dw, ref["dw"]) < 0.02
    assert abs(ds.item() - ref["ds"].item()) < 0.01 * ref["ds_l1"].item()


def _q_rows(t):  # per-row absmax int8 without rotation, float64 dequantized
    step = t.abs().amax(1, keepdim=True) / 127
    return torch.round(t / step).clamp(-127, 127) * step


def test_rotation_beats_plain_int8_with_outliers():
    # Outliers along a GEMM's contraction dimension inflate every per-row int8 step; the
    # Hadamard rotation spreads them over the block. dX contracts over output channels
    # (outlier channels in dy), dW over tokens (outlier tokens in dy).
    x, w, s, dy = _case(128, 256, 64, 4)
    dy = dy.float()
    dy[:, :3] *= 30.0
    dy[:2, :] *= 30.0
    dy = dy.to(torch.bfloat16)
    dx, dw, _ = linear_int8_backward(dy, x, w, s)
    ref = _references(x, w, s, dy)
    sw = weight_step(w)
    v = x.float() / s
    w_hat = quantize_cpu(w, sw).double() * sw.double()[:, None]
    x_hat = quantize_cpu(x, s).double() * s.double()
    plain_dx = (_q_rows(dy.double()) @ _q_rows(w_hat.t()).t()) * ((v >= -127) & (v <= 127))
    plain_dw = _q_rows(dy.double().t()) @ _q_rows(x_hat.t()).t()
    assert (dx.double() - ref["dx"]).norm() < 0.6 * (plain_dx - ref["dx"]).norm()
    assert (dw.double() - ref["dw"]).norm() < 0.5 * (plain_dw - ref["dw"]).norm()


def test_autograd_wrapper_matches_functional():
    x, w, s, dy = _case(24, 64, 32, 3)
    x3 = x.reshape(2, 12, 64).clone().requires_grad_(True)
    wp = w.clone().requires_grad_(True)
    sp = s.clone().requires_grad_(True)
    y = linear_int8(x3, wp, sp)
    y.backward(dy.reshape(2, 12, 32))
    dx, dw, ds = linear_int8_backward(dy, x, w, s)
    assert torch.equal(bits(y.reshape(24, 32)), bits(linear_int8_forward(x, w, s)))
    assert torch.equal(bits(x3.grad.reshape(24, 64)), bits(dx))
    assert torch.equal(bits(wp.grad), bits(dw.to(torch.bfloat16)))
    assert torch.equal(bits(sp.grad), bits(ds))


def test_rejects_bad_step():
    x, w, _, _ = _case(4, 8, 4, 0)
    with pytest.raises(ValueError, match="s_x"):
        linear_int8_forward(x, w, torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize("path", ["cpu", pytest.param("triton", marks=needs_interpreter)])
def test_token_limit_is_one_check_with_one_message_on_both_paths(path):
    # the largest M whose rotation padding keeps the dW contraction within the int8 GEMM
    assert padded_width(MAX_TOKENS, HADAMARD_BLOCK) <= MAX_K
    assert padded_width(MAX_TOKENS + 1, HADAMARD_BLOCK) > MAX_K
    m = MAX_TOKENS + 1
    x, w = torch.zeros(m, 16, dtype=torch.bfloat16), torch.ones(16, 16, dtype=torch.bfloat16)
    s, dy = torch.tensor([1.0]), torch.zeros(m, 16, dtype=torch.bfloat16)
    msg = re.escape(f"{m} tokens > MAX_TOKENS = {MAX_TOKENS}")
    with backend.force(path):
        with pytest.raises(ValueError, match=msg):
            linear_int8_forward(x, w, s)
        with pytest.raises(ValueError, match=msg):
            linear_int8_backward(dy, x, w, s)
        with pytest.raises(ValueError, match=msg):
            linear_int8(x.reshape(1, m, 16), w, s)


def test_the_token_limit_itself_is_accepted():
    m = MAX_TOKENS  # the forward passes the same _check as the backward, at a fraction of its cost
    x = torch.randn(m, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    w, s = torch.ones(16, 16, dtype=torch.bfloat16), torch.tensor([3.0 / 127])
    with backend.force("cpu"):
        assert linear_int8_forward(x, w, s).shape == (m, 16)
