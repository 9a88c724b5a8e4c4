"""The GPU check registry: how each op tells ``scripts/gpu_check.py`` what to run.

Every op module exposes ``GPU_CHECKS: list[GpuCheck]``. The script imports each
``kernels.<noun>`` module, and for every entry:

1. builds inputs with ``make_inputs(scale, device)`` (scale 1.0 = Open-1B shapes; the
   inputs must be a pure function of ``scale``: draw them on the CPU from a seeded
   ``torch.Generator`` and then move them, so the CPU and GPU runs see the same values);
2. runs ``run(args)`` on CUDA tensors (the Triton path) and on the same inputs moved to
   the CPU (the CPU reference; at ``parity_scale`` when the reference would be too slow
   at full size) and counts mismatched elements bit for bit, output by output;
3. times ``run(args)`` against ``torch_baseline(args)`` (stock PyTorch doing the same
   job the usual way, e.g. bf16 ``F.linear``) with CUDA events, median of repeats;
4. scans the PTX of the module's compiled Triton kernels for forbidden instructions.

``run`` and ``torch_baseline`` return a tuple of tensors (outputs, and gradients when the
check covers a backward). ``cost(args)`` gives the work of one ``run`` so the script can
report achieved bandwidth / throughput; count bytes as the minimum traffic an ideal
kernel must move (read every input once, write every output once).

Contract: ``run`` and ``torch_baseline`` must not mutate their ``args`` (the same args
are reused for every repeat) unless the check sets ``fresh``: then the script calls
``fresh(args)`` before every call, outside the timed region, and passes its result (for
in-place ops such as AdamW and clipping).
"""
from __future__ import annotations

import re

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

Args = Any  # whatever make_inputs returns; opaque to the script except for moving devices
Outputs = Sequence[torch.Tensor]


@dataclass(frozen=True)
class Cost:
    """Work of one call: floating/integer operations and the ideal memory traffic."""

    flops: float = 0.0
    bytes: float = 0.0

    def __post_init__(self) -> None:
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"Cost must be non-negative, got flops={self.flops}, bytes={self.bytes}")


@dataclass(frozen=True)
class GpuCheck:
    """One parity + benchmark entry of an op (see the module docstring for the protocol).

    name: unique, ``<noun>.<what>``, e.g. ``"rmsnorm.fwd_bwd"``.
    make_inputs(scale, device): the inputs, a pure function of ``scale`` (see above).
    run(args): the kernels' public API on ``args``; returns the outputs to compare.
    torch_baseline(args): stock PyTorch doing the same job, for timing only.
    cost(args): the work of one ``run``.
    parity_scale: scale at which the bitwise CPU-vs-GPU comparison runs (the CPU
        reference may be too slow at 1.0); the benchmark always uses ``bench_scale``.
    bench_scale: scale of the timed run (1.0 = Open-1B shapes).
    bound: ``"memory"`` (report fraction of bandwidth roofline) or ``"compute"``.
    fresh(args): untimed copy of what ``run`` / ``torch_baseline`` mutate (in-place ops).
    describe(scale): human-readable shape string for the report.
    """

    name: str
    make_inputs: Callable[[float, torch.device | str], Args]
    run: Callable[[Args], Outputs]
    torch_baseline: Callable[[Args], Outputs]
    cost: Callable[[Args], Cost]
    describe: Callable[[float], str]
    parity_scale: float = 1.0
    bench_scale: float = 1.0
    bound: str = "memory"
    fresh: Callable[[Args], Args] | None = None
    notes: str = field(default="")

    def __post_init__(self) -> None:
        if "." not in self.name:
            raise ValueError(f"GpuCheck name must be '<noun>.<what>', got {self.name!r}")
        if self.bound not in ("memory", "compute"):
            raise ValueError(f"GpuCheck {self.name}: bound must be 'memory' or 'compute', got {self.bound!r}")
        for label, s in (("parity_scale", self.parity_scale), ("bench_scale", self.bench_scale)):
            if not 0.0 < s <= 1.0:
                raise ValueError(f"GpuCheck {self.name}: {label} must be in (0, 1], got {s}")


def to_device(args: Args, device: torch.device | str) -> Args:
    """Move every tensor inside nested tuples/lists/dicts of ``args`` to ``device``."""
    if isinstance(args, torch.Tensor):
        return args.to(device)
    if isinstance(args, tuple):
        return tuple(to_device(a, device) for a in args)
    if isinstance(args, list):
        return [to_device(a, device) for a in args]
    if isinstance(args, dict):
        return {k: to_device(v, device) for k, v in args.items()}
    return args


def scaled(n: int, scale: float, multiple: int = 1) -> int:
    """``n * scale`` rounded down to a positive multiple of ``multiple`` (shape helper)."""
    return max(multiple, int(n * scale) // multiple * multiple)


def seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator for make_inputs (draw on the CPU, then move: same values everywhere)."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


# the PTX scan: instructions the arithmetic contract forbids (open1b_kernels/CONTRACT.md)
SKIP_MODULES = {"backend", "registry"}
FORBIDDEN = {
    "float fma/mad": re.compile(r"\b(?:fma|mad)\.[a-z0-9.]*\b(?:f16|bf16|f32|f64|f16x2|bf16x2)\b"),
    ".approx": re.compile(r"\.approx\b"),
    ".ftz": re.compile(r"\.ftz\b"),
    "ex2": re.compile(r"\bex2\."),
    "lg2": re.compile(r"\blg2\."),
    "rsqrt": re.compile(r"\brsqrt\."),
    "div.full": re.compile(r"\bdiv\.full\b"),
}


def discover(only: str | None = None) -> tuple[list[tuple[str, GpuCheck]], list[dict]]:
    """Every ``GPU_CHECKS`` entry of every op module (name containing ``only``), as
    (module leaf name, check), and the modules that failed to import."""
    import importlib
    import pkgutil

    import open1b_kernels

    checks, errors = [], []
    # every module of the layered package (open1b_kernels.core.*, open1b_kernels.ops.*,
    # ...), by its leaf name as before the layering (reports and --only keep their names)
    mods = [m for m in pkgutil.walk_packages(open1b_kernels.__path__, "open1b_kernels.")
            if not m.ispkg]
    for info in sorted(mods, key=lambda m: m.name.rsplit(".", 1)[-1]):
        leaf = info.name.rsplit(".", 1)[-1]
        if leaf in SKIP_MODULES or leaf.startswith("_"):
            continue
        try:
            module = importlib.import_module(info.name)
        except Exception as exc:  # report and go on: one broken op must not hide the rest
            errors.append({"module": info.name, "error": f"import failed: {exc!r}"})
            continue
        for check in getattr(module, "GPU_CHECKS", []):
            if only is None or only in check.name:
                checks.append((leaf, check))
    return checks, errors
