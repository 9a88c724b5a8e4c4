"""The Stack v2-style code: CPython's Lib/ and Include/ files as Stack v2 metadata rows
(Parquet) plus a gzip content store addressed by git blob id."""
from __future__ import annotations

import gzip
import hashlib
import os

import pyarrow as pa

from demo_corpus.records import INCLUDE, STDLIB, git_blob_sha1, split_even, write_parquet

DEMO_MAX_BYTES = 130_000  # the demo's stack-v2 size limit (demo.toml); 2 files exceed it
NO_LICENSE = ("antigravity.py", "keyword.py", "this.py")  # relabelled to exercise the filter

STACK_SCHEMA = pa.schema([
    ("blob_id", pa.string()), ("directory_id", pa.string()), ("path", pa.string()),
    ("content_id", pa.string()), ("detected_licenses", pa.list_(pa.string())),
    ("license_type", pa.string()), ("repo_name", pa.string()), ("snapshot_id", pa.string()),
    ("revision_id", pa.string()), ("branch_name", pa.string()),
    ("visit_date", pa.timestamp("ns")), ("revision_date", pa.timestamp("ns")),
    ("committer_date", pa.timestamp("ns")), ("github_id", pa.int64()),
    ("star_events_count", pa.int64()), ("fork_events_count", pa.int64()),
    ("gha_license_id", pa.string()), ("gha_event_created_at", pa.timestamp("ns")),
    ("gha_created_at", pa.timestamp("ns")), ("gha_language", pa.string()),
    ("src_encoding", pa.string()), ("language", pa.string()), ("is_vendor", pa.bool_()),
    ("is_generated", pa.bool_()), ("length_bytes", pa.int64()), ("extension", pa.string()),
])


def stack_files() -> dict[str, list[tuple[str, str, str]]]:
    """language -> [(absolute file, repo path, src_encoding)]."""
    lib = sorted(f for f in os.listdir(STDLIB) if f.endswith(".py"))
    py, budget = [], 650_000
    for f in lib:
        size = os.path.getsize(os.path.join(STDLIB, f))
        if f in ("_pydecimal.py", "turtle.py") or f in NO_LICENSE or (
                size <= DEMO_MAX_BYTES and budget > 0):
            py.append((os.path.join(STDLIB, f), f"Lib/{f}", "UTF-8"))
            budget -= size if size <= DEMO_MAX_BYTES else 0
    for f, enc in (("module_iso_8859_1.py", "ISO-8859-1"), ("module_koi8_r.py", "KOI8-R")):
        py.append((os.path.join(STDLIB, "test", "encoded_modules", f),
                   f"Lib/test/encoded_modules/{f}", enc))
    c, budget = [], 150_000
    for f in sorted(os.listdir(INCLUDE)):
        if f.endswith(".h") and budget > 0:
            c.append((os.path.join(INCLUDE, f), f"Include/{f}", "UTF-8"))
            budget -= os.path.getsize(os.path.join(INCLUDE, f))
    css = [(os.path.join(STDLIB, "pydoc_data", "_pydoc.css"), "Lib/pydoc_data/_pydoc.css",
            "UTF-8")]
    return {"Python": py, "C": c, "CSS": css}


def make_stack(out: str) -> int:
    store = os.path.join(out, "the-stack-v2", "content")
    os.makedirs(store, exist_ok=True)
    total = 0
    for language, files in stack_files().items():
        rows = []
        for src, path, enc in files:
            with open(src, "rb") as f:
                data = f.read()
            data.decode(enc)  # the label must be true
            blob = git_blob_sha1(data)
            with open(os.path.join(store, blob), "wb") as f:
                f.write(gzip.compress(data, compresslevel=9, mtime=0))
            name = path.rsplit("/", 1)[-1]
            rows.append({
                "blob_id": blob, "directory_id": None, "path": "/" + path,
                "content_id": hashlib.sha1(data).hexdigest(),
                "detected_licenses": [] if name in NO_LICENSE else ["PSF-2.0"],
                "license_type": "no_license" if name in NO_LICENSE else "permissive",
                "repo_name": "python/cpython", "snapshot_id": None, "revision_id": None,
                "branch_name": "refs/tags/v3.11.7", "visit_date": None, "revision_date": None,
                "committer_date": None, "github_id": None, "star_events_count": None,
                "fork_events_count": None, "gha_license_id": None,
                "gha_event_created_at": None, "gha_created_at": None,
                "gha_language": language, "src_encoding": enc, "language": language,
                "is_vendor": False, "is_generated": False, "length_bytes": len(data),
                "extension": name.rsplit(".", 1)[-1],
            })
            total += len(data)
        parts = split_even(rows, 2 if len(rows) > 40 else 1)
        for i, part in enumerate(parts):
            write_parquet(os.path.join(out, "the-stack-v2", "data", language,
                                       f"train-{i:05d}-of-{len(parts):05d}.parquet"),
                          pa.Table.from_pylist(part, schema=STACK_SCHEMA))
    return total
