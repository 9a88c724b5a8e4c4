"""``open1b-audit fetch-step``: one step's windows from a mix, fetched document by document
and proved against the shards' Merkle roots. The rebuilt windows must be the stream's
(``stream-at`` sha256s), the data digest what a training run logs (a real run's
``steps.jsonl``, and ``statehash.data_digest`` over the stream's windows), the bytes read
exactly the footers, row groups and proof nodes of the shards the step touches - over a
loopback S3 server too - and a document changed in a shard, manifest untouched, is refused
by name with nothing reported."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from open1b_audit.cli import main as audit_cli
from open1b_audit.fetch import fetch_step
from open1b_data.formats import merkle
from open1b_data.formats.manifest import load_manifest
from open1b_data.errors import ProofError
from open1b_train import runlog, statehash
from tests.formats.test_merkle import rewrite_shard, strip_roots
from tests.formats.test_s3 import s3_endpoint  # noqa: F401  (the loopback S3 server)

STEPS = (1, 70, 140)
BUCKET = "fetch-step-test"     # one step in each phase of the demo schedule (8, 16, 32 windows)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    from open1b_data.formats.definition import default_mix_path, load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = tmp_path_factory.mktemp("demo") / "mix"
    build_mix(load_mix(default_mix_path()), str(out), BuildOptions(workers=1, progress=False))
    return str(out)


def _stream_at(mix: str, step: int) -> dict:
    from open1b_data.cli import main

    res = CliRunner().invoke(main, ["stream-at", mix, "--step", str(step), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _stream_windows(rep: dict) -> tuple[list[int], list[str], np.ndarray]:
    ws = sorted(rep["windows"], key=lambda w: w["window"])
    return ([w["window"] for w in ws], [w["sha256"] for w in ws],
            np.array([w["tokens"] for w in ws], dtype=np.uint32))


def _expected_reads(mix: str, data) -> dict[str, int]:
    """Footer, row-group and an upper bound on proof bytes for the documents ``data`` used,
    from the shards' local footers: what reading only those row groups costs."""
    m = load_manifest(mix)
    rows: dict[tuple[str, int], set[int]] = {}
    for d in data.documents:
        rows.setdefault((d.source, d.shard), set()).add(d.row)
    footers = groups = proofs = 0
    for (source, shard), docs in rows.items():
        entry = m.source(source).shards[shard]
        md = pq.ParquetFile(f"{mix}/{entry.path}").metadata
        footers += 8 + md.serialized_size
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        for g in {int(np.searchsorted(starts, r, side="right")) - 1 for r in docs}:
            groups += sum(md.row_group(g).column(c).total_compressed_size
                          for c in range(md.num_columns))
        depth = len(merkle.level_sizes(entry.documents))
        proofs += 32 + 32 * len(docs) * (depth + 1)
    return {"footers": footers, "row_groups": groups, "proofs": proofs}


def test_fetched_windows_are_the_streams_and_reads_are_only_the_needed_row_groups(demo):
    m = load_manifest(demo)
    for step in STEPS:
        data = fetch_step(demo, step)
        windows, shas, tokens = _stream_windows(_stream_at(demo, step))
        assert list(data.windows) == windows
        assert list(data.window_sha256) == shas
        assert np.array_equal(data.tokens, tokens)
        # what the trainer logs for these windows (its digest of the loader's tensors)
        want = statehash.data_digest(windows, statehash.window_digests(
            torch.from_numpy(tokens.astype(np.int64))))
        assert data.data_digest == want
        got = data.bytes_fetched
        expect = _expected_reads(demo, data)
        assert got["footers"] == expect["footers"]
        assert got["row_groups"] == expect["row_groups"]
        assert 0 < got["proofs"] <= expect["proofs"]
        assert got["manifest"] == len(Path(demo, "manifest.json").read_bytes())
        assert got["total"] == sum(v for k, v in got.items() if k != "total")
        assert data.mix_bytes == sum(sh.bytes for _, sh in m.shards())
        touched = sum(m.source(s).shards[h].bytes
                      for s, h in {(d.source, d.shard) for d in data.documents})
        # demo shards are 1-3 row groups of 64 documents, so a step reads a good part of
        # each shard it touches - but never a whole one, and a small part of the mix
        assert got["row_groups"] < touched
        assert got["total"] < 0.2 * data.mix_bytes, got


def test_data_digest_is_the_one_a_training_run_logged(mix4, ref_run):
    lines = runlog.read(ref_run)
    for line in lines[1:]:
        data = fetch_step(mix4, line["step"])
        assert data.data_digest == line["components"]["data"], line["step"]


def test_cli_human_json_and_out(demo, tmp_path):
    res = CliRunner().invoke(audit_cli, ["fetch-step", demo, "--step", "3"])
    assert res.exit_code == 0, res.output
    assert ("data digest" in res.output and "proved against its shard's Merkle root"
            in res.output and "of the mix's" in res.output)
    out = tmp_path / "out"
    res = CliRunner().invoke(audit_cli, ["fetch-step", demo, "--step", "3", "--json",
                                         "--out", str(out)])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    windows, shas, tokens = _stream_windows(_stream_at(demo, 3))
    assert [w["sha256"] for w in rep["windows"]] == shas and rep["verified"] is True
    assert np.array_equal(np.load(out / "windows.npy", allow_pickle=False), tokens)
    saved = json.loads((out / "step.json").read_text())
    assert saved["data_digest"] == rep["data_digest"]
    d = saved["proved_documents"][0]          # the saved proofs verify on their own
    proof = merkle.Proof(d["proof"]["leaf_index"], d["proof"]["tree_size"],
                         tuple(bytes.fromhex(h) for h in d["proof"]["siblings"]))
    assert merkle.verify(merkle.leaf_hash(d["doc"], np.array(d["tokens"], np.uint32),
                                          d["doc_id"], d["input"], d["input_row"]), proof,
                         bytes.fromhex(d["root"]))
    res = CliRunner().invoke(audit_cli, ["fetch-step", demo, "--step", "100000"])
    assert res.exit_code == 1 and "past the end of the schedule" in res.output
    assert len(res.output.strip().splitlines()) == 1


def _copy(demo: str, dst: Path) -> Path:
    shutil.copytree(demo, dst, ignore=shutil.ignore_patterns("_work"))
    return dst


def test_a_changed_document_or_tree_is_refused_by_name(demo, tmp_path):
    honest = fetch_step(demo, 5)
    victim = next(d for d in reversed(honest.documents) if d.tokens.size)
    mix = _copy(demo, tmp_path / "doc")
    rewrite_shard(f"{demo}/{victim.shard_path}", str(mix / victim.shard_path), victim.row)
    with pytest.raises(ProofError) as e:
        fetch_step(str(mix), 5)
    msg = str(e.value)
    assert f"{victim.source} {victim.shard_path} row {victim.row}" in msg
    assert repr(victim.doc_id) in msg and "does not match its shard's Merkle root" in msg

    mix = _copy(demo, tmp_path / "tree")
    entry = load_manifest(demo).source(victim.source).shards[victim.shard]
    tree = mix / entry.merkle.path
    raw = bytearray(tree.read_bytes())
    level, j = merkle.path_nodes(victim.row, entry.documents)[0]   # the first sibling
    raw[merkle.node_offset(entry.documents, level, j)] ^= 1
    tree.write_bytes(bytes(raw))
    with pytest.raises(ProofError, match="cannot be proved: the tree file"):
        fetch_step(str(mix), 5)

    mix = _copy(demo, tmp_path / "old")
    strip_roots(mix)
    res = CliRunner().invoke(audit_cli, ["fetch-step", str(mix), "--step", "5"])
    assert res.exit_code == 1 and "has no Merkle root" in res.output


@pytest.mark.s3
@pytest.mark.slow   # ~6 s: a moto server, the demo mix uploaded, two fetches
def test_fetch_step_over_s3_reads_little_and_refuses_a_tampered_shard(demo, s3_endpoint,  # noqa: F811
                                                                       tmp_path):
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    # moto keeps its buckets in process-wide state, across servers: a bucket of our own,
    # removed at the end, so later S3 tests in this process start from an empty store
    fs.mkdir(BUCKET)
    try:
        _over_s3(fs, f"s3://{BUCKET}/demo", demo, tmp_path)
    finally:
        fs.rm(BUCKET, recursive=True)


def _over_s3(fs, url: str, demo: str, tmp_path: Path) -> None:
    fs.put(str(_copy(demo, tmp_path / "up")) + "/", f"{url[5:]}/", recursive=True)
    step = 70
    res = CliRunner().invoke(audit_cli, ["fetch-step", url, "--step", str(step), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    windows, shas, _ = _stream_windows(_stream_at(demo, step))
    assert [w["window"] for w in rep["windows"]] == windows
    assert [w["sha256"] for w in rep["windows"]] == shas
    local = fetch_step(demo, step)
    assert rep["data_digest"] == local.data_digest
    assert rep["bytes_fetched"] == local.bytes_fetched     # the same reads, over S3
    assert rep["fraction"] < 0.2
    print(f"\nstep {step}: {rep['documents']} documents from {rep['shards']} shards, "
          f"{rep['bytes_fetched']['total']:,} of {rep['mix_bytes']:,} bytes "
          f"({rep['fraction']:.1%}) in {rep['requests']} requests: {rep['bytes_fetched']}")

    victim = next(d for d in local.documents if d.tokens.size)
    rewrite_shard(f"{demo}/{victim.shard_path}", str(tmp_path / "tampered.parquet"),
                  victim.row)
    fs.put_file(str(tmp_path / "tampered.parquet"), f"{url[5:]}/{victim.shard_path}")
    res = CliRunner().invoke(audit_cli, ["fetch-step", url, "--step", str(step), "--json"])
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "data_digest" not in res.output, res.output
    assert f"{victim.source} {victim.shard_path} row {victim.row}" in lines[0]
    assert repr(victim.doc_id) in lines[0]
