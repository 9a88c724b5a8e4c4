"""rounding.py: sqrt_rn is the correctly rounded float32 root; the conversions that moved
here from mathfn stay importable there. (The bf16 tie rounding of ``to_bf16_tl`` is tested
in test_mathfn.py and, through every op's parity test, everywhere.)"""
import numpy as np
import pytest
import torch

from open1b_kernels.core import mathfn, rounding
from tests.kernels.support import needs_loops


def test_sqrt_rn_is_correctly_rounded():
    g = torch.Generator().manual_seed(4)
    x = torch.cat([torch.randint(0, 0x7F800000, (200_000,), generator=g, dtype=torch.int32)
                   .view(torch.float32),  # every binade, subnormals included
                   torch.tensor([1.0, 2.0, 4.0, 1e-45, 3.4028235e38])])
    y = rounding.sqrt_rn(x).numpy().astype(np.float64)
    ulp = np.spacing(y.astype(np.float32)).astype(np.float64)
    # the midpoints y -+ ulp/2 have 25 significant bits: their squares are exact in float64
    lo, hi = (y - ulp / 2) ** 2, (y + ulp / 2) ** 2
    xd = x.numpy().astype(np.float64)
    assert ((lo <= xd) & (xd <= hi)).all()
    assert rounding.sqrt_rn(torch.tensor([0.0, -0.0])).view(torch.int32).tolist() == [0, -2**31]
    assert torch.isnan(rounding.sqrt_rn(torch.tensor([-1.0]))).all()


def test_the_conversions_stay_importable_from_mathfn():
    names = ["sqrt_rn"] + (["to_bf16_tl", "widen_tl", "cast_tl"] if rounding.HAVE_TRITON else [])
    for name in names:
        assert getattr(mathfn, name) is getattr(rounding, name), name


@needs_loops
@pytest.mark.parametrize("n_ops", [2, 3])
def test_compiled_bf16_add_equals_the_torch_code(n_ops, monkeypatch):
    """rounding.add_bf16 (the model's residual adds) by the compiled loop against its torch
    code: rounding ties both ways, subnormal sums, overflow to inf, inf - inf, signed zeros
    (-0 + -0 = -0, -0 + +0 = +0), NaN positions; and the model's function is this one."""
    from open1b_train import model
    assert model.add_bf16 is rounding.add_bf16
    g = torch.Generator().manual_seed(12)
    xs = [(torch.randn(3, 1000, generator=g) * torch.exp(torch.randn(3, 1000, generator=g) * 4))
          .to(torch.bfloat16) for _ in range(n_ops)]
    specials = [(1.0, 2.0 ** -8), (1.0, 3 * 2.0 ** -9), (1e-39, 1e-39), (3e38, 3e38),
                (float("inf"), float("-inf")), (-0.0, -0.0), (-0.0, 0.0), (float("nan"), 1.0),
                (-1e-40, 1e-40), (1.0 + 2.0 ** -7, 2.0 ** -8)]
    for i, (a, b) in enumerate(specials):
        xs[0][0, i], xs[1][0, i] = a, b
        if n_ops == 3:
            xs[2][0, i] = 0.0 if i != 5 else -0.0
    want = xs[0].float()
    for x in xs[1:]:
        want = want + x.float()
    want = want.to(torch.bfloat16)
    got = rounding._add_bf16_compiled(xs)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.equal(rounding.add_bf16(*xs)[~nan].view(torch.int16),
                       want[~nan].view(torch.int16))
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    assert rounding._add_bf16_compiled(xs) is None
    assert torch.equal(rounding.add_bf16(*xs)[~nan].view(torch.int16),
                       want[~nan].view(torch.int16))
