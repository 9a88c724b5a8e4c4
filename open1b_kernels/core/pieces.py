"""Running a compiled loop's range in pieces, one per torch intra-op thread.

Built with OpenMP (``team()``), a compiled loop (``open1b_kernels.core.mathc``: one extension
per folder, all built with the same flags) cuts its range itself
(open1b_kernels/core/_pieces.h) and runs the pieces at once on the OpenMP threads torch's own
operations run on. Why not a pool of our
own: torch's OpenMP threads spin for a while after each operation, so the pool's second
piece waited for a core that was busy spinning - on 2 cores two pieces were no faster than
one. Otherwise (no OpenMP in the build, a second OpenMP runtime in the process, or
``OPEN1B_MATHC_OMP=0``) each piece is one call of the loop on this module's thread pool;
the loops release the GIL. A piece writes only its own units or partial sums, so the result
is the same whatever the cut (tests/kernels/test_pieces.py).
"""
from __future__ import annotations

import functools
import os
import re
from concurrent.futures import ThreadPoolExecutor

import torch

try:                 # the core folder's loops: built with OpenMP or not, as every folder's are
    from open1b_kernels.core import _corec
except ImportError:  # pragma: no cover - the extension is optional
    _corec = None

_POOL: ThreadPoolExecutor | None = None


def team() -> bool:
    """True when the loops' pieces run on torch's OpenMP threads: the extensions are built
    with OpenMP, torch's intra-op backend is OpenMP, the process holds one OpenMP runtime (a
    second one would be a second set of threads competing with torch's for the cores), and
    OPEN1B_MATHC_OMP is not 0 (the switch the benchmarks compare with)."""
    return (os.environ.get("OPEN1B_MATHC_OMP", "1") != "0"
            and _one_openmp_runtime())


@functools.lru_cache(maxsize=1)
def _one_openmp_runtime() -> bool:
    if _corec is None or not _corec.openmp():
        return False
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            maps = f.read()
    except OSError:                  # not Linux: no way to tell which runtimes are loaded
        return False
    found = set(re.findall(r"(/\S*/lib(?:gomp|iomp5|omp)[^/\s]*\.so[^/\s]*)$", maps, re.M))
    return len({os.path.realpath(path) for path in found}) == 1


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL._max_workers < n:
        _POOL = ThreadPoolExecutor(max_workers=n, thread_name_prefix="open1b-mathc")
    return _POOL


def _each(fn, items: list) -> None:
    """``fn(item)`` for every item: the first on this thread, the others on the pool at the
    same time (this thread works instead of waiting: one hand-off fewer per call)."""
    if len(items) == 1:
        fn(items[0])
        return
    futures = [_pool(len(items) - 1).submit(fn, item) for item in items[1:]]
    try:
        fn(items[0])
    finally:
        for fut in futures:
            fut.result()


def parallel(fn, n: int, grain: int = 64) -> None:
    """``fn(lo, hi, pieces)`` over [0, n) in one contiguous piece per torch intra-op thread,
    at least ``grain`` units a piece: with ``team()`` one call ``fn(0, n, pieces)`` (the loop
    cuts the range itself), else one call ``fn(lo, hi, 1)`` per piece on this module's
    pool. For loops whose units are independent (and release the GIL): the result does not
    depend on the split."""
    threads = min(torch.get_num_threads(), max(1, n // grain))
    if threads <= 1:
        fn(0, n, 1)
        return
    if team():
        fn(0, n, threads)
        return
    step = -(-n // threads)
    cuts = [(i, min(i + step, n)) for i in range(0, n, step)]
    _each(lambda c: fn(*c, 1), cuts)


def row_pieces(r: int, c: int, max_threads: int, fn) -> torch.Tensor:
    """``fn(lo, hi, parts, pieces)`` over rows [0, r) in one piece per thread (at most
    ``max_threads``), piece i adding its column sums into its own int64 row i of ``parts``
    (pieces, C); returns the parts' total - integer sums, the same in any split. With
    ``team()`` one call over all rows (the loop cuts them the same way), else one call per
    piece on this module's pool."""
    return piece_sums(r, max_threads, (c,), fn)[0]


def piece_sums(n: int, max_threads: int, lengths: tuple[int, ...], fn) -> list[torch.Tensor]:
    """``fn(lo, hi, *parts, pieces)`` over units [0, n) in one piece per thread (at most
    ``max_threads``), piece i adding into its own int64 row i of each ``parts[j]`` (pieces,
    lengths[j]); returns each part's total over the pieces - integer sums, the same in any
    split. With ``team()`` one call over all units (the loop cuts them the same way), else
    one call per piece on this module's pool."""
    threads = max(1, min(torch.get_num_threads(), max_threads, n))
    parts = [torch.zeros((threads, length), dtype=torch.int64) for length in lengths]
    if threads == 1 or team():
        fn(0, n, *(part.reshape(-1).numpy() for part in parts), threads)
        return [part.sum(0) for part in parts]
    step = -(-n // threads)
    _each(lambda i: fn(min(n, i * step), min(n, (i + 1) * step),
                       *(part[i].numpy() for part in parts), 1), list(range(threads)))
    return [part.sum(0) for part in parts]
