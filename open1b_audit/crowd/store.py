"""The crowd's shared place: a prefix of an object store (``s3://bucket/prefix``) or a local
directory, written only by creating objects that do not exist yet.

Contract:

* ``create(rel, data)`` writes an object once. It appears whole or not at all, and only if
  no object of that name exists: on S3 a PutObject with ``If-None-Match: *`` (s3fs's
  ``mode="create"``; the server answers 412 if the name is taken), locally a temporary
  file hard-linked to the name (``link`` fails if it exists). It returns True when this
  call created it, False when an object with the same bytes was already there (a retry
  whose first answer was lost, or another auditor writing the same bytes), and raises
  ``Taken`` when the name holds other bytes - the conditional write is how claims are won.
  Nothing is ever overwritten or deleted: the store is an append-only ledger.
* ``read(rel)`` the bytes (``FileNotFoundError`` when absent); ``listing(prefix)`` every
  object under a prefix with its size and modification time, from a fresh listing (no
  cache: other auditors write between two calls).
* A store that cannot be reached (refused connection, timeout, a 5xx answer) is retried
  with backoff for ``patience`` seconds, then the failure is a ``StoreError`` naming the
  URL. A server restarted mid-run costs a wait, never an object: a create retried after
  the restart either creates the object or finds its own bytes there.
* Endpoints and credentials come from the environment as s3fs/botocore read them
  (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID`` ...), never from a run's
  files. ``stats`` counts objects and bytes written and read (the measurements).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field

from open1b_audit.errors import Open1bAuditError

CHUNK = 1 << 22
TRANSIENT = frozenset({
    "EndpointConnectionError", "ConnectionClosedError", "ConnectTimeoutError",
    "ReadTimeoutError", "ClientConnectorError", "ClientConnectionError", "ClientOSError",
    "ServerDisconnectedError", "ServerTimeoutError", "ConnectionRefusedError",
    "ConnectionResetError", "BrokenPipeError", "TimeoutError", "IncompleteReadError",
    "ResponseStreamingError", "ProxyConnectionError"})


class StoreError(Open1bAuditError):
    """The store cannot be reached or refuses an operation."""


class Taken(StoreError):
    """A conditional create lost: the name holds another object."""


def _transient(e: BaseException) -> bool:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(c.__name__ in TRANSIENT for c in type(e).__mro__):
            return True
        text = str(e)
        if any(f" {code} " in f" {text} " or f"({code})" in text
               for code in ("500", "502", "503", "504", "InternalError", "SlowDown",
                            "ServiceUnavailable")):
            return True
        e = e.__cause__ or e.__context__
    return False


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            h.update(data)
    return h.hexdigest()


def _open_regular(path: str):
    """A local store's object for reading - a regular file only: a FIFO planted in a shared
    directory would block the reader forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError(f"{path}: not a regular file; refusing to read it")
    return os.fdopen(fd, "rb")


@dataclass(frozen=True)
class Entry:
    size: int
    mtime: float            # seconds since the epoch, the store's clock


@dataclass
class Stats:
    created: int = 0
    bytes_written: int = 0
    bytes_read: int = 0
    retries: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"objects_created": self.created, "bytes_written": self.bytes_written,
                "bytes_read": self.bytes_read, "retries": self.retries,
                "objects_by_kind": dict(sorted(self.by_kind.items()))}


class Store:
    """One store prefix (see the module docstring)."""

    def __init__(self, url: str, patience: float = 180.0) -> None:
        from open1b_data.storage import is_local, url_to_fs

        if url.startswith(("http://", "https://")):
            raise StoreError(f"{url}: an http(s) URL is read-only; the crowd's store must be "
                             f"writable (s3://bucket/prefix or a local directory)")
        self.url = url.rstrip("/")
        self.patience = patience
        self.stats = Stats()
        self.fs, self.root = url_to_fs(self.url)
        self.root = self.root.rstrip("/")
        self.local = is_local(self.fs)
        if self.local:
            os.makedirs(self.root, exist_ok=True)

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel.lstrip('/')}"

    def _retry(self, what: str, rel: str, fn):
        delay, deadline = 0.5, time.monotonic() + self.patience
        while True:
            try:
                return fn()
            except (FileNotFoundError, FileExistsError, Taken):
                raise
            except Exception as e:  # noqa: BLE001  (classified: transient or not)
                if not _transient(e) or time.monotonic() > deadline:
                    raise StoreError(f"{self.url}/{rel}: cannot {what} ({type(e).__name__}: "
                                     f"{' '.join(str(e).split())[:160]}); check the store's "
                                     f"endpoint (AWS_ENDPOINT_URL) and credentials") from None
                self.stats.retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    # ------------------------------------------------------------------ writing

    def create(self, rel: str, data: bytes, kind: str = "object") -> bool:
        """Create ``rel`` holding ``data`` unless it exists (module docstring)."""
        def once() -> bool:
            try:
                self._create_once(rel, data)
                return True
            except FileExistsError:
                return False
        made = self._retry("create", rel, once)
        if not made:
            have = self.read(rel)
            if have != data:
                raise Taken(f"{self.url}/{rel} exists with other content")
            return False
        self.stats.created += 1
        self.stats.bytes_written += len(data)
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        return True

    def _create_once(self, rel: str, data: bytes) -> None:
        path = self.path(rel)
        if not self.local:
            self.fs.pipe_file(path, data, mode="create")
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)          # atomic, and refuses an existing name
        finally:
            os.unlink(tmp)

    def upload_file(self, rel: str, local: str, kind: str = "object") -> bool:
        """``create`` from a local file, streamed (a hand-off's tensors: many GB at full
        size). An existing object of the same size and sha256 counts as this one."""
        path = self.path(rel)
        size = os.path.getsize(local)

        def once() -> bool:
            try:
                if self.local:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
                    os.close(fd)
                    try:
                        shutil.copyfile(local, tmp)
                        os.link(tmp, path)
                    finally:
                        os.unlink(tmp)
                else:
                    self.fs.put_file(local, path, mode="create")
                return True
            except FileExistsError:
                return False
        made = self._retry("create", rel, once)
        if not made:
            if self.sha256(rel) != _file_sha(local):
                raise Taken(f"{self.url}/{rel} exists with other content")
            return False
        self.stats.created += 1
        self.stats.bytes_written += size
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        return True

    def download(self, rel: str, dst: str) -> str:
        """Stream ``rel`` into the local file ``dst`` (atomically); its sha256."""
        path = self.path(rel)
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)

        def once() -> tuple[str, int]:
            h, n = hashlib.sha256(), 0
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(dst)))
            try:
                with os.fdopen(fd, "wb") as out:
                    src = _open_regular(path) if self.local else self.fs.open(path, "rb")
                    with src:
                        while data := src.read(CHUNK):
                            out.write(data)
                            h.update(data)
                            n += len(data)
                os.replace(tmp, dst)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            return h.hexdigest(), n
        digest, n = self._retry("read", rel, once)
        self.stats.bytes_read += n
        return digest

    def sha256(self, rel: str) -> str:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-sha-")
        os.close(fd)
        try:
            return self.download(rel, tmp)
        finally:
            os.unlink(tmp)

    # ------------------------------------------------------------------ reading

    def read(self, rel: str) -> bytes:
        path = self.path(rel)

        def once() -> bytes:
            if self.local:
                from open1b.safeio import read_regular

                if not os.path.lexists(path):
                    raise FileNotFoundError(path)
                return read_regular(path, "store object", StoreError)
            return self.fs.cat_file(path)
        data = self._retry("read", rel, once)
        self.stats.bytes_read += len(data)
        return data

    def exists(self, rel: str) -> bool:
        try:
            self.read(rel)
        except FileNotFoundError:
            return False
        return True

    def listing(self, prefix: str = "") -> dict[str, Entry]:
        """{path relative to the store: Entry} of every object under ``prefix``, fresh."""
        base = self.path(prefix).rstrip("/")

        def once() -> dict[str, Entry]:
            out: dict[str, Entry] = {}
            if self.local:
                if not os.path.isdir(base):
                    return out
                for d, _, names in os.walk(base):
                    for n in names:
                        if n.startswith(".tmp-"):
                            continue
                        p = os.path.join(d, n)
                        st = os.lstat(p)
                        rel = os.path.relpath(p, self.root).replace(os.sep, "/")
                        out[rel] = Entry(st.st_size, st.st_mtime)
                return out
            self.fs.invalidate_cache(base)
            cache = getattr(self.fs, "dircache", None)
            if cache is not None:
                for k in [k for k in list(cache) if k.startswith(base + "/") or k == base]:
                    cache.pop(k, None)
            try:
                found = self.fs.find(base, detail=True)
            except FileNotFoundError:
                return out
            for p, info in found.items():
                if info.get("type") == "directory" or not p.startswith(self.root + "/"):
                    continue
                lm = info.get("LastModified")
                out[p[len(self.root) + 1:]] = Entry(int(info.get("size") or 0),
                                                    lm.timestamp() if lm else 0.0)
            return out
        return self._retry("list", prefix, once)
