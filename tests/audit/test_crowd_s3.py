"""A run audited where it is published: on a real S3-compatible server on loopback (moto's,
configured the standard way: ``AWS_ENDPOINT_URL`` and ``AWS_*`` credentials) and on a
read-only http server - ``chain``, ``replay``, ``verify-model``, ``coverage`` and ``site``
take the run URL, fetch only what the step needs into a cache checked against the chain,
and report the bytes fetched; the crowd's store on S3 is written with conditional creates
only."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from open1b_audit.cli import main
from open1b_audit.crowd.cache import named_mix
from open1b_audit.crowd.join import JoinOptions, join
from open1b_audit.crowd.publish import publish
from open1b_audit.crowd.source import SourceError
from open1b_audit.crowd.store import Store, Taken
from open1b_train import checkpoint, runlog
from testkit import crowd as cf
from testkit.runs import cli_env

pytestmark = pytest.mark.s3
pytest.importorskip("moto.server")


@pytest.fixture
def s3(monkeypatch, tmp_path):
    moto = cf.Moto()
    cf.use_moto(monkeypatch, moto)
    monkeypatch.setenv("OPEN1B_CACHE", str(tmp_path / "cache"))
    try:
        yield moto
    finally:
        moto.stop()


def _cli(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_run_on_s3_and_on_http_is_audited_where_it_lies(s3, ref_run, mix4, tmp_path):
    run = f"s3://{cf.BUCKET}/runs/ref"
    publish(ref_run, run, "../mix", mix4)
    h = runlog.read(ref_run)[-1]["hash"]
    res = _cli("chain", run, "--expect-run-hash", h)
    assert res.exit_code == 0 and "chain OK" in res.output, res.output
    res = _cli("replay", run, "--step", "3", "--expect-run-hash", h, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["verdict"] == "match" and rep["verified_steps"] == [3]
    got = rep["bytes_fetched"]
    ck = sum(os.path.getsize(os.path.join(checkpoint.step_dir(ref_run, 2), n))
             for n in os.listdir(checkpoint.step_dir(ref_run, 2)))
    assert got["checkpoint"] == ck                       # one checkpoint, every file once
    assert 0 < got["data"] < got["mix"]
    assert "log" not in got                  # fetched once, by chain, and kept in the cache
    # a fresh process configured the standard way (AWS_ENDPOINT_URL, no fsspec settings)
    env = {**cli_env(), **s3.env(), "OPEN1B_CACHE": str(tmp_path / "c2")}
    env.pop("FSSPEC_S3_ENDPOINT_URL", None)
    p = subprocess.run([sys.executable, "-m", "open1b_audit.cli", "replay", run, "--step", "8",
                        "--expect-run-hash", h], env=env, capture_output=True, timeout=300)
    assert p.returncode == 0 and b"verdict: MATCH" in p.stdout, p.stderr.decode()[-2000:]
    assert b"published checkpoints compared with the replayed state: steps 8" in p.stdout
    res = _cli("verify-model", checkpoint.step_dir(ref_run, 8), "--run", run,
               "--expect-run-hash", h)
    assert res.exit_code == 0 and "is step 8 of run" in res.output, res.output
    res = _cli("bisect", run, "--until", "4", "--expect-run-hash", h, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["replayed_intervals"] == [[0, 2], [2, 4]]
    # the same run and mix from a read-only http server (no listing needed)
    local = tmp_path / "www"
    publish(ref_run, str(local / "run"), "../mix", mix4)
    www = cf.Http(str(local))
    try:
        res = _cli("replay", f"{www.url}/run", "--step", "5", "--expect-run-hash", h, "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["verdict"] == "match", res.output
        res = _cli("chain", f"{www.url}/run", "--expect-run-hash", "ab" * 32)
        assert res.exit_code == 1 and "not the published run" in res.output
    finally:
        www.stop()
    # a server that ignores byte ranges is refused by name: no proof fails, no run is blamed
    www = cf.Http(str(local), ranges=False)
    try:
        res = _cli("replay", f"{www.url}/run", "--step", "7")
        assert res.exit_code == 1 and "does not answer byte ranges" in res.output, res.output
        assert "MISMATCH" not in res.output
    finally:
        www.stop()


def test_the_runs_files_never_choose_where_an_auditor_connects():
    assert named_mix("s3://b/runs/x", "../mix") == "s3://b/runs/mix"
    assert named_mix("http://h:1/runs/x", "http://h:1/m") == "http://h:1/m"
    for run, mix in (("http://h:1/runs/x", "http://evil:2/m"), ("s3://b/x", "/etc/mix"),
                     ("s3://b/x", "http://h/m"), ("/data/run", "s3://b/mix")):
        with pytest.raises(SourceError, match="not a place of the run URL's kind"):
            named_mix(run, mix)


def test_conditional_creates_on_s3(s3):
    st = Store(f"s3://{cf.BUCKET}/store")
    assert st.create("ledger/x.json", b"a") is True
    assert st.create("ledger/x.json", b"a") is False
    with pytest.raises(Taken):
        st.create("ledger/x.json", b"b")
    assert st.read("ledger/x.json") == b"a"
    entry = st.listing("ledger")["ledger/x.json"]
    assert entry.size == 1 and entry.mtime > 0


def test_two_auditors_cover_a_run_on_s3_and_coverage_reads_the_store(s3, ref_run, mix4,
                                                                     tmp_path):
    run, store = f"s3://{cf.BUCKET}/runs/two", f"s3://{cf.BUCKET}/runs/two-audit"
    publish(ref_run, run, "../mix", mix4)
    ks = cf.keys(str(tmp_path / "keys"), ("ann", "ben"))
    got = {}
    for who in ("ann", "ben"):
        summ = join(JoinOptions(run=run, key_path=ks[who][0], store=store,
                                cache=str(tmp_path / "cache"), leg_steps=1, redundancy=2,
                                selftest=False, idle_s=0), open(os.devnull, "w"))
        assert summ.outcome == "match" and len(summ.legs) == 8
        got[who] = summ.to_dict()
    # every unit's second leg starts from a hand-off: ann, alone at first, from her own
    # (kept locally, nothing downloaded); ben from his own where he ran the leg before,
    # else one of ann's, downloaded from the store
    starts = {who: [x["start"] for x in got[who]["legs"] if "hand-off" in x["start"]]
              for who in got}
    assert len(starts["ann"]) == len(starts["ben"]) == 4
    assert all("own hand-off" in x for x in starts["ann"])
    assert got["ann"]["bytes_fetched"]["handoff"] < 10_000        # ledger reads only
    downloaded = sum("by key " + ks["ann"][1][:16] in x for x in starts["ben"])
    own = sum("own hand-off" in x for x in starts["ben"])
    assert downloaded + own == 4
    assert got["ben"]["bytes_fetched"]["handoff"] >= downloaded * 1_000_000
    trusted = cf.trusted_file(str(tmp_path), [ks["ann"][1], ks["ben"][1]])
    h = runlog.read(ref_run)[-1]["hash"]
    res = _cli("coverage", run, "--store", store, "--trusted-keys", trusted, "--redundancy",
               "2", "--expect-run-hash", h, "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["covered"] == 8 and rep["gaps"] == [] and rep["keys_counted"] == 2
    c = rep["crowd"]
    assert c["legs_covered"] == 8 and not c["in_flight"] and not c["distrusted"]
    assert rep["final_checkpoint"]["matches"] is True
    out = tmp_path / "site"
    res = _cli("site", run, "--store", store, "--out", str(out))
    assert res.exit_code == 0, res.output
    page = (out / "crowd.html").read_text()
    assert "8 of 8 legs certified" in page and ks["ann"][1][:16] in page
