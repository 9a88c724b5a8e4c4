"""The build's output store: small atomic reads/writes under a directory or URL prefix.

Contract: ``write_bytes`` never leaves a partial file under its final name (it is
``storage.atomic_write_bytes``: temporary name + ``os.replace`` locally, one PUT on object
stores). ``exists``/``list_files`` drop fsspec's listing cache first, because another task
or process may have written since this process last listed. Paths are joined with ``/``;
local paths may be relative (to the current directory). Endpoint, credentials
and other object-store options come from fsspec's configuration, e.g. the environment
variables ``FSSPEC_S3_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL`` and ``AWS_ACCESS_KEY_ID``.
A failure names the URL and what to set (``storage_errors.failures``).
"""
from __future__ import annotations

import json
import os
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from open1b_data.storage import atomic_write_bytes, join
from open1b_data.storage_errors import failures

__all__ = ["join", "exists", "read_bytes", "read_json", "write_bytes", "write_json",
           "list_files", "sweep_temporaries"]


def _fs(url: str) -> tuple[Any, str]:
    return fsspec.core.url_to_fs(url)


def _forget(fs: Any, path: str) -> None:
    """Drop fsspec's cached listings of ``path``, its parents and everything below it.
    ``invalidate_cache`` alone keeps the listings below, and s3fs's ``find`` refills only
    missing ones: a subdirectory listed before another task wrote into it stayed stale,
    and a later read of the new file failed client-side ("does not exist": s3fs sizes a
    file from the cached listing of its directory before the GET)."""
    fs.invalidate_cache(path)
    cache = getattr(fs, "dircache", None)
    if cache is not None:
        below = path.rstrip("/") + "/"
        for key in [k for k in list(cache) if k.startswith(below)]:
            cache.pop(key, None)


def is_local(url: str) -> bool:
    return isinstance(_fs(url)[0], LocalFileSystem)


def exists(url: str) -> bool:
    with failures(url, "check"):
        fs, path = _fs(url)
        if not isinstance(fs, LocalFileSystem):
            # Another task or process may have written it since this process last listed.
            _forget(fs, path.rsplit("/", 1)[0])
        return fs.exists(path)


def read_bytes(url: str) -> bytes:
    with failures(url, "read"):
        fs, path = _fs(url)
        return fs.cat_file(path)


def read_json(url: str) -> Any:
    return json.loads(read_bytes(url))


def write_bytes(url: str, data: bytes) -> None:
    atomic_write_bytes(url, data)


def dumps(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, fixed separators, trailing newline)."""
    return (json.dumps(obj, sort_keys=True, indent=1, ensure_ascii=True) + "\n").encode()


def write_json(url: str, obj: Any) -> None:
    write_bytes(url, dumps(obj))


def list_files(url: str) -> list[str]:
    """Every file under ``url`` (recursive), as paths relative to it, sorted."""
    with failures(url, "list"):
        fs, path = _fs(url)
        if not isinstance(fs, LocalFileSystem):
            _forget(fs, path)
        if not fs.exists(path):
            return []
        root = path.rstrip("/") + "/"
        return sorted(p[len(root):] for p in fs.find(path) if p.startswith(root))


def sweep_temporaries(url: str) -> int:
    """Delete temporary files a killed writer left under a LOCAL output directory (names
    ``.tmp-*``, the atomic writers' prefix). Only safe when no other process writes there,
    so build-mix calls it for whole builds, never for ``--task`` runs."""
    fs, path = _fs(url)
    if not isinstance(fs, LocalFileSystem) or not os.path.isdir(path):
        return 0
    n = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            if name.startswith(".tmp-") or ".tmp-" in name:
                os.unlink(os.path.join(dirpath, name))
                n += 1
    return n
