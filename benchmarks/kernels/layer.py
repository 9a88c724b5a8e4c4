"""One production Open-1B layer, forward + backward, on the CPU reference vs torch float32.

    python -m benchmarks.kernels.layer [--seq 4096] [--repeats 3] [--windows 512,full]
        [--profile] [--out FILE]

Ours: ``open1b_train.model.layer_forward`` / ``layer_backward`` - the trainer's own layer
(the ops and bits of ``forward_backward``), Open-1B shapes (d_model 2,048, 16/4 heads x 128,
FFN 5,632), one sequence of ``--seq`` tokens, window 512 (a windowed layer) or fully
causal (``full``). Anchor: the same block in stock torch CPU float32
(``benchmarks.kernels.block.torch_block``: ``F.linear``, ``F.scaled_dot_product_attention``
with the causal/window mask), forward + backward, same shapes. Alternating runs, median of
``--repeats`` after one warm-up each; ratio = torch time / ours (> 1: ours faster).

The split of our time by op comes from the model's trace hook (the time between two trace
calls goes to the later op) in the timed runs. ``--profile`` adds one torch.profiler run
of ours: self CPU time per aten op (where the GEMMs and elementwise passes go).
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections import defaultdict

import click
import torch

from benchmarks.kernels.block import torch_block
from benchmarks.machine import LoadLog, describe
from open1b_kernels.core.backend import force
from open1b_train.config import open1b
from open1b_train.model import layer_backward, layer_forward
from open1b_train.params import init_params
from testkit.kernels.block import BlockConfig


def _kind(name: str) -> str:
    """'layers.0.bwd.attn.q.dx' -> 'bwd attn.q' ; 'layers.0.fwd.mlp.swiglu' -> 'fwd mlp.swiglu'."""
    parts = name.split(".")
    d, rest = parts[2], parts[3:]
    if rest and rest[-1] in ("dx", "dq", "dk", "dv"):
        rest = rest[:-1]
    return f"{d} {'.'.join(rest)}"


def setup(seq: int, window):
    base = open1b().model
    full = window == "full"
    # layer 0 is windowed in Open-1B; with full_every=1 every layer is fully causal
    mc = dataclasses.replace(base, n_layers=1, vocab=256, full_every=1 if full else 1000)
    if not full:
        mc = dataclasses.replace(mc, n_layers=2, window=int(window))
    p = init_params(mc, seed=1)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, seq, mc.d_model, generator=g).to(torch.bfloat16)
    dy = (torch.randn(1, seq, mc.d_model, generator=g) * 1e-3).to(torch.bfloat16)
    bc = BlockConfig(d_model=mc.d_model, n_heads=mc.n_heads, n_kv_heads=mc.n_kv_heads,
                     head_dim=mc.head_dim, ffn=mc.ffn, window=None if full else int(window))
    names = {"attn_norm.gain": "g_attn", "mlp_norm.gain": "g_mlp", "attn.q.weight": "w_q",
             "attn.k.weight": "w_k", "attn.v.weight": "w_v", "attn.o.weight": "w_o",
             "mlp.gate_up.weight": "w_gate_up", "mlp.down.weight": "w_down"}
    p32 = {v: p[f"layers.0.{k}"].detach().float().requires_grad_(True) for k, v in names.items()}
    return mc, p, x, dy, bc, p32


def ours_fn(mc, p, x, dy, times=None):
    last = [0.0]

    def hook(name, _t):
        now = time.perf_counter()
        if times is not None:
            times[_kind(name)] += now - last[0]
        last[0] = now

    def run():
        with force("cpu"):
            last[0] = time.perf_counter()
            y, saved = layer_forward(mc, p, 0, x, hook)
            grads = {}
            layer_backward(mc, p, 0, dy, saved, grads, hook)
        return y
    return run


@click.command()
@click.option("--seq", default=4096)
@click.option("--repeats", default=3)
@click.option("--windows", default="512,full")
@click.option("--profile", is_flag=True)
@click.option("--threads", default=0, help="torch threads (0: all usable cores)")
@click.option("--out", default=None, help="append a markdown record to this file")
def main(seq, repeats, windows, profile, threads, out):
    if threads:
        torch.set_num_threads(threads)
    load = LoadLog()
    lines = [f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - "
             f"`python -m benchmarks.kernels.layer {' '.join(sys.argv[1:])}`",
             f"\nMachine: {describe()}; CPU flags (VNNI-class): "
             f"{_flags()}.\n"]
    for window in windows.split(","):
        mc, p, x, dy, bc, p32 = setup(seq, window)
        times: dict[str, float] = defaultdict(float)
        ours = ours_fn(mc, p, x, dy)
        timed = ours_fn(mc, p, x, dy, times)
        x32, dy32 = x.float(), dy.float()

        def anchor():
            xx = x32.clone().requires_grad_(True)
            torch_block(bc, p32, xx).backward(dy32)

        ours()
        anchor()
        t_o, t_t = [], []
        for i in range(repeats):
            t0 = time.perf_counter()
            timed()
            t_o.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            anchor()
            t_t.append(time.perf_counter() - t0)
            load.sample(f"{window} run {i}")
        mo, mt = statistics.median(t_o), statistics.median(t_t)
        lines.append(f"### window {window}, {seq} tokens: ours {mo:.2f} s, torch fp32 "
                     f"{mt:.2f} s, **ratio torch/ours {mt / mo:.2f}x** (runs ours/torch: "
                     + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(t_o, t_t)) + ")\n")
        tot = sum(times.values())
        lines.append("| op (ours) | s per fwd+bwd | share |\n|---|---|---|")
        for k, v in sorted(times.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {k} | {v / repeats:.3f} | {100 * v / tot:.1f}% |")
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as prof
            with prof(activities=[ProfilerActivity.CPU]) as pr:
                ours()
            ka = pr.key_averages()
            rows = sorted(ka, key=lambda e: -e.self_cpu_time_total)[:14]
            total = sum(e.self_cpu_time_total for e in ka)
            lines.append("\n| aten op (torch.profiler, one run) | calls | self s | share |\n"
                         "|---|---|---|---|")
            for e in rows:
                lines.append(f"| {e.key} | {e.count} | {e.self_cpu_time_total / 1e6:.2f} | "
                             f"{100 * e.self_cpu_time_total / total:.1f}% |")
        lines.append("")
        print("\n".join(lines[-40:]), flush=True)
    lines.append(f"- {load.summary()}")
    text = "\n".join(lines)
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


def _flags() -> str:
    from open1b_kernels.int8.route import cpu_flags
    f = cpu_flags()
    keep = sorted(x for x in f if x.startswith(("avx", "amx", "fma")) or "vnni" in x)
    return " ".join(keep) + f"; torch CPU capability {torch.backends.cpu.get_cpu_capability()}"


if __name__ == "__main__":
    main()
