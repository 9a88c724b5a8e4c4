"""manifest.json: round trip, fingerprint sensitivity, path confinement, verify."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from open1b_data.formats import manifest as mf
from open1b_data.formats import mixpath
from open1b_data.ingest.verify import verify
from open1b_data.errors import ManifestError
from open1b_data.formats.definition import ShardSpec
from open1b_data.formats.shards import ShardWriter
from open1b_data.formats.tokenizerfile import content_digest
from open1b_data.storage import sha256_of

DEFINITION = {"name": "t", "seed": 42, "window": 17, "sources": []}
TOKENIZER = b'{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}'


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
    (root / "tokenizer.json").write_bytes(TOKENIZER)
    tok = {"path": "tokenizer.json", "sha256": sha256_of(str(root / "tokenizer.json")),
           "content": content_digest("tokenizer.json", TOKENIZER),
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


def test_fingerprint_is_content_not_file_records(tmp_path):
    m = _build(tmp_path)
    d = m.to_dict()
    assert mf.fingerprint(d) == m.fingerprint

    def edited(edit):
        e = json.loads(json.dumps(d))
        edit(e)
        return mf.fingerprint(e)
    first = lambda e: e["sources"][1]["shards"][0]           # noqa: E731
    # records of this copy's files: not the mix's identity
    for edit in (lambda e: first(e).update(sha256="f" * 64, bytes=1),
                 lambda e: first(e).update(path="elsewhere/x.parquet"),
                 lambda e: first(e)["lengths"].update(path="elsewhere/x.npy"),
                 lambda e: first(e)["merkle"].update(sha256="f" * 64, path="t/x.merkle"),
                 lambda e: e["tokenizer"].update(sha256="f" * 64, path="other.json"),
                 lambda e: e.update(builder_version="9.9.9"),
                 lambda e: e["sources"][0]["inputs"][0].update(size=11, sha256="1" * 64)):
        assert edited(edit) == m.fingerprint
    # content: every one changes it
    for edit in (lambda e: first(e)["lengths"].update(content="e" * 64),
                 lambda e: first(e)["merkle"].update(root="e" * 64),
                 lambda e: first(e).update(tokens=first(e)["tokens"] + 1),
                 lambda e: first(e).update(heldout=[0]),
                 lambda e: e["tokenizer"].update(content="e" * 64),
                 lambda e: e["tokenizer"].update(eot_id=1),
                 lambda e: e["sources"][0]["inputs"][0].update(path="other.jsonl"),
                 lambda e: e["sources"][0]["counts"]["dropped"].update(empty=2),
                 lambda e: e["sources"][0].update(target_share=0.25)):
        assert edited(edit) != m.fingerprint
    e = json.loads(json.dumps(d))
    e["definition"]["seed"] = 43
    assert mf.fingerprint(e) != m.fingerprint
    # Key order does not matter: the fingerprint is over canonical JSON.
    assert mf.fingerprint(dict(reversed(list(d.items())))) == m.fingerprint


def test_edited_manifest_is_rejected(tmp_path):
    _build(tmp_path)
    path = tmp_path / "manifest.json"
    d = json.loads(path.read_text())
    d["sources"][0]["shards"][0]["lengths"]["content"] = "a" * 64
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="fingerprint"):
        mf.load_manifest(str(tmp_path))
    d["version"] = 1
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="version 1, whose fingerprint covered the bytes"):
        mf.load_manifest(str(tmp_path))
    d["version"] = 3
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
        mixpath.check_path(bad)
    with pytest.raises(ManifestError):
        mixpath.resolve(str(tmp_path), bad)
    # ... also when they come from a manifest file whose fingerprint is otherwise valid.
    m = _build(tmp_path)
    d = m.to_dict()
    d["sources"][0]["shards"][0]["path"] = bad
    d["fingerprint"] = mf.fingerprint(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="path"):
        mf.load_manifest(str(tmp_path))


def _edited(tmp_path, edit) -> None:
    """The built manifest with ``edit(dict)`` applied and its fingerprint recomputed, so
    only the field checks can refuse it."""
    d = _build(tmp_path).to_dict()
    edit(d)
    d["fingerprint"] = mf.fingerprint(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["tokenizer"].pop("eot_id"), r"tokenizer\.eot_id: missing"),
    (lambda d: d["tokenizer"].update(eot_id=-1), r"tokenizer\.eot_id: must be >= 0"),
    (lambda d: d["definition"].update(window=0), r"definition\.window: must be >= 1, got 0"),
    (lambda d: d["definition"].update(seed=2**64), r"definition\.seed: must be < 2\^64"),
    (lambda d: d["definition"].update(seed="42"), r"definition\.seed: expected int"),
])
def test_fields_the_stream_relies_on_are_checked(tmp_path, edit, match):
    _edited(tmp_path, edit)
    with pytest.raises(ManifestError, match=match):
        mf.load_manifest(str(tmp_path))


def test_not_a_built_mix_says_what_to_pass(tmp_path):
    toml = tmp_path / "mix.toml"
    toml.write_text("[mix]\n")
    with pytest.raises(ManifestError, match=f"{toml} is a mix definition, not a built mix; "
                                            f"build it with `open1b-data build-mix --manifest"):
        mf.load_manifest(str(toml))
    other = tmp_path / "notes.txt"
    other.write_text("x")
    with pytest.raises(ManifestError, match=f"{other} is a file, not a built mix"):
        mf.load_manifest(str(other))
    with pytest.raises(ManifestError, match=f"{tmp_path}/manifest.json does not exist"):
        mf.load_manifest(str(tmp_path))
    with pytest.raises(ManifestError, match="does not exist"):     # verify: an error too,
        verify(str(tmp_path))                                     # not a "mismatch"
    (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ManifestError, match="nests too deeply"):
        mf.load_manifest(str(tmp_path))


def _confined(rel: str) -> bool:
    """The confinement rules as the module docstring states them, one by one."""
    return (bool(rel) and "\\" not in rel and "://" not in rel and not rel.startswith("/")
        and not re.match(r"[A-Za-z]:", rel) and all(ord(c) >= 32 for c in rel)
        and all(part not in ("", ".", "..") for part in rel.split("/")))


def test_check_path_fast_path_keeps_every_refusal():
    """check_path accepts with one regex; on 20,000 random paths over the characters that
    matter it accepts exactly what the rules accept, and every refusal names its specific
    reason (never the fallback that would mean the regex and the rules disagree)."""
    rng = np.random.default_rng(0)
    alphabet = list("ab.C:/\\ ") + ["\x00", "\x1f", "\x7f", "é", "s3://", "..", "/"]
    picks = rng.integers(0, len(alphabet), size=(20_000, 8)).tolist()
    sizes = rng.integers(0, 9, size=20_000).tolist()
    refusals = set()
    for pick, size in zip(picks, sizes):
        rel = "".join(alphabet[i] for i in pick[:size])
        try:
            assert mixpath.check_path(rel) == rel and _confined(rel), rel
        except ManifestError as e:
            assert not _confined(rel), rel
            assert "is not a confined path" not in str(e), (rel, str(e))
            refusals.add(str(e).split("' ", 1)[-1].split(";")[0])
    assert len(refusals) >= 5, refusals        # every kind of refusal was exercised
    for ok in ("a/b.parquet", "src/shard-00000-00000.lengths.npy", "...", ".x/..y", "é/ü"):
        assert mixpath.check_path(ok) == ok


def test_fast_shard_parse_agrees_with_the_checked_one(tmp_path):
    """The straight-line parse of a shard entry gives the same entry when every check
    passes, and leaves every bad entry to from_dict, which refuses it."""
    good = _build(tmp_path).to_dict()["sources"][0]["shards"][0]
    assert mf._fast_shard(good) == mf.ShardEntry.from_dict(good)
    bad_values = {"path": ["../x", "/x", "a\\b", "", 3, None], "sha256": ["A" * 64, "0" * 63, 1],
                  "bytes": [-1, True, 1.0, "1"], "documents": [-1, False, None],
                  "tokens": [-5, 2.5], "lengths.path": ["a//b", "C:x"],
                  "lengths.content": ["g" * 64, None]}
    for field, values in bad_values.items():
        for v in values:
            d = json.loads(json.dumps(good))
            node, key = (d["lengths"], field[8:]) if field.startswith("lengths.") else (d, field)
            node[key] = v
            assert mf._fast_shard(d) is None, (field, v)
            with pytest.raises(ManifestError, match=key):
                mf.ShardEntry.from_dict(d)
    for missing in ("path", "sha256", "bytes", "documents", "tokens", "lengths"):
        d = {k: v for k, v in good.items() if k != missing}
        assert mf._fast_shard(d) is None
        with pytest.raises(ManifestError, match=f"{missing}: missing"):
            mf.ShardEntry.from_dict(d)
    assert mf._fast_shard([good]) is None


def test_resolve_confined(tmp_path):
    assert mixpath.resolve("s3://bucket/mix/", "a/b.parquet") == "s3://bucket/mix/a/b.parquet"
    assert mixpath.resolve(str(tmp_path), "a/b") == f"{tmp_path}/a/b"


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
    assert any(x.startswith(shard.path) for x in problems), problems
    assert any(lengths in x and "missing file" in x for x in problems), problems
    assert len(problems) == 2, problems
    (tmp_path / "tokenizer.json").write_bytes(b'{"model": {"type": "BPE", "vocab": {"b": 0}}}')
    assert any("tokenizer.json: content differs" in x for x in verify(str(tmp_path)))
    (tmp_path / "tokenizer.json").write_bytes(b"{}")
    assert any(x.startswith("tokenizer.json: ") for x in verify(str(tmp_path)))


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
