"""Backend selection shared by every op: Triton on CUDA tensors (or under the Triton
interpreter), the CPU reference otherwise.

Contract: ``use_triton(t)`` is the one place that decides which path runs, so tests can
force the Triton path on CPU tensors with ``TRITON_INTERPRET=1`` and compare it bit for bit
with the CPU reference. Every Triton launch goes through ``LAUNCH_OPTIONS`` so that no
compiler-chosen multiply-add contraction can change a rounding (``enable_fp_fusion=False``).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

from open1b_kernels.core.ieee import ieee_matmul

try:  # triton is an optional extra: without it only the CPU reference runs.
    import triton  # noqa: F401
    import triton.language as tl  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised on machines without the extra
    HAVE_TRITON = False

# Passed to every kernel launch: kernel[grid](..., **LAUNCH_OPTIONS).
LAUNCH_OPTIONS: dict[str, object] = {"enable_fp_fusion": False}

_FORCE: str | None = None  # "cpu", "triton" or None (decide by device)


def interpreting() -> bool:
    """True when Triton kernels run on the CPU under the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_available() -> bool:
    """True when Triton kernels can run here: a CUDA device, or the interpreter."""
    return HAVE_TRITON and (torch.cuda.is_available() or interpreting())


def use_triton(t: torch.Tensor) -> bool:
    """Whether an op on tensor ``t`` runs its Triton kernel (else its CPU reference)."""
    if _FORCE == "cpu":
        return False
    if _FORCE == "triton":
        if not triton_available():
            raise RuntimeError(
                "backend forced to 'triton' but Triton cannot run here: install the "
                "'gpu' extra and use a CUDA device or set TRITON_INTERPRET=1"
            )
        return True
    return HAVE_TRITON and t.is_cuda


@contextlib.contextmanager
def force(backend: str | None) -> Iterator[None]:
    """Force every op to one path inside the block: ``"cpu"``, ``"triton"`` or ``None``;
    float32 matrix products at full precision inside it (``ieee.ieee_matmul``)."""
    global _FORCE
    if backend not in ("cpu", "triton", None):
        raise ValueError(f"backend must be 'cpu', 'triton' or None, got {backend!r}")
    previous, _FORCE = _FORCE, backend
    try:
        with ieee_matmul():
            yield
    finally:
        _FORCE = previous
