"""The LM head's CPU integer route (``open1b_kernels.ops.lmhead_int``): the library's
int8 GEMM per slice level, checked once per product by exact row and column sums. It must
give the float path's bits (both slice counts, chunked contractions, several output blocks,
non-finite rows), and a faulty integer GEMM - a wrong element, or two that cancel in their
row - must be caught, counted, and recomputed on the float path with the same bits."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend, mathc
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_int as li
from open1b_kernels.ops import lmhead_plan as lp
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward
from tests.kernels.support import needs_loops


def exact_mm(a, b_t):
    return gemm_route._exact_ref(a, b_t.t()).to(torch.int32)


def _case(m=40, k=300, v=90, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, k, generator=g)
    h[3] *= 1e-30                                   # a row far below the others
    w = torch.randn(v, k, generator=g) * 0.02
    dl = torch.randn(m, v, generator=g) * 1e-4
    return h.to(torch.bfloat16), w.to(torch.bfloat16), dl


def _run(h, w, dl, slices):
    with backend.force("cpu"):
        return (lmhead_forward(h, w, slices), *lmhead_backward(dl, h, w, slices))


def _same(xs, ys):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(xs, ys))


@pytest.fixture(params=["compiled", "torch"])
def loops(request, monkeypatch):
    """The integer route's work between GEMMs by its compiled loop (level sums, check sums,
    rounding: ``_lmhead_sums.c``), or by the torch code (OPEN1B_MATHC=0): both are tested."""
    if request.param == "torch":
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    elif not mathc.available():
        pytest.skip("the compiled loops are not built")
    return request.param


@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("row_block", [16, 128])
@pytest.mark.parametrize("short", [True, False])
@pytest.mark.parametrize("chunked", [True, False])
def test_int_route_gives_the_float_paths_bits(route, monkeypatch, slices, loops, row_block,
                                              short, chunked):
    # small blocks and chunks: several row and column blocks, contraction chunks flushed
    # (level operands copied chunk by chunk) or one chunk (level operands are views of the
    # level-ready slices, open1b_kernels.ops.lmhead_slices); 128 rows: one row block, where each b
    # operand is built when used; the blocks of short contractions (every K here counted
    # short), or the long ones (SHORT_K = 0)
    if short:
        monkeypatch.setattr(li, "SHORT_K", 1 << 30)
        monkeypatch.setattr(li, "SHORT_BLOCKS", (row_block, 32))
    else:
        monkeypatch.setattr(li, "SHORT_K", 0)
        monkeypatch.setattr(li, "INT_ROW_BLOCK", row_block)
        monkeypatch.setattr(li, "INT_COL_BLOCK", 32)
    if chunked:
        monkeypatch.setattr(lp, "K_CHUNK", 64)
    # the dense plan: every level's pairs in its GEMM (the sparse pairs of a VNNI CPU's plan:
    # tests/kernels/test_lmhead_sparse.py)
    monkeypatch.setattr(lp, "SPARSE_MAX", -1.0)
    h, w, dl = _case()
    dl[5, 7] = float("nan")                         # a non-finite row and column of dlogits
    route("float")
    want = _run(h, w, dl, slices)
    shapes = []

    def counting(a, b_t):
        shapes.append(a.shape[1])
        return exact_mm(a, b_t)

    route("int", counting)
    got = _run(h, w, dl, slices)
    # the level products ran on the integer GEMM (pairs concatenated: 1..S pairs x chunk;
    # 300 columns in 64-column chunks are five of 60: no short tail)
    assert {(60 if chunked else 300) * p for p in range(1, slices + 1)} <= set(shapes)
    assert gemm_route.int_gemm_status() | {"reason": ""} == gemm_route.int_gemm_status() | {
        "route": "int", "failures": 0, "reason": ""}
    assert _same(want, got)


@pytest.mark.parametrize("fault", ["one element", "cancelling in a row"])
def test_a_faulty_integer_gemm_is_caught_and_recomputed(route, monkeypatch, fault, loops):
    monkeypatch.setattr(li, "SHORT_K", 1 << 30)
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    h, w, dl = _case(seed=1)
    route("float")
    want = _run(h, w, dl, 3)
    calls = []

    def faulty(a, b_t):                             # exact on the probe, wrong in one block
        out = exact_mm(a, b_t)
        if a.shape[1] != 300 and a.shape[1] % 300 == 0:        # the head's level products
            calls.append(1)
            if len(calls) == 4:
                out[2, 3] += 1
                if fault == "cancelling in a row":
                    out[2, 9] -= 1                  # the row sum is unchanged
        return out

    route("int", faulty)
    with pytest.warns(RuntimeWarning, match="checksum failed on the LM head.s slice products"):
        got = _run(h, w, dl, 3)
    assert _same(want, got)
    st = gemm_route.int_gemm_status()
    assert st["route"] == "float" and st["failures"] == 1


@pytest.mark.parametrize("slices", [2, 3])
def test_a_narrow_weight_gradient_runs_swapped_with_the_same_bits(route, monkeypatch, slices,
                                                                  loops):
    # d_model 24 < the vocabulary's 90 rows: the weight gradient dlogits^T h (a transposed
    # view, 24 output columns) runs as (h^T dlogits)^T on the integer route (NARROW_C)
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    h, w, dl = _case(k=24)
    dl[5, 7] = float("nan")                         # its column is a NaN row of the swap
    route("float")
    want = _run(h, w, dl, slices)
    route("int", exact_mm)
    swapped = []
    real = lm._narrow_transposed
    monkeypatch.setattr(lm, "_narrow_transposed",
                        lambda a, b: swapped.append(real(a, b)) or swapped[-1])
    got = _run(h, w, dl, slices)
    assert swapped.count(True) == 1                 # the weight gradient only, once
    assert _same(want, got)
    monkeypatch.setattr(lm, "NARROW_C", 0)          # the unswapped orientation: same bits
    assert _same(want, _run(h, w, dl, slices))


@needs_loops
@pytest.mark.parametrize("n, with_base, width",
                         [(n, b, 70) for n in (0, 2, 3, 6) for b in (False, True) if n or b]
                         # nothing at all: refused, tested below; 1,100 columns: rows
                         # longer than a vector loop's unrolled body, both loops
                         + [(6, False, 1100), (6, True, 1100), (3, False, 1100)])
def test_compiled_lmhead_level_loop_equals_torch(n, with_base, width):
    """The level loop (``levels_round_weighted`` in ``_lmhead_sums.c``): the pass after the
    level GEMMs of one block (the weighted level sum
    T on an int64 base part - the row-sparse slices' - or on zero, its one rounding into the
    output's columns, T's row and column sums modulo 2^64) against the torch operations it
    replaces - int32 extremes, the two levels of S = 2 and the three of S = 3 (the loop's
    unrolled cases), S = 3 with two contraction chunks per level (six products: the general
    loop) and the base alone, rows split among threads, sums added to what is there."""
    g = torch.Generator().manual_seed(4)
    accs = torch.randint(-2**31, 2**31 - 1, (n, 37, width), generator=g,
                         dtype=torch.int64).to(torch.int32)
    if n:
        accs[0, 0], accs[-1, 1] = 2**31 - 1, -2**31
    weights = {0: [], 2: [float(1 << 7), 1.0], 3: [float(1 << 14), float(1 << 7), 1.0],
               6: [float(1 << 14)] * 2 + [float(1 << 7)] * 2 + [1.0] * 2}[n]
    base = None
    if with_base:                      # |T| < 2^53 keeps float64 exact: the base below 2^51
        base = torch.randint(-2**51, 2**51, (37, width), generator=g, dtype=torch.int64)
    rowf = torch.pow(2.0, torch.randint(-60, 60, (37,), generator=g).double())
    colf = torch.pow(2.0, torch.randint(-200, -100, (width,), generator=g).double())
    out = torch.zeros((37, width + 20))
    # sums near the int64 limits: T's row sums wrap modulo 2^64, as the check's do
    rows = torch.full((37,), 2**63 - 5, dtype=torch.int64)
    cols = torch.full((width,), -2**63 + 3, dtype=torch.int64)
    want_rows, want_cols = rows.clone(), cols.clone()
    assert li._levels_round_compiled(accs, weights, rowf, colf, out, 11, rows, cols, base)
    t = base.double() if with_base else torch.zeros((37, width), dtype=torch.float64)
    u = base.clone() if with_base else torch.zeros((37, width), dtype=torch.int64)
    for a, w in zip(accs, weights):
        t = t + a.to(torch.float64) * w
        u = u + a.to(torch.int64) * int(w)
    ref = (t * rowf[:, None] * colf[None, :]).to(torch.float32)
    assert torch.equal(out[:, 11:11 + width].view(torch.int32), ref.view(torch.int32))
    assert not out[:, :11].any() and not out[:, 11 + width:].any()
    # the reference sums in Python integers, reduced modulo 2^64 to int64
    def wrap(x: int) -> int:
        return (x + 2**63) % 2**64 - 2**63
    uu = u.tolist()
    assert rows.tolist() == [wrap(r0 + sum(row)) for r0, row in zip(want_rows.tolist(), uu)]
    assert cols.tolist() == [wrap(c0 + sum(uu[r][c] for r in range(37)))
                             for c, c0 in enumerate(want_cols.tolist())]


@needs_loops
def test_compiled_lmhead_level_loop_refuses_bad_arguments():
    # a weight that is not a power of two (the sums' shifts), or no products and no base:
    # refused by name, nothing written
    accs = torch.ones((2, 4, 5), dtype=torch.int32)
    out = torch.zeros((4, 5))
    rows, cols = torch.zeros(4, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
    one = torch.ones(4, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
    for weights in ([3.0, 1.0], [0.5, 1.0], [float(2**63), 1.0]):
        with pytest.raises(ValueError, match="power of two"):
            li._levels_round_compiled(accs, weights, *one, out, 0, rows, cols)
    with pytest.raises(ValueError, match="levels_round_weighted"):
        li._levels_round_compiled(accs[:0], [], *one, out, 0, rows, cols)
    assert not out.any() and not rows.any() and not cols.any()
