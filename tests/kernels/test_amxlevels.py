"""The LM head's levels on the AMX tiles (open1b_kernels/int8/_amxlevels.h, amxmm.product_levels):
a block's level products summed in the tile product's epilogue - weighted into T, rounded into
the logits, T's sums taken - give the bits and the sums of the products written and summed
apart (levels_round_weighted) on every shape, split and extreme; bad arguments are refused;
a wrong T in the tiles is caught by the head's check and recomputed on the float route."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.int8 import amxmm
from open1b_kernels.int8 import route as gemm_route
from tests.kernels.test_amxmm import _exact, _layouts, needs_amx


def _levels_ref(raw, rowf, colf):
    """T = sum of each level's exact product times 2^shift (int64), its float32 rounding as
    levels_round_weighted makes it, and its row and column sums."""
    t = sum(_exact(a, b) * (1 << sh) for a, b, sh in raw)
    out = ((t.double() * rowf[:, None]) * colf[None, :]).float()
    return out, t.sum(1), t.sum(0)


@needs_amx
@pytest.mark.parametrize("m,n,ks", [(1, 1, (1,)), (33, 17, (64, 128)), (100, 333, (130, 260, 390)),
                                    (40, 1000, (192, 192, 192, 64)), (300, 600, (2048, 4096, 6144)),
                                    (544, 96, (700,))])
def test_the_heads_levels_summed_in_the_tiles_give_the_level_sums_bits(m, n, ks):
    # each level's product weighted by 2^shift into T, rounded once into a block of a wider
    # output (its neighbours untouched), T's sums modulo 2^64: what levels_round_weighted
    # makes of the products written apart - at blocks' edges and whole (the AVX-512 epilogue),
    # units of rows and of columns (few rows), cache blocks cut at the output's edge, the
    # largest values with the largest shift
    g = torch.Generator().manual_seed(m + n + sum(ks))
    raw = [(torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8),
            torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8), 7 * (len(ks) - 1 - i))
           for i, k in enumerate(ks)]
    raw[0][0][0], raw[0][1][0] = -128, -128
    rowf = torch.pow(2.0, torch.randint(-30, 30, (m,), generator=g).double())
    colf = torch.pow(2.0, torch.randint(-80, -40, (n,), generator=g).double())
    colf[-1] = 2.0 ** 100                           # overflows float32: inf, as the float path
    want, rows_w, cols_w = _levels_ref(raw, rowf, colf)
    for aa in _layouts(raw[0][0]):
        wide = torch.full((m, n + 40), 7.0)
        out = wide[:, 8:8 + n]
        levels = [(amxmm.pack(aa if i == 0 else a, False, f"t.a{i}"), amxmm.pack(b, True, f"t.b{i}"),
                   sh) for i, (a, b, sh) in enumerate(raw)]
        rows, cols = amxmm.product_levels(levels, rowf, colf, out)
        assert torch.equal(out.view(torch.int32), want.view(torch.int32))
        assert torch.equal(rows, rows_w) and torch.equal(cols, cols_w)
        assert bool((wide[:, :8] == 7).all()) and bool((wide[:, 8 + n:] == 7).all())


@needs_amx
def test_the_levels_thread_cut_does_not_change_the_bits(monkeypatch):
    import open1b_kernels.core.pieces as pieces
    g = torch.Generator().manual_seed(5)
    raw = [(torch.randint(-128, 128, (250, k), generator=g, dtype=torch.int8),
            torch.randint(-128, 128, (90, k), generator=g, dtype=torch.int8), sh)
           for k, sh in ((300, 14), (600, 7))]
    rowf, colf = torch.ones(250, dtype=torch.float64), torch.full((90,), 2.0 ** -30, dtype=torch.float64)
    levels = [(amxmm.pack(a, False, f"t.a{i}"), amxmm.pack(b, True, f"t.b{i}"), sh)
              for i, (a, b, sh) in enumerate(raw)]
    outs = []
    for threads in (1, 4):
        monkeypatch.setattr(pieces, "team", lambda: False)
        torch.set_num_threads(threads)
        try:
            out = torch.empty((250, 90))
            outs.append((out, *amxmm.product_levels(levels, rowf, colf, out)))
        finally:
            torch.set_num_threads(2)
    assert all(torch.equal(x, y) for x, y in zip(*outs))


@needs_amx
def test_the_levels_refuse_bad_arguments():
    a = amxmm.pack(torch.ones((9, 64), dtype=torch.int8), False, "t.a")
    b = amxmm.pack(torch.ones((4, 64), dtype=torch.int8), True, "t.b")
    b5 = amxmm.pack(torch.ones((5, 64), dtype=torch.int8), True, "t.b5")
    rf, cf = torch.ones(9, dtype=torch.float64), torch.ones(4, dtype=torch.float64)
    out = torch.empty((9, 4))
    with pytest.raises(ValueError, match="1 to 4 levels"):
        amxmm.product_levels([(a, b, 0)] * 5, rf, cf, out)
    with pytest.raises(ValueError, match="same lines"):
        amxmm.product_levels([(a, b, 0), (a, b5, 0)], rf, cf, out)
    with pytest.raises(ValueError, match="out must be float32"):
        amxmm.product_levels([(a, b, 0)], rf, cf, out.t())
    with pytest.raises(ValueError, match="float64 rowf"):
        amxmm.product_levels([(a, b, 0)], rf.float(), cf, out)
    with pytest.raises(ValueError, match="shift 53"):      # the C side: 2^shift exact in T
        amxmm.product_levels([(a, b, 53)], rf, cf, out)
    # a row's T: 4 columns of 64 ones times 2^52
    assert amxmm.product_levels([(a, b, 52)], rf, cf, out)[0].tolist() == [2 ** 60] * 9


@needs_amx
@pytest.mark.parametrize("fault", ["one element", "cancelling in a row"])
def test_a_fault_in_the_heads_levels_on_the_tiles_is_caught_and_recomputed(route, monkeypatch,
                                                                            fault):
    # the forward's and the weight gradient's blocks run their levels in one tile call, its
    # epilogue reporting the sums of the T it rounded: a wrong T there (as lost tile state
    # would make it; two errors cancelling in a row caught by the column sums) fails the
    # head's check, is counted, and the head is recomputed on the float route - its bits
    from open1b_kernels.ops import lmhead_int as li
    from tests.kernels.test_lmhead_int import _case, _run, _same
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    h, w, dl = _case(k=320)
    route("float")
    want = _run(h, w, dl, 3)
    real, calls = amxmm.product_levels, []
    wrong = {(2, 5): 1} if fault == "one element" else {(2, 5): 1, (2, 6): -1}

    def faulty(levels, rowf, colf, out):             # T off by one (and one) in one block
        rows, cols = real(levels, rowf, colf, out)
        calls.append(1)
        if len(calls) == 3:
            for (r, c), d in wrong.items():
                rows[r] += d
                cols[c] += d
        return rows, cols

    monkeypatch.setattr(amxmm, "product_levels", faulty)
    route("amx")
    with pytest.warns(RuntimeWarning, match="checksum failed on the LM head.s slice products"):
        got = _run(h, w, dl, 3)
    assert len(calls) >= 3 and _same(want, got)
    assert gemm_route.int_gemm_status()["route"] == "float"
    assert gemm_route.int_gemm_status()["failures"] == 1
