"""Attention's forward and backward on AMX tiles: every query block (``amx.forward_loop``)
and every step (``amx.backward_loop``) in one compiled call on the OpenMP team, against the
calls a query block or a step from Python (the way before), side by side at Open-1B's
shapes.

    python -m benchmarks.kernels.attention_loop [--seq 4096] [--repeats 5] [--out FILE]

Shapes: one sequence of ``--seq`` tokens, 16 query heads over 4 KV heads of 128 (Open-1B's
layer), window 512 and fully causal. Both forms run ``compiled.forward`` and
``compiled.backward`` on the same operands (``compiled.ONE_LOOP`` switched), alternating,
median of ``--repeats`` after one warm-up each; their outputs, lse and gradients are asserted
bit-equal. Needs AMX tiles in use
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

        def fwd(one: bool):
            compiled.ONE_LOOP = one
            got["forward", one] = compiled.forward(q, k, v, window)

        def bwd(one: bool):
            compiled.ONE_LOOP = one
            got["backward", one] = compiled.backward(q, k, v, o, lse, do, window)

        for part, call in (("forward", fwd), ("backward", bwd)):
            sides = {"one loop": lambda: call(True), "per block": lambda: call(False)}
            for fn in sides.values():
                fn()
            for x, y in zip(got[part, True], got[part, False]):
                if not torch.equal(x.view(torch.int16), y.view(torch.int16)):
                    raise SystemExit(f"the two forms of the {part} differ at window {window}: "
                                     "not the same bits")
            t = alternating_medians(sides, repeats)
            compiled.ONE_LOOP = True
            load.sample(f"{window} {part}")
            rows.append(f"| {window or 'causal'} | {part} | {t['per block'] * 1e3:.0f} | "
                        f"{t['one loop'] * 1e3:.0f} | **{t['per block'] / t['one loop']:.2f}x** |")
    report_end([
        f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - `python -m "
        f"benchmarks.kernels.attention_loop {' '.join(sys.argv[1:])}`",
        f"\nMachine: {describe()}. {load.summary()}. Attention, 1 x {seq:,} tokens, 16/4 heads "
        f"of 128; medians of {repeats} alternating runs; outputs, lse and gradients bit-equal.\n",
        "| window | part | calls a block / step ms | one loop ms | calls / one loop |",
        "|---|---|---|---|---|",
        *rows], out)


if __name__ == "__main__":
    main()
