"""What the lean plan's kept layers save: one forward + backward of a full-width model under
``lean`` recomputing every layer (``lean:0``, the anchor) and keeping every layer's
activations, alternated in one process, with the same weights and tokens.

The model is ``open1b`` at full width (d_model 2,048, heads of 128, SwiGLU 5,632) with
``--layers`` layers (default 4: layer 3 fully causal, the others windowed, as in Open-1B's
first five) and a ``--vocab``-entry LM head (default 8,192: the head is not what the plans
differ in, and Open-1B's 128,256 adds ~38 s to both sides), on one 4,096-token sequence.
Both sides must give the same loss and gradients (checked with ``torch.equal``); the
difference in time is the recomputed forwards. No disk, no optimizer: the end-to-end
steps of ``benchmarks.train.full_step`` add the update, the hashes and their disk I/O.

    python -m benchmarks.train.lean_kept [--layers 4] [--vocab 8192] [--repeats 2]
        [--out benchmarks/results/results-full-step.md]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import torch

SEQ = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="append the markdown report here")
    a = ap.parse_args()

    from benchmarks.machine import LoadLog, describe, simd_flags
    from open1b_kernels.core.backend import force
    from open1b_train.config import open1b
    from open1b_train.model import forward_backward
    from open1b_train.params import init_params

    torch.set_num_threads(os.cpu_count() or 1)
    load = LoadLog()
    m = dataclasses.replace(open1b().model, n_layers=a.layers, vocab=a.vocab)
    p = init_params(m, 1)
    ids = torch.randint(0, a.vocab, (1, SEQ + 1), generator=torch.Generator().manual_seed(0))
    sides = {"lean:0 (every layer recomputed)": frozenset(),
             f"lean, all {a.layers} layers kept": frozenset(range(a.layers))}
    runs: dict[str, list[float]] = {k: [] for k in sides}
    first: dict[str, tuple] = {}
    with force("cpu"):
        for rep in range(a.repeats):                 # alternated: load drifts hit both
            for name, kept in sides.items():
                t0 = time.perf_counter()
                loss, _, grads = forward_backward(m, p, ids[:, :-1], ids[:, 1:], lean=True,
                                                  kept=kept)
                runs[name].append(time.perf_counter() - t0)
                print(f"[{name}] run {rep}: {runs[name][-1]:.2f} s", flush=True)
                if rep == 0:
                    first[name] = (loss, dict(grads))
                del grads
    (l0, g0), (l1, g1) = first.values()
    same = torch.equal(l0, l1) and g0.keys() == g1.keys() and all(
        torch.equal(g0[k], g1[k]) for k in g0)
    load.sample("runs")
    best = {k: min(v) for k, v in runs.items()}
    anchor, kept_side = best.values()
    per_layer = (anchor - kept_side) / a.layers
    lines = [
        f"\n## {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC - "
        f"`python -m benchmarks.train.lean_kept --layers {a.layers} --vocab {a.vocab} "
        f"--repeats {a.repeats}`", "",
        f"- machine: {describe()}; CPU flags: {simd_flags()}",
        f"- {load.summary()}",
        f"- what: `open1b` at full width, {a.layers} layers (fully causal: "
        f"{list(m.full_layers)}), vocabulary {a.vocab:,}, one {SEQ:,}-token sequence, forward "
        f"+ backward under lean; same loss and gradients on both sides (torch.equal): "
        f"**{same}**", "",
        "| side | best s | runs | ratio anchor / side |", "|---|---|---|---|",
        *[f"| {k} | {best[k]:.2f} | {', '.join(f'{t:.2f}' for t in v)} | "
          f"**{anchor / best[k]:.2f}x** |" for k, v in runs.items()], "",
        f"Each kept layer saved {per_layer:.2f} s (best of each side)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)
    if not same:
        raise SystemExit("the two sides differ: a memory plan changed a bit")


if __name__ == "__main__":
    main()
