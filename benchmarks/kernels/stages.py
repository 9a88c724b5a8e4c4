"""Where the CPU's time goes inside the W8A8 linear's backward and the LM head + loss, stage
by stage - which of them sit at the int8 GEMM's floor and what is left around them.

    python -m benchmarks.kernels.stages [--tokens 4096] [--repeats 3] [--only linear|head]
        [--out FILE]

The linear (``open1b_kernels.int8.linear``'s CPU path, the calls of
``linear_int8_backward_cpu`` one by one) at Open-1B's shapes for ``--tokens``: gate|up
(2,048 -> 11,264), down (5,632 -> 2,048) and q|o (2,048 -> 2,048): the four rotations and
quantizations, the dX and dW GEMMs with their dequantization and checks, the STE and the
LSQ tree (today in one pass, each block of the term's tree summed as it is made, beside the
term written and summed after: ``FUSED_STE`` off, before 2026-12-07), and the whole
backward; beside them the route's bare int8 GEMM of the dX product.
Side by side with today's three rotations along the columns (the weight's columns for
dX, the gradient's and the input codes' for dW: ``rotate_quantize_cols_cpu``'s fused pass,
each strip of columns through L2 once) the way before it (``FUSED_COLS`` off: a float32
copy of the whole matrix rotated in tiles, then a sweep for the codes), alone and inside
the whole backward ("before": the backward with the fused pass off), with the ratio; and
the dX and dW GEMMs, the whole backward and the whole forward with the dequantization in
the tile product's epilogue (the "amx" route's ``FUSED_DEQUANT``, results past the caches
by streaming stores) against its second pass over the int32 product with every result
stored through the caches ("second pass, before": the code before 2026-12-07; the same
code on other routes). The
LM head + loss (``lmhead_forward``, ``xent_forward``, ``xent_backward``, dh and dW) at
``--tokens`` x 128,256. Anchor: each GEMM's int8 multiply-adds at the measured bare
``_int_mm`` rate. Median of ``--repeats`` after one warm-up, the linear's stages once each
a round (alternating); freed memory kept for reuse as the trainer keeps it.
"""
from __future__ import annotations

import statistics
import time

import click
import torch

from benchmarks.machine import alternating_medians, report_end, report_head
from open1b_kernels.core.backend import force
from open1b_kernels.int8 import linear as lin
from open1b_kernels.int8 import amxmm, gemm, quantize, route, ste
from open1b_kernels.ops import lmhead as lm
from open1b_kernels.ops.xent import xent_backward, xent_forward
from open1b_train.memory.allocator import keep_freed_memory

LINEARS = {"gate|up": (2_048, 11_264), "down": (5_632, 2_048), "q|o": (2_048, 2_048)}
VOCAB, D_MODEL = 128_256, 2_048


def _off(module, switch: str):
    """``fn`` -> ``fn`` run with ``module.switch`` False (a way as it ran before) - the same
    bits."""
    def wrap(fn):
        def run():
            setattr(module, switch, False)
            try:
                return fn()
            finally:
                setattr(module, switch, True)
        return run
    return wrap


# the columns' rotations before the fused pass (``FUSED_COLS`` off: the tiles into a float32
# copy, then the codes' sweep)
_tiles = _off(quantize, "FUSED_COLS")
# the STE's term written, then summed by the tree (``FUSED_STE`` off), as before 2026-12-07
_ste_apart = _off(ste, "FUSED_STE")


def _second_pass(fn):
    """``fn`` with the int8 GEMMs' dequantization as it ran before the tiles' epilogue
    (``FUSED_DEQUANT`` off: the int32 product written, then the dequantization's own pass
    over it) and no streaming stores (``amxmm.stream_min_bytes``) - the amx route only; the
    same bits."""
    def run():
        was = amxmm.stream_min_bytes(1 << 62) if amxmm.available() else None
        try:
            return _off(gemm, "FUSED_DEQUANT")(fn)()
        finally:
            if was is not None:
                amxmm.stream_min_bytes(was)
    return run


def _linear_rows(m: int, k: int, n: int, repeats: int) -> list[str]:
    g = torch.Generator().manual_seed(k * n)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.02).bfloat16()
    dy = (torch.randn(m, n, generator=g) * 1e-3).bfloat16()
    sx = torch.tensor([0.05])
    _, codes = lin.linear_int8_forward_cpu(x, w, sx)
    q_x, q_w, sw, outside = codes
    rq = lin.rotate_quantize_cols_cpu
    qb, sb = rq(q_w, "linear.codes_w", row_scale=sw)
    qa, sa = lin.rotate_quantize_rows_cpu(dy, "stages.codes_g")
    qa2, sa2 = rq(dy, "stages.codes_g2", transposed=True)
    qb2, sb2 = rq(q_x, "linear.codes_x")
    dx_hat = lin.exact_dequant_cpu(qa, qb.t(), sa, sb, torch.float32)
    rotations = {
        "rotate w_hat": lambda: rq(q_w, "stages.codes_w", row_scale=sw),
        "rotate dy (for dW)": lambda: rq(dy, "stages.codes_g2", transposed=True),
        "rotate q_x": lambda: rq(q_x, "stages.codes_x"),
    }
    for name, fn in rotations.items():
        got, was = [t.clone() for t in fn()], _tiles(fn)()
        if not all(torch.equal(a, b) for a, b in zip(got, was)):
            raise SystemExit(f"{name}: the fused pass and the tiles differ: not comparable")
    backward = lambda: lin.linear_int8_backward_cpu(dy, x, w, sx, codes)  # noqa: E731
    forward = lambda: lin.linear_int8_forward_cpu(x, w, sx)[0]  # noqa: E731
    now = [t.clone() for t in backward()]
    for way, off in (("the fused pass", _tiles), ("the tiles' dequantization", _second_pass)):
        if not all(torch.equal(a, b) for a, b in zip(off(backward)(), now)):
            raise SystemExit(f"the backward differs with {way} off: not comparable")
    if not all(torch.equal(a, b) for a, b in zip(_ste_apart(backward)(), now)):
        raise SystemExit("the backward differs with the STE's term apart: not comparable")
    if not torch.equal(forward().view(torch.int16), _second_pass(forward)().view(torch.int16)):
        raise SystemExit("the forward differs with the tiles' dequantization off: not comparable")
    dx_gemm = lambda: lin.exact_dequant_cpu(qa, qb.t(), sa, sb, torch.float32)  # noqa: E731
    dw_gemm = lambda: lin._dw_cpu(qa2, qb2.t(), sa2, sb2 * sx, outside,  # noqa: E731
                                  torch.float32)
    stages = {}
    for name, fn in rotations.items():
        stages[name] = fn
        stages[f"{name} (tiles, before)"] = _tiles(fn)
    stages.update({
        "rotate dy (for dX), rows": lambda: lin.rotate_quantize_rows_cpu(dy, "stages.codes_g"),
        "dX GEMM + dequant + check": dx_gemm,
        "dX GEMM + dequant + check (second pass, before)": _second_pass(dx_gemm),
        "dW GEMM in slabs": dw_gemm,
        "dW GEMM in slabs (second pass, before)": _second_pass(dw_gemm),
        "STE + term": lambda: lin.ste_cpu(dx_hat, x, sx, want_term=True, out_bf16=True),
        "STE + the term's tree sum": lambda: ste.ste_term_sum_cpu(dx_hat, x, sx),
        "STE + the term's tree sum (term apart, before)": _ste_apart(
            lambda: ste.ste_term_sum_cpu(dx_hat, x, sx)),
        "whole backward": backward,
        "whole backward (before)": _tiles(backward),
        "whole backward (term apart, before)": _ste_apart(backward),
        "whole backward (second pass, before)": _second_pass(backward),
        "whole forward": forward,
        "whole forward (second pass, before)": _second_pass(forward),
        "bare dX _int_mm": lambda: route._raw_int_mm(qa, qb),
    })
    for fn in stages.values():                                     # warm-up
        fn()
    # every stage once a round, so that the before / now pairs are timed side by side
    ms = {name: t * 1e3 for name, t in alternating_medians(stages, repeats).items()}
    rows = [f"| {m} x {k} -> {n} | {name} | {t:.1f} |" for name, t in ms.items()]
    pairs = [(name, f"{name} (tiles, before)", name) for name in rotations] + [
        ("whole backward", "whole backward (before)", "whole backward")] + [
        ("STE + the term's tree sum, fused", "STE + the term's tree sum (term apart, before)",
         "STE + the term's tree sum"),
        ("whole backward, the STE's term fused", "whole backward (term apart, before)",
         "whole backward")] + [
        (f"{name}, tiles' dequantization", f"{name} (second pass, before)", name)
        for name in ("dX GEMM + dequant + check", "dW GEMM in slabs", "whole backward",
                     "whole forward")]
    for what, a, b in pairs:
        rows.append(f"| {m} x {k} -> {n} | {what}: before / now | **{ms[a] / ms[b]:.2f}x** |")
    return rows


def _head_rows(tokens: int, repeats: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, D_MODEL, generator=g).bfloat16()
    w = (torch.randn(VOCAB, D_MODEL, generator=g) * 0.02).bfloat16()
    labels = torch.randint(0, VOCAB, (tokens,), generator=g)
    times: dict[str, list[float]] = {}
    with force("cpu"):
        for _ in range(repeats + 1):
            marks = [time.perf_counter()]
            logits = lm.lmhead_forward(h, w)
            marks.append(time.perf_counter())
            _, lse = xent_forward(logits, labels)
            marks.append(time.perf_counter())
            dl = xent_backward(torch.ones(()), logits, labels, lse, overwrite=True)
            marks.append(time.perf_counter())
            lm.ozaki_mm(dl, w.t())
            lm.release("lmhead.")
            marks.append(time.perf_counter())
            lm.ozaki_mm(dl.t(), h.t())
            lm.release("lmhead.")
            marks.append(time.perf_counter())
            del logits, dl
            for name, a, b in zip(("forward product", "xent forward", "xent backward", "dh",
                                   "dW"), marks, marks[1:]):
                times.setdefault(name, []).append(b - a)
    return [f"| {tokens} x {VOCAB} | {name} | {statistics.median(t[1:]) * 1e3:.0f} |"
            for name, t in times.items()]


@click.command()
@click.option("--tokens", default=4_096, type=click.IntRange(min=1))
@click.option("--repeats", default=3, type=click.IntRange(min=1))
@click.option("--only", type=click.Choice(["linear", "head"]), default=None,
              help="one of the two parts (default: both, the linear's first)")
@click.option("--out", default=None)
def main(tokens, repeats, only, out):
    keep_freed_memory()
    lines = report_head("python -m benchmarks.kernels.stages")
    lines += ["", f"int8 GEMM route: {route.int_gemm_route()}", "",
              "| shape | stage | ms (median) |", "|---|---|---|"]
    for k, n in LINEARS.values() if only != "head" else ():
        lines += _linear_rows(tokens, k, n, repeats)
        print("\n".join(lines[-15:]), flush=True)
    if only != "linear":
        lines += _head_rows(tokens, repeats)
    report_end(lines, out)


if __name__ == "__main__":
    main()
