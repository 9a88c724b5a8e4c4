"""Attention's compiled CPU path (open1b_kernels.attention.compiled) against the torch definition
(forward_reference / backward_reference): the same bits on every shape class and value class
of the attention tests, any thread count, and its dispatch switch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from open1b_kernels.attention import compiled
from open1b_kernels.attention.backward import backward_cpu, backward_reference
from open1b_kernels.attention.forward import forward_cpu, forward_reference
from tests.kernels.support import bits
from tests.kernels.test_attention import CASES, _inputs

pytestmark = pytest.mark.skipif(not compiled.available(),
                                reason="the compiled attention loops are not built")

KINDS = ["normal", "tiny", "peaked", "subnormal", "v_extreme"]
MORE_CASES = [
    (1, 8, 2, 333, 32, 100),   # several query blocks per group, window of 1.5 blocks
    (2, 2, 2, 64, 64, None),   # exactly one block
    (1, 4, 4, 129, 128, 65),   # head dim 128 (Open-1B's), one row into a third block
]


# dq_tiles/kv_tiles exist in one copy per CPU level (_tilemm.h), each with its own register
# blocks: every copy this CPU runs must give the definition's bits.
TILE_TOP = compiled._tilesc.tile_level() if compiled.available() else 0


@pytest.fixture(params=[0, 1, 2], ids=["baseline", "x86-64-v3", "x86-64-v4"])
def tile_copy(request):
    if request.param > TILE_TOP:
        pytest.skip(f"this CPU does not run tile copy {request.param} (it runs up to {TILE_TOP})")
    assert compiled._tilesc.tile_level(request.param) == request.param
    yield request.param
    compiled._tilesc.tile_level(TILE_TOP)


def _assert_same(a, b):
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(bits(x), bits(y))


@pytest.fixture(params=["float64", "amx"])
def products(request, monkeypatch):
    """The tile products as float64 BLAS products, or on AMX tiles where this CPU runs them
    (open1b_kernels/attention/amx.py): both give the definition's bits."""
    if request.param == "float64":
        monkeypatch.setattr(compiled, "tiles_in_use", lambda: False)
    elif not compiled.tiles_in_use():
        pytest.skip("this CPU (or OS) does not run AMX-INT8 tiles")
    return request.param


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", CASES + MORE_CASES)
@pytest.mark.parametrize("batch_band", [compiled.BATCH_BAND, 0])
def test_compiled_matches_reference(case, kind, batch_band, monkeypatch, products):
    # the band's tile products batched over the KV heads (small bands) or per KV head (0)
    if products == "amx" and batch_band == 0:
        pytest.skip("the batching is the float64 products' choice")
    monkeypatch.setattr(compiled, "BATCH_BAND", batch_band)
    q, k, v, do, window = _inputs(case, seed=11, kind=kind)
    out, lse = forward_reference(q, k, v, window)
    _assert_same(compiled.forward(q, k, v, window), (out, lse))
    _assert_same(compiled.backward(q, k, v, out, lse, do, window),
                 backward_reference(q, k, v, out, lse, do, window))


@pytest.mark.parametrize("case", MORE_CASES)
def test_every_tile_copy_matches_the_reference(case, tile_copy, monkeypatch):
    monkeypatch.setattr(compiled, "tiles_in_use", lambda: False)      # the float64 products' copies
    q, k, v, do, window = _inputs(case, seed=13, kind="normal")
    out, lse = forward_reference(q, k, v, window)
    _assert_same(compiled.backward(q, k, v, out, lse, do, window),
                 backward_reference(q, k, v, out, lse, do, window))


def test_thread_count_does_not_change_bits(products):
    q, k, v, do, window = _inputs((1, 4, 1, 300, 32, 90), seed=3)
    before = torch.get_num_threads()
    results = []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            out, lse = compiled.forward(q, k, v, window)
            results.append((out, lse, *compiled.backward(q, k, v, out, lse, do, window)))
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        _assert_same(results[0], other)


def test_cpu_entry_points_dispatch(monkeypatch):
    """forward_cpu/backward_cpu take the compiled path, and the reference under
    OPEN1B_MATHC=0 (the switch a user has when a compiled loop is suspect)."""
    q, k, v, do, window = _inputs(CASES[1], seed=5)
    calls = []
    real = compiled.forward
    monkeypatch.setattr(compiled, "forward", lambda *a: calls.append("fwd") or real(*a))
    out, lse = forward_cpu(q, k, v, window)
    assert calls == ["fwd"]
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    assert not compiled.available()
    _assert_same(forward_cpu(q, k, v, window), (out, lse))
    assert calls == ["fwd"]
    _assert_same(backward_cpu(q, k, v, out, lse, do, window),
                 backward_reference(q, k, v, out, lse, do, window))


def test_dq_tiles_sum_exact_tile_products_in_ascending_order(tile_copy):
    """dq_tiles multiplies each 64 x 64 by 64 x D tile exactly (the values are integers
    times one power of two per tile, as fixed-point values are, so float64 holds every
    partial sum) and adds the float32-rounded tiles in ascending key-block order: its
    result equals that running sum and differs from the reversed order on these values
    (so the bit tests above can see a loop that sums in another order)."""
    g = torch.Generator().manual_seed(0)
    bk, nk, n_kb, first, d = 2, 7, 9, 1, 32
    scale = torch.pow(2.0, torch.randint(-30, 30, (bk, nk, 1, 1), generator=g).double())
    dsr = torch.randint(-2**20, 2**20, (bk, nk, 64, 64), generator=g).double() * scale
    kc = torch.randint(-2**20, 2**20, (bk, n_kb, 64, d), generator=g).double()
    prod = dsr @ kc[:, first:first + nk]                   # exact: |partial sums| < 2^47
    out = torch.empty((bk, 64, d))
    for u0, u1 in ((0, 37), (37, 128)):                    # a row range cut mid-block
        compiled._tilesc.dq_tiles(dsr.numpy().reshape(-1), kc.numpy().reshape(-1),
                                  out.numpy().reshape(-1), bk, nk, d, n_kb, first, u0, u1)
    ascending = torch.zeros((bk, 64, d))
    for j in range(nk):
        ascending = ascending + prod[:, j].float()
    descending = torch.zeros((bk, 64, d))
    for j in reversed(range(nk)):
        descending = descending + prod[:, j].float()
    assert torch.equal(bits(out), bits(ascending))
    assert not torch.equal(bits(out), bits(descending))


def test_kv_tiles_add_exact_transposed_tile_products_in_call_order(tile_copy):
    """kv_tiles adds lhs^T @ rhs (exact, as in dq_tiles' test) to running float32 sums at
    the band's offset, each element rounded once, in the order of the calls (heads, then
    query blocks): two calls equal the float32 running sum in that order and differ from
    the other order; columns outside the band are left alone."""
    g = torch.Generator().manual_seed(1)
    bk, d, width, stride, offset = 2, 24, 48, 112, 32
    calls = []
    for e in (-22, -24):                        # products ~2^21, 2^19: the order shows
        lhs = torch.randint(-2**20, 2**20, (bk, 64, d), generator=g).double() * 2.0**e
        rhs = torch.randint(-2**20, 2**20, (bk, 64, width), generator=g).double()
        calls.append((lhs, rhs, lhs.transpose(1, 2) @ rhs))   # exact: |sums| < 2^47
    start = torch.randn(bk, d, stride, generator=g)
    acc = start.clone()
    for lhs, rhs, _ in calls:
        for u0, u1 in ((0, 13), (13, bk * d)):             # a row range cut mid-group
            compiled._tilesc.kv_tiles(lhs.numpy().reshape(-1), rhs.numpy().reshape(-1),
                                      acc.numpy().reshape(-1), bk, d, width, stride, offset,
                                      u0, u1)
    band = slice(offset, offset + width)
    forward, backward = start[:, :, band].clone(), start[:, :, band].clone()
    for _, _, prod in calls:
        forward = forward + prod.float()
    for _, _, prod in reversed(calls):
        backward = backward + prod.float()
    assert torch.equal(bits(acc[:, :, band]), bits(forward))
    assert not torch.equal(bits(acc[:, :, band]), bits(backward))
    assert torch.equal(bits(acc[:, :, :offset]), bits(start[:, :, :offset]))
    assert torch.equal(bits(acc[:, :, offset + width:]), bits(start[:, :, offset + width:]))


def test_compiled_loops_reject_inconsistent_buffers():
    s64 = np.zeros(64 * 64, dtype=np.float64)
    small = np.zeros(10, dtype=np.float32)
    out = np.zeros(64 * 16, dtype=np.float32)
    with pytest.raises(ValueError, match="kc: buffer of"):
        compiled._tilesc.dq_tiles(s64, s64[:10], out, 1, 1, 16, 1, 0, 0, 64)
    with pytest.raises(ValueError, match="unit range"):
        compiled._tilesc.dq_tiles(s64, s64[:64 * 16], out, 1, 1, 16, 1, 0, 0, 65)
    with pytest.raises(ValueError, match="dq_tiles: inconsistent shapes"):  # D % 16 != 0
        compiled._tilesc.dq_tiles(s64, s64[:64 * 24], np.zeros(64 * 24, dtype=np.float32),
                                  1, 1, 24, 1, 0, 0, 64)
    with pytest.raises(ValueError, match="dq_tiles: inconsistent shapes"):  # past the keys
        compiled._tilesc.dq_tiles(s64, s64[:64 * 16], out, 1, 1, 16, 1, 1, 0, 64)
    acc = np.zeros(16 * 64, dtype=np.float32)
    with pytest.raises(ValueError, match="rhs: buffer of"):
        compiled._tilesc.kv_tiles(s64[:64 * 16], s64[:10], acc, 1, 16, 16, 64, 0, 0, 16)
    with pytest.raises(ValueError, match="kv_tiles: inconsistent shapes"):  # past the row
        compiled._tilesc.kv_tiles(s64[:64 * 16], s64[:64 * 16], acc, 1, 16, 16, 64, 56, 0, 16)
    with pytest.raises(ValueError, match="kv_tiles: inconsistent shapes"):  # L % 16 != 0
        compiled._tilesc.kv_tiles(s64[:64 * 16], s64[:64 * 8], acc, 1, 16, 8, 64, 0, 0, 16)
    with pytest.raises(ValueError, match="int32 range"):
        compiled._tilesc.bwd_tiles(s64, s64, small, small, s64, s64, s64, 1, 1, 0, 0,
                                   2**40, 0, 1.0, 0, 1)


@pytest.mark.parametrize("kind", KINDS)
def test_fixed_point_planes_match_the_torch_definition(kind):
    from open1b_kernels.attention.tiles import blocked_rows, column_values

    q, k, *_ = _inputs((2, 3, 3, 130, 32, None), seed=2, kind=kind)
    for x in (q, k):
        assert torch.equal(bits(compiled._fixed(x, 64, False)), bits(blocked_rows(x, 64)))
        assert torch.equal(bits(compiled._fixed(x, 64, True)), bits(column_values(x, 64)))


@pytest.mark.parametrize("form", ["fwd_rows", "fwd_rows32"])
def test_row_maximum_is_the_scans_value_first_zero_sign_and_nans(form):
    """The softmax pass takes each row's maximum in 16 lanes (scan_max64 in _tilesc.c), not
    the definition's scan m = x > m ? x : m. Forgery stopped: a maximum in another order
    returns the last or a tree's zero where the scan keeps the first zero's sign (-0 before
    +0 and +0 before -0), or lets a NaN in; every row's m must carry the scan's bits."""
    rng = np.random.default_rng(11)
    s = -rng.random((64, 64)) * 8 - 0.25                     # negative rows: a zero is the max
    s[0, 5], s[0, 9] = -0.0, 0.0                             # -0 first: the scan keeps -0
    s[1, 3], s[1, 40] = 0.0, -0.0                            # +0 first: +0
    s[2, 63] = -0.0                                          # the only zero, last
    s[3, 0], s[3, 17] = np.nan, -0.125                       # a NaN skipped, max elsewhere
    s[4, :] = np.nan                                         # nothing above -inf
    s[5, 16:32] = -0.0                                       # a lane block of -0, then +0
    s[5, 50] = 0.0
    s[6:] = rng.standard_normal((58, 64)) * 4                # positive maxima, ties
    s[7, 10], s[7, 60] = 9.5, 9.5
    scale = 0.0883883461356163
    sc = s.astype(np.float32) * np.float32(scale)
    want = np.empty(64, dtype=np.float32)
    for r in range(64):
        m = np.float32(-np.inf)
        for x in sc[r]:
            m = x if x > m else m
        want[r] = m
    src = (s if form == "fwd_rows" else s.astype(np.float32)).ravel().copy()
    p8 = np.zeros(64 * 64, dtype=np.float32 if form == "fwd_rows" else np.int8)
    alpha, t = np.zeros(64, dtype=np.float32), np.zeros(64, dtype=np.int32)
    m_out, l_out = np.zeros(64, dtype=np.float32), np.zeros(64, dtype=np.float32)
    u = np.zeros(64, dtype=np.int32)
    # query block 1 against key block 0: every key visible from every row
    getattr(compiled._tilesc, form)(src, u, p8, alpha, t, m_out, l_out, 1, 64, 1, 64, 0, 64,
                                    128, 0, scale, 0, 64)
    assert np.array_equal(m_out.view(np.int32), want.view(np.int32))
    assert m_out.view(np.int32)[0] == np.float32(-0.0).view(np.int32)
    assert m_out.view(np.int32)[1] == 0 and m_out.view(np.int32)[5] == -2**31
