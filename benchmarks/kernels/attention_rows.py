"""Attention's row products Q K^T and dO V^T and the forward's P V on AVX-512 VNNI
(``open1b_kernels.attention.vnni``) against the float64 / float32 BLAS products they replace,
and the whole attention with and without them - where ``vnni.SPARSE_MAX`` stands.

    python -m benchmarks.kernels.attention_rows [--repeats 5] [--out FILE]

Shapes: Open-1B's (B 1, 16 query / 4 KV heads, S 4,096, D 128). One product: the forward's
(every head of a KV group, 256 rows) and the backward's (one head, 64 rows) against a band
of 9 key blocks (window 512) and of 64 (the last query block, fully causal); then by share
of L's nonzeros (a share of values scaled 2^-9: the rest of their row 9 binades above). Anchor:
``torch.matmul`` of the float64 fixed-point values (compiled.py's product); both results
checked equal first. P V and its ordered sum into the output (every head of a KV group, 256
rows, P's integers 0..127 at random, V's int8 codes of a Gaussian V; ``vnni.accumulate``)
against compiled.py's float32 product of the same integers and ``fwd_acc``, and the attention
forward with P V on VNNI against the same
forward with P V as that float32 product (the row products on VNNI in both). Then attention
forward + backward (``forward_cpu`` / ``backward_cpu``)
with ``OPEN1B_VNNI`` unset and 0, outputs checked bit-equal. Median of ``--repeats``, the sides
alternating; ratio = float64 time / VNNI time (> 1: VNNI is faster).
"""
from __future__ import annotations

import os

import click
import torch

import open1b_kernels.attention.backward as AB
import open1b_kernels.attention.forward as AF
from benchmarks.machine import alternating_medians, report_end, report_head
from open1b_kernels.attention import compiled, vnni
from open1b_kernels.attention.tiles import BLOCK_M, quantize_v

B, HQ, HKV, S, D = 1, 16, 4, 4096, 128
SHARES = (0.0, 0.02, 0.04, 0.06, 0.08, 0.12)


def _operands(g: torch.Generator, share: float):
    q, k = torch.randn(B, HQ, S, D, generator=g), torch.randn(B, HKV, S, D, generator=g)
    for x in (q, k):
        x[torch.rand(x.shape, generator=g) < share] *= 2.0 ** -9
    return q.bfloat16(), k.bfloat16()


def _product_row(q, k, heads: str, nk: int, repeats: int, label: str) -> tuple[str, float]:
    g, bk, n = HQ // HKV, B * HKV, S // BLOCK_M
    a64 = compiled._fixed(q, BLOCK_M, False, HKV)                     # (G, n, bk, 64, D)
    b64 = compiled._fixed(k, BLOCK_M, False).reshape(bk, n * BLOCK_M, D)
    qa, kb = vnni.Rows(q, False), vnni.Rows(k, True)
    h, qb = (-1, nk - 1) if heads == "all" else (1, nk - 1)
    lhs = a64[:, qb].movedim(0, 1).reshape(bk, -1, D).contiguous() if h < 0 else a64[h, qb]
    rows = lhs.shape[1]
    ref, out = (torch.empty((bk, rows, nk * BLOCK_M), dtype=torch.float64) for _ in range(2))
    band = b64[:, :nk * BLOCK_M].transpose(1, 2)
    sides = {"float64": lambda: torch.matmul(lhs, band, out=ref),
             "vnni": lambda: vnni.products(qa, kb, g, h, qb, 0, nk, out)}
    if not torch.equal(sides["float64"]().view(torch.int64), sides["vnni"]().view(torch.int64)):
        raise SystemExit(f"the VNNI product differs from the float64 one at {label}")
    md = alternating_medians(sides, repeats)
    ratio = md["float64"] / md["vnni"]
    return (f"| {label} | {bk} x {rows} x {nk * BLOCK_M} x {D} | {qa.share:.1%} / {kb.share:.1%} "
            f"| {md['float64'] * 1e3:.2f} | {md['vnni'] * 1e3:.2f} | {ratio:.2f} |"), ratio


def _pv_row(nk: int, repeats: int, g: torch.Generator) -> str:
    bk, rows = B * HKV, (HQ // HKV) * BLOCK_M
    v8, _ = quantize_v(torch.randn(B, HKV, S, D, generator=g).bfloat16())
    v8 = v8.reshape(bk, S, D)
    p8 = torch.randint(0, 128, (bk, nk, rows, BLOCK_M), generator=g, dtype=torch.int8)
    alpha, t = torch.rand((bk, rows, nk), generator=g), torch.randint(0, 20, (bk, rows, nk),
                                                                       generator=g,
                                                                       dtype=torch.int32)
    m, l = torch.randn((bk, rows), generator=g), torch.rand((bk, rows), generator=g) + 1
    p8f, v8f = p8.float(), v8.float().reshape(bk, S // BLOCK_M, BLOCK_M, D)[:, :nk]
    vq, ii = vnni.Values(v8), torch.empty((bk, nk, rows, D))
    outs = {side: (torch.empty((bk, rows, D)), torch.empty((bk, rows)))
            for side in ("float32", "vnni")}

    def float_side():
        compiled._band_products(p8f, v8f, ii)
        compiled._accumulate(ii, alpha, t, m, l, *outs["float32"])
    sides = {"float32": float_side,
             "vnni": lambda: vnni.accumulate(p8, vq, 0, alpha, t, m, l, *outs["vnni"])}
    for run in sides.values():
        run()
    if not all(torch.equal(x.view(torch.int32), y.view(torch.int32))
               for x, y in zip(outs["float32"], outs["vnni"])):
        raise SystemExit(f"the VNNI P V differs from the float32 one at {nk} key blocks")
    md = alternating_medians(sides, repeats)
    return (f"| forward P V and its ordered sum, {nk} key blocks | {bk} x {rows} x "
            f"{nk * BLOCK_M} x {D} | - | {md['float32'] * 1e3:.2f} (float32 + fwd_acc) | "
            f"{md['vnni'] * 1e3:.2f} | {md['float32'] / md['vnni']:.2f} |")


def _forward_pv(window, repeats: int, g: torch.Generator) -> str:
    q, k = _operands(g, 0.0)
    v = torch.randn(B, HKV, S, D, generator=g).bfloat16()
    real = vnni.Values

    def run(on: bool):
        vnni.Values = real if on else (lambda v8: None)   # None: compiled.py's float32 P V
        try:
            return compiled.forward(q, k, v, window)
        finally:
            vnni.Values = real
    for x, y in zip(run(True), run(False)):
        if not torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                           y.view(torch.int16 if y.element_size() == 2 else torch.int32)):
            raise SystemExit(f"the forward differs with P V on VNNI (window {window})")
    md = alternating_medians({"float32": lambda: run(False), "vnni": lambda: run(True)}, repeats)
    return (f"| attention forward, window {window or 'full'}: P V float32 / VNNI | "
            f"{md['float32']:.3f} | {md['vnni']:.3f} | {md['float32'] / md['vnni']:.2f} |")


def _attention(window, repeats: int, g: torch.Generator) -> str:
    q, k = _operands(g, 0.0)
    v = torch.randn(B, HKV, S, D, generator=g).bfloat16()
    do = (torch.randn(B, HQ, S, D, generator=g) * 1e-3).bfloat16()

    def run(switch: str):
        os.environ[vnni.SWITCH] = switch
        o, lse = AF.forward_cpu(q, k, v, window)
        return (o, lse, *AB.backward_cpu(q, k, v, o, lse, do, window))
    try:
        got, want = run("1"), run("0")
        for x, y in zip(got, want):
            if not torch.equal(x.view(torch.int16 if x.element_size() == 2 else torch.int32),
                               y.view(torch.int16 if y.element_size() == 2 else torch.int32)):
                raise SystemExit(f"attention differs with and without VNNI (window {window})")
        md = alternating_medians({"float64": lambda: run("0"), "vnni": lambda: run("1")},
                                 repeats)
    finally:
        os.environ.pop(vnni.SWITCH, None)
    return (f"| attention fwd + bwd, window {window or 'full'} | {md['float64']:.3f} | "
            f"{md['vnni']:.3f} | {md['float64'] / md['vnni']:.2f} |")


@click.command()
@click.option("--repeats", default=5)
@click.option("--out", default=None)
def main(repeats, out):
    if not (vnni.available() and compiled.vnni_in_use()):
        raise SystemExit("the VNNI row products do not run on this CPU: nothing to time")
    lines = report_head("python -m benchmarks.kernels.attention_rows")
    lines += [f"torch threads: {torch.get_num_threads()}; SPARSE_MAX {vnni.SPARSE_MAX:.4f}", "",
              "| product | planes x rows x keys x D | L share (A / B) | float64 ms | VNNI ms | "
              "float64 / VNNI |", "|---|---|---|---|---|---|"]
    g = torch.Generator().manual_seed(0)
    q, k = _operands(g, 0.0)
    for heads, who in (("all", "forward Q K^T"), ("one", "backward Q K^T, dO V^T")):
        for nk in (9, 64):
            lines.append(_product_row(q, k, heads, nk, repeats, f"{who}, {nk} key blocks")[0])
            print(lines[-1], flush=True)
    for nk in (9, 64):
        lines.append(_pv_row(nk, repeats, g))
        print(lines[-1], flush=True)
    for share in SHARES:
        q, k = _operands(g, share)
        lines.append(_product_row(q, k, "all", 16, repeats, f"forward, share {share:.0%}")[0])
        print(lines[-1], flush=True)
    lines += ["", "| whole | float64 s | VNNI s | float64 / VNNI |", "|---|---|---|---|"]
    for window in (512, None):
        lines.append(_forward_pv(window, repeats, g))
        print(lines[-1], flush=True)
    for window in (512, None):
        lines.append(_attention(window, max(2, repeats // 2), g))
        print(lines[-1], flush=True)
    report_end(lines, out)


if __name__ == "__main__":
    main()
