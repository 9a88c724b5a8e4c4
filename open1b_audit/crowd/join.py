"""``open1b-audit join RUN_URL --key K``: the volunteer loop.

Open the run where it is published (``cache.py``: the log pinned to the announced run hash,
the config, the mix's metadata - each checked against the chain), open the store's plan or
create it (``plan.py``), run the doctor (``doctor.py``; a machine it refuses claims
nothing and ends ``inconclusive``), then repeat until told to stop (``--max-legs``,
``--hours``, a signal) or until nothing is left that this key may take:

1. list the ledger (``ledger.scan``); go on with this key's own unfinished claim if there
   is one (a restart after a crash resumes it from its spilled state), else claim a leg
   (``claim.choose`` / ``try_claim``: a conditional create; a lost race is counted and the
   next candidate tried, and after ``RESCAN_AFTER`` in a row the ledger is listed again);
2. run it (``leg.run_leg``: fetch, replay with a progress bar and ETA, certify, hand off,
   publish) to its outcome;
3. when no leg can be claimed now but some may open later (a hand-off not yet uploaded, a
   claim in flight that may expire), wait ``poll_s`` and look again - at most ``idle_s``
   without work.

Several auditors - processes on one machine or on many - share nothing but the store; each
keeps its own cache (``<cache>/key-<first 16 hex digits of its key>``, locked: a second
process with the same key and cache is refused). The summary at the end: legs and their
outcomes, steps certified, bytes fetched (per step and by kind), objects written by kind,
claims lost to other auditors; the exit code is the worst outcome (``leg.EXIT``).
"""
from __future__ import annotations

import fcntl
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from open1b_audit.crowd.leg import EXIT
from open1b_audit.crowd.store import Store, StoreError
from open1b_train.recipe import Announcement

WORST = ("mismatch", "inconclusive", "cancelled", "timeout", "match")
RESCAN_AFTER = 3        # claims lost in a row before the ledger is listed again


@dataclass(frozen=True)
class JoinOptions:
    run: str
    key_path: str
    store: str | None = None           # default: RUN_URL/audit
    name: str | None = None
    cache: str | None = None
    mix: str | None = None
    announce: Announcement = Announcement()
    leg_steps: int = 4
    redundancy: int = 2
    lease_s: float = 24 * 3600.0
    heartbeat_s: float = 300.0
    max_legs: int | None = None
    hours: float | None = None
    backend: str = "cpu"
    memory_plan: str = "auto"
    selftest: bool = True
    poll_s: float = 5.0
    idle_s: float = 600.0


def store_url(run: str, store: str | None) -> str:
    """The crowd's store: ``--store``, else ``RUN_URL/audit`` (an http(s) run is read-only:
    its crowd needs ``--store``)."""
    if store:
        return store
    if run.startswith(("http://", "https://")):
        from open1b_audit.crowd.store import StoreError

        raise StoreError(f"{run} is read-only (http); give the crowd's store with --store "
                         f"s3://bucket/prefix or a local directory")
    return run.rstrip("/") + "/audit"


@dataclass
class Summary:
    legs: list[dict] = field(default_factory=list)
    doctor: dict | None = None
    claims_lost: int = 0
    stopped: str = ""
    failed: bool = False           # the store could not be reached: inconclusive
    cancelled: bool = False        # a signal between legs
    seconds: float = 0.0
    store: dict = field(default_factory=dict)
    fetched: dict = field(default_factory=dict)

    @property
    def outcome(self) -> str:
        got = [x["outcome"] for x in self.legs]
        if self.failed or (self.doctor is not None and not self.doctor.get("ok", True)):
            got.append("inconclusive")
        if self.cancelled:
            got.append("cancelled")
        for w in WORST:
            if w in got:
                return w
        return "match"

    def to_dict(self) -> dict[str, Any]:
        steps = sorted({s for x in self.legs for s in x["certified"]})
        total = self.fetched.get("total", 0)
        return {"outcome": self.outcome, "exit_code": EXIT[self.outcome], "legs": self.legs,
                "steps_certified": steps, "claims_lost": self.claims_lost,
                "stopped": self.stopped, "seconds": round(self.seconds, 2),
                "bytes_fetched": self.fetched,
                "bytes_fetched_per_step": round(total / len(steps)) if steps else None,
                "store": self.store, "doctor": self.doctor}


class CacheLock:
    """An exclusive lock on a cache directory (one process per key and cache)."""

    def __init__(self, root: str) -> None:
        os.makedirs(root, exist_ok=True)
        self.f = open(os.path.join(root, ".lock"), "a+")
        try:
            fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            from open1b_audit.errors import Open1bAuditError

            self.f.close()
            raise Open1bAuditError(f"{root} is in use by another auditor process with the same "
                                   f"key; give this one another --key or --cache") from None

    def release(self) -> None:
        self.f.close()


def join(opts: JoinOptions, out=sys.stderr, stop: threading.Event | None = None) -> Summary:
    """The volunteer loop (module docstring)."""
    from open1b_audit.crowd import claim as cl
    from open1b_audit.crowd.cache import RunCache, default_root
    from open1b_audit.crowd.doctor import doctor
    from open1b_audit.crowd.event import public_key
    from open1b_audit.crowd.ledger import key16, scan
    from open1b_audit.crowd.leg import Auditor, run_leg
    from open1b_audit.crowd.plan import open_plan
    from open1b_audit.crowd.source import RunSource
    from open1b_audit.crowd.windows import ProvedWindows

    t0 = time.perf_counter()
    key = public_key(opts.key_path)
    root = os.path.join(opts.cache or default_root(opts.run), f"key-{key16(key)}")
    lock = CacheLock(root)
    summ = Summary()
    try:
        store = Store(store_url(opts.run, opts.store))
        cache = RunCache(RunSource(opts.run), root, opts.announce, opts.mix)
        cache.config()
        plan, created = open_plan(store, cache.run_hash, len(cache.lines) - 1,
                                  cache.published_steps(), opts.leg_steps, opts.redundancy,
                                  opts.lease_s, opts.heartbeat_s)
        print(f"{'created' if created else 'joined'} the crowd of run {plan.run_hash[:16]}... "
              f"at {store.url}: {len(plan.legs)} legs of <= {plan.leg_steps} steps, redundancy "
              f"{plan.redundancy}, lease {plan.lease_s:.0f} s", file=out, flush=True)
        summ.doctor = doctor(cache, {"leg_steps": plan.leg_steps, "lease_s": plan.lease_s},
                             selftest=opts.selftest)
        if not summ.doctor["ok"]:
            print("doctor: this machine cannot take a leg: " + "; ".join(summ.doctor["reasons"]),
                  file=out, flush=True)
            summ.stopped = "refused by the doctor"
            return summ
        aud = Auditor(store, cache, plan, opts.key_path, key, opts.name or key16(key),
                      ProvedWindows(cache), opts.backend, opts.memory_plan,
                      None if opts.hours is None else time.time() + 3600 * opts.hours,
                      stop, out)
        holders = cl.Holders(store)
        rng = random.Random(f"{key}:{os.getpid()}:{time.time()}")
        idle_since = time.monotonic()
        while True:
            if stop is not None and stop.is_set():
                summ.stopped = "asked to stop"
                break
            if opts.max_legs is not None and len(summ.legs) >= opts.max_legs:
                summ.stopped = f"--max-legs {opts.max_legs} reached"
                break
            if aud.deadline is not None and time.time() >= aud.deadline:
                summ.stopped = f"--hours {opts.hours} reached"
                break
            views, now = scan(store, plan), time.time()
            claim = _resume(store, plan, holders, views, key, opts.key_path, now)
            verb = "resuming" if claim is not None else "claimed"
            lost = 0
            if claim is None:
                for leg, slot, gen in cl.choose(views, plan, holders, key, now, rng):
                    got = cl.try_claim(store, plan, opts.key_path, key, leg, slot, gen)
                    if got is None:
                        summ.claims_lost += 1
                        lost += 1
                        if lost >= RESCAN_AFTER:
                            break
                        continue
                    if cl.duplicate(scan(store, plan), plan, holders, got, time.time()):
                        got.end("cancelled", {"why": "this key holds another slot of the leg"})
                        continue
                    claim = got
                    break
            if claim is None and lost >= RESCAN_AFTER:
                continue                    # others are claiming: list the ledger again
            if claim is None:
                could, flight = cl.remaining(views, plan, holders, key, now)
                if could == 0 and flight == 0:
                    summ.stopped = "nothing left for this key"
                    break
                if time.monotonic() - idle_since > opts.idle_s:
                    summ.stopped = f"no leg could be claimed for {opts.idle_s:.0f} s"
                    break
                time.sleep(opts.poll_s)
                continue
            a, b = claim.steps
            print(f"{verb} leg {claim.leg} (steps {a + 1}..{b}), slot {claim.slot}, "
                  f"generation {claim.gen}", file=out, flush=True)
            res = run_leg(aud, claim)
            summ.legs.append(res.to_dict())
            idle_since = time.monotonic()
            print(f"leg {claim.leg}: {res.outcome.upper()} ({res.start or res.detail.get('why')}; "
                  f"{len(res.certified)} step(s) certified, {res.seconds:.1f} s, "
                  f"{res.bytes_fetched.get('total', 0):,} bytes fetched)", file=out, flush=True)
            if res.outcome == "cancelled":
                summ.stopped = "cancelled"
                break
        return summ
    except StoreError as e:
        summ.failed, summ.stopped = True, f"the store cannot be reached ({e})"
        return summ
    except KeyboardInterrupt:                   # SIGINT / SIGTERM between legs
        summ.cancelled, summ.stopped = True, "cancelled by a signal"
        return summ
    finally:
        summ.seconds = time.perf_counter() - t0
        if "store" in locals():
            summ.store = store.stats.to_dict()
        if "cache" in locals():
            f = dict(cache.source.totals())
            if cache.mix_source is not None:
                f["mix"] = f.get("mix", 0) + cache.mix_source.totals()["total"]
                f["total"] += cache.mix_source.totals()["total"]
            if "aud" in locals():
                f["data"] = aud.windows.bytes_total
                f["total"] += aud.windows.bytes_total
            if "store" in locals():
                f["handoff"] = store.stats.bytes_read
                f["total"] += store.stats.bytes_read
            summ.fetched = f
        lock.release()


def _resume(store, plan, holders, views, key: str, key_path: str, now: float):
    """This key's own unfinished claim, to go on with (a restart), or None; one past its
    lease is ended ``timeout`` first."""
    from open1b_audit.crowd.claim import Claim, mine
    from open1b_audit.crowd.ledger import skew

    for cv in mine(views, plan, holders, key, now):
        c = Claim(store, plan, key_path, key, cv.leg, cv.slot, cv.gen,
                  next_seq=1 + max([0] + [s for s, _, _, _ in cv.events]))
        if now > (cv.claimed_at or 0) + plan.lease_s + skew(plan):
            c.end("timeout", {"why": "the lease passed while this auditor was down"})
            continue
        c.started -= max(0.0, now - (cv.claimed_at or now))       # the lease runs from then
        c.event("renewed", {"why": "resumed after a restart"})
        return c
    return None
