"""The three ingest filters: each a pure predicate with its reason, at its boundaries, and
applied by the readers at the right moment (Stack v2 before any content fetch)."""
from __future__ import annotations

import gzip
import hashlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from open1b_data.ingest.document import Document, Dropped
from open1b_data.ingest.filters import (
    content_filters, edu_score, empty, license_allowed, metadata_fields, metadata_filters, size,
)
from open1b_data.formats.definition import FilterSpec, load_mix
from open1b_data.ingest.sources import list_inputs, read_input

MIX = load_mix("manifests/mix-0626.toml")


def spec_of(name: str):
    return MIX.source(name)


@pytest.mark.parametrize("text", ["", " ", "\t\r\n", "\u3000\u00a0\u2028\u2009", "\x1c\x1f\x0b\x0c",
                                  "\n" * 10_000])
def test_empty_drops_whitespace_only(text):
    assert empty(text) == "empty"
    assert content_filters(FilterSpec(drop_empty=True), text) == "empty"


@pytest.mark.parametrize("text", ["a", " x ", "\u200b", "\ufeff", "\x00", ".", "0"])
def test_empty_keeps_any_non_whitespace(text):
    # U+200B ZERO WIDTH SPACE and U+FEFF are not whitespace by str.isspace: kept.
    assert empty(text) is None
    assert text.strip() != ""


def test_drop_empty_false_keeps_empty():
    assert content_filters(FilterSpec(drop_empty=False), "  ") is None


def test_edu_score_boundary():
    assert edu_score(2, 3) == "edu_score_below_min"
    assert edu_score(2.999, 3) == "edu_score_below_min"
    assert edu_score(3, 3) is None
    assert edu_score(5, 3) is None
    assert edu_score(float("nan"), 3) == "edu_score_below_min"


def test_license_exact_match():
    assert license_allowed("permissive", ("permissive",)) is None
    assert license_allowed("no_license", ("permissive",)) == "license_not_allowed"
    assert license_allowed("Permissive", ("permissive",)) == "license_not_allowed"


def test_size_boundary():
    assert size(1_000_000, 1_000_000) is None
    assert size(1_000_001, 1_000_000) == "too_large"
    assert size(0, 1_000_000) is None


def test_mix_0626_filters_name_fields_and_thresholds():
    fw = spec_of("fineweb-edu").filters
    assert (fw.score_field, fw.min_score) == ("int_score", 3)
    st = spec_of("the-stack-v2").filters
    assert (st.license_field, st.license_allowed) == ("license_type", ("permissive",))
    assert (st.size_field, st.max_bytes) == ("length_bytes", 1_000_000)
    assert all(s.filters.drop_empty for s in MIX.sources)
    assert metadata_fields(spec_of("dclm-baseline").filters) == {}
    assert set(metadata_fields(st)) == {"license_type", "length_bytes"}


def test_metadata_filters_order_license_before_size():
    st = spec_of("the-stack-v2").filters
    rec = {"license_type": "no_license", "length_bytes": 2_000_000}
    assert metadata_filters(st, rec) == "license_not_allowed"
    assert (metadata_filters(st, {"license_type": "permissive", "length_bytes": 2_000_000})
        == "too_large")
    assert metadata_filters(st, {"license_type": "permissive", "length_bytes": 10}) is None


# --- applied by the readers, with Mix 0626's filter specs --------------------------------

def _with_root(name, root, **kw):
    import dataclasses
    return dataclasses.replace(spec_of(name), root=str(root), **kw)


def test_fineweb_reader_int_score_boundary(tmp_path):
    rows = [{"text": f"doc {s}", "id": f"<urn:uuid:{s}>", "int_score": s, "score": s + 0.1}
            for s in (0, 2, 3, 4, 5)]
    rows.append({"text": " \n ", "id": "<urn:uuid:e>", "int_score": 3, "score": 3.0})
    (tmp_path / "data" / "CC-MAIN-2024-10").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows),
                   tmp_path / "data" / "CC-MAIN-2024-10" / "000_00000.parquet")
    spec = _with_root("fineweb-edu", tmp_path)
    [inp] = list_inputs(spec)
    out = list(read_input(spec, inp))
    assert [getattr(r, "reason", "kept") for r in out] == [
        "edu_score_below_min", "edu_score_below_min", "kept", "kept", "kept", "empty"]
    assert [r.row for r in out] == list(range(6))
    assert out[1].detail == "int_score=2 < 3.0"


def _git_sha1(b: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


def test_stack_reader_filters_before_fetch(tmp_path):
    """License and size drop rows whose blobs are absent from the store: had the reader
    fetched them, they would count as missing_blob, not as the filter's reason."""
    store = tmp_path / "content"
    store.mkdir()
    kept_body = b"print('kept')\n"
    rows = []
    for i, (lic, n) in enumerate([("permissive", 1_000_000), ("permissive", 1_000_001),
                                  ("no_license", 10), ("permissive", len(kept_body))]):
        body = kept_body if i == 3 else b"x" * 8 + bytes([i])
        blob = _git_sha1(body)
        if i in (0, 3):  # only rows that pass the filters have content in the store
            (store / blob).write_bytes(gzip.compress(body, mtime=0))
        rows.append({"blob_id": blob, "license_type": lic, "length_bytes": n,
                     "src_encoding": "UTF-8", "path": f"/f{i}.py"})
    (tmp_path / "data" / "Python").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows),
                   tmp_path / "data" / "Python" / "train-00000-of-00001.parquet")
    spec = _with_root("the-stack-v2", tmp_path,
                      content_store=str(store) + "/{blob_id}")
    [inp] = list_inputs(spec)
    out = list(read_input(spec, inp))
    assert [getattr(r, "reason", "kept") for r in out] == [
        "kept", "too_large", "license_not_allowed", "kept"]
    assert isinstance(out[3], Document) and out[3].text == "print('kept')\n"
    assert out[3].doc_id == rows[3]["blob_id"]
    assert isinstance(out[1], Dropped) and "1000001 > 1000000" in out[1].detail
