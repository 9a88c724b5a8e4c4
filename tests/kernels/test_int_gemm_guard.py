"""The exactness guard of the CPU integer GEMM route (open1b_kernels/int8/route.py).

A platform whose int8 GEMM is not exact - here emulated: oneDNN's AVX2 s8 x s8 scheme
without VNNI, a shifted to u8 and vpmaddubsw's saturating int16 pair sums - must be caught
by the start-up probe (or, for a fault the probe misses, by the per-result checksum), the
process must fall back to the float route naming the platform and the failing case, and
every result must still be the exact integer product.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.int8 import checksum, gemm, pairmm
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.int8.linear import linear_int8_backward, linear_int8_forward


def saturating_int_mm(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """int8 GEMM as vpmaddubsw computes it: (a + 128) as u8 times b as s8, adjacent
    products summed in *saturating* int16, then int32 sums, minus the 128 * sum(b)
    compensation."""
    b = b_t.t().to(torch.int32)                     # (N, K)
    k = a.shape[1]
    au = a.to(torch.int32) + 128
    if k % 2:
        au = torch.nn.functional.pad(au, (0, 1))
        b = torch.nn.functional.pad(b, (0, 1))
    out = torch.empty((a.shape[0], b.shape[0]), dtype=torch.int32)
    comp = 128 * b.sum(1)
    for m in range(a.shape[0]):
        pairs = (au[m][None, :] * b).view(b.shape[0], -1, 2).sum(-1)
        out[m] = pairs.clamp_(-32768, 32767).sum(-1) - comp
    return out


def _operands(m=37, k=2_100, n=29, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    return a, b


def test_the_emulation_is_wrong_where_real_hardware_would_be():
    a = torch.full((2, 64), 127, dtype=torch.int8)
    got = saturating_int_mm(a, a.t())
    assert int(got[0, 0]) != 64 * 127 * 127                         # saturated
    small = torch.full((2, 64), 3, dtype=torch.int8)
    assert int(saturating_int_mm(small, small.t())[0, 0]) == 64 * 9  # fine when small


def test_probe_passes_an_exact_gemm_and_names_the_failing_case():
    assert gemm_route.probe_int_mm(lambda a, bt: gemm_route._exact_ref(a, bt.t()).to(torch.int32)) is None
    bad = gemm_route.probe_int_mm(saturating_int_mm)
    assert bad is not None and "127" in bad and "exact" in bad


def test_probe_on_this_platform_is_exact_or_refused():
    # whatever the library does here, the guard's verdict is a decision, never a wrong result
    verdict = gemm_route.probe_int_mm()
    assert verdict is None or isinstance(verdict, str)


def test_faulty_platform_falls_back_at_start_up_with_exact_results(route):
    route("int", saturating_int_mm)
    a, b = _operands()
    with pytest.warns(RuntimeWarning, match="not exact on .*probe failed - all 127 x all 127"):
        got = gemm_route.exact_int_mm_cpu(a, b)
    assert gemm_route.int_gemm_status()["route"] == "float"
    assert torch.equal(got.long(), gemm_route._exact_ref(a, b))


def test_a_fault_the_probe_misses_is_caught_by_the_checksum(route):
    def faulty_on_large(a, bt):           # exact on the probe's shapes, one wrong element on
        out = gemm_route._exact_ref(a, bt.t()).to(torch.int32)     # the larger ones
        if a.shape[0] >= 40:
            out[3, 5] += 1
        return out

    route("int", faulty_on_large)
    a, b = _operands(m=48)
    assert gemm_route.int_gemm_route() == "int"                    # the probe passed
    with pytest.warns(RuntimeWarning, match="checksum failed on a 48x2100x29 GEMM"):
        got = gemm_route.exact_int_mm_cpu(a, b)
    assert torch.equal(got.long(), gemm_route._exact_ref(a, b))
    assert gemm_route.int_gemm_status() | {"reason": ""} == gemm_route.int_gemm_status() | {
        "route": "float", "failures": 1, "reason": ""}


@pytest.mark.parametrize("fault", ["one element", "cancelling in a row"])
def test_a_fault_is_caught_in_the_fused_dequantization(route, fault):
    # the int route's check sums come from the dequantization's own pass
    # (``exact_dequant_cpu``): a wrong element, and a pair that leaves every row sum intact,
    # are caught there, counted, and the result recomputed on the float route
    a, b = _operands(m=48)
    rs, cs = torch.rand(48) * 1e-3, torch.rand(29) * 1e-2
    route("float")
    want = gemm.int8_mm_cpu(a, b, rs, cs, torch.bfloat16)

    def faulty_on_large(a, bt):
        out = gemm_route._exact_ref(a, bt.t()).to(torch.int32)
        if a.shape[0] >= 40:
            out[3, 5] += 1
            if fault == "cancelling in a row":
                out[3, 6] -= 1
        return out

    route("int", faulty_on_large)
    assert gemm_route.int_gemm_route() == "int"
    with pytest.warns(RuntimeWarning, match="checksum failed on a 48x2100x29 GEMM"):
        got = gemm.int8_mm_cpu(a, b, rs, cs, torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert gemm_route.int_gemm_status()["route"] == "float"
    assert gemm_route.int_gemm_status()["failures"] == 1


def test_routes_give_the_same_bits_through_the_linear(route, monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(70, 300, generator=g).to(torch.bfloat16)
    w = (torch.randn(90, 300, generator=g) * 0.02).to(torch.bfloat16)
    dy = (torch.randn(70, 90, generator=g) * 1e-3).to(torch.bfloat16)
    s = torch.tensor([4.0 / 127])
    outs = {}
    exact = lambda a, bt: gemm_route._exact_ref(a, bt.t()).to(torch.int32)  # noqa: E731
    routes = [("float", None), ("int", exact)] + ([("pairs", None)] if pairmm.available() else [])
    pair_calls = []
    real = pairmm.pair_mm
    monkeypatch.setattr(pairmm, "pair_mm", lambda *a, **k: pair_calls.append(1) or real(*a, **k))
    for which, mm in routes:
        route(which, mm)
        with force("cpu"), warnings.catch_warnings():
            warnings.simplefilter("error")
            outs[which] = (linear_int8_forward(x, w, s), *linear_int8_backward(dy, x, w, s))
        assert gemm_route.int_gemm_route() == which
    # the pair route, where this CPU runs it, ran forward, dX and dW on the pair GEMM
    assert len(pair_calls) >= (3 if pairmm.available() else 0)
    for which, _ in routes[1:]:
        for f, i in zip(outs["float"], outs[which]):
            assert torch.equal(f.view(-1).view(torch.int16 if f.dtype == torch.bfloat16
                                               else torch.int32),
                               i.view(-1).view(torch.int16 if i.dtype == torch.bfloat16
                                               else torch.int32))


def test_unknown_route_is_refused(route):
    route("fast")
    with pytest.raises(ValueError, match="auto, amx, int, pairs, float"):
        gemm_route.int_gemm_route()


def _dw_case(seed=5):
    """Operands of the weight gradient's slab loop: codes (N, Mp) and (Mp, K) as the linear
    passes them, small slabs so that there are several."""
    g = torch.Generator().manual_seed(seed)
    qa = torch.randint(-128, 128, (40, 512), dtype=torch.int8, generator=g)
    qb = torch.randint(-128, 128, (512, 300), dtype=torch.int8, generator=g).t()
    sa, sb = torch.rand(40, generator=g) + 0.5, torch.rand(300, generator=g) + 0.5
    return qa, qb, sa, sb


def _dw(qa, qb, sa, sb, monkeypatch):
    from open1b_kernels.int8 import linear
    monkeypatch.setattr(linear, "DW_SLAB", 16 * 300)         # 16-row slabs: three of them
    return linear._dw_cpu(qa, qb, sa, sb, None, torch.float32)


def test_weight_gradient_slabs_catch_a_row_fault(route, monkeypatch):
    qa, qb, sa, sb = _dw_case()
    want = _dw(qa, qb, sa, sb, monkeypatch)                  # float route (auto: no probe)
    calls = []

    def faulty_second_slab(a, bt):                           # one wrong element, slab 2
        out = gemm_route._exact_ref(a, bt.t()).to(torch.int32)
        calls.extend([a.shape] if a.shape[1] == 512 else [])   # not the probe's calls
        if len(calls) == 2 and a.shape[1] == 512:
            out[4, 7] += 3
        return out

    route("int", faulty_second_slab)
    assert gemm_route.int_gemm_route() == "int"
    with pytest.warns(RuntimeWarning, match="checksum failed on a 16x512x300 GEMM"):
        got = _dw(qa, qb, sa, sb, monkeypatch)
    assert torch.equal(got, want) and gemm_route.int_gemm_status()["failures"] == 1


def test_weight_gradient_slabs_catch_a_fault_the_row_sums_cannot_see(route, monkeypatch):
    # +d and -d in one row leave its sum intact: only the columns, checked once after all
    # slabs, see it; every slab is then recomputed on the float route
    qa, qb, sa, sb = _dw_case(6)
    route("float")
    want = _dw(qa, qb, sa, sb, monkeypatch)
    calls = []

    def compensating(a, bt):
        out = gemm_route._exact_ref(a, bt.t()).to(torch.int32)
        calls.extend([a.shape] if a.shape[1] == 512 else [])   # not the probe's calls
        if len(calls) == 3 and a.shape[1] == 512:
            out[1, 10] += 5
            out[1, 20] -= 5
        return out

    route("int", compensating)
    assert gemm_route.int_gemm_route() == "int"
    with pytest.warns(RuntimeWarning, match="column checksum failed over the slabs of a "
                                            "300x512 weight gradient"):
        got = _dw(qa, qb, sa, sb, monkeypatch)
    assert torch.equal(got, want)
    assert gemm_route.int_gemm_status()["route"] == "float" and gemm_route.int_gemm_status()["failures"] == 1


def test_checksum_sums_are_exact_in_their_dtype():
    # float64 only while every checksum value stays below 2^53; int64 beyond
    assert checksum._sum_dtype(131_071, 4_096, 11_264) == torch.float64
    assert checksum._sum_dtype(131_071, 131_071, 131_071) == torch.float64     # 2^48
    assert checksum._sum_dtype(131_071, 1 << 23, 16) == torch.int64
    a = torch.full((3, 5000), -128, dtype=torch.int8)
    v = torch.full((5000,), float(-128 * 70_000), dtype=torch.float64)
    assert checksum._mv(a, v).tolist() == [128 * 128 * 70_000 * 5000] * 3


def test_a_contraction_of_one_takes_the_float_route_without_a_failure(route):
    # torch 2.13's CPU _int_mm returns uninitialized memory for K = 1, N >= 2 (degenerate
    # strides of the (1, N) operand): such GEMMs never reach the library
    def garbage_for_k1(a, b_t):
        out = gemm_route._exact_ref(a, b_t.t()).to(torch.int32)
        if a.shape[1] == 1:
            out += 12345
        return out

    route("int", garbage_for_k1)
    a, b = _operands(m=3, k=1, n=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = gemm_route.exact_int_mm_cpu(a, b)
        assert gemm_route.int_mm_unchecked(a, b) is None
    assert torch.equal(got.long(), gemm_route._exact_ref(a, b))
    assert gemm_route.int_gemm_status()["route"] == "int" and gemm_route.int_gemm_status()["failures"] == 0
