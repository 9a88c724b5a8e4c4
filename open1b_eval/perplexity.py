"""Per-source loss and perplexity of a checkpoint on text files, and over checkpoints.

A source is one file (its name without directories); its text is one document: the
separator, then its byte-level BPE ids (``Trained.encode_prompt``). Loss = mean -log p
(nats) over every token of the document, each predicted with up to ``window`` tokens of
context in disjoint windows (``scoring.rolling_nll``); perplexity = exp(loss). ``window``
defaults to the mix's training window (the mix's ``window`` - 1). Validation over
checkpoints (``over_steps``) reloads each checkpoint and writes a PNG of the loss per
source against the step.
"""
from __future__ import annotations

import math
import os

from open1b_eval.decoder import Decoder
from open1b_eval.errors import EvalError
from open1b_eval.scoring import rolling_nll
from open1b_eval.trained import Trained, load


def training_window(t: Trained) -> int:
    """The tokens a training window feeds the model: the mix's window minus the label."""
    from open1b_data import load_manifest

    return load_manifest(t.mix).window - 1


def read_sources(files: list[str]) -> dict[str, str]:
    out = {}
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                out[os.path.basename(f)] = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise EvalError(f"{f}: cannot read it as UTF-8 text ({e})") from None
    if not out:
        raise EvalError("no text files given: pass FILES (plain UTF-8 text, one source each)")
    return out


def perplexity(t: Trained, sources: dict[str, str], window: int | None = None) -> dict:
    """{"step", "window", "sources": {name: {"tokens", "loss", "perplexity"}}, "all"}."""
    window = window or training_window(t)
    dec = Decoder(t.cfg, t.params)
    rows, tot, n = {}, 0.0, 0
    for name, text in sources.items():
        nll, k = rolling_nll(dec, t.encode_prompt(text), window)
        if k == 0:
            raise EvalError(f"{name}: no tokens to score (empty file)")
        rows[name] = {"tokens": k, "loss": nll / k, "perplexity": math.exp(nll / k)}
        tot, n = tot + nll, n + k
    return {"run": t.run, "step": t.step, "window": window, "sources": rows,
            "all": {"tokens": n, "loss": tot / n, "perplexity": math.exp(tot / n)}}


def over_steps(run: str, sources: dict[str, str], steps: list[int], window: int | None,
               png: str | None) -> list[dict]:
    """``perplexity`` at every step in ``steps``; with ``png``, the loss-vs-step plot."""
    reps = [perplexity(load(run, s), sources, window) for s in steps]
    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for name in ["all", *sources]:
            ys = [r["all" if name == "all" else "sources"][name]["loss"] if name != "all"
                  else r["all"]["loss"] for r in reps]
            ax.plot([r["step"] for r in reps], ys, marker="o", label=name,
                    linewidth=2.5 if name == "all" else 1)
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title(f"{os.path.basename(os.path.normpath(run))}: validation loss")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)
    return reps
