"""Token shards: round trip, random access, byte determinism, format checks."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from open1b_data.errors import ShardFormatError
from open1b_data.formats.definition import ShardSpec
from open1b_data.formats.shards import (ShardWriter, iter_documents, read_document, read_lengths,
                                read_rows, read_shard_info)

SPEC = ShardSpec(tokens_per_shard=2000, docs_per_row_group=16, zstd_level=3)


def _docs(n=400, seed=0):
    rng = np.random.default_rng(seed)
    # Ids above 65,535 and up to 2^32-1 (uint32 is the point), including empty documents.
    return [rng.integers(0, 2**32, size=int(rng.integers(0, 30)), dtype=np.uint32)
            for _ in range(n)]


def _write(prefix, docs):
    w = ShardWriter(prefix, "src", SPEC)
    for i, t in enumerate(docs):
        w.add(t, f"<urn:uuid:{i}>", f"part-{i % 3}.jsonl.zstd", i)
    return w.close()


def test_round_trip_and_lengths(tmp_path):
    docs = _docs()
    entries = _write(f"{tmp_path}/src/shard-00003", docs)
    assert len(entries) > 2
    assert entries[0].path == "src/shard-00003-00000.parquet"
    assert entries[0].lengths_path == "src/shard-00003-00000.lengths.npy"
    assert all(e.tokens >= SPEC.tokens_per_shard for e in entries[:-1])
    got, start = [], 0
    for e in entries:
        url = f"{tmp_path}/{e.path}"
        assert hashlib.sha256((tmp_path / e.path).read_bytes()).hexdigest() == e.sha256
        info = read_shard_info(url)
        assert (info.source, info.documents, info.tokens) == ("src", e.documents, e.tokens)
        assert all(r == SPEC.docs_per_row_group for r in info.row_group_rows[:-1])
        lengths = read_lengths(f"{tmp_path}/{e.lengths_path}", e.documents)
        assert lengths.dtype == np.dtype("<u4")
        rows = list(iter_documents(url))
        assert [len(r.tokens) for r in rows] == lengths.tolist()
        assert [r.row for r in rows] == list(range(start, start + e.documents))
        assert rows[0].doc_id == f"<urn:uuid:{start}>"
        assert rows[0].input == f"part-{start % 3}.jsonl.zstd"
        got += [r.tokens for r in rows]
        start += e.documents
    assert len(got) == len(docs)
    assert all(np.array_equal(a, b) and a.dtype == np.uint32 for a, b in zip(got, docs))
    # Readable with plain pyarrow: the stored column type is list<uint32>.
    t = pq.read_table(f"{tmp_path}/{entries[0].path}")
    assert t.schema.field("tokens").type == pa.list_(pa.uint32())


def test_random_access_reads_one_row_group(tmp_path, monkeypatch):
    docs = _docs()
    entries = _write(f"{tmp_path}/src/shard-00000", docs)
    url = f"{tmp_path}/{entries[0].path}"
    read_groups = []
    orig = pq.ParquetFile.read_row_group

    def spy(self, i, *a, **k):
        read_groups.append(i)
        return orig(self, i, *a, **k)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    assert np.array_equal(read_document(url, 37), docs[37])
    assert read_groups == [37 // SPEC.docs_per_row_group]
    idx = [50, 3, 17, 3]
    assert all(np.array_equal(a, docs[i]) for a, i in zip(read_rows(url, idx), idx))
    with pytest.raises(ShardFormatError, match="out of range"):
        read_document(url, entries[0].documents)


def test_byte_identical_output(tmp_path):
    docs = _docs(seed=3)
    a = _write(f"{tmp_path}/a/src/shard-00000", docs)
    b = _write(f"{tmp_path}/b/src/shard-00000", docs)
    assert a == b  # same paths, hashes, sizes and counts
    for e in a:
        assert (tmp_path / "a" / e.path).read_bytes() == (tmp_path / "b" / e.path).read_bytes()
    assert not list(tmp_path.rglob(".tmp-*"))  # no temporaries left behind


def test_corrupt_and_foreign_files_raise(tmp_path):
    entries = _write(f"{tmp_path}/src/shard-00000", _docs(50))
    url = f"{tmp_path}/{entries[0].path}"
    # A truncated shard.
    bad = tmp_path / "trunc.parquet"
    bad.write_bytes((tmp_path / entries[0].path).read_bytes()[:-100])
    with pytest.raises(ShardFormatError, match="trunc.parquet"):
        read_document(str(bad), 0)
    # Not Parquet at all.
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"NOTAPARQUETFILE" * 10)
    with pytest.raises(ShardFormatError, match="junk.parquet"):
        read_shard_info(str(junk))
    # Valid Parquet but the wrong magic / a lying count.
    t = pq.read_table(url)
    meta = {k: v for k, v in pq.ParquetFile(url).metadata.metadata.items()
            if k != b"ARROW:schema"}
    assert meta[b"open1b.documents"] == str(entries[0].documents).encode()
    pq.write_table(t.replace_schema_metadata({**meta, b"open1b.format": b"other"}),
                   tmp_path / "magic.parquet")
    with pytest.raises(ShardFormatError, match="magic.parquet.*format/version"):
        read_shard_info(str(tmp_path / "magic.parquet"))
    pq.write_table(t.replace_schema_metadata({**meta, b"open1b.documents": b"999"}),
                   tmp_path / "count.parquet")
    with pytest.raises(ShardFormatError, match="count.parquet.*999"):
        read_document(str(tmp_path / "count.parquet"), 0)
    pq.write_table(t.replace_schema_metadata({**meta, b"open1b.tokens": b"1"}),
                   tmp_path / "tokens.parquet")
    with pytest.raises(ShardFormatError, match="tokens.parquet: metadata says 1 tokens"):
        list(iter_documents(str(tmp_path / "tokens.parquet")))
    # Nulls in the tokens column (a shard made by someone else): refused, never read as 0.
    toks = t.column("tokens").to_pylist()
    for name, bad_toks in (("nulldoc", [None] + toks[1:]),
                           ("nullid", [toks[0][:1] + [None] + toks[0][2:]] + toks[1:])):
        col = pa.array(bad_toks, pa.list_(pa.uint32()))
        pq.write_table(t.set_column(0, "tokens", col).replace_schema_metadata(meta),
                       tmp_path / f"{name}.parquet")
        with pytest.raises(ShardFormatError, match=f"{name}.parquet: the tokens column holds "
                                                   f"nulls"):
            read_document(str(tmp_path / f"{name}.parquet"), 0)
    # Lengths files: wrong dtype, not npy, wrong count.
    np.save(tmp_path / "l.npy", np.zeros(3, np.int64))
    with pytest.raises(ShardFormatError, match="l.npy"):
        read_lengths(str(tmp_path / "l.npy"))
    (tmp_path / "x.npy").write_bytes(b"garbage")
    with pytest.raises(ShardFormatError, match="x.npy"):
        read_lengths(str(tmp_path / "x.npy"))
    with pytest.raises(ShardFormatError, match="expected 7"):
        read_lengths(f"{tmp_path}/{entries[0].lengths_path}", 7)


def test_rejects_non_uint32_tokens(tmp_path):
    w = ShardWriter(f"{tmp_path}/src/shard-00000", "src", SPEC)
    with pytest.raises(ShardFormatError, match="uint32"):
        w.add(np.array([1, 2], dtype=np.int64), "a", "b", 0)
    assert w.close() == []  # nothing added: no shard
