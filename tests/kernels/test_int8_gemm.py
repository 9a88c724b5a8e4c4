"""int8 GEMM: exact integer results, bit parity of the Triton kernel (interpreter) with the
CPU reference, the int32 bound, and the dequantization epilogue's roundings."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.int8.gemm import MAX_K, bf16_rne, int8_mm, int8_mm_cpu
from tests.kernels.support import bits, needs_interpreter
from tests.kernels.support import needs_loops
from open1b_kernels.int8.gemm import _dequant_compiled


def _ints(shape, g, lo=-128, hi=128):
    return torch.randint(lo, hi, shape, dtype=torch.int8, generator=g)


def _both(*args, **kw):
    with backend.force("cpu"):
        ref = int8_mm(*args, **kw)
    with backend.force("triton"):
        got = int8_mm(*args, **kw)
    return ref, got


@needs_interpreter
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (37, 129, 45), (64, 64, 64), (3, 300, 5),
                                   (7, 1, 5)])
def test_parity_int32_and_dequant(m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k)
    a, b = _ints((m, k), g), _ints((n, k), g)
    ref, got = _both(a, b)
    assert torch.equal(ref, got)
    assert torch.equal(ref.long(), a.long() @ b.long().t())
    # scales spanning tiny (subnormal products), ordinary and huge magnitudes
    rs = torch.rand(m, generator=g) * torch.tensor([1e-41, 1.0, 1e30])[torch.arange(m) % 3]
    cs = torch.rand(n, generator=g) + 0.5
    for out in (torch.float32, torch.bfloat16):
        ref, got = _both(a, b, rs, cs, out)
        assert torch.equal(bits(ref), bits(got)), out
    ref, got = _both(a, b, torch.tensor([0.37]), cs, torch.bfloat16)  # per-tensor row scale
    assert torch.equal(bits(ref), bits(got))


@needs_interpreter
def test_parity_strided_operands():
    g = torch.Generator().manual_seed(7)
    a, b = _ints((40, 70), g), _ints((70, 33), g)  # b^T is a transposed view
    ref, got = _both(a.t().contiguous().t(), b.t())
    assert torch.equal(ref, got)
    assert torch.equal(ref.long(), a.long() @ b.long())


def test_cpu_is_exact_at_the_k_bound():
    a = torch.full((1, MAX_K), -128, dtype=torch.int8)
    acc = int8_mm_cpu(a, a)
    assert acc.item() == MAX_K * 128 * 128 <= 2**31 - 1
    with pytest.raises(ValueError, match="MAX_K"):
        int8_mm_cpu(torch.zeros((1, MAX_K + 1), dtype=torch.int8),
                    torch.zeros((1, MAX_K + 1), dtype=torch.int8))


@pytest.mark.parametrize("path", ["cpu", pytest.param("triton", marks=needs_interpreter)])
def test_int32_to_fp32_conversion_rounds_to_nearest_even(path):
    # K = 2,048 products of 127 * 127 (plus odd offsets) give |acc| > 2^24 with low bits set:
    # float(acc) must be the round-to-nearest-even value on both paths.
    g = torch.Generator().manual_seed(3)
    a = torch.full((8, 2048), 127, dtype=torch.int8)
    a[:, :5] = _ints((8, 5), g)
    b = torch.full((6, 2048), 127, dtype=torch.int8)
    b[:, -3:] = _ints((6, 3), g)
    b[1] = -b[1]
    one = torch.ones(8), torch.ones(6)
    with backend.force(path):
        acc = int8_mm(a, b)
        y = int8_mm(a, b, *one, torch.float32)
    assert (acc.abs() > 2**24).all() and (acc % 2 == 1).any()
    # float64 holds acc exactly, and float64 -> float32 rounds once, to nearest even
    assert torch.equal(y, acc.to(torch.float64).to(torch.float32))


def test_bf16_rne_matches_torch_on_finite_values():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4096, generator=g) * 10.0 ** torch.randint(-40, 38, (4096,), generator=g)
    ties = (torch.randint(0, 2**15, (512,), generator=g) << 16 | 0x8000).to(torch.int32)
    x = torch.cat([x, ties.view(torch.float32), torch.tensor([3.4e38, -3.4e38, 1e-45, -0.0])])
    x = x[torch.isfinite(x)]
    assert torch.equal(bits(bf16_rne(x)), bits(x.to(torch.bfloat16)))


def test_dequant_accuracy_vs_float64():
    # three roundings (conversion, two multiplies): relative error <= 3 * 2^-24 (+ O(eps^2))
    g = torch.Generator().manual_seed(11)
    a, b = _ints((50, 3000), g), _ints((20, 3000), g)
    rs, cs = torch.rand(50, generator=g) + 0.1, torch.rand(20, generator=g) + 0.1
    y = int8_mm_cpu(a, b, rs, cs, torch.float32).double()
    exact = (a.double() @ b.double().t()) * rs.double()[:, None] * cs.double()[None, :]
    assert ((y - exact).abs() <= 3.0001 * 2.0**-24 * exact.abs()).all()


def test_rejects_bad_arguments():
    a = torch.zeros((2, 3), dtype=torch.int8)
    with pytest.raises(TypeError):
        int8_mm(a.float(), a)
    with pytest.raises(ValueError, match="same K"):
        int8_mm(a, torch.zeros((2, 4), dtype=torch.int8))
    with pytest.raises(ValueError, match="scales"):
        int8_mm(a, a, out_dtype=torch.float32)


@needs_loops
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_row", [True, False])
def test_compiled_dequantization_equals_torch(out_dtype, per_row):
    """open1b_kernels.int8.gemm's dequantization (int32 -> float32 rounded, two float32 multiplies,
    bf16 rounding) and the guard's sums from the same pass, against the torch code - int32
    extremes (conversion rounds above 2^24), scales that overflow to inf and underflow to
    subnormals and zero, a zero scale - on shapes that split among threads."""
    from open1b_kernels.int8.checksum import row_col_sums
    from open1b_kernels.int8.gemm import dequantize_cpu

    g = torch.Generator().manual_seed(8)
    acc = torch.randint(-2**31, 2**31 - 1, (301, 1200), generator=g,
                        dtype=torch.int64).to(torch.int32)
    acc[0], acc[1, :7] = 2**31 - 1, torch.tensor([-2**31, 16777217, -16777219, 1, 0, -1, 3])
    rs = torch.rand(301 if per_row else 1, generator=g) * 1e-3
    cs = torch.rand(1200, generator=g) * 1e-4
    cs[:4] = torch.tensor([1e30, 1e-30, 0.0, 3.0e-39])
    if per_row:
        rs[5] = 1e-38
    out = torch.empty(acc.shape, dtype=out_dtype)
    sums = _dequant_compiled(acc, rs, cs, out, sums=True)
    want = dequantize_cpu(acc, rs, cs, out_dtype)
    bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out.view(bits), want.view(bits))
    assert all(torch.equal(a, b) for a, b in zip(sums, row_col_sums(acc)))
    out2 = torch.empty(acc.shape, dtype=out_dtype)
    assert _dequant_compiled(acc, rs, cs, out2, sums=False) == ()
    assert torch.equal(out2.view(bits), want.view(bits))
    assert _dequant_compiled(acc.t(), rs, cs, out2, sums=False) is None   # not contiguous
