"""One leg of the crowd's audit, from its start state to its outcome - resumable.

``run_leg(auditor, claim)`` replays steps a+1..b of the claimed leg in a run directory of
its own in the cache (``legs/leg-<L>/``), starting from, in this order:

1. the newest state this auditor spilled there before it was stopped (a crash, a reboot,
   ``kill -9``): the replay checks it against the chain like any checkpoint, and a spill
   that fails (a flipped bit: its files' sha256 are in its record) is deleted and the one
   before it used;
2. the published checkpoint at a (or the seed's initial state at a = 0);
3. a hand-off of a by the auditor of the leg before (``handoff.py``): one that is not the
   chain's state is refused by name and the next offer tried.

After each step that matched, the replay's ``on_verified`` hook signs that step's
certificate and uploads it (``certs/step-N/<key>.json``, created once: a certificate the
auditor wrote before a crash is kept, never written twice), then spills the state (the
run's checkpoint format, ``checkpoint.save``; the leg's start and the two newest spills
are kept), prints the progress with an ETA, and stops the leg if a stop was asked for
(``cancelled``), if the next step would end past ``--hours`` or past the plan's lease
(``timeout``). At the end: the state after b is checked against the log and handed off when
the next leg starts from it, and the claim ends ``certified``. A step that differs ends it
``mismatch``, with bisect-ready evidence uploaded to ``evidence/step-N/<key>/``: the signed
mismatch certificate, the finding and this machine's per-op trace of the step (replayed
from the spilled state before it), which ``open1b-audit bisect --against`` compares with
the other party's. A machine that cannot decide (its disk or store fails, a spill keeps
failing, no valid hand-off exists) ends it ``inconclusive``.

Exit codes of the outcomes (``EXIT``): match 0, mismatch 1, timeout 4, cancelled 5,
inconclusive 6 (2 and 3 are the shell's usage and internal errors).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from open1b_audit.crowd import handoff
from open1b_audit.crowd.ledger import cert_path, evidence_dir, key16
from open1b_audit.crowd.store import Taken
from open1b.errors import Open1bError
from open1b_audit.errors import Open1bAuditError

EXIT = {"match": 0, "mismatch": 1, "timeout": 4, "cancelled": 5, "inconclusive": 6}
START_COMPONENTS = ("checkpoint", "params", "optim")


class Stop(Exception):
    """Ends a leg before its last step: ``kind`` is timeout or cancelled."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(why)
        self.kind, self.why = kind, why


@dataclass
class Auditor:
    """One volunteer: where it works, who it is, and its limits."""

    store: Any
    cache: Any                      # cache.RunCache of the run (verified)
    plan: Any
    key_path: str
    key: str
    name: str
    windows: Any                    # windows.ProvedWindows over the cache
    backend: str = "cpu"
    memory_plan: str = "auto"
    deadline: float | None = None   # time.time() past which no step may end (--hours)
    stop_requested: Any = None      # a threading.Event: cancel after the current step
    out: Any = sys.stderr           # progress lines


@dataclass
class LegResult:
    leg: int
    steps: tuple[int, int]
    outcome: str
    detail: dict = field(default_factory=dict)
    certified: list[int] = field(default_factory=list)
    resumed_from: int | None = None
    start: str = ""
    seconds: float = 0.0
    step_seconds: dict[int, float] = field(default_factory=dict)
    bytes_fetched: dict[str, int] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT[self.outcome]

    def to_dict(self) -> dict:
        return {"leg": self.leg, "steps": list(self.steps), "outcome": self.outcome,
                "detail": self.detail, "certified": self.certified,
                "resumed_from": self.resumed_from, "start": self.start,
                "seconds": round(self.seconds, 3), "step_seconds": self.step_seconds,
                "bytes_fetched": self.bytes_fetched}


def leg_name(store_url: str, a: int, b: int) -> str:
    """The cache directory of a leg: one per store and steps (a cache may serve several
    stores; a leg's spills belong to the store its certificates went to)."""
    import hashlib

    return f"{hashlib.sha256(store_url.encode()).hexdigest()[:8]}-steps-{a + 1}-{b}"


def _spills(leg_dir: str, a: int, b: int) -> list[int]:
    from open1b_train import checkpoint

    return [s for s in checkpoint.list_steps(leg_dir) if a < s <= b]


def _spill(leg_dir: str, run, state, s: int, keep: set[int]) -> None:
    """The state after step ``s`` as a checkpoint of ``leg_dir`` (module docstring)."""
    from open1b_data.stream.loader import step_boundary_state
    from open1b_train import checkpoint
    from open1b_train.run import checkpoint_record, optim_shards

    st = dataclasses.replace(state, loader=step_boundary_state(run.plan, run.cfg.virtual_ranks,
                                                               s + 1))
    layout = run.layout
    n = run.cfg.mesh[1]
    if run.memory is not None and run.memory.lean:
        checkpoint.save_streamed(leg_dir, s, st.params, layout, st.opt.m, st.opt.v, n,
                                 checkpoint_record(run, st))
    else:
        checkpoint.save(leg_dir, s, st.params, optim_shards(layout, st.opt, n), n,
                        checkpoint_record(run, st))
    for k in checkpoint.list_steps(leg_dir):
        if k not in keep and k != s:
            shutil.rmtree(checkpoint.step_dir(leg_dir, k), ignore_errors=True)


def _state_ok(state_dir: str, lines: list[dict], cfg, step: int) -> str | None:
    """Why a spilled state is not the log's at ``step`` (None: it is)."""
    from open1b_eval.verify import verify_model
    from open1b_train.published import PublishedRun

    v = verify_model(state_dir, PublishedRun(state_dir, cfg, "", lines, None, {}, False))
    if not v.ok:
        return f"{v.difference['what']} {v.difference['name']}: {v.difference['detail']}"
    return None if v.step == step else f"it holds step {v.step}'s state, not step {step}'s"


class _Progress:
    def __init__(self, aud: Auditor, leg: int, a: int, b: int) -> None:
        self.aud, self.leg, self.a, self.b = aud, leg, a, b
        self.times: list[float] = []

    def step(self, s: int, seconds: float) -> None:
        self.times.append(seconds)
        done, total = s - self.a, self.b - self.a
        per = sum(self.times) / len(self.times)
        bar = "#" * (20 * done // total) + "-" * (20 - 20 * done // total)
        print(f"leg {self.leg} steps {self.a + 1}..{self.b}: [{bar}] step {s} matched in "
              f"{seconds:.1f} s; ETA {per * (self.b - s):.0f} s", file=self.aud.out, flush=True)

    def next_estimate(self) -> float:
        return sum(self.times) / len(self.times) if self.times else 0.0


def run_leg(aud: Auditor, claim) -> LegResult:
    """Replay the claimed leg to its outcome (module docstring); the claim is ended."""
    a, b = claim.steps
    res = LegResult(claim.leg, (a, b), "inconclusive")
    t0 = time.perf_counter()
    before = _fetched(aud)
    claim.start_heartbeat()
    try:
        _run(aud, claim, res)
    except Stop as e:
        res.outcome, res.detail = e.kind, {"why": e.why, "certified": res.certified}
    except KeyboardInterrupt:
        res.outcome, res.detail = "cancelled", {"why": "stopped by a signal",
                                                "certified": res.certified}
    except (Open1bError, OSError, ValueError) as e:    # this machine could not decide
        res.outcome, res.detail = "inconclusive", {"why": f"{type(e).__name__}: {e}",
                                                   "certified": res.certified}
    finally:
        res.seconds = time.perf_counter() - t0
        after = _fetched(aud)
        res.bytes_fetched = {k: after[k] - before.get(k, 0) for k in after}
    if res.outcome not in ("match", "mismatch"):
        claim.end(res.outcome, res.detail)       # a store that cannot be reached: join's
    return res


def _fetched(aud: Auditor) -> dict[str, int]:
    c = aud.cache
    out = dict(c.source.totals())
    out.pop("total", None)
    if c.mix_source is not None:
        out["mix"] = out.get("mix", 0) + c.mix_source.totals()["total"]
    out["data"] = aud.windows.bytes_total
    out["handoff"] = aud.store.stats.bytes_read
    out["total"] = sum(out.values())
    return out


def _start(aud: Auditor, claim, leg_dir: str, res: LegResult, offers_left: list):
    """(from_step, what it is, the hand-off offer it came from or None)."""
    a, b = claim.steps
    spills = [s for s in _spills(leg_dir, a, b) if s > a]
    if spills:
        res.resumed_from = spills[-1]
        return spills[-1], f"this auditor's own spilled state at step {spills[-1]}", None
    if a == 0:
        return 0, "the initial state re-derived from the seed", None
    if aud.plan.from_checkpoint(claim.leg):
        aud.cache.link_state(aud.cache.checkpoint(a), leg_dir, a)
        return a, f"the published checkpoint of step {a}", None
    from open1b_train import checkpoint

    mine = [o for o in offers_left if o.key == aud.key]       # its own first: no download
    offers_left[:] = mine + [o for o in offers_left if o.key != aud.key]
    while offers_left:
        offer = offers_left.pop(0)
        own = _own_state(aud, offer, a)
        if own is not None:
            aud.cache.link_state(own, leg_dir, a)
            return a, f"this auditor's own hand-off of step {a} (kept locally)", offer
        try:
            handoff.receive(aud.store, offer, checkpoint.step_dir(leg_dir, a))
        except handoff.HandoffRefused as e:
            handoff.refuse(aud.store, aud.plan, aud.key_path, aud.key, offer, str(e))
            claim.event("handoff-refused", {"handoff": offer.rel, "why": str(e)})
            continue
        return a, f"the hand-off of step {a} by key {key16(offer.key)}", offer
    raise Open1bAuditError(f"no valid hand-off of step {a} exists: the leg before must be "
                           f"audited again")


def _prune(aud: Auditor, leg: int) -> None:
    """Remove the cache's directories of this store's other legs, but the one before
    ``leg`` (its end state is this leg's start when this auditor handed it off)."""
    keep = {leg_name(aud.store.url, *aud.plan.legs[i]) for i in (leg - 1, leg) if i >= 0}
    root = os.path.join(aud.cache.root, "legs")
    prefix = leg_name(aud.store.url, 0, 0).split("-steps-")[0] + "-steps-"
    for name in os.listdir(root) if os.path.isdir(root) else []:
        if name.startswith(prefix) and name not in keep:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _own_state(aud: Auditor, offer, a: int) -> str | None:
    """The state this auditor handed off itself, still in its cache with the files its
    signed record lists (the replay checks it against the chain as any hand-off)."""
    if offer.key != aud.key:
        return None
    from open1b_train import checkpoint

    before = aud.plan.legs[aud.plan.leg_of(a)]
    d = checkpoint.step_dir(os.path.join(aud.cache.root, "legs",
                                         leg_name(aud.store.url, *before)), a)
    files = offer.detail.get("files") or {}
    try:
        if sorted(files) != sorted(n for n in os.listdir(d) if not n.startswith(".")):
            return None
        if any(handoff.sha256_of(os.path.join(d, n)) != (m or {}).get("sha256")
               for n, m in files.items()):
            return None
    except OSError:
        return None
    return d


def _run(aud: Auditor, claim, res: LegResult) -> None:
    from open1b_audit import certificate
    from open1b_audit.crowd.ledger import scan
    from open1b_audit.crowd.claim import Holders
    from open1b_audit.replay import machine, replay
    from open1b_train import checkpoint, recipe

    a, b = claim.steps
    rc, lines = aud.cache, aud.cache.lines
    _prune(aud, claim.leg)
    leg_dir = rc.leg_dir(leg_name(aud.store.url, a, b))
    rc.mirror_mix()
    offers_left = []
    if not aud.plan.from_checkpoint(claim.leg):
        views = scan(aud.store, aud.plan)
        offers_left = handoff.offers(aud.store, views, aud.plan, Holders(aud.store),
                                     claim.leg, time.time())
    released_end = b == aud.plan.steps and b in rc.published_steps()
    refetched = False
    while True:
        c, what, offer = _start(aud, claim, leg_dir, res, offers_left)
        res.start = what
        if released_end:                     # the released weights: compared when reached
            aud.cache.link_state(aud.cache.checkpoint(b), leg_dir, b)
        progress = _Progress(aud, claim.leg, a, b)
        protect = {c} | ({b} if released_end else set())
        keep = set(protect)
        holder: dict[str, Any] = {}

        def on_verified(run, state, s, line, c=c, keep=keep, holder=holder, progress=progress,
                        protect=protect):
            if "recipe" not in holder:
                holder["recipe"] = recipe.summary(run.cfg, run.plan.view.definition,
                                                  run.plan.fingerprint, run.plan.view.seed)
            cert = certificate.sign(certificate.build(
                lines, s, line, None, aud.name, aud.backend, machine(), c, holder["recipe"],
                released_end and s == b), aud.key_path)
            _put_cert(aud, s, cert)
            res.certified.append(s)
            _spill(leg_dir, run, state, s, keep)
            keep.clear()
            keep.update(protect | {s})          # the start, the released end, the newest two
            now = time.perf_counter()
            res.step_seconds[s] = round(now - holder["t"], 3)
            holder["t"] = now
            progress.step(s, res.step_seconds[s])
            if s == b:
                return
            if aud.stop_requested is not None and aud.stop_requested.is_set():
                raise Stop("cancelled", f"asked to stop after step {s}")
            est = progress.next_estimate()
            if aud.deadline is not None and time.time() + est > aud.deadline:
                raise Stop("timeout", f"step {s + 1} would end past --hours")
            if time.monotonic() - claim.started + est > aud.plan.lease_s:
                raise Stop("timeout", f"step {s + 1} would end past the lease "
                                      f"({aud.plan.lease_s:.0f} s)")

        if c == b and not all(aud.store.exists(cert_path(s, aud.key))
                              for s in range(a + 1, b + 1)):
            shutil.rmtree(checkpoint.step_dir(leg_dir, c), ignore_errors=True)
            res.resumed_from = None              # a certificate is missing: replay again
            continue
        holder["t"] = time.perf_counter()     # a leg's first step counts its setup too
        if c == b:
            rep = None                       # every step was replayed before a restart
        else:
            rep = replay(leg_dir, b, rc.replay_mix, aud.backend, None, c,
                         memory_plan=aud.memory_plan, windows=aud.windows,
                         on_verified=on_verified)
        f = None if rep is None else rep.finding
        if f is not None and f.step == c and f.component in START_COMPONENTS and c > 0:
            shutil.rmtree(checkpoint.step_dir(leg_dir, c), ignore_errors=True)
            if res.resumed_from == c:        # a spill that changed on disk: the one before
                res.resumed_from = None
                continue
            if offer is not None:            # a hand-off that is not the chain's state
                handoff.refuse(aud.store, aud.plan, aud.key_path, aud.key, offer, str(f))
                claim.event("handoff-refused", {"handoff": offer.rel, "why": str(f)})
                continue
        if (f is not None and f.step == b and released_end and f.component == "checkpoint"
                and not refetched):
            refetched = True                 # the cached copy may have changed on disk:
            shutil.rmtree(aud.cache.checkpoint(b), ignore_errors=True)     # fetch it again
            continue
        if f is not None:
            _mismatch(aud, claim, res, rep, leg_dir, c)
            return
        if rep is not None and not rep.ok:
            raise Open1bAuditError(f"the replay of steps {c + 1}..{b} stopped without a "
                                   f"finding at step {max(rep.verified or [c])}")
        break
    state_dir = checkpoint.step_dir(leg_dir, b)
    why = _state_ok(state_dir, lines, rc.config(), b)
    if why is not None:
        shutil.rmtree(state_dir, ignore_errors=True)
        raise Open1bAuditError(f"the spilled state after step {b} is not the log's ({why}); "
                               f"not handed off - this machine's disk changed it")
    detail: dict[str, Any] = {"steps": [a + 1, b], "start": res.start,
                              "certificates": {str(s): cert_path(s, aud.key)
                                               for s in range(a + 1, b + 1)},
                              "step_seconds": res.step_seconds}
    if aud.plan.needs_handoff(claim.leg):
        sent = handoff.send(aud.store, claim, state_dir, b, lines[b]["hash"])
        detail["handoff"] = {"prefix": sent["prefix"], "bytes": sent["bytes"]}
    res.outcome, res.detail = "match", detail
    res.certified = sorted(set(res.certified))
    claim.end("certified", detail)


def _put_cert(aud: Auditor, s: int, cert: dict) -> bool:
    """Upload a step's certificate once; False when one of this key was already there."""
    data = (json.dumps(cert, sort_keys=True, indent=1) + "\n").encode()
    try:
        return aud.store.create(cert_path(s, aud.key), data, "certificate")
    except Taken:                  # written before a restart: kept, never replaced
        return False


def _mismatch(aud: Auditor, claim, res: LegResult, rep, leg_dir: str, c: int) -> None:
    """A step differs: sign its mismatch certificate and upload the evidence."""
    from open1b_audit import certificate
    from open1b_audit.bisect import trace_step
    from open1b_audit.replay import machine

    f = rep.finding
    lines = aud.cache.lines
    s = f.step
    ev_dir = evidence_dir(s, aud.key)
    objects = {}
    if s >= 1:
        cert = certificate.sign(certificate.build(lines, s, rep.lines.get(s), f, aud.name,
                                                  aud.backend, machine(), c, rep.recipe,
                                                  False), aud.key_path)
        _put_cert(aud, s, cert)
        objects["certificate"] = cert_path(s, aud.key)
        aud.store.create(f"{ev_dir}/finding.json",
                         (json.dumps(f.to_dict(), sort_keys=True, indent=1) + "\n").encode(),
                         "evidence")
        objects["finding"] = f"{ev_dir}/finding.json"
        from open1b_train import checkpoint

        if s - 1 == c or s - 1 in checkpoint.list_steps(leg_dir):
            out = os.path.join(aud.cache.root, "evidence", f"trace-{s}.jsonl")
            os.makedirs(os.path.dirname(out), exist_ok=True)
            trace_step(leg_dir, s, out, mix=aud.cache.replay_mix, backend=aud.backend,
                       from_step=s - 1, windows=aud.windows)
            aud.store.upload_file(f"{ev_dir}/trace.jsonl", out, "evidence")
            objects["trace"] = f"{ev_dir}/trace.jsonl"
    res.outcome = "mismatch"
    res.detail = {"finding": f.to_dict(), "evidence": objects, "certified": res.certified}
    claim.end("mismatch", res.detail)
