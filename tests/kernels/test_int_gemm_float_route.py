"""The CPU float route of the exact int8 GEMM (open1b_kernels/int8/route.py): one float32 GEMM
over the whole contraction where the operands' norms bound every partial sum below 2^24,
chunks of SGEMM_K where they do not - the exact integer product either way, through the
plain GEMM and the fused dequantization, for row-major and transposed operands."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import mathc
from open1b_kernels.int8 import gemm
from open1b_kernels.int8 import route as gemm_route


def _spy(monkeypatch) -> list[int]:
    """The contraction length of every float32 GEMM the route runs."""
    lengths: list[int] = []
    real = torch.mm

    def mm(a, b, *args, **kw):
        lengths.append(a.shape[1])
        return real(a, b, *args, **kw)

    monkeypatch.setattr(gemm_route.torch, "mm", mm)
    return lengths


def _operands(kind: str, m=24, k=2_500, n=19, seed=0):
    g = torch.Generator().manual_seed(seed)
    if kind == "moderate":      # quantized-like codes: |a| |b| ~ 2^21, below the bound
        return (torch.randint(-40, 41, (m, k), generator=g, dtype=torch.int8),
                torch.randint(-40, 41, (n, k), generator=g, dtype=torch.int8))
    if kind == "same sign":     # positive codes of 100-127: the sums pass 2^24 by k ~1,300
        return (torch.randint(100, 128, (m, k), generator=g, dtype=torch.int8),
                torch.randint(100, 128, (n, k), generator=g, dtype=torch.int8))
    # codes at +-127 in random signs: far above the bound, though their sums mostly cancel
    sa = torch.randint(0, 2, (m, k), generator=g) * 254 - 127
    sb = torch.randint(0, 2, (n, k), generator=g) * 254 - 127
    return sa.to(torch.int8), sb.to(torch.int8)


def _exact(a, b):
    return gemm_route._exact_ref(a, b)


@pytest.mark.parametrize("kind,one_gemm", [("moderate", True), ("extreme", False),
                                           ("same sign", False)])
@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_one_gemm_where_the_norms_allow_it_and_exact_everywhere(route, monkeypatch, kind,
                                                                 one_gemm, layout):
    route("float")
    a, b = _operands(kind)
    if layout == "transposed":                     # views of (K, M) and (K, N) storage
        a, b = a.t().contiguous().t(), b.t().contiguous().t()
    want = _exact(a, b)
    lengths = _spy(monkeypatch)
    got = gemm_route.exact_int_mm_cpu(a, b)
    assert lengths == ([2_500] if one_gemm else [1024, 1024, 452])
    assert torch.equal(got.to(torch.int64), want)


def test_the_bound_is_what_keeps_the_worst_case_exact(route, monkeypatch):
    # the forgery the norm check stops: one float32 GEMM over a contraction whose partial
    # sums pass 2^24 silently rounds - lifting the bound must give a wrong product
    route("float")
    a, b = _operands("same sign")
    monkeypatch.setattr(gemm_route, "ONE_GEMM_BOUND", 1 << 80)
    got = gemm_route.exact_int_mm_cpu(a, b)
    assert not torch.equal(got.to(torch.int64), _exact(a, b))


@pytest.mark.parametrize("kind", ["moderate", "extreme"])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_fused_dequantization_gives_the_int32_paths_bits(route, kind, out_dtype):
    route("float")
    a, b = _operands(kind, seed=3)
    g = torch.Generator().manual_seed(4)
    rs, cs = torch.rand(a.shape[0], generator=g) * 1e-3, torch.rand(b.shape[0], generator=g)
    got = gemm.exact_dequant_cpu(a, b, rs, cs, out_dtype)
    want = gemm.dequantize_cpu(_exact(a, b).to(torch.int32), rs, cs, out_dtype)
    assert torch.equal(got.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32))


def test_a_bound_exactly_at_the_limit_takes_the_chunks(route, monkeypatch):
    # |a| = |b| = 2^12 (4,096 codes of 64): |a| |b| = 2^24 is not below it
    route("float")
    a = torch.full((3, 4_096), 64, dtype=torch.int8)
    b = a.clone()
    for last, want_lengths in ((64, [1024] * 4), (63, [4_096])):     # 63: just below
        b[:, 0] = last
        want = _exact(a, b)
        lengths = _spy(monkeypatch)
        got = gemm_route.exact_int_mm_cpu(a, b)
        monkeypatch.undo()
        route("float")
        assert lengths == want_lengths
        assert torch.equal(got.to(torch.int64), want)


@pytest.mark.parametrize("by_rows", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (7, 300), (40, 70_000), (70_000, 3)])
def test_compiled_widening_and_sums_of_squares_equal_torch(by_rows, shape):
    if not mathc.available():
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(shape[0])
    x = torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    x[0, 0] = -128                                # the one square of 2^14
    out = torch.empty(shape, dtype=torch.float32)
    sq = gemm_route._widen_sq_compiled(x, out, by_rows)
    assert torch.equal(out, x.to(torch.float32))
    assert torch.equal(sq, x.to(torch.int64).square().sum(1 if by_rows else 0))
