"""Merkle trees of token shards: the definition (a pinned test vector, RFC 6962's recursive
definition for 1..70 leaves), proofs that fail on any wrong hash, the stored tree read by
ranges, the writer recording roots, ``verify`` catching a changed root, shard or tree, and
``stream-at --proof`` through the CLI."""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from open1b_data.formats import manifest as mf
from open1b_data.formats import merkle
from open1b_data.formats.definition import ShardSpec
from open1b_data.formats.shards import ShardWriter, iter_documents, read_document
from open1b_data.ingest.verify import verify
from open1b_data.errors import ShardFormatError
from tests.formats.test_manifest import _build

# docs/FORMATS.md "Merkle trees": three documents [1, 2, 3], [], [4294967295, 0] with
# provenance ("doc-0", "in.jsonl", 0), ("", "in.jsonl", 7), ("é", "x/y.parquet", 2^40)
VECTOR_DOCS = [[1, 2, 3], [], [4294967295, 0]]
VECTOR_PROVENANCE = [("doc-0", "in.jsonl", 0), ("", "in.jsonl", 7),
                     ("\u00e9", "x/y.parquet", 1 << 40)]
VECTOR_LEAVES = ["5c6870e32461380dc038f618c28093c8f89fc0dc93d35cc8ae2df2afd875eaec",
                 "bfa29ccdc0c0bb24654087e77a16e51d285982f8c1c51be6bc3a645526061790",
                 "5f4dc3b25562317cf330cdf8b1bd2e85a1e3ad707eb6733833a46b16650d398f"]
VECTOR_NODE_01 = "83b80784aa94f5f6ed4c24a52c7c57cc613d61dc42815d6e57929f08d2fef6d8"
VECTOR_ROOT = "794dbad5252fb71d7ac91481f38f61644c6973fda5cadc6dce32edcb6794e41b"


def _leaves(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [merkle.leaf_hash(i, rng.integers(0, 2**32, size=int(rng.integers(0, 9)),
                                             dtype=np.uint32), f"d{i}", "in", i)
            for i in range(n)]


def _leaf_of(i: int, doc) -> bytes:
    return merkle.leaf_hash(i, doc.tokens, doc.doc_id, doc.input, doc.row)


# RFC 6962 section 2.1, written as the RFC states it (recursive), independent of merkle.py.
def _mth(d: list[bytes]) -> bytes:
    if len(d) == 1:
        return d[0]
    k = 1 << (len(d) - 1).bit_length() - 1       # largest power of two < n
    return hashlib.sha256(b"\x01" + _mth(d[:k]) + _mth(d[k:])).digest()


def _path(m: int, d: list[bytes]) -> list[bytes]:
    if len(d) == 1:
        return []
    k = 1 << (len(d) - 1).bit_length() - 1
    return _path(m, d[:k]) + [_mth(d[k:])] if m < k else _path(m - k, d[k:]) + [_mth(d[:k])]


def test_vector_and_leaf_definition():
    leaves = [merkle.leaf_hash(i, np.array(d, dtype=np.uint32), *p)
              for i, (d, p) in enumerate(zip(VECTOR_DOCS, VECTOR_PROVENANCE))]
    assert [x.hex() for x in leaves] == VECTOR_LEAVES
    # the leaf as the format states it, byte by byte
    for i, (d, (doc_id, inp, row)) in enumerate(zip(VECTOR_DOCS, VECTOR_PROVENANCE)):
        a, b = doc_id.encode(), inp.encode()
        raw = (b"\x00" + struct.pack("<QQ", i, len(d))
               + b"".join(struct.pack("<I", t) for t in d)
               + struct.pack("<Q", len(a)) + a + struct.pack("<Q", len(b)) + b
               + struct.pack("<q", row))
        assert hashlib.sha256(raw).hexdigest() == VECTOR_LEAVES[i]
    # the bulk form gives the same leaves, on one thread or two
    flat = np.array([t for d in VECTOR_DOCS for t in d], dtype=np.uint32)
    offsets = np.cumsum([0] + [len(d) for d in VECTOR_DOCS])
    for threads in (1, 2):
        assert merkle.leaf_hashes(flat, offsets, *zip(*VECTOR_PROVENANCE),
                                  threads=threads) == leaves
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 300, 999)
    flat = rng.integers(0, 2**32, int(sizes.sum()), dtype=np.uint32)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    prov = ([f"d{k}" for k in range(999)], ["a", "b", "c"] * 333, list(range(999)))
    one = [merkle.leaf_hash(7 + k, flat[offsets[k]:offsets[k + 1]], *(p[k] for p in prov))
           for k in range(999)]
    assert merkle.leaf_hashes(flat, offsets, *prov, first=7, threads=2) == one
    tree = merkle.levels(leaves)
    assert tree[1][0].hex() == VECTOR_NODE_01
    assert tree[1][1] == leaves[2]               # the odd last leaf moves up unhashed
    assert merkle.root_of(tree).hex() == VECTOR_ROOT
    assert merkle.root_of(merkle.levels([])) == hashlib.sha256(b"").digest()
    # the leaf commits to the index, the length and each provenance field
    toks = np.array([1, 2, 3], np.uint32)
    for other in (merkle.leaf_hash(1, toks, "doc-0", "in.jsonl", 0),
                  merkle.leaf_hash(0, np.array([1, 2, 3, 0], np.uint32), "doc-0", "in.jsonl", 0),
                  merkle.leaf_hash(0, toks, "doc-1", "in.jsonl", 0),
                  merkle.leaf_hash(0, toks, "doc-0", "in.json", 0),
                  merkle.leaf_hash(0, toks, "doc-0", "in.jsonl", 1),
                  merkle.leaf_hash(0, toks, "doc-0i", "n.jsonl", 0)):   # framed, not glued
        assert other.hex() != VECTOR_LEAVES[0]


def test_tree_and_proofs_are_rfc6962_for_1_to_70_leaves():
    for n in range(1, 71):
        leaves = _leaves(n, seed=n)
        tree = merkle.levels(leaves)
        root = merkle.root_of(tree)
        assert root == _mth(leaves), n
        for i in range(n):
            p = merkle.prove(tree, i)
            assert list(p.siblings) == _path(i, leaves), (n, i)
            assert len(p.siblings) <= math.ceil(math.log2(n))
            assert merkle.verify(leaves[i], p, root)


def test_a_wrong_sibling_leaf_index_or_length_fails():
    for n in (1, 2, 3, 5, 8, 13, 70):
        leaves = _leaves(n, seed=100 + n)
        tree = merkle.levels(leaves)
        root = merkle.root_of(tree)
        for i in range(n):
            p = merkle.prove(tree, i)
            for k in range(len(p.siblings)):
                bad = list(p.siblings)
                bad[k] = bytes([bad[k][0] ^ 1]) + bad[k][1:]
                assert not merkle.verify(leaves[i], merkle.Proof(i, n, tuple(bad)), root)
            assert not merkle.verify(leaves[(i + 1) % n], p, root) or n == 1
            assert not merkle.verify(hashlib.sha256(leaves[i]).digest(), p, root)
            if n > 1:
                assert not merkle.verify(leaves[i], merkle.Proof((i + 1) % n, n, p.siblings),
                                         root)
            assert merkle.root_from_proof(leaves[i], merkle.Proof(
                i, n, p.siblings + (root,))) is None
            if p.siblings:
                assert merkle.root_from_proof(leaves[i], merkle.Proof(
                    i, n, p.siblings[:-1])) is None
            assert merkle.root_from_proof(leaves[i], merkle.Proof(n, n, p.siblings)) is None


def test_stored_tree_round_trips_and_serves_proofs_by_ranges():
    for n in (0, 1, 2, 3, 7, 64, 70):
        tree = merkle.levels(_leaves(n, seed=n))
        data = merkle.encode(tree)
        assert len(data) == merkle.file_size(n)
        assert merkle.decode(data, "t", n) == tree
        if n == 0:
            continue
        read = []

        def ranges(url, spans):
            read.extend(spans)
            return [data[a:b] for a, b in spans]

        got = merkle.read_proofs(ranges, "t", n, range(n))
        for i in range(n):
            assert got[i] == (tree[0][i], merkle.prove(tree, i))
        # one document: the header and at most its leaf and log2(n) siblings
        read.clear()
        merkle.read_proofs(ranges, "t", n, [n - 1])
        assert sum(b - a for a, b in read) <= 32 * (2 + math.ceil(math.log2(max(n, 2))))
    data = merkle.encode(merkle.levels(_leaves(5)))
    with pytest.raises(ShardFormatError, match="manifest says 6 documents"):
        merkle.decode(data, "t.merkle", 6)
    with pytest.raises(ShardFormatError, match="magic"):
        merkle.decode(b"x" * len(data), "t.merkle", 5)
    with pytest.raises(ShardFormatError, match="damaged"):
        merkle.decode(data[:-1], "t.merkle", 5)


def test_writer_records_each_shards_root_and_tree(tmp_path):
    rng = np.random.default_rng(3)
    w = ShardWriter(str(tmp_path / "s" / "shard-00000"), "s",
                    ShardSpec(tokens_per_shard=60, docs_per_row_group=3))
    for i in range(40):
        w.add(rng.integers(0, 50_000, size=int(rng.integers(0, 12)), dtype=np.uint32),
              f"d{i}", "in", i)
    entries = w.close()
    assert len(entries) > 2
    for e in entries:
        docs = list(iter_documents(str(tmp_path / e.path)))
        tree = merkle.levels([_leaf_of(i, d) for i, d in enumerate(docs)])
        assert e.merkle.root == merkle.root_of(tree).hex()
        stored = (tmp_path / e.merkle.path).read_bytes()
        assert stored == merkle.encode(tree)
        assert e.merkle.sha256 == hashlib.sha256(stored).hexdigest()
        assert e.merkle.path == e.path.replace(".parquet", ".merkle")
    # the root is part of the manifest entry and so of the fingerprint
    d = entries[0].to_dict()
    assert d["merkle"] == {"root": entries[0].merkle.root, "path": entries[0].merkle.path,
                           "sha256": entries[0].merkle.sha256}
    assert mf.ShardEntry.from_dict(d) == entries[0]


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _rewrite(root: Path, d: dict) -> None:
    """Write ``d`` back with a recomputed fingerprint (what a forger would do)."""
    d["fingerprint"] = mf.fingerprint(d)
    (root / "manifest.json").write_text(json.dumps(d))


def rewrite_shard(src: str, dst: str, row: int) -> None:
    """Shard ``src`` with one token of document ``row`` changed, written to ``dst`` with the
    same layout (row groups, metadata) by the shard writer."""
    import pyarrow.parquet as pq

    rows = list(iter_documents(src))
    meta = pq.ParquetFile(src).metadata
    per_group = meta.row_group(0).num_rows
    tmp = Path(dst).parent / "rewrite-tmp" / "shard"
    w = ShardWriter(str(tmp), meta.metadata[b"open1b.source"].decode(),
                    ShardSpec(tokens_per_shard=1 << 40, docs_per_row_group=per_group))
    for i, r in enumerate(rows):
        toks = r.tokens.copy()
        if i == row:
            toks[0] ^= 1
        w.add(toks, r.doc_id, r.input, r.row)
    (e,) = w.close()
    shutil.copyfile(tmp.parent / e.path.rsplit("/", 1)[-1], dst)
    shutil.rmtree(tmp.parent)


def test_verify_catches_a_changed_root_shard_or_tree(tmp_path):
    m = _build(tmp_path)
    assert verify(str(tmp_path)) == []
    sh = m.source("alpha").shards[1]

    d = _manifest(tmp_path)                      # a root edited, fingerprint left alone
    d["sources"][0]["shards"][1]["merkle"]["root"] = "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    assert any("fingerprint" in p for p in verify(str(tmp_path)))
    _rewrite(tmp_path, d)                        # ... and the fingerprint recomputed
    problems = verify(str(tmp_path))
    assert [p for p in problems if "Merkle root differs" in p and sh.path in p], problems

    # One token of a shard changed, its sha256 and size rewritten in the manifest: the
    # content is not the root's, and the stored tree names the row.
    m = _build(tmp_path)
    rewrite_shard(str(tmp_path / sh.path), str(tmp_path / sh.path), row=2)
    d = _manifest(tmp_path)
    entry = d["sources"][0]["shards"][1]
    data = (tmp_path / sh.path).read_bytes()
    entry["sha256"], entry["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    _rewrite(tmp_path, d)
    problems = verify(str(tmp_path))
    assert (len(problems) == 1 and "Merkle root differs" in problems[0]
        and sh.path in problems[0] and "first at row 2" in problems[0]), problems

    m = _build(tmp_path)
    tree = tmp_path / sh.merkle.path
    raw = bytearray(tree.read_bytes())
    raw[40] ^= 1
    tree.write_bytes(bytes(raw))
    assert [p for p in verify(str(tmp_path)) if sh.merkle.path in p
            and "not the tree of the shard's documents" in p]
    tree.unlink()
    assert verify(str(tmp_path)) == [f"{sh.merkle.path}: missing file"]


def strip_roots(root: Path) -> None:
    """The manifest with its shards' roots taken out (and re-fingerprinted)."""
    d = _manifest(root)
    for s in d["sources"]:
        for sh in s["shards"]:
            sh.pop("merkle")
    _rewrite(root, d)


def test_a_mix_without_roots_loads_but_its_shards_cannot_be_read(tmp_path):
    from open1b_data.stream.plan import StreamPlan
    from open1b_data.stream.windows import WindowReader

    _build(tmp_path)
    strip_roots(tmp_path)
    m = mf.load_manifest(str(tmp_path))
    assert all(sh.merkle is None for _, sh in m.shards())
    with pytest.raises(mf.ManifestError, match="no Merkle root"):
        WindowReader(StreamPlan.open(str(tmp_path))).window_tokens(0)
    d = _manifest(tmp_path)                  # a "merkle" that is there must be well formed
    d["sources"][0]["shards"][0]["merkle"] = None
    _rewrite(tmp_path, d)
    with pytest.raises(mf.ManifestError, match="merkle: expected dict"):
        mf.load_manifest(str(tmp_path))


# ------------------------------------------------------------------- stream-at --proof

@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    from testkit.trainmix import train_mix

    return train_mix(tmp_path_factory.mktemp("proofmix"), steps=12, batch=4)


def _stream_at(*args):
    from open1b_data.cli import main

    return CliRunner().invoke(main, ["stream-at", *args])


def test_stream_at_proof_emits_each_document_once_with_a_valid_proof(built):
    res = _stream_at(built, "--step", "5", "--proof", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    m = mf.load_manifest(built)
    keys = [(s["source"], s["shard"], s["doc"]) for w in rep["windows"] for s in w["segments"]]
    docs = rep["documents"]
    assert [(d["source"], d["shard"], d["doc"]) for d in docs] == list(dict.fromkeys(keys))
    assert len(set(keys)) < len(keys)             # some document spans windows: deduplicated
    by_key = {}
    for d in docs:
        entry = m.source(d["source"]).shards[d["shard"]]
        toks = np.array(d["tokens"], dtype=np.uint32)
        assert np.array_equal(toks, read_document(f"{built}/{entry.path}", d["doc"]))
        assert d["root"] == entry.merkle.root and d["shard_path"] == entry.path
        leaf = merkle.leaf_hash(d["doc"], toks, d["doc_id"], d["input"], d["input_row"])
        assert d["leaf"] == leaf.hex()
        p = d["proof"]
        assert (p["leaf_index"], p["tree_size"]) == (d["doc"], entry.documents)
        proof = merkle.Proof(p["leaf_index"], p["tree_size"],
                             tuple(bytes.fromhex(h) for h in p["siblings"]))
        assert merkle.verify(leaf, proof, bytes.fromhex(entry.merkle.root))
        by_key[(d["source"], d["shard"], d["doc"])] = toks
    eot = m.tokenizer["eot_id"]
    for w in rep["windows"]:                     # the documents rebuild every window
        got = []
        for s in w["segments"]:
            full = np.append(by_key[(s["source"], s["shard"], s["doc"])], eot)
            got.extend(full[s["doc_start"]:s["doc_start"] + s["length"]].tolist())
        assert got == w["tokens"]

    res = _stream_at(built, "--window", "3", "--proof")
    assert res.exit_code == 0, res.output
    assert "proved against its shard's Merkle root" in res.output
    res = _stream_at(built, "--step", "5", "--proof", "--plan-only")
    assert res.exit_code == 2 and "--proof" in res.output


def test_stream_at_refuses_a_mix_without_roots(built, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(built, old)
    strip_roots(old)
    res = _stream_at(str(old), "--step", "2", "--plan-only")
    assert res.exit_code == 0, res.output            # it plans
    for extra in ([], ["--proof"]):
        res = _stream_at(str(old), "--step", "2", *extra)
        assert res.exit_code == 1
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and "no Merkle root" in lines[0], res.output


def test_a_rerun_rebuilds_inputs_whose_marker_predates_content_identity(built, tmp_path):
    """A build interrupted before content identity (markers whose lengths record the
    file's sha256, trees over tokens alone), resumed now: its old markers do not count,
    so every shard of the merged mix has a content root (the mix is the one built fresh)."""
    from open1b_data.formats.definition import load_mix
    from open1b_data.ingest.pipeline import BuildOptions, build_mix

    out = tmp_path / "built"
    shutil.copytree(built, out)
    markers = sorted((out / "_work" / "inputs").rglob("*.json"))
    for path in markers:
        m = json.loads(path.read_text())
        for sh in m["shards"]:
            sh["lengths"]["sha256"] = sh["lengths"].pop("content")
        path.write_text(json.dumps(m))
    (out / "manifest.json").unlink()
    res = build_mix(load_mix(Path(built).parent / "small.toml"), str(out),
                    BuildOptions(workers=1, progress=False))
    assert res.inputs_built == len(markers) and res.inputs_skipped == 0
    assert res.fingerprint == mf.load_manifest(built).fingerprint
    assert all(sh.merkle is not None for _, sh in res.manifest.shards())
