"""Attention's tile products on AMX (open1b_kernels/attention/amx.py, _tileamx.c): the digits
are fixed.py's, the products the float64 products' values (the whole forward and backward
against the definition: tests/kernels/test_attention_compiled.py, both product paths), the
once-per-process probe catches forged products, and the switches keep the float64 path."""

from __future__ import annotations

import warnings

import pytest
import torch

from open1b_kernels.attention import amx, compiled
from open1b_kernels.attention.backward import backward_reference
from open1b_kernels.attention.fixed import digits, fixed_point
from open1b_kernels.attention.forward import forward_reference
from tests.kernels.support import bits
from tests.kernels.test_attention import _inputs

needs_tiles = pytest.mark.skipif(not amx.available(),
                                 reason="this CPU (or OS) does not run AMX-INT8 tiles")


def _extreme(shape, seed=0):
    """bf16 with the largest significands (digit -128), tiny values, subnormals, zeros, -0
    and whole subnormal and zero rows."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g)
    t[..., ::5] = -255.0 / 128 * 2 ** 20
    t[..., 1::7] = 2.0 ** -133
    t[..., 2::9] = -0.0
    t[..., 3::11] = 2.0 ** -30
    t[..., 1, :] = 2.0 ** -133
    t[..., 2, :] = 0.0
    return t.to(torch.bfloat16)


def _a_order(blocks: torch.Tensor) -> torch.Tensor:
    """(..., 16 lines, 64 k) digit blocks as stored on the A side."""
    return blocks


def _unpack_b(blocks: torch.Tensor) -> torch.Tensor:
    """B-side digit blocks (..., 16 quads, 16 lines, 4) -> (..., 16 lines, 64 k)."""
    return blocks.reshape(*blocks.shape[:-3], 16, 16, 4).movedim(-2, -3).reshape(
        *blocks.shape[:-3], 16, 64)


@needs_tiles
@pytest.mark.parametrize("d", [16, 64, 128, 256])
@pytest.mark.parametrize("b_side", [False, True])
def test_row_digits_are_fixed_points(d, b_side):
    # by rows (Q, dO: A side; K, V: B side): every row's exponent and its integers' digits
    # are fixed.py's, in the tile order, zero past the sequence and past D in a chunk
    x = _extreme((1, 2, 70, d))
    dg = amx.Digits(x, cols=False, b_side=b_side)
    n_int, e = fixed_point(x, -1, d)                        # (1, 2, 70, d), (1, 2, 70, 1)
    want = digits(n_int).reshape(3, 2, 70, d)
    chunks = -(-d // 64)
    got = dg.data.reshape(2, 2, 4, chunks, 3, 16, 64)       # planes, blocks, panels, chunks
    got = (_unpack_b(got.reshape(2, 2, 4, chunks, 3, 16, 16, 4)) if b_side else got)
    got = got.permute(4, 0, 1, 2, 5, 3, 6).reshape(3, 2, 128, chunks * 64)
    assert torch.equal(got[:, :, :70, :d], want)
    assert not got[:, :, 70:].any() and not got[:, :, :, d:].any()
    assert torch.equal(dg.exps[:, :70], e.reshape(2, 70))
    assert (dg.exps[:, 70:] == 1).all()


@needs_tiles
@pytest.mark.parametrize("b_side", [False, True])
def test_column_digits_are_fixed_points(b_side):
    # by 64-row column groups (Q, dO: A side; K: B side): each column's exponent per block
    x = _extreme((1, 2, 100, 32), seed=1)
    dg = amx.Digits(x, cols=True, b_side=b_side)
    n_int, e = fixed_point(x, 2, 64)                        # (1, 2, 128, 32), (1, 2, 2, 32)
    want = digits(n_int).reshape(3, 2, 2, 64, 32)           # digit, plane, block, row, col
    got = dg.data.reshape(2, 2, 2, 3, 16, 64)               # plane, block, panel, digit
    if b_side:
        got = _unpack_b(got.reshape(2, 2, 2, 3, 16, 16, 4))
    got = got.permute(3, 0, 1, 5, 2, 4).reshape(3, 2, 2, 64, 32)   # lines are columns
    assert torch.equal(got, want)
    assert torch.equal(dg.exps, e.reshape(2, 2, 32))


@needs_tiles
@pytest.mark.parametrize("case", [(1, 4, 2, 150, 128, None), (2, 2, 1, 100, 64, 70),
                                  (1, 2, 2, 64, 256, 30), (1, 4, 1, 80, 16, None)])
def test_tiles_give_the_definitions_bits_on_extreme_operands(case):
    b, hq, hkv, s, d, window = case
    q = (_extreme((b, hq, s, d), 1).float() * 2.0 ** -40).to(torch.bfloat16)
    k, v, do = _extreme((b, hkv, s, d), 2), _extreme((b, hkv, s, d), 3), _extreme((b, hq, s, d), 4)
    out, lse = forward_reference(q, k, v, window)
    got = compiled._forward(q, k, v, window, True)
    for x, y in zip(got, (out, lse)):
        assert torch.equal(bits(x), bits(y))
    want = backward_reference(q, k, v, out, lse, do, window)
    for x, y in zip(compiled._backward_amx(q, k, v, out, lse, do, window), want):
        assert torch.equal(bits(x), bits(y))


def backward_keeps_the_definitions_bits(case, seed, forward=forward_reference):
    """compiled.backward on ``_inputs(case, seed)`` (its out and lse from ``forward``), any
    warning an error, against backward_reference bit for bit: what a product path switched
    off or refused by its probe must still give."""
    q, k, v, do, window = _inputs(case, seed=seed)
    out, lse = forward(q, k, v, window)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled.backward(q, k, v, out, lse, do, window)
    for x, y in zip(got, backward_reference(q, k, v, out, lse, do, window)):
        assert torch.equal(bits(x), bits(y))


@needs_tiles
@pytest.mark.parametrize("one_loop", [True, False])
def test_the_probe_passes_here_and_catches_a_forged_product(monkeypatch, one_loop):
    # a tile product wrong in one element (lost tile state would look like this) is seen by
    # the probe, which keeps the float64 products - the definition's bits; on the backward
    # in one compiled loop and in per-step calls alike
    monkeypatch.setattr(compiled, "ONE_LOOP", one_loop)
    compiled.tiles_agree.cache_clear()
    assert compiled.tiles_agree()
    if one_loop:
        real_loop = amx.backward_loop

        def forged_loop(ops, lse, drow, lo, hi, acc_dq, acc_dk, acc_dv, *rest):
            real_loop(ops, lse, drow, lo, hi, acc_dq, acc_dk, acc_dv, *rest)
            acc_dv[0, 3, 1] *= 1.5

        monkeypatch.setattr(amx, "backward_loop", forged_loop)
    else:
        real = amx.backward_step

        def forged(ops, h, qb, first, nk, lse, drow, out_dq, acc_dk, acc_dv, *rest):
            real(ops, h, qb, first, nk, lse, drow, out_dq, acc_dk, acc_dv, *rest)
            acc_dv[0, 3, first * 64 + 1] *= 1.5

        monkeypatch.setattr(amx, "backward_step", forged)
    compiled.tiles_agree.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="AMX tile products differ .*dv of the probe"):
            assert not compiled.tiles_agree()
        backward_keeps_the_definitions_bits((1, 4, 2, 90, 32, 50), 8)  # float64 products now
    finally:
        compiled.tiles_agree.cache_clear()


@needs_tiles
@pytest.mark.parametrize("one_loop", [True, False])
def test_a_forged_score_is_caught_too(monkeypatch, one_loop):
    # a forward wrong in one value - the one loop's output, or one score of the per-block
    # calls - is seen by the probe as well
    monkeypatch.setattr(compiled, "ONE_LOOP", one_loop)
    if one_loop:
        real_loop = amx.forward_loop

        def forged_loop(q, k, v8, u, lo, hi, out, lse, *rest):
            real_loop(q, k, v8, u, lo, hi, out, lse, *rest)
            out[0, 0, 1, 2] *= 1.5

        monkeypatch.setattr(amx, "forward_loop", forged_loop)
    else:
        real = amx.scores

        def forged(q, k):
            fill = real(q, k)

            def wrong(qb, first, nk, out):
                fill(qb, first, nk, out)
                out[0, 0, 0] = out[0, 0, 0] * 2
                return out
            return wrong

        monkeypatch.setattr(amx, "scores", forged)
    compiled.tiles_agree.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="AMX tile products differ"):
            assert not compiled.tiles_agree()
    finally:
        compiled.tiles_agree.cache_clear()


def test_switch_off_keeps_the_float64_products(monkeypatch):
    monkeypatch.setenv(amx.SWITCH, "0")
    assert not amx.available() and not compiled.tiles_in_use()
    calls = []
    monkeypatch.setattr(amx, "backward_step", lambda *a: calls.append(1))
    monkeypatch.setattr(amx, "backward_loop", lambda *a: calls.append(1))
    monkeypatch.setattr(amx, "forward_loop", lambda *a: calls.append(1))
    backward_keeps_the_definitions_bits((1, 2, 1, 70, 16, None), 2, compiled.forward)
    assert not calls


@needs_tiles
@pytest.mark.parametrize("case", [(1, 4, 2, 150, 128, None), (2, 2, 1, 100, 64, 70),
                                  (1, 4, 1, 300, 16, 100), (1, 2, 2, 64, 256, 30)])
def test_the_backward_in_one_loop_gives_the_per_step_calls_bits(monkeypatch, case):
    # the steps in one compiled call on the OpenMP team (the phases split between its
    # threads, a barrier after each) against the per-step calls from Python: GQA, windows,
    # partial blocks, head dims 16 to 256 - and both the definition's bits
    q, k, v, do, window = _extreme_case(case)
    out, lse = forward_reference(q, k, v, window)
    one, calls = _loop_and_calls(monkeypatch, "backward_loop",
                                 lambda: compiled._backward_amx(q, k, v, out, lse, do, window))
    for x, y, z in zip(one, calls, backward_reference(q, k, v, out, lse, do, window)):
        assert torch.equal(bits(x), bits(y)) and torch.equal(bits(x), bits(z))


def _extreme_case(case):
    """(q, k, v, do, window) of extreme values (``_extreme``) for (B, Hq, Hkv, S, D, window);
    q scaled so that the softmax is not one-hot."""
    b, hq, hkv, s, d, window = case
    q = (_extreme((b, hq, s, d), 1).float() * 2.0 ** -40).to(torch.bfloat16)
    k, v, do = _extreme((b, hkv, s, d), 2), _extreme((b, hkv, s, d), 3), _extreme((b, hq, s, d), 4)
    return q, k, v, do, window


def _loop_and_calls(monkeypatch, loop: str, run):
    """``run()``'s result with ``compiled.ONE_LOOP`` on and off; ``amx.<loop>`` ran once with it
    on where there is an OpenMP team (else the calls are the only form), never with it off."""
    loops = []
    real = getattr(amx, loop)
    monkeypatch.setattr(amx, loop, lambda *a: loops.append(1) or real(*a))
    got = {}
    for one in (True, False):
        monkeypatch.setattr(compiled, "ONE_LOOP", one)
        got[one] = run()
    assert len(loops) == (1 if compiled.pieces.team() else 0)
    return got[True], got[False]


@needs_tiles
@pytest.mark.parametrize("case", [(1, 4, 2, 150, 128, None), (2, 2, 1, 100, 64, 70),
                                  (1, 4, 1, 300, 16, 100), (1, 2, 2, 64, 256, 30),
                                  (1, 16, 4, 700, 128, 512)])
def test_the_forward_in_one_loop_gives_the_per_block_calls_bits(monkeypatch, case):
    # every 16-row panel from its scores to its output rows in one compiled call (units
    # handed out dynamically on the OpenMP team) against the calls a query block from
    # Python: GQA, windows, partial blocks, head dims 16 to 256, Open-1B's heads - and both
    # the definition's bits
    q, k, v, _, window = _extreme_case(case)
    one, calls = _loop_and_calls(monkeypatch, "forward_loop",
                                 lambda: compiled._forward(q, k, v, window, True))
    for x, y, z in zip(one, calls, forward_reference(q, k, v, window)):
        assert torch.equal(bits(x), bits(y)) and torch.equal(bits(x), bits(z))


@needs_tiles
def test_the_forward_loop_refuses_a_band_or_buffer_that_does_not_fit():
    # the C side checks every query block's band against the key blocks and each buffer's
    # size: a forged band would read past K's digits or V's codes
    q, k, v, _, _ = _inputs((1, 2, 1, 128, 16, None), seed=3)
    v8 = torch.zeros(1, 128, 16, dtype=torch.int8)
    u = torch.zeros(1, 128, dtype=torch.int32)
    out, lse = torch.zeros(2, 1, 128, 16), torch.zeros(2, 1, 128)
    for lo, hi in [([0, 0], [0, 2]), ([0, -1], [0, 1]), ([0, 1], [0, 0])]:
        with pytest.raises(ValueError, match="band"):
            amx.forward_loop(q, k, v8, u, torch.tensor(lo), torch.tensor(hi), out, lse, 128, 0,
                             0.25)
    with pytest.raises(ValueError, match="expected"):
        amx.forward_loop(q, k, v8, u, torch.tensor([0, 0]), torch.tensor([0, 1]), out[:1], lse,
                         128, 0, 0.25)
    with pytest.raises(ValueError, match="expected"):
        amx.forward_loop(q, k, v8[:, :64], u, torch.tensor([0, 0]), torch.tensor([0, 1]), out,
                         lse, 128, 0, 0.25)


@needs_tiles
def test_the_backward_loop_refuses_a_band_outside_its_blocks():
    # the C side checks every query block's band against the key blocks and the scratch
    q, k, v, do, window = _inputs((1, 2, 1, 128, 16, None), seed=3)
    ops = amx.Operands(q, k, v, do)
    lse, drow = torch.zeros(2, 2, 1, 64), torch.zeros(2, 2, 1, 64)
    acc_dq = torch.zeros(2, 2, 1, 64, 16)
    acc = torch.zeros(1, 16, 128), torch.zeros(1, 16, 128)
    for lo, hi in [([0, 0], [0, 2]), ([0, -1], [0, 1]), ([0, 1], [0, 0])]:
        with pytest.raises(ValueError, match="band"):
            amx.backward_loop(ops, lse, drow, torch.tensor(lo), torch.tensor(hi), acc_dq, *acc,
                              128, 0, 0.25)
    with pytest.raises(ValueError, match="expected"):
        amx.backward_loop(ops, lse[:1], drow, torch.tensor([0, 0]), torch.tensor([0, 1]),
                          acc_dq, *acc, 128, 0, 0.25)


@needs_tiles
def test_tile_loops_reject_inconsistent_buffers():
    e8, e32 = torch.zeros(8, dtype=torch.int8).numpy(), torch.zeros(8, dtype=torch.int32).numpy()
    f32 = torch.zeros(8).numpy()
    with pytest.raises(ValueError, match="expected"):
        amx._tilesc.amx_scores(e8, e32, e8, e32, f32, 1, 1, 1, 1, 0, 1, 0, 64, 0, 4)
    with pytest.raises(ValueError, match="expected"):
        amx._tilesc.amx_dq(e8, e32, e8, e32, f32, 1, 1, 64, 1, 0, 0, 4)
    with pytest.raises(ValueError, match="expected"):
        amx._tilesc.amx_kv(e8, e32, e8, e32, f32, 1, 1, 1, 1, 0, 0, 1, 64, 64, 0, 0, 4)
    with pytest.raises(ValueError, match="expected"):
        amx._tilesc.amx_pv(e8, e8, f32, 1, 64, 1, 0, 1, 64, 0, 4)
    with pytest.raises(ValueError, match="expected|inconsistent"):
        amx._tilesc.digit_planes(torch.zeros(8, dtype=torch.int16).numpy(), e8, e32, 1, 4, 64,
                                 2, False, False, 0, 1)
    with pytest.raises(ValueError, match="consistent shapes"):        # first + nk > n_blk
        amx._tilesc.amx_dq(e8, e32, e8, e32, f32, 1, 2, 64, 1, 0, 0, 4)
