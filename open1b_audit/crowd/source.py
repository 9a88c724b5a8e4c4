"""A published run where it lies: ``s3://bucket/run``, ``http(s)://host/run`` (read-only) or a
local directory, read file by file and counted.

``RunSource(url)`` reads what a step needs and nothing else - the log, the config, one
checkpoint's files, the mix's metadata - and counts every byte and request by what it was
for (``counts``: log, config, mix, checkpoint, handoff, data). Large files are streamed to
a local path with their SHA-256 taken over the bytes as they arrive (``download``), so a
checkpoint of many GB is never whole in memory and is hashed once.

Nothing read here is trusted: ``cache.py`` checks every file against the chain before
anything uses it. Paths inside the run are fixed names or checkpoint file names the run's
own record lists, each confined (a plain ``*.safetensors`` / ``record.json`` name). The
endpoint and credentials of s3:// come from the environment as s3fs and botocore read them
(``AWS_ENDPOINT_URL``, ``AWS_PROFILE``...), never from the run's files; an http(s) run is
read with plain GETs.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections import Counter

from open1b_audit.errors import Open1bAuditError

CHUNK = 1 << 22
STEP_DIR = re.compile(r"^step-(\d{8})$")
FILE_NAME = re.compile(r"^(record\.json|params\.safetensors|optim-\d{5}-of-\d{5}\.safetensors)$")


class SourceError(Open1bAuditError):
    """A run URL that cannot be read as a published run."""


def is_url(run: str) -> bool:
    """A run given as a URL (``s3://``, ``http(s)://``, ``file://``), not a local path."""
    return "://" in str(run)


def confined(name: str) -> str:
    """A checkpoint file name as the run's record may list it; anything else is refused."""
    if not isinstance(name, str) or not FILE_NAME.match(name):
        raise SourceError(f"{name!r} is not a checkpoint file name (record.json, "
                          f"params.safetensors, optim-NNNNN-of-NNNNN.safetensors); refusing "
                          f"to fetch it")
    return name


PATIENCE = 180.0          # seconds a store that cannot be reached is retried


def patiently(what: str, fn, patience: float = PATIENCE):
    """``fn()``, retried with backoff while the store cannot be reached (a ``StorageError``
    that is not a missing or refused file: no network, a server restarting); after
    ``patience`` seconds a ``SourceError``. A missing file is the run's and passes through;
    an unreachable store is no one's finding: the caller's leg ends inconclusive."""
    import time

    from open1b_data.errors import FileAccessError, StorageError

    delay, deadline = 0.5, time.monotonic() + patience
    while True:
        try:
            return fn()
        except StorageError as e:
            if isinstance(e, FileAccessError):
                raise
            if time.monotonic() > deadline:
                raise SourceError(f"{what}: the store cannot be reached ({e})") from None
            time.sleep(delay)
            delay = min(2 * delay, 10.0)


class RunSource:
    """Read access to one published run (see the module docstring)."""

    def __init__(self, url: str) -> None:
        from open1b_data.storage import url_to_fs

        self.url = url.rstrip("/")
        self.fs, self.root = url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.bytes: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0].lower() if "://" in self.url else "file"

    def join(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _path(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def read(self, rel: str, what: str) -> bytes:
        """The whole file ``rel`` of the run (``FileNotFoundError`` if absent)."""
        from open1b_data.storage_errors import failures

        def once() -> bytes:
            if self.scheme == "file":
                with self._open(rel) as f:
                    return f.read()
            with failures(self.join(rel), "read"):
                return self.fs.cat_file(self._path(rel))
        data = patiently(self.join(rel), once)
        self.count(what, len(data))
        return data

    def download(self, rel: str, dst: str, what: str) -> str:
        """Stream ``rel`` to the local file ``dst`` (written atomically); its sha256."""
        return patiently(self.join(rel), lambda: self._download(rel, dst, what))

    def _download(self, rel: str, dst: str, what: str) -> str:
        from open1b_data.storage_errors import failures

        h = hashlib.sha256()
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(dst))
        n = 0
        try:
            with os.fdopen(fd, "wb") as out, failures(self.join(rel), "read"):
                with self._open(rel) as f:
                    while data := f.read(CHUNK):
                        out.write(data)
                        h.update(data)
                        n += len(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.count(what, n)
        return h.hexdigest()

    def _open(self, rel: str):
        """``rel`` for reading; on a local run a regular file only (a FIFO in its place
        would block this process forever: refused, as ``safeio`` refuses one)."""
        if self.scheme != "file":
            return self.fs.open(self._path(rel), "rb")
        from open1b import safeio

        path = self._path(rel)
        safeio.refuse_linked_dirs(self.root, path, "run file", SourceError)
        try:
            fd = safeio.os_open(path, "run file", SourceError)
        except (SourceError, FileNotFoundError):       # refused, or absent: the caller's
            raise
        except OSError as e:
            raise SourceError(f"{path}: cannot open the run file ({e.strerror})") from None
        return os.fdopen(safeio.regular_fd(fd, path, "run file", SourceError), "rb")

    def count(self, what: str, nbytes: int, requests: int = 1) -> None:
        self.bytes[what] += nbytes
        self.requests[what] += requests

    def checkpoint_steps(self, candidates: list[int]) -> list[int]:
        """The steps with a published checkpoint (``checkpoints/step-N/record.json``): from
        one listing of ``checkpoints/`` on an object store or a local directory; over
        http(s), which need not list directories, by asking for each of ``candidates``."""
        from open1b_data.storage_errors import failures

        if self.scheme in ("http", "https"):
            return [s for s in candidates if self._has_record(s)]
        base = self._path("checkpoints")
        with failures(self.join("checkpoints"), "list"):
            self.fs.invalidate_cache(base)
            try:
                found = self.fs.find(base)
            except FileNotFoundError:
                found = []
        self.requests["listing"] += 1
        steps = []
        for p in found:
            parts = p.rstrip("/").rsplit("/", 2)
            if len(parts) == 3 and parts[2] == "record.json" and (m := STEP_DIR.match(parts[1])):
                steps.append(int(m[1]))
        return sorted(steps)

    def _has_record(self, step: int) -> bool:
        self.requests["listing"] += 1
        try:
            self.fs.info(self._path(f"checkpoints/step-{step:08d}/record.json"))
        except FileNotFoundError:
            return False
        return True

    def totals(self) -> dict:
        out = {k: int(v) for k, v in sorted(self.bytes.items())}
        out["total"] = sum(self.bytes.values())
        return out
