"""One core's multiply-add rate in a GEMM register block, float32 FMA against exact int16
pairs (``vpmaddwd``): written with intrinsics, and the pair GEMM's inline assembly.

    python -m benchmarks.kernels.madd_rate [--repeats 5] [--out FILE]

Compiles ``madd_rate.c`` (x86-64-v3: AVX2 + FMA) with the system's C compiler and runs it
``--repeats`` times; the blocks run in each process, one after the other. An exact int8
GEMM without an int8 dot-product instruction can only beat the float route where
``vpmaddwd`` (16 multiply-adds) issues more than half as often as an FMA (8). The
intrinsics block measured 0.95x on a Zen 3 - GCC spills its accumulators -, which once
read as "no": the assembly block (``open1b_kernels/int8/_pairblock.h``) runs the same
instructions without the spills, the rate the pair GEMM (``open1b_kernels.int8.pairmm``)
is built on.
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess
import tempfile

import click

from benchmarks.machine import report_end, report_head


@click.command()
@click.option("--repeats", default=5, type=click.IntRange(min=1))
@click.option("--out", default=None)
def main(repeats, out):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise click.ClickException("no C compiler (cc or gcc) on PATH")
    src = pathlib.Path(__file__).with_name("madd_rate.c")
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "madd_rate"
        built = subprocess.run([cc, "-O3", "-march=x86-64-v3", str(src), "-o", str(exe)],
                               capture_output=True, text=True)
        if built.returncode:
            raise click.ClickException(f"{src.name} did not compile for x86-64-v3 (AVX2 + FMA): "
                                       f"this benchmark is for x86-64 CPUs; {cc} said: "
                                       f"{(built.stderr.strip().splitlines() or ['nothing'])[-1]}")
        runs = [tuple(float(v) for v in subprocess.run(
            [str(exe)], check=True, capture_output=True, text=True).stdout.split()[:3])
            for _ in range(repeats)]
    f32 = statistics.median(r[0] for r in runs)
    i16 = statistics.median(r[1] for r in runs)
    asm = statistics.median(r[2] for r in runs)
    lines = [*report_head("python -m benchmarks.kernels.madd_rate"),
             f"One core, 6 x 16 register block, median of {repeats} runs: float32 FMA "
             f"**{f32:.1f}** GMAC/s, int16 pairs (vpmaddwd + vpaddd) with intrinsics "
             f"**{i16:.1f}** GMAC/s (**{i16 / f32:.2f}x**), the pair GEMM's assembly block "
             f"**{asm:.1f}** GMAC/s (**{asm / f32:.2f}x**) (runs f32/i16/asm: "
             + ", ".join(f"{a:.1f}/{b:.1f}/{c:.1f}" for a, b, c, *_ in runs) + ")"]
    report_end(lines, out)


if __name__ == "__main__":
    main()
