"""The lean head's weight gradient with its blocks sliced in place against through a copy.

Under the lean plan the LM head's weight gradient runs in blocks of ``--block`` vocabulary
rows (``open1b_train.model.HEAD_COLS``: 16,384): ``ozaki_mm(dlogits[:, v0:v1].t(), h.t())``,
whose ``a`` - the transpose of a column block of dlogits (``--tokens`` x 128,256 float32) -
is neither row- nor column-contiguous. The slicer (``lmhead_slices``) now reads such a
block in place (its columns a whole dlogits row apart) and slices it as it slices a whole
transposed dlogits (the resident plan's); before, it sliced a row-major copy. Both sides
run every block of one dlogits, alternated; the same weight gradient is asserted.

    python -m benchmarks.kernels.lmhead_blocks [--tokens 4096] [--block 16384] [--repeats 2]
        [--out FILE]
"""
from __future__ import annotations

import argparse
import time

import torch

VOCAB = 128_256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=16_384)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="append the markdown report here")
    a = ap.parse_args()
    if min(a.tokens, a.block, a.repeats) < 1:
        ap.error("--tokens, --block and --repeats must be at least 1")

    from benchmarks.machine import report_end, report_head
    from open1b_kernels.core.backend import force
    from open1b_kernels.ops.lmhead import ozaki_mm

    g = torch.Generator().manual_seed(0)
    dl = torch.softmax(torch.randn(a.tokens, VOCAB, generator=g), 1)   # the loss's gradient:
    dl[torch.arange(a.tokens), torch.randint(0, VOCAB, (a.tokens,), generator=g)] -= 1.0
    dl /= a.tokens                                                      # softmax - onehot, mean
    h = torch.randn(a.tokens, 2048, generator=g).to(torch.bfloat16)
    starts = range(0, VOCAB, a.block)

    def in_place():
        return [ozaki_mm(dl[:, v0:v0 + a.block].t(), h.t(), 3) for v0 in starts]

    def copied():
        return [ozaki_mm(dl[:, v0:v0 + a.block].t().contiguous(), h.t(), 3) for v0 in starts]

    sides = {"through a copy (before)": copied, "in place": in_place}
    runs: dict[str, list[float]] = {k: [] for k in sides}
    got = {}
    with force("cpu"):
        for _ in range(a.repeats):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                got[name] = fn()
                runs[name].append(time.perf_counter() - t0)
                print(f"[{name}] {runs[name][-1]:.2f} s", flush=True)
    first, second = got.values()
    if not all(torch.equal(x, y) for x, y in zip(first, second)):
        raise SystemExit("the weight gradient differs between the two sides")
    best = {k: min(v) for k, v in runs.items()}
    lines = report_head("python -m benchmarks.kernels.lmhead_blocks")
    lines += [f"the weight gradient of dlogits {a.tokens:,} x {VOCAB:,} (float32, softmax - "
              f"onehot over the tokens) and h {a.tokens:,} x 2,048 (bf16) in {len(starts)} "
              f"blocks of {a.block:,} vocabulary rows, 3 slices; best of {a.repeats}, "
              "alternated; the same result (torch.equal)", "",
              "| side | s | runs |", "|---|---|---|"]
    lines += [f"| {k} | {best[k]:.3f} | {', '.join(f'{x:.3f}' for x in runs[k])} |"
              for k in sides]
    lines.append(f"\nin place: **{best['through a copy (before)'] / best['in place']:.2f}x**")
    report_end(lines, a.out)


if __name__ == "__main__":
    main()
