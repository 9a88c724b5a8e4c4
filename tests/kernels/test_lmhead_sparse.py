"""One LM-head slice pair with a sparse slice (open1b_kernels/ops/_lmhead_sparse.c): exact
against int64 products in every layout the slices' stores hold (row-major or transposed
operands, a transposed output), stored or added, by the VNNI loop, the AVX2 one and the plain one, at the
int32 bound; bad arguments refused by name. Planned on the integer route, the sparse pairs
give the dense plan's bits (forward, both gradients, chunked and short contractions), and a
wrong sparse product is caught by the route's checksum like a wrong GEMM."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.ops import lmhead_int as li
from open1b_kernels.ops import lmhead_plan as lp
from open1b_kernels.ops import lmhead_sparse as ls
from tests.kernels.support import needs_loops
from tests.kernels.test_lmhead_int import _case, _run, _same, exact_mm
from tests.kernels.test_lmhead_plan import _caught_and_recomputed

# the plain loop, the AVX2 one (x86-64 with AVX2) and the VNNI one where this CPU runs them
PATHS = ["plain"] + {"vnni": ["avx2", "vnni"], "avx2": ["avx2"]}.get(ls.loop(), [])


def _sparse(n, k, density, g):
    keep = torch.rand(n, k, generator=g) < density
    return (torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8) * keep).to(torch.int8)


def _layouts(x):
    """``x`` row-major and as a transposed view of its transpose (the two store layouts)."""
    return [x, x.t().contiguous().t()]


@needs_loops
@pytest.mark.parametrize("loop", PATHS)
@pytest.mark.parametrize("n_s,k,n_d,density", [
    (1, 1, 1, 1.0), (17, 100, 70, 0.1), (33, 333, 300, 0.5), (40, 2049, 513, 0.03),
    (16, 64, 256, 0.0)])
@pytest.mark.parametrize("threads", [1, 3])
def test_sparse_mm_is_exact_in_every_layout(loop, n_s, k, n_d, density, threads):
    # rows not a multiple of the 16-row tile, columns not of the 64-column panel or the
    # 256-column block, K not of the scan's words, an all-zero row, one of each sign only
    g = torch.Generator().manual_seed(n_s + k + n_d)
    s = _sparse(n_s, k, density, g)
    s[n_s // 2] = 0
    if n_s > 2:
        s[0] = s[0].abs()
        s[1] = -s[1].abs()
    d = torch.randint(-127, 128, (k, n_d), generator=g, dtype=torch.int8)
    want = (s.long() @ d.long()).int()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for sv in _layouts(s):
            for dv in _layouts(d):
                for out in (torch.empty(n_s, n_d, dtype=torch.int32),
                            torch.empty(n_d, n_s, dtype=torch.int32).t()):
                    assert torch.equal(ls.sparse_mm(sv, dv, out, loop=loop), want)
                    assert torch.equal(ls.sparse_mm(sv, dv, out, add=True, loop=loop), 2 * want)
    finally:
        torch.set_num_threads(old)


@needs_loops
@pytest.mark.parametrize("loop", PATHS)
def test_sparse_mm_at_the_int32_bound(loop):
    # every product (-128) x (-128) over the largest K: 2^30 in one element, reached through
    # the negative quads (|S| 128 as an unsigned byte, the accumulators negated twice); a row
    # of both signs
    k = ls.MAX_K
    s = torch.full((2, k), -128, dtype=torch.int8)
    s[1, : k // 2] = 127
    d = torch.full((k, 70), -128, dtype=torch.int8)
    d[:, 3] = 127
    out = torch.zeros((2, 70), dtype=torch.int32)
    ls.sparse_mm(s, d, out, loop=loop)
    assert torch.equal(out, (s.long() @ d.long()).int())
    assert int(out.max()) == 1 << 30


@needs_loops
def test_sparse_mm_refuses_bad_arguments():
    s = torch.zeros((4, 8), dtype=torch.int8)
    d = torch.zeros((8, 5), dtype=torch.int8)
    out = torch.zeros((4, 5), dtype=torch.int32)
    with pytest.raises(ValueError, match="sparse_mm needs int8 s"):
        ls.sparse_mm(s.int(), d, out)
    with pytest.raises(ValueError, match="an int32 out"):
        ls.sparse_mm(s, d, out.long())
    with pytest.raises(ValueError, match=r"1 <= K <= 65536"):
        ls.sparse_mm(torch.zeros((1, ls.MAX_K + 1), dtype=torch.int8),
                     torch.zeros((ls.MAX_K + 1, 1), dtype=torch.int8),
                     torch.zeros((1, 1), dtype=torch.int32))
    with pytest.raises(ValueError, match="unit stride"):
        ls.sparse_mm(s, torch.zeros((8, 10), dtype=torch.int8)[:, ::2], out)
    empty = ls.sparse_rows(torch.zeros((0, 8), dtype=torch.int8))     # no rows: nothing to do
    assert ls.sparse_mm(empty, d, torch.zeros((0, 5), dtype=torch.int32)).shape == (0, 5)
    rows = ls.sparse_rows(s)
    args = (d.numpy().reshape(-1), 5, 5, 1, out.numpy().reshape(-1), 5, 1)
    with pytest.raises(ValueError, match="block range"):       # the C wrapper's own check
        ls.LOOPS.sparse_mm(rows.quads, 4, 8, *args, 0, 2)
    with pytest.raises(ValueError, match="loop must be one of auto, plain, avx2, vnni"):
        ls.sparse_mm(s, d, out, loop="avx512")
    with pytest.raises(ValueError, match="loop 9 does not run on this CPU"):
        ls.LOOPS.sparse_mm(rows.quads, 4, 8, *args, 0, 1, 1, 0, 9)
    with pytest.raises(ValueError, match="for s \\(4, 8\\)"):
        ls.sparse_mm(rows, torch.zeros((9, 5), dtype=torch.int8), out)


@needs_loops
def test_sparse_mm_refuses_quads_that_do_not_fit():
    # the forgery: quads made for other rows, or edited to point past the dense operand (a
    # k of K or more would read beyond D's rows) or to carry |S| above 128 - refused before
    # any product, by name
    g = torch.Generator().manual_seed(5)
    s = _sparse(6, 40, 0.3, g)
    d = torch.randint(-127, 128, (40, 20), generator=g, dtype=torch.int8)
    out = torch.zeros((6, 20), dtype=torch.int32)
    good = ls.sparse_rows(s)
    assert torch.equal(ls.sparse_mm(good, d, out), (s.long() @ d.long()).int())
    head = 8 * (2 * 6 + 1)
    total = (len(good.quads) - head) // 20
    k_at = head                                  # the first quad's first column
    v_at = head + 16 * total                     # and its first |S|
    forged = {
        "other rows": ls.SparseRows(good.quads, 5, 40),
        "other K": ls.SparseRows(good.quads, 6, 30) if int(s[:, 30:].ne(0).sum()) else None,
        "k past D": ls.SparseRows(good.quads[:k_at] + (40).to_bytes(4, "little")
                                  + good.quads[k_at + 4:], 6, 40),
        "|S| above 128": ls.SparseRows(good.quads[:v_at] + bytes([129]) + good.quads[v_at + 1:],
                                       6, 40),
        "cut short": ls.SparseRows(good.quads[:-1], 6, 40),
    }
    for name, rows in forged.items():
        if rows is None:
            continue
        with pytest.raises(ValueError, match="the quads do not fit"):
            ls.sparse_mm(rows, d[: rows.k], torch.zeros((rows.rows, 20), dtype=torch.int32))


def test_level_products_fold_the_sparse_pairs_into_their_level():
    # S = 3: a_3 sparse (pair (3, 1)) and b_3 sparse (pair (1, 3)) leave the lowest level's
    # GEMM with (2, 2), and both add onto its int32 sums; chunked, they get slots of their own
    p = lp.Plan(slice(0, 8), 3, ((slice(0, 8), {}),), (), frozenset({3}))
    got = lp.level_products(p, 100, frozenset({3}))
    dense = [(q.a, q.b) for q in got if not q.sparse]
    assert dense == [((1,), (1,)), ((1, 2), (2, 1)), ((2,), (2,))]
    assert [(q.a, q.b, q.sparse, q.add, q.weight) for q in got if q.sparse] == [
        ((1,), (3,), "b", True, 1.0), ((3,), (1,), "a", True, 1.0)]
    chunked = lp.level_products(p, 3 * lp.K_CHUNK, frozenset({3}))
    assert [q.add for q in chunked if q.sparse] == [False, False]


@pytest.fixture
def sparse_planned(monkeypatch):
    """The integer route planning sparse pairs here (the plain loop where no VNNI runs),
    counting the sparse products by side."""
    monkeypatch.setattr(ls, "loop", lambda: "vnni")     # planned; run by the best loop here
    sides: list[str] = []
    real = li.sparse_product
    monkeypatch.setattr(li, "sparse_product", lambda sa, sb, q, *rest: (
        sides.append(q.sparse), real(sa, sb, q, *rest))[1])
    return sides


@needs_loops
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("short", [True, False])
def test_sparse_pairs_give_the_dense_plans_bits(route, monkeypatch, sparse_planned, slices,
                                                short):
    # Gaussian h and w of 300 columns: slice 3 of each holds ~2% of the elements, so the
    # forward runs (3, 1) from a's side and (1, 3) from b's, the weight gradient (1, 3)
    # from h's (with two slices, slice 2 is dense: no sparse pair); several row and column
    # blocks
    if short:
        monkeypatch.setattr(li, "SHORT_K", 1 << 30)
        monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    else:
        monkeypatch.setattr(li, "SHORT_K", 0)
        monkeypatch.setattr(li, "INT_ROW_BLOCK", 16)
        monkeypatch.setattr(li, "INT_COL_BLOCK", 32)
    h, w, dl = _case(m=64, v=96)
    route("float")
    want = _run(h, w, dl, slices)
    route("int", exact_mm)
    monkeypatch.setattr(lp, "SPARSE_MAX", -1.0)                 # the dense plan
    dense = _run(h, w, dl, slices)
    assert sparse_planned == []
    monkeypatch.setattr(lp, "SPARSE_MAX", 1 / 8)
    got = _run(h, w, dl, slices)
    assert set(sparse_planned) == ({"a", "b"} if slices == 3 else set())
    assert _same(want, dense) and _same(want, got)
    assert gemm_route.int_gemm_status()["failures"] == 0


@needs_loops
def test_a_wrong_sparse_product_is_caught_and_recomputed(route, monkeypatch, sparse_planned):
    # the forgery: a sparse pair's sums off by one in one element (an adversary's, or a
    # miscompiled loop's) - the integer route's row and column sums of T catch it, count
    # the failure and recompute on the float route: the same bits as the float route
    monkeypatch.setattr(li, "SHORT_K", 1 << 30)
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    h, w, dl = _case(m=64, v=96, seed=2)
    route("float")
    want = _run(h, w, dl, 3)
    real = ls.sparse_mm

    def wrong(s, d, out, add=False, loop="auto"):
        real(s, d, out, add, loop)
        out[1, 2] += 1
        return out

    monkeypatch.setattr(ls, "sparse_mm", wrong)
    _caught_and_recomputed(route, h, w, dl, want)
