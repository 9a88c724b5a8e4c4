"""The mix's identity is its content (docs/FORMATS.md, "The mix fingerprint").

One content fingerprint for one mix, whatever wrote its files: the same corpus built with
other Parquet writer settings (row groups, compression level - both definition settings
that do not enter the fingerprint), its shards rewritten again (dictionary pages,
statistics, data page and format versions, another writer string), moved to other file
paths, and built from sources kept at another path. And every change of content changes
it: a token, a document id, an input (a document's upstream location), a held-out row, a
merge of the tokenizer. (Worker counts and task splits: tests/ingest/test_build.py.)"""
from __future__ import annotations

import json
import os
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest

from open1b_data.formats.definition import load_mix
from open1b_data.formats.manifest import fingerprint, load_manifest
from open1b_data.formats.tokenizerfile import content_digest
from open1b_data.ingest.pipeline import BuildOptions, build_mix
from open1b_data.ingest.verify import verify
from open1b_data.stream.plan import StreamPlan
from open1b_data.stream.windows import WindowReader
from testkit.mixfixture import dump_toml, small_mix
from testkit.rewrite import edit_shard, refingerprint, reroot, rewrite_shard

QUIET = dict(progress=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The small demo-shaped corpus and its definition (with a held-out fraction)."""
    path = small_mix(tmp_path_factory.mktemp("src"), docs=24, tokens_per_shard=6000)
    raw = tomllib.loads(path.read_text())
    raw["heldout"] = {"fraction": "0.2"}
    path.write_text(dump_toml(raw))
    return path


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("ref") / "mix")
    build_mix(load_mix(source), out, BuildOptions(workers=1, **QUIET))
    return out


def _files(mix: str) -> dict[str, bytes]:
    return {p.relative_to(mix).as_posix(): p.read_bytes()
            for p in sorted(Path(mix).rglob("*.parquet"))}


def _variant(source: Path, tmp: Path, edit) -> Path:
    raw = tomllib.loads(source.read_text())
    edit(raw)
    path = tmp / "variant.toml"
    path.write_text(dump_toml(raw))
    return path


def test_writer_settings_in_the_definition_do_not_change_the_fingerprint(source, reference,
                                                                         tmp_path):
    def other_settings(raw):
        raw["shards"].update(docs_per_row_group=3, zstd_level=19)
    out = str(tmp_path / "mix")
    r = build_mix(load_mix(_variant(source, source.parent, other_settings)), out,
                  BuildOptions(workers=2, **QUIET))
    os.unlink(source.parent / "variant.toml")
    assert r.fingerprint == load_manifest(reference).fingerprint
    theirs, ours = _files(reference), _files(out)
    assert theirs.keys() == ours.keys() and all(theirs[k] != ours[k] for k in ours)


def test_shards_rewritten_and_moved_keep_the_fingerprint(reference, tmp_path):
    mix = str(tmp_path / "mix")
    shutil.copytree(reference, mix)
    want = load_manifest(reference).fingerprint
    settings = [dict(row_group_size=5, compression="snappy", use_dictionary=False,
                     write_statistics=True, data_page_version="2.0", version="2.4",
                     created_by="parquet-cpp-arrow version 18.1.0"),
                dict(row_group_size=1000, compression="zstd", compression_level=1,
                     write_statistics=False, created_by="parquet-mr version 1.13.1 (bld)")]
    m = load_manifest(mix)
    for i, (_, sh) in enumerate(m.shards()):
        rewrite_shard(os.path.join(mix, sh.path), **settings[i % 2])

    def move(d):          # another file layout: every file under another name
        for src in d["sources"]:
            for k, sh in enumerate(src["shards"]):
                for key, node, ext in (("path", sh, "parquet"), ("path", sh["lengths"], "npy"),
                                       ("path", sh["merkle"], "merkle")):
                    new = f"moved/{src['name']}-{k}.{ext}"
                    os.makedirs(os.path.join(mix, "moved"), exist_ok=True)
                    os.replace(os.path.join(mix, node[key]), os.path.join(mix, new))
                    node[key] = new
    d = refingerprint(mix, move)
    assert d["fingerprint"] == want
    assert verify(mix) == []
    ref_plan, plan = StreamPlan.open(reference), StreamPlan.open(mix)
    for whole in (True, False):
        assert np.array_equal(WindowReader(plan, whole_shards=whole).windows(0, 60),
                              WindowReader(ref_plan).windows(0, 60))


def test_sources_kept_at_another_path_give_the_same_fingerprint(source, reference, tmp_path):
    """The definition's roots are where this builder keeps the corpus: not the mix."""
    other = tmp_path / "elsewhere" / "deeper"
    shutil.copytree(source.parent / "corpus", other / "corpus")

    def absolute(raw):
        for src in raw["sources"]:
            src["root"] = str(other / src["root"])
            if "content_store" in src:
                src["content_store"] = str(other / src["content_store"])
    out = str(tmp_path / "mix")
    r = build_mix(load_mix(_variant(source, tmp_path, absolute)), out,
                  BuildOptions(workers=1, **QUIET))
    assert r.fingerprint == load_manifest(reference).fingerprint
    roots = lambda m: [s["root"] for s in load_manifest(m).definition["sources"]]  # noqa: E731
    assert roots(out) != roots(reference)              # recorded, but not the mix's identity


def _first_shard(mix: str, heldout: bool = False):
    m = load_manifest(mix)
    return next(sh for _, sh in m.shards() if not heldout or sh.heldout)


@pytest.mark.parametrize("what", ["token", "doc_id", "input", "row", "heldout-row",
                                  "merge", "vocabulary"])
def test_every_change_of_content_changes_the_fingerprint(reference, tmp_path, what):
    mix = str(tmp_path / "mix")
    shutil.copytree(reference, mix)
    want = load_manifest(reference).fingerprint
    sh = _first_shard(mix, heldout=what == "heldout-row")
    path = os.path.join(mix, sh.path)
    if what == "token":
        edit_shard(path, 1, "tokens", lambda t: t[:1] + [t[1] ^ 1] + t[2:])
    elif what in ("doc_id", "input"):
        edit_shard(path, 1, what, lambda v: v + "x")
    elif what == "row":
        edit_shard(path, 1, "row", lambda v: v + 1)
    if what in ("token", "doc_id", "input", "row"):
        d = reroot(mix)
    elif what == "heldout-row":
        d = refingerprint(mix, lambda d: [s.update(heldout=s["heldout"][1:])
                                          for src in d["sources"] for s in src["shards"]
                                          if s["path"] == sh.path])
    else:
        tok = json.loads((Path(mix) / "tokenizer.json").read_text())
        if what == "merge":
            tok["model"]["merges"][5] = tok["model"]["merges"][6]
        else:
            vocab = tok["model"]["vocab"]
            a, b = sorted(vocab)[300:302]
            vocab[a], vocab[b] = vocab[b], vocab[a]
        raw = json.dumps(tok).encode()
        (Path(mix) / "tokenizer.json").write_bytes(raw)
        d = refingerprint(mix, lambda d: d["tokenizer"].update(
            content=content_digest("tokenizer.json", raw)))
    assert d["fingerprint"] != want
    assert fingerprint(d) == load_manifest(mix).fingerprint != want
