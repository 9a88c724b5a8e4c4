"""Is a run's ``steps.jsonl`` one unbroken hash chain?

Without re-executing anything: line 0 is the genesis and its hash is the hash of its
record; line s holds step s, its ``prev`` is line s-1's hash, its scalars digest is the
digest of its scalars, and its hash is the step hash of (s, prev, components). The first
line that breaks a rule is reported with the step and what is wrong - an edited, removed,
reordered or inserted line cannot pass (the hashes are SHA-256). A field of the wrong type
(a step that is a string, components that are not an object) is such a break, never an
exception. The informational decimals of a line (``loss``, ``grad_norm``, ``lr``: not
hashed) must be the values of its hashed scalars (float32 bits, binary64 hex float), so a
reader of the decimals reads what the chain commits to.

A chain proves only that the log is consistent with itself: a truncated log, or one whose
suffix was rebuilt, is a valid chain with another last hash. ``pin`` compares the log's end
with the run hash its owner published (every audit command's ``--expect-run-hash``), and
``cut_tail`` reports a cut-off last line (``runlog.Log.partial_bytes``), which is never
part of the chain.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from open1b_train import statehash


@dataclass(frozen=True)
class Finding:
    step: int
    component: str          # data, grad, params, optim, scalars, chain, log, checkpoint
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "component": self.component, "detail": self.detail}

    def __str__(self) -> str:
        return f"step {self.step}: {self.component} - {self.detail}"


HEX64 = frozenset("0123456789abcdef")
INFORMATIONAL = ("loss", "grad_norm", "lr")


def is_hash(h: Any) -> bool:
    """A SHA-256 hex digest as this package writes it (64 lowercase hex digits)."""
    return isinstance(h, str) and len(h) == 64 and set(h) <= HEX64


def _hashed_value(scalars: dict[str, Any], field: str) -> float | None:
    """The value the hashed scalars give ``field`` (None: absent or malformed)."""
    h = scalars.get(field)
    if not isinstance(h, str):
        return None
    try:
        if field == "lr":
            return float.fromhex(h)
        return struct.unpack("<f", struct.pack("<I", int(h, 16)))[0]
    except (ValueError, OverflowError, struct.error):
        return None


def _informational(s: int, line: dict[str, Any]) -> Finding | None:
    """A decimal field that is not the value of its hashed scalar (named), or None."""
    for field in INFORMATIONAL:
        if field not in line:
            continue
        have, want = line[field], _hashed_value(line["scalars"], field)
        if want is None:
            return Finding(s, "scalars", f"scalars.{field} is {line['scalars'].get(field)!r}, "
                                         f"not the hex bits of a number")
        if type(have) not in (int, float) or have != want:
            return Finding(s, "scalars", f"its {field} {have!r} is not the value of its hashed "
                                         f"scalars.{field} {line['scalars'][field]!r} ({want!r})"
                                         f" - the decimal was edited")
    return None


def _shape(s: int, line: dict[str, Any]) -> Finding | None:
    """A hashed field of the wrong type, or None."""
    comps = line.get("components")
    if not isinstance(comps, dict) or not all(isinstance(v, str) for v in comps.values()):
        return Finding(s, "log", f"its components are {type(comps).__name__}, not an object "
                                 f"of digests")
    if not isinstance(line.get("scalars"), dict):
        return Finding(s, "log", f"its scalars are {type(line.get('scalars')).__name__}, not "
                                 f"an object")
    for field in ("prev", "hash"):
        if not is_hash(line.get(field)):
            return Finding(s, "log", f"its {field} {line.get(field)!r} is not a SHA-256 hex "
                                     f"digest")
    return None


def check(lines: list[dict[str, Any]]) -> Finding | None:
    """The first broken link of the chain, or None."""
    try:
        return _check(lines)
    except RecursionError:      # a record nested too deeply to hash: crafted, not written
        return Finding(0, "log", "a line is nested too deeply to be a record of this tool")


def _check(lines: list[dict[str, Any]]) -> Finding | None:
    if not lines:
        return Finding(0, "log", "the run's steps.jsonl has no lines")
    g = lines[0]
    if (type(g.get("step")) is not int or g["step"] != 0 or
            not isinstance(g.get("genesis"), dict)):
        return Finding(0, "log", "line 1 is not the run's genesis (step 0 with a genesis "
                                 "object)")
    if statehash.genesis_hash(g["genesis"]) != g.get("hash"):
        return Finding(0, "chain", "the genesis hash is not the hash of its record (edited)")
    for s, line in enumerate(lines[1:], start=1):
        if type(line.get("step")) is not int or line["step"] != s:
            return Finding(s, "log", f"line {s + 1} holds step {line.get('step')!r}, not {s} "
                                     f"(a step removed, inserted or reordered)")
        f = _shape(s, line)
        if f is not None:
            return f
        if line["prev"] != lines[s - 1].get("hash"):
            return Finding(s, "chain", "its prev is not step {0}'s hash (a step removed or "
                                       "replaced before it)".format(s - 1))
        comps = line["components"]
        if statehash.sha(line["scalars"]) != comps.get("scalars"):
            return Finding(s, "scalars", "the logged scalars do not match their digest "
                                         "(edited)")
        try:
            want = statehash.step_hash(s, line["prev"], comps)
        except ValueError:
            return Finding(s, "log", f"components missing: {sorted(comps)}")
        if want != line["hash"]:
            return Finding(s, "chain", "its hash is not the hash of its components (edited)")
        f = _informational(s, line)
        if f is not None:
            return f
    return None


def pin(lines: list[dict[str, Any]], expect: str, partial_bytes: int = 0) -> Finding | None:
    """None if the log ends in ``expect`` (the run hash its owner published); else the
    first step that is not part of the published run, or the first that is missing."""
    last = len(lines) - 1
    hashes = [ln.get("hash") for ln in lines]
    if last >= 0 and hashes[-1] == expect:
        return None
    if expect in hashes:
        k = hashes.index(expect)
        return Finding(k + 1, "log", f"the published run hash {expect[:16]}... is step {k}'s; "
                                     f"steps {k + 1}..{last} of this log are not part of the "
                                     f"published run")
    end = "" if last < 0 else f" (hash {str(hashes[-1])[:16]}...)"
    cut = (f" (line {last + 2} is cut off: {partial_bytes} bytes without a newline)"
           if partial_bytes else "")
    return Finding(last + 1, "log", f"no logged step has the published run hash "
                                    f"{expect[:16]}...: the log ends at step {last}{end}; step "
                                    f"{last + 1} is missing{cut} or an earlier step was "
                                    f"re-chained")


def cut_tail(lines: list[dict[str, Any]], partial_bytes: int) -> Finding | None:
    """A finding for a cut-off last line (``runlog.Log.partial_bytes``), or None."""
    if not partial_bytes:
        return None
    n = len(lines)
    return Finding(n, "log", f"line {n + 1} is cut off ({partial_bytes} bytes, no newline): "
                             f"a writer was killed mid-append or the log was truncated; it is "
                             f"not part of the chain, which ends at step {n - 1}")
