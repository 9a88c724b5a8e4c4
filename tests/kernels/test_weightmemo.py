"""The per-step memo of the linears' weight-side values (open1b_kernels/int8/weightmemo.py):
the same bits with it as without, made once per weight per scope, never served for a weight
changed in place or after the scope (the update), and gone when the scope ends."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core.backend import force
from open1b_kernels.int8 import linear, weightmemo
from open1b_kernels.int8.linear import linear_int8_backward_cpu, linear_int8_forward_cpu


def _case(seed: int, m: int = 70, k: int = 320, n: int = 90):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    dy = (torch.randn(m, n, generator=g) * 1e-3).to(torch.bfloat16)
    return x, w, dy, torch.tensor([4.0 / 127])


def _window(x, w, dy, s):
    """One window's forward and backward of the linear, as the model runs them."""
    y, codes = linear_int8_forward_cpu(x, w, s)
    return (y, *linear_int8_backward_cpu(dy, x, w, s, codes))


def _same(a, b) -> bool:
    return all(torch.equal(p.view(-1).view(torch.int16 if p.dtype == torch.bfloat16 else
                                          torch.int32),
                           q.view(-1).view(torch.int16 if q.dtype == torch.bfloat16 else
                                           torch.int32)) for p, q in zip(a, b))


def test_windows_in_a_scope_give_the_bits_of_windows_without_it():
    _, w, _, s = _case(0)
    windows = [_case(seed)[::2] for seed in (1, 2, 3)]          # (x, dy): three windows
    with force("cpu"):
        want = [_window(x, w, dy, s) for x, dy in windows]
        with weightmemo.held() as stats:
            got = [_window(x, w, dy, s) for x, dy in windows]
    assert all(_same(a, b) for a, b in zip(want, got))
    # the codes and w_hat's rotated codes made once, reused by the other windows (and the
    # codes by each window's own backward)
    assert (stats.made, stats.reused, stats.changed) == (2, 4, 0)
    assert not weightmemo.active()


def test_a_weight_changed_in_place_inside_the_scope_is_never_served_stale():
    # a step's parameters are only read inside the scope; were one written in place anyway
    # (autograd's version counter moves), its values are made again from the new bits
    x, w, dy, s = _case(4)
    with force("cpu"), weightmemo.held() as stats:
        _window(x, w, dy, s)
        w.mul_(2)
        got = _window(x, w, dy, s)
    with force("cpu"):
        want = _window(x, w, dy, s)
    assert _same(want, got) and stats.changed == 2


def test_each_weight_gets_its_own_values():
    x, w, dy, s = _case(5)
    with force("cpu"), weightmemo.held() as stats:
        _window(x, w, dy, s)
        other = w.clone()
        other.copy_(w * 3)
        got = _window(x, other, dy, s)
    with force("cpu"):
        assert _same(_window(x, other, dy, s), got)
    assert (stats.made, stats.reused) == (4, 0)      # each weight's own values


def test_nothing_is_kept_outside_a_scope_or_after_it(monkeypatch):
    x, w, dy, s = _case(6)
    calls = []
    real = linear.weight_codes_cpu
    monkeypatch.setattr(linear, "weight_codes_cpu", lambda t: calls.append(1) or real(t))
    with force("cpu"):
        _window(x, w, dy, s)
        _window(x, w, dy, s)
        assert len(calls) == 2                       # no scope: made every window
        with pytest.raises(ValueError, match="boom"), weightmemo.held():
            _window(x, w, dy, s)
            raise ValueError("boom")                 # the scope ends on an error too
        assert not weightmemo.active() and len(calls) == 3
        with weightmemo.held():                      # a new scope starts empty: the update
            _window(x, w, dy, s)                     # between two steps is never missed
        assert len(calls) == 4


def test_one_scope_at_a_time():
    with weightmemo.held():
        with pytest.raises(RuntimeError, match="already open"):
            with weightmemo.held():
                pass
    assert not weightmemo.active()


def test_a_scope_belongs_to_its_thread():
    # another thread's step neither sees this scope's values nor is refused as a second one
    import threading
    x, w, dy, s = _case(7)
    seen = {}

    def other():
        seen["active"] = weightmemo.active()
        with weightmemo.held() as stats, force("cpu"):
            _window(x, w, dy, s)
        seen["made"] = stats.made

    with weightmemo.held() as mine, force("cpu"):
        _window(x, w, dy, s)
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert weightmemo.active()
    assert seen == {"active": False, "made": 2} and mine.made == 2
