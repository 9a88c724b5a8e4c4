"""The fused dX GEMM + STE epilogue (open1b_kernels/int8/stegemm.py) gives the bits of the
op-by-op form: int8_mm's dequantization, ste.ste, and the tree of the LSQ term."""
import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.core.reduce import tree_sum
from open1b_kernels.int8 import stegemm
from open1b_kernels.int8.gemm import int8_mm
from open1b_kernels.int8.ste import ste
from tests.kernels.support import bits, needs_triton


def _case(m, k, np_, seed):
    g = torch.Generator().manual_seed(seed)
    qa = torch.randint(-127, 128, (m, np_), generator=g, dtype=torch.int8)
    qb = torch.randint(-127, 128, (k, np_), generator=g, dtype=torch.int8)
    sa = torch.rand(m, generator=g) * 1e-3
    sb = torch.rand(k, generator=g) * 1e-2
    x = (torch.randn(m, k, generator=g) * 3).to(torch.bfloat16)
    x[0, :5] = torch.tensor([-0.0, 0.0, 1e4, -1e4, 2.0**-130])   # signed zeros, clipped, tiny
    sa[1] = 0.0                                                  # a zero row: -0.0 terms
    return qa, qb, sa, sb, x, torch.tensor([4.0 / 127])


@needs_triton
@pytest.mark.parametrize("m,k,np_", [(37, 64, 70), (5, 32, 256), (64, 96, 33)])
def test_fused_equals_the_op_by_op_form(m, k, np_):
    qa, qb, sa, sb, x, sx = _case(m, k, np_, m + k)
    with force("triton"):
        dx, total = stegemm.ste_gemm(qa, qb, sa, sb, x, sx)
        dx_hat = int8_mm(qa, qb, sa, sb, torch.float32)
        want_dx, term = ste(dx_hat, x, sx, want_term=True, out_bf16=True)
        want = tree_sum(term.reshape(-1), 0)
    assert torch.equal(bits(dx), bits(want_dx))
    assert torch.equal(bits(total), bits(want))


def test_refuses_a_width_that_is_not_a_multiple_of_the_tile():
    qa, qb, sa, sb, x, sx = _case(3, 33, 8, 0)
    assert not stegemm.fits(3, 33)
    with pytest.raises(ValueError, match="multiple of the tile width"):
        stegemm.ste_gemm(qa, qb, sa, sb, x, sx)
