"""How much of the LM head's backward the GPU product runs when it lists dlogits' nonzero
top-slice tiles (``open1b_kernels.ops.lmhead``, ``sparse_a``): the share of each slice's
tiles that hold a nonzero, at the GPU kernel's tiles, and the products and tile loads that
leaves against the dense loop's. A count, not a timing - the kernel's speed needs a GPU
(scripts/gpu_check.py times ``lmhead.bwd_softmax`` both ways); this says what to expect.

    python -m benchmarks.kernels.lmhead_tiles [--tokens 4096] [--out FILE]

dlogits are the cross-entropy's (``xent_backward``) of Open-1B-shaped logits (vocabulary
128,256) in three regimes: ``init`` - Gaussian logits of standard deviation 0.905, what
Open-1B's head gives at initialization (unit-RMS h against weights of std 0.02 over 2,048
features); ``peaked-2``, ``-4`` and ``-6`` - a Zipf unigram prior (log 1/rank) plus
Gaussian logits of std 2, 4 and 6, standing in for a model in training (the mean softmax entropy is printed
beside each: a trained 1B model's loss is ~2.5-3.5 nats). Targets are drawn from the
softmax itself. Slices as the definition (S = 3) cuts them; tiles as the GPU kernel's: dh
(dlogits @ w, contraction over the vocabulary) 64 token rows x 64 vocabulary columns, dW
(dlogits^T @ h, contraction over the tokens) 128 vocabulary rows x 64 tokens.
"""
from __future__ import annotations

import math

import click
import torch

from benchmarks.machine import report_end, report_head
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops import lmhead_triton as lmt
from open1b_kernels.ops.xent import xent_backward, xent_forward
from testkit.kernels.tiles import tile_hits

VOCAB, D_MODEL, INIT_STD = 128_256, 2_048, 0.02
REGIMES = {"init": (INIT_STD * math.sqrt(D_MODEL), 0.0), "peaked-2": (2.0, 1.0),
           "peaked-4": (4.0, 1.0), "peaked-6": (6.0, 1.0)}


def _dlogits(tokens: int, spread: float, prior: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    bias = -prior * torch.log(torch.arange(1, VOCAB + 1, dtype=torch.float32))
    z = torch.randn(tokens, VOCAB, generator=g) * spread + bias
    p = torch.softmax(z.double(), dim=1)
    labels = torch.multinomial(p.float(), 1, generator=g)[:, 0]
    entropy = float(-(p * torch.log(p.clamp_min(1e-300))).sum(1).mean())
    loss, lse = xent_forward(z, labels)
    return xent_backward(torch.ones(()), z, labels, lse, overwrite=True), entropy, float(loss)


def _tile_hits(a: torch.Tensor, rows: int) -> torch.Tensor:
    """(S, row blocks, K blocks) bool: which of a's slice tiles hold a nonzero."""
    return tile_hits(lm.slice_rows_cpu(a, lm.SLICES)[0], rows, lmt.TILE_K)


def _counts(hit: torch.Tensor) -> tuple[list[float], float, float]:
    """Each slice's share of tiles with a nonzero; the listed form's products and tile loads
    as a share of the dense loop's. At S = 3 a block of the dense loop is six products and
    six tile loads (a's three slices, b's three); the listed form runs the top slice's three
    products (a_1 and b_1..b_3: four loads) only on listed blocks, the other three (a_2, a_3,
    b_1, b_2: four loads) on every block."""
    f = [float(hit[i].float().mean()) for i in range(hit.shape[0])]
    return f, (3 * f[0] + 3) / 6, (4 * f[0] + 4) / 6


@click.command()
@click.option("--tokens", default=4_096, type=click.IntRange(min=1),
              help="dlogits rows (one Open-1B window: 4,096)")
@click.option("--seed", default=0)
@click.option("--out", default=None)
def main(tokens, seed, out):
    lines = report_head("python -m benchmarks.kernels.lmhead_tiles")
    lines += ["", f"dlogits {tokens} x {VOCAB}, S = {lm.SLICES}; tiles with a nonzero in slice "
              "1 / 2 / 3; the listed form's products and tile loads against the dense loop's",
              "", "| regime | entropy (nats) | loss | product | tile rows | slice 1 | slice 2 | "
              "slice 3 | products | tile loads |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, (spread, prior) in REGIMES.items():
        dl, entropy, loss = _dlogits(tokens, spread, prior, seed)
        for product, a, rows in (("dh", dl, lmt.GPU_BLOCKS_LONG_K["BLOCK_M"]),
                                 ("dW", dl.t(), lmt.GPU_BLOCKS["BLOCK_M"])):
            f, products, loads = _counts(_tile_hits(a, rows))
            lines.append(f"| {name} | {entropy:.2f} | {loss:.2f} | {product} | {rows} | "
                         + " | ".join(f"{x:.1%}" for x in f)
                         + f" | {products:.1%} | {loads:.1%} |")
            print(lines[-1], flush=True)
        del dl
    report_end(lines, out)


if __name__ == "__main__":
    main()
