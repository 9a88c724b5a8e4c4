"""Token shards: zstd Parquet files of documents' token ids, plus a ``.lengths.npy`` index.

Contract (docs/FORMATS.md, "Token shards" and "Document lengths"):
- One row per document, in the order ``ShardWriter.add`` received them; columns
  ``tokens: list<uint32>`` (without the separator), ``doc_id: string``, ``input: string``,
  ``row: int64``; row groups of exactly ``docs_per_row_group`` documents (the last may be
  shorter), so one document is read by reading one row group (``read_document``).
- Key-value metadata ``open1b.format = "open1b-shard"``, ``open1b.version = "1"``,
  ``open1b.documents``, ``open1b.tokens``, ``open1b.source``; every reader checks the magic,
  version, schema and counts and raises ``ShardFormatError`` naming the file.
- ``<shard>.lengths.npy``: ``<u4`` array of the documents' token counts (the stream plans
  from it alone). Loaded with ``allow_pickle=False``; dtype/shape checked. Its manifest
  record is ``lengths_content``: the SHA-256 of the counts as uint32 LE (not of the file).
- ``<shard>.merkle``: the shard's Merkle tree over its documents - tokens and provenance
  (``merkle.py``) - computed as the documents arrive (one SHA-256 over each document's
  bytes, which the writer holds anyway); its root goes into the shard's manifest entry
  and is the shard's identity.
- Bytes depend only on the rows and ``ShardSpec`` within one environment: Parquet written
  by pyarrow carries no timestamp, but ``created_by`` names the pyarrow version and another
  version may encode pages differently. Nothing identifies a shard by its bytes: readers
  check the documents they decode against the root (``stream/shardreader.py``), so a shard
  rewritten by another writer reads the same.
- Writes are atomic: each file goes to a local temporary name and is then renamed (local)
  or uploaded with one PUT (object stores); the tree and lengths files are published
  before their shard, so a listed shard always has both. A shard closes once it holds
  ``tokens_per_shard`` tokens; ``close()`` flushes the last one and returns the entries.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from open1b_data.errors import ShardFormatError
from open1b_data.formats import merkle
from open1b_data.formats.heldout import is_heldout
from open1b_data.formats.manifest import ShardEntry, TreeEntry
from open1b_data.formats.definition import ShardSpec
from open1b_data.storage import is_local, open_file, read_bytes, url_to_fs
from open1b_data.storage_errors import failures

FORMAT = "open1b-shard"
VERSION = "1"
SCHEMA = pa.schema([("tokens", pa.list_(pa.uint32())), ("doc_id", pa.string()),
                    ("input", pa.string()), ("row", pa.int64())])
_MAX_TOKENS = 2**31 - 1  # list<> offsets are int32


def _publish(tmp: str, url: str) -> None:
    """Move a finished local temporary file to ``url`` in one step."""
    fs, path = url_to_fs(url)
    if is_local(fs):
        os.replace(tmp, path)
    else:
        fs.put_file(tmp, path)  # one PUT: the object appears whole or not at all


@contextlib.contextmanager
def _temp_for(url: str) -> Iterator[str]:
    fs, path = url_to_fs(url)
    directory = None
    if is_local(fs):
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=directory)
    os.close(fd)
    try:
        yield tmp
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _sha256_file(path: str) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while data := f.read(1 << 20):
            h.update(data)
            n += len(data)
    return h.hexdigest(), n


# Arrow columns from buffers: ``pa.array`` of a Python sequence or of a numpy array asks
# pandas whether it is array-like, and importing pandas costs 0.3 s per process.

def _from_numpy(a: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), a.size, [None, pa.py_buffer(a)])


def _offsets(sizes: Sequence[int]) -> np.ndarray:
    offsets = np.zeros(len(sizes) + 1, dtype=np.int32)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def _token_lists(toks: Sequence[np.ndarray]) -> pa.Array:
    offsets = _offsets([t.size for t in toks])
    values = np.concatenate(toks) if offsets[-1] else np.zeros(0, "<u4")
    return pa.Array.from_buffers(SCHEMA.field("tokens").type, len(toks),
                                 [None, pa.py_buffer(offsets)], children=[_from_numpy(values)])


def _strings(items: Sequence[str]) -> pa.Array:
    data = [s.encode("utf-8") for s in items]
    return pa.Array.from_buffers(pa.string(), len(data), [
        None, pa.py_buffer(_offsets([len(b) for b in data])), pa.py_buffer(b"".join(data))])


class ShardWriter:
    """Writes ``<prefix>-<k:05d>.parquet`` (+ ``.lengths.npy``) for k = 0, 1, ...

    ``dest_prefix_url`` is ``<mix>/<source>/shard-<task>``; entries' paths are relative to
    the mix root (``<source>/<file name>``) unless ``rel_prefix`` says otherwise. Memory is
    bounded by one row group: each full row group goes straight to a local temporary
    Parquet file; the counts go into the footer when the shard closes.
    """

    def __init__(self, dest_prefix_url: str, source: str, shard_spec: ShardSpec,
                 rel_prefix: str | None = None, heldout: Fraction | None = None) -> None:
        self.prefix = dest_prefix_url.rstrip("/")
        self.source = source
        self.spec = shard_spec
        self.rel_prefix = rel_prefix or f"{source}/{self.prefix.rsplit('/', 1)[-1]}"
        self.entries: list[ShardEntry] = []
        self._writer: pq.ParquetWriter | None = None
        self._tmp: str | None = None
        self._lengths: list[int] = []
        self._leaves: list[bytes] = []
        self._group: list[tuple[np.ndarray, str, str, int]] = []
        self._count = 0
        self._closed = False
        # the source's held-out fraction: each entry then lists the rows it holds out
        self.heldout = heldout
        self._heldout: list[int] = []

    def _url(self, suffix: str) -> str:
        return f"{self.prefix}-{len(self.entries):05d}{suffix}"

    def add(self, tokens: np.ndarray, doc_id: str, input: str, row: int) -> None:
        if self._closed:
            raise ShardFormatError(f"{self.prefix}: add() after close()")
        arr = np.asarray(tokens)
        if arr.ndim != 1 or not (arr.dtype == np.uint32 or arr.size == 0):
            raise ShardFormatError(f"{self.prefix}: tokens must be a 1-D uint32 array, got "
                                   f"dtype {arr.dtype} shape {arr.shape}")
        if self._count + arr.size > _MAX_TOKENS:
            raise ShardFormatError(f"{self._url('.parquet')}: more than {_MAX_TOKENS} tokens "
                                   f"in one Parquet list column; lower shards.tokens_per_shard")
        arr = arr.astype("<u4", copy=False)
        if self.heldout is not None and is_heldout(str(doc_id), self.heldout):
            self._heldout.append(len(self._lengths))
        self._leaves.append(merkle.leaf_hash(len(self._lengths), arr, str(doc_id), str(input),
                                             int(row)))
        self._group.append((arr, str(doc_id), str(input), int(row)))
        self._lengths.append(int(arr.size))
        self._count += int(arr.size)
        if len(self._group) >= self.spec.docs_per_row_group:
            self._write_group()
        if self._count >= self.spec.tokens_per_shard:
            self._finish()

    def close(self) -> list[ShardEntry]:
        if not self._closed:
            try:
                self._finish()
            finally:
                self._closed = True
                self._discard()
        return list(self.entries)

    def _write_group(self) -> None:
        if not self._group:
            return
        if self._writer is None:
            fs, path = url_to_fs(self._url(".parquet"))
            directory = None
            if is_local(fs):
                directory = os.path.dirname(path) or "."
                os.makedirs(directory, exist_ok=True)
            fd, self._tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=directory)
            os.close(fd)
            # Dictionary pages only for `input` (few distinct values); no statistics: they
            # cost bytes and nothing reads them.
            self._writer = pq.ParquetWriter(
                self._tmp, SCHEMA.with_metadata({"open1b.format": FORMAT,
                                                 "open1b.version": VERSION}),
                compression="zstd", compression_level=self.spec.zstd_level,
                use_dictionary=["input"], write_statistics=False)
        toks, ids, inputs, rows = zip(*self._group)
        table = pa.Table.from_arrays([_token_lists(toks), _strings(ids), _strings(inputs),
                                      _from_numpy(np.asarray(rows, np.int64))], schema=SCHEMA)
        self._writer.write_table(table, row_group_size=len(toks))
        self._group = []

    def _finish(self) -> None:
        """Close the current shard: footer counts, lengths file, then the shard itself."""
        self._write_group()
        if self._writer is None:
            return
        url, lurl, turl = self._url(".parquet"), self._url(".lengths.npy"), self._url(".merkle")
        lengths = np.array(self._lengths, dtype="<u4")
        self._writer.add_key_value_metadata({
            "open1b.documents": str(len(lengths)), "open1b.tokens": str(self._count),
            "open1b.source": self.source})
        self._writer.close()
        self._writer = None
        buf = io.BytesIO()
        np.save(buf, lengths, allow_pickle=False)
        lbytes = buf.getvalue()
        tree = merkle.levels(self._leaves)
        tbytes = merkle.encode(tree)
        # tree and lengths first: a listed shard always has both
        for data, dest in ((tbytes, turl), (lbytes, lurl)):
            with _temp_for(dest) as tmp:
                with open(tmp, "wb") as f:
                    f.write(data)
                _publish(tmp, dest)
        sha, nbytes = _sha256_file(self._tmp)
        _publish(self._tmp, url)
        name = f"-{len(self.entries):05d}"
        self.entries.append(ShardEntry(
            path=f"{self.rel_prefix}{name}.parquet", sha256=sha, bytes=nbytes,
            documents=len(lengths), tokens=self._count,
            lengths_path=f"{self.rel_prefix}{name}.lengths.npy",
            lengths_content=lengths_digest(lengths),
            merkle=TreeEntry(root=merkle.root_of(tree).hex(),
                             path=f"{self.rel_prefix}{name}.merkle",
                             sha256=hashlib.sha256(tbytes).hexdigest()),
            heldout=None if self.heldout is None else tuple(self._heldout)))
        self._discard()
        self._lengths, self._leaves, self._count, self._heldout = [], [], 0, []

    def _discard(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if self._tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)
            self._tmp = None


# ---------------------------------------------------------------------------------------
# Reading

@dataclass(frozen=True)
class ShardInfo:
    """What a shard's footer says: counts, source and row-group layout."""

    source: str
    documents: int
    tokens: int
    row_group_rows: tuple[int, ...]


@dataclass(frozen=True)
class ShardRow:
    """One stored document."""

    tokens: np.ndarray
    doc_id: str
    input: str
    row: int


@contextlib.contextmanager
def _open(url: str) -> Iterator[tuple[pq.ParquetFile, ShardInfo]]:
    """The open shard and its checked footer; the file is closed on exit."""
    try:
        with failures(url, "read"):
            handle = open_file(url)
    except FileNotFoundError:
        raise ShardFormatError(f"{url}: shard does not exist") from None
    with handle:
        try:
            pf = pq.ParquetFile(handle)
        except (pa.ArrowException, OSError) as e:
            raise ShardFormatError(f"{url}: not a readable Parquet shard ({e}); the file is "
                                   f"damaged or replaced - run `open1b-data verify` on the "
                                   f"mix, then restore or rebuild it") from None
        yield pf, _check(url, pf)


def _check(url: str, pf: pq.ParquetFile) -> ShardInfo:
    meta = {k.decode(errors="replace"): v.decode(errors="replace")
            for k, v in (pf.metadata.metadata or {}).items() if k != b"ARROW:schema"}
    if meta.get("open1b.format") != FORMAT or meta.get("open1b.version") != VERSION:
        raise ShardFormatError(f"{url}: format/version {meta.get('open1b.format')!r}/"
                               f"{meta.get('open1b.version')!r}, expected {FORMAT!r}/{VERSION!r}")
    if not pf.schema_arrow.remove_metadata().equals(SCHEMA):
        raise ShardFormatError(f"{url}: schema {pf.schema_arrow.remove_metadata()} is not "
                               f"{SCHEMA}")
    try:
        docs, tokens = int(meta["open1b.documents"]), int(meta["open1b.tokens"])
    except (KeyError, ValueError):
        raise ShardFormatError(f"{url}: missing or bad open1b.documents/open1b.tokens") from None
    md = pf.metadata
    if md.num_rows != docs:
        raise ShardFormatError(f"{url}: metadata says {docs} documents, file holds "
                               f"{md.num_rows} rows")
    rows = tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
    return ShardInfo(meta.get("open1b.source", ""), docs, tokens, rows)


def check_footer(url: str, pf: pq.ParquetFile) -> ShardInfo:
    """The checks every reader makes of a shard's footer (magic, version, schema, counts),
    for a ``ParquetFile`` opened elsewhere (e.g. over range requests)."""
    return _check(url, pf)


def read_shard_info(url: str) -> ShardInfo:
    """Footer-only check of one shard (no data pages read)."""
    with _open(url) as (_, info):
        return info


def read_lengths(url: str, documents: int | None = None) -> np.ndarray:
    """The ``<u4`` document lengths of one shard; ``ShardFormatError`` if malformed."""
    try:
        data = read_bytes(url)
    except FileNotFoundError:
        raise ShardFormatError(f"{url}: lengths file does not exist") from None
    return parse_lengths(data, url, documents)


def parse_lengths(data: bytes, url: str, documents: int | None = None) -> np.ndarray:
    """A lengths file's bytes as a read-only ``<u4`` array, or ``ShardFormatError``.

    The ``.npy`` header is read and checked first - 1-D ``<u4``, as many elements as
    ``documents`` when given, and exactly ``4 x`` that many bytes after the header - and
    only then is the array made, as a view of ``data``: ``np.load`` would allocate whatever
    shape a header declares (2^40 elements: a 4 TiB ``MemoryError``) before noticing that
    the file is 40 bytes long."""
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(buf)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(buf)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError, EOFError, SyntaxError) as e:
        raise ShardFormatError(f"{url}: not a valid .npy lengths file ({e}); rebuild the "
                               f"mix") from None
    if dtype != np.dtype("<u4") or len(shape) != 1:
        raise ShardFormatError(f"{url}: expected a 1-D <u4 array, got {dtype} {shape}; "
                               f"rebuild the mix")
    n = int(shape[0])
    if documents is not None and n != documents:
        raise ShardFormatError(f"{url}: {n:,} lengths, expected {documents:,}; rebuild the "
                               f"mix")
    body = len(data) - buf.tell()
    if body != 4 * n:
        raise ShardFormatError(f"{url}: its header declares {n:,} lengths ({4 * n:,} bytes) "
                               f"but {body:,} bytes follow it; the file is damaged, rebuild "
                               f"the mix")
    return np.frombuffer(data, dtype="<u4", count=n, offset=buf.tell())


def lengths_digest(lengths: np.ndarray) -> str:
    """A shard's ``lengths_content``: SHA-256 (hex) of its document lengths as uint32 LE."""
    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<u4").data).hexdigest()


def _numpy_view(a: pa.Array, dtype: type) -> np.ndarray:
    """A null-free fixed-width Arrow array as a numpy view of its data buffer (what
    ``to_numpy`` gives, without the pandas import ``to_numpy`` triggers)."""
    return np.frombuffer(a.buffers()[1], dtype=dtype, count=len(a),
                         offset=a.offset * np.dtype(dtype).itemsize)


def list_parts(col: pa.ChunkedArray | pa.ListArray, url: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """A ``tokens`` column as (flat uint32 values, int64 offsets from 0): document d is
    ``values[offsets[d]:offsets[d + 1]]``; zero-copy. A null anywhere is a format error."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if len(arr) == 0:
        return np.zeros(0, np.uint32), np.zeros(1, np.int64)
    if arr.null_count or arr.values.null_count:
        raise ShardFormatError(f"{url}: the tokens column holds nulls; shards never do "
                               f"(rebuild the shard with build-mix)")
    offsets = _numpy_view(arr.offsets, np.int32).astype(np.int64)
    values = _numpy_view(arr.values, np.uint32)
    return values[offsets[0]:offsets[-1]], offsets - offsets[0]


def _tokens_of(col: pa.ChunkedArray | pa.ListArray, url: str) -> list[np.ndarray]:
    values, offsets = list_parts(col, url)
    return [values[offsets[i]:offsets[i + 1]].copy() for i in range(len(offsets) - 1)]


def decode_group(pf: pq.ParquetFile, url: str, group: int | None,
                 columns: Sequence[str] | None = None, use_threads: bool = False) -> pa.Table:
    """Row group ``group`` (None: the whole file) decoded; damaged data - a flipped byte
    that zstd or the page decoder refuses - is a ``ShardFormatError`` naming the file.
    (Readers check content, not bytes, so a damaged file reaches the decoder.)"""
    cols = None if columns is None else list(columns)
    try:
        if group is None:
            return pf.read(columns=cols, use_threads=use_threads)
        return pf.read_row_group(group, columns=cols, use_threads=use_threads)
    except (pa.ArrowException, OSError) as e:
        where = "" if group is None else f" row group {group}"
        raise ShardFormatError(f"{url}:{where} cannot be decoded ({e}); the file is damaged - "
                               f"run `open1b-data verify` on the mix, then restore or "
                               f"rebuild it") from None


def read_documents(url: str, indices: Sequence[int], columns: Sequence[str] = (
        "tokens", "doc_id", "input", "row")) -> list[ShardRow]:
    """The given documents (tokens and provenance), reading only the row groups that hold
    them; columns left out of ``columns`` come back empty (``""``, -1)."""
    got: dict[int, ShardRow] = {}
    with _open(url) as (pf, info):
        starts = np.concatenate([[0], np.cumsum(info.row_group_rows)])
        wanted: dict[int, list[int]] = {}
        for i in indices:
            if not 0 <= int(i) < info.documents:
                raise ShardFormatError(f"{url}: document {i} out of range "
                                       f"[0, {info.documents})")
            g = int(np.searchsorted(starts, int(i), side="right") - 1)
            wanted.setdefault(g, []).append(int(i))
        for g, idx in wanted.items():
            # One small row group: Arrow's thread pool costs more than it saves here.
            t = decode_group(pf, url, g, columns)
            docs = _tokens_of(t.column("tokens"), url)
            n = len(docs)
            ids = t.column("doc_id").to_pylist() if "doc_id" in columns else [""] * n
            inputs = t.column("input").to_pylist() if "input" in columns else [""] * n
            rows = t.column("row").to_pylist() if "row" in columns else [-1] * n
            for i in idx:
                k = i - int(starts[g])
                got[i] = ShardRow(docs[k], ids[k], inputs[k], rows[k])
    return [got[int(i)] for i in indices]


def read_rows(url: str, indices: Sequence[int]) -> list[np.ndarray]:
    """Token arrays of the given documents, reading only the row groups that hold them."""
    return [d.tokens for d in read_documents(url, indices, ("tokens",))]


def read_document(url: str, index: int) -> np.ndarray:
    """Token ids of document ``index`` (reads one row group)."""
    return read_rows(url, [index])[0]


def iter_documents(url: str) -> Iterator[ShardRow]:
    """Every document in row order, one row group at a time; checks the token count."""
    seen = 0
    with _open(url) as (pf, info):
        for g in range(len(info.row_group_rows)):
            t = decode_group(pf, url, g)
            toks = _tokens_of(t.column("tokens"), url)
            for arr, doc_id, inp, row in zip(toks, t.column("doc_id").to_pylist(),
                                             t.column("input").to_pylist(),
                                             t.column("row").to_pylist()):
                seen += arr.size
                yield ShardRow(arr, doc_id, inp, row)
    if seen != info.tokens:
        raise ShardFormatError(f"{url}: metadata says {info.tokens} tokens, rows hold {seen}")
