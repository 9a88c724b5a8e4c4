"""One core's AMX-INT8 rate where the operands come from, against the tile product as the
GEMMs run it - how far the product is from the tiles' own rate, and why.

    python -m benchmarks.kernels.tile_rate [--repeats 3] [--out FILE]

Compiles ``tile_rate.c`` with the system's C compiler (``-mamx-tile -mamx-int8``) and runs
it ``--repeats`` times alone, then twice at once (every core of a 2-core machine busy): the
TDPBSSD rate with its operands in the tile registers (the anchor: the instruction's own
rate) and a 2 x 2 register block (each chunk's four tiles loaded before its products, as
the tile product ran until 2026-12-07) with its operands in L1, A in L1 and B from L2, both
from L2 and beyond L2, and with its sums carried through tile loads and stores every 8
chunks; and the product's pass (``open1b_kernels/int8/_amxpass.h``'s ``pass_next``: A in L1,
B by TILELOADDT1, the next chunk's tiles loaded as the products free them, its sums carried
every 16 chunks: the product's loop itself, included). Beside them, in
this process, the tile product itself (``amxmm.product`` of packed operands, the linears'
shapes at 4,096 tokens) on one thread and on every usable core. Each figure is stated as a
share of the anchor measured in the same run. Every operand is pseudo-random bytes, as the
GEMMs' codes are: the tiles' rate depends on the values - the register and pass rates with
zero operands are printed too (on the AMX Xeon VM, 2026-12-07: the pass 1.24-1.37x faster
on zeros; the register rate about the same). Before 2026-12-07 the anchor ran on ones and
the blocks on a regular pattern. The product's own side is random codes throughout. Needs
an AMX-INT8 CPU (``amxmm.available()``).
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import subprocess
import sysconfig
import tempfile
import time

import click
import torch

from benchmarks.machine import cores as usable_cores
from benchmarks.machine import report_end, report_head
from open1b_kernels.int8 import amxmm

CASES = {"registers": "operands in the tile registers (the anchor)",
         "l1": "2 x 2 block, A and B in L1 (16 + 16 KB)",
         "a_l1_b_l2": "2 x 2 block, A in L1, B from L2 (16 KB, 512 KB)",
         "a_l1_b_l2_carried": "the same, sums carried every 8 chunks",
         "l2": "2 x 2 block, both from L2 (512 + 512 KB)",
         "beyond_l2": "2 x 2 block, beyond L2 (704 KB + 1.4 MB)",
         "pass": "the product's pass: A in L1, B from L2 (32 KB, 512 KB), carried every 16",
         "registers_zeros": "operands in the tile registers, zeros",
         "pass_zeros": "the product's pass, zeros"}
SHAPES = ((4096, 2048, 2048), (4096, 2048, 11264), (4096, 11264, 2048), (4096, 5632, 2048))


def _runs(exe: pathlib.Path, copies: int) -> list[dict[str, float]]:
    """Each copy's {case: T multiply-adds/s} of ``copies`` processes started together."""
    procs = [subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(copies)]
    got = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            raise click.ClickException(f"tile_rate.c's program failed: {err.strip()}")
        got.append({name: float(v) for name, v in (line.split() for line in out.splitlines())})
    return got


def _product_rate(m: int, k: int, n: int, threads: int) -> float:
    g = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    ap, bp = amxmm.pack(a, False, "tile_rate.a"), amxmm.pack(b, True, "tile_rate.b")
    c = torch.empty((m, n), dtype=torch.int32)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        amxmm.product(ap, bp, c)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            amxmm.product(ap, bp, c)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(was)
    return m * k * n / statistics.median(times) / 1e12


@click.command()
@click.option("--repeats", default=3, type=click.IntRange(min=1))
@click.option("--out", default=None)
def main(repeats, out):
    if not amxmm.available():
        raise click.ClickException("needs a CPU (and OS) that runs AMX-INT8 tiles")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise click.ClickException("no C compiler (cc or gcc) on PATH")
    src = pathlib.Path(__file__).with_name("tile_rate.c")
    cores = usable_cores()
    with tempfile.TemporaryDirectory() as tmp:
        exe = pathlib.Path(tmp) / "tile_rate"
        # Python's headers: the extension's headers it includes (core/_amx.h,
        # int8/_amxpass.h: the product's own pass loop) use Py_ssize_t
        built = subprocess.run([cc, "-O2", "-std=gnu11", "-mamx-tile", "-mamx-int8",
                                f"-I{sysconfig.get_paths()['include']}", str(src), "-o",
                                str(exe)], capture_output=True, text=True)
        if built.returncode:
            raise click.ClickException(f"{src.name} did not compile with AMX-INT8: {cc} said: "
                                       f"{(built.stderr.strip().splitlines() or ['nothing'])[-1]}")
        alone = [_runs(exe, 1)[0] for _ in range(repeats)]
        together = [r for _ in range(repeats) for r in _runs(exe, cores)]
    peak = statistics.median(r["registers"] for r in alone)
    lines = [*report_head("python -m benchmarks.kernels.tile_rate"),
             f"One core alone, median of {repeats} runs; then {cores} copies at once (every "
             "usable core), median over copies and runs. T = 10^12 int8 multiply-adds/s; the "
             "share is of the register rate alone.", "",
             "| case | one core, T/s | share | every core at once, T/s a core |",
             "|---|---|---|---|"]
    for name, what in CASES.items():
        one = statistics.median(r[name] for r in alone)
        all_ = statistics.median(r[name] for r in together)
        lines.append(f"| {what} | {one:.2f} | **{one / peak:.2f}** | {all_:.2f} |")
    lines += ["", "The tile product (`amxmm.product`, packed operands, median of 5 after one "
              "warm-up), M x K x N:", "",
              "| shape | one thread, T/s | share | every core, T/s a core | share |",
              "|---|---|---|---|---|"]
    for m, k, n in SHAPES:
        one = _product_rate(m, k, n, 1)
        all_ = _product_rate(m, k, n, cores) / cores
        lines.append(f"| {m:,} x {k:,} x {n:,} | {one:.2f} | **{one / peak:.2f}** | "
                     f"{all_:.2f} | **{all_ / peak:.2f}** |")
    report_end(lines, out)


if __name__ == "__main__":
    main()
