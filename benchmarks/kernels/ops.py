"""CPU reference speed of the elementwise / norm / optimizer ops vs stock torch CPU float32.

For audits on commodity machines the CPU reference must stay practical. This times each
op's CPU reference (open1b_kernels/, exactly specified arithmetic) against the torch CPU op a
float32 model would use for the same job, side by side in one run, median of repeats.

    .venv/bin/python -m benchmarks.kernels.ops [--tokens 2048] [--repeats 5] [--json out.json]

Shapes follow Open-1B per token (d_model 2048, 16 q-heads x 128, FFN 5,632) with a
configurable token count; ratio = ours / torch (lower is better, 1.0 = parity). Each row
also records the 1-minute load average after it, and the run says whether it was taken
under load (benchmarks/machine.py). Results: benchmarks/results/results-kernels-ops.md.
"""
from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from benchmarks.machine import LoadLog, describe, median_s
from open1b_kernels.ops import adamw, embedding, gradnorm, rmsnorm, rope, swiglu
from open1b_kernels.core import mathfn
from open1b_kernels.core.backend import force


def cases(t: int):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, 2048, generator=g)
    gain = torch.ones(2048)
    dy = torch.randn(t, 2048, generator=g)
    q = torch.randn(1, t, 16, 128, generator=g)
    h = torch.randn(t, 11_264, generator=g)
    dyf = torch.randn(t, 5_632, generator=g)
    ids = torch.randint(0, 128_256, (t,), generator=g)
    grads = [torch.randn(2048, 2048, generator=g) * 1e-3 for _ in range(4)]
    n = 2048 * 5632
    p, pg, m, v = torch.randn(n, generator=g), torch.randn(n, generator=g), torch.zeros(n), torch.zeros(n)
    pb = p.to(torch.bfloat16)

    def torch_rms_fb():
        xr = x.clone().requires_grad_(True)
        torch.nn.functional.rms_norm(xr, (2048,), gain.requires_grad_(True), 1e-6).backward(dy)

    def ours_rms_fb():
        y, r = rmsnorm.rmsnorm_fwd(x, gain)
        rmsnorm.rmsnorm_bwd(dy, x, gain, r)

    def torch_swiglu_fb():
        hr = h.clone().requires_grad_(True)
        a, b = hr.chunk(2, -1)
        (torch.nn.functional.silu(a) * b).backward(dyf)

    def torch_rope():
        inv = 1.0 / (500_000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
        ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
        x1, x2 = q[..., :64], q[..., 64:]
        torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def torch_emb_bwd():
        torch.zeros(128_256, 2048).index_add_(0, ids, x)

    def torch_adamw():
        pr = p.clone().requires_grad_(True)
        pr.grad = pg
        torch.optim.AdamW([pr], lr=1e-3, betas=(0.9, 0.95), foreach=False).step()

    return [
        ("exp [t x 2048]", lambda: mathfn.exp(x), lambda: torch.exp(x)),
        ("rmsnorm fwd+bwd [t x 2048]", ours_rms_fb, torch_rms_fb),
        ("rope fwd [1 x t x 16 x 128]", lambda: rope.rope_fwd(q), torch_rope),
        ("swiglu fwd+bwd [t x 11264]", lambda: (swiglu.swiglu_fwd(h), swiglu.swiglu_bwd(dyf, h)),
         torch_swiglu_fb),
        ("embedding bwd [t tokens, V 128256]", lambda: embedding.embedding_bwd(x, ids, 128_256),
         torch_emb_bwd),
        ("gradnorm clip [4 x 2048 x 2048]", lambda: gradnorm.clip_grads_([t_.clone() for t_ in grads]),
         lambda: torch.nn.utils.clip_grad_norm_([t_.clone() for t_ in grads], 1.0, foreach=False)),
        ("adamw step [11.5M params]", lambda: adamw.adamw_step_(pb.clone(), pg, m.clone(), v.clone(),
                                                                10, 1e-3, 0.1), torch_adamw),
    ]


@click.command()
@click.option("--tokens", default=2048, show_default=True, help="Tokens per op call.")
@click.option("--repeats", default=5, show_default=True, help="Timed repeats (median).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows as JSON here.")
def main(tokens: int, repeats: int, json_out: str | None) -> None:
    """Time the CPU references against torch CPU float32."""
    rows = []
    load = LoadLog()
    with force("cpu"):
        items = cases(tokens)
        for name, ours, theirs in items:
            a, b = median_s(ours, repeats), median_s(theirs, repeats)
            rows.append({"op": name.replace("t x", f"{tokens} x").replace("t tokens", f"{tokens} tokens"),
                         "ours_ms": 1e3 * a, "torch_ms": 1e3 * b, "ratio": a / b,
                         "load_1min": load.sample(name)})
    click.echo(describe())
    click.echo("| op | ours ms | torch fp32 ms | ours / torch | load (1 min) |\n|---|---|---|---|---|")
    for r in rows:
        click.echo(f"| {r['op']} | {r['ours_ms']:.1f} | {r['torch_ms']:.1f} | {r['ratio']:.2f}x "
                   f"| {r['load_1min']:.2f} |")
    summary = load.summary()
    click.echo(summary)
    if json_out:
        Path(json_out).write_text(json.dumps({"machine": describe(), "load": summary,
                                              "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
