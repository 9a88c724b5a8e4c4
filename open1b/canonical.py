"""Canonical JSON, written in one place: the bytes every hash of the project is taken over.

``canonical_json(obj)`` = ``json.dumps(obj, sort_keys=True, separators=(",", ":"),
ensure_ascii=True, allow_nan=False)`` as ASCII bytes: keys sorted, no spaces, non-ASCII
escaped, NaN and infinities refused (their spelling is not JSON and differs between
writers). The manifest fingerprint, the stream state, the step and run hashes, the run log
and the certificates' signed message all use it. ``readable_json`` is the deterministic,
indented form of files people read (sorted keys, indent 1, trailing newline).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def sha256_json(obj: Any) -> str:
    """SHA-256 (hex) of ``canonical_json(obj)``."""
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def readable_json(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()
