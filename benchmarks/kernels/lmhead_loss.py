"""The exact LM head and loss, forward + backward, vs torch float32 at Open-1B's vocabulary.

    python -m benchmarks.kernels.lmhead_loss [--tokens 256] [--repeats 3] [--out FILE]

Ours (CPU reference, ``force("cpu")``): ``lmhead_forward`` (the exact 3-slice bf16 GEMM,
h (T, 2,048) bf16 x w (128,256, 2,048) bf16 -> fp32 logits), ``xent_forward`` /
``xent_backward`` (cross-entropy + z-loss), ``lmhead_backward`` (dh and dw, both exact
slice GEMMs), once as now and once as before (the same bits, checked here): on the
float route the S = 3 two-GEMM form (``CPU_S3_TWO_GEMMS``) against the six slice
products, on the integer routes the plan with its sparse pairs (``lmhead_plan.SPARSE_MAX``,
where the VNNI loop runs; ``PAIR_SPARSE_MAX`` on the pair route, where the AVX2 or VNNI loop
runs) against the dense plan; and ours as a step's later window meets it inside the weight
memo (``open1b_kernels.int8.weightmemo``: the head weight's slices both ways and their
column sums made by the scope's first window, timed on its second). Anchor: torch float32
``F.linear`` + ``F.cross_entropy`` forward and backward (to h and w) of the same shape.
Alternating, median of ``--repeats`` after one warm-up; ratio = torch time / ours.
Freed memory is kept for reuse as the trainer's process keeps it (``keep_freed_memory``,
both sides; ``--fresh-pages`` leaves malloc as it is, as under the lean memory plan).
"""
from __future__ import annotations

import statistics
import sys
import time

import click
import torch
import torch.nn.functional as F

from benchmarks.machine import LoadLog, describe, simd_flags
from open1b_train.memory.allocator import keep_freed_memory
from open1b_kernels.core.backend import force
from open1b_kernels.int8 import route, weightmemo
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_plan
from open1b_kernels.ops.xent import xent_backward, xent_forward

V, D = 128_256, 2_048


@click.command()
@click.option("--tokens", default=256)
@click.option("--repeats", default=3)
@click.option("--out", default=None)
@click.option("--fresh-pages", is_flag=True, help="leave malloc as it is (the lean plan's way)")
def main(tokens, repeats, out, fresh_pages):
    kept = not fresh_pages and keep_freed_memory()
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, D, generator=g).to(torch.bfloat16)
    w = (torch.randn(V, D, generator=g) * 0.02).to(torch.bfloat16)
    labels = torch.randint(0, V, (tokens,), generator=g)
    h32, w32 = h.float(), w.float()

    def ours(now: bool):
        def run():
            lm.CPU_S3_TWO_GEMMS = now
            lmhead_plan.SPARSE_MAX = sparse_max if now else -1.0
            lmhead_plan.PAIR_SPARSE_MAX = pair_sparse_max if now else -1.0
            with force("cpu"):
                logits = lm.lmhead_forward(h, w, 3)
                loss, lse = xent_forward(logits, labels)
                dl = xent_backward(torch.ones(()), logits, labels, lse, overwrite=True)
                del logits
                return (loss, *lm.lmhead_backward(dl, h, w, 3))
        return run

    def memo():
        # the scope's first window makes the weight's values, its second is timed
        with weightmemo.held():
            ours(True)()
            t0 = time.perf_counter()
            got = ours(True)()
            return got, time.perf_counter() - t0

    def anchor():
        hh = h32.clone().requires_grad_(True)
        ww = w32.clone().requires_grad_(True)
        F.cross_entropy(F.linear(hh, ww), labels).backward()

    load = LoadLog()
    sparse_max, pair_sparse_max = lmhead_plan.SPARSE_MAX, lmhead_plan.PAIR_SPARSE_MAX
    before = ("ours before (six slice products)" if route.int_gemm_route() == "float"
              else "ours before (no sparse pairs: the dense plan)")
    held = "ours, a step's later window (the head weight's slices held: `weightmemo`)"
    sides = {"ours": ours(True), held: memo, before: ours(False),
             "torch fp32 F.linear + cross_entropy": anchor}
    res = {k: f() for k, f in sides.items()}
    same = all(torch.equal(a.view(torch.int32), b.view(torch.int32))
               for other in (res[before], res[held][0]) for a, b in zip(res["ours"], other))
    times = {k: [] for k in sides}
    for i in range(repeats):
        for k, f in sides.items():
            t0 = time.perf_counter()
            got = f()
            times[k].append(got[1] if k == held else time.perf_counter() - t0)
            print(f"run {i} {k}: {times[k][-1]:.2f} s", flush=True)
        load.sample(f"run {i}")
    lm.CPU_S3_TWO_GEMMS, lmhead_plan.SPARSE_MAX = True, sparse_max
    lmhead_plan.PAIR_SPARSE_MAX = pair_sparse_max
    med = {k: statistics.median(v) for k, v in times.items()}
    t_anchor = med["torch fp32 F.linear + cross_entropy"]
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - "
             f"`python -m benchmarks.kernels.lmhead_loss {' '.join(sys.argv[1:])}`",
             f"\nMachine: {describe()}; CPU flags: {simd_flags()}. {tokens} tokens x {D} -> "
             f"{V:,} columns, forward + "
             f"backward (dh, dw); median of {repeats} alternating runs; freed memory "
             f"{'kept for reuse (as the trainer keeps it)' if kept else 'returned (fresh pages)'}"
             f". Ours, ours in the memo's later window and ours before give the same bits: "
             f"{same}; the memo's window against ours: **{med['ours'] / med[held]:.2f}x**.\n",
             "| side | median s | runs | ratio torch / side |", "|---|---|---|---|"]
    for k, v in med.items():
        lines.append(f"| {k} | {v:.2f} | {', '.join(f'{x:.2f}' for x in times[k])} | "
                     f"**{t_anchor / v:.2f}x** |")
    lines.append(f"\n- {load.summary()}")
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
