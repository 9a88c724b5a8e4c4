"""The fused weight-codes pass (open1b_kernels/int8/weightcodes.py) gives the bits of the W8A8
linear's op-by-op definitions: weight_step, quantize and w_hat = rn(q_w * sw)."""
import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.int8 import linear
from open1b_kernels.int8.quantize import quantize_cpu
from open1b_kernels.int8.weightcodes import weight_codes_triton
from tests.kernels.support import needs_triton


@needs_triton
@pytest.mark.parametrize("k", [1, 7, 300, 4096, 5000, 9000])
def test_fused_codes_equal_the_definitions(k):
    g = torch.Generator().manual_seed(k)
    w = torch.randn(5, k, generator=g) * torch.exp(torch.randn(5, 1, generator=g) * 10)
    w[1] = 0.0                                       # a zero row: step 0, divided by 1
    w[2, ::3] *= 2.0**-130                           # bf16 subnormals
    w[3, 0] = 1e4 * w[3].abs().max()                 # one huge value: the others clip to 0
    w = w.to(torch.bfloat16)
    with force("triton"):
        sw, q, hat = weight_codes_triton(w, linear._inv_k(k), linear.TWO_OVER_SQRT127, True)
    with force("cpu"):
        want_sw = linear.weight_step(w)
    want_q = quantize_cpu(w, want_sw)
    assert torch.equal(sw.view(torch.int32), want_sw.view(torch.int32))
    assert torch.equal(q, want_q)
    assert torch.equal(hat.view(torch.int32),
                       (want_q.to(torch.float32) * want_sw.reshape(-1, 1)).view(torch.int32))


def test_refuses_other_dtypes():
    with pytest.raises(TypeError, match="bf16"):
        weight_codes_triton(torch.ones(2, 3), 1.0, 1.0)
