"""The crowd's ledger entries: signed, append-only events.

An event is a JSON object::

    {"format": "open1b-crowd-event", "version": 1, "run_hash": <the pinned run hash>,
     "leg": <index in the plan>, "slot": <0..redundancy-1>, "gen": <claim generation>,
     "seq": <the holder's event number in that claim>, "kind": <KINDS>,
     "key": <the signer's Ed25519 public key, hex>, "time": <the signer's clock, seconds>,
     "detail": {...kind-specific...},
     "signature": {"algorithm": "ed25519", "public_key": <hex>, "value": <hex>}}

signed exactly as certificates are (``certificate.sign``: Ed25519 over the canonical JSON
with ``signature`` null), with the same keys. Kinds: ``claimed`` (seq 0, the claim itself),
``renewed`` (the lease goes on), ``handed-off`` (the leg's end state uploaded: its files and
their sha256), ``handoff-refused`` (a hand-off that is not the chain's state, named),
``certified`` (every step of the leg matched; the certificates' objects), ``mismatch``
(a step differs; the finding and the evidence's objects), ``timeout``, ``cancelled``,
``inconclusive`` (the auditor could not decide: the reason). The last five end a claim.

``verify_event`` checks the shape and the signature and returns the signer; an event whose
``key`` is not its signer, or that is malformed, is an ``EventError`` - a reader lists it
and never acts on it.
"""
from __future__ import annotations

import json
import time
from typing import Any

from open1b.canonical import canonical_json
from open1b_audit.errors import Open1bAuditError

FORMAT = "open1b-crowd-event"
VERSION = 1
TERMINAL = ("certified", "mismatch", "timeout", "cancelled", "inconclusive")
KINDS = ("claimed", "renewed", "handed-off", "handoff-refused") + TERMINAL
RELEASING = ("timeout", "cancelled", "inconclusive")     # the slot is open again after these


class EventError(Open1bAuditError):
    """A ledger object that is not a well-formed event signed by the key it names."""


def build(run_hash: str, leg: int, slot: int, gen: int, seq: int, kind: str, key: str,
          detail: dict[str, Any] | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise EventError(f"{kind!r} is not an event kind ({', '.join(KINDS)})")
    # as JSON gives it back (integer keys become strings): the signed bytes are the read ones
    detail = json.loads(json.dumps(detail or {}))
    return {"format": FORMAT, "version": VERSION, "run_hash": run_hash, "leg": leg,
            "slot": slot, "gen": gen, "seq": seq, "kind": kind, "key": key,
            "time": round(time.time(), 3), "detail": detail, "signature": None}


def sign(event: dict[str, Any], key_path: str) -> dict[str, Any]:
    from open1b_audit import certificate

    out = certificate.sign(event, key_path)
    if out["signature"]["public_key"] != event["key"]:
        raise EventError(f"{key_path} is not the key the event names ({event['key'][:16]}...)")
    return out


def encode(event: dict[str, Any]) -> bytes:
    return canonical_json(event)


def _int(x: Any) -> bool:
    return type(x) is int and x >= 0


def verify_event(event: Any) -> str:
    """The signer of a well-formed, correctly signed event (see the module docstring)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(event, dict) or (event.get("format"), event.get("version")) != (
            FORMAT, VERSION):
        raise EventError(f"not a version-{VERSION} {FORMAT}")
    for k in ("leg", "slot", "gen", "seq"):
        if not _int(event.get(k)):
            raise EventError(f"not a valid {FORMAT}: {k} must be an integer >= 0")
    if (event.get("kind") not in KINDS or not isinstance(event.get("detail"), dict)
            or not isinstance(event.get("run_hash"), str) or not isinstance(event.get("key"), str)):
        raise EventError(f"not a valid {FORMAT}: kind, detail, run_hash or key is malformed")
    sig = event.get("signature")
    if (not isinstance(sig, dict) or sig.get("algorithm") != "ed25519"
            or sig.get("public_key") != event["key"]):
        raise EventError(f"the {event['kind']} event of leg {event['leg']} is not signed by "
                         f"the key it names")
    try:
        pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(sig["public_key"]))
        pub.verify(bytes.fromhex(sig["value"]), canonical_json({**event, "signature": None}))
    except (InvalidSignature, ValueError, TypeError, KeyError):
        raise EventError(f"the {event['kind']} event of leg {event['leg']} has a signature "
                         f"that does not verify (edited, or not signed by that key)") from None
    return event["key"]


def public_key(key_path: str) -> str:
    """The raw Ed25519 public key (hex) of a private key file ``keygen`` wrote."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise EventError(f"{key_path}: not a readable PEM private key ({e}); make one with "
                         f"`open1b-audit keygen`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise EventError(f"{key_path}: not an Ed25519 key; make one with `open1b-audit keygen`")
    return key.public_key().public_bytes(serialization.Encoding.Raw,
                                         serialization.PublicFormat.Raw).hex()
