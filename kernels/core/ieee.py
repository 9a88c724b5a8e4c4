"""Is this process computing IEEE float32 with subnormals? (kernels/CONTRACT.md section 4)

The CPU reference keeps subnormals; an x86 thread whose MXCSR has flush-to-zero (FTZ:
subnormal results become 0) or denormals-are-zero (DAZ: subnormal inputs read as 0) set
computes other bits wherever one occurs - ``torch.set_flush_denormal(True)``, a library
built with ``-ffast-math`` (its crtfastmath.o sets both at load time), or an embedding
program can set them without a word. ``flush_state()`` measures both on the calling thread
with torch's and numpy's own arithmetic (no register access: the same probe works on
aarch64, whose FPCR.FZ flag has the same effect); ``require_ieee()`` refuses to go on,
naming what is on and how to turn it off. The trainer, the distributed engine and every
replay call it before their first step (``open1b_train.run.backend_scope``).
"""
from __future__ import annotations

import numpy as np
import torch

TINY = 2.0 ** -140           # a float32 subnormal
NORMAL = 2.0 ** -100


def flush_state() -> dict[str, bool]:
    """{"ftz": subnormal results flushed, "daz": subnormal inputs read as zero} for torch
    and numpy on this thread (either flag set in either library counts)."""
    t_sub = torch.tensor([TINY], dtype=torch.float32)
    t_norm = torch.tensor([NORMAL], dtype=torch.float32)
    n_sub, n_norm = np.array([TINY], np.float32), np.array([NORMAL], np.float32)
    scale = np.float32(2.0 ** -40)
    # FTZ: a normal times a small normal whose exact product is a subnormal -> 0
    ftz = bool((t_norm * (2.0 ** -40)).item() == 0.0) or bool((n_norm * scale)[0] == 0.0)
    # DAZ: a subnormal input times 2^100 (a normal result) -> 0
    big = np.float32(2.0 ** 100)
    daz = bool((t_sub * (2.0 ** 100)).item() == 0.0) or bool((n_sub * big)[0] == 0.0)
    return {"ftz": ftz, "daz": daz}


class FlushToZeroError(RuntimeError):
    """This process flushes subnormals: its CPU results would not be the runtime's bits."""


def require_ieee() -> None:
    """Raise ``FlushToZeroError`` naming FTZ/DAZ when either is on for this thread."""
    s = flush_state()
    on = [k.upper() for k in ("ftz", "daz") if s[k]]
    if on:
        raise FlushToZeroError(
            f"this process flushes subnormal floats to zero ({' and '.join(on)} set in the "
            f"CPU's floating-point control register: torch.set_flush_denormal(True), or a "
            f"library built with -ffast-math): the kernels keep IEEE subnormals "
            f"(kernels/CONTRACT.md section 4), so this machine would compute other bits; "
            f"call torch.set_flush_denormal(False) or remove the library that sets it")
