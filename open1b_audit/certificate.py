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
     "recipe": {"preset", "mix_fingerprint", "schedule", "departures": [...]},
     "published_checkpoint_compared": bool,
     "signature": null | {"algorithm": "ed25519", "public_key": <hex>, "value": <hex>}}

``coverage`` counts a certificate only when its signed ``recipe`` is the announced one with
no departure (``open1b_train.recipe.on_recipe``).

The signature is Ed25519 (``cryptography``) over the canonical JSON (sorted keys, no
spaces, ASCII) of the certificate with ``signature`` set to null; ``public_key`` is the raw
32-byte key in hex, which is also the auditor's identity for coverage. Keys are PEM files
(PKCS#8 private, SubjectPublicKeyInfo public) made by ``open1b-audit keygen``.

A certificate is read as data from a regular file (``safeio``) and its shape checked
(``check_shape``) before any field is used: anyone can write one, so a wrong type, a
missing field or JSON nested too deeply is a ``CertificateError`` naming it. A trusted-keys
file (``read_trusted_keys``) lists the public keys whose certificates count: one key per
line as 64 hex digits (the raw key, as ``keygen`` prints it), and/or PEM public key blocks
(``KEY.pub`` as ``keygen`` writes it); blank lines and lines starting with ``#`` are
ignored.
"""
from __future__ import annotations

import json
import os
from typing import Any

from open1b_audit import __version__
from open1b_train.chain import Finding
from open1b_train import statehash
from open1b_audit.errors import CertificateError
from open1b.safeio import read_json_object, read_regular, write_atomic

FORMAT = "open1b-certificate"
VERSION = 1



def _state(line: dict[str, Any]) -> dict[str, Any]:
    comps = line.get("components") or line.get("genesis") or {}
    return {"step": line["step"], "hash": line["hash"], "params": comps.get("params"),
            "optim": comps.get("optim")}


def build(lines: list[dict[str, Any]], step: int, replayed: dict[str, Any] | None,
          finding: Finding | None, auditor: str, backend: str, machine: dict[str, Any],
          replayed_from: int, recipe: dict[str, Any] | None = None,
          checkpoint_compared: bool = False) -> dict[str, Any]:
    """The certificate of ``step`` from the published ``lines`` and the replay's line;
    ``recipe``: the replay's (``open1b_train.recipe.summary``: preset, mix fingerprint,
    departures); ``checkpoint_compared``: the published checkpoint of ``step`` was compared
    with the replayed state."""
    import torch

    return {"format": FORMAT, "version": VERSION,
            "run": {"genesis": lines[0]["hash"], "run_hash": lines[-1]["hash"]},
            "step": step, "verdict": "match" if finding is None else "mismatch",
            "input_state": _state(lines[step - 1]), "output_state": _state(lines[step]),
            "components": None if replayed is None else replayed["components"],
            "finding": None if finding is None else finding.to_dict(),
            "auditor": auditor, "backend": backend, "machine": machine,
            "software": {"open1b": __version__, "torch": torch.__version__},
            "replayed_from": replayed_from, "recipe": recipe,
            "published_checkpoint_compared": checkpoint_compared, "signature": None}


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


def _is_hex(x: Any, nbytes: int | None = None) -> bool:
    if not isinstance(x, str) or (nbytes is not None and len(x) != 2 * nbytes):
        return False
    try:
        bytes.fromhex(x)
    except ValueError:
        return False
    return True


def check_shape(cert: Any) -> None:
    """Raise ``CertificateError`` naming the first field of ``cert`` that is missing or of
    the wrong type (see the module docstring for the format)."""
    def bad(field: str, want: str) -> CertificateError:
        return CertificateError(f"not a valid {FORMAT}: {field} must be {want}")

    if not isinstance(cert, dict) or (cert.get("format"), cert.get("version")) != (FORMAT, VERSION):
        raise CertificateError(f"not a version-{VERSION} {FORMAT}")
    if type(cert.get("step")) is not int:
        raise bad("step", "an integer")
    if cert.get("verdict") not in ("match", "mismatch"):
        raise bad("verdict", '"match" or "mismatch"')
    run = cert.get("run")
    if not isinstance(run, dict) or not all(isinstance(run.get(k), str)
                                            for k in ("genesis", "run_hash")):
        raise bad("run", "an object with genesis and run_hash strings")
    for k in ("input_state", "output_state"):
        st = cert.get(k)
        if not isinstance(st, dict) or not isinstance(st.get("hash"), str):
            raise bad(k, "an object with a hash string")
    comps = cert.get("components")
    if comps is not None and (not isinstance(comps, dict) or
                              not all(isinstance(v, str) for v in comps.values())):
        raise bad("components", "null or an object of digest strings")
    if not isinstance(cert.get("auditor", ""), str):
        raise bad("auditor", "a string")
    sig = cert.get("signature")
    if sig is not None and (not isinstance(sig, dict) or sig.get("algorithm") != "ed25519"
                            or not _is_hex(sig.get("public_key"), 32)
                            or not _is_hex(sig.get("value"), 64)):
        raise bad("signature", 'null or {"algorithm": "ed25519", "public_key": 64 hex '
                               'digits, "value": 128 hex digits}')


def verify(cert: dict[str, Any]) -> str | None:
    """The signer's public key (hex) if the signature verifies, None if unsigned; raises
    ``CertificateError`` for a malformed certificate or a bad signature."""
    check_shape(cert)
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
    return sig["public_key"].lower()


def keygen(path: str) -> str:
    """Write a new Ed25519 private key (PEM, mode 0600) and its public key beside it
    (``<path>.pub``); returns the public key hex."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if os.path.exists(path):
        raise CertificateError(f"{path} exists; refusing to overwrite a key")
    os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key()
    write_atomic(path + ".pub", pub.public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def git_work_tree(path: str) -> str | None:
    """The git work tree ``path`` lies in (a private key there is one ``git add -A`` away
    from being published), or None."""
    d = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.exists(os.path.join(d, ".git")):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def write(cert: dict[str, Any], path: str) -> None:
    """Write ``cert`` to ``path`` through a temporary file created exclusively in its
    folder (``safeio.write_atomic``): a shared folder may hold names others planted - a
    ``step-N.json.tmp-<pid>`` link to a file of yours - and none is ever opened."""
    write_atomic(path, json.dumps(cert, sort_keys=True, indent=1).encode())


def _signer(cert: dict[str, Any]) -> str | None:
    sig = cert.get("signature")
    return sig.get("public_key") if isinstance(sig, dict) else None


def path_for(folder: str, step: int, cert: dict[str, Any]) -> str:
    """Where ``cert`` for ``step`` goes in ``folder``: ``step-<N>.json``, unless that file
    holds another signer's certificate - then ``step-<N>-<key prefix>.json``, so auditors
    sharing a folder never overwrite each other (coverage reads every ``*.json``)."""
    base = os.path.join(folder, f"step-{step:08d}.json")
    if not os.path.lexists(base):     # a link there (even dangling) is someone's: kept
        return base
    try:
        theirs = _signer(read(base))
    except CertificateError:          # unreadable: keep it for coverage to report
        theirs = ""
    mine = _signer(cert)
    if theirs == mine:
        return base
    return os.path.join(folder, f"step-{step:08d}-{(mine or 'unsigned')[:16]}.json")


def read(path: str) -> dict[str, Any]:
    """A certificate file: a regular file holding one JSON object (shape not checked here:
    ``verify`` does)."""
    return read_json_object(path, "certificate", CertificateError)


def read_trusted_keys(path: str) -> set[str]:
    """The raw Ed25519 public keys (hex) a trusted-keys file lists (module docstring)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        text = read_regular(path, "trusted-keys file", CertificateError).decode("ascii")
    except UnicodeDecodeError:
        raise CertificateError(f"{path}: a trusted-keys file is ASCII text (64-hex keys or "
                               f"PEM public keys)") from None
    keys: set[str] = set()
    pem: list[str] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if pem is not None:
            pem.append(line)
            if line.startswith("-----END"):
                try:
                    key = serialization.load_pem_public_key("\n".join(pem).encode())
                except (ValueError, TypeError) as e:
                    raise CertificateError(f"{path}: the PEM block ending on line {n} is not a "
                                           f"public key ({e})") from None
                if not isinstance(key, Ed25519PublicKey):
                    raise CertificateError(f"{path}: the PEM block ending on line {n} is not "
                                           f"an Ed25519 public key")
                keys.add(key.public_bytes(serialization.Encoding.Raw,
                                          serialization.PublicFormat.Raw).hex())
                pem = None
        elif not line or line.startswith("#"):
            continue
        elif line.startswith("-----BEGIN"):
            pem = [line]
        elif _is_hex(line, 32):
            keys.add(line.lower())
        else:
            raise CertificateError(f"{path}: line {n} is neither a 64-hex Ed25519 public key "
                                   f"nor part of a PEM public key: {line[:40]!r}")
    if pem is not None:
        raise CertificateError(f"{path}: a PEM block is not closed (no -----END line)")
    if not keys:
        raise CertificateError(f"{path}: lists no public key")
    return keys
