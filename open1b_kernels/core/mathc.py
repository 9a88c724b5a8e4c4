"""The compiled CPU loops' plumbing and their switch (``OPEN1B_MATHC``).

Each folder of open1b_kernels has one optional extension, built by setup.py from the
folder's ``_*.c`` files - a C file beside each op it serves (``ops/_rmsnorm.c`` beside
``ops/rmsnorm.py``): ``open1b_kernels.core._corec``, ``open1b_kernels.ops._opsc``,
``open1b_kernels.int8._int8c`` and ``open1b_kernels.attention._tilesc``. An op reaches its
folder's extension through a ``Loops`` handle and calls a loop only when
``LOOPS.available()``; otherwise - the extension was not compiled (no C compiler at install
time) or ``OPEN1B_MATHC=0`` is set - it runs its torch code, the definition whose bits the
loop reproduces (each op's tests compare the two on every class of input; the rules are
section 7b of open1b_kernels/CONTRACT.md).

The loops read and write numpy views of contiguous CPU tensors (``flat``: never a copy) and
take a piece count: large inputs are cut into one contiguous piece per torch intra-op thread
(``open1b_kernels.core.pieces``). Every loop's result is the same whatever the cut.
"""
from __future__ import annotations

import importlib
import os

import torch

from open1b_kernels.core.pieces import parallel

SWITCH = "OPEN1B_MATHC"   # "0" turns every compiled loop off
PARALLEL_MIN = 1 << 18    # elements below which one thread is faster than a hand-off
EXTENSIONS = ("open1b_kernels.core._corec", "open1b_kernels.ops._opsc",
              "open1b_kernels.int8._int8c", "open1b_kernels.attention._tilesc")


class Loops:
    """One folder's extension: its loops as attributes (``LOOPS.rms_fwd(...)``), or none
    where it was not compiled."""

    def __init__(self, module: str) -> None:
        self.module, self.error = module, None
        try:
            self.lib = importlib.import_module(module)
        except ImportError as e:   # the extension is optional: kept, not raised, but named
            self.lib = None        # (a built one that fails to load says why: import_errors)
            self.error = str(e)

    def available(self) -> bool:
        """True when the extension is built and the loops are not switched off."""
        return self.lib is not None and os.environ.get(SWITCH, "1") != "0"

    def __getattr__(self, name: str):
        if name == "lib" or self.lib is None:
            raise AttributeError(f"{self.module} was not compiled: no loop {name!r}")
        return getattr(self.lib, name)


def available() -> bool:
    """True when every folder's extension is built and the loops are not switched off (what
    the audit's machine record reports as ``mathc``)."""
    return all(Loops(name).available() for name in EXTENSIONS)


def cpu_cap() -> int:
    """The lowest CPU cap of the loaded extensions: 1 where one was built to run as an AVX2
    CPU (``-DOPEN1B_CPU_CAP=1``: no copy above x86-64-v3, no VNNI or AMX loop - the
    AVX2-on-AVX-512 test build of docs/PORTABILITY.md), else 2 (none built: 2)."""
    libs = [lib.lib for name in EXTENSIONS if (lib := Loops(name)).lib is not None]
    return min((lib.cpu_cap() for lib in libs), default=2)


def import_errors() -> dict[str, str]:
    """Why each folder's extension is missing, by module: not built (no C compiler at
    install), or built and unloadable (an undefined symbol in a build for another
    architecture) - empty where every one loaded. The machine record reports it beside
    ``mathc``, so "off" never hides a broken build."""
    return {name: lib.error for name in EXTENSIONS if (lib := Loops(name)).error}


def flat(x: torch.Tensor):
    """The numpy view of a contiguous CPU tensor's memory, for a compiled loop to write into
    or read (never a copy: a copy would drop what the loop writes)."""
    if not x.is_contiguous():
        raise ValueError("the compiled loops need contiguous tensors")
    return x.numpy().ravel()     # a view of contiguous memory; ~2x faster than reshape first


def span(x: torch.Tensor) -> torch.Tensor:
    """A 1-D view of a 2-D CPU tensor's storage (non-negative strides) from its first element
    to its last: what a loop indexes with the strides it is given - a block of a wider matrix
    or a transposed view read in place, never copied."""
    if not x.numel():
        return torch.empty(0, dtype=x.dtype)
    n = (x.shape[0] - 1) * x.stride(0) + (x.shape[1] - 1) * x.stride(1) + 1
    return torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), x.storage_offset(), (n,), (1,))


def none(dtype: torch.dtype = torch.float32):
    """An empty array: the loops' "not given" for an optional buffer."""
    return torch.empty(0, dtype=dtype).numpy()


def unary(loops: Loops, name: str, x: torch.Tensor) -> torch.Tensor | None:
    """The elementwise float32 loop ``name`` of ``loops`` over a CPU float32 tensor (a new
    tensor of x's shape), or None when the loop is unavailable (the caller then evaluates
    its torch code)."""
    if not loops.available() or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    fn = getattr(loops, name)
    src = x.contiguous()
    out = torch.empty_like(src)
    a, b = flat(src), flat(out)
    parallel(lambda lo, hi, p: fn(a[lo:hi], b[lo:hi], p), a.shape[0], grain=PARALLEL_MIN)
    return out.reshape(x.shape)
