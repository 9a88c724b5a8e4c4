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

Under the lean memory plan (``open1b_train.memory.memplan``), whose point is the smallest
peak, only blocks below LEAN_KEEP are kept: a heap that keeps every freed block below 1 GiB
fragments across the step's differently sized temporaries, and one full-size ``open1b`` step
under lean grew its heap to 22.9 GB of resident memory within its first layers' forward
(estimate 14.3 GiB; measured on the 24 GB VM, 2026-12-02). A layer's largest temporaries at
Open-1B's 4,096 tokens are the gate|up projection's (4,096 x 11,264: 88 MiB in bf16, 176 MiB
in float32), below LEAN_KEEP, and every layer asks for the same sizes, so each layer reuses
the blocks the one before it freed; the LM head's GB-sized blocks stay mapped and go back to
the kernel when freed. Measured on the Zen 4 VM (2026-12-05): a window-512 layer's lean
forward + forward + backward 4.5-4.8 s with malloc as it is, 3.6-3.8 s with LEAN_KEEP.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1          # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
LEAN_KEEP = 192 << 20          # the lean plan's mmap threshold (module docstring)
_set: dict[bool, bool] = {}    # lean -> whether that setting took; the latest call's holds
_last: bool | None = None


def keep_freed_memory(lean: bool = False) -> bool:
    """Set glibc's mmap and trim thresholds for the plan that runs next in this process; True
    if they were set. ``lean``: the lean memory plan runs here, so only blocks below
    LEAN_KEEP are kept (module docstring). A process that runs both plans (a test, a replay
    after a training) gets each plan's setting when it asks: the thresholds are set again
    whenever the plan differs from the last call's."""
    global _last
    if _last == lean:
        return _set[lean]
    _last = lean
    _set[lean] = False
    if os.environ.get("OPEN1B_MALLOPT", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):          # not glibc (musl has no mallopt)
        return False
    # resident: 1 GiB - larger blocks are still mapped -, 2 GiB of free heap before trimming;
    # lean: LEAN_KEEP, and twice that of free heap
    mmap = LEAN_KEEP if lean else 1 << 30
    _set[lean] = bool(mallopt(M_MMAP_THRESHOLD, mmap)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * mmap))
    return _set[lean]
