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
fsync, rename). The file is read only if it is a regular file and not a symbolic link
(``safeio``: a FIFO, a device or a link in its place is refused, never waited on or
followed), as a stream of ``CHUNK``-byte reads: no line may be longer than
``MAX_LINE_BYTES`` (a longer one is refused naming its line number, after at most that
many bytes of it were held), so reading costs memory for the parsed lines and one
bounded line, never for a crafted giant line (a 400 MB line read whole and split cost
4.7x its size). Every line is parsed as data (JSON nested too deeply is an error, not a
``RecursionError``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from open1b.canonical import canonical_json
from open1b_train.errors import ResumeError
from open1b.safeio import open_regular, parse_json, write_atomic

NAME = "steps.jsonl"
# The longest line an honest log holds, with 40x to spare: a line is ~930 bytes of fixed
# fields (five component digests, hash, prev, the hashed scalars, the decimals and timings)
# plus 11 bytes per window's loss (``"40c7db40",``) and ~30 per source's validation loss -
# measured: `make demo`'s steps of 8 windows are 1,016 bytes, 1,135 with 4 sources'
# validation losses. Open-1B's widest step has 2,304 windows: ~26 KB. 1 MiB also holds a
# step of 90,000 windows.
MAX_LINE_BYTES = 1 << 20
CHUNK = 1 << 20             # bytes per read while streaming the log


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
    out: list[dict[str, Any]] = []
    with open_regular(p, "step log", error) as f:
        partial = _stream(f, p, strict, error, out)
    return Log(p, out, partial)


def _too_long(p: str, n: int, error) -> Exception:
    return error(f"{p}: line {n} is longer than {MAX_LINE_BYTES:,} bytes, the most a line of "
                 f"this tool's log holds (runlog.MAX_LINE_BYTES); refusing to read it - the "
                 f"log was crafted or damaged")


def _stream(f, p: str, strict: bool, error, out: list[dict[str, Any]]) -> int:
    """Parse the complete lines of ``f`` into ``out``, each at most ``MAX_LINE_BYTES``;
    returns the length of a cut-off last line (0: none)."""
    buf = bytearray()
    scan = 0                                 # buf[:scan] holds no newline
    while chunk := f.read(CHUNK):
        buf += chunk
        start = 0
        while (nl := buf.find(b"\n", scan)) >= 0:
            if nl - start > MAX_LINE_BYTES:
                raise _too_long(p, len(out) + 1, error)
            _parse(buf[start:nl], p, len(out), strict, error, out)
            start = scan = nl + 1
        del buf[:start]
        scan = len(buf)
        if len(buf) > MAX_LINE_BYTES:
            raise _too_long(p, len(out) + 1, error)
    return len(buf)


def _parse(line: bytes | bytearray, p: str, i: int, strict: bool, error,
           out: list[dict[str, Any]]) -> None:
    rec = parse_json(line, f"{p}: line {i + 1}", error)
    if not isinstance(rec, dict) or (strict and rec.get("step") != i):
        raise error(f"{p}: line {i + 1} should hold step {i} as a JSON object, it holds "
                    f"{rec.get('step') if isinstance(rec, dict) else type(rec).__name__!r}"
                    f"; the log was edited or damaged")
    out.append(rec)


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
    write_atomic(path_of(run), b"".join(canonical_json(r) + b"\n" for r in records))


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
    write_atomic(p, raw[:cut])
    return aside

