"""``open1b-train plot RUN``: a PNG of a run's loss, learning rate, gradient norm and
tokens/s against the step, with the batch-ramp phase boundaries marked and skipped steps
shown, read from ``RUN/steps.jsonl`` (and the run's mix, for the phase boundaries).

What is plotted is what an audit checks: every value comes from a step's hashed
``scalars`` (``runlog``), never from the decimal ``loss`` / ``lr`` / ``grad_norm`` /
``phase`` fields beside them, which nothing hashes and anyone can edit without breaking
the chain or the replay. Loss and gradient norm are the logged float32 bits, the learning
rate the logged binary64 hex float, skipped steps the hashed flag. Phase boundaries come
from the hashed token counts: with the run's mix (its fingerprint must equal the one in the
hashed genesis record), step s starts phase i when its ``tokens_before`` (the previous
step's hashed ``tokens``) reaches the schedule's ``start_tokens`` of phase i; without it,
a change of the per-step token count (the batch) marks a boundary, and the axis says so.
The one unhashed series is tokens/s, a timing that differs between two runs of the same
steps; its axis is labelled as the owner's report. The plot does not verify the chain
(``open1b-audit`` does); it only never shows a value the chain does not cover.
"""
from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass

from open1b_train import runlog
from open1b_train.errors import Open1bTrainError
from open1b_train.show import f32_from_hex

FROM_SCHEDULE = "batch-ramp phase starts (schedule at the hashed tokens)"
FROM_TOKENS = "batch changes (hashed tokens; the run's mix is unavailable)"


@dataclass(frozen=True)
class Series:
    """What the plot shows, step by step (index i is ``steps[i]``)."""

    steps: list[int]
    loss: list[float]                 # float32 value of scalars.loss
    lr: list[float]                   # float.fromhex(scalars.lr)
    grad_norm: list[float]            # float32 value of scalars.grad_norm (pre-clip)
    tokens: list[int]                 # scalars.tokens: consumed once the step is applied
    skipped: list[int]                # steps whose update was skipped (scalars.skipped)
    phase_starts: list[int]           # steps that open a new phase (not the first step)
    phase_source: str                 # FROM_SCHEDULE or FROM_TOKENS
    tokens_per_s: list[float | None]  # owner-reported timing, unhashed
    # float32 values of scalars.val_loss on the steps that carry one (eval_every):
    # {source: [(step, loss), ...]}
    val_loss: dict[str, list[tuple[int, float]]] | None = None


def series(lines: list[dict], phase_start_tokens: list[int] | None = None) -> Series:
    """The plotted series of trained step lines (step >= 1, consecutive), from their
    hashed ``scalars`` only. ``phase_start_tokens``: the schedule's ``start_tokens`` of
    each phase (None: boundaries where the hashed per-step token count changes)."""
    sc = [ln["scalars"] for ln in lines]
    steps = [ln["step"] for ln in lines]
    tokens = [int(s["tokens"]) for s in sc]
    # tokens_before of each step: the previous step's hashed tokens (unknown for the first
    # line of a slice that does not start at step 1)
    before = [0 if steps[0] == 1 else None] + tokens[:-1]
    if phase_start_tokens is not None:
        key = [None if b is None else bisect.bisect_right(phase_start_tokens, b) - 1
               for b in before]
        source = FROM_SCHEDULE
    else:
        key = [None if b is None else t - b for b, t in zip(before, tokens)]
        source = FROM_TOKENS
    starts = [steps[i] for i in range(1, len(lines))
              if key[i - 1] is not None and key[i] != key[i - 1]]
    return Series(steps=steps, loss=[f32_from_hex(s["loss"]) for s in sc],
                  lr=[float.fromhex(s["lr"]) for s in sc],
                  grad_norm=[f32_from_hex(s["grad_norm"]) for s in sc], tokens=tokens,
                  skipped=[st for st, s in zip(steps, sc) if s["skipped"]],
                  phase_starts=starts, phase_source=source,
                  tokens_per_s=[ln.get("tokens_per_s") for ln in lines],
                  val_loss=_val_loss(steps, sc))


def _val_loss(steps: list[int], sc: list[dict]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for st, s in zip(steps, sc):
        for name, h in (s.get("val_loss") or {}).items():
            out.setdefault(name, []).append((st, f32_from_hex(h)))
    return out


def phase_start_tokens(run: str, genesis: dict, mix: str | None = None) -> list[int] | None:
    """The schedule's phase starts of the run's mix (``mix``, else the one ``RUN/run.json``
    names), or None when it cannot be read or is not the mix the genesis record hashed."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.errors import Open1bDataError
    from open1b_data.stream.schedule import Schedule

    try:
        if mix is None:
            with open(os.path.join(run, "run.json")) as f:
                mix = json.load(f)["mix"]
        manifest = load_manifest(mix)
        if manifest.fingerprint != genesis.get("genesis", {}).get("mix_fingerprint"):
            return None
        spec = Schedule.from_definition(manifest.definition).spec
    except (OSError, ValueError, KeyError, TypeError, Open1bDataError):
        return None
    return [p.start_tokens for p in spec.phases]


def xlabel(s: Series) -> str:
    """The step axis's label, naming only the marks this run's plot has: dashed lines
    where it has batch-ramp phase starts, red bands where it has skipped updates."""
    marks = (([f"dashed: {s.phase_source}"] if s.phase_starts else []) +
        (["red: skipped updates"] if s.skipped else []))
    return "step" + (f" ({'; '.join(marks)})" if marks else "")


def figure(s: Series, title: str = ""):
    """The matplotlib figure of ``s``: loss, LR, gradient norm, tokens/s (in that order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(s.loss, "loss"), (s.lr, "learning rate"), (s.grad_norm, "grad norm (pre-clip)"),
              ([float("nan") if x is None else x for x in s.tokens_per_s],
               "tokens / s\n(owner-reported,\nunhashed)")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 9), sharex=True)
    for ax, (ys, label) in zip(axes, panels):
        ax.plot(s.steps, ys, lw=1.2, label="train" if ax is axes[0] else None)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        for st in s.phase_starts:
            ax.axvline(st, color="grey", ls="--", lw=0.8)
        for st in s.skipped:
            ax.axvspan(st - 0.5, st + 0.5, color="red", alpha=0.15, lw=0)
    for name, pts in (s.val_loss or {}).items():     # held-out loss beside the training loss
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, lw=1,
                     label=f"held-out {name}")
    if s.val_loss:
        axes[0].legend(fontsize=7)
    axes[2].set_yscale("log")
    axes[-1].set_xlabel(xlabel(s))
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_run(run: str, out: str | None = None, mix: str | None = None) -> str:
    """Write the PNG (default ``RUN/training.png``) of ``figure(series(...))``; returns its
    path."""
    lines = runlog.read(run)
    if len(lines) < 2:
        raise Open1bTrainError(f"{run}: no trained steps to plot (steps.jsonl has none)")
    s = series(lines[1:], phase_start_tokens(run, lines[0], mix))
    fig = figure(s, f"{os.path.basename(os.path.abspath(run))}: run hash "
                    f"{lines[-1]['hash'][:16]}...")
    import matplotlib.pyplot as plt

    path = out or os.path.join(run, "training.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
