"""Coverage of the crowd: what the store's certificates and ledger establish.

``crowd_report(store, cache, ...)`` reads everything the crowd wrote and trusts none of it:

* every certificate under ``certs/`` is checked by ``coverage.coverage`` exactly as local
  certificate folders are (signature, the run's log, the announced recipe, distinct and
  trusted keys); one stored under another key's name or another step's is a conflict;
* every ledger object is read and its signature checked (``event.verify_event``); an event
  in a claim that its holder did not sign is listed (``forged_events``) and never used;
* a key is *distrusted* - none of its certificates counts - when it signed something the
  chain refutes: a ``match`` certificate whose state hashes or component digests are not the
  log's, or a hand-off that is not the chain's state. A refusal is only an accusation: each
  is re-checked from the store (``handoff.check_offer``: the files against the signed
  record, the state against the log); a refusal that does not hold up is listed and the
  accused key keeps its standing;
* per leg, from the ledger: covered (``redundancy`` certified claims by distinct keys),
  claims in flight, expired claims (an auditor that vanished), disputes (``mismatch``
  events, with the evidence's objects) and refused hand-offs.

The report is ``coverage``'s report of the counted certificates plus a ``crowd`` section.
"""
from __future__ import annotations

import os
import re
import time
from typing import Any

from open1b_audit.crowd import event as ev
from open1b_audit.crowd.ledger import HOLDER_NAME, key16, scan

CERT = re.compile(r"^certs/step-(\d{8})/([0-9a-f]{16})\.json$")
CONTRADICTS = ("it certifies other state hashes than the run's log",
               "its component digests differ from the run's log for the step")


def store_certificates(store) -> list[tuple[str, Any, str | None]]:
    """(name, certificate or the error that makes it unreadable, why it is misplaced) of
    every stored one."""
    from open1b_audit.errors import CertificateError
    from open1b.safeio import parse_json

    out: list[tuple[str, Any, str | None]] = []
    for rel in sorted(store.listing("certs")):
        m = CERT.match(rel)
        name = f"{store.url}/{rel}"
        if m is None:
            out.append((name, CertificateError(f"{rel}: not a certificate's place in the "
                                               f"store (certs/step-N/<key>.json)"), None))
            continue
        try:
            cert = parse_json(store.read(rel), name, CertificateError)
        except CertificateError as e:
            out.append((name, e, None))
            continue
        sig = cert.get("signature") if isinstance(cert, dict) else None
        signer = sig.get("public_key") if isinstance(sig, dict) else None
        why = None
        if isinstance(signer, str) and (cert.get("step") != int(m[1]) or key16(signer) != m[2]):
            why = (f"stored as step {int(m[1])} of key {m[2]}, but it is step "
                   f"{cert.get('step')!r} signed by {signer[:16]}")
        out.append((name, cert, why))
    return out


def ledger_events(store, plan) -> tuple[dict, list[dict]]:
    """{object: (event, signer)} of every valid ledger object, and the invalid ones."""
    from open1b.safeio import parse_json

    good, bad = {}, []
    for rel in sorted(store.listing("ledger")):
        if HOLDER_NAME.match(rel.rsplit("/", 1)[-1]):
            continue                               # an empty marker (ledger.py)
        try:
            e = parse_json(store.read(rel), rel, ev.EventError)
            signer = ev.verify_event(e)
            if e["run_hash"] != plan.run_hash:
                raise ev.EventError(f"it is about run {str(e['run_hash'])[:16]}..., not this one")
            good[rel] = (e, signer)
        except (ev.EventError, FileNotFoundError) as err:
            bad.append({"object": rel, "why": str(err)})
    return good, bad


def crowd_report(store, cache, redundancy: int, trusted: set[str] | None, announce,
                 run_recipe: str | None, work: str) -> dict[str, Any]:
    """The report (module docstring)."""
    from open1b_audit.coverage import coverage
    from open1b_audit.crowd import claim as cl
    from open1b_audit.crowd import handoff
    from open1b_audit.crowd.plan import NAME, parse

    lines = cache.lines
    plan = parse(store.read(NAME), f"{store.url}/{NAME}")
    placed = store_certificates(store)
    first = coverage(lines, [(n, c) for n, c, w in placed if w is None], redundancy, trusted,
                     announce, run_recipe)
    distrusted: dict[str, list[str]] = {}
    for c in first["conflicts"]:
        who = c.get("auditor") or ""
        if c["why"] in CONTRADICTS and not who.startswith("unsigned:"):
            distrusted.setdefault(who, []).append(f"signed a match certificate of step "
                                                  f"{c['step']} that {c['why'][3:]}")
    events, forged = ledger_events(store, plan)
    views, now = scan(store, plan), time.time()
    holders = cl.Holders(store)
    refusals = []
    for lv in views.values():
        for cv in lv.claims.values():
            holder = holders.key(cv)
            if cv.named is not None and (holder or "")[:16] != cv.named:
                forged.append({"object": f"{cv.dir}/by-{cv.named}",
                               "why": "the marker names another key than the claim's holder"})
            for rel in [r for _, _, _, r in cv.events] + cv.refusals:
                own = rel in events and events[rel][0]["kind"] != "handoff-refused"
                if own and events[rel][1] != holder:
                    forged.append({"object": rel, "why": "not signed by the claim's holder"})
            for rel in cv.refusals:
                if rel not in events:
                    continue
                e, refuser = events[rel]
                for o in _handed_off(events, cv, holder)[:1]:
                    why = handoff.check_offer(store, o, lines, cache.config(), work)
                    refusals.append({"leg": cv.leg, "step": o.step, "sender": o.key,
                                     "refuser": refuser, "object": rel,
                                     "confirmed": why is not None,
                                     "why": why or e["detail"].get("why")})
                    if why is not None and "corrupted or swapped in the store" not in why:
                        distrusted.setdefault(o.key, []).append(
                            f"signed a hand-off of step {o.step} that is not the chain's state "
                            f"({why})")
    keep = []
    dropped = []
    conflicting = {c["certificate"] for c in first["conflicts"]}
    for name, cert, why in placed:
        sig = cert.get("signature") if isinstance(cert, dict) else None
        signer = sig.get("public_key") if isinstance(sig, dict) else None
        if signer in distrusted and name not in conflicting:
            dropped.append({"certificate": name, "step": cert.get("step"), "key": signer})
            continue
        keep.append((name, cert))
    rep = coverage(lines, keep, redundancy, trusted, announce, run_recipe)
    for name, cert, why in placed:
        if why is not None:
            rep["conflicts"].append({"certificate": name, "step": cert.get("step"), "why": why})
    legs = []
    for i, lv in views.items():
        slots = []
        for (slot, gen), cv in sorted(lv.claims.items()):
            slots.append({"slot": slot, "gen": gen, "key": holders.key(cv),
                          "status": cv.status(plan, now), "final": cv.final})
        a, b = plan.legs[i]
        keys = {s["key"] for s in slots if s["status"] == "done" and s["key"] not in distrusted}
        legs.append({"leg": i, "steps": [a + 1, b], "claims": slots,
                     "certified_by": len(keys), "covered": len(keys) >= plan.redundancy})
    disputes = [{"leg": e["leg"], "key": e["key"], "finding": e["detail"].get("finding"),
                 "evidence": e["detail"].get("evidence"), "object": rel}
                for rel, (e, _) in events.items() if e["kind"] == "mismatch"]
    rep["crowd"] = {
        "store": store.url, "plan": plan.to_dict(), "legs": legs,
        "legs_covered": sum(x["covered"] for x in legs),
        "in_flight": [dict(leg=x["leg"], **s) for x in legs for s in x["claims"]
                      if s["status"] == "live"],
        "expired": [dict(leg=x["leg"], **s) for x in legs for s in x["claims"]
                    if s["status"] == "expired"],
        "disputes": disputes, "refusals": refusals,
        "distrusted": {k: v for k, v in distrusted.items()}, "not_counted": dropped,
        "forged_events": forged, "objects": len(events) + len(forged) + len(placed)}
    return rep


def _handed_off(events: dict, cv, holder: str | None) -> list:
    """The hand-offs a claim's holder signed (``handoff.offers`` lists only those of claims
    no one refused)."""
    from open1b_audit.crowd.handoff import Offer

    out = []
    for _, kind, _, rel in sorted(cv.events):
        if kind == "handed-off" and rel in events and events[rel][1] == holder:
            out.append(Offer(rel, events[rel][0], cv))
    return out


def write_certificates(store, folder: str, skip: set[str] = frozenset()) -> list[str]:
    """Copy the store's certificates into ``folder`` (for the commands that read certificate
    folders: ``site``); names as ``step-N-<key>.json``."""
    os.makedirs(folder, exist_ok=True)
    out = []
    for rel in sorted(store.listing("certs")):
        m = CERT.match(rel)
        if m is None or rel in skip:
            continue
        p = os.path.join(folder, f"step-{m[1]}-{m[2]}.json")
        with open(p, "wb") as f:
            f.write(store.read(rel))
        out.append(p)
    return out
