"""Token shards as the stream reads them: no byte is used before the manifest vouches for it.

Contract:

* ``ShardReader(view)`` reads shard (source, shard) as one whole file, once, into memory,
  hashes exactly those bytes (sha256 over the whole file, as the manifest's
  ``ShardEntry.sha256`` records it) and refuses a size or digest mismatch with a
  ``ManifestError`` naming the file, both digests and what to do. Only then are the bytes
  parsed (``build.shards`` checks magic, version, schema and counts) and decoded - from
  that same buffer, so there is no second read and nothing changes between check and use.
* ``tokens(source, shard)``: the whole ``tokens`` column as one flat uint32 array plus
  offsets (``ShardTokens``), checked against the ``.lengths.npy`` the plan used; kept in a
  per-source LRU of ``cache_shards``. ``prefetch(source, shard)`` starts the same work in a
  background thread (one per reader), so a sequential reader decodes the next shard while it
  serves the current one; a failure there is raised by the ``tokens`` call that needs it.
  At most one shard per source is in flight or waiting.
* ``parquet(source, shard)``: the checked file, for reading a few row groups (random access:
  ``stream-at``, provenance). Checked files are kept in memory, least recently used first
  out, up to ``FILE_CACHE_BYTES`` (always the last one): a process hashes a file once, the
  first time it needs any part of it. Nothing is remembered across processes (a cache keyed
  by path, size and mtime would let through an edit that restores them).

Why the buffers are Arrow's own memory (``pa.allocate_buffer``), never a Python object:
Arrow's thread pool may drop the last reference to a buffer after a read has returned. A
buffer that wraps a Python object (what a Python file handle's reads return, or
``pa.py_buffer``) then takes the GIL from an Arrow thread, and if that happens while the
interpreter exits, the thread is torn down inside C++ and the process aborts ("terminate
called without an active exception", exit 134, after correct output). Reading through an
fsspec handle with Arrow's default ``use_threads=True`` did exactly that in 1-7% of
``stream-at`` and ``provenance`` runs.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from open1b_data.errors import ManifestError, ShardFormatError
from open1b_data.storage import open_file
from open1b_data.storage_errors import failures

FILE_CACHE_BYTES = 512 << 20   # checked whole files kept for random access


@dataclass(frozen=True)
class ShardTokens:
    """One shard's documents as a flat uint32 array: document d is
    ``flat[offsets[d]:offsets[d+1]]``."""

    flat: np.ndarray
    offsets: np.ndarray

    def doc(self, d: int) -> np.ndarray:
        return self.flat[self.offsets[d]:self.offsets[d + 1]]


@dataclass(frozen=True)
class CheckedFile:
    """A shard file whose bytes matched the manifest: its buffer, parsed footer and counts."""

    url: str
    buffer: object          # pyarrow.Buffer (Arrow-owned memory)
    parquet: object         # pyarrow.parquet.ParquetFile over that buffer
    info: object            # build.shards.ShardInfo

    def row_group_of(self, docs) -> dict[int, list[int]]:
        """Documents grouped by the row group that holds them."""
        starts = np.concatenate([[0], np.cumsum(self.info.row_group_rows)]).astype(np.int64)
        groups: dict[int, list[int]] = {}
        for d in docs:
            if not 0 <= int(d) < self.info.documents:
                raise ShardFormatError(f"{self.url}: document {d} out of range "
                                       f"[0, {self.info.documents})")
            g = int(np.searchsorted(starts, int(d), side="right") - 1)
            groups.setdefault(g, []).append(int(d) - int(starts[g]))
        return groups


def read_checked(url: str, size: int, sha256: str):
    """The whole file at ``url`` in Arrow-owned memory, after checking its size and sha256
    against the manifest's (``ManifestError`` naming the file and both digests if not)."""
    import pyarrow as pa

    buf = pa.allocate_buffer(size + 1)      # one spare byte shows a file that grew
    view = memoryview(buf)
    n = 0
    try:
        with failures(url, "read"), open_file(url) as f:
            while n <= size:
                got = f.readinto(view[n:])
                if not got:
                    break
                n += got
    except FileNotFoundError:
        raise ManifestError(f"shard {url} does not exist but the manifest lists it; the mix "
                            f"is incomplete - rebuild it (open1b-data build-mix)") from None
    digest = hashlib.sha256(view[:n]).hexdigest()
    view.release()
    if n != size or digest != sha256:
        raise ManifestError(
            f"shard {url} has sha256 {digest} ({n if n <= size else 'more than ' + str(size)}"
            f" bytes) but the manifest says {sha256} ({size} bytes): the file changed since "
            f"the mix was built, and the stream serves only what the manifest vouches for. "
            f"Run `open1b-data verify` on the mix to list every changed file, then rebuild it")
    return buf.slice(0, size)


def _parse(url: str, buf) -> CheckedFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from open1b_data.formats.shards import _check

    try:
        pf = pq.ParquetFile(pa.BufferReader(buf))
    except (pa.ArrowException, OSError) as e:
        raise ShardFormatError(f"{url}: not a readable Parquet shard ({e})") from None
    return CheckedFile(url, buf, pf, _check(url, pf))


class ShardReader:
    """Checked reads of one mix's token shards (see module docstring)."""

    def __init__(self, view, cache_shards: int = 2) -> None:
        self.view = view
        self.cache_shards = max(1, int(cache_shards))
        self._tokens: list[OrderedDict[int, ShardTokens]] = [OrderedDict() for _ in
                                                             view.sources]
        self._files: OrderedDict[tuple[int, int], CheckedFile] = OrderedDict()
        self._pending: dict[int, tuple[int, Future]] = {}    # source -> (shard, future)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.loads = 0          # whole shards decoded (tests, stats)
        self.ahead_hits = 0     # of which asked for after a prefetch had started them

    def url(self, source: int, shard: int) -> str:
        return self.view.url(self.view.sources[source].shard_paths[shard])

    def _checked(self, source: int, shard: int) -> CheckedFile:
        sv = self.view.sources[source]
        url = self.url(source, shard)
        return _parse(url, read_checked(url, sv.shard_bytes[shard], sv.shard_sha256[shard]))

    # ------------------------------------------------------------------ random access

    def parquet(self, source: int, shard: int) -> CheckedFile:
        """The checked file (read and hashed on first use, then kept; see docstring)."""
        key = (source, shard)
        with self._lock:
            hit = self._files.get(key)
            if hit is not None:
                self._files.move_to_end(key)
                return hit
        f = self._checked(source, shard)
        with self._lock:
            self._files[key] = f
            while len(self._files) > 1 and sum(
                    x.buffer.size for x in self._files.values()) > FILE_CACHE_BYTES:
                self._files.popitem(last=False)
        return f

    def rows(self, source: int, shard: int, docs) -> list[np.ndarray]:
        """Token ids of documents ``docs`` of one shard, reading only their row groups."""
        from open1b_data.formats.shards import list_parts

        f = self.parquet(source, shard)
        got: dict[int, np.ndarray] = {}
        for g, local in f.row_group_of(docs).items():
            # one small row group from memory: Arrow's thread pool costs more than it saves
            col = f.parquet.read_row_group(g, columns=["tokens"], use_threads=False)
            flat, offsets = list_parts(col.column("tokens"), f.url)
            base = int(np.sum(f.info.row_group_rows[:g]))
            for q in local:
                got[base + q] = flat[offsets[q]:offsets[q + 1]]
        return [got[int(d)] for d in docs]

    def column(self, source: int, shard: int, name: str, docs=None) -> list:
        """A column of a shard as a Python list: all rows, or rows ``docs`` (their row
        groups only)."""
        f = self.parquet(source, shard)
        if docs is None:
            return f.parquet.read(columns=[name], use_threads=False).column(name).to_pylist()
        out: dict[int, object] = {}
        for g, local in f.row_group_of(docs).items():
            vals = f.parquet.read_row_group(g, columns=[name], use_threads=False
                                            ).column(name).to_pylist()
            base = int(np.sum(f.info.row_group_rows[:g]))
            for q in local:
                out[base + q] = vals[q]
        return [out[int(d)] for d in docs]

    # ------------------------------------------------------------------ whole shards

    def _decode(self, source: int, shard: int) -> ShardTokens:
        from open1b_data.formats.shards import list_parts

        f = self._checked(source, shard)
        # the buffer is Arrow's and in memory: Arrow's threads may decode it in parallel
        col = f.parquet.read(columns=["tokens"], use_threads=True).column("tokens")
        flat, offsets = list_parts(col, f.url)
        lengths = self.view.lengths(source, shard)
        if offsets.shape[0] != lengths.shape[0] + 1 or not np.array_equal(
                np.diff(offsets), lengths.astype(np.int64)):
            raise ShardFormatError(
                f"{f.url}: document lengths differ from its .lengths.npy, which the stream "
                f"plans from; run `open1b-data verify` on the mix and rebuild it")
        with self._lock:
            self.loads += 1
        return ShardTokens(np.ascontiguousarray(flat, dtype=np.uint32), offsets)

    def _after_fork(self) -> None:
        """A forked child (a DataLoader worker) has none of its parent's threads."""
        if self._pid != os.getpid():
            self._pid, self._pool, self._pending = os.getpid(), None, {}
            self._lock = threading.Lock()

    def prefetch(self, source: int, shard: int) -> None:
        """Start decoding ``shard`` of ``source`` in the background unless it is cached or
        already on its way; it replaces any other shard of that source on its way."""
        self._after_fork()
        with self._lock:
            if shard in self._tokens[source]:
                return
            waiting = self._pending.get(source)
            if waiting is not None and waiting[0] == shard:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="open1b-readahead")
            self._pending[source] = (shard, self._pool.submit(self._decode, source, shard))

    def tokens(self, source: int, shard: int) -> ShardTokens:
        """The whole shard, decoded once and cached (see module docstring)."""
        self._after_fork()
        cache = self._tokens[source]
        with self._lock:
            hit = cache.get(shard)
            if hit is not None:
                cache.move_to_end(shard)
                return hit
            waiting = self._pending.get(source)
            if waiting is not None and waiting[0] == shard:
                del self._pending[source]
                self.ahead_hits += 1
            else:
                waiting = None
        st = waiting[1].result() if waiting is not None else self._decode(source, shard)
        with self._lock:
            cache[shard] = st
            while len(cache) > self.cache_shards:
                cache.popitem(last=False)
        return st

    def close(self) -> None:
        """Stop the background thread (waits for a decode in progress); caches stay."""
        with self._lock:
            pool, self._pool, self._pending = self._pool, None, {}
        if pool is not None and self._pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)
