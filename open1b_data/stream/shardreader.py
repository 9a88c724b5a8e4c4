"""Token shards as the stream reads them: no document is used before the manifest vouches
for its content.

Contract: what a reader checks is what the mix fingerprint covers - each shard's Merkle
root over its documents' tokens and provenance (``formats/merkle.py``) - never the file's
bytes, so a shard rewritten by another Parquet writer (another pyarrow, other row groups,
compression or dictionary settings) reads the same, and a changed token, doc_id, input or
row is refused, named (``ManifestError``: the shard, the row, the doc_id read, and to run
``open1b-data verify``).

* ``tokens(source, shard)``: the whole shard (sequential reading: the loader). Every column
  is decoded once, every document's leaf computed and the tree's root compared with the
  manifest's; the document lengths are compared with the ``.lengths.npy`` the plan used.
  The held-out rows are derived from the ``doc_id`` column by the definition's rule
  (``formats/heldout.py``) and must be the manifest's list, which the plan used to leave
  them out of training: a list emptied (or changed) in a re-fingerprinted manifest would
  put validation documents into training, and is refused naming the first row it gets
  wrong (``HeldOutError``). Kept in a per-source LRU of ``cache_shards``.
  ``prefetch(source, shard)`` starts the same work in a background thread (one per
  reader), so a sequential reader decodes the next shard while it serves the current one;
  a failure there is raised by the ``tokens`` call that needs it. At most one shard per
  source is in flight or waiting.
* ``documents(source, shard, docs)`` (random access: ``stream-at``, provenance, held-out
  windows): only the row groups holding ``docs`` are decoded, each document's leaf is
  computed and proved against the root with its inclusion proof from the shard's stored
  tree (read with range requests; nothing in the tree file is trusted), and its held-out
  status by the rule must be its status in the manifest's list. Proved documents are kept
  with their file (below). ``rows`` and ``column`` are views of them.
* Files: for random access a shard is read once, whole, into memory and kept, least
  recently used first out, up to ``FILE_CACHE_BYTES`` (always the last one); a shard
  decoded whole is read for that decode only (its decoded form is what is kept). Nothing
  is remembered across processes.

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

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from open1b_data.errors import HeldOutError, ManifestError, ProofError, ShardFormatError
from open1b_data.formats import merkle
from open1b_data.formats.heldout import heldout_rows, is_heldout
from open1b_data.formats.shards import ShardRow, decode_group
from open1b_data.storage import open_file
from open1b_data.storage_errors import failures

FILE_CACHE_BYTES = 512 << 20   # shard files kept for random access
LEAF_THREADS_BYTES = 4 << 20   # a shard decoded whole with this many token bytes: 2 threads
COLUMNS = ("tokens", "doc_id", "input", "row")


@dataclass(frozen=True)
class ShardTokens:
    """One shard's documents as a flat uint32 array: document d is
    ``flat[offsets[d]:offsets[d+1]]``; with their provenance columns when decoded whole."""

    flat: np.ndarray
    offsets: np.ndarray
    doc_ids: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    rows: np.ndarray | None = None

    def doc(self, d: int) -> np.ndarray:
        return self.flat[self.offsets[d]:self.offsets[d + 1]]


@dataclass
class ShardFile:
    """A shard file in memory: its buffer, parsed footer, counts, and the documents of it
    proved so far (row -> ``ShardRow``)."""

    url: str
    buffer: object          # pyarrow.Buffer (Arrow-owned memory)
    parquet: object         # pyarrow.parquet.ParquetFile over that buffer
    info: object            # formats.shards.ShardInfo
    proved: dict[int, ShardRow] = field(default_factory=dict)

    def row_group_of(self, docs) -> dict[int, list[int]]:
        """Documents grouped by the row group that holds them."""
        starts = np.concatenate([[0], np.cumsum(self.info.row_group_rows)]).astype(np.int64)
        groups: dict[int, list[int]] = {}
        for d in docs:
            if not 0 <= int(d) < self.info.documents:
                raise ShardFormatError(f"{self.url}: document {d} out of range "
                                       f"[0, {self.info.documents})")
            g = int(np.searchsorted(starts, int(d), side="right") - 1)
            groups.setdefault(g, []).append(int(d))
        return groups


def read_whole(url: str):
    """The whole file at ``url`` in Arrow-owned memory (module docstring says why)."""
    import pyarrow as pa

    try:
        with failures(url, "read"), open_file(url) as f:    # a regular file, never a link
            size = (int(f.size) if getattr(f, "size", None) is not None else
                os.fstat(f.fileno()).st_size)
            buf = pa.allocate_buffer(size + 1)      # one spare byte shows a file that grew
            view = memoryview(buf)
            n = 0
            while n <= size:
                got = f.readinto(view[n:])
                if not got:
                    break
                n += got
            view.release()
    except FileNotFoundError:
        raise ManifestError(f"shard {url} does not exist but the manifest lists it; the mix "
                            f"is incomplete - restore it or rebuild it (open1b-data "
                            f"build-mix)") from None
    if n != size:
        raise ManifestError(f"shard {url} changed while it was read ({n} of {size} bytes); "
                            f"read it again")
    return buf.slice(0, size)


def _parse(url: str, buf) -> ShardFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from open1b_data.formats.shards import check_footer

    try:
        pf = pq.ParquetFile(pa.BufferReader(buf))
    except (pa.ArrowException, OSError) as e:
        raise ShardFormatError(f"{url}: not a readable Parquet shard ({e}); the file is "
                                   f"damaged or replaced - run `open1b-data verify` on the "
                                   f"mix, then restore or rebuild it") from None
    return ShardFile(url, buf, pf, check_footer(url, pf))


def _columns(table, url: str, first: int):
    """(flat tokens, offsets, doc_ids, inputs, rows) of a decoded table."""
    from open1b_data.formats.shards import list_parts

    flat, offsets = list_parts(table.column("tokens"), url)
    ids = table.column("doc_id").to_pylist()
    inputs = table.column("input").to_pylist()
    rows = table.column("row").to_pylist()
    if None in ids or None in inputs or None in rows:
        raise ShardFormatError(f"{url}: a doc_id, input or row near document {first} is null; "
                               f"shards never hold nulls (restore or rebuild the mix)")
    return flat, offsets, ids, inputs, rows


class ShardReader:
    """Checked reads of one mix's token shards (see module docstring)."""

    def __init__(self, view, cache_shards: int = 2) -> None:
        self.view = view
        self.cache_shards = max(1, int(cache_shards))
        self._tokens: list[OrderedDict[int, ShardTokens]] = [OrderedDict() for _ in
                                                             view.sources]
        self._files: OrderedDict[tuple[int, int], ShardFile] = OrderedDict()
        self._pending: dict[int, tuple[int, Future]] = {}    # source -> (shard, future)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self.loads = 0          # whole shards decoded (tests, stats)
        self.ahead_hits = 0     # of which asked for after a prefetch had started them

    def url(self, source: int, shard: int) -> str:
        return self.view.url(self.view.sources[source].shard_paths[shard])

    def _root(self, source: int, shard: int) -> bytes:
        root = self.view.sources[source].shard_roots[shard]
        if root is None:
            raise ManifestError(f"shard {self.url(source, shard)} has no Merkle root in the "
                                f"manifest, so its content cannot be checked; it cannot be "
                                f"read (a plan-only mix)")
        return bytes.fromhex(root)

    # ------------------------------------------------------------------ checks

    def _changed(self, source: int, shard: int, row: int, doc_id: object) -> ManifestError:
        return ManifestError(
            f"shard {self.url(source, shard)} row {row} (doc_id {doc_id!r}): its tokens, "
            f"doc_id, input or row are not the ones mix {self.view.name!r} (fingerprint "
            f"{self.view.fingerprint[:16]}...) was built with - its content does not lead to "
            f"the shard's Merkle root in the manifest, and the stream serves only what the "
            f"manifest vouches for. Run `open1b-data verify` on the mix to list every "
            f"changed shard, then restore or rebuild it")

    def _first_changed(self, source: int, shard: int, leaves: list[bytes]) -> int | None:
        """The first document whose leaf differs from the stored tree's, when the stored
        tree leads to the manifest's root (else None: the tree cannot say)."""
        sv = self.view.sources[source]
        try:
            from open1b_data.storage import read_bytes

            tree = merkle.decode(read_bytes(self.view.url(sv.tree_paths[shard])),
                                 sv.tree_paths[shard], sv.shard_documents[shard])
        except (OSError, ShardFormatError, TypeError):
            return None
        if merkle.root_of(merkle.levels(tree[0] if tree else [])) != self._root(source, shard):
            return None
        return next((i for i, (a, b) in enumerate(zip(leaves, tree[0] if tree else []))
                     if a != b), min(len(leaves), len(tree[0]) if tree else 0))

    def _check_heldout(self, source: int, shard: int, rows: list[int], ids: list[str]
                       ) -> None:
        """Documents ``rows`` (with ids ``ids``) are held out by the rule exactly when the
        manifest lists them (module docstring)."""
        sv = self.view.sources[source]
        fraction = sv.heldout_fraction
        if fraction is None:
            return
        listed = sv.shard_heldout[shard]
        for r, doc_id in zip(rows, ids):
            rule = is_heldout(doc_id, fraction)
            k = int(np.searchsorted(listed, r))
            if rule != (k < listed.size and int(listed[k]) == r):
                raise _heldout_error(self.url(source, shard), r, doc_id, fraction, rule)

    # ------------------------------------------------------------------ files

    def file(self, source: int, shard: int) -> ShardFile:
        """The shard file in memory (read on first use, then kept; see docstring)."""
        key = (source, shard)
        with self._lock:
            hit = self._files.get(key)
            if hit is not None:
                self._files.move_to_end(key)
                return hit
        url = self.url(source, shard)
        f = _parse(url, read_whole(url))
        with self._lock:
            self._files[key] = f
            while len(self._files) > 1 and sum(
                    x.buffer.size for x in self._files.values()) > FILE_CACHE_BYTES:
                self._files.popitem(last=False)
        return f

    # ------------------------------------------------------------------ random access

    def documents(self, source: int, shard: int, docs) -> list[ShardRow]:
        """Documents ``docs`` of one shard, each proved against the shard's root (only
        their row groups decoded; see module docstring)."""
        f = self.file(source, shard)
        wanted = [int(d) for d in docs]
        todo = sorted({d for d in wanted if d not in f.proved})
        if todo:
            root = self._root(source, shard)
            sv = self.view.sources[source]
            got: dict[int, ShardRow] = {}
            starts = np.concatenate([[0], np.cumsum(f.info.row_group_rows)]).astype(np.int64)
            for g, rows in f.row_group_of(todo).items():
                # one small row group from memory: Arrow's thread pool costs more than it saves
                t = decode_group(f.parquet, f.url, g, COLUMNS)
                flat, offsets, ids, inputs, rws = _columns(t, f.url, int(starts[g]))
                for d in rows:
                    q = d - int(starts[g])
                    got[d] = ShardRow(flat[offsets[q]:offsets[q + 1]], ids[q], inputs[q],
                                      rws[q])
            proofs = _read_proofs(self.view.url(sv.tree_paths[shard]), sv.tree_paths[shard],
                                  sv.shard_documents[shard], todo)
            for d in todo:
                r = got[d]
                leaf = merkle.leaf_hash(d, r.tokens, r.doc_id, r.input, r.row)
                stored, proof = proofs[d]
                if not merkle.verify(leaf, proof, root):
                    if merkle.verify(stored, proof, root):
                        raise self._changed(source, shard, d, r.doc_id)
                    raise ProofError(f"{sv.tree_paths[shard]}: the stored Merkle tree of "
                                     f"shard {f.url} does not lead to the root in the "
                                     f"manifest (damaged or replaced), so row {d} cannot be "
                                     f"proved; run `open1b-data verify` on the mix")
            self._check_heldout(source, shard, todo, [got[d].doc_id for d in todo])
            with self._lock:
                f.proved.update(got)
        return [f.proved[d] for d in wanted]

    def rows(self, source: int, shard: int, docs) -> list[np.ndarray]:
        """Token ids of documents ``docs`` of one shard (proved; their row groups only)."""
        return [r.tokens for r in self.documents(source, shard, docs)]

    def column(self, source: int, shard: int, name: str, docs=None) -> list:
        """``doc_id``, ``input``, ``row`` or ``tokens`` of documents ``docs`` (proved), or
        of the whole shard (checked whole) when ``docs`` is None."""
        if name not in COLUMNS:
            raise ShardFormatError(f"a shard has no column {name!r}; its columns: {COLUMNS}")
        if docs is None:
            st = self.tokens(source, shard)
            return {"doc_id": list(st.doc_ids), "input": list(st.inputs),
                    "row": [int(r) for r in st.rows],
                    "tokens": [st.doc(d) for d in range(len(st.doc_ids))]}[name]
        field_of = {"doc_id": "doc_id", "input": "input", "row": "row", "tokens": "tokens"}
        return [getattr(r, field_of[name]) for r in self.documents(source, shard, docs)]

    # ------------------------------------------------------------------ whole shards

    def _decode(self, source: int, shard: int) -> ShardTokens:
        url = self.url(source, shard)
        f = _parse(url, read_whole(url))        # not kept: the decoded shard is
        root = self._root(source, shard)
        # the buffer is Arrow's and in memory: Arrow's threads may decode it in parallel
        t = decode_group(f.parquet, f.url, None, COLUMNS, use_threads=True)
        flat, offsets, ids, inputs, rows = _columns(t, f.url, 0)
        # a large shard's token bytes are hashed on two threads (docstring of leaf_hashes)
        leaves = merkle.leaf_hashes(flat, offsets, ids, inputs, rows,
                                    threads=2 if flat.nbytes >= LEAF_THREADS_BYTES else 1)
        if merkle.root_of(merkle.levels(leaves)) != root:
            i = self._first_changed(source, shard, leaves)
            if i is not None and i < len(ids):
                raise self._changed(source, shard, i, ids[i])
            raise ManifestError(
                f"shard {f.url}: its {len(ids)} documents do not lead to the Merkle root in "
                f"the manifest of mix {self.view.name!r} (fingerprint "
                f"{self.view.fingerprint[:16]}...): its content changed since the build. Run "
                f"`open1b-data verify` on the mix to list every changed shard, then restore "
                f"or rebuild it")
        lengths = self.view.lengths(source, shard)
        if offsets.shape[0] != lengths.shape[0] + 1 or not np.array_equal(
                np.diff(offsets), lengths.astype(np.int64)):
            raise ShardFormatError(
                f"{f.url}: document lengths differ from its .lengths.npy, which the stream "
                f"plans from; run `open1b-data verify` on the mix and rebuild it")
        sv = self.view.sources[source]
        if sv.heldout_fraction is not None:
            want = heldout_rows(ids, sv.heldout_fraction)
            listed = sv.shard_heldout[shard].tolist()
            if want != listed:
                k = next((j for j, (a, b) in enumerate(zip(want, listed)) if a != b),
                         min(len(want), len(listed)))
                r = min(want[k] if k < len(want) else 1 << 62,
                        listed[k] if k < len(listed) else 1 << 62)
                raise _heldout_error(f.url, r, ids[r], sv.heldout_fraction, r in want)
        with self._lock:
            self.loads += 1
        return ShardTokens(np.ascontiguousarray(flat, dtype=np.uint32), offsets,
                           tuple(ids), tuple(inputs), np.asarray(rows, dtype=np.int64))

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
        """The whole shard, checked, decoded once and cached (see module docstring)."""
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


def _heldout_error(url: str, row: int, doc_id: str, fraction, rule: bool) -> HeldOutError:
    if rule:
        return HeldOutError(
            f"shard {url} row {row} (doc_id {doc_id!r}) is held out by the definition's rule "
            f"(fraction {fraction}) but the manifest does not list it: the stream would "
            f"train on a validation document. The manifest's held-out lists were edited; "
            f"refusing the mix - rebuild it (or run `open1b-data verify` on it)")
    return HeldOutError(
        f"shard {url} row {row} (doc_id {doc_id!r}) is listed as held out, but the "
        f"definition's rule (fraction {fraction}) keeps it for training; the manifest's "
        f"held-out lists were edited - refusing the mix, rebuild it")


def _read_proofs(url: str, rel: str | None, size: int, rows: list[int]):
    """Stored leaves and proofs of ``rows`` from a shard's tree file (range reads)."""
    from open1b_data.storage import read_ranges

    if rel is None:
        raise ManifestError(f"{url}: no Merkle tree recorded; the shard cannot be proved")
    try:
        return merkle.read_proofs(read_ranges, url, size, rows)
    except FileNotFoundError:
        raise ProofError(f"{rel}: the shard's Merkle tree file does not exist, so no "
                         f"document of it can be proved; run `open1b-data verify` on the "
                         f"mix (or rebuild it)") from None
