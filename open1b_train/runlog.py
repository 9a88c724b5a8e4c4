"""``RUN/steps.jsonl``: the append-only step log, one JSON object per line.

Line 0 is the run's genesis (``step: 0``); line s is step s. Hashed fields (what the step
hash covers): ``step``, ``hash``, ``prev``, ``components`` (data, grad, params, optim,
scalars) and ``scalars`` (the exact values behind the scalars digest: float32 bits as hex,
the LR as a binary64 hex float). Informational fields (not hashed, may differ between two
runs of the same step): ``loss``, ``grad_norm``, ``lr`` (decimal), ``seconds``,
``tokens_per_s``, ``hash_seconds``, ``update_seconds``.

A process killed while appending leaves at most one partial last line (no newline); ``read``
(the trainer's view) ignores it and a resume removes it; ``read_log`` (the auditor's view)
reports it - a cut-off line is not part of the chain, and it may as well be a truncation
of a published log. Truncation on resume rewrites the file atomically (temporary file,
fsync, rename). The file is read only if it is a regular file (``safeio``: a FIFO or a
device in its place is refused, never waited on) and every line is parsed as data (JSON
nested too deeply is an error, not a ``RecursionError``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from open1b.canonical import canonical_json
from open1b_train.errors import ResumeError
from open1b.safeio import parse_json, read_regular

NAME = "steps.jsonl"


def path_of(run: str) -> str:
    return os.path.join(run, NAME)


@dataclass(frozen=True)
class Log:
    """The complete lines of a log and its cut-off last line, if any."""

    path: str
    lines: list[dict[str, Any]]
    partial_bytes: int = 0           # length of a last line without its newline (0: none)

    @property
    def partial_line(self) -> int | None:
        """The 1-based line number of the cut-off line (None: the log ends in a newline)."""
        return len(self.lines) + 1 if self.partial_bytes else None


def read_log(run: str, strict: bool = False, error=ResumeError) -> Log:
    """Every complete line of the log and the size of a partial last line. Each line must
    be a JSON object; ``strict`` also requires line i to hold step i (the audit reads
    leniently and ``open1b_train.chain`` names the first line that breaks a rule)."""
    p = path_of(run)
    raw = read_regular(p, "step log", error)
    lines = raw.split(b"\n")
    partial = len(lines.pop())               # b"" when the log ends in a newline
    out = []
    for i, line in enumerate(lines):
        rec = parse_json(line, f"{p}: line {i + 1}", error)
        if not isinstance(rec, dict) or (strict and rec.get("step") != i):
            raise error(f"{p}: line {i + 1} should hold step {i} as a JSON object, it holds "
                        f"{rec.get('step') if isinstance(rec, dict) else type(rec).__name__!r}"
                        f"; the log was edited or damaged")
        out.append(rec)
    return Log(p, out, partial)


def read(run: str, strict: bool = True) -> list[dict[str, Any]]:
    """Every complete line of the log (a partial last line is skipped; no log: []).
    ``strict`` also requires line i to hold step i."""
    if not os.path.lexists(path_of(run)):
        return []
    try:
        return read_log(run, strict).lines
    except ResumeError as e:
        raise ResumeError(f"{e}; restore it or start a new run") from None


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
        f.write(canonical_json(record) + b"\n")
        f.flush()
        os.fsync(f.fileno())


def rewrite(run: str, records: list[dict[str, Any]]) -> None:
    """Replace the log with ``records`` atomically."""
    p = path_of(run)
    tmp = f"{p}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        for r in records:
            f.write(canonical_json(r) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)


def set_aside_partial_tail(run: str) -> str | None:
    """Move a partial last line (a writer killed mid-append) out of the log into
    ``RUN/steps.jsonl.partial-<n>`` - kept for inspection, never silently dropped - and leave
    the log ending at its last complete line, so appending can go on. Returns the path the
    tail went to (None: there was none)."""
    p = path_of(run)
    if not has_partial_tail(run):
        return None
    with open(p, "rb") as f:
        raw = f.read()
    cut = raw.rfind(b"\n") + 1
    n = 0
    while os.path.exists(f"{p}.partial-{n}"):
        n += 1
    aside = f"{p}.partial-{n}"
    with open(aside, "wb") as f:
        f.write(raw[cut:])
        f.flush()
        os.fsync(f.fileno())
    tmp = f"{p}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(raw[:cut])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return aside

