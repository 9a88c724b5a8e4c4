"""Verified hand-offs: a leg's end state, passed to the auditor of the next leg, who
trusts nothing its sender says.

Sending (``send``): after every step of its leg matched, the auditor uploads its state after
the leg's last step b - the checkpoint its replay spilled, in the run's checkpoint format
(``params.safetensors``, ``optim-*.safetensors``, ``record.json`` with each file's sha256) -
to ``handoffs/step-<b>/<key>/``, then writes a signed ``handed-off`` event naming b, the
chain's hash of step b and every file's sha256 and size.

Receiving (``offers``, ``receive``): the next leg's auditor reads the ``handed-off`` events
of the leg before it (each signed by the holder of its claim, in a claim that certified
and that no one refused), downloads one hand-off's files and compares each with the sha256
the signed event lists - a corrupted or swapped file is refused by name. The state is then
loaded as any checkpoint (``run.checkpoint_state`` in the replay): its record must be the
chain's step b, its parameters and optimizer state the log's digests for step b. A hand-off
that is not is refused: ``refuse`` writes a signed ``handoff-refused`` event into the
sender's claim (which makes it ``void``: the leg it ended is claimed again), and the
receiver tries the next offer or, with none left, gives its own claim back
(``inconclusive``).

A refusal is an accusation; ``check_offer`` re-checks one without trusting the refuser (the
files against the signed event, the state against the log), which is how coverage decides
whether the sender's key lied (``report.py``).
"""
from __future__ import annotations

import hashlib
import os
import shutil

from open1b_audit.crowd import event as ev
from open1b_audit.crowd.ledger import handoff_dir, key16
from open1b_audit.crowd.source import confined
from open1b_audit.errors import Open1bAuditError


class HandoffRefused(Open1bAuditError):
    """A hand-off that is not the chain's state (or not the files its sender signed)."""


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(1 << 22):
            h.update(data)
    return h.hexdigest()


def send(store, claim, state_dir: str, step: int, step_hash: str) -> dict:
    """Upload the state in ``state_dir`` (a spilled checkpoint of ``step``) and write the
    signed ``handed-off`` event; the event's detail."""
    files, total = {}, 0
    prefix = handoff_dir(step, claim.key)
    names = sorted((n for n in os.listdir(state_dir) if not n.startswith(".")),
                   key=lambda n: (n == "record.json", n))
    for name in names:
        confined(name)
        path = os.path.join(state_dir, name)
        files[name] = {"sha256": sha256_of(path), "bytes": os.path.getsize(path)}
        store.upload_file(f"{prefix}/{name}", path, "handoff-file")
        total += files[name]["bytes"]
    detail = {"step": step, "step_hash": step_hash, "prefix": prefix, "files": files,
              "bytes": total}
    claim.event("handed-off", detail)
    return detail


class Offer:
    """A signed ``handed-off`` event of the leg before, and where it lies."""

    def __init__(self, rel: str, event: dict, claim_view) -> None:
        self.rel, self.event, self.claim = rel, event, claim_view
        self.key = event["key"]
        self.detail = event["detail"]

    @property
    def step(self) -> int:
        return self.detail.get("step")


def offers(store, views, plan, holders, leg: int, now: float) -> list[Offer]:
    """The hand-offs into ``leg``, oldest first (module docstring)."""
    from open1b.safeio import parse_json

    out = []
    a = plan.legs[leg][0]
    for cv in views[leg - 1].claims.values():
        if cv.status(plan, now) != "done":
            continue
        holder = holders.key(cv)
        for rel in cv.has("handed-off"):
            try:
                e = parse_json(store.read(rel), rel, ev.EventError)
                signer = ev.verify_event(e)
            except (ev.EventError, FileNotFoundError):
                continue
            d = e["detail"]
            if signer != holder or not isinstance(d.get("files"), dict) or d.get("step") != a:
                continue
            out.append(Offer(rel, e, cv))
    return sorted(out, key=lambda o: o.event.get("time", 0))


def receive(store, offer: Offer, dst: str) -> str:
    """Download ``offer``'s files into ``dst`` (a checkpoint directory), each compared with
    the sha256 its sender signed; ``HandoffRefused`` names the first that is not."""
    shutil.rmtree(dst, ignore_errors=True)
    tmp = f"{dst}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    files = offer.detail["files"]
    if "record.json" not in files or "params.safetensors" not in files:
        raise HandoffRefused(f"the hand-off of step {offer.step} by key {key16(offer.key)} lists "
                             f"no record.json and params.safetensors")
    prefix = offer.detail.get("prefix") or handoff_dir(offer.step, offer.key)
    if prefix != handoff_dir(offer.step, offer.key):
        raise HandoffRefused(f"the hand-off of step {offer.step} by key {key16(offer.key)} "
                             f"points at {prefix!r}, not its own place in the store")
    for name, meta in sorted(files.items()):
        confined(name)
        got = store.download(f"{prefix}/{name}", os.path.join(tmp, name))
        want = meta.get("sha256") if isinstance(meta, dict) else None
        if got != want:
            raise HandoffRefused(f"the hand-off of step {offer.step} by key {key16(offer.key)}: "
                                 f"{name} has sha256 {got[:16]}..., its signed record lists "
                                 f"{str(want)[:16]}... (corrupted or swapped in the store)")
    os.rename(tmp, dst)
    return dst


def refuse(store, plan, key_path: str, key: str, offer: Offer, why: str) -> str:
    """Write the signed refusal of ``offer`` into its sender's claim (module docstring)."""
    cv = offer.claim
    e = ev.sign(ev.build(plan.run_hash, cv.leg, cv.slot, cv.gen, 0, "handoff-refused", key,
                         {"step": offer.step, "handoff": offer.rel, "sender": offer.key,
                          "why": why}), key_path)
    rel = f"{cv.dir}/refused-{key16(key)}.json"
    from open1b_audit.crowd.store import Taken

    try:
        store.create(rel, ev.encode(e), "handoff-refused")
    except Taken:                         # this key refused it before
        pass
    return rel


def check_offer(store, offer: Offer, lines: list[dict], cfg, work: str) -> str | None:
    """Why ``offer`` is not the chain's state at its step (None: it is), checked from the
    store without trusting anyone's refusal: the files against the signed event, then the
    state against the log (``open1b_eval.verify``'s checkpoint check)."""
    from open1b_eval.verify import verify_model
    from open1b_train.published import PublishedRun

    d = os.path.join(work, f"handoff-{offer.step}-{key16(offer.key)}")
    try:
        receive(store, offer, d)
    except HandoffRefused as e:
        return str(e)
    try:
        if offer.detail.get("step_hash") != lines[offer.step]["hash"]:
            return (f"its signed record names step hash {str(offer.detail.get('step_hash'))[:16]}"
                    f"..., the chain's step {offer.step} is {lines[offer.step]['hash'][:16]}...")
        pub = PublishedRun(d, cfg, "", lines, None, {}, False)
        v = verify_model(d, pub)
        if not v.ok:
            return f"{v.difference['what']} {v.difference['name']}: {v.difference['detail']}"
        if v.step != offer.step:
            return f"it holds step {v.step}'s state, not step {offer.step}'s"
        return None
    finally:
        shutil.rmtree(d, ignore_errors=True)
