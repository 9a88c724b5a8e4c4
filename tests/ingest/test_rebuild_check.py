"""``open1b-data rebuild-check``: a published mix against the upstream sources.

A mix rebuilt in full from its corpus matches, to its fingerprint; a published mix with one
token changed - self-consistent, its root, tree and fingerprint recomputed, so ``verify``
and every reader accept it - is caught, named by shard, row, doc_id and position; so are a
changed doc_id and an input the sources lack. A sample of K shards rebuilds only their
inputs. The check reads a mix published on an S3-compatible server (moto, on loopback)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from open1b_data.cli import main
from open1b_data.formats.definition import load_mix
from open1b_data.formats.manifest import load_manifest
from open1b_data.ingest.pipeline import BuildOptions, build_mix
from open1b_data.ingest.rebuildcheck import rebuild_check, sample_shards
from open1b_data.ingest.verify import verify
from testkit.mixfixture import small_mix
from testkit.rewrite import edit_shard, refingerprint, reroot


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> tuple[str, Path]:
    """(the built mix, the corpus directory: one folder per source)."""
    toml = small_mix(tmp_path_factory.mktemp("src"), docs=24, tokens_per_shard=6000)
    out = str(tmp_path_factory.mktemp("pub") / "mix")
    build_mix(load_mix(toml), out, BuildOptions(workers=1, progress=False))
    return out, toml.parent / "corpus"


def _stores(corpus: Path) -> dict[str, str]:
    return {"the-stack-v2": f"{corpus}/the-stack-v2-content/{{blob_id}}"}


def _check(mix: str, corpus: Path, **kw):
    roots = {s.name: str(corpus / s.name) for s in load_manifest(mix).sources}
    return rebuild_check(mix, roots, _stores(corpus), **kw)


def test_the_published_mix_rebuilds_to_its_fingerprint(published):
    mix, corpus = published
    rep = _check(mix, corpus, workers=2)
    assert rep.matches, rep.differences
    assert rep.rebuilt_fingerprint == load_manifest(mix).fingerprint
    assert (rep.inputs_checked, rep.shards_checked) == (rep.inputs_total, rep.shards_total)
    res = CliRunner().invoke(main, ["rebuild-check", mix, "--sources", str(corpus),
                                    "--content-store",
                                    f"the-stack-v2={_stores(corpus)['the-stack-v2']}",
                                    "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["verdict"] == "MATCH"


def test_one_changed_token_is_named(published, tmp_path):
    mix, corpus = published
    forged = str(tmp_path / "forged")
    shutil.copytree(mix, forged)
    sh = load_manifest(forged).sources[1].shards[0]
    edit_shard(os.path.join(forged, sh.path), 3, "tokens", lambda t: t[:2] + [t[2] + 1] + t[3:])
    reroot(forged)
    assert verify(forged) == []                     # self-consistent: only the sources know
    rep = _check(forged, corpus)
    assert len(rep.differences) == 1, rep.differences
    assert rep.differences[0].startswith(f"shard {sh.path} row 3 (doc_id ")
    assert "tokens differ at position 2" in rep.differences[0]
    res = CliRunner().invoke(main, ["rebuild-check", forged, "--sources", str(corpus),
                                    "--content-store",
                                    f"the-stack-v2={_stores(corpus)['the-stack-v2']}"])
    assert res.exit_code == 1 and f"DIFFER shard {sh.path} row 3" in res.output


def test_a_changed_doc_id_and_a_missing_input_are_named(published, tmp_path):
    mix, corpus = published
    forged = str(tmp_path / "forged")
    shutil.copytree(mix, forged)
    sh = load_manifest(forged).sources[0].shards[0]
    edit_shard(os.path.join(forged, sh.path), 0, "doc_id", lambda v: v + "-x")
    reroot(forged)

    def renamed_input(d):    # the manifest claims an input the sources do not have
        d["sources"][2]["inputs"][0]["path"] = "nope.parquet"
    refingerprint(forged, renamed_input)
    diffs = _check(forged, corpus).differences
    assert any(d.startswith(f"shard {sh.path} row 0: doc_id differs") for d in diffs), diffs
    assert any("input nope.parquet of the published mix is not in the sources" in d
               for d in diffs), diffs
    assert any("1 input(s) in the sources that the published mix does not list" in d
               for d in diffs), diffs


def test_a_sample_of_k_shards_rebuilds_their_inputs_only(published):
    mix, corpus = published
    m = load_manifest(mix)
    picked = sample_shards(m, 2, seed=5)
    assert picked == sample_shards(m, 2, seed=5) != sample_shards(m, 2, seed=6)
    rep = _check(mix, corpus, sample=2, seed=5)
    owners = {i["path"] for s in m.sources for i in s.inputs if set(i["shards"]) & set(picked)}
    assert rep.matches and rep.inputs_checked == len(owners) <= 2
    assert 2 <= rep.shards_checked < rep.shards_total and rep.rebuilt_fingerprint is None


pytest_s3 = pytest.importorskip("moto.server")


@pytest.mark.s3
def test_a_mix_on_object_storage_is_checked(published, monkeypatch):
    import s3fs

    from tests.formats.test_s3 import _free_port

    mix, corpus = published
    port = _free_port()
    server = pytest_s3.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                     "AWS_DEFAULT_REGION": "us-east-1"}.items():
            monkeypatch.setenv(k, v)
        import fsspec.config

        monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        fs.mkdir("pub")
        fs.put(mix + "/", "pub/mix/", recursive=True)
        rep = _check("s3://pub/mix", corpus, sample=3)
        assert rep.matches and rep.shards_checked >= 3, rep.differences
        sh = load_manifest(mix).sources[0].shards[0]
        local = Path(mix).parent / "edited"
        shutil.copytree(mix, local)
        edit_shard(str(local / sh.path), 1, "tokens", lambda t: [t[0] ^ 1] + t[1:])
        reroot(str(local))
        fs.put(str(local / "manifest.json"), "pub/mix/manifest.json")
        for suffix in ("parquet", "merkle"):
            path = sh.path.replace(".parquet", f".{suffix}")
            fs.put(str(local / path), f"pub/mix/{path}")
        diffs = _check("s3://pub/mix", corpus).differences
        assert len(diffs) == 1 and diffs[0].startswith(f"shard {sh.path} row 1 "), diffs
    finally:
        server.stop()
