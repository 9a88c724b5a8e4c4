"""Each reader on real-format fixtures built from the committed demo corpus, and every bad
input: each counted under its reason at its location, with the good records around it
still read."""
from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from open1b_data.ingest.document import Document, Dropped
from open1b_data.errors import BuildError
from open1b_data.formats.definition import load_mix
from open1b_data.ingest.sources import InputFile, list_inputs, read_input

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = load_mix(os.path.join(ROOT, "manifests", "demo.toml"))
DCLM_REL = "global-shard_01_of_10/local-shard_0_of_10/shard_00000000_processed.jsonl.zstd"


def kinds(records):
    return [r.reason if isinstance(r, Dropped) else "doc" for r in records]


def read_source(spec):
    return [r for inp in list_inputs(spec) for r in read_input(spec, inp)]


def only_input(spec):
    [inp] = list_inputs(spec)
    return inp


def git_sha1(b: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(b) + b).hexdigest()


def demo_dclm_lines() -> list[bytes]:
    with open(os.path.join(DEMO.source("dclm-baseline").root, DCLM_REL), "rb") as f:
        return zstandard.ZstdDecompressor().decompress(f.read()).splitlines()


def write_zstd(path, data: bytes, frames: int = 1) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    cut = [len(data) * i // frames for i in range(frames + 1)]
    c = zstandard.ZstdCompressor(level=3)
    with open(path, "wb") as f:
        for a, b in zip(cut, cut[1:]):
            f.write(c.compress(data[a:b]))


# --- the committed demo corpus through the real readers ----------------------------------

def test_demo_corpus_counts_are_pinned():
    """The committed corpus is fixed (golden hashes depend on it): pin what each reader
    makes of it. Regenerating manifests/demo must update these numbers deliberately."""
    want = {"dclm-baseline": {"doc": 859, "empty": 2},
            "fineweb-edu": {"doc": 675, "edu_score_below_min": 31},
            "the-stack-v2": {"doc": 66, "too_large": 2, "license_not_allowed": 3},
            "proof-pile-2": {"doc": 312}}
    for spec in DEMO.sources:
        recs = read_source(spec)
        assert dict(collections.Counter(kinds(recs))) == want[spec.name], spec.name
        docs = [r for r in recs if isinstance(r, Document)]
        assert len({(d.input, d.row) for d in docs}) == len(docs)
        assert all(d.text.strip() for d in docs)


def test_demo_ids_are_source_native():
    dclm = [r for r in read_source(DEMO.source("dclm-baseline")) if isinstance(r, Document)]
    assert all(d.doc_id.startswith("<urn:uuid:") for d in dclm)
    fw = [r for r in read_source(DEMO.source("fineweb-edu")) if isinstance(r, Document)]
    assert all(d.doc_id.startswith("<urn:uuid:") for d in fw)
    pp = [r for r in read_source(DEMO.source("proof-pile-2")) if isinstance(r, Document)]
    assert {d.doc_id.split(":", 1)[0] for d in pp} == {"arxiv", "open-web-math",
                                                        "algebraic-stack"}


def test_demo_stack_content_is_exact_and_decoded_with_src_encoding():
    spec = DEMO.source("the-stack-v2")
    meta = {}
    for inp in list_inputs(spec):
        for row in pq.read_table(inp.url).to_pylist():
            meta[row["blob_id"]] = row
    docs = [r for r in read_source(spec) if isinstance(r, Document)]
    for d in docs:
        raw = d.text.encode(meta[d.doc_id]["src_encoding"])
        assert git_sha1(raw) == d.doc_id  # the exact bytes of the blob, decoded
        assert len(raw) == meta[d.doc_id]["length_bytes"]
    koi8 = [d for d in docs if meta[d.doc_id]["src_encoding"] == "KOI8-R"]
    assert len(koi8) == 1 and any("\u0400" <= c <= "\u04ff" for c in koi8[0].text)


def test_list_inputs_sorted_relative_sizes_and_sha256():
    spec = DEMO.source("dclm-baseline")
    inputs = list_inputs(spec)
    assert [i.path for i in inputs] == sorted(i.path for i in inputs)
    assert inputs[0].path == DCLM_REL
    for i in inputs:
        with open(i.url, "rb") as f:
            data = f.read()
        assert i.size == len(data)
        assert i.checksum == hashlib.sha256(data).hexdigest()
        assert i.manifest_entry() == {"path": i.path, "size": i.size, "sha256": i.checksum}
    assert InputFile("a", "s3://b/a", 3, "etag:abc").manifest_entry() == {
        "path": "a", "size": 3, "etag": "abc"}


def test_list_inputs_config_errors_name_source(tmp_path):
    spec = dataclasses.replace(DEMO.source("dclm-baseline"), root=str(tmp_path))
    with pytest.raises(BuildError, match="dclm-baseline.*no file under"):
        list_inputs(spec)
    spec = dataclasses.replace(spec, root=str(tmp_path / "absent"))
    with pytest.raises(BuildError, match="does not exist"):
        list_inputs(spec)


# --- DCLM: every bad line, in place --------------------------------------------------------

def test_dclm_bad_lines_each_counted_and_neighbours_read(tmp_path):
    good = demo_dclm_lines()[:4]
    rec = json.loads(good[0])
    no_text = {k: v for k, v in rec.items() if k != "text"}
    no_id = dict(rec, metadata={k: v for k, v in rec["metadata"].items()
                                if k != "WARC-Record-ID"})
    lines = [
        good[0],
        b'{"text": "unterminated',                                   # malformed_json
        good[1].replace(b'"text": "', b'"text": "\xff\xfe', 1),       # invalid_utf8
        json.dumps(no_text).encode(),                                  # missing_field
        json.dumps(dict(rec, text=12345)).encode(),                    # wrong_type
        json.dumps(no_id).encode(),                                    # missing_field (nested)
        json.dumps(dict(rec, metadata="WARC")).encode(),               # wrong_type (nested)
        b"",                                                           # blank line
        b"[1, 2, 3]",                                                  # not an object
        json.dumps(dict(rec, text="bad \ud800 surrogate")).encode(),   # lone surrogate
        json.dumps(dict(rec, text="pair \ud83d\ude00 ok")).encode(),    # valid pair: kept
        json.dumps(dict(rec, text=" \u3000\n")).encode(),              # empty
        good[2],
        good[3] + b"\r",                                               # CRLF line: fine
    ]
    path = tmp_path / DCLM_REL
    write_zstd(str(path), b"\n".join(lines))  # no final newline: last line still read
    spec = dataclasses.replace(DEMO.source("dclm-baseline"), root=str(tmp_path))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["doc", "malformed_json", "invalid_utf8", "missing_field",
                          "wrong_type", "missing_field", "wrong_type", "malformed_json",
                          "malformed_json", "invalid_utf8", "doc", "empty", "doc", "doc"]
    assert [r.row for r in out] == list(range(len(lines)))
    assert all(r.input == DCLM_REL for r in out)
    assert out[0] == Document(rec["text"], rec["metadata"]["WARC-Record-ID"], DCLM_REL, 0)
    assert out[10].text == "pair \U0001F600 ok"
    assert out[13].text == json.loads(good[3])["text"]
    assert "'text'" in out[3].detail and "metadata.WARC-Record-ID" in out[5].detail
    assert "U+D800" in out[9].detail and "blank line" in out[7].detail


@pytest.mark.parametrize("frames", [1, 3])
def test_truncated_zstd_keeps_everything_before_the_cut(tmp_path, frames):
    lines = demo_dclm_lines()
    data = b"\n".join(lines) + b"\n"
    write_zstd(str(tmp_path / "full" / DCLM_REL), data, frames)
    blob = (tmp_path / "full" / DCLM_REL).read_bytes()
    cut = tmp_path / "cut" / DCLM_REL
    cut.parent.mkdir(parents=True)
    cut.write_bytes(blob[: len(blob) * 2 // 3])
    spec = dataclasses.replace(DEMO.source("dclm-baseline"), root=str(tmp_path / "cut"))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out)[-1] == "truncated_zstd"
    assert set(kinds(out)[:-1]) <= {"doc", "empty"} and len(out) > 10
    k = len(out) - 1
    assert out[-1].row == k and k < len(lines)  # the cut line, never a partial record
    full = list(read_input(dataclasses.replace(spec, root=str(tmp_path / "full")),
                           only_input(dataclasses.replace(spec, root=str(tmp_path / "full")))))
    assert out[:-1] == full[:k] and len(full) == len(lines)


def test_unreadable_and_empty_zstd_files(tmp_path):
    spec = dataclasses.replace(DEMO.source("dclm-baseline"), root=str(tmp_path))
    p = tmp_path / DCLM_REL
    p.parent.mkdir(parents=True)
    p.write_bytes(b"this is not zstd at all" * 10)
    [r] = list(read_input(spec, only_input(spec)))
    assert (r.reason, r.row, r.input) == ("unreadable_file", None, DCLM_REL)
    p.write_bytes(b"")
    [r] = list(read_input(spec, only_input(spec)))
    assert (r.reason, r.row) == ("truncated_zstd", 0)
    inp = only_input(spec)
    p.unlink()  # listed, then gone before it is read
    [r] = list(read_input(spec, inp))
    assert (r.reason, r.row) == ("unreadable_file", None) and "FileNotFound" in r.detail


# --- FineWeb-Edu: parquet rows ---------------------------------------------------------

def demo_fineweb_rows(n=6) -> list[dict]:
    inp = list_inputs(DEMO.source("fineweb-edu"))[0]
    rows = pq.read_table(inp.url).to_pylist()
    return [r for r in rows if r["int_score"] >= 3][:n]


def write_fineweb(root, table) -> None:
    d = root / "data" / "CC-MAIN-2024-10"
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, d / "000_00000.parquet", row_group_size=2)


def test_fineweb_bad_rows(tmp_path):
    rows = demo_fineweb_rows()
    rows[1]["text"] = None
    rows[3]["int_score"] = None
    table = pa.Table.from_pylist(rows)
    texts = [r["text"].encode() if r["text"] else None for r in rows]
    texts[4] = b"\xff" + texts[4]
    table = table.set_column(0, "text", pa.array(texts, pa.binary()).view(pa.string()))
    write_fineweb(tmp_path, table)
    spec = dataclasses.replace(DEMO.source("fineweb-edu"), root=str(tmp_path))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["doc", "missing_field", "doc", "missing_field", "invalid_utf8", "doc"]
    assert [r.row for r in out] == list(range(6))
    assert out[5] == Document(rows[5]["text"], rows[5]["id"], out[5].input, 5)
    assert "'int_score'" in out[3].detail and "'text'" in out[4].detail


def test_fineweb_missing_and_mistyped_columns(tmp_path):
    rows = demo_fineweb_rows(3)
    spec = dataclasses.replace(DEMO.source("fineweb-edu"), root=str(tmp_path))
    write_fineweb(tmp_path, pa.Table.from_pylist(rows).drop(["id"]))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["missing_field"] * 3 and "'id'" in out[0].detail
    write_fineweb(tmp_path, pa.Table.from_pylist([dict(r, int_score=str(r["int_score"]))
                                                  for r in rows]))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["wrong_type"] * 3 and "int_score" in out[0].detail
    write_fineweb(tmp_path, pa.Table.from_pylist([dict(r, int_score=True) for r in rows]))
    assert kinds(read_input(spec, only_input(spec))) == ["wrong_type"] * 3


def test_fineweb_corrupt_parquet_is_unreadable(tmp_path):
    write_fineweb(tmp_path, pa.Table.from_pylist(demo_fineweb_rows(4)))
    p = tmp_path / "data" / "CC-MAIN-2024-10" / "000_00000.parquet"
    p.write_bytes(p.read_bytes()[:-100])  # footer gone
    spec = dataclasses.replace(DEMO.source("fineweb-edu"), root=str(tmp_path))
    [r] = list(read_input(spec, only_input(spec)))
    assert (r.reason, r.row) == ("unreadable_file", None)


def test_fineweb_corrupt_row_group_drops_its_rows_only(tmp_path):
    rows = demo_fineweb_rows(8)
    d = tmp_path / "data" / "CC-MAIN-2024-10"
    d.mkdir(parents=True)
    p = d / "000_00000.parquet"
    # Plain pages with CRCs and without statistics, so the middle of the chunk is checked
    # compressed text.
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=2, compression="zstd",
                   use_dictionary=False, write_statistics=False, write_page_checksum=True)
    chunk = pq.ParquetFile(p).metadata.row_group(1).column(0)  # the text of rows 2-3
    blob = bytearray(p.read_bytes())
    mid = chunk.data_page_offset + chunk.total_compressed_size // 2
    blob[mid:mid + 32] = bytes(b ^ 0xFF for b in blob[mid:mid + 32])
    p.write_bytes(bytes(blob))
    spec = dataclasses.replace(DEMO.source("fineweb-edu"), root=str(tmp_path))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["doc", "doc", "unreadable_file", "unreadable_file",
                          "doc", "doc", "doc", "doc"]
    assert [r.row for r in out] == list(range(8))
    assert "row group 1" in out[2].detail
    assert [r.text for r in out[4:]] == [r["text"] for r in rows[4:]]


# --- The Stack v2: metadata rows + content store ---------------------------------------

def stack_fixture(tmp_path, n=8):
    spec = DEMO.source("the-stack-v2")
    table = pq.read_table(list_inputs(spec)[0].url)
    rows = [r for r in table.to_pylist() if r["license_type"] == "permissive"
            and r["length_bytes"] <= 130_000 and r["src_encoding"] == "UTF-8"][:n]
    store = tmp_path / "content"
    store.mkdir()
    src_store = os.path.dirname(spec.content_store)
    for r in rows:
        (store / r["blob_id"]).write_bytes(
            open(os.path.join(src_store, r["blob_id"]), "rb").read())
    return spec, rows, store, table.schema


def test_stack_bad_blobs_each_counted(tmp_path):
    spec, rows, store, schema = stack_fixture(tmp_path)
    originals = {r["blob_id"]: gzip.decompress((store / r["blob_id"]).read_bytes()).decode()
                 for r in rows}
    (store / rows[1]["blob_id"]).unlink()                                  # missing_blob
    (store / rows[2]["blob_id"]).write_bytes(b"plain bytes, not gzip")      # corrupt_blob
    gz = (store / rows[3]["blob_id"]).read_bytes()
    (store / rows[3]["blob_id"]).write_bytes(gz[: len(gz) // 2])           # cut gzip
    (store / rows[4]["blob_id"]).write_bytes(gzip.compress("ok é".encode("latin-1")))
    rows[5]["src_encoding"] = "no-such-codec"                              # unknown codec
    rows[6]["blob_id"] = "../../../etc/passwd"                             # not a blob id
    extra = dict(rows[0], src_encoding=None)                               # missing field
    rows.append(extra)
    d = tmp_path / "data" / "Python"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema),
                   d / "train-00000-of-00001.parquet")
    spec = dataclasses.replace(spec, root=str(tmp_path), content_store=str(store) + "/{blob_id}")
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["doc", "missing_blob", "corrupt_blob", "corrupt_blob",
                          "undecodable_content", "undecodable_content", "wrong_type", "doc",
                          "missing_field"]
    assert [r.row for r in out] == list(range(9))
    assert out[0].text == originals[rows[0]["blob_id"]] and out[0].doc_id == rows[0]["blob_id"]
    assert out[7].text == originals[rows[7]["blob_id"]]
    assert rows[1]["blob_id"] in out[1].detail
    assert "no-such-codec" in out[5].detail and "utf-8" in out[4].detail.lower()


def test_stack_mistyped_filter_column(tmp_path):
    spec, rows, store, _ = stack_fixture(tmp_path, 3)
    d = tmp_path / "data" / "Python"
    d.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([dict(r, length_bytes=str(r["length_bytes"]))
                                         for r in rows]), d / "train-00000-of-00001.parquet")
    spec = dataclasses.replace(spec, root=str(tmp_path), content_store=str(store) + "/{blob_id}")
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["wrong_type"] * 3 and "length_bytes" in out[0].detail


# --- Proof-Pile-2 ----------------------------------------------------------------------

def test_proof_pile_2_ids_and_truncation(tmp_path):
    lines = [
        {"text": "a", "meta": {"arxiv_id": "2105.01234", "url": "u"}},
        {"text": "b", "meta": json.dumps({"url": "https://x.org/p"})},
        {"text": "c", "meta": {"id": 7}},
        {"text": "d"},
        {"text": "e", "meta": [1]},
        {"meta": {"url": "no text"}},
    ]
    data = b"\n".join(json.dumps(x).encode() for x in lines) + b"\n"
    rel = "open-web-math/train/shard-0000.jsonl.zst"
    write_zstd(str(tmp_path / rel), data)
    spec = dataclasses.replace(DEMO.source("proof-pile-2"), root=str(tmp_path))
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out) == ["doc"] * 5 + ["missing_field"]
    assert [r.doc_id for r in out[:5]] == [
        "open-web-math:2105.01234", "open-web-math:https://x.org/p", "open-web-math:7",
        f"{rel}:3", f"{rel}:4"]
    # A zstd frame needs its last block: cutting the final bytes loses the whole block.
    (tmp_path / rel).write_bytes((tmp_path / rel).read_bytes()[:-3])
    out = list(read_input(spec, only_input(spec)))
    assert kinds(out)[-1] == "truncated_zstd"


# --- object storage: the same readers over s3:// (moto server on loopback) --------------

@pytest.fixture(scope="module")
def s3_env():
    from moto.server import ThreadedMotoServer
    import s3fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID",
                                            "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ENDPOINT_URL=f"http://{host}:{port}", AWS_ACCESS_KEY_ID="test",
                      AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem()
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.mark.s3
def test_readers_over_s3_match_local(s3_env):
    fs = s3_env
    fs.mkdir("demo")
    for name in ("dclm-baseline", "the-stack-v2", "fineweb-edu", "proof-pile-2"):
        fs.put(DEMO.source(name).root, f"demo/{name}", recursive=True)
    missing = None
    for name in ("dclm-baseline", "the-stack-v2", "fineweb-edu", "proof-pile-2"):
        local = DEMO.source(name)
        remote = dataclasses.replace(local, root=f"s3://demo/{name}")
        if name == "the-stack-v2":
            remote = dataclasses.replace(remote, content_store="s3://demo/the-stack-v2/content/"
                                                               "{blob_id}")
        inputs = list_inputs(remote)
        assert [i.path for i in inputs] == [i.path for i in list_inputs(local)]
        assert all(i.checksum.startswith("etag:") for i in inputs)
        assert read_source(remote) == read_source(local), name
        if name == "the-stack-v2":
            missing = next(r for r in read_source(remote) if isinstance(r, Document))
    fs.rm(f"demo/the-stack-v2/content/{missing.doc_id}")
    out = read_source(dataclasses.replace(
        DEMO.source("the-stack-v2"), root="s3://demo/the-stack-v2",
        content_store="s3://demo/the-stack-v2/content/{blob_id}"))
    gone = [r for r in out if isinstance(r, Dropped) and r.reason == "missing_blob"]
    assert [(g.input, g.row) for g in gone] == [(missing.input, missing.row)]
