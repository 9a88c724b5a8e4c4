"""Large freed CPU buffers kept for reuse instead of returned to the kernel.

glibc's malloc serves a block above its mmap threshold (which it raises to at most 32 MiB)
with fresh ``mmap`` pages and unmaps it on free, so every step's large temporaries - the
gradient, the collectives' messages, the LM head's blocks - fault their pages in anew. On the
project's 2-vCPU VM a fresh 64 MiB buffer cost more than moving it between two processes:
the deterministic reduce-scatter of 64 MiB on 2 gloo processes took 0.157 s with fresh
pages and 0.042 s with reused ones (gloo's own reduce-scatter, in the same processes:
0.157 s and 0.073 s). Raising the mmap and trim thresholds keeps freed blocks in the heap,
as jemalloc and tcmalloc (which PyTorch's CPU tuning guide recommends) do. It changes where
memory comes from, never a value; resident memory stays near the peak instead of shrinking.
``OPEN1B_MALLOPT=0`` leaves malloc as it is; other C libraries are left alone.

Not under the lean memory plan (``open1b_train.memplan``), whose point is the smallest peak:
a heap that keeps every freed block below 1 GiB fragments across the layers' differently
sized temporaries, and one full-size ``open1b`` step under lean grew its heap to 22.9 GB of
resident memory within its first layers' forward (estimate 14.3 GiB; measured on the 24 GB
VM, 2026-12-02), where the default malloc returns them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1          # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
_done: bool | None = None


def keep_freed_memory(lean: bool = False) -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True if they were set.
    ``lean``: the lean memory plan runs here, so leave malloc as it is (module docstring)."""
    global _done
    if lean:
        return False
    if _done is not None:
        return _done
    _done = False
    if os.environ.get("OPEN1B_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):          # not glibc (musl has no mallopt)
        return False
    # 1 GiB: larger blocks are still mapped; 2 GiB of free heap before trimming
    _done = bool(mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(M_TRIM_THRESHOLD, 1 << 31))
    return _done
