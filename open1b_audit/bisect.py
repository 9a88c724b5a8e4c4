"""``open1b-audit bisect``: where a replay and a published run first disagree - the step,
then the operator.

Steps: the log's chain is checked first; then the replay runs checkpoint interval by
checkpoint interval (each from the published checkpoint at its start, which is itself
checked against the log), binary-searching for the first interval that does not
reproduce, then replaying that interval step by step to its first mismatch. (The binary
search assumes that a machine that cannot reproduce one interval cannot reproduce the
later ones either - true for a systematic difference such as another kernel; the step it
reports is always confirmed by a replay that verified the step before it.)

Operator: the disputed step is replayed once more with a per-op digest trace
(``trace.py``) and compared with the other party's trace of the same step - the run's own
``RUN/traces/step-<n>.jsonl`` (``open1b-train run --trace-steps``) or a file given with
``--against`` (``open1b-audit trace`` run on the other party's machine). The first op
whose output differs names the virtual rank, micro-batch, layer, forward/backward and op;
only that op needs to be re-executed by a referee.
"""
from __future__ import annotations

import os
from typing import Any

from open1b_audit import trace as tracemod
from open1b_audit.replay import ReplayResult, replay
from open1b_train import checkpoint


def trace_step(run_dir: str, step: int, out: str | None = None, **kw) -> tracemod.Tracer:
    """Replay ``step`` from the nearest checkpoint with a per-op trace of it."""
    tracer = tracemod.Tracer(step)
    res = replay(run_dir, step, trace=lambda s, name, t: tracer(name, t), trace_steps={step},
                 **kw)
    tracer.replay = res
    if out:
        tracer.write(out)
    return tracer


def _interval_ok(run_dir: str, a: int, b: int, **kw) -> ReplayResult:
    return replay(run_dir, b, from_step=a, **kw)


def first_difference_step(run_dir: str, until: int, **kw) -> tuple[int | None, ReplayResult]:
    """The first step up to ``until`` whose replay differs from the log (None: none)."""
    marks = [0] + [c for c in checkpoint.list_steps(run_dir) if 0 < c < until] + [until]
    lo, hi = 0, len(marks) - 1              # intervals [marks[i], marks[i+1]]
    last = None
    while lo < hi:                          # smallest interval index that fails
        mid = (lo + hi) // 2
        res = _interval_ok(run_dir, marks[mid], marks[mid + 1], **kw)
        if res.ok:
            lo = mid + 1
        else:
            hi, last = mid, res
    if lo == len(marks) - 1:
        return None, last
    res = _interval_ok(run_dir, marks[lo], marks[lo + 1], **kw) if last is None or \
        last.start != marks[lo] else last
    return (None if res.ok else res.finding.step), res


def bisect(run_dir: str, until: int, against: str | None = None, **kw) -> dict[str, Any]:
    step, res = first_difference_step(run_dir, until, **kw)
    out: dict[str, Any] = {"run": run_dir, "until": until, "step": step,
                           "finding": None if res is None or res.finding is None
                           else res.finding.to_dict(), "operator": None}
    if step is None:
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
