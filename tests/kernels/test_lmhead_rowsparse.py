"""A sparse int8 slice's products row by row (open1b_kernels/ops/_lmhead_rowsparse.c): exact
against int64 products for every shape class, layout and thread cut, at the extremes
across the int32 accumulators' flushes, and bad arguments refused by name."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.ops import lmhead_rowsparse as rowsparse

needs_rowsparse = pytest.mark.skipif(not rowsparse.available(), reason="the extension is not built")


def _ref(a, bs, t):
    return t + sum((a.to(torch.int64) @ b.to(torch.int64)) << s for b, s in bs)


@needs_rowsparse
@pytest.mark.parametrize("r,k,c,density,shifts", [
    (1, 1, 1, 1.0, [0]), (13, 1000, 37, 0.02, [7, 0]), (50, 333, 129, 0.3, [14, 7, 0]),
    (7, 9, 5, 1.0, [3]), (64, 4099, 300, 0.05, [7, 0])])
@pytest.mark.parametrize("threads", [1, 3])
def test_rows_add_is_exact(r, k, c, density, shifts, threads):
    # K not a multiple of the scan's 8-byte words, rows with no nonzero, 1 to 3 b slices
    g = torch.Generator().manual_seed(r + k + c)
    keep = torch.rand(r, k, generator=g) < density
    a = (torch.randint(-128, 128, (r, k), generator=g, dtype=torch.int8) * keep).to(torch.int8)
    a[r // 2] = 0
    bs = [(torch.randint(-128, 128, (k, c), generator=g, dtype=torch.int8), s) for s in shifts]
    t = torch.randint(-(1 << 40), 1 << 40, (r, c), generator=g, dtype=torch.int64)
    want = _ref(a, bs, t)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        seen = rowsparse.rows_add(a, bs, t)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(t, want)
    assert seen == int((a != 0).sum())


@needs_rowsparse
def test_rows_add_in_place_views_and_the_extremes():
    # a row block of a larger plane and b as column blocks of transposed views (dh's b:
    # slices of W laid out (K, C_total)); every product -128 x -128 (all of one sign) with
    # the largest shifts, far more nonzeros per row than one int32 accumulator takes (7 for
    # shifts 14, 7, 0; 1,016 for 7, 0: one more overflows it), so only the flushes keep it
    # exact
    k, c_all = 3000, 40
    plane = torch.full((9, k), -128, dtype=torch.int8)
    a = plane[2:7]
    store = torch.full((3, k, c_all), -128, dtype=torch.int8)
    for shifts in ([14, 7, 0], [7, 0]):
        bs = [(store[j][:, 8:24], s) for j, s in enumerate(shifts)]
        assert not bs[0][0].is_contiguous() and rowsparse.fits(bs[0][0])
        t = torch.zeros((5, 16), dtype=torch.int64)
        rowsparse.rows_add(a, bs, t)
        assert torch.equal(t, _ref(a, [(b.contiguous(), s) for b, s in bs],
                                   torch.zeros((5, 16), dtype=torch.int64)))
        assert int(t.abs().max()) > 1 << 31                  # past any one int32


@needs_rowsparse
def test_rows_add_refuses_bad_arguments_by_name():
    a = torch.zeros((4, 10), dtype=torch.int8)
    b = torch.zeros((10, 6), dtype=torch.int8)
    t = torch.zeros((4, 6), dtype=torch.int64)
    bad = [
        (a.t().contiguous().t(), [(b, 0)], t),                 # a without a unit row stride
        (a, [(b.t().contiguous().t(), 0)], t),                 # b without one
        (a, [(b, 15)], t),                                     # shift past 14
        (a, [(b, 0)] * 4, t),                                  # four b slices
        (a, [(b, 0)], t.to(torch.int32)),                      # t not int64
        (a, [(b[:9], 0)], t),                                  # b's K differs
        (a, [(b, 0), (torch.zeros((10, 8), dtype=torch.int8)[:, :6], 0)], t),  # row strides
    ]
    for args in bad:
        with pytest.raises(ValueError, match="rows_add needs"):
            rowsparse.rows_add(*args)
    # the C side checks what it reads too
    with pytest.raises(ValueError, match="shift"):
        rowsparse.LOOPS.rows_add(a.numpy(), 4, 10, 10, [(b.numpy(), 20)], 6, t.numpy(), 6,
                                 0, 4)
    with pytest.raises(ValueError, match="b: buffer of 60 bytes, needs 69"):     # row stride 7
        rowsparse.LOOPS.rows_add(a.numpy(), 4, 10, 10, [(b.numpy(), 0)], 7, t.numpy(), 6,
                                 0, 4)
    for r1, pieces in ((5, 1), (4, 0), (4, 100_000)):          # past R; pieces out of range
        with pytest.raises(ValueError, match="row range"):
            rowsparse.LOOPS.rows_add(a.numpy(), 4, 10, 10, [(b.numpy(), 0)], 6, t.numpy(), 6,
                                     0, r1, pieces)
