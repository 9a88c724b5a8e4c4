"""CPU reference of attention (forward + backward) vs stock torch CPU float32 SDPA.

    .venv/bin/python -m benchmarks.kernels.attention [--scale 0.0625 --scale 0.25]
                                                     [--threads 1] [--repeats 3]

Shapes: the ``GPU_CHECKS`` of open1b_kernels/attention/forward.py (B 4, 16/4 heads, D 128, S 4,096 at
scale 1.0; window 512 and fully causal) at each ``--scale``. Ours: ``forward_cpu`` then
``backward_cpu`` (the reproducible attention: exact fixed-point Q K^T rounded once to
fp32, portable exp, P V with P and V in int8). Anchor: fp32
``scaled_dot_product_attention`` with the same boolean causal/window mask and repeated KV
heads, forward + backward. Median of --repeats alternating runs; ratio = ours / torch.
Each row records the 1-minute load average after it (benchmarks/machine.py).
Results: benchmarks/results/results-kernels-attention.md.
"""
from __future__ import annotations

import statistics
import time

import click
import torch

import open1b_kernels.attention.forward as A
import open1b_kernels.attention.backward as AB
from benchmarks.machine import LoadLog, describe


def ours(a) -> None:
    o, lse = A.forward_cpu(a["q"], a["k"], a["v"], a["window"])
    AB.backward_cpu(a["q"], a["k"], a["v"], o, lse, a["do"], a["window"])


def stock(a) -> None:
    q, k, v = (a[n].float().requires_grad_() for n in "qkv")
    s = q.shape[2]
    i = torch.arange(s)
    w = a["window"] or s
    mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)
    rep = q.shape[1] // k.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
    out.backward(a["do"].float())


@click.command()
@click.option("--scale", "scales", multiple=True, type=float, default=(0.0625, 0.25),
              show_default=True, help="Fractions of the Open-1B sequence length (4,096).")
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads.")
@click.option("--repeats", default=3, show_default=True, help="Alternating timed runs.")
def main(scales: tuple[float, ...], threads: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    load = LoadLog()
    click.echo(describe())
    click.echo("| shape (fwd+bwd) | ours s | torch fp32 SDPA s | ratio | load (1 min) |")
    click.echo("|---|---|---|---|---|")
    for scale in scales:
        for check in A.GPU_CHECKS:
            a = check.make_inputs(scale, "cpu")
            t_o, t_s = [], []
            for _ in range(repeats):
                for fn, acc in ((ours, t_o), (stock, t_s)):
                    t0 = time.perf_counter()
                    fn(a)
                    acc.append(time.perf_counter() - t0)
            mo, ms = statistics.median(t_o), statistics.median(t_s)
            click.echo(f"| {check.describe(scale)} | {mo:.2f} | {ms:.2f} | {mo / ms:.1f}x | "
                       f"{load.sample(check.name):.2f} |")
    click.echo(load.summary())


if __name__ == "__main__":
    main()
