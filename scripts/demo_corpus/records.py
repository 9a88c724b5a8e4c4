"""What every upstream format of the demo corpus shares: deterministic ids and digests,
and the two file writers (zstd JSON lines, zstd Parquet) with fixed settings, so that a
rerun with the same versions writes the same bytes."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import sysconfig
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

STDLIB = sysconfig.get_paths()["stdlib"]
INCLUDE = sysconfig.get_paths()["include"]
ZSTD_LEVEL = 19


def det_uuid(key: str) -> str:
    """A stable UUID (RFC 4122 layout, version 4 bits) from SHA-256 of ``key``."""
    return str(uuid.UUID(bytes=hashlib.sha256(key.encode()).digest()[:16], version=4))


def sha1_b32(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode()


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def zstd_jsonl(path: str, records: list[dict]) -> None:
    data = b"".join(json.dumps(r, ensure_ascii=False, sort_keys=False).encode() + b"\n"
                    for r in records)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data))


def write_parquet(path: str, table: pa.Table) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path, compression="zstd", compression_level=ZSTD_LEVEL,
                   row_group_size=256)


def split_even(items: list, parts: int) -> list[list]:
    n = len(items)
    return [items[i * n // parts:(i + 1) * n // parts] for i in range(parts)]


def words(text: str) -> int:
    return len(text.split())
