"""manifest.json: round trip, fingerprint sensitivity, path confinement, verify."""
from __future__ import annotations

import json

import numpy as np
import pytest

from open1b_data.build import manifest as mf
from open1b_data.build.verify import verify
from open1b_data.errors import ManifestError
from open1b_data.build.definition import ShardSpec
from open1b_data.build.shards import ShardWriter
from open1b_data.storage import sha256_of

DEFINITION = {"name": "t", "seed": 42, "window": 17, "sources": []}


def _build(root, n_docs=40, tokens_per_shard=200):
    """A real mix directory: two sources of real shards, a tokenizer file, a manifest."""
    rng = np.random.default_rng(7)
    sources = []
    for name in ("alpha", "beta"):
        w = ShardWriter(f"{root}/{name}/shard-00000", name,
                        ShardSpec(tokens_per_shard=tokens_per_shard, docs_per_row_group=4))
        for i in range(n_docs):
            w.add(rng.integers(0, 128_256, size=int(rng.integers(1, 20)), dtype=np.uint32),
                  f"{name}-{i}", "in.jsonl", i)
        sources.append(mf.make_source_entry(name, "dclm", 0.5, w.close(),
                                            {"read": n_docs + 1, "kept": n_docs,
                                             "dropped": {"empty": 1}},
                                            [{"path": "in.jsonl", "size": 10, "sha256": "0" * 64}],
                                            0))
    (root / "tokenizer.json").write_bytes(b'{"tok": 1}')
    tok = {"path": "tokenizer.json", "sha256": sha256_of(str(root / "tokenizer.json")),
           "vocab_size": 128_256, "eot_id": 0, "sample": {}}
    m = mf.assemble_manifest("t", "0.1.0", DEFINITION, tok, sources)
    mf.write_manifest(str(root), m)
    return m


def test_round_trip_and_accessors(tmp_path):
    m = _build(tmp_path)
    back = mf.load_manifest(str(tmp_path))
    assert back == m
    assert mf.load_manifest(str(tmp_path / "manifest.json")) == m
    assert (back.seed, back.window) == (42, 17)
    assert back.source("beta").documents == 40
    assert back.totals["tokens"] == sum(s.tokens for s in back.sources)
    assert back.source("alpha").token_share == round(back.source("alpha").tokens
                                                      / back.totals["tokens"], 6)
    assert len(back.source("alpha").shards) > 1  # the shard cut happened
    with pytest.raises(ManifestError, match="gamma"):
        back.source("gamma")
    # Writing the same manifest twice gives the same bytes.
    first = (tmp_path / "manifest.json").read_bytes()
    mf.write_manifest(str(tmp_path), back)
    assert (tmp_path / "manifest.json").read_bytes() == first
    assert verify(str(tmp_path)) == []


def test_fingerprint_changes_with_one_hash(tmp_path):
    m = _build(tmp_path)
    d = m.to_dict()
    assert mf.fingerprint(d) == m.fingerprint
    for key in ("sha256",):
        e = json.loads(json.dumps(d))
        e["sources"][1]["shards"][0][key] = "f" * 64
        assert mf.fingerprint(e) != m.fingerprint
    e = json.loads(json.dumps(d))
    e["sources"][0]["shards"][-1]["lengths"]["sha256"] = "e" * 64
    assert mf.fingerprint(e) != m.fingerprint
    e = json.loads(json.dumps(d))
    e["definition"]["seed"] = 43
    assert mf.fingerprint(e) != m.fingerprint
    # Key order does not matter: the fingerprint is over canonical JSON.
    assert mf.fingerprint(dict(reversed(list(d.items())))) == m.fingerprint


def test_edited_manifest_is_rejected(tmp_path):
    _build(tmp_path)
    path = tmp_path / "manifest.json"
    d = json.loads(path.read_text())
    d["sources"][0]["shards"][0]["lengths"]["sha256"] = "a" * 64
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="fingerprint"):
        mf.load_manifest(str(tmp_path))
    d["version"] = 2
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="format/version"):
        mf.load_manifest(str(tmp_path))
    path.write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        mf.load_manifest(str(tmp_path))
    path.unlink()
    with pytest.raises(ManifestError, match="does not exist"):
        mf.load_manifest(str(tmp_path))


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x.parquet", "a/../../x", "a\\b.parquet",
                                 "s3://b/k", "C:/x", "a//b", "./a", ""])
def test_escaping_paths_rejected(tmp_path, bad):
    with pytest.raises(ManifestError):
        mf.check_path(bad)
    with pytest.raises(ManifestError):
        mf.resolve(str(tmp_path), bad)
    # ... also when they come from a manifest file whose fingerprint is otherwise valid.
    m = _build(tmp_path)
    d = m.to_dict()
    d["sources"][0]["shards"][0]["path"] = bad
    d["fingerprint"] = mf.fingerprint(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="path"):
        mf.load_manifest(str(tmp_path))


def test_resolve_confined(tmp_path):
    assert mf.resolve("s3://bucket/mix/", "a/b.parquet") == "s3://bucket/mix/a/b.parquet"
    assert mf.resolve(str(tmp_path), "a/b") == f"{tmp_path}/a/b"


def test_verify_names_each_mismatch(tmp_path):
    m = _build(tmp_path)
    shard = m.source("alpha").shards[0]
    p = tmp_path / shard.path
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01  # flip one bit in the middle of the shard
    p.write_bytes(bytes(data))
    lengths = m.source("beta").shards[1].lengths_path
    (tmp_path / lengths).unlink()
    problems = verify(str(tmp_path))
    assert any(shard.path in x and "sha256 differs" in x for x in problems), problems
    assert any(lengths in x and "missing file" in x for x in problems), problems
    assert len(problems) == 2, problems
    (tmp_path / "tokenizer.json").write_bytes(b"{}")
    assert any("tokenizer.json: sha256 differs" in x for x in verify(str(tmp_path)))


def test_verify_names_count_mismatch(tmp_path):
    m = _build(tmp_path)
    d = m.to_dict()
    d["sources"][0]["shards"][0]["documents"] += 1  # hashes still match the files
    d["sources"][0]["documents"] += 1
    d["fingerprint"] = mf.fingerprint(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    problems = verify(str(tmp_path))
    path = d["sources"][0]["shards"][0]["path"]
    lpath = d["sources"][0]["shards"][0]["lengths"]["path"]
    assert [p.split(":")[0] for p in problems] == [path, lpath], problems
    assert all("count differs" in p for p in problems)
