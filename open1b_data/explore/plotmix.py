"""Source composition over training steps: a PNG (matplotlib, Agg backend) of each source's
realized token share per bin of steps (dots) and cumulative from step A (line), with its
target share as a dashed line.

Contract: ``composition(plan, sched, (A, B), bins)`` is pure planning (no token shard read):
for each of ``bins`` equal bins of steps A..B it sums, per source, the document tokens of
the segments in that bin's windows (separators excluded; a document split across windows is
counted where its tokens lie) and divides by the bin's document tokens. ``plot_mix`` writes
the PNG atomically and returns the realized shares over the whole range beside the targets
(the shares the mix weights are built from, ``stream/mixview.py``). A local ``out`` that cannot be
written (a directory, a file in the way, no permission) fails before any planning.
"""
from __future__ import annotations

import io
import os

import numpy as np

from open1b_data.errors import StorageError, StreamError
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.schedule import Schedule
from open1b_data.storage import atomic_write_bytes, ensure_writable_dir
from open1b_data.storage_errors import scheme

CHUNK_WINDOWS = 8192


def _tokens_by_source(plan: StreamPlan, a: int, b: int) -> np.ndarray:
    n = len(plan.sources)
    out = np.zeros(n, dtype=np.int64)
    for lo in range(a, b, CHUNK_WINDOWS):
        segs = plan.segments_range(lo, min(b, lo + CHUNK_WINDOWS))
        doc_tokens = np.minimum(segs.doc_start + segs.length, segs.doc_length) - segs.doc_start
        out += np.bincount(segs.source, weights=doc_tokens, minlength=n).astype(np.int64)
    return out


def composition(plan: StreamPlan, sched: Schedule, steps: tuple[int, int], bins: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges in steps, len k+1; tokens [k, sources]) for steps A..B inclusive."""
    a, b = steps
    if not 1 <= a <= b <= sched.last_step:
        raise StreamError(f"steps {a}:{b} must satisfy 1 <= A <= B <= {sched.last_step} "
                          f"(the schedule's last step)")
    if bins < 1:
        raise StreamError(f"bins must be >= 1, got {bins}")
    k = min(bins, b - a + 1)
    edges = np.unique(np.linspace(a, b + 1, k + 1).round().astype(np.int64))
    tokens = np.zeros((len(edges) - 1, len(plan.sources)), dtype=np.int64)
    for i, (s0, s1) in enumerate(zip(edges[:-1], edges[1:])):
        lo = sched.step(int(s0)).first_window
        last = sched.step(int(s1) - 1)
        tokens[i] = _tokens_by_source(plan, lo, last.first_window + last.batch_sequences)
    return edges, tokens


def plot_mix(mix: str, steps: tuple[int, int], out: str, bins: int = 50) -> dict:
    """Write the composition PNG to ``out``; returns a summary (see module docstring)."""
    if scheme(out) == "file":
        if os.path.isdir(out):
            raise StreamError(f"--out {out} is a directory; name the PNG file to write, "
                              f"e.g. {os.path.join(out, 'mix-composition.png')}")
        try:
            ensure_writable_dir(os.path.dirname(os.path.abspath(out)))
        except StorageError as e:
            raise StreamError(f"--out {out}: {e}") from e
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plan = StreamPlan.open(mix)
    sched = Schedule.from_definition(plan.view.definition)
    edges, tokens = composition(plan, sched, steps, bins)
    targets = [float(s.share) for s in plan.view.sources]
    shares = tokens / np.maximum(tokens.sum(axis=1, keepdims=True), 1)
    mid = (edges[:-1] + edges[1:] - 1) / 2
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    cum = np.cumsum(tokens, axis=0)
    cum_share = cum / np.maximum(cum.sum(axis=1, keepdims=True), 1)
    for j, name in enumerate(plan.sources):
        line, = ax.plot(edges[1:] - 1, cum_share[:, j], lw=2, label=name)
        ax.plot(mid, shares[:, j], ls="none", marker="o", ms=3, alpha=0.35,
                color=line.get_color())
        ax.axhline(targets[j], color=line.get_color(), ls="--", lw=1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("token share")
    ax.text(0.01, 0.98, "line: cumulative from step A;  dots: per bin;  dashed: target",
            transform=ax.transAxes, va="top", fontsize=8)
    ax.set_title(f"{plan.view.name}: source composition, steps {steps[0]}..{steps[1]}")
    ax.set_ylim(0, max(1e-9, float(max(shares.max(), max(targets)))) * 1.15)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write_bytes(out, buf.getvalue())
    total = tokens.sum(axis=0)
    real = total / max(int(total.sum()), 1)
    lo = sched.step(steps[0]).first_window
    last = sched.step(steps[1])
    return {"steps": list(steps), "windows": last.first_window + last.batch_sequences - lo,
            "shares": [(n, float(r), t) for n, r, t in zip(plan.sources, real, targets)]}
