"""Is a run's ``steps.jsonl`` one unbroken hash chain?

Without re-executing anything: line 0 is the genesis and its hash is the hash of its
record; line s holds step s, its ``prev`` is line s-1's hash, its scalars digest is the
digest of its scalars, and its hash is the step hash of (s, prev, components). The first
line that breaks a rule is reported with the step and what is wrong - an edited, removed,
reordered or inserted line cannot pass (the hashes are SHA-256).
"""
from __future__ import annotations

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


def check(lines: list[dict[str, Any]]) -> Finding | None:
    """The first broken link of the chain, or None."""
    if not lines:
        return Finding(0, "log", "the run's steps.jsonl has no lines")
    g = lines[0]
    if g.get("step") != 0 or "genesis" not in g:
        return Finding(0, "log", "line 1 is not the run's genesis (step 0)")
    if statehash.genesis_hash(g["genesis"]) != g.get("hash"):
        return Finding(0, "chain", "the genesis hash is not the hash of its record (edited)")
    for s, line in enumerate(lines[1:], start=1):
        if line.get("step") != s:
            return Finding(s, "log", f"line {s + 1} holds step {line.get('step')!r}, not {s} "
                                     f"(a step removed, inserted or reordered)")
        if line.get("prev") != lines[s - 1].get("hash"):
            return Finding(s, "chain", "its prev is not step {0}'s hash (a step removed or "
                                       "replaced before it)".format(s - 1))
        comps = line.get("components") or {}
        if statehash.sha(line.get("scalars")) != comps.get("scalars"):
            return Finding(s, "scalars", "the logged scalars do not match their digest "
                                         "(edited)")
        try:
            want = statehash.step_hash(s, line["prev"], comps)
        except (ValueError, KeyError):
            return Finding(s, "log", f"components missing: {sorted(comps)}")
        if want != line.get("hash"):
            return Finding(s, "chain", "its hash is not the hash of its components (edited)")
    return None
