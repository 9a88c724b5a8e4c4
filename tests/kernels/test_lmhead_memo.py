"""The LM head weight's slices held across a step's windows (``ozaki_mm``'s ``weight=``,
open1b_kernels/int8/weightmemo.py) and the tiles' B operands as windows of one packed run of
slices (``lmhead_int.tile_b``): the same bits as without them on every route, made once per
way and reused, made again for a weight written in place, never served for a tensor that is
not the weight; a window offset or run wrong by one slice would change the bits."""
from __future__ import annotations

import pytest

from open1b_kernels.core import backend
from open1b_kernels.int8 import amxmm, weightmemo
from open1b_kernels.ops import lmhead_int as li
from open1b_kernels.ops import lmhead_plan as lp
from open1b_kernels.ops.lmhead import lmhead_backward, lmhead_forward, ozaki_mm
from tests.kernels.test_amxmm import needs_amx
from tests.kernels.test_lmhead_int import _case, _same


def _window(h, w, dl):
    """One window's head, forward and backward, as the trainer runs it."""
    with backend.force("cpu"):
        return (lmhead_forward(h, w), *lmhead_backward(dl, h, w))


@pytest.mark.parametrize("on", ["float", "machine"])
@pytest.mark.parametrize("chunked", [True, False])
def test_windows_in_a_scope_give_the_bits_of_windows_without_it(route, monkeypatch, on,
                                                                chunked):
    # the weight's slices both ways (the forward's rows, dh's columns) made by the first
    # window, reused by the others; between them the weight gradient slices h^T into the
    # scratch buffer the b side uses - kept slices of their own are not overwritten by it
    if on == "float":
        route("float")
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    if chunked:
        monkeypatch.setattr(lp, "K_CHUNK", 64)
    _, w, _ = _case(seed=0)
    windows = [_case(seed=s)[::2] for s in (1, 2, 3)]              # (h, dlogits) each
    want = [_window(h, w, dl) for h, dl in windows]
    with weightmemo.held() as stats:
        got = [_window(h, w, dl) for h, dl in windows]
    assert all(_same(a, b) for a, b in zip(want, got))
    assert (stats.made, stats.reused, stats.changed) == (2, 4, 0)


def test_a_head_weight_written_in_place_is_sliced_again():
    # parameters are only read inside a step's scope; were the head's written in place
    # anyway (its version moves), its slices and their column sums are made again
    h, w, dl = _case(seed=4)
    with weightmemo.held() as stats:
        _window(h, w, dl)
        w.mul_(2)
        got = _window(h, w, dl)
    want = _window(h, w, dl)
    assert _same(want, got) and stats.changed == 2


def test_the_weight_must_be_b_or_its_transpose():
    # a caller naming another tensor as b's weight would be served that weight's slices
    h, w, dl = _case(seed=5)
    with weightmemo.held():
        _window(h, w, dl)
        for b in (w.clone(), w.t().contiguous().t(), w[1:]):
            with pytest.raises(ValueError, match="weight= must be b itself or its transpose"):
                ozaki_mm(h[:, :b.shape[1]], b, weight=w)
    with pytest.raises(ValueError, match="weight= must be b itself or its transpose"):
        ozaki_mm(h, w.clone(), weight=w)                          # outside a scope too


@needs_amx
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("slices", [2, 3])
@pytest.mark.parametrize("aligned", [True, False])
def test_the_tiles_b_windows_give_the_bits_of_each_b_packed_apart(route, monkeypatch, chunked,
                                                                  slices, aligned):
    # the level runs of b (every product's: the forward's over the hidden size, dh's over
    # the vocabulary, the weight gradient's over the tokens; chunked, each chunk's) read as
    # windows of one packing of the chunk's run; where a contraction is not a multiple of 64
    # a run's later slices do not start on a 64-wide chunk, no window can be read there and
    # those are packed per product - both ways give the float route's bits, over several
    # row and column blocks (the packing kept across row blocks)
    monkeypatch.setattr(li, "SHORT_BLOCKS", (16, 32))
    monkeypatch.setattr(lp, "SPARSE_MAX", -1.0)
    if chunked:
        monkeypatch.setattr(lp, "K_CHUNK", 64)
    h, w, dl = _case(m=64, k=320, v=128, seed=6) if aligned else _case(seed=6)
    route("float")
    with backend.force("cpu"):
        want = (lmhead_forward(h, w, slices), *lmhead_backward(dl, h, w, slices))
    real, read = amxmm.window, []

    def counted(p, k0, k):
        got = real(p, k0, k)
        read.append((p.b_side, got is not None))
        return got

    monkeypatch.setattr(amxmm, "window", counted)
    route("amx")
    with backend.force("cpu"):
        got = (lmhead_forward(h, w, slices), *lmhead_backward(dl, h, w, slices))
    assert _same(want, got)
    assert (True, True) in read
    assert ((True, False) in read) == (not aligned)
