"""The LM head's CPU float route (``open1b_kernels.ops.lmhead_float``): float GEMMs of the
int8 slices, converted chunk by chunk from the level-ready store. Its groupings - levels side
by side along K, S = 3's two-GEMM head form, a sparse slice compacted to its nonzero
columns, contraction chunks that straddle two slices, transposed stores - must all give the
bits of the plainest grouping (every pair on its own, no compaction, one block)."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_float as fp
from open1b_kernels.ops import lmhead_plan as lp
from open1b_kernels.ops.lmhead_slices import LevelSlices
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward
from tests.kernels.support import needs_loops


def _case(m=48, k=300, v=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(m, k, generator=g)
    h[3] *= 1e-30                                   # a row far below the others
    w = torch.randn(v, k, generator=g) * 0.02
    # a logits gradient: p - onehot(target), one large element per row, the rest tiny -
    # slice 1 is nonzero in about one column per row, so dh compacts it
    dl = torch.softmax(torch.randn(m, v, generator=g), 1) * 1e-3
    dl[torch.arange(m), torch.randint(0, v, (m,), generator=g)] -= 1.0
    return h.to(torch.bfloat16), w.to(torch.bfloat16), dl


def _run(h, w, dl, slices):
    with backend.force("cpu"):
        return (lmhead_forward(h, w, slices), *lmhead_backward(dl, h, w, slices))


def _bits(xs):
    return [x.view(torch.int32).clone() for x in xs]


@pytest.fixture
def plain(route, monkeypatch):
    """The float route's plainest grouping, as the reference: no compaction, six (three)
    slice products by levels, one output block per product."""
    route("float")

    def run(h, w, dl, slices):
        with monkeypatch.context() as m:
            m.setattr(lp, "COMPACT_MAX", -1.0)
            m.setattr(lm, "CPU_S3_TWO_GEMMS", False)
            m.setattr(fp, "ROW_BLOCK", 1 << 20)
            m.setattr(fp, "COL_BLOCK", 1 << 20)
            return _bits(_run(h, w, dl, slices))
    return run


@pytest.mark.parametrize("slices", [2, 3])
def test_the_compacted_slice_gives_the_plain_bits(plain, monkeypatch, slices):
    h, w, dl = _case()
    want = plain(h, w, dl, slices)
    gathered = []
    real = LevelSlices.gather

    def spy(self, i, rows, cols, name):
        gathered.append((i, cols.numel()))
        return real(self, i, rows, cols, name)

    monkeypatch.setattr(LevelSlices, "gather", spy)
    monkeypatch.setattr(fp, "ROW_BLOCK", 16)            # several row blocks, each its own union
    monkeypatch.setattr(fp, "COL_BLOCK", 32)
    got = _bits(_run(h, w, dl, slices))
    # dh compacted slice 1 of dlogits: a union of at most a few columns per row block
    assert any(i == 1 and n <= 16 for i, n in gathered)
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("two_gemms", [True, False])
def test_chunks_straddling_two_slices_give_the_plain_bits(plain, monkeypatch, slices,
                                                          two_gemms):
    # 300 columns per slice in chunks of 70: a level's concatenated operand [a_i | a_i']
    # has chunks holding the end of one slice and the start of the next; dw's operands are
    # transposed stores (dlogits^T, h^T), so those chunks copy rows of the transposed layout
    h, w, dl = _case(seed=1)
    want = plain(h, w, dl, slices)
    monkeypatch.setattr(fp, "SGEMM_K", 70)
    monkeypatch.setattr(fp, "ROW_BLOCK", 20)
    monkeypatch.setattr(fp, "COL_BLOCK", 24)
    monkeypatch.setattr(lm, "CPU_S3_TWO_GEMMS", two_gemms)
    got = _bits(_run(h, w, dl, slices))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name


def test_a_chunk_that_drops_a_column_is_not_the_plain_bits(plain, monkeypatch):
    # the comparison above can fail: a chunking that loses the last column of each slice
    # changes the logits
    h, w, dl = _case(seed=2)
    want = plain(h, w, dl, 3)
    real = fp._chunk

    def lossy(planes, k0, k1, u0, u1, dtype, name, coef=None):
        view = real(planes, k0, k1, u0, u1, dtype, name, coef)
        if u1 == len(planes) * (k1 - k0) if coef is None else u1 == k1 - k0:
            view[:, -1] = 0
        return view

    monkeypatch.setattr(fp, "_chunk", lossy)
    got = _bits(_run(h, w, dl, 3))
    assert not torch.equal(want[0], got[0])


def test_a_compaction_that_loses_a_column_is_caught_on_the_float_route(plain, monkeypatch):
    # the fault the union's check stops: columns that miss a nonzero of the compacted slice
    # would drop its terms from dh. The float route has no checksum of its own: the count of
    # the slice's nonzeros against the gathered ones sends the block to the plain products
    h, w, dl = _case(seed=4)
    want = plain(h, w, dl, 3)
    real = lp.nonzero_cols
    monkeypatch.setattr(lp, "nonzero_cols", lambda sa, i, rows: real(sa, i, rows)[:-1])
    with pytest.warns(RuntimeWarning, match="compacted slice 1 missed a nonzero column"):
        got = _bits(_run(h, w, dl, 3))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name
    monkeypatch.setattr(fp, "verified", lambda sa, p: p)   # without the check
    assert not torch.equal(want[1], _bits(_run(h, w, dl, 3))[1])


@needs_loops
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("parts", [1, 2, fp.PARTS])
def test_the_compiled_sum_of_the_products_gives_the_torch_bits(route, monkeypatch, slices,
                                                                parts):
    # a block's float32 products wait in scratch and one compiled pass adds them into T
    # (_float_sum_compiled), the last rounding into the output: against the torch adds and
    # multiplies, with chunks of 70 so that products outnumber the waiting parts (the
    # passes that store T, then the one that rounds), S = 3's head product writing T first
    route("float")
    h, w, dl = _case(seed=5)
    monkeypatch.setattr(fp, "SGEMM_K", 70)
    monkeypatch.setattr(fp, "ROW_BLOCK", 20)
    monkeypatch.setattr(fp, "COL_BLOCK", 24)
    full = fp.PARTS
    monkeypatch.setattr(fp, "PARTS", parts)
    calls = []
    real = fp._float_sum_compiled
    monkeypatch.setattr(fp, "_float_sum_compiled", lambda *a: calls.append(a[3]) or real(*a))
    got = _bits(_run(h, w, dl, slices))
    assert len(calls) > 0 and (parts == full or True in calls)   # stored T, then added to it
    monkeypatch.setattr(fp, "_float_sum_compiled", lambda *a: False)  # the torch code
    want = _bits(_run(h, w, dl, slices))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name


@needs_loops
def test_the_compiled_sum_rounds_into_its_columns_and_keeps_the_weights():
    # the compiled sum directly: T from 0 and from its values, the rounding into columns
    # [c0, c0 + C) of a wider output (the others untouched), against float64 torch; and a
    # wrong weight does not give those bits
    g = torch.Generator().manual_seed(6)
    parts = torch.randint(-(1 << 23), 1 << 23, (3, 5, 7), generator=g).to(torch.float32)
    weights = [128.0, 1.0, 2.0 ** -7]
    base = torch.randint(-(1 << 40), 1 << 40, (5, 7), generator=g).to(torch.float64)
    rowf = 2.0 ** torch.randint(-60, -20, (5,), generator=g).to(torch.float64)
    colf = 2.0 ** torch.randint(-60, -20, (7,), generator=g).to(torch.float64)
    want_t = base + sum(p.double() * w for p, w in zip(parts, weights))
    t = base.clone()
    assert fp._float_sum_compiled(parts, weights, t, True)
    assert torch.equal(t, want_t)
    t2 = torch.full((5, 7), float("nan"), dtype=torch.float64)
    assert fp._float_sum_compiled(parts, weights, t2, False)                  # from 0, not from t
    assert torch.equal(t2, want_t - base)
    out = torch.full((5, 12), -1.0)
    assert fp._float_sum_compiled(parts, weights, base.clone(), True, (out, 3, rowf, colf))
    want = (want_t * rowf[:, None] * colf[None, :]).to(torch.float32)
    assert torch.equal(out[:, 3:10], want)
    assert bool((out[:, :3] == -1).all()) and bool((out[:, 10:] == -1).all())
    out2 = out.clone()
    assert fp._float_sum_compiled(parts, [128.0, 1.0, 2.0 ** -6], base.clone(), True,
                                  (out2, 3, rowf, colf))
    assert not torch.equal(out2, out)


def test_products_sharing_a_slice_share_its_converted_chunks(plain, monkeypatch):
    # with chunks of one slice's width, a1.b1 and [a1 | a2].[b2 | b1] (S = 2) hold the same
    # a1 chunk: a row block converts a1 and a2 once each, not a1 twice - and the bits are
    # the plain grouping's
    h, w, dl = _case(seed=7)
    want = plain(h, w, dl, 2)
    monkeypatch.setattr(fp, "SGEMM_K", h.shape[1])
    builds = []
    real = fp._Kept.get

    def spy(self, key, build):
        if self.chunks is not None and key[0] == 1 and key not in self.chunks:
            builds.append(key)
        return real(self, key, build)

    monkeypatch.setattr(fp._Kept, "get", spy)
    got = _bits(_run(h, w, dl, 2))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name
    k = h.shape[1]
    # the forward's a side (h's slices, K = k): a1 and a2 converted once each, nothing else
    assert sorted(b for b in builds if b[2:] == (0, k)) == [(1, 1, 0, k), (1, 2, 0, k)]


def test_the_head_product_after_other_products_gives_the_plain_bits(plain, monkeypatch):
    # the head product writes T itself when it comes first (head_form's order); placed
    # after the float32 pair it adds into T - over a buffer that still holds the previous
    # block's T unless it is zeroed first
    h, w, dl = _case(seed=8)
    want = plain(h, w, dl, 3)
    monkeypatch.setattr(fp, "ROW_BLOCK", 16)
    monkeypatch.setattr(fp, "COL_BLOCK", 24)
    monkeypatch.setattr(fp, "head_form",
                        lambda k: (lp.Product((1, 3), (3, 1), 1.0, 0, k), fp.HeadProduct()))
    got = _bits(_run(h, w, dl, 3))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name
