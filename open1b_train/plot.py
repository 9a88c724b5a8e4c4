"""``open1b-train plot RUN``: a PNG of a run's loss, learning rate, gradient norm and
tokens/s against the step, with the batch-ramp phase boundaries marked and skipped steps
shown, read from ``RUN/steps.jsonl`` alone."""
from __future__ import annotations

import os

from open1b_train import runlog
from open1b_train.errors import Open1bTrainError


def plot_run(run: str, out: str | None = None) -> str:
    lines = runlog.read(run)[1:]
    if not lines:
        raise Open1bTrainError(f"{run}: no trained steps to plot (steps.jsonl has none)")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [ln["step"] for ln in lines]
    series = [("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "grad norm (pre-clip)"),
              ("tokens_per_s", "tokens / s")]
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 9), sharex=True)
    starts = [ln["step"] for prev, ln in zip(lines, lines[1:]) if ln.get("phase") != prev.get("phase")]
    skipped = [ln["step"] for ln in lines if ln["scalars"]["skipped"]]
    for ax, (key, label) in zip(axes, series):
        ax.plot(steps, [ln.get(key) for ln in lines], lw=1.2)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for s in starts:
            ax.axvline(s, color="grey", ls="--", lw=0.8)
        for s in skipped:
            ax.axvspan(s - 0.5, s + 0.5, color="red", alpha=0.15, lw=0)
    axes[2].set_yscale("log")
    axes[-1].set_xlabel("step (dashed: batch-ramp phase starts; red: skipped updates)")
    fig.suptitle(f"{os.path.basename(os.path.abspath(run))}: run hash {lines[-1]['hash'][:16]}...")
    fig.tight_layout()
    path = out or os.path.join(run, "training.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
