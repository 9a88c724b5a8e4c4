"""rounding.py: sqrt_rn is the correctly rounded float32 root; the conversions that moved
here from mathfn stay importable there. (The bf16 tie rounding of ``to_bf16_tl`` is tested
in test_mathfn.py and, through every op's parity test, everywhere.)"""
import numpy as np
import torch

from open1b_kernels.core import mathfn, rounding


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
