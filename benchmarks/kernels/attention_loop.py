"""Attention's backward on AMX tiles: every step in one compiled call on the OpenMP team
(``amx.backward_loop``) against the per-step calls from Python (``amx.backward_step``, the
way before), side by side at Open-1B's shapes.

    python -m benchmarks.kernels.attention_loop [--seq 4096] [--repeats 5] [--out FILE]

Shapes: one sequence of ``--seq`` tokens, 16 query heads over 4 KV heads of 128 (Open-1B's
layer), window 512 and fully causal. Both forms run ``compiled.backward`` on the same
operands (``compiled.ONE_LOOP`` switched), alternating, median of ``--repeats`` after one
warm-up each; their gradients are asserted bit-equal. Needs AMX tiles in use
(``compiled.tiles_in_use()``) and an OpenMP team (``pieces.team()``): elsewhere the per-step
calls are the only form.
"""
from __future__ import annotations

import sys
import time

import click
import torch

from benchmarks.machine import LoadLog, alternating_medians, describe, report_end
from open1b_kernels.attention import compiled
from open1b_kernels.core import pieces


@click.command()
@click.option("--seq", default=4096)
@click.option("--repeats", default=5)
@click.option("--out", default=None, help="append the markdown report here")
def main(seq, repeats, out):
    if not (compiled.tiles_in_use() and pieces.team()):
        raise SystemExit("needs attention's AMX tile products in use and an OpenMP team")
    load = LoadLog()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, seq, 128, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 4, seq, 128, generator=g).to(torch.bfloat16) for _ in range(2))
    do = (torch.randn(1, 16, seq, 128, generator=g) * 1e-2).to(torch.bfloat16)
    rows = []
    for window in (512, None):
        o, lse = compiled.forward(q, k, v, window)
        got = {}

        def run(one: bool):
            compiled.ONE_LOOP = one
            got[one] = compiled.backward(q, k, v, o, lse, do, window)

        sides = {"one loop": lambda: run(True), "per step": lambda: run(False)}
        for fn in sides.values():
            fn()
        for x, y in zip(got[True], got[False]):
            if not torch.equal(x.view(torch.int16), y.view(torch.int16)):
                raise SystemExit(f"the two forms differ at window {window}: not the same bits")
        t = alternating_medians(sides, repeats)
        compiled.ONE_LOOP = True
        load.sample(str(window))
        rows.append(f"| {window or 'causal'} | {t['per step'] * 1e3:.0f} | "
                    f"{t['one loop'] * 1e3:.0f} | **{t['per step'] / t['one loop']:.2f}x** |")
    report_end([
        f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - `python -m "
        f"benchmarks.kernels.attention_loop {' '.join(sys.argv[1:])}`",
        f"\nMachine: {describe()}. {load.summary()}. Attention's backward, 1 x {seq:,} tokens, "
        f"16/4 heads of 128; medians of {repeats} alternating runs; the gradients bit-equal.\n",
        "| window | per-step calls ms | one loop ms | per step / one loop |", "|---|---|---|---|",
        *rows], out)


if __name__ == "__main__":
    main()
