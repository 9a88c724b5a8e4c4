"""One LM-head slice pair with a sparse slice (``open1b_kernels.ops.lmhead_sparse``) against
the int8 GEMM the dense plan runs it as, at the integer route's output block, by share of
nonzeros - where the planner's SPARSE_MAX stands.

    python -m benchmarks.kernels.lmhead_sparse [--repeats 5] [--loop auto|avx2|vnni|plain]
        [--anchor int|pairs|amx] [--out FILE]

Shapes: the forward's block (1,024 rows x 4,096 columns, K = 2,048; the sparse slice as the
rows, a_3 b_1, or as the columns, a_1 b_3, whose product is stored transposed) and the
weight gradient's (1,024 vocabulary rows x 2,048 columns, K = 4,096 tokens, the sparse
slice h^T's as the columns). Anchor: ``torch._int_mm`` of the same int8 operands (one
pair's GEMM), or with ``--anchor pairs`` the pair GEMM (``open1b_kernels.int8.pairmm``: the
pair route's, what the AVX2 loop, ``--loop avx2``, competes with on a CPU without VNNI), or
with ``--anchor amx`` the AMX tile GEMM (``open1b_kernels.int8.amxmm``: the amx route's, its
B side packed once outside the timing, as the head's dense plan packs a weight block once for
every row block).
Both results checked equal first. Median of ``--repeats`` after one warm-up, the sides
alternating; ratio = GEMM time / sparse time (> 1: the sparse pair is faster).
"""
from __future__ import annotations


import click
import torch

from benchmarks.machine import alternating_medians, report_end, report_head
from open1b_kernels.int8 import amxmm, pairmm
from open1b_kernels.ops import lmhead_sparse as ls

SHAPES = (("forward a_3 b_1", 1024, 2048, 4096, False),
          ("forward a_1 b_3", 1024, 2048, 4096, True),
          ("weight grad a_1 b_3", 1024, 4096, 2048, True))
SHARES = (0.0, 0.01, 0.03, 0.06, 0.125, 0.25)


@click.command()
@click.option("--repeats", default=5, type=click.IntRange(min=1))
@click.option("--loop", type=click.Choice(["auto", "avx2", "vnni", "plain"]), default="auto",
              help="The sparse loop timed (auto: the best this CPU runs).")
@click.option("--anchor", type=click.Choice(["int", "pairs", "amx"]), default="int",
              help="The dense pair's GEMM: the library's int8 GEMM, the pair GEMM or the AMX "
                   "tile GEMM.")
@click.option("--out", default=None)
def main(repeats, loop, anchor, out):
    got = ls.loop()
    if got == "none" or (loop == "vnni" and got != "vnni") or (loop == "avx2" and got == "plain"):
        raise SystemExit(f"the sparse pair's {loop} loop does not run here (this CPU's: {got}): "
                         "nothing to time")
    if anchor == "pairs" and not pairmm.available():
        raise SystemExit("the pair GEMM does not run here (x86-64 with AVX2 and the loops "
                         "built): nothing to time")
    if anchor == "amx" and not amxmm.available():
        raise SystemExit("the AMX tile GEMM does not run here (AMX-INT8 tiles granted and the "
                         "loops built): nothing to time")
    lines = report_head("python -m benchmarks.kernels.lmhead_sparse")
    lines += ["", "| block (rows x K x cols) | sparse side | nonzeros | GEMM ms | sparse ms | "
              "GEMM / sparse |", "|---|---|---|---|---|---|"]
    g = torch.Generator().manual_seed(0)
    for name, r, k, c, b_side in SHAPES:
        dense = torch.randint(-127, 128, (c if not b_side else r, k), generator=g,
                              dtype=torch.int8)
        for share in SHARES:
            n_s = c if b_side else r
            keep = torch.rand(n_s, k, generator=g) < share
            sparse = (torch.randint(-127, 128, (n_s, k), generator=g, dtype=torch.int8)
                      * keep).to(torch.int8)
            a, b = (dense, sparse) if b_side else (sparse, dense)     # (r, k), (c, k)
            acc = torch.empty((r, c), dtype=torch.int32)

            def run_sparse():
                ls.sparse_mm(sparse, dense.t(), acc.t() if b_side else acc, loop=loop)
                return acc

            sides = {"gemm": _gemm(anchor, a, b), "sparse": run_sparse}
            if not torch.equal(sides["gemm"](), sides["sparse"]().clone()):
                raise SystemExit(f"the sparse pair differs from the GEMM at {name}, {share}")
            md = alternating_medians(sides, repeats)
            lines.append(f"| {r} x {k} x {c} ({name}) | {'columns' if b_side else 'rows'} | "
                         f"{share:.1%} | {md['gemm'] * 1e3:.2f} | {md['sparse'] * 1e3:.2f} | "
                         f"{md['gemm'] / md['sparse']:.2f} |")
            print(lines[-1], flush=True)
    report_end(lines, out)


def _gemm(anchor: str, a: torch.Tensor, b: torch.Tensor):
    """The dense pair's GEMM of int8 ``a`` (r, K) and ``b`` (c, K) as a call: int32 a b^T."""
    if anchor == "int":
        return lambda: torch._int_mm(a, b.t())
    if anchor == "pairs":
        return lambda: pairmm.pair_mm(a, b)
    packed = amxmm.pack(b, True, "bench.amx_b")
    return lambda: amxmm.amx_mm(a, packed)


if __name__ == "__main__":
    main()
