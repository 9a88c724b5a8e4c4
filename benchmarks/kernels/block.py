"""One Open-1B block, forward + backward: kernels' CPU path vs the same block in torch fp32.

    .venv/bin/python -m benchmarks.kernels.block [--d-model 2048] [--seq 256] [--repeats 3] [--out FILE]

Ours: testkit/kernels/block.py (the ops composed through their autograd wrappers) under
force("cpu") (bf16 activations, W8A8 int8 linears, exactly
specified arithmetic). Anchor: the same block in stock torch CPU float32 (F.linear,
RMSNorm from torch ops, RoPE, F.scaled_dot_product_attention with a boolean causal+window
mask and repeated KV heads, SwiGLU), no quantization. Heads: d_model / 128 query heads,
a quarter as many KV heads, head dim 128, FFN = 2.75 * d_model, window min(seq, 4096),
batch 1. Ratio = ours / torch (lower is better). Median of --repeats, alternating runs.
The load average is sampled after every run and recorded with the result
(benchmarks/machine.py says when a run counts as under load). Results:
benchmarks/results/results-block.md.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import click
import torch
import torch.nn.functional as F

from benchmarks.machine import LoadLog, describe
from open1b_kernels.core.backend import force
from testkit.kernels.block import BlockConfig, block_forward, init_params


def torch_block(cfg: BlockConfig, p, x):
    b, s, _ = x.shape
    hd = cfg.head_dim

    def rms(t, g=None):
        y = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + cfg.eps)
        return y if g is None else y * g

    inv = cfg.theta ** (-torch.arange(0, hd // 2, dtype=torch.float32) * 2.0 / hd)
    a = torch.arange(s, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = a.cos()[None, :, None], a.sin()[None, :, None]

    def rope(t):
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1)

    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    mask = (j <= i) & (j > i - (cfg.window or s))
    xn = rms(x, p["g_attn"])
    q = rope(rms(F.linear(xn, p["w_q"]).view(b, s, cfg.n_heads, hd))).transpose(1, 2)
    k = rope(rms(F.linear(xn, p["w_k"]).view(b, s, cfg.n_kv_heads, hd))).transpose(1, 2)
    v = F.linear(xn, p["w_v"]).view(b, s, cfg.n_kv_heads, hd).transpose(1, 2)
    rep = cfg.n_heads // cfg.n_kv_heads
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1),
                                       v.repeat_interleave(rep, 1), attn_mask=mask)
    h = x + F.linear(o.transpose(1, 2).reshape(b, s, -1), p["w_o"])
    gate, up = F.linear(rms(h, p["g_mlp"]), p["w_gate_up"]).chunk(2, -1)
    return h + F.linear(F.silu(gate) * up, p["w_down"])


@click.command()
@click.option("--d-model", default=2048)
@click.option("--seq", default=256)
@click.option("--repeats", default=3)
@click.option("--out", default=None, help="write a markdown result file")
def main(d_model: int, seq: int, repeats: int, out: str | None) -> None:
    cfg = BlockConfig(d_model=d_model, n_heads=d_model // 128, n_kv_heads=max(1, d_model // 512),
                      head_dim=128, ffn=int(2.75 * d_model), window=min(seq, 4096))
    p = init_params(cfg, seed=0)
    p32 = {k: v.detach().float().requires_grad_(True) for k, v in p.items()}
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, seq, d_model, generator=g)
    dy = torch.randn(1, seq, d_model, generator=g)

    def ours():
        xb = x.to(torch.bfloat16).requires_grad_(True)
        with force("cpu"):
            block_forward(cfg, p, xb).backward(dy.to(torch.bfloat16))

    def anchor():
        x32 = x.clone().requires_grad_(True)
        torch_block(cfg, p32, x32).backward(dy)

    load = LoadLog()
    ours()
    anchor()  # warm up
    t_ours, t_torch = [], []
    for i in range(repeats):
        for fn, acc in ((ours, t_ours), (anchor, t_torch)):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
        load.sample(f"run {i}")
    mo, mt = statistics.median(t_ours), statistics.median(t_torch)
    line = (f"d_model {d_model}, seq {seq}, heads {cfg.n_heads}/{cfg.n_kv_heads}x128, "
            f"ffn {cfg.ffn}, window {cfg.window}: ours {mo:.3f} s, torch fp32 {mt:.3f} s, "
            f"ratio {mo / mt:.2f}")
    summary = load.summary()
    print(line)
    print(summary)
    if out:
        cmd = "python -m benchmarks.kernels.block " + " ".join(sys.argv[1:])
        runs = ", ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(t_ours, t_torch))
        text = (f"# One block fwd+bwd, CPU: kernels (force cpu) vs torch fp32\n\n"
                f"Command: `{cmd}`\n\nMachine: {describe()}.\n\n"
                f"Median of {repeats} alternating runs (after one warm-up each); ours/torch s "
                f"per run: {runs}.\n\n- {line}\n- {summary}\n")
        Path(out).write_text(text)


if __name__ == "__main__":
    main()
