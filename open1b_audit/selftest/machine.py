"""The machine a selftest or portability check ran on, as a plain dict: what a reader of
its certificate needs to know which platform reproduced the bits (CPU model and flags,
torch's dispatch capability, the versions, the thread count, whether the compiled math
loops ran, which exact integer GEMM route ran, the floating-point flush state, the
environment variables that steer them)."""
from __future__ import annotations

import os
import platform
import sys
from typing import Any

import numpy as np
import torch

ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS", "OPEN1B_MATHC",
       "OPEN1B_INT_GEMM", "OPEN1B_AMX", "OPEN1B_VNNI", "MKL_ENABLE_INSTRUCTIONS",
       "TRITON_INTERPRET", "CUDA_VISIBLE_DEVICES")


def cpu_info() -> dict[str, Any]:
    """Model name and feature flags from /proc/cpuinfo (x86 ``flags``, arm ``Features``)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and model in ("", platform.machine()):
                    model = value.strip()
                elif key in ("flags", "features") and not flags:
                    flags = value.split()
    except OSError:
        pass
    return {"arch": platform.machine(), "model": model, "cores": os.cpu_count(),
            "flags": sorted(flags)}


def describe() -> dict[str, Any]:
    from open1b_kernels.attention import compiled as attention_loops
    from open1b_kernels.core import ieee, mathc
    from open1b_kernels.core.backend import HAVE_TRITON
    from open1b_kernels.int8.route import int_gemm_status

    cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    triton = None
    if HAVE_TRITON:
        import triton as _t
        triton = _t.__version__
    return {"cpu": cpu_info(), "platform": platform.platform(),
            "python": platform.python_version(), "python_build": sys.version.split("\n")[0],
            "torch": torch.__version__, "numpy": np.__version__, "triton": triton,
            "torch_cpu_capability": cap() if cap else None,
            "torch_threads": torch.get_num_threads(),
            "mathc": mathc.available(), "attention_loops": attention_loops.available(),
            # an extension that is missing or failed to load, with the reason
            "mathc_errors": mathc.import_errors(),
            # 1 where the loops were built to run as an AVX2 CPU (docs/PORTABILITY.md)
            "mathc_cpu_cap": mathc.cpu_cap(),
            # attention's exact tile products on AMX tiles, or as float64 BLAS products
            "attention_tiles": attention_loops.available() and attention_loops.tiles_in_use(),
            # or Q K^T, dO V^T and the forward's P V as int8 products on AVX-512 VNNI
            "attention_vnni": attention_loops.available() and attention_loops.vnni_in_use(),
            "flush": ieee.flush_state(),
            # which exact integer GEMM ran (the library's, checked, or float32 chunks) and
            # how many results failed their checksum: a reader sees the path, not just "CPU"
            "int_gemm": int_gemm_status(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "env": {k: os.environ[k] for k in ENV if k in os.environ}}
