"""``RUN/steps.jsonl``: the append-only step log, one JSON object per line.

Line 0 is the run's genesis (``step: 0``); line s is step s. Hashed fields (what the step
hash covers): ``step``, ``hash``, ``prev``, ``components`` (data, grad, params, optim,
scalars) and ``scalars`` (the exact values behind the scalars digest: float32 bits as hex,
the LR as a binary64 hex float). Informational fields (not hashed, may differ between two
runs of the same step): ``loss``, ``grad_norm``, ``lr`` (decimal), ``seconds``,
``tokens_per_s``, ``hash_seconds``.

A process killed while appending leaves at most one partial last line (no newline); it is
ignored when the log is read and removed when a run resumes. Truncation on resume rewrites
the file atomically (temporary file, fsync, rename).
"""
from __future__ import annotations

import json
import os
from typing import Any

from open1b_train.errors import ResumeError

NAME = "steps.jsonl"


def path_of(run: str) -> str:
    return os.path.join(run, NAME)


def read(run: str, strict: bool = True) -> list[dict[str, Any]]:
    """Every complete line of the log (a partial last line is skipped). ``strict`` also
    requires line i to hold step i (the audit reads leniently and reports the gap)."""
    p = path_of(run)
    if not os.path.exists(p):
        return []
    with open(p, "rb") as f:
        raw = f.read()
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        lines.pop()                              # killed mid-append: no newline yet
    out = []
    for i, line in enumerate(lines):
        try:
            rec = json.loads(line)
        except ValueError:
            raise ResumeError(f"{p}: line {i + 1} is not valid JSON; the log was edited or "
                              f"damaged - restore it or start a new run") from None
        if not isinstance(rec, dict) or (strict and rec.get("step") != i):
            raise ResumeError(f"{p}: line {i + 1} should hold step {i}, it holds "
                              f"{rec.get('step') if isinstance(rec, dict) else rec!r}")
        out.append(rec)
    return out


def has_partial_tail(run: str) -> bool:
    """True when the last line has no newline (a writer was killed mid-append)."""
    p = path_of(run)
    if not os.path.exists(p) or os.path.getsize(p) == 0:
        return False
    with open(p, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


def append(run: str, record: dict[str, Any]) -> None:
    with open(path_of(run), "ab") as f:
        f.write(json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def rewrite(run: str, records: list[dict[str, Any]]) -> None:
    """Replace the log with ``records`` atomically."""
    p = path_of(run)
    tmp = f"{p}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True, separators=(",", ":")).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
