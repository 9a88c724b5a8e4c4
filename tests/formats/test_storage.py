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


# --- failures named: storage_errors.translate ------------------------------------------
# Stand-ins named like the backends' classes: translate recognises them by name, so the
# test needs neither botocore nor a network.

class NoCredentialsError(Exception):
    pass


class EndpointConnectionError(Exception):
    pass


class OfflineModeIsEnabled(ConnectionError):
    pass


@pytest.mark.parametrize("exc, url, kind, words", [
    (NoCredentialsError("Unable to locate credentials"), "s3://b/k", "StorageError",
     ("cannot read s3://b/k", "no credentials", "AWS_ACCESS_KEY_ID", "FSSPEC_S3_ENDPOINT_URL")),
    (EndpointConnectionError('Could not connect to "http://127.0.0.1:9/b/k"'), "s3://b/k",
     "StorageError", ("no network or a wrong endpoint", "127.0.0.1:9", "AWS_ENDPOINT_URL")),
    (OfflineModeIsEnabled("offline"), "hf://datasets/x/y", "StorageError",
     ("offline mode is on", "HF_HUB_OFFLINE")),
    (FileNotFoundError(2, "No such file or directory"), "hf://datasets/x/y",
     "FileMissingError", ("does not exist", "HF_TOKEN")),
    (PermissionError(13, "Permission denied"), "/data/x", "FileAccessError",
     ("cannot read /data/x: permission denied", "permissions")),
    (PermissionError(13, "Access Denied"), "s3://b/k", "FileAccessError",
     ("access denied", "AWS_PROFILE")),
    (OSError(28, "No space left on device"), "/data/x", "FileAccessError",
     ("No space left on device",)),
])
def test_translate_names_url_reason_and_setting(exc, url, kind, words):
    from open1b_data import errors
    from open1b_data.storage_errors import translate

    err = translate(exc, url, "read")
    assert type(err).__name__ == kind and isinstance(err, errors.Open1bDataError)
    for w in words:
        assert w in str(err), (w, str(err))
    assert "\n" not in str(err)
    # An outage must stop a build; only a file's own failure may count as bad data.
    assert isinstance(err, OSError) == (kind != "StorageError")


def test_translate_leaves_bugs_and_own_errors_alone():
    from open1b_data.errors import BuildError
    from open1b_data.storage_errors import failures, translate

    assert translate(ValueError("a bug"), "/x", "read") is None
    assert translate(BuildError("ours"), "/x", "read") is None
    with pytest.raises(KeyError):
        with failures("/x", "read"):
            raise KeyError("a bug")


def test_local_failures_name_the_path(tmp_path):
    from open1b_data.errors import FileAccessError, FileMissingError

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FileMissingError, match=f"cannot read {tmp_path}/absent: it does not"):
        storage.read_bytes(str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError):          # still what callers catch for absence
        storage.read_bytes(str(tmp_path / "absent"))
    with pytest.raises(FileAccessError, match=f"{blocker} is a file, not a directory"):
        storage.read_bytes(str(blocker / "x"))
    with pytest.raises(FileAccessError, match=f"{blocker} is a file, a directory is needed"):
        storage.atomic_write_bytes(str(blocker / "x"), b"data")
    with pytest.raises(FileAccessError, match="is a directory, expected a file"):
        storage.atomic_write_bytes(str(tmp_path), b"data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # no debris, nothing lost
    with pytest.raises(FileMissingError, match=f"cannot list {tmp_path}/nowhere"):
        storage.list_files(str(tmp_path / "nowhere"), ["*"])
