"""Reusable scratch memory for the CPU references.

Why: glibc serves every block above 32 MB with a fresh ``mmap`` and unmaps it on free, so
each new weight-sized CPU tensor pays its page faults again (measured on the 2-core VM:
~20 ms to first-touch 92 MB, four times the IEEE pass that then fills it). The CPU
references of the big ops (the linear's weight quantization and gradient rotations, the
tree sums) therefore write their large *intermediates* into buffers kept here and reused
from call to call.

Contract: ``scratch(name, shape, dtype)`` returns a contiguous tensor whose contents are
garbage, backed by one byte buffer per name that only grows. A later call with the same
name returns the same memory, so a caller must use each name for one live intermediate at
a time and must never return a scratch tensor (or a view of it) from an op, nor save one
for backward. Buffers are per thread (autograd may run backward on another thread).
Arithmetic is unaffected: only where bytes live changes, never which operations run.
``release()`` frees this thread's buffers, or those of one op's name prefix
(``total_bytes()`` reports them).

Helpers that run on either device (the tree sum, attention's row delta) pass ``device``:
off the CPU ``scratch`` is a plain ``torch.empty`` there, since a GPU's caching allocator
already reuses its blocks and a CPU buffer would be on the wrong device.
"""
from __future__ import annotations

import math
import threading

import torch

_LOCAL = threading.local()


def _buffers() -> dict[str, torch.Tensor]:
    bufs = getattr(_LOCAL, "bufs", None)
    if bufs is None:
        bufs = _LOCAL.bufs = {}
    return bufs


def _views() -> dict[str, tuple]:
    views = getattr(_LOCAL, "views", None)
    if views is None:
        views = _LOCAL.views = {}
    return views


def scratch(name: str, shape: tuple[int, ...], dtype: torch.dtype,
            device: torch.device | None = None) -> torch.Tensor:
    """A contiguous tensor of ``shape``/``dtype`` with garbage contents (see module doc),
    reused on the CPU (``device`` None or a CPU device), freshly allocated on another.

    The view of the last call per name is kept and returned again for the same shape and
    dtype (a step asks for the same few hundred views every time: three torch calls each
    otherwise)."""
    if device is not None and device.type != "cpu":
        return torch.empty(shape, dtype=dtype, device=device)
    views = _views()
    last = views.get(name)
    if last is not None and last[0] == shape and last[1] is dtype:
        return last[2]
    nbytes = math.prod(shape) * dtype.itemsize
    bufs = _buffers()
    buf = bufs.get(name)
    if buf is None or buf.numel() < nbytes:
        bufs.pop(name, None)  # free the old block before the new one is faulted in
        views.pop(name, None)
        buf = bufs[name] = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    view = buf[:nbytes].view(dtype).view(shape)
    views[name] = (tuple(shape), dtype, view)
    return view


def total_bytes() -> int:
    """Bytes held by this thread's scratch buffers."""
    return sum(b.numel() for b in _buffers().values())


def release(prefix: str = "") -> None:
    """Drop this thread's scratch buffers whose names start with ``prefix`` (all by default;
    the next ``scratch`` call of a dropped name allocates afresh)."""
    bufs, views = _buffers(), _views()
    for name in [n for n in bufs if n.startswith(prefix)]:
        del bufs[name]
        views.pop(name, None)
