"""What the card and the compiler say, for ``scripts/gpu_check.py``: the card's two ceilings,
measured, and each compiled kernel's resources, read from its cubin.

Ceilings (METHOD.md's "two numbers" of the device pages: measure them, do not take the
datasheet's): a device-to-device copy of ``COPY_BYTES`` (bytes read plus written per
second) and an 8192^3 bf16 matrix product on random data (FLOP per second), each the
median of five CUDA-event timings after a warm-up. Every op's achieved GB/s or TFLOP/s in
the report is read against these.

Resources (no GPU needed): ``cuobjdump -res-usage`` and ``-sass`` on the kernel's cubin
(the binaries ship with Triton's NVIDIA backend) give registers per thread, the stack
frame, local-memory instructions (``LDL``/``STL``: register spills), barriers, tensor-core
instructions and the instruction count - what METHOD.md says to read before spending
device time. A stack frame or local-memory instructions in a memory-bound kernel is the
first thing to look at when it runs far from the roofline.
"""
from __future__ import annotations

import collections
import os
import re
import shutil
import statistics
import subprocess
import tempfile

import torch

COPY_BYTES = 2 << 30   # 2 GiB each way: many times any L2
MM_N = 8192


def _cuobjdump() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    return path if os.path.exists(path) else shutil.which("cuobjdump")


def resources(kernel) -> dict | None:
    """Registers, stack, spills and instruction counts of a compiled Triton kernel (None
    when its cubin or cuobjdump is missing)."""
    tool, cubin = _cuobjdump(), kernel.asm.get("cubin")
    if tool is None or not cubin:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    reg, stack = re.search(r"REG:(\d+)", res), re.search(r"STACK:(\d+)", res)
    return {"warps": kernel.metadata.num_warps, "registers": int(reg.group(1)) if reg else None,
            "stack_bytes": int(stack.group(1)) if stack else None,
            "local_memory_instructions": ops["LDL"] + ops["STL"],
            "instructions": sum(ops.values()), "barriers": ops["BAR"],
            "tensor_core_instructions": sum(ops[k] for k in ("HMMA", "IMMA", "HGMMA", "IGMMA"))}


def _median_ms(fn, repeats: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_ms(g: torch.Generator) -> float:
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device="cuda").uniform_(generator=g)
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src))


def _mm_ms(g: torch.Generator) -> float:
    a = torch.randn(MM_N, MM_N, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(MM_N, MM_N, device="cuda", dtype=torch.bfloat16, generator=g)
    return _median_ms(lambda: torch.mm(a, b))


def ceilings() -> dict:
    """The card's copy bandwidth (GB/s, read + write) and bf16 matrix rate (TFLOP/s)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    copy_ms, mm_ms = _copy_ms(g), _mm_ms(g)
    torch.cuda.empty_cache()
    return {"copy_gbps": round(2 * COPY_BYTES / copy_ms / 1e6, 1),
            "bf16_mm_tflops": round(2 * MM_N**3 / mm_ms / 1e9, 1),
            "copy_bytes_each_way": COPY_BYTES, "mm_n": MM_N}
