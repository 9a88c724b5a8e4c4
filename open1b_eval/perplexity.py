"""Per-source loss and perplexity of a checkpoint on text files, and over checkpoints.

A source is one file (its name without directories); its text is one document: the
separator, then its byte-level BPE ids (``Trained.encode_prompt``). Loss = mean -log p
(nats) over every token of the document, each predicted with up to ``window`` tokens of
context in disjoint windows (``scoring.rolling_nll``); perplexity = exp(loss). ``window``
defaults to the mix's training window (the mix's ``window`` - 1). Validation over
checkpoints (``over_steps``) reloads each checkpoint and writes a PNG of the loss per
source against the step.

Held-out data: when the run's mix reserves a held-out set (``[heldout]`` in its definition,
STREAM.md section 10), ``heldout`` scores each source's first ``windows`` held-out windows
(``open1b_data.stream.heldout``: the documents the stream never trains on, packed into the
mix's windows): every token of a window but the first is predicted from the tokens before
it in the window, exactly as in training; loss = mean -log p over them, per source and
over all.
"""
from __future__ import annotations

import math
import os

from open1b_eval.decoder import Decoder
from open1b_eval.errors import EvalError
from open1b_eval.scoring import rolling_nll, token_logprobs
from open1b_eval.trained import Trained, at_step
from open1b_train.published import PublishedRun


def training_window(t: Trained) -> int:
    """The tokens a training window feeds the model: the mix's window minus the label."""
    from open1b_data import load_manifest

    return load_manifest(t.mix).window - 1


def has_heldout(t: Trained) -> bool:
    """Whether the run's mix reserves held-out data."""
    from open1b_data.stream.mixview import MixView

    return any(s.heldout for s in MixView.open(t.mix).sources)


def heldout(t: Trained, windows: int = 8) -> dict:
    """{"windows", "sources": {name: {"windows", "tokens", "loss", "perplexity"}}, "all"}
    over each held-out source's first ``windows`` held-out windows (see the docstring)."""
    from open1b_data.stream.heldout import HeldoutWindows

    ho = HeldoutWindows.open(t.mix)
    try:
        if not ho.sources:
            raise EvalError(f"the mix of {t.run} ({t.mix}) has no held-out data; its "
                            f"definition needs [heldout] fraction = \"...\"")
        dec = Decoder(t.cfg, t.params)
        rows, tot, n = {}, 0.0, 0
        for name in ho.sources:
            ws = ho.windows(name, windows)
            nll = 0.0
            for w in ws:
                nll -= sum(token_logprobs(dec, w.tolist())[0])
            k = int(ws.shape[0]) * (ho.window - 1)
            if k == 0:
                continue
            rows[name] = {"windows": int(ws.shape[0]), "tokens": k, "loss": nll / k,
                          "perplexity": math.exp(nll / k)}
            tot, n = tot + nll, n + k
    finally:
        ho.close()
    if not n:
        raise EvalError(f"the held-out sets of {t.mix} hold no full window")
    return {"windows": windows, "sources": rows,
            "all": {"tokens": n, "loss": tot / n, "perplexity": math.exp(tot / n)}}


def read_sources(files: list[str], allow_none: bool = False) -> dict[str, str]:
    out = {}
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                out[os.path.basename(f)] = fh.read()
        except (OSError, UnicodeDecodeError) as e:
            raise EvalError(f"{f}: cannot read it as UTF-8 text ({e})") from None
    if not out and not allow_none:
        raise EvalError("no text files given: pass FILES (plain UTF-8 text, one source each)")
    return out


def perplexity(t: Trained, sources: dict[str, str], window: int | None = None,
               heldout_windows: int | None = None) -> dict:
    """{"step", "window", "sources": {name: {"tokens", "loss", "perplexity"}}, "all"}, and
    "heldout" (``heldout``) when ``heldout_windows`` is given and the mix has held-out
    data."""
    window = window or training_window(t)
    dec = Decoder(t.cfg, t.params)
    rows, tot, n = {}, 0.0, 0
    for name, text in sources.items():
        nll, k = rolling_nll(dec, t.encode_prompt(text), window)
        if k == 0:
            raise EvalError(f"{name}: no tokens to score (empty file)")
        rows[name] = {"tokens": k, "loss": nll / k, "perplexity": math.exp(nll / k)}
        tot, n = tot + nll, n + k
    rep = {"run": t.run, "step": t.step, "window": window, "sources": rows,
           "all": {"tokens": n, "loss": tot / n, "perplexity": math.exp(tot / n)}
           if n else None}
    if heldout_windows and has_heldout(t):
        rep["heldout"] = heldout(t, heldout_windows)
    return rep


def over_steps(pub: PublishedRun, sources: dict[str, str], steps: list[int],
               window: int | None, png: str | None) -> list[dict]:
    """``perplexity`` at every step in ``steps`` of the checked run ``pub``; with ``png``,
    the loss-vs-step plot."""
    run = pub.dir
    reps = [perplexity(at_step(pub, s), sources, window) for s in steps]
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
