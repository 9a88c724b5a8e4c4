"""Exact int8 x int8 -> int32 GEMM routes on this CPU, side by side, at the linear's shapes.

    python -m benchmarks.kernels.int_gemm [--repeats 3] [--out FILE]

Routes: ``torch._int_mm`` (the library's integer GEMM: oneDNN on x86), the project's float
route (``open1b_kernels.int8.route._float_int_mm``: float32 GEMMs of int8 values in contraction
chunks of 1,024, exact by construction), its pair route where the CPU runs it
(``open1b_kernels.int8.pairmm``: int16 pairs, AVX2's vpmaddwd; "-" elsewhere), its AMX tile
route where this process runs AMX-INT8 tiles (``open1b_kernels.int8.amxmm``: packing and
product; "-" elsewhere), and, as anchors, a float32 and a float64 GEMM of the same shape
(what a user would otherwise run).
Also checks that ``torch._int_mm``, the pair and the tile routes equal the exact result on these
operands and runs the exactness probe (``open1b_kernels.int8.route.probe_int_mm``). Median
of ``--repeats`` after one warm-up, the sides alternating; ratio = float32 GEMM time / route
time (> 1: faster than float32).
"""
from __future__ import annotations

import sys
import time

import click
import torch

from benchmarks.machine import LoadLog, alternating_medians, describe
from open1b_kernels.int8 import amxmm, pairmm, route

SHAPES = ((4096, 2048, 2048), (4096, 2048, 512), (4096, 5632, 2048))


@click.command()
@click.option("--repeats", default=3)
@click.option("--out", default=None)
def main(repeats, out):
    load = LoadLog()
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - "
             f"`python -m benchmarks.kernels.int_gemm {' '.join(sys.argv[1:])}`",
             f"\nMachine: {describe()}; {route.platform_name()}. Probe of torch._int_mm: "
             f"{route.probe_int_mm() or 'exact on every worst case'}.\n",
             "| M x K x N | _int_mm exact | _int_mm s | float route s | pair route s | "
             "tile route s | fp32 GEMM s | fp64 GEMM s | fp32 / _int_mm | fp32 / float route | "
             "fp32 / pair route | fp32 / tile route |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, k, n in SHAPES:
        a = torch.randint(-128, 128, (m, k), dtype=torch.int8)
        b = torch.randint(-128, 128, (n, k), dtype=torch.int8)
        af, bf = a.float(), b.float()
        ad, bd = a.double(), b.double()
        sides = {"int": lambda: torch._int_mm(a, b.t()),
                 "float": lambda: route._float_int_mm(a, b, None),
                 "f32": lambda: torch.mm(af, bf.t()), "f64": lambda: torch.mm(ad, bd.t())}
        if pairmm.available():
            sides["pairs"] = lambda: pairmm.pair_mm(a, b)
            if not torch.equal(sides["pairs"](), sides["float"]()):
                raise SystemExit(f"the pair route differs from the float route at {m}x{k}x{n}")
        if amxmm.available():
            sides["amx"] = lambda: amxmm.amx_mm(a, b)
            if not torch.equal(sides["amx"](), sides["float"]()):
                raise SystemExit(f"the tile route differs from the float route at {m}x{k}x{n}")
        exact = torch.equal(sides["int"](), sides["float"]())
        md = alternating_medians(sides, repeats)
        def side(name):
            return ((f"{md[name]:.3f}", f"{md['f32'] / md[name]:.2f}") if name in md
                    else ("-", "-"))
        (pair_s, pair_r), (tile_s, tile_r) = side("pairs"), side("amx")
        lines.append(f"| {m} x {k} x {n} | {exact} | {md['int']:.3f} | {md['float']:.3f} | "
                     f"{pair_s} | {tile_s} | {md['f32']:.3f} | {md['f64']:.3f} | "
                     f"{md['f32'] / md['int']:.2f} | {md['f32'] / md['float']:.2f} | {pair_r} | "
                     f"{tile_r} |")
        load.sample(f"{m}x{k}x{n}")
    lines.append(f"\n- {load.summary()}")
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
