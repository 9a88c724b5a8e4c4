"""The plan's compacted slices (``open1b_kernels.ops.lmhead_plan``), on the integer route: a
slice of ``a`` that is zero in most contraction columns of a row block runs its pairs over
only its nonzero columns. The logits gradient's top slice is the case (at most ~256 nonzeros per row, by the
softmax's sums): the route must give the float path's bits with compaction on and off, in
every layout and blocking, and a compaction that loses a nonzero column must be caught by
the exactness guard, counted and recomputed - never a silently different T."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend, mathc
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_int as li
from open1b_kernels.ops import lmhead_plan as lp
from open1b_kernels.ops.lmhead import _level_slices, lmhead_backward, lmhead_forward, ozaki_mm


def exact_mm(a, b_t):
    return gemm_route._exact_ref(a, b_t.t()).to(torch.int32)


def _dlogits(m, v, seed, peaked=False):
    """softmax(logits) - onehot(targets), over m rows: the loss's gradient (times 1/m)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(m, v, generator=g) * (4.0 if peaked else 1.0)
    targets = torch.randint(0, v, (m,), generator=g)
    d = torch.softmax(logits, 1)
    d[torch.arange(m), targets] -= 1.0
    return d / m


def _case(m=70, k=40, v=300, seed=0, peaked=False):
    g = torch.Generator().manual_seed(seed + 100)
    h = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(v, k, generator=g) * 0.02).to(torch.bfloat16)
    return h, w, _dlogits(m, v, seed, peaked)


def _run(h, w, dl):
    with backend.force("cpu"):
        return (lmhead_forward(h, w), *lmhead_backward(dl, h, w))


def _same(xs, ys):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(xs, ys))


@pytest.fixture(params=["compiled", "torch"])
def loops(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    elif not mathc.available():
        pytest.skip("the compiled loops are not built")
    return request.param


def _completed(monkeypatch) -> list[bool]:
    """Each integer-route product's outcome: True where it finished on the integer GEMM
    (False would mean a refused layout or a failed check: the float path's bits again, so
    equal bits alone do not show that the compacted route ran)."""
    got: list[bool] = []
    real = li.int_blocks
    monkeypatch.setattr(li, "int_blocks", lambda *a: got.append(real(*a)) or got[-1])
    return got


def _same_on_the_int_route(route, monkeypatch, a, b):
    """ozaki_mm(a, b) on the float path, then on the integer route (the exact reference as
    the library's GEMM): the same bits, and the integer route finished the product."""
    route("float")
    with backend.force("cpu"):
        want = ozaki_mm(a, b)
        route("int", exact_mm)
        done = _completed(monkeypatch)
        got = ozaki_mm(a, b)
    assert torch.equal(want.view(torch.int32), got.view(torch.int32)) and done == [True]


def _counting(widths):
    def mm(a, b_t):
        widths.append(a.shape[1])
        return exact_mm(a, b_t)
    return mm


def test_the_logits_gradients_top_slice_is_sparse():
    # the bound of the module docstring: slice 1 of a dlogits row is nonzero only above
    # 2^-7 of the row's largest magnitude, at most 256 elements (here the target and the few
    # probabilities that large); a block's union is a small share of the columns
    dl = _dlogits(64, 2000, seed=3)
    sa = _level_slices(dl, 3, "test.sa", False)
    cols = lp.nonzero_cols(sa, 1, slice(0, 64))
    want = torch.nonzero((sa[0] != 0).any(0)).flatten()
    assert torch.equal(cols, want) and 64 <= cols.numel() <= 0.1 * 2000
    assert set(lp.compacted(sa, slice(0, 64), 3)) == {1}       # slice 2 is dense
    assert int((sa[0] != 0).sum(1).max()) <= 256


@pytest.mark.parametrize("row_block", [16, 1024])
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("peaked", [True, False])
def test_compaction_gives_the_float_paths_bits(route, monkeypatch, loops, row_block, chunked,
                                               peaked):
    # several row blocks (each b operand kept for its column block, compaction differing per
    # block) or one; the contraction in chunks (compacted columns too) or whole; peaked
    # logits make more than the target nonzero in slice 1
    monkeypatch.setattr(li, "SHORT_K", 0)
    monkeypatch.setattr(li, "INT_ROW_BLOCK", row_block)
    monkeypatch.setattr(li, "INT_COL_BLOCK", 32)
    if chunked:
        monkeypatch.setattr(lp, "K_CHUNK", 16)
    h, w, dl = _case(v=4000, peaked=peaked)
    route("float")
    want = _run(h, w, dl)
    seen: list[int] = []
    real = lp.compacted
    monkeypatch.setattr(lp, "compacted", lambda sa, rows, s: seen.append(
        sum(c.numel() for c in real(sa, rows, s).values())) or real(sa, rows, s))
    widths: list[int] = []
    route("int", _counting(widths))
    done = _completed(monkeypatch)
    got = _run(h, w, dl)
    assert gemm_route.int_gemm_status()["route"] == "int" and gemm_route.int_gemm_status()["failures"] == 0
    assert _same(want, got) and done == [True] * 3
    # dh's top slice ran compacted (in every row block), on operands of >= 2 columns
    assert sum(1 for n in seen if n) >= -(-70 // row_block) and min(widths) >= 2
    monkeypatch.setattr(lp, "COMPACT_MAX", -1.0)                 # never compact: same bits
    assert _same(want, _run(h, w, dl))


def test_a_transposed_operand_compacts_with_the_same_bits(route, monkeypatch, loops):
    # the weight gradient's a = dlogits^T (a transposed view) with one large entry per
    # vocabulary column: its top slice is sparse along the tokens, gathered from the
    # transposed store (NARROW_C = 0: not swapped to the other side)
    monkeypatch.setattr(lm, "NARROW_C", 0)
    monkeypatch.setattr(li, "SHORT_K", 0)
    monkeypatch.setattr(li, "INT_ROW_BLOCK", 64)
    g = torch.Generator().manual_seed(5)
    m, v, d = 200, 96, 24
    dl = torch.randn(m, v, generator=g) * 1e-4
    dl[torch.randint(0, 7, (v,), generator=g), torch.arange(v)] = 1.0
    h = torch.randn(m, d, generator=g).to(torch.bfloat16)
    route("float")
    with backend.force("cpu"):
        want = ozaki_mm(dl.t(), h.t())
        widths: list[int] = []
        route("int", _counting(widths))
        done = _completed(monkeypatch)
        got = ozaki_mm(dl.t(), h.t())
    assert done == [True]
    assert torch.equal(want.view(torch.int32), got.view(torch.int32))
    assert 2 <= min(widths) <= 7 and gemm_route.int_gemm_status()["failures"] == 0


def test_an_all_zero_or_single_column_slice_is_padded(route, monkeypatch, loops):
    # a block whose slice 1 is zero everywhere or in all but one column: the library's GEMM
    # needs K >= 2, so the union is padded with zero columns - the same T
    monkeypatch.setattr(li, "SHORT_K", 0)
    monkeypatch.setattr(li, "INT_ROW_BLOCK", 8)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(16, 50, generator=g) * 1e-3
    a[:8, 0] = 1.0                      # rows 0-7: slice 1 only in column 0
    a[8:] = torch.randn(8, 50, generator=g) * 1e-3
    a[8:, 3] = 1.0                      # rows 8-15: one column too
    a[12, 3] = 0.0                      # a row without its large entry: slice 1 all zero
    b = torch.randn(20, 50, generator=g)
    sa = _level_slices(a, 3, "test.sa", False)
    assert torch.equal(lp.compacted(sa, slice(0, 8), 3)[1], torch.tensor([0, 1]))
    _same_on_the_int_route(route, monkeypatch, a, b)


def test_contraction_chunks_never_leave_a_one_column_tail(route, monkeypatch):
    # a one-column chunk is a shape the library's GEMM refuses, which sent the whole
    # product to the float route (K = K_CHUNK + 1, e.g. a 32,769-entry vocabulary)
    monkeypatch.setattr(lp, "K_CHUNK", 16)
    for k in (1, 2, 15, 16, 17, 33, 300):
        got = lp.chunks(k)
        assert got[0][0] == 0 and got[-1][1] == k
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        assert all(min(2, k) <= k1 - k0 <= 16 for k0, k1 in got)
    monkeypatch.setattr(li, "SHORT_K", 0)
    g = torch.Generator().manual_seed(8)
    a, b = torch.randn(20, 17, generator=g), torch.randn(9, 17, generator=g)
    _same_on_the_int_route(route, monkeypatch, a, b)


def test_a_compaction_that_loses_a_column_is_caught(route, monkeypatch, loops):
    # the fault this guards against: a union missing a nonzero column gives a T short of
    # that column's terms; the row and column sums of the products no longer match the
    # slices', so the failure is counted and the float path recomputes the same bits
    monkeypatch.setattr(li, "SHORT_K", 0)
    h, w, dl = _case(seed=2, v=2000)
    route("float")
    want = _run(h, w, dl)
    sa = _level_slices(dl, 3, "test.sa", False)
    assert 1 in lp.compacted(sa, slice(0, 70), 3)                # dh's slice 1 compacts
    real = lp.nonzero_cols
    monkeypatch.setattr(lp, "nonzero_cols", lambda sa, i, rows: real(sa, i, rows)[:-1])
    _caught_and_recomputed(route, h, w, dl, want)


def _caught_and_recomputed(route, h, w, dl, want) -> None:
    """On the int route (the exact reference as the library's GEMM) the forged products fail
    the check once: counted, and the float path recomputes the same bits."""
    route("int", exact_mm)
    with pytest.warns(RuntimeWarning, match="checksum failed on the LM head.s slice products"):
        got = _run(h, w, dl)
    assert _same(want, got)
    st = gemm_route.int_gemm_status()
    assert st["route"] == "float" and st["failures"] == 1


@pytest.mark.parametrize("kind", ["weight", "drop", "double"])
def test_a_product_with_the_wrong_weight_or_dropped_or_doubled_is_caught(route, monkeypatch,
                                                                        loops, kind):
    # the check takes T's own sums against the definition's weighted pairs: a level product
    # given another level's weight (which unweighted sums of the products could not see),
    # or dropped, or run twice, is counted and the float path recomputes the same bits
    h, w, dl = _case(seed=3, v=900)
    route("float")
    want = _run(h, w, dl)
    real = lp.level_products

    def forged(plan, k, *sparse_b):
        got = real(plan, k, *sparse_b)
        p = got[0]
        if kind == "weight":
            return [lp.Product(p.a, p.b, p.weight * 2, p.k0, p.k1, p.cols), *got[1:]]
        return got[1:] if kind == "drop" else got + got[:1]
    monkeypatch.setattr(li, "level_products", forged)
    _caught_and_recomputed(route, h, w, dl, want)


def test_the_real_library_gemm_compacts_with_the_same_bits(route, monkeypatch):
    # the library's own int8 GEMM (forced: its probe decides) on the gathered operands
    monkeypatch.setattr(li, "SHORT_K", 0)
    h, w, dl = _case(m=300, k=64, v=2000)
    route("float")
    want = _run(h, w, dl)
    route("int")
    done = _completed(monkeypatch)
    got = _run(h, w, dl)
    assert gemm_route.int_gemm_status()["failures"] == 0 and done == [True] * 3
    assert _same(want, got)


def test_every_route_runs_the_one_plan(route, monkeypatch):
    # every route takes its compaction from the one planner: for the products whose
    # a is the 70 token rows (the forward's h, dh's dlogits: one row block on every route;
    # the weight gradient's blocks and orientation are the route's own) the same compacted
    # slices and columns - the route changes only the products behind the plan, and the
    # bits agree
    from open1b_kernels.int8 import amxmm, pairmm
    h, w, dl = _case(v=2000, seed=4)
    real = lp.compacted
    runs = {}
    for on in ("int", "amx", "pairs", "float"):
        if (on == "pairs" and not pairmm.available()) or (on == "amx" and not amxmm.available()):
            continue
        seen: list = []
        monkeypatch.setattr(lp, "compacted", lambda sa, rows, s: seen.append(
            (sa.shape, rows.start, {i: c.tolist() for i, c in real(sa, rows, s).items()}))
            or real(sa, rows, s))
        route(on, exact_mm if on == "int" else None)
        out = _run(h, w, dl)
        runs[on] = (sorted((x for x in seen if x[0][1] == 70), key=lambda x: x[0]), out)
    (want_plans, want), *others = runs.values()
    assert [x[0] for x in want_plans] == [(3, 70, 40), (3, 70, 2000)]
    assert not want_plans[0][2] and set(want_plans[1][2]) == {1}   # dh's slice 1 compacted
    for plans, bits in others:
        assert plans == want_plans and _same(want, bits)


def _rows_of_density(m, k, share, seed):
    """m rows of k values: each row's largest 1.0, ``share`` of its values 2^-10 (slice 2 of
    three: nonzero only there), the rest 2^-30 (below every slice)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((m, k), 2.0 ** -30)
    x[torch.rand(m, k, generator=g) < share] = 2.0 ** -10
    x[:, 0] = 1.0
    return x


def test_the_tiles_bound_on_row_by_row_slices(route, monkeypatch):
    # a slice with ~1/100 of its elements nonzero runs row by row where the dense products
    # are the library's GEMM (below ROW_SPARSE_MAX = 1/64) and dense on AMX tiles (above
    # ROW_SPARSE_MAX_TILES = 1/384: there the tiles' two pairs cost less than its rows);
    # with ~1/1000 both run it row by row - the same bits every way (the float route's)
    from open1b_kernels.ops import lmhead_rowsparse
    if not lmhead_rowsparse.available():
        pytest.skip("the row-sparse loop is not built")
    monkeypatch.setattr(lp, "ROW_SPARSE_SAMPLE", 1)
    w = (torch.randn(2000, 64, generator=torch.Generator().manual_seed(3)) * 0.02)
    real, rowwise = lmhead_rowsparse.rows_add, []
    monkeypatch.setattr(lmhead_rowsparse, "rows_add", lambda *x: rowwise.append(1) or real(*x))
    # enough rows that slice 2's nonzeros cover most columns: not compacted
    for share, m, tiles_rows in ((1 / 100, 300, ()), (1 / 1000, 2000, (2, 3))):
        dl = _rows_of_density(m, 2000, share, seed=7)
        sa = _level_slices(dl, 3, "t.a", False)
        sb = _level_slices(w.t().to(torch.bfloat16), 3, "t.b", True)
        rows = slice(0, m)
        assert lp.plan(sa, sb, rows, 3).by_rows == (2, 3)         # slice 3: all zero
        assert lp.plan(sa, sb, rows, 3, tiles=True).by_rows == tiles_rows
        route("float")
        with backend.force("cpu"):
            want = ozaki_mm(dl, w.t().to(torch.bfloat16))
        for which in ("int", "amx"):
            route(which)
            if gemm_route.int_gemm_route() != which:      # not on this CPU (no VNNI, no AMX)
                continue
            rowwise.clear()
            with backend.force("cpu"):
                got = ozaki_mm(dl, w.t().to(torch.bfloat16))
            assert torch.equal(got.view(torch.int32), want.view(torch.int32))
            assert gemm_route.int_gemm_status()["failures"] == 0
            assert bool(rowwise) == (which == "int" or tiles_rows == (2, 3))
