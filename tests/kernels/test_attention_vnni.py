"""Attention's row products and the forward's P V on AVX-512 VNNI (open1b_kernels/attention/
vnni.py, _tilevnni.c): the float products' values on every value class (so the forward and
backward keep the definition's bits, whichever operands run on VNNI), the share that keeps the
float64 products, the once-per-process probe that catches a forged product, and the switch."""

from __future__ import annotations


import pytest
import torch

from open1b_kernels.attention import amx, compiled, vnni
from open1b_kernels.attention.backward import backward_reference
from open1b_kernels.attention.forward import forward_reference
from open1b_kernels.attention.tiles import BLOCK_M, quantize_v
from tests.kernels.support import bits
from tests.kernels.test_attention import _inputs
from tests.kernels.test_attention_amx import _extreme, backward_keeps_the_definitions_bits

needs_vnni = pytest.mark.skipif(not vnni.available(), reason="this CPU does not run AVX-512 VNNI")


@pytest.fixture(autouse=True)
def _no_tiles(monkeypatch):
    """AMX tiles off: where they run they take every product (compiled.vnni_in_use), so an
    AMX CPU tests the VNNI products here too."""
    monkeypatch.setenv(amx.SWITCH, "0")


def _float64_products(a, b, hkv, h, qb, first, nk):
    """compiled.py's float64 BLAS product of the same operands: the values to match."""
    bk, d, n = b.shape[0] * hkv, a.shape[3], -(-a.shape[2] // BLOCK_M)
    a64 = compiled._fixed(a, BLOCK_M, False, hkv)                    # (G, n, bk, 64, D)
    b64 = compiled._fixed(b, BLOCK_M, False).reshape(bk, n * BLOCK_M, d)
    lhs = a64[:, qb].movedim(0, 1).reshape(bk, -1, d) if h < 0 else a64[h, qb]
    return torch.matmul(lhs, b64[:, first * BLOCK_M:(first + nk) * BLOCK_M].transpose(1, 2))


@needs_vnni
@pytest.mark.parametrize("kind", ["normal", "outlier", "extreme", "tiny"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 200, 128), (2, 2, 1, 130, 64), (1, 2, 2, 64, 16),
                                   (1, 2, 1, 100, 256)])
def test_products_are_the_float64_products(shape, kind):
    b, hq, hkv, s, d = shape
    g = torch.Generator().manual_seed(hash((shape, kind)) % 2**31)
    q, k = torch.randn(b, hq, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g)
    if kind == "outlier":    # one huge column: most of every row 7+ binades below it (dense L)
        q[..., 3] *= 4096.0
        k[..., 5, :] *= 2.0 ** -100
    elif kind == "tiny":
        q, k = q * 2.0 ** -120, k * 2.0 ** -126
    q, k = q.bfloat16(), k.bfloat16()
    if kind == "extreme":    # every digit at -128 / 127, subnormals, zeros, zero rows
        q, k = _extreme((b, hq, s, d), 1), _extreme((b, hkv, s, d), 2)
    a, bb = vnni.Rows(q, False), vnni.Rows(k, True)
    n, gq = -(-s // BLOCK_M), hq // hkv
    for qb in range(n):
        for first, nk in ((0, n), (qb, 1), (max(0, qb - 1), min(2, n - max(0, qb - 1)))):
            for h in (-1, gq - 1):
                out = torch.empty((b * hkv, (gq if h < 0 else 1) * BLOCK_M, nk * BLOCK_M),
                                  dtype=torch.float64)
                vnni.products(a, bb, gq, h, qb, first, nk, out)
                want = _float64_products(q, k, hkv, h, qb, first, nk)
                assert torch.equal(bits(out), bits(want)), (qb, first, nk, h)


@needs_vnni
def test_share_counts_the_low_digits():
    # L (N's low 7 bits) is nonzero only for a value 7+ binades below its row's largest, and
    # there where its significand reaches below bit 7: here every other value of every row is
    # 255/128 * 2^-9 (N = 255 * 2^4, L = 112), and 2^-9 (N = 2^11, L = 0) in a second tensor
    x = torch.ones(1, 1, 64, 128)
    x[..., ::2] = 2.0 ** -9 * 255 / 128
    r = vnni.Rows(x.bfloat16(), False)
    assert r.share == 0.5
    x[..., ::2] = 2.0 ** -9
    assert vnni.Rows(x.bfloat16(), True).share == 0.0


@needs_vnni
@pytest.mark.parametrize("case", [(1, 4, 2, 150, 128, None), (2, 2, 1, 100, 64, 70),
                                  (1, 2, 2, 64, 256, 30), (1, 4, 1, 80, 16, None)])
@pytest.mark.parametrize("kind", ["normal", "extreme"])
def test_forward_and_backward_keep_the_definitions_bits(monkeypatch, case, kind):
    # every row product on VNNI however dense L is (SPARSE_MAX 1: the share never falls
    # back), against the definition
    monkeypatch.setattr(vnni, "SPARSE_MAX", 1.0)
    b, hq, hkv, s, d, window = case
    if kind == "extreme":
        q = (_extreme((b, hq, s, d), 1).float() * 2.0 ** -40).to(torch.bfloat16)
        k, v, do = (_extreme((b, hkv, s, d), 2), _extreme((b, hkv, s, d), 3),
                    _extreme((b, hq, s, d), 4))
    else:
        q, k, v, do, _ = _inputs(case, seed=5)
    assert compiled.rows_agree()                         # the probe's products run first
    calls = []
    real = vnni.products
    monkeypatch.setattr(vnni, "products", lambda *a: calls.append(1) or real(*a))
    out, lse = forward_reference(q, k, v, window)
    for x, y in zip(compiled.forward(q, k, v, window), (out, lse)):
        assert torch.equal(bits(x), bits(y))
    for x, y in zip(compiled.backward(q, k, v, out, lse, do, window),
                    backward_reference(q, k, v, out, lse, do, window)):
        assert torch.equal(bits(x), bits(y))
    n_qb = -(-s // BLOCK_M)
    assert len(calls) == n_qb * (1 + 2 * (hq // hkv))   # the forward's, the backward's two


@needs_vnni
def test_a_dense_low_digit_keeps_the_float64_products(monkeypatch):
    # an operand whose L is dense (a row with one huge value: the rest 7+ binades below)
    # would run slower on VNNI than in float64: the share sends it to the BLAS
    q, k, v, do, window = _inputs((1, 2, 1, 70, 64, None), seed=3)
    q = (q.float() * torch.where(torch.arange(64) == 0, 2.0 ** 12, 1.0)).bfloat16()
    assert compiled.rows_agree()
    calls = []
    monkeypatch.setattr(vnni, "products", lambda *a: calls.append(a))
    assert vnni.Rows(q, False).share > vnni.SPARSE_MAX
    assert compiled._vnni_rows(q, k) is None
    out, lse = compiled.forward(q, k, v, window)
    dq, dk, dv = compiled.backward(q, k, v, out, lse, do, window)
    assert len(calls) == 2 * 2        # dO V^T only (2 query blocks x 2 heads): Q's L is dense
    out_ref, _ = forward_reference(q, k, v, window)
    assert torch.equal(bits(out), bits(out_ref))


@needs_vnni
def test_the_probe_passes_here_and_catches_a_forged_product(monkeypatch):
    # a row product wrong in one element (a platform miscomputing VPDPBUSD would look like
    # this) is seen by the probe, which keeps the float64 products - the definition's bits
    assert compiled.rows_agree() and compiled.vnni_in_use()
    real = vnni.products

    def forged(a, b, g, h, qb, first, nk, out):
        real(a, b, g, h, qb, first, nk, out)
        out[0, 1, 2] = out[0, 1, 2] * (1 + 2.0 ** -40)
        return out

    monkeypatch.setattr(vnni, "products", forged)
    compiled.rows_agree.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="VNNI products differ"):
            assert not compiled.rows_agree()
        assert not compiled.vnni_in_use()
        backward_keeps_the_definitions_bits((1, 4, 2, 90, 32, 50), 8)  # float64 products now
    finally:
        compiled.rows_agree.cache_clear()


@needs_vnni
@pytest.mark.parametrize("d", [16, 48, 128, 256])
def test_pv_and_its_sum_are_the_float_paths(d):
    """P V on VNNI added into the output (``vnni.accumulate``) equals the float32 products of
    the same integers summed by fwd_acc, bit for bit, for every band, P at its extremes (0
    and 127 in whole rows and columns), V's codes at theirs (+-127, 0; a zero row of P against
    a negative column: +0 both ways) and the softmax's weights at theirs (alpha 0 and 1)."""
    g = torch.Generator().manual_seed(d)
    bk, n = 3, 5
    v8, _ = quantize_v(torch.randn(1, bk, n * BLOCK_M, d, generator=g).bfloat16())
    v8 = v8.reshape(bk, n * BLOCK_M, d)
    v8[:, 7], v8[:, 9], v8[1, :, 5] = 127, -127, -127
    v8[2, 64:128] = 0                                            # a zero key block
    for first, nk in ((0, n), (2, 1), (1, 3)):
        for heads in (1, 2):
            got, want = compiled._pv_outputs(v8, heads, first, nk, seed=d + first)
            for x, y in zip(got, want):
                assert torch.equal(x.view(torch.int32), y.view(torch.int32))


@needs_vnni
def test_the_probe_catches_a_forged_pv(monkeypatch):
    # P V wrong in one element: the probe keeps the float products, and the forward the
    # definition's bits
    assert compiled.rows_agree()
    real = vnni.accumulate

    def forged(*a):
        out, lse = real(*a)
        out[0, 2, 3] = torch.nextafter(out[0, 2, 3], torch.tensor(1e30))
        return out, lse

    monkeypatch.setattr(vnni, "accumulate", forged)
    compiled.rows_agree.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="P V"):
            assert not compiled.rows_agree()
        q, k, v, _, window = _inputs((1, 4, 2, 90, 32, 50), seed=8)
        for x, y in zip(compiled.forward(q, k, v, window), forward_reference(q, k, v, window)):
            assert torch.equal(bits(x), bits(y))
    finally:
        compiled.rows_agree.cache_clear()


@needs_vnni
def test_the_forward_runs_pv_on_vnni(monkeypatch):
    """Where the VNNI products run, every query block's P V is one (the definition's bits
    checked by the forward tests above and in test_attention_compiled.py)."""
    assert compiled.vnni_in_use()
    calls = []
    real = vnni.accumulate
    monkeypatch.setattr(vnni, "accumulate", lambda *a: calls.append(1) or real(*a))
    q, k, v, _, window = _inputs((1, 4, 2, 200, 64, None), seed=9)
    for x, y in zip(compiled.forward(q, k, v, window), forward_reference(q, k, v, window)):
        assert torch.equal(bits(x), bits(y))
    assert len(calls) == -(-200 // BLOCK_M)


def test_switch_off_keeps_the_float64_products(monkeypatch):
    monkeypatch.setenv(vnni.SWITCH, "0")
    assert not vnni.available() and not compiled.vnni_in_use()
    calls = []
    monkeypatch.setattr(vnni, "products", lambda *a: calls.append(1))
    monkeypatch.setattr(vnni, "accumulate", lambda *a: calls.append(1))
    backward_keeps_the_definitions_bits((1, 2, 1, 70, 16, None), 2, compiled.forward)
    assert not calls


@needs_vnni
def test_sides_swapped_are_refused():
    q = torch.randn(1, 2, 64, 16).bfloat16()
    a, b = vnni.Rows(q, False), vnni.Rows(q, True)
    out = torch.empty((2, 64, 64), dtype=torch.float64)
    with pytest.raises(ValueError, match="left side"):
        vnni.products(b, a, 1, -1, 0, 0, 1, out)


@needs_vnni
def test_loops_reject_inconsistent_buffers():
    t = vnni._tilesc
    x = torch.zeros(64 * 16, dtype=torch.int16).numpy()
    i8, i32 = torch.zeros(2 * 64 * 16, dtype=torch.int8), torch.zeros(64 * 16, dtype=torch.int32)
    one, rows = torch.zeros(1, dtype=torch.int32), torch.zeros(64, dtype=torch.int32)
    f64 = torch.zeros(64, dtype=torch.float64)
    ok = [y.numpy() for y in (i8, i32, i32.clone(), one, rows, f64)]
    t.vnni_rows(x, *ok, 1, 64, 64, 16, False, 0, 1)                 # consistent: runs
    with pytest.raises(ValueError, match="expected"):               # S_pad past the buffers
        t.vnni_rows(x, *ok, 1, 64, 128, 16, False, 0, 1)
    with pytest.raises(ValueError, match="inconsistent"):           # S_pad not whole blocks
        t.vnni_rows(x, *ok, 1, 60, 60, 16, False, 0, 1)
    a = ok[:5]
    out = torch.zeros(64 * 64, dtype=torch.float64).numpy()
    t.vnni_products(*a, *ok, out, 1, 1, -1, 0, 0, 1, 1, 1, 16, 0, 1)  # consistent: runs
    with pytest.raises(ValueError, match="consistent shapes"):      # first + nk past the blocks
        t.vnni_products(*a, *ok, out, 1, 1, -1, 0, 1, 1, 1, 1, 16, 0, 1)
    with pytest.raises(ValueError, match="expected"):               # out too short for nk = 2
        t.vnni_products(*a, *ok, out, 1, 1, -1, 0, 0, 2, 1, 2, 16, 0, 2)
    p8, vq = torch.zeros(2 * 64 * 64, dtype=torch.int8), torch.zeros(2 * 64 * 16, dtype=torch.int8)
    ws = [torch.zeros(64 * 2).numpy(), torch.zeros(64 * 2, dtype=torch.int32).numpy(),
          torch.zeros(64).numpy(), torch.ones(64).numpy()]          # alpha, t, m, l
    out, lse = torch.zeros(64 * 16).numpy(), torch.zeros(64).numpy()
    pv = (p8.numpy(), vq.numpy(), *ws)
    t.vnni_pv_acc(*pv, out, lse, 1, 64, 2, 0, 2, 16, 0, 16)          # consistent: runs
    with pytest.raises(ValueError, match="consistent shapes"):      # first + nk past the blocks
        t.vnni_pv_acc(*pv, out, lse, 1, 64, 2, 1, 2, 16, 0, 16)
    with pytest.raises(ValueError, match="consistent shapes"):      # rows not a multiple of 4
        t.vnni_pv_acc(*pv, out, lse, 1, 62, 2, 0, 2, 16, 0, 15)
    with pytest.raises(ValueError, match="expected"):               # out too short for D = 32
        t.vnni_pv_acc(p8.numpy(), torch.zeros(2 * 64 * 32, dtype=torch.int8).numpy(), *ws, out,
                      lse, 1, 64, 2, 0, 2, 32, 0, 16)
