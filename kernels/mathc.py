"""Compiled CPU loops for ``kernels.mathfn``'s exp and log: the same bits, ~15x faster.

``kernels/_mathc.c`` evaluates exactly the float32 operations of ``mathfn._exp`` /
``mathfn._log`` in the same order (its build flags forbid fused multiply-add contraction
and value-changing optimizations), one element at a time in a vectorized C loop, instead
of torch's one full pass per operation. The torch code stays the definition and the
fallback: where the extension was not compiled (no C compiler at install time), or with
``OPEN1B_MATHC=0`` in the environment, ``apply`` returns None and mathfn runs its torch
code. tests/kernels/test_mathc.py checks bit equality with the torch code on every class
of input.

Large inputs are split into one contiguous piece per torch intra-op thread; the C loop
releases the GIL, so the pieces run in parallel.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import torch

try:
    from kernels import _mathc
except ImportError:  # pragma: no cover - the extension is optional
    _mathc = None

PARALLEL_MIN = 1 << 18   # elements below which one thread is faster than a hand-off
_POOL: ThreadPoolExecutor | None = None


def available() -> bool:
    """True when the compiled loops are present and not disabled by OPEN1B_MATHC=0."""
    return _mathc is not None and os.environ.get("OPEN1B_MATHC", "1") != "0"


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="open1b-mathc")
    return _POOL


def apply(name: str, x: torch.Tensor) -> torch.Tensor | None:
    """``mathfn.<name>(x)`` by the compiled loop for a CPU float32 tensor, or None when
    the loop is unavailable (the caller then evaluates the torch code)."""
    if not available() or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    fn = getattr(_mathc, name)
    src = x.contiguous()
    out = torch.empty_like(src)
    a, b = src.reshape(-1).numpy(), out.reshape(-1).numpy()
    n = a.shape[0]
    threads = min(torch.get_num_threads(), max(1, n // PARALLEL_MIN))
    if threads <= 1:
        fn(a, b)
    else:
        step = -(-n // threads)
        cuts = [(i, min(i + step, n)) for i in range(0, n, step)]
        list(_pool(len(cuts)).map(lambda c: fn(a[c[0]:c[1]], b[c[0]:c[1]]), cuts))
    return out.reshape(x.shape)
