"""``open1b-audit bisect``: where a replay and a published run first disagree - the step,
then the operator - and which steps that vouches for.

Contract: bisect vouches only for steps it replayed. Every checkpoint interval
``[a, b]`` (steps a+1..b, replayed from the published checkpoint at a, itself checked
against the log) is an independent claim: a forger can make one interval wrong and every
later one right (a checkpoint edited consistently with a re-hashed log, later steps
trained honestly from it). So no interval's result says anything about another's.

Steps: the log's chain is checked first (by every replay); then the intervals of
1..UNTIL (cut at the run's checkpoints) are replayed, each step by step to its first
mismatch.

* ``search="all"`` (the default): every interval, in order, until the first that does not
  reproduce. Its first differing step is the range's first differing step. When all
  match, the whole range is vouched for - that is what vouching costs: a full replay.
* ``search="binary"``: a binary search over the intervals, replaying O(log n) of them.
  It is only sound between two states both known to be honest (a systematic difference
  such as another kernel, on a run already vouched for), so it never vouches: the report
  names every interval it did not replay, and a differing step it finds is *a* differing
  step (confirmed by a replay from a verified checkpoint), not necessarily the first.

The report: ``step`` (the differing step or None), ``finding``, ``search``,
``replayed_intervals`` and ``not_replayed`` (lists of ``[a, b]``), ``verified_steps``
(the steps whose replay matched), ``vouched`` - true only when every interval of
1..UNTIL was replayed and matched -, ``recipe`` (preset, mix fingerprint, departures) and
``final_checkpoint``: the last published checkpoint in 1..UNTIL and whether a replay
compared it with the log (every replay compares the published checkpoints of the steps it
reproduces, so the released weights are checked, not only the steps before them).

Operator: the differing step is replayed once more with a per-op digest trace
(``trace.py``: forward, backward, the reduction and every optimizer stage) and compared
with the other party's trace of the same step - the run's own
``RUN/traces/step-<n>.jsonl`` (``open1b-train run --trace-steps``) or a file given with
``--against`` (``open1b-audit trace`` run on the other party's machine). The first op
whose output differs names the virtual rank, micro-batch, layer, forward/backward and op,
or the optimizer stage, parameter and tensor; only that op needs to be re-executed by a
referee.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from open1b_audit import trace as tracemod
from open1b_audit.replay import ReplayResult, replay
from open1b_train import checkpoint

SEARCHES = ("all", "binary")


def trace_step(run_dir: str, step: int, out: str | None = None, **kw) -> tracemod.Tracer:
    """Replay ``step`` from the nearest checkpoint with a per-op trace of it."""
    tracer = tracemod.Tracer(step)
    res = replay(run_dir, step, trace=lambda s, name, t: tracer(name, t), trace_steps={step},
                 **kw)
    tracer.replay = res
    if out:
        tracer.write(out)
    return tracer


def intervals(run_dir: str, until: int) -> list[tuple[int, int]]:
    """The checkpoint intervals ``[a, b]`` covering steps 1..until, in order."""
    marks = [0] + [c for c in checkpoint.list_steps(run_dir) if 0 < c < until] + [until]
    return list(zip(marks, marks[1:]))


@dataclass
class Search:
    """What a search replayed and what it found (see the module docstring)."""

    mode: str
    intervals: list[tuple[int, int]]
    replayed: dict[tuple[int, int], ReplayResult] = field(default_factory=dict)
    differing: ReplayResult | None = None          # the replay that found ``step``

    @property
    def step(self) -> int | None:
        return None if self.differing is None else self.differing.finding.step

    @property
    def not_replayed(self) -> list[tuple[int, int]]:
        return [iv for iv in self.intervals if iv not in self.replayed]

    @property
    def verified_steps(self) -> list[int]:
        return sorted(s for r in self.replayed.values() for s in r.verified)

    @property
    def vouched(self) -> bool:
        return (self.differing is None and not self.not_replayed and
            all(r.ok for r in self.replayed.values()))

    def replay_interval(self, run_dir: str, iv: tuple[int, int], **kw) -> ReplayResult:
        self.replayed[iv] = replay(run_dir, iv[1], from_step=iv[0], **kw)
        return self.replayed[iv]


def first_difference_step(run_dir: str, until: int, search: str = "all", **kw) -> Search:
    """Replay the intervals of 1..``until`` (every one with ``search="all"``, a binary
    search with ``"binary"``) up to the first that does not reproduce."""
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {SEARCHES}, got {search!r}")
    out = Search(search, intervals(run_dir, until))
    if search == "all":
        for iv in out.intervals:
            res = out.replay_interval(run_dir, iv, **kw)
            if not res.ok:
                out.differing = res
                break
        return out
    # sound only if a difference persists: intervals below a matching one are skipped
    lo, hi = 0, len(out.intervals)
    while lo < hi:
        mid = (lo + hi) // 2
        res = out.replay_interval(run_dir, out.intervals[mid], **kw)
        if res.ok:
            lo = mid + 1
        else:
            out.differing, hi = res, mid            # the earliest failing interval seen
    return out


def final_checkpoint(run_dir: str, until: int, found: Search) -> dict[str, Any] | None:
    """The last published checkpoint in 1..``until`` (the weights users take away) and
    whether a replay compared it with the log (``replay.published_checkpoint_difference``);
    None when the run publishes none there."""
    steps = [c for c in checkpoint.list_steps(run_dir) if 0 < c <= until]
    if not steps:
        return None
    compared = any(steps[-1] in r.checkpoints_compared for r in found.replayed.values())
    return {"step": steps[-1], "compared": compared}


def bisect(run_dir: str, until: int, against: str | None = None, search: str = "all",
           **kw) -> dict[str, Any]:
    found = first_difference_step(run_dir, until, search, **kw)
    step, res = found.step, found.differing
    out: dict[str, Any] = {
        "run": run_dir, "until": until, "search": found.mode, "step": step,
        "finding": None if res is None else res.finding.to_dict(),
        "replayed_intervals": [list(iv) for iv in found.intervals if iv in found.replayed],
        "not_replayed": [list(iv) for iv in found.not_replayed],
        "verified_steps": found.verified_steps, "vouched": found.vouched, "operator": None,
        "recipe": next((r.recipe for r in found.replayed.values() if r.recipe), None),
        "final_checkpoint": final_checkpoint(run_dir, until, found)}
    if step is None or res.finding.component == "recipe":    # nothing was replayed
        return out
    theirs = against or tracemod.path_of(run_dir, step)
    if not os.path.exists(theirs):
        out["operator_unavailable"] = (
            f"no trace of step {step} to compare with ({theirs}); ask the run's owner for "
            f"`open1b-audit trace RUN --step {step} --out FILE` from their machine, then "
            f"`open1b-audit bisect RUN --until {step} --against FILE`")
        return out
    t_step, their_ops = tracemod.read(theirs)
    if t_step != step:
        raise ValueError(f"{theirs} traces step {t_step}, the first differing step is {step}")
    mine = trace_step(run_dir, step, **kw)
    out["operator"] = tracemod.first_difference(their_ops, mine.ops)
    out["ops_compared"] = min(len(their_ops), len(mine.ops))
    return out
