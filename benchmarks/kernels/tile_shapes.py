"""The AMX tile product at the shapes a step runs it, this checkout against another's build,
side by side.

    python -m benchmarks.kernels.tile_shapes --against DIR [--repeats 7] [--out FILE]

The tile product's cache blocking, its passes over a long contraction and its packing are
compile-time choices of ``open1b_kernels/int8/_amxmm.c``, so the anchor is another checkout
with its extension built (a clone at an earlier commit: ``--against``). Each side runs in its
own process, one after the other, ``--rounds`` times alternating; each reports the median of
``--repeats`` calls after a warm-up and a SHA-256 of every result, which must be equal between
the sides (the same integers by construction - asserted here, not assumed). Shapes:

* the LM head at 4,096 tokens: the weight gradient's row block (1,024 vocabulary rows x 2,048,
  K = 12,288: dlogits' three slices of 4,096 tokens, read from a transposed 128,256-wide
  store) and its packing; the forward's block (1,024 x 4,096, K = 6,144, A read in place);
  dh's block (1,024 x 2,048, K = 32,064, B read across its lines) and that packing;
* the linears at 4,096 tokens, dequantized to bf16 in the tiles: gate|up's dX (K = 11,264),
  down's forward (K = 5,632), gate|up's forward (N = 11,264, K = 2,048).

Needs a CPU whose OS grants AMX-INT8 tiles (``amxmm.available()``).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import click

from benchmarks.machine import LoadLog, describe, median_s, report_end

CASES = ("pack dlogits^T (1024 x 12288)", "head dW 1024x2048 K=12288", "pack W^T (2048 x 32064)",
         "head dh 1024x2048 K=32064", "head fwd 1024x4096 K=6144",
         "linear dX 4096x2048 K=11264 (bf16)", "linear down fwd 4096x2048 K=5632 (bf16)",
         "linear gate|up fwd 4096x11264 K=2048 (bf16)")


def _side(repeats: int) -> dict:
    """This process's timings {case: (median s, sha256 of the result)}."""
    import torch

    from open1b_kernels.int8 import amxmm
    if not amxmm.available():
        raise SystemExit("the tile product needs a CPU whose OS grants AMX-INT8 tiles")
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)

    def ints(*shape):
        return torch.randint(-127, 128, shape, dtype=torch.int8, generator=g)

    def timed(fn):
        return median_s(fn, repeats)

    def digest(t):
        return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()

    out = {}
    store = ints(12288, 128256)                  # dlogits' slices, tokens x vocabulary
    dl_t = store[:, 5120:6144].t()               # a block of vocabulary rows: transposed
    h_t = ints(2048, 12288)
    pa = amxmm.pack(dl_t, False, "bench.a")
    out[CASES[0]] = (timed(lambda: amxmm.pack(dl_t, False, "bench.a")), digest(pa.data))
    pa = amxmm.pack(dl_t, False, "bench.a")
    pb = amxmm.pack(h_t, True, "bench.b")
    c = torch.empty(1024, 2048, dtype=torch.int32)
    out[CASES[1]] = (timed(lambda: amxmm.product(pa, pb, c)), digest(c))
    w = ints(32064, 2048)
    pw = amxmm.pack(w.t(), True, "bench.w")
    out[CASES[2]] = (timed(lambda: amxmm.pack(w.t(), True, "bench.w")), digest(pw.data))
    pw = amxmm.pack(w.t(), True, "bench.w")
    a = amxmm.pack(ints(1024, 32064), False, "bench.dl")
    out[CASES[3]] = (timed(lambda: amxmm.product(a, pw, c)), digest(c))
    a = amxmm.pack(ints(1024, 6144), False, "bench.h")
    b = amxmm.pack(ints(4096, 6144), True, "bench.wf")
    c2 = torch.empty(1024, 4096, dtype=torch.int32)
    out[CASES[4]] = (timed(lambda: amxmm.product(a, b, c2)), digest(c2))
    for case, (m, n, k) in zip(CASES[5:], [(4096, 2048, 11264), (4096, 2048, 5632),
                                           (4096, 11264, 2048)]):
        a = amxmm.pack(ints(m, k), False, "bench.x")
        b = amxmm.pack(ints(n, k), True, "bench.y")
        rs, cs = torch.rand(m, generator=g) * 1e-3, torch.rand(n, generator=g) * 1e-2
        o = torch.empty(m, n, dtype=torch.bfloat16)
        out[case] = (timed(lambda: amxmm.product_dequant(a, b, rs, cs, o)),
                     digest(o.view(torch.int16)))
    return out


def _run_side(root: str, repeats: int) -> dict:
    # this file's measuring code against the checkout's kernels (an anchor older than this
    # file has none of its own)
    got = subprocess.run([sys.executable, os.path.abspath(__file__), "--side", "--repeats",
                          str(repeats)], cwd=root, text=True, capture_output=True,
                         env={**os.environ, "PYTHONPATH": root})
    if got.returncode != 0:
        raise SystemExit(f"the side at {root} failed (is its extension built there?): "
                         f"{got.stderr.strip().splitlines()[-1] if got.stderr.strip() else ''}")
    return json.loads(got.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--against", default=None, type=click.Path(exists=True, file_okay=False),
              help="a checkout (with its extension built) to compare")
@click.option("--repeats", default=7)
@click.option("--rounds", default=2, help="alternating runs of each side")
@click.option("--out", default=None, help="append the markdown report here")
@click.option("--side", is_flag=True, hidden=True)
def main(against, repeats, rounds, out, side):
    if side:
        print(json.dumps(_side(repeats)))
        return
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if against and not os.path.isfile(os.path.join(against, "open1b_kernels", "int8",
                                                   "amxmm.py")):
        raise click.BadParameter(f"{against} is not an open1b checkout (no "
                                 "open1b_kernels/int8/amxmm.py): clone the commit to compare "
                                 "and build its extension there", param_hint="--against")
    roots = {"this": here, **({"anchor": os.path.abspath(against)} if against else {})}
    commit = {k: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=r, text=True,
                                capture_output=True).stdout.strip() or "?"
              for k, r in roots.items()}
    load = LoadLog()
    runs = {k: [] for k in roots}
    for i in range(rounds):
        for k, r in roots.items():
            print(f"[{k} {commit[k]}] round {i + 1} ...", flush=True)
            runs[k].append(_run_side(r, repeats))
            load.sample(k)
    for k in roots:
        for got in runs[k]:
            if {c: v[1] for c, v in got.items()} != {c: v[1] for c, v in runs["this"][0].items()}:
                raise SystemExit(f"the results differ between the sides ({k}): not the same bits")
    head = " | ".join(f"{k} ({commit[k]}) ms" for k in roots)
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - `python -m "
             f"benchmarks.kernels.tile_shapes {' '.join(sys.argv[1:])}`",
             f"\nMachine: {describe()}. {load.summary()}. Each side's medians of {repeats} "
             f"calls in {rounds} alternating runs (each run's median listed); the results' "
             "SHA-256 equal on every side and run.\n",
             f"| case | {head} |" + (" anchor / this |" if against else ""),
             "|---|" + "---|" * (len(roots) + bool(against))]
    for case in CASES:
        cells = {k: [v[case][0] for v in runs[k]] for k in roots}
        row = " | ".join(", ".join(f"{s * 1e3:.1f}" for s in cells[k]) for k in roots)
        ratio = (f" **{min(cells['anchor']) / max(cells['this']):.2f}-"
                 f"{max(cells['anchor']) / min(cells['this']):.2f}x** |" if against else "")
        lines.append(f"| {case} | {row} |{ratio}")
    report_end(lines, out)


if __name__ == "__main__":
    main()
