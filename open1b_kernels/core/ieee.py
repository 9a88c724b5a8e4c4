"""Is this process computing IEEE float32 with subnormals? (open1b_kernels/CONTRACT.md section 4)

The CPU reference keeps subnormals; an x86 thread whose MXCSR has flush-to-zero (FTZ:
subnormal results become 0) or denormals-are-zero (DAZ: subnormal inputs read as 0) set
computes other bits wherever one occurs - ``torch.set_flush_denormal(True)``, a library
built with ``-ffast-math`` (its crtfastmath.o sets both at load time), or an embedding
program can set them without a word. ``flush_state()`` measures both on the calling thread
with torch's and numpy's own arithmetic (no register access: the same probe works on
aarch64, whose FPCR.FZ flag has the same effect); ``require_ieee()`` refuses to go on,
naming what is on and how to turn it off. The trainer, the distributed engine and every
replay call it before their first step (``open1b_train.run.backend_scope``).

``ieee_matmul()`` is the other half: torch lets a process compute float32 matrix products
in reduced precision (``torch.set_float32_matmul_precision("medium")`` means bfloat16
through oneDNN on CPUs with AVX512-BF16 or AMX, TF32 on CUDA). The CPU reference's float32
GEMMs are exact only at full precision (the LM head's float32 slices carry more bits than
bfloat16's 8 or TF32's 11), so every runtime scope (``backend.force``) pins IEEE float32
products for its duration and gives the process its own setting back afterwards.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
            f"(open1b_kernels/CONTRACT.md section 4), so this machine would compute other bits; "
            f"call torch.set_flush_denormal(False) or remove the library that sets it")


def _matmul_backends() -> dict[str, object]:
    """The per-backend float32 matmul precision objects of this torch (new API)."""
    b = torch.backends
    return {name: mod for name, mod in (("mkldnn", getattr(b.mkldnn, "matmul", None)),
                                        ("cuda", getattr(b.cuda, "matmul", None)))
            if mod is not None and hasattr(mod, "fp32_precision")}


def matmul_precision() -> dict[str, str]:
    """{"mkldnn": ..., "cuda": ...}: "ieee" is full float32; "bf16" / "tf32" are not."""
    return {name: str(mod.fp32_precision) for name, mod in _matmul_backends().items()}


@contextlib.contextmanager
def ieee_matmul() -> Iterator[None]:
    """Full-precision float32 matrix products inside the block, whatever the process set;
    the process's own setting (legacy or per-backend) is restored on exit."""
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:       # the process mixed torch's two APIs: restore per backend
        legacy = None
    saved = matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        else:
            for name, mod in _matmul_backends().items():
                mod.fp32_precision = saved[name]
