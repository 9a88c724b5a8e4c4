"""Claiming a leg, holding it, and ending it - with conditional writes only.

A claim is won by creating ``ledger/leg-<L>/s<slot>-g<gen>/claim.json`` (``store.create``:
``If-None-Match: *`` on S3): of several auditors racing for the same slot and generation
exactly one creates it, the others get ``Taken`` and look again. Which slot: the lowest open
one of a leg (``ledger.py``); which leg: among those whose start state exists (a published
checkpoint, or a hand-off of the leg before that no one refused) and that this key has not
already claimed or finished, the ones with the fewest filled slots first - and among those
first the legs that start from this key's own hand-off (it still holds that state: nothing
to download) - in random order (auditors scanning alike would otherwise all race for the
same one). A key
takes at most one slot of a leg: ``choose`` skips legs it holds or finished, and after
winning a claim the auditor re-reads the leg and cancels its own claim if the same key won
another slot there at the same moment.

The holder numbers its events in the claim's directory (``Claim.event``): a heartbeat
thread writes ``renewed`` every ``heartbeat_s`` while the leg runs, and one final event
(certified, mismatch, timeout, cancelled, inconclusive) ends it. An auditor restarted after
a crash finds its own unfinished claim (``mine``) and goes on with it, numbering its
events after the last one it wrote before.
"""
from __future__ import annotations

import random
import threading
import time

from open1b_audit.crowd import event as ev
from open1b_audit.crowd.ledger import claim_dir
from open1b_audit.crowd.store import Taken


class Claim:
    """A claim this auditor holds (module docstring)."""

    def __init__(self, store, plan, key_path: str, key: str, leg: int, slot: int, gen: int,
                 next_seq: int = 1) -> None:
        self.store, self.plan = store, plan
        self.key_path, self.key = key_path, key
        self.leg, self.slot, self.gen = leg, slot, gen
        self.seq = next_seq
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.heartbeat_errors = 0

    @property
    def dir(self) -> str:
        return claim_dir(self.leg, self.slot, self.gen)

    @property
    def steps(self) -> tuple[int, int]:
        return self.plan.legs[self.leg]

    def event(self, kind: str, detail: dict | None = None) -> str:
        """Write the next event of this claim; its object's path."""
        with self._lock:
            while True:
                e = ev.sign(ev.build(self.plan.run_hash, self.leg, self.slot, self.gen,
                                     self.seq, kind, self.key, detail), self.key_path)
                rel = f"{self.dir}/{self.seq:03d}-{kind}.json"
                self.seq += 1
                try:
                    self.store.create(rel, ev.encode(e), kind)
                    return rel
                except Taken:          # a former life of this claim used that number
                    continue

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.plan.heartbeat_s):
                try:
                    self.event("renewed")
                except Exception:  # noqa: BLE001  (the next beat retries; the leg goes on)
                    self.heartbeat_errors += 1
        self._beat = threading.Thread(target=beat, name=f"open1b-lease-{self.leg}", daemon=True)
        self._beat.start()

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()

    def end(self, kind: str, detail: dict | None = None) -> str:
        self.stop_heartbeat()
        return self.event(kind, detail)


def try_claim(store, plan, key_path: str, key: str, leg: int, slot: int, gen: int
              ) -> Claim | None:
    """Create the claim of (leg, slot, gen); None when another auditor created it first."""
    e = ev.sign(ev.build(plan.run_hash, leg, slot, gen, 0, "claimed", key,
                         {"steps": list(plan.legs[leg])}), key_path)
    try:
        store.create(f"{claim_dir(leg, slot, gen)}/claim.json", ev.encode(e), "claimed")
    except Taken:
        return None
    store.create(f"{claim_dir(leg, slot, gen)}/by-{key[:16]}", b"", "marker")
    return Claim(store, plan, key_path, key, leg, slot, gen)


def named(holders, cv, key: str) -> bool:
    """Whether ``cv`` is ``key``'s, for scheduling: its ``by-`` marker, else its checked
    ``claim.json`` (``ledger.py``: a marker is a hint, never a proof)."""
    if cv.named is not None:
        return cv.named == key[:16]
    return holders.key(cv) == key


class Holders:
    """Who holds each claim: its ``claim.json``, read once (objects never change) and
    checked (signature, coordinates); None for one that is not a valid claim."""

    def __init__(self, store) -> None:
        self.store = store
        self._keys: dict[tuple[int, int, int], str | None] = {}

    def key(self, cv) -> str | None:
        k = (cv.leg, cv.slot, cv.gen)
        if k not in self._keys:
            from open1b.safeio import parse_json

            try:
                e = parse_json(self.store.read(f"{cv.dir}/claim.json"), cv.dir, ev.EventError)
                signer = ev.verify_event(e)
                where = (e["kind"], e["leg"], e["slot"], e["gen"], e["seq"])
                ok = where == ("claimed", cv.leg, cv.slot, cv.gen, 0)
                self._keys[k] = signer if ok else None
            except (ev.EventError, FileNotFoundError):
                self._keys[k] = None
        return self._keys[k]


def startable(views, plan, leg: int, now: float) -> bool:
    """Whether ``leg``'s start state exists: published, or handed off by the leg before it
    in a claim that certified and no one refused."""
    if plan.from_checkpoint(leg):
        return True
    before = views[leg - 1]
    return any(cv.has("handed-off") and cv.status(plan, now) == "done"
               for cv in before.claims.values())


def mine(views, plan, holders: Holders, key: str, now: float) -> list:
    """This key's unfinished newest claims (to go on with after a restart)."""
    out = []
    for lv in views.values():
        for slot in range(plan.redundancy):
            top = lv.top(slot)
            if top is None or top.status(plan, now) not in ("live", "expired"):
                continue
            if named(holders, top, key) and holders.key(top) == key:
                out.append(top)
    return out


def involved(lv, plan, holders: Holders, key: str, now: float) -> bool:
    """Whether ``key`` holds or finished a slot of this leg (or was refused there)."""
    for cv in lv.claims.values():
        if not named(holders, cv, key):
            continue
        if cv.status(plan, now) in ("live", "done", "disputed", "void") or cv.refusals:
            return True
    return False


def choose(views, plan, holders: Holders, key: str, now: float, rng: random.Random,
           spread: int | None = None) -> list[tuple[int, int, int]]:
    """(leg, slot, gen) to try, best first (module docstring): the legs with the fewest
    filled slots first, those continuing this key's own hand-off first among them, in
    random order within each rank (``spread``: only the first ``spread`` of each rank
    shuffled, the rest by leg; 0: no shuffle)."""
    ranked = []
    for leg, lv in views.items():
        statuses = [lv.slot_status(plan, s, now) for s in range(plan.redundancy)]
        free = [s for s, st in enumerate(statuses) if st in ("open", "expired", "released",
                                                              "void")]
        if not free or not startable(views, plan, leg, now):
            continue
        if involved(lv, plan, holders, key, now):
            continue
        filled = plan.redundancy - len(free)
        relay = 0 if _continues(views, plan, holders, key, leg, now) else 1
        ranked.append(((filled, relay), leg, [(s, lv.next_gen(s)) for s in free]))
    ranked.sort()
    out = []
    for filled in sorted({r[0] for r in ranked}):
        tier = [r for r in ranked if r[0] == filled]
        k = len(tier) if spread is None else spread
        head = tier[:k]
        rng.shuffle(head)
        out += head + tier[k:]
    # every free slot of a leg, lowest first: a lost race for slot 0 tries slot 1 next
    return [(leg, slot, gen) for _, leg, slots in out for slot, gen in slots]


def _continues(views, plan, holders: Holders, key: str, leg: int, now: float) -> bool:
    """Whether ``leg`` starts from this key's own hand-off (it keeps the state: no
    download), which ``choose`` prefers among legs as filled."""
    if leg == 0 or plan.from_checkpoint(leg):
        return False
    return any(cv.has("handed-off") and cv.status(plan, now) == "done"
               and named(holders, cv, key) for cv in views[leg - 1].claims.values())


def duplicate(views, plan, holders: Holders, claim: Claim, now: float) -> bool:
    """Whether this key also holds another, lower slot of the claim's leg (a race of two
    processes with one key): the higher one gives way."""
    lv = views[claim.leg]
    for slot in range(claim.slot):
        top = lv.top(slot)
        if top is None or top.status(plan, now) not in ("live", "done", "disputed"):
            continue
        if named(holders, top, claim.key):
            return True
    return False


def remaining(views, plan, holders: Holders, key: str, now: float) -> tuple[int, int]:
    """(slots this key could still take now or later, slots in flight): the volunteer
    loop stops when it can take none and none is in flight that could open again."""
    could = flight = 0
    for leg, lv in views.items():
        statuses = [lv.slot_status(plan, s, now) for s in range(plan.redundancy)]
        flight += statuses.count("live")
        if involved(lv, plan, holders, key, now):
            continue
        could += sum(st in ("open", "expired", "released", "void") for st in statuses)
    return could, flight
