"""The weights' weight-side work made once per optimizer step instead of once per window.

Within one step every window (1,152 of them in Open-1B's main batch) multiplies by the same
weights: the CPU path's weight codes (``linear.weight_codes_cpu``: the steps, the int8 codes
and the clipped positions) and the weight's rotation for dX (``rotate_quantize_cols_cpu`` of
w_hat) are functions of the weight alone, ~0.1 s of every windowed layer on 2 cores of an
AMX Xeon (``benchmarks/HISTORY.md``); so are the LM head weight's int8 slices, both ways
(the forward's by rows, dh's by columns: ``open1b_kernels.ops.lmhead``'s ``weight=``) and
their column sums for the head's check, ~0.3 s of a window there. Inside ``held()`` - the
trainer opens it around a step's gradient, where the parameters are only read - each is
made on the first window and reused by the others.

Why a reuse cannot serve a wrong value:
- nothing outlives the scope: ``held()`` empties the memo on the way out, whatever happens
  inside, so an optimizer update (outside it) never meets a kept value;
- each entry is keyed by the weight tensor itself (held by the entry, so its id cannot be
  reused) and is served only while the tensor's storage address, shape, strides, dtype and
  version counter (bumped by every in-place write autograd sees) are those it was made from;
  a weight changed in place inside the scope is recomputed (and counted: ``Stats``);
- the values are the same function of the same bits either way: the memo changes when they
  are computed, never what (tests compare memo on and off bit for bit, across windows).

It holds the int8 codes and the rotated codes of every linear weight: ~2 bytes per weight
element, 1.1 GB for Open-1B's 24 layers, and the head weight's slices both ways: 6 bytes per
element at three slices, 1.6 GB - counted in the resident plan's estimate
(``open1b_train.memory.memplan``); the lean plan, built to stay under 16 GB, does not open it.
Nothing here is read from a file or a run's publication: the memo only holds what this
process computed from the weights it holds.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch


@dataclass
class Stats:
    """What the current (or last) scope did: values made, values reused, and weights found
    changed in place (each then made again)."""
    made: int = 0
    reused: int = 0
    changed: int = 0


class _Memo(threading.local):
    """One memo per thread: a scope opened by one thread is not another's (a second thread's
    step neither sees its values nor is refused as a second scope)."""

    def __init__(self) -> None:
        self.active = False
        self.entries: dict[tuple[int, str], tuple[torch.Tensor, tuple, object]] = {}
        self.stats = Stats()


_MEMO = _Memo()


def _identity(w: torch.Tensor) -> tuple:
    return (w.data_ptr(), tuple(w.shape), w.stride(), w.dtype, w.device, w._version)


@contextlib.contextmanager
def held():
    """The scope in which the weights the linears see do not change (one step's windows):
    their weight-side values are made once and reused. Not reentrant."""
    if _MEMO.active:
        raise RuntimeError("weightmemo.held() is already open in this thread: one scope per "
                           "step")
    _MEMO.active, _MEMO.entries, _MEMO.stats = True, {}, Stats()
    try:
        yield _MEMO.stats
    finally:
        _MEMO.active, _MEMO.entries = False, {}


def active() -> bool:
    """True inside ``held()`` (in this thread)."""
    return _MEMO.active


def get(w: torch.Tensor, what: str, make, keep=None):
    """``make()``'s value for weight ``w`` (``what`` names which), made once per scope while
    ``w`` is unchanged; outside ``held()`` simply ``make()``. ``keep``: applied to a value
    before it is kept (a copy of one that lives in a reused scratch buffer)."""
    if not _MEMO.active:
        return make()
    key = (id(w), what)
    found = _MEMO.entries.get(key)
    ident = _identity(w)
    if found is not None:
        if found[0] is w and found[1] == ident:
            _MEMO.stats.reused += 1
            return found[2]
        _MEMO.stats.changed += 1
    value = make()
    if keep is not None:
        value = keep(value)
    _MEMO.entries[key] = (w, ident, value)
    _MEMO.stats.made += 1
    return value
