"""One LM-head slice pair with a sparse slice (``open1b_kernels.ops.lmhead_sparse``) against
the int8 GEMM the dense plan runs it as, at the integer route's output block, by share of
nonzeros - where the planner's SPARSE_MAX stands.

    python -m benchmarks.kernels.lmhead_sparse [--repeats 5] [--out FILE]

Shapes: the forward's block (1,024 rows x 4,096 columns, K = 2,048; the sparse slice as the
rows, a_3 b_1, or as the columns, a_1 b_3, whose product is stored transposed) and the
weight gradient's (1,024 vocabulary rows x 2,048 columns, K = 4,096 tokens, the sparse
slice h^T's as the columns). Anchor: ``torch._int_mm`` of the same int8 operands (one
pair's GEMM). Both results checked equal first. Median of ``--repeats`` after one warm-up,
the sides alternating; ratio = GEMM time / sparse time (> 1: the sparse pair is faster).
"""
from __future__ import annotations


import click
import torch

from benchmarks.machine import alternating_medians, report_end, report_head
from open1b_kernels.ops import lmhead_sparse as ls

SHAPES = (("forward a_3 b_1", 1024, 2048, 4096, False),
          ("forward a_1 b_3", 1024, 2048, 4096, True),
          ("weight grad a_1 b_3", 1024, 4096, 2048, True))
SHARES = (0.0, 0.01, 0.03, 0.06, 0.125, 0.25)


@click.command()
@click.option("--repeats", default=5)
@click.option("--out", default=None)
def main(repeats, out):
    if not ls.available():
        raise SystemExit("the sparse pair's VNNI loop does not run on this CPU: nothing to time")
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
                ls.sparse_mm(sparse, dense.t(), acc.t() if b_side else acc)
                return acc

            sides = {"gemm": lambda: torch._int_mm(a, b.t()), "sparse": run_sparse}
            if not torch.equal(sides["gemm"](), sides["sparse"]().clone()):
                raise SystemExit(f"the sparse pair differs from the GEMM at {name}, {share}")
            md = alternating_medians(sides, repeats)
            lines.append(f"| {r} x {k} x {c} ({name}) | {'columns' if b_side else 'rows'} | "
                         f"{share:.1%} | {md['gemm'] * 1e3:.2f} | {md['sparse'] * 1e3:.2f} | "
                         f"{md['gemm'] / md['sparse']:.2f} |")
            print(lines[-1], flush=True)
    report_end(lines, out)


if __name__ == "__main__":
    main()
