"""What a build tells its user: live progress on stderr and the final per-source summary.

Contract: ``Progress`` prints at most one line per ``interval`` seconds (documents/s,
tokens/s, MB of text/s, inputs done) to stderr and never to stdout, so ``--json`` output
stays machine-readable. ``summarize`` turns the per-source counts of a merged build into
``SourceSummary`` rows (read, kept, dropped by reason, tokens, token share) and
``format_table`` renders them; the same rows are returned as data by ``build_mix``.
``InputSummary`` is one input file's account (counts by reason, its first bad record, the
shards it wrote, by path relative to the mix root); ``format_bad_inputs`` lists the inputs
that had bad records, and ``unreadable`` names those that were truncated or unreadable.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from open1b_data.ingest.document import BAD_INPUT_REASONS


@dataclass(frozen=True)
class SourceSummary:
    """One row of the end-of-build table."""

    source: str
    read: int
    kept: int
    dropped: dict[str, int]
    tokens: int
    share: float  # this source's fraction of all kept tokens


# Drop reasons that mean the input FILE could not be read to its end (not one bad record).
UNREADABLE_REASONS = ("truncated_zstd", "unreadable_file")


@dataclass(frozen=True)
class InputSummary:
    """One input file as the manifest's ``inputs[]`` entry and ``build-mix --json`` give it.

    ``first_error`` is the first record dropped for bad input (not by a filter):
    ``{"reason", "row", "detail"}`` with ``row`` the 0-based line/row in the file (None when
    the file could not be opened), or None when every record was well formed."""

    source: str
    path: str  # relative to the source root
    read: int
    kept: int
    dropped: dict[str, int]
    tokens: int
    first_error: dict[str, Any] | None
    shards: tuple[str, ...]  # relative to the mix root

    @classmethod
    def from_marker(cls, marker: dict[str, Any]) -> InputSummary:
        c = marker["counts"]
        return cls(marker["source"], marker["input"]["path"], c["read"], c["kept"],
                   dict(c["dropped"]), marker["tokens"], marker.get("first_error"),
                   tuple(s["path"] for s in marker["shards"]))

    @property
    def unreadable(self) -> tuple[str, ...]:
        """The reasons that say the file was truncated or unreadable (empty: read whole)."""
        return tuple(r for r in UNREADABLE_REASONS if self.dropped.get(r))

    def where(self) -> str:
        """``source/path`` and, when a record was bad, its row and reason."""
        e = self.first_error
        if e is None:
            return f"{self.source}/{self.path}"
        at = "" if e["row"] is None else f" row {e['row']}"
        return f"{self.source}/{self.path}{at}: {e['reason']}: {e['detail']}"


def format_bad_inputs(inputs: tuple[InputSummary, ...]) -> str:
    """One line per input that had a bad record (counts by reason, then the first one)."""
    lines = []
    for i in inputs:
        if i.first_error is not None:
            bad = ", ".join(f"{k}={v:,}" for k, v in i.dropped.items()
                            if k in BAD_INPUT_REASONS)
            lines.append(f"  {i.where()} [{bad}]")
    if not lines:
        return ""
    return (f"inputs with bad records ({len(lines)}; first bad record of each):\n" +
        "\n".join(lines))


def summarize(per_source: dict[str, dict[str, Any]]) -> tuple[SourceSummary, ...]:
    """Rows from ``{source: {"read", "kept", "dropped": {reason: n}, "tokens"}}`` (mix order)."""
    total = sum(v["tokens"] for v in per_source.values()) or 1
    return tuple(SourceSummary(name, v["read"], v["kept"], dict(sorted(v["dropped"].items())),
                               v["tokens"], v["tokens"] / total)
                 for name, v in per_source.items())


def format_table(rows: tuple[SourceSummary, ...]) -> str:
    head = ("source", "read", "kept", "dropped", "tokens", "share")
    body = []
    for r in rows:
        why = ", ".join(f"{k}={v:,}" for k, v in r.dropped.items()) or "-"
        body.append((r.source, f"{r.read:,}", f"{r.kept:,}", why, f"{r.tokens:,}",
                     f"{100 * r.share:.1f}%"))
    total_dropped: dict[str, int] = {}
    for r in rows:
        for k, v in r.dropped.items():
            total_dropped[k] = total_dropped.get(k, 0) + v
    body.append(("total", f"{sum(r.read for r in rows):,}", f"{sum(r.kept for r in rows):,}",
                 ", ".join(f"{k}={v:,}" for k, v in sorted(total_dropped.items())) or "-",
                 f"{sum(r.tokens for r in rows):,}", "100.0%"))
    widths = [max(len(row[i]) for row in (head, *body)) for i in range(len(head))]
    right = {1, 2, 4, 5}

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths))).rstrip()

    return "\n".join([fmt(head), fmt(tuple("-" * w for w in widths)), *map(fmt, body)])


class Progress:
    """Throughput counters with rate-limited reporting to stderr."""

    def __init__(self, total_inputs: int, enabled: bool = True, interval: float = 2.0,
                 stream: TextIO | None = None) -> None:
        self.total_inputs = total_inputs
        self.enabled = enabled
        self.interval = interval
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.last = self.start
        self.documents = self.tokens = self.text_bytes = self.inputs_done = 0

    def add(self, documents: int, tokens: int, text_bytes: int) -> None:
        self.documents += documents
        self.tokens += tokens
        self.text_bytes += text_bytes
        self.maybe_print()

    def restart(self) -> None:
        self.start = self.last = time.perf_counter()

    def input_done(self) -> None:
        self.inputs_done += 1
        self.maybe_print()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def line(self) -> str:
        s = max(self.elapsed(), 1e-9)
        return (f"[build-mix] inputs {self.inputs_done}/{self.total_inputs}  "
                f"{self.documents:,} docs ({self.documents / s:,.0f}/s)  "
                f"{self.tokens:,} tokens ({self.tokens / s:,.0f}/s)  "
                f"{self.text_bytes / 1e6:,.1f} MB ({self.text_bytes / 1e6 / s:,.2f} MB/s)  "
                f"{s:,.1f} s")

    def maybe_print(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.enabled and (force or now - self.last >= self.interval):
            self.last = now
            print(self.line(), file=self.stream, flush=True)
