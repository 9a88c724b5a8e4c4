"""Checked reads: the stream never serves a document the manifest does not vouch for, and
vouches by content. An edited shard (valid Parquet: one token, doc_id, input or row
changed), a flipped byte, an edited mixview.json and an edited seek index are refused or
ignored, naming the document; a shard rewritten with other writer settings and another
writer string is served exactly as before."""
import hashlib
import io
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from open1b_data.formats.shards import read_shard_info
from open1b_data.errors import ManifestError, Open1bDataError, StreamError
from open1b_data.stream import seekindex
from open1b_data.stream.loader import StreamLoader
from open1b_data.stream.mixview import summary_of
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.windows import WindowReader
from testkit.rewrite import edit_shard, rewrite_shard
from testkit.s2mix import token_mix


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """An untouched mix to compare with; each test edits its own copy."""
    return token_mix(str(tmp_path_factory.mktemp("pristine")))


@pytest.fixture
def mix(tmp_path):
    return token_mix(str(tmp_path / "mix"))


def first_segment(mix):
    """(path of the shard holding window 0's first document, that document, a position)."""
    plan = StreamPlan.open(mix)
    seg = plan.segments_range(0, 1)
    s, h, d, a = (int(x[0]) for x in (seg.source, seg.shard, seg.doc, seg.doc_start))
    return plan.view.url(plan.view.sources[s].shard_paths[h]), d, a


def change_one_token(path, doc, pos):
    """Rewrite the shard as valid Parquet (same schema, metadata and counts) with one token
    of ``doc`` changed - what a careless or malicious edit looks like."""
    t = pq.ParquetFile(path).read()      # (read_table would import pandas: 1 s)
    toks = t.column("tokens").to_pylist()
    toks[doc][pos] = (toks[doc][pos] + 1) % 512
    meta = {k: v for k, v in pq.read_metadata(path).metadata.items() if k != b"ARROW:schema"}
    t = t.set_column(0, "tokens", pa.array(toks, type=pa.list_(pa.uint32())))
    t = t.replace_schema_metadata(meta)
    pq.write_table(t, path, compression="zstd")
    assert read_shard_info(path).documents == len(toks)     # its own checks still pass


def readers(mix):
    return (WindowReader(StreamPlan.open(mix)),
            WindowReader(StreamPlan.open(mix), whole_shards=False))


def test_edited_token_is_refused_everywhere(mix, pristine):
    path, doc, pos = first_segment(mix)
    change_one_token(path, doc, pos)
    for reader in readers(mix):
        with pytest.raises(ManifestError) as e:
            reader.window_tokens(0)
        msg = str(e.value)
        assert f"{path} row {doc} (doc_id " in msg and "Merkle root" in msg
        assert "open1b-data verify" in msg
    with pytest.raises(ManifestError, match="open1b-data verify"):
        next(iter(StreamLoader(mix, rank=0, world=1)))
    # the untouched mix serves these windows
    assert WindowReader(StreamPlan.open(pristine)).window_tokens(0).shape == (129,)


@pytest.mark.parametrize("column, edit", [("doc_id", lambda v: v + "x"),
                                          ("input", lambda v: "other/" + v),
                                          ("row", lambda v: v + 1)])
def test_edited_provenance_is_refused_naming_the_document(mix, column, edit):
    path, doc, _ = first_segment(mix)
    edit_shard(path, doc, column, edit)
    for reader in readers(mix):
        with pytest.raises(ManifestError, match=f"{path} row {doc} "):
            reader.window_tokens(0)


@pytest.mark.parametrize("settings", [
    dict(row_group_size=7, compression="zstd", compression_level=19),
    dict(row_group_size=1000, compression="snappy", use_dictionary=False,
         write_statistics=False, data_page_version="2.0", version="2.4"),
    dict(compression="none", created_by="parquet-cpp-arrow version 18.1.0"),
])
def test_shards_rewritten_by_another_writer_read_the_same(mix, pristine, settings):
    """Every shard written again with other writer settings (and another writer string):
    its bytes differ, its content does not - read, served and verified as before."""
    from open1b_data.formats.manifest import load_manifest
    from open1b_data.ingest.verify import verify

    before = {}
    for _, sh in load_manifest(mix).shards():
        path = os.path.join(mix, sh.path)
        before[path] = hashlib.sha256(open(path, "rb").read()).digest()
        rewrite_shard(path, **settings)
        assert hashlib.sha256(open(path, "rb").read()).digest() != before[path]
    want = WindowReader(StreamPlan.open(pristine)).windows(0, 80)
    for reader in readers(mix):
        assert np.array_equal(reader.windows(0, 80), want)
    assert np.array_equal(next(iter(StreamLoader(mix, rank=0, world=1)))["input_ids"],
                          next(iter(StreamLoader(pristine, rank=0, world=1)))["input_ids"])
    assert [p for p in verify(mix) if not p.startswith("tokenizer.json")] == []  # none here
    assert load_manifest(mix).fingerprint == load_manifest(pristine).fingerprint


def test_flipped_byte_is_a_clean_error(mix, pristine):
    path, _, _ = first_segment(mix)
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 3] ^= 0x40
    open(path, "wb").write(bytes(raw))
    with pytest.raises(Open1bDataError, match=path):
        WindowReader(StreamPlan.open(mix)).window_tokens(0)
    # random access proves the documents it serves: the damaged one, or none
    want = WindowReader(StreamPlan.open(pristine)).windows(0, 40)
    try:
        got = WindowReader(StreamPlan.open(mix), whole_shards=False).windows(0, 40)
    except Open1bDataError as e:
        assert path in str(e)
    else:
        assert np.array_equal(got, want)


def test_cli_names_the_edited_shard_in_one_line(mix):
    from open1b_data.cli.stream import stream_at

    path, doc, pos = first_segment(mix)
    change_one_token(path, doc, pos)
    res = CliRunner().invoke(stream_at, [mix, "--window", "0", "--json"])
    assert res.exit_code == 1 and res.exception.__class__ is SystemExit
    assert res.output.startswith("Error: shard ") and path in res.output
    assert res.output.count("\n") == 1


def test_a_file_edited_after_its_check_is_not_served(mix, pristine):
    reader = WindowReader(StreamPlan.open(mix), whole_shards=False)
    ref = WindowReader(StreamPlan.open(pristine)).windows(0, 3)
    assert np.array_equal(reader.windows(0, 3), ref)
    path, doc, pos = first_segment(mix)
    change_one_token(path, doc, pos)
    # this reader keeps the documents it proved; a new one checks the file again
    assert np.array_equal(reader.windows(0, 3), ref)
    with pytest.raises(ManifestError):
        WindowReader(StreamPlan.open(mix), whole_shards=False).windows(0, 3)


def test_mixview_json_with_another_seed_is_never_used(mix, pristine):
    from open1b_data.formats.manifest import load_manifest

    # the cache file as earlier versions wrote and trusted it: keyed by the manifest bytes
    raw = open(os.path.join(mix, "manifest.json"), "rb").read()
    summary = summary_of(load_manifest(mix))
    summary["definition"] = {**summary["definition"], "seed": 7}
    os.makedirs(os.path.join(mix, "stream"), exist_ok=True)
    with open(os.path.join(mix, "stream", "mixview.json"), "w") as f:
        json.dump({"format": "open1b-stream-mixview/1",
                   "manifest_sha256": hashlib.sha256(raw).hexdigest(), "summary": summary}, f)
    plan = StreamPlan.open(mix)
    assert plan.seed == 42
    assert np.array_equal(WindowReader(plan).windows(0, 60),
                          WindowReader(StreamPlan.open(pristine)).windows(0, 60))


def forge(mix, every, edit):
    """Rewrite the seek index's arrays with ``edit`` and re-sign its header, as a forger
    with write access to the mix would."""
    jpath, npath = seekindex.paths(mix, 42, every)
    with np.load(npath, allow_pickle=False) as z:
        arrays = {k: z[k].copy() for k in ("draw", "offset", "consumed")}
    edit(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    open(npath, "wb").write(buf.getvalue())
    header = json.load(open(jpath))
    header["npz_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    json.dump(header, open(jpath, "w"))


def test_seek_index_cursors_are_checked(mix):
    seekindex.ensure(StreamPlan.open(mix, use_index=False), windows=330, every=64)
    ref = StreamPlan.open(mix, use_index=False).segments_range(200, 210)
    honest = StreamPlan.open(mix)
    assert honest.index is not None
    assert np.array_equal(honest.segments_range(200, 210).doc, ref.doc)

    def move_a_count(a):        # entry 3: one document counted to another source
        a["consumed"][3, 0] -= 1
        a["consumed"][3, 2] += 1
    forge(mix, 64, move_a_count)
    plan = StreamPlan.open(mix)
    assert plan.index is not None           # it passes the structural checks...
    with pytest.raises(StreamError, match="entry 3 .* edited or corrupted"):
        plan.segments_range(200, 210)       # ...but not the replay from entry 2

    def unbalanced(a):
        a["draw"][2] += 1
    forge(mix, 64, unbalanced)
    assert StreamPlan.open(mix).index is None     # refused on load: not used, warned


def test_object_store_urls_are_read_and_checked_the_same_way(pristine):
    import fsspec

    fs = fsspec.filesystem("memory")
    for root, _, files in os.walk(pristine):
        for f in files:
            p = os.path.join(root, f)
            fs.pipe("/checked/" + os.path.relpath(p, pristine), open(p, "rb").read())
    ref = WindowReader(StreamPlan.open(pristine)).windows(0, 40)
    for whole in (True, False):
        got = WindowReader(StreamPlan.open("memory://checked"), whole_shards=whole)
        assert np.array_equal(got.windows(0, 40), ref)
    path, _, _ = first_segment(pristine)
    fs.pipe("/checked/" + os.path.relpath(path, pristine), b"PAR1" + b"\0" * 64)
    with pytest.raises(Open1bDataError, match="memory://checked/"):
        WindowReader(StreamPlan.open("memory://checked")).windows(0, 40)
