"""What the kernel tests share: when Triton parity can run here, and bit equality."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend, mathc

# Kernels on the tensors' own device: a CUDA device, or CPU tensors under the interpreter.
needs_triton = pytest.mark.skipif(not backend.triton_available(),
                                  reason="needs triton + TRITON_INTERPRET=1 or CUDA")
# Triton kernels fed CPU tensors: only the interpreter can run them.
needs_interpreter = pytest.mark.skipif(
    not (backend.HAVE_TRITON and backend.interpreting()),
    reason="Triton parity on CPU tensors needs triton and TRITON_INTERPRET=1")


def bits(t: torch.Tensor) -> torch.Tensor:
    """The same memory as integers of the same width, so that ``torch.equal`` compares
    bits, not values (-0.0 vs 0.0, NaN payloads)."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def same_bits(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Bit equality; NaN payloads do not count (see open1b_kernels/CONTRACT.md), NaN positions do.
    Two Nones are equal (an absent gradient on both paths)."""
    if a is None or b is None:
        return a is None and b is None
    na, nb = torch.isnan(a), torch.isnan(b)
    return torch.equal(na, nb) and torch.equal(bits(a)[~na], bits(b)[~nb])


# The compiled CPU loops: every folder's extension built and not switched off.
needs_loops = pytest.mark.skipif(not mathc.available(), reason="the compiled loops are not built")
