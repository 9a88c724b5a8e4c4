"""The LM head's CPU float route (``open1b_kernels.ops.float_products``): float GEMMs of the
int8 slices, converted chunk by chunk from the level-ready store. Its groupings - levels side
by side along K, S = 3's two-GEMM head form, a sparse slice compacted to its nonzero
columns, contraction chunks that straddle two slices, transposed stores - must all give the
bits of the plainest grouping (every pair on its own, no compaction, one block)."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.ops import float_products as fp
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import products as pr
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward


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
            m.setattr(pr, "COMPACT_MAX", -1.0)
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
    real = pr.LevelSlices.gather

    def spy(self, i, rows, cols, name):
        gathered.append((i, cols.numel()))
        return real(self, i, rows, cols, name)

    monkeypatch.setattr(pr.LevelSlices, "gather", spy)
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
    real = pr.nonzero_cols
    monkeypatch.setattr(pr, "nonzero_cols", lambda sa, i, rows: real(sa, i, rows)[:-1])
    with pytest.warns(RuntimeWarning, match="compacted slice 1 missed a nonzero column"):
        got = _bits(_run(h, w, dl, 3))
    for name, a, b in zip(("logits", "dh", "dw"), want, got):
        assert torch.equal(a, b), name
    monkeypatch.setattr(fp, "_checked", lambda sa, rs, sparse: sparse)   # without the check
    assert not torch.equal(want[1], _bits(_run(h, w, dl, 3))[1])
