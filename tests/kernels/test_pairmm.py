"""The int16-pair GEMM (open1b_kernels/int8/_pairmm.c): the exact int32 product on every
shape, layout and extreme and the route that picks it (the same bits as the float route
through the linear: tests/kernels/test_int_gemm_guard.py, every route; through the LM
head, whose products run as wide int64 terms: tests/kernels/test_lmhead_pairs.py)."""
from __future__ import annotations


import pytest
import torch

from open1b_kernels.int8 import pairmm
from open1b_kernels.int8 import route as gemm_route

needs_pairs = pytest.mark.skipif(not pairmm.available(),
                                 reason="the pair GEMM needs x86-64 with AVX2 (and the build)")


def _exact(a, b):
    return torch.mm(a.to(torch.int64), b.to(torch.int64).t())


def _layouts(x):
    """x row-major and as a transposed view of a row-major copy (same values)."""
    return x, x.t().contiguous().t()


@needs_pairs
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 17), (6, 2, 16), (13, 1001, 33),
                                   (100, 2049, 70), (197, 2050, 35), (12, 4097, 48)])
def test_exact_on_awkward_shapes_and_both_layouts(m, k, n):
    # rows not a multiple of 6, columns not of 16, odd K, K across the 2,048-element block
    g = torch.Generator().manual_seed(m * 7 + k + n)
    a = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    want = _exact(a, b)
    for aa in _layouts(a):
        for bb in _layouts(b):
            got = pairmm.pair_mm(aa, bb)
            assert got.dtype == torch.int32 and torch.equal(got.to(torch.int64), want)


@needs_pairs
@pytest.mark.parametrize("va,vb", [(-128, -128), (127, -128), (-128, 127), (127, 127)])
def test_extremes_at_the_longest_contraction(va, vb):
    # -128 * -128 = 2^14 summed MAX_K times: 2^31 - 2^14, the largest int32 sum it must hold;
    # pairs of -128 * -128 are 2^15 (vpmaddwd saturates only at two -32768 products)
    k = pairmm.MAX_K
    a = torch.full((7, k), va, dtype=torch.int8)
    b = torch.full((17, k), vb, dtype=torch.int8)
    assert torch.equal(pairmm.pair_mm(a, b).to(torch.int64), _exact(a, b))


@needs_pairs
def test_the_thread_cut_does_not_change_the_bits(monkeypatch):
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-128, 128, (250, 3000), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (40, 3000), generator=g, dtype=torch.int8)
    one = pairmm.pair_mm(a, b).clone()
    # every range in pieces of one panel (a different cut of rows and of packing)
    monkeypatch.setattr(pairmm, "parallel", lambda fn, n, grain=1: [fn(i, i + 1, 1)
                                                                  for i in range(n)])
    assert torch.equal(pairmm.pair_mm(a, b), one)
    assert torch.equal(one.to(torch.int64), _exact(a, b))


@needs_pairs
def test_out_and_bad_arguments():
    a = torch.randint(-128, 128, (9, 5), dtype=torch.int8)
    b = torch.randint(-128, 128, (4, 5), dtype=torch.int8)
    out = torch.full((9, 4), 7, dtype=torch.int32)
    assert pairmm.pair_mm(a, b, out) is out and torch.equal(out.to(torch.int64), _exact(a, b))
    with pytest.raises(ValueError, match="contiguous int32"):
        pairmm.pair_mm(a, b, torch.empty((4, 9), dtype=torch.int32))
    with pytest.raises(ValueError, match="int8"):
        pairmm.pair_mm(a.to(torch.int16), b)
    with pytest.raises(ValueError, match="K = 0"):
        pairmm.pair_mm(a[:, :0], b[:, :0])
    with pytest.raises(ValueError, match="buffer"):       # the C side checks sizes too
        pairmm.LOOPS.product(torch.zeros(4, dtype=torch.int32).numpy(),
                             torch.zeros(4, dtype=torch.int32).numpy(),
                             torch.zeros(4, dtype=torch.int32).numpy(), 9, 4, 5, 0, 2)


@needs_pairs
def test_auto_picks_pairs_without_vnni_and_says_why(route, monkeypatch):
    monkeypatch.setattr(gemm_route, "cpu_flags", lambda: {"avx2", "fma"})
    route("auto")
    assert gemm_route.int_gemm_route() == "pairs"
    assert "AVX2" in gemm_route.int_gemm_status()["reason"]
    a = torch.randint(-128, 128, (30, 70), dtype=torch.int8)
    b = torch.randint(-128, 128, (20, 70), dtype=torch.int8)
    calls = []
    real = pairmm.pair_mm
    monkeypatch.setattr(pairmm, "pair_mm", lambda *x, **k: calls.append(1) or real(*x, **k))
    got = gemm_route.exact_int_mm_cpu(a, b)
    assert calls and torch.equal(got.to(torch.int64), _exact(a, b))


def test_pairs_unavailable_falls_back_to_float(route, monkeypatch):
    monkeypatch.setattr(pairmm, "available", lambda: False)
    route("pairs")
    assert gemm_route.int_gemm_route() == "float"
    assert "no AVX2 pair GEMM" in gemm_route.int_gemm_status()["reason"]


@needs_pairs
def test_blocks_of_larger_matrices_are_read_in_place():
    # a column block of a transposed view (the head's weight gradient) and a row-major
    # block with a longer row: read where they lie (no copy), the exact product either way
    g = torch.Generator().manual_seed(9)
    big = torch.randint(-128, 128, (300, 500), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (21, 77), generator=g, dtype=torch.int8)
    for a in (big.t()[40:123, 7:84], big[5:88, 100:177], big[5:88, 100:177].t().contiguous().t()):
        src, sl, sk = pairmm.source(a)
        assert (sl, sk) == a.stride()
        assert (src.untyped_storage().data_ptr() == big.untyped_storage().data_ptr() or
            a.is_contiguous() or a.t().is_contiguous())
        assert torch.equal(pairmm.pair_mm(a, b).to(torch.int64), _exact(a, b))
        assert torch.equal(pairmm.pair_mm(b, a).to(torch.int64), _exact(b, a))
    odd = big[::2, ::3][:50, :77]                    # no unit stride: a copy, still exact
    assert pairmm.source(odd)[1:] == (77, 1)
    assert torch.equal(pairmm.pair_mm(odd, b).to(torch.int64), _exact(odd, b))
