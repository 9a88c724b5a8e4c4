"""The LM head's products on the pair route (open1b_kernels/ops/lmhead_pairs.py and the
wide operands, int64 sums and rounding of open1b_kernels/int8/_pairmm.c, the row-sparse
slices of open1b_kernels/ops/_lmhead_rowsparse.c): every slice pair once with its weight, exact
at the extremes, the float route's bits through the head, and a check that catches a
wrong product."""
from __future__ import annotations

import itertools

import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.int8 import pairmm
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_int, lmhead_plan
from open1b_kernels.ops import lmhead_pairs as pp
from open1b_kernels.ops import lmhead_rowsparse as rowsparse
from open1b_kernels.ops import lmhead_sparse as ls

needs_pairs = pytest.mark.skipif(not pairmm.available(),
                                 reason="the pair GEMM needs x86-64 with AVX2 (and the build)")


@pytest.mark.parametrize("slices", [2, 3])
def test_terms_cover_every_pair_once_with_its_weight(slices):
    # any skipped (compacted) set: each pair (i, j), i + j <= S + 1, i not skipped, exactly
    # once, with weight 2^(7(S + 1 - i - j)); fewer products than pairs where two a slices
    # meet one b slice
    pairs = [(i, j) for i in range(1, slices + 1) for j in range(1, slices + 2 - i)]
    for n in range(slices + 1):
        for skip in itertools.combinations(range(1, slices + 1), n):
            got: dict[tuple[int, int], int] = {}
            for t in pp.terms(slices, set(skip)):
                for d, i in enumerate(t.a):              # wide: a_i weighs 128 a_(i+1)
                    assert (i, t.j) not in got
                    got[(i, t.j)] = t.shift + 7 * (len(t.a) - 1 - d)
                assert len(t.a) == 1 or t.a[1] == t.a[0] + 1
            assert got == {(i, j): 7 * (slices + 1 - i - j) for i, j in pairs if i not in skip}
    assert len(pp.terms(3)) == 4 and len(pp.terms(3, {1})) == 2 and len(pp.terms(2)) == 2


def _ref(terms, m, n):
    t = torch.zeros((m, n), dtype=torch.int64)
    for a, low, b, shift in terms:
        av = a.to(torch.int64) * (128 if low is not None else 1)
        if low is not None:
            av = av + low.to(torch.int64)
        t += (av @ b.to(torch.int64).t()) << shift
    return t


@needs_pairs
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 3, 17), (13, 1025, 33), (40, 2049, 50)])
def test_product_add_is_exact_for_wide_and_plain_terms(m, k, n):
    # K across the wide terms' 512-pair blocks and the plain terms' 1,024; both layouts;
    # a wide operand read in place (two slices of one store) and copied (two tensors)
    g = torch.Generator().manual_seed(m + k + n)
    store = torch.randint(-127, 128, (m, 3, k), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (2, n, k), generator=g, dtype=torch.int8)
    other = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    start = torch.randint(-1000, 1000, (m, n), generator=g, dtype=torch.int64)
    want = start + _ref([(store[:, 0], store[:, 1], b[0], 7), (store[:, 2], None, b[1], 0),
                         (other, store[:, 2], b[1], 3)], m, n)
    for layout in (lambda x: x, lambda x: x.t().contiguous().t()):
        bt = [layout(b[0]), layout(b[1])]
        t = start.clone()
        group = [(pairmm.pack(store[:, 0], pairmm.MR, "t.a0", store[:, 1]),
                  pairmm.pack(bt[0], pairmm.NR, "t.b0"), 7),
                 (pairmm.pack(store[:, 2], pairmm.MR, "t.a1"),
                  pairmm.pack(bt[1], pairmm.NR, "t.b1"), 0),
                 (pairmm.pack(layout(other), pairmm.MR, "t.a2", store[:, 2]),
                  pairmm.pack(bt[1], pairmm.NR, "t.b2"), 3)]
        assert group[0][0].wide and not group[1][0].wide
        pairmm.product_add(group, t)
        assert torch.equal(t, want)
        t.fill_(-7)                                   # start: stored, never read
        pairmm.product_add(group, t, start=True)
        assert torch.equal(t, want - start)
        # rounded in the kernel: round_block's bits and sums, T not stored
        rowf = lm._pow2_f64(torch.randint(-20, 20, (m,), generator=g))
        colf = lm._pow2_f64(torch.randint(-280, -250, (n,), generator=g))
        ref, got = torch.zeros((m, n + 3)), torch.zeros((m, n + 3))
        sums = [torch.zeros(x, dtype=torch.int64) for x in (m, n, m, n)]
        pairmm.round_block(want - start, rowf, colf, ref, 2, sums[0], sums[1])
        t.fill_(-7)
        pairmm.product_add(group, t, True, (rowf, colf, got, 2, sums[2], sums[3]))
        assert torch.equal(got.view(torch.int32), ref.view(torch.int32))
        assert torch.equal(sums[0], sums[2]) and torch.equal(sums[1], sums[3])
        assert k > 2 * 1024 or torch.equal(t, torch.full_like(t, -7))   # one K block


@needs_pairs
def test_product_add_at_the_extremes():
    # wide values +-16,383 against int8 -128 over two full 1,024-pair blocks: each 512-pair
    # int32 block reaches 2,147,352,576 (just below 2^31), the int64 sum 2^33 and more
    k = 4096
    for hi, lo, vb in [(127, 127, -128), (-127, -127, -128), (-127, -127, 127)]:
        a, low = torch.full((7, k), hi, dtype=torch.int8), torch.full((7, k), lo, dtype=torch.int8)
        b = torch.full((17, k), vb, dtype=torch.int8)
        t = torch.zeros((7, 17), dtype=torch.int64)
        pairmm.product_add([(pairmm.pack(a, pairmm.MR, "x.a", low),
                             pairmm.pack(b, pairmm.NR, "x.b"), 14)], t)
        assert torch.equal(t, _ref([(a, low, b, 14)], 7, 17))


@needs_pairs
def test_wide_operands_refuse_minus_128_and_bad_arguments_are_named():
    a = torch.zeros((5, 9), dtype=torch.int8)
    low = a.clone()
    low[2, 3] = -128
    with pytest.raises(ValueError, match="-128"):
        pairmm.pack(a, pairmm.MR, "bad.a", low)
    with pytest.raises(ValueError, match="low must be int8"):    # never converted silently
        pairmm.pack(a, pairmm.MR, "bad.a", low.to(torch.int16))
    pa = pairmm.pack(a, pairmm.MR, "ok.a")
    pb = pairmm.pack(torch.zeros((4, 9), dtype=torch.int8), pairmm.NR, "ok.b")
    with pytest.raises(ValueError, match="contiguous int64"):
        pairmm.product_add([(pa, pb, 0)], torch.zeros((5, 4), dtype=torch.int32))
    with pytest.raises(ValueError, match="does not fit"):
        pairmm.product_add([(pa, pb, 0)], torch.zeros((4, 5), dtype=torch.int64))
    words = (flat := lambda x: x.reshape(-1).numpy())(pa.words), flat(pb.words)
    c = flat(torch.zeros((5, 4), dtype=torch.int64))
    with pytest.raises(ValueError, match="shift"):                    # the C side too
        pairmm.LOOPS.product64([(*words, 0, 40)], c, 5, 4, 9, False, 0, 1)
    with pytest.raises(ValueError, match="terms"):
        pairmm.LOOPS.product64([(*words, 0, 0)] * 9, c, 5, 4, 9, False, 0, 1)
    with pytest.raises(ValueError, match="buffer"):
        pairmm.LOOPS.product64([(*words, 0, 0)], c, 5, 4, 99, False, 0, 1)


def _head_case(g, m=40, k=300, v=600):
    h = torch.randn(m, k, generator=g)
    h[3] *= 1e-30
    w = torch.randn(v, k, generator=g) * 0.02
    # a logits gradient: one large entry per row (its slice 1 compacts), a NaN row/column
    dl = torch.softmax(torch.randn(m, v, generator=g) * 0.5, 1) / m
    dl[torch.arange(m), torch.randint(0, v, (m,), generator=g)] -= 1.0 / m
    dl[5, 7] = float("nan")
    return h.to(torch.bfloat16), w.to(torch.bfloat16), dl


def _head(h, w, dl, slices):
    with force("cpu"):
        return (lm.lmhead_forward(h, w, slices), *lm.lmhead_backward(dl, h, w, slices))


def _many_blocks(monkeypatch, blocks: str) -> None:
    """Several row and column blocks, contraction chunks and compaction parts, the packs
    made again per block or kept across blocks (``blocks`` "many", "many-kept"; "one": as
    they are)."""
    if blocks != "one":
        monkeypatch.setattr(pp, "ROW_BLOCK", 16)
        monkeypatch.setattr(pp, "T_BLOCK", 16 * 32)
        monkeypatch.setattr(pp, "PACK_K", 64)
        monkeypatch.setattr(pp, "PACK_CACHE", 1 << 30 if blocks == "many-kept" else 0)
        monkeypatch.setattr(pp, "COMPACT_ROWS", 6)        # parts of a T block


@needs_pairs
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("blocks", ["one", "many", "many-kept"])
def test_lm_head_on_the_pair_route_gives_the_float_bits(route, monkeypatch, slices, blocks):
    # one block, or several row and column blocks with contraction chunks and compaction
    # parts, with the packs made again per block or kept across blocks
    # (the sparse pairs off: the test of them is below)
    monkeypatch.setattr(lmhead_plan, "PAIR_SPARSE_MAX", -1.0)
    _many_blocks(monkeypatch, blocks)
    h, w, dl = _head_case(torch.Generator().manual_seed(4))
    route("float")
    want = _head(h, w, dl, slices)
    calls = []
    real = pairmm.product_add
    monkeypatch.setattr(pairmm, "product_add", lambda terms, t, start=False, rounding=None: (
        calls.append((len(terms), terms[0][0].k, rounding is not None))
        or real(terms, t, start, rounding)))
    route("pairs")
    got = _head(h, w, dl, slices)
    assert gemm_route.int_gemm_status()["failures"] == 0
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))
    # the forward's products, the last one of a block rounding T in the kernel
    assert (len(pp.terms(slices)), 300 if blocks == "one" else 60, True) in calls
    assert any(n < len(pp.terms(slices)) for n, _, _ in calls)   # a compacted slice 1 (dh)
    if blocks != "one":                               # chunked: earlier chunks only add
        assert (len(pp.terms(slices)), 60, False) in calls


def _sparse_dl(g, m=128, v=600):
    # a logits gradient whose slice 2 is sparse in every row but spread over the columns:
    # the target at -1/m (slice 1), five entries per row in [2^-10, 2^-9) of it (slice 2:
    # above 2^-14 of the row's largest, below 2^-7), the rest below 2^-19 of it (slice 3
    # alone for S = 3; zero slices for S = 2); over 128 rows slice 2's nonzero columns are
    # more than half of the 600, so it is not compacted
    dl = torch.rand(m, v, generator=g) * 2e-6 / m
    dl.scatter_(1, torch.randint(0, v, (m, 5), generator=g),
                (1 + torch.rand(m, 5, generator=g)) / 1024 / m)
    dl[torch.arange(m), torch.randint(0, v, (m,), generator=g)] = -1.0 / m
    return dl


def _exact_mm(a, b_t):
    return gemm_route._exact_ref(a, b_t.t()).to(torch.int32)


def _integer_route(route, on: str) -> None:
    """The pair route, or the int route with the exact reference as the library's GEMM
    (so the test runs on any CPU)."""
    if on == "pairs":
        if not pairmm.available():
            pytest.skip("the pair GEMM is not built")
        route("pairs")
    else:
        route("int", _exact_mm)


@pytest.mark.skipif(not rowsparse.available(), reason="the row-sparse extension is not built")
@pytest.mark.parametrize("on", ["pairs", "int"])
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("case", ["one", "many", "uncompacted"])
def test_a_row_sparse_slice_runs_row_by_row_with_the_float_bits(route, monkeypatch, on, slices,
                                                               case):
    # dh's slice 2 row by row after the compacted slice 1 (S = 2: no dense product left),
    # in one T block or many; with no compaction, slices 1 and 2 row by row; the same bits
    # as the float route on both integer routes, and a denser slice stays dense
    if case == "many":                 # two row blocks, column blocks, contraction chunks
        monkeypatch.setattr(pp, "ROW_BLOCK", 64)
        monkeypatch.setattr(pp, "T_BLOCK", 64 * 32)
        monkeypatch.setattr(pp, "PACK_K", 64)
        monkeypatch.setattr(lmhead_int, "INT_ROW_BLOCK", 64)
        monkeypatch.setattr(lmhead_int, "INT_COL_BLOCK", 32)
        monkeypatch.setattr(lmhead_plan, "K_CHUNK", 256)
        monkeypatch.setattr(lmhead_plan, "COMPACT_MAX", 0.25)  # slice 2 over 64 rows: ~250 of 600
    if case == "uncompacted":
        monkeypatch.setattr(lmhead_plan, "COMPACT_MAX", 0.0)
    g = torch.Generator().manual_seed(8)
    h, w, _ = _head_case(g, m=128)
    dl = _sparse_dl(g)
    route("float")
    want = _head(h, w, dl, slices)
    calls = []
    real = rowsparse.rows_add
    monkeypatch.setattr(rowsparse, "rows_add", lambda a, bs, t: calls.append(
        [s for _, s in bs]) or real(a, bs, t))
    _integer_route(route, on)
    got = _head(h, w, dl, slices)
    assert gemm_route.int_gemm_status()["failures"] == 0
    assert gemm_route.int_gemm_status()["route"] == on
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))
    # slice i's pairs (i, j), j = 1 .. S + 1 - i, with their weights
    weights = {i: [7 * (slices + 1 - i - j) for j in range(1, slices + 2 - i)] for i in (1, 2)}
    assert calls and set(map(tuple, calls)) == (
        {tuple(weights[1]), tuple(weights[2])} if case == "uncompacted" else {tuple(weights[2])})
    calls.clear()
    monkeypatch.setattr(lmhead_plan, "ROW_SPARSE_MAX", 1 / 1200)   # below their 1-5 nonzeros a row
    got = _head(h, w, dl, slices)
    assert not calls
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))


@pytest.mark.skipif(not rowsparse.available(), reason="the row-sparse extension is not built")
@pytest.mark.parametrize("on", ["pairs", "int"])
@pytest.mark.parametrize("kind", ["weight", "dropped"])
def test_the_check_catches_a_wrong_row_sparse_product(route, monkeypatch, on, kind):
    # a row-sparse product with a wrong weight, or one never added: caught by T's sums,
    # counted, and recomputed on the float route with the right bits
    g = torch.Generator().manual_seed(9)
    h, w, _ = _head_case(g, m=128)
    dl = _sparse_dl(g)
    route("float")
    want = _head(h, w, dl, 3)
    _integer_route(route, on)
    real = rowsparse.rows_add
    forged = {"weight": lambda a, bs, t: real(a, [(b, s + 1) for b, s in bs], t),
              "dropped": lambda a, bs, t: 0}[kind]
    monkeypatch.setattr(rowsparse, "rows_add", forged)
    with pytest.warns(RuntimeWarning, match="pair products" if on == "pairs" else
                      "slice products"):
        got = _head(h, w, dl, 3)
    status = gemm_route.int_gemm_status()
    assert status["failures"] >= 1 and status["route"] == "float"
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))


def _corrupt_terms(kind):
    real = pp.terms

    def terms(slices, skip=frozenset(), skip_b=frozenset()):
        got = real(slices, skip, skip_b)
        if kind == "drop":
            return got[:-1]
        if kind == "double":
            return got + got[-1:]
        t = got[0]
        if kind == "weight":
            return [pp.Term(t.a, t.j, t.shift + 1), *got[1:]]
        return [pp.Term(t.a, t.j % slices + 1, t.shift), *got[1:]]    # the wrong b slice
    return terms


@needs_pairs
@pytest.mark.parametrize("kind", ["drop", "double", "weight", "operand"])
def test_the_check_catches_a_wrong_product_and_the_float_route_recomputes(route, monkeypatch,
                                                                          kind):
    h, w, dl = _head_case(torch.Generator().manual_seed(6))
    route("float")
    want = _head(h, w, dl, 3)
    route("pairs")
    monkeypatch.setattr(pp, "terms", _corrupt_terms(kind))
    with pytest.warns(RuntimeWarning, match="pair products"):
        got = _head(h, w, dl, 3)
    status = gemm_route.int_gemm_status()
    assert status["failures"] >= 1 and status["route"] == "float"
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))


needs_sparse = pytest.mark.skipif(ls.loop() not in ("avx2", "vnni"),
                                  reason="the sparse pair's AVX2 loop needs x86-64 with AVX2")


@pytest.fixture
def sparse_pairs(monkeypatch):
    """The pair route's sparse products, counted as (a slice, b slice, sparse side)."""
    got: list[tuple[int, int, str]] = []
    real = pp._sparse_into
    monkeypatch.setattr(pp, "_sparse_into", lambda sa, sb, pairs, *rest: (
        got.extend(pairs), real(sa, sb, pairs, *rest))[1])
    return got


@needs_pairs
@needs_sparse
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("blocks", ["one", "many", "many-kept"])
def test_sparse_pairs_on_the_pair_route_give_the_float_bits(route, monkeypatch, sparse_pairs,
                                                            slices, blocks):
    # Gaussian h and w: slice 3 of each holds ~2% of the elements, so with S = 3 the forward
    # runs (3, 1) from h's side and (1, 3) from w's - two of its four products - and the
    # weight gradient (1, 3) from h's (b) side; with S = 2 slice 2 is dense: none. The dense
    # products then leave T to the rounding pass
    _many_blocks(monkeypatch, blocks)
    h, w, dl = _head_case(torch.Generator().manual_seed(4))
    route("float")
    want = _head(h, w, dl, slices)
    route("pairs")
    got = _head(h, w, dl, slices)
    assert gemm_route.int_gemm_status()["failures"] == 0
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))
    assert set(sparse_pairs) == ({(3, 1, "a"), (1, 3, "b")} if slices == 3 else set())


@needs_pairs
@needs_sparse
def test_a_slice_between_two_dense_ones_stays_in_its_wide_product(route, monkeypatch,
                                                                  sparse_pairs):
    # slice 2 of a sparse enough (forced): leaving the dense products would split the wide
    # 128 a_1 + a_2 into a_1 alone - as many dense products and a sparse one more - so it
    # stays; slice 3 (sparse) leaves. The float bits either way
    monkeypatch.setattr(lmhead_plan, "sparse_share", lambda x, i, rows: 0.0 if i > 1 else 1.0)
    h, w, dl = _head_case(torch.Generator().manual_seed(5))
    route("float")
    want = _head(h, w, dl, 3)
    route("pairs")
    got = _head(h, w, dl, 3)
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))
    assert sparse_pairs and all(i != 2 or side == "b" for i, _, side in sparse_pairs)
    assert (3, 1, "a") in sparse_pairs and (2, 2, "b") in sparse_pairs


@needs_pairs
@needs_sparse
@pytest.mark.parametrize("side", ["a", "b"])
def test_the_check_catches_a_wrong_sparse_pair_on_the_pair_route(route, monkeypatch, side):
    # the forgery: one sparse product off by one in one element (a miscompiled AVX2 loop's,
    # or an adversary's) - T's row and column sums catch it, the failure is counted and the
    # float route recomputes: its bits
    h, w, dl = _head_case(torch.Generator().manual_seed(6))
    route("float")
    want = _head(h, w, dl, 3)
    route("pairs")
    real = ls.sparse_mm

    def wrong(s, d, out, add=False, loop="auto"):
        real(s, d, out, add, loop)
        if (side == "a") == (out.stride(1) == 1):
            out[1, 2] += 1
        return out

    monkeypatch.setattr(ls, "sparse_mm", wrong)
    with pytest.warns(RuntimeWarning, match="pair products"):
        got = _head(h, w, dl, 3)
    status = gemm_route.int_gemm_status()
    assert status["failures"] >= 1 and status["route"] == "float"
    assert all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(want, got))


@needs_pairs
def test_round_block_matches_the_definition():
    # fp32((T * rowf) * colf) with the row and column sums, modulo 2^64 past int64
    g = torch.Generator().manual_seed(2)
    t = torch.randint(-(1 << 52), 1 << 52, (9, 21), generator=g, dtype=torch.int64)
    t[0, :] = (1 << 62) + 12345
    rowf = lm._pow2_f64(torch.randint(-30, 30, (9,), generator=g))
    colf = lm._pow2_f64(torch.randint(-300, -200, (21,), generator=g))
    out = torch.full((9, 30), 5.0)
    rows, cols = torch.zeros(9, dtype=torch.int64), torch.zeros(21, dtype=torch.int64)
    pairmm.round_block(t, rowf, colf, out, 4, rows, cols)
    want = ((t.to(torch.float64) * rowf[:, None]) * colf[None, :]).to(torch.float32)
    assert torch.equal(out[:, 4:25].view(torch.int32), want.view(torch.int32))
    assert torch.equal(out[:, :4], torch.full((9, 4), 5.0))
    assert torch.equal(rows, t.sum(1)) and torch.equal(cols, t.sum(0))
