"""Certificates: what an auditor states about one step of a run, optionally signed.

A certificate is a JSON object::

    {"format": "open1b-certificate", "version": 1,
     "run": {"genesis": <step-0 hash>, "run_hash": <hash of the last logged step>},
     "step": N, "verdict": "match" | "mismatch",
     "input_state":  {"step": N-1, "hash": ..., "params": ..., "optim": ...},
     "output_state": {"step": N, "hash": ..., "params": ..., "optim": ...},
     "components": {data, grad, params, optim, scalars}   (the replay's own digests),
     "finding": null | {"step", "component", "detail"},
     "auditor": "<name>", "backend": "cpu" | "triton", "machine": {...},
     "software": {"open1b": ..., "torch": ...}, "replayed_from": <checkpoint step>,
     "signature": null | {"algorithm": "ed25519", "public_key": <hex>, "value": <hex>}}

The signature is Ed25519 (``cryptography``) over the canonical JSON (sorted keys, no
spaces, ASCII) of the certificate with ``signature`` set to null; ``public_key`` is the raw
32-byte key in hex, which is also the auditor's identity for coverage. Keys are PEM files
(PKCS#8 private, SubjectPublicKeyInfo public) made by ``open1b-audit keygen``.
"""
from __future__ import annotations

import json
import os
from typing import Any

from open1b_audit import __version__
from open1b_audit.chain import Finding
from open1b_train import statehash
from open1b_train.errors import Open1bTrainError

FORMAT = "open1b-certificate"
VERSION = 1


class CertificateError(Open1bTrainError):
    """A certificate that is malformed or whose signature does not verify."""


def _state(line: dict[str, Any]) -> dict[str, Any]:
    comps = line.get("components") or line.get("genesis") or {}
    return {"step": line["step"], "hash": line["hash"], "params": comps.get("params"),
            "optim": comps.get("optim")}


def build(lines: list[dict[str, Any]], step: int, replayed: dict[str, Any] | None,
          finding: Finding | None, auditor: str, backend: str, machine: dict[str, Any],
          replayed_from: int) -> dict[str, Any]:
    """The certificate of ``step`` from the published ``lines`` and the replay's line."""
    import torch

    return {"format": FORMAT, "version": VERSION,
            "run": {"genesis": lines[0]["hash"], "run_hash": lines[-1]["hash"]},
            "step": step, "verdict": "match" if finding is None else "mismatch",
            "input_state": _state(lines[step - 1]), "output_state": _state(lines[step]),
            "components": None if replayed is None else replayed["components"],
            "finding": None if finding is None else finding.to_dict(),
            "auditor": auditor, "backend": backend, "machine": machine,
            "software": {"open1b": __version__, "torch": torch.__version__},
            "replayed_from": replayed_from, "signature": None}


def _message(cert: dict[str, Any]) -> bytes:
    return statehash.canonical({**cert, "signature": None})


def sign(cert: dict[str, Any], key_path: str) -> dict[str, Any]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise CertificateError(f"{key_path}: not a readable PEM private key ({e}); make one "
                               f"with `open1b-audit keygen`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CertificateError(f"{key_path}: not an Ed25519 key; make one with "
                               f"`open1b-audit keygen`")
    pub = key.public_key().public_bytes(serialization.Encoding.Raw,
                                        serialization.PublicFormat.Raw)
    return {**cert, "signature": {"algorithm": "ed25519", "public_key": pub.hex(),
                                  "value": key.sign(_message(cert)).hex()}}


def verify(cert: dict[str, Any]) -> str | None:
    """The signer's public key (hex) if the signature verifies, None if unsigned; raises
    ``CertificateError`` for a malformed certificate or a bad signature."""
    if not isinstance(cert, dict) or (cert.get("format"), cert.get("version")) != (FORMAT, VERSION):
        raise CertificateError(f"not a version-{VERSION} {FORMAT}")
    sig = cert.get("signature")
    if sig is None:
        return None
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(sig["public_key"]))
        key.verify(bytes.fromhex(sig["value"]), _message(cert))
    except (InvalidSignature, ValueError, KeyError, TypeError):
        raise CertificateError(f"the certificate of step {cert.get('step')} by "
                               f"{cert.get('auditor')!r} has a signature that does not verify "
                               f"(edited after signing, or not signed by that key)") from None
    return sig["public_key"]


def keygen(path: str) -> str:
    """Write a new Ed25519 private key (PEM, mode 0600) and its public key beside it
    (``<path>.pub``); returns the public key hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if os.path.exists(path):
        raise CertificateError(f"{path} exists; refusing to overwrite a key")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key()
    with open(path + ".pub", "wb") as f:
        f.write(pub.public_bytes(serialization.Encoding.PEM,
                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def write(cert: dict[str, Any], path: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(cert, f, sort_keys=True, indent=1)
    os.replace(tmp, path)


def read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CertificateError(f"{path}: not a readable certificate ({e})") from None
