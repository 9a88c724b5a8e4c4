"""fsspec helpers: line splitting at every chunk boundary, compressed streams by suffix,
truncation detection, atomic writes."""
from __future__ import annotations

import gzip
import os

import pytest
import zstandard

from open1b_data import storage

LINES = [b"", b"alpha", b"\xce\xb2\xce\xb5\xcf\x84\xce\xb1", b"", b"x" * 50, b"last"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".jsonl.zstd", ".jsonl.gz"])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 64, 1 << 20])
def test_iter_lines_any_chunking(tmp_path, suffix, chunk):
    data = b"\n".join(LINES) + b"\n"
    enc = {".jsonl": lambda d: d, ".jsonl.gz": lambda d: gzip.compress(d, mtime=0)}.get(
        suffix, lambda d: zstandard.ZstdCompressor().compress(d))
    p = tmp_path / ("f" + suffix)
    p.write_bytes(enc(data))
    assert list(storage.iter_lines(str(p), chunk=chunk)) == LINES
    p.write_bytes(enc(data[:-1]))  # no final newline: same lines
    assert list(storage.iter_lines(str(p), chunk=chunk)) == LINES


def test_compression_by_suffix():
    assert storage.compression_of("s3://b/shard_1_processed.jsonl.zstd") == "zstd"
    assert storage.compression_of("a/b.jsonl.ZST") == "zstd"
    assert storage.compression_of("a/b.gz") == "gzip"
    assert storage.compression_of("a/b.parquet") is None


def test_truncated_gzip_and_zstd_raise_after_good_chunks(tmp_path):
    data = os.urandom(1 << 16).hex().encode()  # 128 KiB, incompressible-ish text
    for name, comp in (("a.gz", lambda d: gzip.compress(d, mtime=0)),
                       ("a.zst", lambda d: zstandard.ZstdCompressor().compress(d))):
        p = tmp_path / name
        blob = comp(data)
        p.write_bytes(blob[: len(blob) * 3 // 4])
        got = bytearray()
        with pytest.raises(storage.TruncatedInputError):
            for chunk in storage.open_stream(str(p), chunk=4096):
                got += chunk
        assert data.startswith(bytes(got))


def test_multi_frame_zstd_and_multi_member_gzip(tmp_path):
    c = zstandard.ZstdCompressor()
    (tmp_path / "m.zst").write_bytes(c.compress(b"one\n") + c.compress(b"two\n"))
    assert list(storage.iter_lines(str(tmp_path / "m.zst"))) == [b"one", b"two"]
    (tmp_path / "m.gz").write_bytes(gzip.compress(b"one\n") + gzip.compress(b"two\n"))
    assert list(storage.iter_lines(str(tmp_path / "m.gz"))) == [b"one", b"two"]


def test_corrupt_zstd_raises_corrupt(tmp_path):
    (tmp_path / "c.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\xff" * 64)
    with pytest.raises(storage.CorruptInputError):
        list(storage.open_stream(str(tmp_path / "c.zst")))


def test_atomic_writer_all_or_nothing(tmp_path):
    target = tmp_path / "sub" / "out.bin"
    storage.atomic_write_bytes(str(target), b"first")
    with pytest.raises(RuntimeError):
        with storage.atomic_writer(str(target)) as f:
            f.write(b"half written")
            raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"first"
    assert sorted(os.listdir(target.parent)) == ["out.bin"]  # no temp file left behind
    storage.atomic_write_bytes(str(target), b"second")
    assert target.read_bytes() == b"second"


def test_list_files_patterns_dedup_and_order(tmp_path):
    for rel in ("b/2.txt", "a/1.txt", "a/sub/3.txt", "c.bin"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(rel.encode())
    got = storage.list_files(str(tmp_path), ["*/*.txt", "a/*.txt", "**/3.txt"])
    assert [f.path for f in got] == ["a/1.txt", "a/sub/3.txt", "b/2.txt"]
    assert got[0].size == 7 and got[0].url == str(tmp_path / "a" / "1.txt")


def test_checksum_of_object_stores():
    import hashlib

    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/bkt/a.bin", b"payload")
    sha = hashlib.sha256(b"payload").hexdigest()
    # HF LFS files publish the sha256 of their bytes; S3 publishes an ETag; else hash.
    assert storage.checksum_of(fs, "/bkt/a.bin", {"lfs": {"sha256": "ab" * 32}}) == "ab" * 32
    assert storage.checksum_of(fs, "/bkt/a.bin", {"ETag": '"0123"'}) == "etag:0123"
    assert storage.checksum_of(fs, "/bkt/a.bin", {}) == sha
    [info] = storage.list_files("memory://bkt", ["*.bin"])
    assert (info.path, info.size, info.checksum) == ("a.bin", 7, sha)
    assert storage.read_bytes(info.url) == b"payload"
