"""Storage: every byte the data pipeline reads or writes goes through these fsspec helpers,
so a local path and an object-store URL (``s3://bucket/key``, ``hf://...``) behave alike.

Contracts:
- ``open_stream(url)`` yields decompressed bytes chunks. Compression is chosen from the
  name: ``.zst`` *and* ``.zstd`` (DCLM's suffix, which fsspec does not infer) are zstd,
  ``.gz`` is gzip, anything else is read as is. A zstd stream that ends inside a frame
  raises ``TruncatedInputError`` *after* every complete chunk before the cut was yielded
  (zstandard's own ``stream_reader`` ends silently on truncation, so we drive the
  decompressor ourselves). Corrupt compressed data raises ``CorruptInputError``.
- ``iter_lines(url)`` splits that stream on ``b"\\n"`` in bounded memory (one line at a
  time); a partial last line of a truncated stream is never yielded.
- ``exists`` and ``list_tree`` never answer from a stale listing: on object stores they drop
  fsspec's cached listings first (several build tasks write one output).
- ``list_files(root, patterns)`` is sorted by '/'-separated relative path and carries each
  file's size and checksum: ``sha256`` hex of the bytes for local files (and for object
  stores that publish it, e.g. HF LFS files), ``"etag:<ETag>"`` for object stores that
  publish an ETag (cheaper than downloading the object to hash it).
- Writes are atomic: local files are written to a temporary name in the same directory and
  ``os.replace``d; object-store objects are uploaded with one PUT, which stores the object
  whole or not at all (no half-written object is ever listed).
- Failures name the URL: every helper here runs its backend calls under
  ``storage_errors.failures``, so no credentials, no network, a missing file or a denied
  write arrive as the package's own errors (``StorageError``, ``FileMissingError`` - still a
  ``FileNotFoundError`` - and ``FileAccessError`` - still an ``OSError``), never as a
  botocore or aiohttp exception.
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import os
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import fsspec
import zstandard

from open1b.canonical import readable_json
from open1b_data.errors import FileAccessError, Open1bDataError
from open1b_data.storage_errors import failures

CHUNK = 1 << 20  # bytes per read: large enough for object-store throughput
FEED = 1 << 16   # compressed bytes per decompressor call (see _slices)


class TruncatedInputError(Open1bDataError):
    """A compressed stream ends inside a frame (e.g. an interrupted upload)."""


class CorruptInputError(Open1bDataError):
    """Compressed data that cannot be decoded (not a cut: bad bytes)."""


def url_to_fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and in-filesystem path of a local path or URL."""
    return fsspec.core.url_to_fs(url)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def join(root: str, rel: str) -> str:
    """``root`` + '/'-separated ``rel``; works for local paths and URLs alike."""
    return root.rstrip("/") + "/" + rel.lstrip("/")


def compression_of(url: str) -> str | None:
    name = url.rsplit("/", 1)[-1].lower()
    if name.endswith((".zst", ".zstd")):
        return "zstd"
    if name.endswith(".gz"):
        return "gzip"
    return None


# ---------------------------------------------------------------------------------------
# Reading

def _slices(raw: IO[bytes], chunk: int) -> Iterator[bytes]:
    """Compressed input in ``FEED``-byte slices of ``chunk``-byte reads: the decompressors
    return all output of what they are fed, so feeding little keeps each output chunk
    small (a slice of real text inflates ~5x; memory stays bounded on every input that
    is not a deliberate decompression bomb)."""
    while data := raw.read(chunk):
        for i in range(0, len(data), FEED):
            yield data[i:i + FEED]


# codec -> (new decompressor, its error type, what one self-contained unit is called, whether
# an empty file is a truncated stream). Both decompressors share the zlib-style API
# (decompress / eof / unused_data).
_CODECS = {
    "zstd": (lambda: zstandard.ZstdDecompressor().decompressobj(), zstandard.ZstdError,
             "frame", True),
    "gzip": (lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), zlib.error, "member", False),
}


def _decompressed(raw: IO[bytes], chunk: int, codec: str) -> Iterator[bytes]:
    """Decompressed chunks of ``raw``. Frames (zstd) or members (gzip) back to back are one
    stream, as ``zstd -d`` and ``gunzip`` read them; bytes that are not the codec's raise
    ``CorruptInputError``, a stream that stops inside a unit ``TruncatedInputError``."""
    new, error, unit, empty_is_truncated = _CODECS[codec]
    obj = new()
    in_unit = False  # fed bytes of a unit whose end we have not seen yet
    total = 0
    for data in _slices(raw, chunk):
        total += len(data)
        while data:
            try:
                out = obj.decompress(data)
            except error as e:
                raise CorruptInputError(f"{codec} data invalid near compressed byte {total}: "
                                        f"{e}") from None
            in_unit = True
            if out:
                yield out
            if obj.eof:  # the next unit starts on the bytes the finished one did not use
                data = obj.unused_data
                obj = new()
                in_unit = False
            else:
                data = b""
    if not total and empty_is_truncated:
        raise TruncatedInputError(f"empty file: no {codec} {unit} at all")
    if in_unit:
        raise TruncatedInputError(f"{codec} stream ends inside a {unit} after {total} "
                                  f"compressed bytes")


def open_stream(url: str, chunk: int = CHUNK) -> Iterator[bytes]:
    """Decompressed byte chunks of ``url`` (see module contract). Raises
    ``FileAccessError`` / ``FileMissingError`` (an ``OSError`` / ``FileNotFoundError``) when
    the file cannot be opened or read, ``StorageError`` when its store cannot be reached."""
    with failures(url, "read"):
        fs, path = url_to_fs(url)
        comp = compression_of(url)
        with fs.open(path, "rb") as raw:
            if comp is not None:
                yield from _decompressed(raw, chunk, comp)
            else:
                while data := raw.read(chunk):
                    yield data


def iter_lines(url: str, chunk: int = CHUNK) -> Iterator[bytes]:
    """Lines of the decompressed ``url`` without their ``\\n`` (a final line without a
    newline is still a line; ``\\r`` is left to the JSON parser, which treats it as
    whitespace)."""
    parts: list[bytes] = []
    for data in open_stream(url, chunk):
        start = 0
        nl = data.find(b"\n")
        while nl >= 0:
            if parts:
                parts.append(data[start:nl])
                yield b"".join(parts)
                parts = []
            else:
                yield data[start:nl]
            start = nl + 1
            nl = data.find(b"\n", start)
        if start < len(data):
            parts.append(data[start:])
    if parts:
        yield b"".join(parts)


def read_bytes(url: str) -> bytes:
    """Whole (raw, not decompressed) object. ``FileMissingError`` (a ``FileNotFoundError``)
    if absent."""
    with failures(url, "read"):
        fs, path = url_to_fs(url)
        return fs.cat_file(path)


def read_ranges(url: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """Byte ranges ``[start, end)`` of one file (local or object store) in one batched call."""
    with failures(url, "read"):
        fs, path = url_to_fs(url)
        return fs.cat_ranges([path] * len(ranges), [a for a, _ in ranges],
                             [b for _, b in ranges], on_error="raise")


def gunzip(data: bytes) -> bytes:
    """Decompress a whole gzip object; ``CorruptInputError`` / ``TruncatedInputError``."""
    try:
        return gzip.decompress(data)
    except EOFError as e:
        raise TruncatedInputError(f"gzip object ends early: {e}") from None
    except (OSError, zlib.error) as e:
        raise CorruptInputError(f"not valid gzip: {e}") from None


# ---------------------------------------------------------------------------------------
# Listing and hashing

@dataclass(frozen=True)
class FileInfo:
    """One listed file: path relative to the listing root, absolute URL, size, checksum."""

    path: str
    url: str
    size: int
    checksum: str


def sha256_of(url: str) -> str:
    """Hex SHA-256 of the raw bytes of ``url``, streamed."""
    h = hashlib.sha256()
    with failures(url, "read"):
        fs, path = url_to_fs(url)
        with fs.open(path, "rb") as f:
            while data := f.read(CHUNK):
                h.update(data)
    return h.hexdigest()


def checksum_of(fs: fsspec.AbstractFileSystem, path: str, info: dict[str, Any]) -> str:
    """A content identifier of one file, as cheap as the storage allows (module contract)."""
    if not is_local(fs):
        lfs = info.get("lfs")
        if isinstance(lfs, dict) and isinstance(lfs.get("sha256"), str):
            return lfs["sha256"]
        etag = info.get("ETag") or info.get("etag")
        if isinstance(etag, str) and etag.strip('"'):
            return "etag:" + etag.strip('"')
    return sha256_of(fs.unstrip_protocol(path) if not is_local(fs) else path)


def list_files(root: str, patterns: tuple[str, ...] | list[str],
               checksums: bool = True) -> list[FileInfo]:
    """Files under ``root`` matching any glob pattern (``*``, ``?``, ``[]``, ``**``), sorted
    by relative path, each once. Raises ``FileMissingError`` (a ``FileNotFoundError``) if
    ``root`` does not exist."""
    with failures(root, "list"):
        fs, root_path = url_to_fs(root)
        root_path = root_path.rstrip("/")
        if not fs.exists(root_path):
            # exists() swallows the reason on some backends (HfFileSystem offline: False);
            # info() raises it, and a plain absence as FileNotFoundError.
            fs.info(root_path)
            raise FileNotFoundError(errno.ENOENT, "no such directory", root)
        found: dict[str, dict[str, Any]] = {}
        for pattern in patterns:
            hits = fs.glob(root_path + "/" + pattern.lstrip("/"), detail=True)
            for p, info in hits.items():
                if info.get("type") == "directory":
                    continue
                rel = p[len(root_path) + 1:] if p.startswith(root_path + "/") else p
                found[rel] = info
    out = []
    for rel in sorted(found):
        info = found[rel]
        full = root_path + "/" + rel
        url = full if is_local(fs) else fs.unstrip_protocol(full)
        with failures(url, "read"):
            checksum = checksum_of(fs, full, info) if checksums else ""
        out.append(FileInfo(path=rel, url=url, size=int(info.get("size") or 0),
                            checksum=checksum))
    return out


# ---------------------------------------------------------------------------------------
# Writing

def makedirs(url: str) -> None:
    with failures(url, "create directory"):
        fs, path = url_to_fs(url)
        if is_local(fs):
            os.makedirs(path, exist_ok=True)


def ensure_writable_dir(url: str) -> None:
    """Create local directory ``url`` and check that this process may write into it, so a
    long job fails before it starts, naming the directory. Object stores have no
    directories and no cheap permission check: their first write names the failure."""
    makedirs(url)
    fs, path = url_to_fs(url)
    if is_local(fs) and not os.access(path, os.W_OK | os.X_OK):
        raise FileAccessError(f"cannot write into {url}: permission denied; check its "
                              f"permissions, or use another directory")


@contextlib.contextmanager
def atomic_writer(url: str) -> Iterator[IO[bytes]]:
    """A binary file handle whose content appears at ``url`` only if the block succeeds."""
    with failures(url, "write"):
        fs, path = url_to_fs(url)
        local = is_local(fs)
        directory = os.path.dirname(path) if local else None
        if local:
            os.makedirs(directory or ".", exist_ok=True)
            if os.path.isdir(path):
                # os.replace would name the temporary file, not the path asked for.
                raise IsADirectoryError(errno.EISDIR, "is a directory", url)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            # The caller's own writes are not wrapped (they may fail for reasons of their
            # own); a full disk shows up here, when the buffered bytes reach the file.
            with failures(url, "write"):
                f.flush()
                if local:
                    os.fsync(f.fileno())
        with failures(url, "write"):
            if local:
                os.replace(tmp, path)
            else:
                fs.put_file(tmp, path)  # one PUT: the object appears whole or not at all
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def atomic_write_bytes(url: str, data: bytes) -> None:
    with atomic_writer(url) as f:
        f.write(data)


# ---------------------------------------------------------------------------------------
# Fresh listings: several tasks or processes write one output; none may trust a listing
# fsspec cached before another wrote

def _forget(fs: fsspec.AbstractFileSystem, path: str) -> None:
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


def exists(url: str) -> bool:
    """Whether ``url`` exists now: on an object store the cached listing of its directory
    is dropped first (another task or process may have written it since)."""
    with failures(url, "check"):
        fs, path = url_to_fs(url)
        if not is_local(fs):
            _forget(fs, path.rsplit("/", 1)[0])
        return fs.exists(path)


def list_tree(url: str) -> list[str]:
    """Every file under ``url`` (recursive), as paths relative to it, sorted, from a fresh
    listing (see ``exists``); [] when ``url`` does not exist."""
    with failures(url, "list"):
        fs, path = url_to_fs(url)
        if not is_local(fs):
            _forget(fs, path)
        if not fs.exists(path):
            return []
        root = path.rstrip("/") + "/"
        return sorted(p[len(root):] for p in fs.find(path) if p.startswith(root))


def read_json(url: str) -> Any:
    return json.loads(read_bytes(url))


def write_json(url: str, obj: Any) -> None:
    atomic_write_bytes(url, readable_json(obj))


def sweep_temporaries(url: str) -> int:
    """Delete temporary files a killed writer left under a LOCAL output directory (names
    ``.tmp-*``, the atomic writers' prefix). Only safe when no other process writes there,
    so build-mix calls it for whole builds, never for ``--task`` runs."""
    fs, path = url_to_fs(url)
    if not is_local(fs) or not os.path.isdir(path):
        return 0
    n = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            if name.startswith(".tmp-") or ".tmp-" in name:
                os.unlink(os.path.join(dirpath, name))
                n += 1
    return n
