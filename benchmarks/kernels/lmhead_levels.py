"""The LM head's blocks on the AMX tiles, two choices side by side in one process.

    python -m benchmarks.kernels.lmhead_levels [--repeats 9] [--out FILE]

* **levels**: a block's level products summed in the tiles' epilogue
  (``amxmm.product_levels``: weighted into T, rounded into the logits, T's sums for the check,
  per 32 x 32 block in cache) against the products written as int32 and summed after by
  ``_lmhead_sums.c``'s ``levels_round_weighted`` - the way before, and the way still for a
  block the epilogue does not take. Blocks at 4,096 tokens: the forward's (1,024 x 4,096,
  levels of K = 2,048, 4,096, 6,144: h's slices against the weight's) and the weight
  gradient's (1,024 x 2,048, K = 4,096, 8,192, 12,288). The logits and both sums asserted
  equal between the two.
* **rows**: dh's slice 2 (1,024 rows of dlogits, K = 128,256, the weight's slices 1 and 2)
  row by row (``lmhead_rowsparse.rows_add``) against its two dense pairs on the tiles (four
  contraction chunks of 32,064 each: int32 holds them), at 420, 1,000 and 2,000 nonzeros a
  row - what ``lmhead_plan.ROW_SPARSE_MAX_TILES`` rests on. Operand packing not timed on
  either side (the head packs the weight's slices once per column block).

Each pair alternates call by call (``alternating_medians``): a drift of the machine falls
on both. Needs a CPU whose OS grants AMX-INT8 tiles (``amxmm.available()``).
"""
from __future__ import annotations

import sys

import click
import torch

from benchmarks.machine import LoadLog, alternating_medians, describe, report_end


def _levels(repeats: int) -> list[str]:
    from open1b_kernels.int8 import amxmm
    from open1b_kernels.ops import lmhead_int
    g = torch.Generator().manual_seed(0)
    rows = []
    for name, (m, n, ks) in {"forward": (1024, 4096, (2048, 4096, 6144)),
                             "weight gradient": (1024, 2048, (4096, 8192, 12288))}.items():
        shifts = [7 * (len(ks) - 1 - i) for i in range(len(ks))]
        levels = [(amxmm.pack(torch.randint(-127, 128, (m, k), generator=g, dtype=torch.int8),
                              False, f"bench.a{i}"),
                   amxmm.pack(torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8),
                              True, f"bench.b{i}"), sh)
                  for i, (k, sh) in enumerate(zip(ks, shifts))]
        rowf = torch.pow(2.0, torch.randint(-20, 20, (m,), generator=g).double())
        colf = torch.full((n,), 2.0 ** -60, dtype=torch.float64)
        wide = torch.empty((m, 4 * n))                  # a block of a wider output, as the head's
        accs = torch.empty((len(ks), m, n), dtype=torch.int32)
        got = {}

        def apart():
            for i, (a, b, _) in enumerate(levels):
                amxmm.product(a, b, accs[i])
            r, c = torch.zeros(m, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)
            lmhead_int._levels_round_compiled(accs, [2.0 ** s for s in shifts], rowf, colf,
                                              wide, n, r, c)
            got["apart"] = (wide[:, n:2 * n].clone(), r, c)

        def fused():
            r, c = amxmm.product_levels(levels, rowf, colf, wide[:, 2 * n:3 * n])
            got["fused"] = (wide[:, 2 * n:3 * n].clone(), r, c)

        apart()
        fused()
        if not all(torch.equal(x, y) for x, y in zip(got["apart"], got["fused"])):
            raise SystemExit(f"the head's {name} block differs between the two ways")
        t = alternating_medians({"apart": apart, "fused": fused}, repeats)
        macs = m * n * sum(ks)
        rows.append(f"| {name} {m} x {n}, K = {' + '.join(f'{k:,}' for k in ks)} | "
                    f"{t['apart'] * 1e3:.1f} ({macs / t['apart'] / 1e12:.2f} T/s) | "
                    f"{t['fused'] * 1e3:.1f} ({macs / t['fused'] / 1e12:.2f} T/s) | "
                    f"**{t['apart'] / t['fused']:.2f}x** |")
    return rows


def _rows(repeats: int) -> list[str]:
    from open1b_kernels.int8 import amxmm
    from open1b_kernels.ops import lmhead_rowsparse
    g = torch.Generator().manual_seed(1)
    r, k, c, chunk = 1024, 128256, 2048, 32064
    w1 = torch.randint(-127, 128, (k, c), generator=g, dtype=torch.int8)
    w2 = torch.randint(-127, 128, (k, c), generator=g, dtype=torch.int8)
    cuts = list(range(0, k, chunk))
    packs = [(amxmm.pack(w1[k0:k0 + chunk].t(), True, f"bench.w1_{i}"),
              amxmm.pack(w2[k0:k0 + chunk].t(), True, f"bench.w2_{i}")) for i, k0 in enumerate(cuts)]
    out = []
    for nnz in (420, 1000, 2000):
        a = torch.zeros(r, k, dtype=torch.int8)
        a.scatter_(1, torch.randint(0, k, (r, nnz), generator=g),
                   torch.randint(1, 127, (r, nnz), generator=g, dtype=torch.int8))
        t_rows = torch.zeros(r, c, dtype=torch.int64)
        lvl = torch.empty((2, r, c), dtype=torch.int32)

        def by_rows():
            t_rows.zero_()
            lmhead_rowsparse.rows_add(a, [(w1, 7), (w2, 0)], t_rows)

        def dense():
            for i, k0 in enumerate(cuts):
                pa = amxmm.pack(a[:, k0:k0 + chunk], False, "bench.dl")
                amxmm.product(pa, packs[i][0], lvl[0])
                amxmm.product(pa, packs[i][1], lvl[1])

        by_rows()
        t = alternating_medians({"rows": by_rows, "dense": dense}, repeats)
        share = int((a != 0).sum()) / a.numel()
        out.append(f"| {nnz:,} a row (1/{1 / share:.0f}) | {t['rows'] * 1e3:.0f} | "
                   f"{t['dense'] * 1e3:.0f} | **{t['rows'] / t['dense']:.2f}x** |")
    return out


@click.command()
@click.option("--repeats", default=9)
@click.option("--part", type=click.Choice(["levels", "rows", "both"]), default="both")
@click.option("--out", default=None, help="append the markdown report here")
def main(repeats, part, out):
    from open1b_kernels.int8 import amxmm
    if not amxmm.available():
        raise SystemExit("the tile product needs a CPU whose OS grants AMX-INT8 tiles")
    torch.set_num_threads(2)
    load = LoadLog()
    lines = [f"\n## {describe()} - `python -m benchmarks.kernels.lmhead_levels "
             f"{' '.join(sys.argv[1:])}`"]
    if part in ("levels", "both"):
        lines += ["\nThe levels summed in the tiles' epilogue against written and summed "
                  f"apart (ms, median of {repeats} alternating calls; the same logits and "
                  "sums asserted):\n",
                  "| block | apart ms | in the epilogue ms | apart / epilogue |", "|---|---|---|---|"]
        lines += _levels(repeats)
        load.sample("levels")
    if part in ("rows", "both"):
        lines += ["\ndh's slice 2 row by row against its two dense pairs on the tiles (ms, "
                  f"median of {repeats} alternating calls; packing not timed):\n",
                  "| nonzeros | row by row ms | dense on the tiles ms | rows / dense |",
                  "|---|---|---|---|"]
        lines += _rows(repeats)
    lines.append(f"\n{load.summary()}")
    report_end(lines, out)


if __name__ == "__main__":
    main()
