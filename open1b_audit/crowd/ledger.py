"""The store's layout and the state of every leg, read from one listing.

::

    plan.json                                   the plan (plan.py)
    ledger/leg-<L>/s<slot>-g<gen>/claim.json    a claim: event ``claimed`` (seq 0)
    ledger/leg-<L>/s<slot>-g<gen>/<seq>-<kind>.json   its holder's later events
    ledger/leg-<L>/s<slot>-g<gen>/refused-<key>.json  a refusal of its hand-off, by <key>
    ledger/leg-<L>/s<slot>-g<gen>/by-<key>      an empty marker: who claimed it
    certs/step-<N>/<key>.json                   certificates (the existing format)
    handoffs/step-<N>/<key>/<file>              hand-off states (checkpoint format)
    evidence/step-<N>/<key>/<file>              a mismatch's finding and per-op trace

(``<key>``: the first 16 hex digits of the signer's public key.) Every object is created
once and never changed (``store.py``). A leg has ``redundancy`` slots; a slot's claims are
numbered by generation, and only the newest generation's claim counts. Its status, from
the listing alone (names and the store's modification times):

* ``open``     - no claim, or the newest one ``expired``, was released (``timeout``,
  ``cancelled``, ``inconclusive``) or is ``void`` - then generation + 1 may be claimed;
* ``live``     - claimed, no final event, and neither past the plan's lease since it was
  claimed nor silent for three heartbeats (the clock margin ``skew``: clocks of the
  auditors and the store must agree within it);
* ``expired``  - past either: its auditor is gone or too slow; the slot is open again;
* ``done``     - ``certified``; ``void`` when a refusal names its hand-off (its auditor's
  state was not the chain's: the slot opens again);
* ``disputed`` - ``mismatch``: final; coverage lists it.

Names are not trusted beyond scheduling: the reader that acts on an event (using a hand-off,
counting coverage) reads it and checks its signature (``event.verify_event``). The ``by-``
marker lets an auditor choose a leg from the listing alone (which legs its key already
holds) instead of reading every claim; a false marker can only make someone skip a leg.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from open1b_audit.crowd.event import RELEASING, TERMINAL

CLAIM_DIR = re.compile(r"^ledger/leg-(\d{5})/s(\d+)-g(\d+)/(.+)$")
EVENT_NAME = re.compile(r"^(\d{3,})-([a-z-]+)\.json$")
REFUSAL_NAME = re.compile(r"^refused-([0-9a-f]{16})\.json$")
HOLDER_NAME = re.compile(r"^by-([0-9a-f]{16})$")


def key16(key: str) -> str:
    return key[:16]


def claim_dir(leg: int, slot: int, gen: int) -> str:
    return f"ledger/leg-{leg:05d}/s{slot}-g{gen}"


def cert_path(step: int, key: str) -> str:
    return f"certs/step-{step:08d}/{key16(key)}.json"


def handoff_dir(step: int, key: str) -> str:
    return f"handoffs/step-{step:08d}/{key16(key)}"


def evidence_dir(step: int, key: str) -> str:
    return f"evidence/step-{step:08d}/{key16(key)}"


def skew(plan) -> float:
    return min(60.0, plan.heartbeat_s)


@dataclass
class ClaimView:
    leg: int
    slot: int
    gen: int
    claimed_at: float | None = None
    events: list[tuple[int, str, float, str]] = field(default_factory=list)  # seq kind mtime
    refusals: list[str] = field(default_factory=list)
    named: str | None = None     # the holder's key16 its ``by-`` marker names (scheduling only)

    @property
    def dir(self) -> str:
        return claim_dir(self.leg, self.slot, self.gen)

    @property
    def last(self) -> float:
        return max([self.claimed_at or 0.0] + [m for _, _, m, _ in self.events])

    @property
    def final(self) -> str | None:
        ends = [k for _, k, _, _ in sorted(self.events) if k in TERMINAL]
        return ends[0] if ends else None

    def has(self, kind: str) -> list[str]:
        return [rel for _, k, _, rel in sorted(self.events) if k == kind]

    def status(self, plan, now: float) -> str:
        if self.claimed_at is None:
            return "open"
        end = self.final
        if end == "certified":
            return "void" if self.refusals else "done"
        if end == "mismatch":
            return "disputed"
        if end in RELEASING:
            return "released"
        margin = skew(plan)
        past_lease = now > self.claimed_at + plan.lease_s + margin
        silent = now > self.last + 3 * plan.heartbeat_s + margin
        if past_lease or silent:
            return "expired"
        return "live"


@dataclass
class LegView:
    leg: int
    claims: dict[tuple[int, int], ClaimView] = field(default_factory=dict)   # (slot, gen)

    def top(self, slot: int) -> ClaimView | None:
        gens = [g for (s, g) in self.claims if s == slot]
        return self.claims[(slot, max(gens))] if gens else None

    def slot_status(self, plan, slot: int, now: float) -> str:
        top = self.top(slot)
        return "open" if top is None else top.status(plan, now)

    def next_gen(self, slot: int) -> int:
        top = self.top(slot)
        return 0 if top is None else top.gen + 1


def scan(store, plan) -> dict[int, LegView]:
    """Every leg's claims, from one fresh listing of ``ledger/``."""
    legs = {i: LegView(i) for i in range(len(plan.legs))}
    for rel, entry in store.listing("ledger").items():
        m = CLAIM_DIR.match(rel)
        if m is None or int(m[1]) not in legs:
            continue
        leg, slot, gen, name = int(m[1]), int(m[2]), int(m[3]), m[4]
        if slot >= plan.redundancy:
            continue
        cv = legs[leg].claims.setdefault((slot, gen), ClaimView(leg, slot, gen))
        if name == "claim.json":
            cv.claimed_at = entry.mtime
        elif (e := EVENT_NAME.match(name)) is not None:
            cv.events.append((int(e[1]), e[2], entry.mtime, rel))
        elif REFUSAL_NAME.match(name):
            cv.refusals.append(rel)
        elif (h := HOLDER_NAME.match(name)) is not None:
            cv.named = h[1]
    return legs
