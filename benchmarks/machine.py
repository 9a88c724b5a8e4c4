"""What every benchmark records beside its figures: the machine, the date and the load.

The project's benchmarks run on shared machines. A ratio measured side by side is less
affected by other jobs than a wall time, but not immune (the two sides do not contend for
the same caches and cores in the same way), so each result records the load average
(``os.getloadavg``, 1/5/15 minutes) when its run starts and ends, and says "under load"
when other jobs were running.

Rule for "under load": a 1-minute load average above the usable cores at the start of the
run, or above twice the cores at any later sample. At the start only earlier jobs count;
later, the benchmark's own threads (at most the usable cores) are in the average too, so
only load beyond that is attributed to others.

Also the one timing rule for side-by-side timings (``median_s``) and where results go
(``RESULTS``, ``benchmarks/results/``).
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def cores() -> int:
    return len(os.sched_getaffinity(0))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_id() -> str:
    """The CPU's family, model and stepping from /proc/cpuinfo: two VMs that both call
    themselves "AMD EPYC" can be different generations (family 25 model 17 is Zen 4,
    family 26 Zen 5), and their ratios differ."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model", "stepping") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        return "unknown"
    return ", ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping")
                     if k in fields) or "unknown"


def simd_flags() -> str:
    """The SIMD subset of /proc/cpuinfo's flags (avx*, fma, sse4*, f16c, *vnni, amx*), and
    whether AVX-512 is there: what a reader compares machines by."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                         [])
    except OSError:
        return "unknown"
    keep = [x for x in flags if x.startswith(("avx", "amx", "fma", "sse4", "f16c"))
            or "vnni" in x]
    avx512 = "AVX-512" if any(x.startswith("avx512") for x in flags) else "no AVX-512"
    return f"{' '.join(keep)} ({avx512})"


def median_s(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn``, after one untimed warm-up call."""
    fn()  # warm up allocator and caches
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def alternating_medians(sides: dict, repeats: int) -> dict:
    """{name: median wall seconds} of ``repeats`` rounds calling every side once in turn
    (side by side: a drift of the machine falls on all sides alike); the callers warm the
    sides up first (usually by the call that checks their results)."""
    times = {name: [] for name in sides}
    for _ in range(repeats):
        for name, fn in sides.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in times.items()}


class LoadLog:
    """Load-average samples over one benchmark run."""

    def __init__(self) -> None:
        self.samples: list[tuple[str, tuple[float, float, float]]] = []
        self.sample("start")

    def sample(self, label: str) -> float:
        """Record the load average now; returns its 1-minute value."""
        load = os.getloadavg()
        self.samples.append((label, load))
        return load[0]

    @property
    def loaded(self) -> bool:
        c = cores()
        first = self.samples[0][1][0] > c
        return first or any(load[0] > 2 * c for _, load in self.samples[1:])

    def summary(self) -> str:
        """One line: start and end load averages, the maximum, and the verdict."""
        self.sample("end")
        start, end = self.samples[0][1], self.samples[-1][1]
        peak = max(load[0] for _, load in self.samples)
        verdict = ("**under load** (other jobs were running: wall times are inflated, ratios "
                   "noisier)" if self.loaded else "idle apart from this run")
        return (f"load average (1/5/15 min) at the start {start[0]:.2f}/{start[1]:.2f}/"
                f"{start[2]:.2f}, at the end {end[0]:.2f}/{end[1]:.2f}/{end[2]:.2f}, highest "
                f"1-min sample {peak:.2f} on {cores()} usable cores: {verdict}")


CAP_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                 "OPEN1B_INT_GEMM", "OPEN1B_VNNI", "OPEN1B_AMX", "OPEN1B_MATHC")


def caps() -> str:
    """What this run was capped to, for a results file: the loops built to run as an AVX2
    CPU (docs/PORTABILITY.md) and the libraries' and routes' variables that are set; "" when
    none."""
    mathc = sys.modules.get("open1b_kernels.core.mathc")    # where the benchmark loaded it
    got = (["loops built as an AVX2 CPU (-DOPEN1B_CPU_CAP=1)"]
           if mathc is not None and mathc.cpu_cap() < 2 else [])
    got += [f"{v}={os.environ[v]}" for v in CAP_VARIABLES if v in os.environ]
    return f"; capped: {', '.join(got)}" if got else ""


def describe() -> str:
    """Machine, software and date, for a results file."""
    now = datetime.datetime.now(datetime.timezone.utc)
    torch = sys.modules.get("torch")  # named only where the benchmark uses it
    lib = f", torch {torch.__version__} with {torch.get_num_threads()} threads" if torch else ""
    route = sys.modules.get("open1b_kernels.int8.route")   # where the benchmark loaded it
    gemm = f", exact int8 GEMM on the {route.int_gemm_route()} route" if route else ""
    return (f"{cores()} usable cores (nproc {os.cpu_count()}), {cpu_model()}, Python "
            f"{platform.python_version()}{lib}{gemm}{caps()}; {now:%Y-%m-%d %H:%M} UTC")


def report_head(script: str) -> list[str]:
    """The first lines of a markdown report: when, the command, the machine, the load."""
    now = datetime.datetime.now(datetime.timezone.utc)
    torch = sys.modules.get("torch")
    lib = f", torch {torch.__version__}" if torch else ""
    return [f"\n## {now:%Y-%m-%d %H:%M} UTC - `{' '.join([script] + sys.argv[1:])}`",
            f"machine: {cpu_model()} ({cpu_id()}), {cores()} usable cores{lib}; load "
            f"average before {tuple(round(x, 2) for x in os.getloadavg())}",
            f"SIMD: {simd_flags()}{caps()}"]


def report_end(lines: list[str], out: str | None) -> None:
    """Close a report with the load after, print it and append it to ``out`` if given."""
    lines.append(f"load average after {tuple(round(x, 2) for x in os.getloadavg())}")
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")
