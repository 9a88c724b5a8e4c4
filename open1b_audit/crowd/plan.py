"""The crowd's work units: legs of consecutive steps, and the plan every auditor reads.

A *unit* is the steps between two published checkpoints (c, c'] (the first from step 0,
whose state every auditor re-derives from the seed; the last ends at the run's last step).
A unit is split into *legs* of at most ``leg_steps`` steps: the first leg of a unit starts
from the published checkpoint, each later leg from the state the leg before it *hands off*
(``handoff.py``). The plan is a pure function of the run (its log's length, its published
checkpoint steps) and four numbers - ``leg_steps``, ``redundancy`` (distinct keys that
certify each leg), ``lease_s`` (the longest an auditor may hold a leg) and
``heartbeat_s`` (how often a holder renews its claim; a claim silent for three heartbeats
has expired: its auditor crashed) - so every auditor derives it alike.

The first auditor to join writes it to ``plan.json`` in the store with a conditional
create; every later one reads it and re-derives it from the run: a plan about another run,
naming checkpoints the run does not publish or legs that are not the derivation's, is
refused by name (a store is one run's).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from open1b_audit.errors import Open1bAuditError

FORMAT = "open1b-crowd-plan"
VERSION = 1
NAME = "plan.json"


class PlanError(Open1bAuditError):
    """A store's plan that is not the one its run gives."""


@dataclass(frozen=True)
class Plan:
    run_hash: str
    steps: int                         # the run's last step
    checkpoints: tuple[int, ...]       # published checkpoint steps 1..steps-1: unit starts
    leg_steps: int
    redundancy: int
    lease_s: float
    heartbeat_s: float
    legs: tuple[tuple[int, int], ...]  # (a, b): steps a+1..b

    @functools.cached_property
    def _marks(self) -> frozenset[int]:
        return frozenset(self.checkpoints)

    def from_checkpoint(self, leg: int) -> bool:
        """Whether ``leg`` starts from a published state (step 0 or a checkpoint)."""
        a = self.legs[leg][0]
        return a == 0 or a in self._marks

    def needs_handoff(self, leg: int) -> bool:
        """Whether the leg after ``leg`` starts from ``leg``'s hand-off."""
        b = self.legs[leg][1]
        return b < self.steps and b not in self._marks

    def leg_of(self, step: int) -> int:
        for i, (a, b) in enumerate(self.legs):
            if a < step <= b:
                return i
        raise PlanError(f"step {step} is in no leg of the plan (steps 1..{self.steps})")

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "run_hash": self.run_hash,
                "steps": self.steps, "checkpoints": list(self.checkpoints),
                "leg_steps": self.leg_steps, "redundancy": self.redundancy,
                "lease_s": self.lease_s, "heartbeat_s": self.heartbeat_s,
                "legs": [list(x) for x in self.legs]}

    def encode(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode()


def legs_of(steps: int, checkpoints: list[int], leg_steps: int) -> tuple[tuple[int, int], ...]:
    marks = [0] + sorted(c for c in set(checkpoints) if 0 < c < steps) + [steps]
    out = []
    for a, b in zip(marks, marks[1:]):
        for x in range(a, b, leg_steps):
            out.append((x, min(x + leg_steps, b)))
    return tuple(out)


def derive(run_hash: str, steps: int, checkpoints: list[int], leg_steps: int,
           redundancy: int, lease_s: float, heartbeat_s: float) -> Plan:
    if leg_steps < 1 or redundancy < 1 or lease_s <= 0 or heartbeat_s <= 0:
        raise PlanError(f"a plan needs leg_steps >= 1, redundancy >= 1 and positive lease and "
                        f"heartbeat (got {leg_steps}, {redundancy}, {lease_s}, {heartbeat_s})")
    cps = tuple(sorted(c for c in set(checkpoints) if 0 < c < steps))
    return Plan(run_hash, steps, cps, leg_steps, redundancy, float(lease_s),
                float(heartbeat_s), legs_of(steps, list(cps), leg_steps))


def parse(raw: bytes, where: str) -> Plan:
    from open1b.safeio import parse_json

    d = parse_json(raw, where, PlanError)
    try:
        if (d.get("format"), d.get("version")) != (FORMAT, VERSION):
            raise PlanError(f"{where}: not a version-{VERSION} {FORMAT}")
        return Plan(str(d["run_hash"]), int(d["steps"]),
                    tuple(int(c) for c in d["checkpoints"]), int(d["leg_steps"]),
                    int(d["redundancy"]), float(d["lease_s"]), float(d["heartbeat_s"]),
                    tuple((int(a), int(b)) for a, b in d["legs"]))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise PlanError(f"{where}: a malformed plan ({type(e).__name__}: {e})") from None


def check(stored: Plan, run_hash: str, steps: int, published: list[int], where: str) -> None:
    """Refuse a stored plan that its run does not give (module docstring)."""
    if stored.run_hash != run_hash or stored.steps != steps:
        raise PlanError(f"{where} is the plan of run {stored.run_hash[:16]}... ({stored.steps} "
                        f"steps), not of this run {run_hash[:16]}... ({steps} steps): use "
                        f"another store prefix")
    missing = sorted(set(stored.checkpoints) - set(published))
    if missing:
        raise PlanError(f"{where} starts units at steps {missing[:5]}, where the run publishes "
                        f"no checkpoint: the plan is not this run's")
    want = derive(run_hash, steps, list(stored.checkpoints), stored.leg_steps,
                  stored.redundancy, stored.lease_s, stored.heartbeat_s)
    if want.legs != stored.legs:
        raise PlanError(f"{where}: its legs are not the ones its checkpoints and leg length "
                        f"give; the plan was edited")


def open_plan(store, run_hash: str, steps: int, published: list[int], leg_steps: int,
              redundancy: int, lease_s: float, heartbeat_s: float) -> tuple[Plan, bool]:
    """The store's plan, created from the arguments if it has none; (plan, created)."""
    mine = derive(run_hash, steps, published, leg_steps, redundancy, lease_s, heartbeat_s)
    from open1b_audit.crowd.store import Taken

    try:
        created = store.create(NAME, mine.encode(), "plan")
    except Taken:                       # another auditor's numbers were first: theirs hold
        created = False
    stored = parse(store.read(NAME), f"{store.url}/{NAME}")
    check(stored, run_hash, steps, published, f"{store.url}/{NAME}")
    return stored, created
