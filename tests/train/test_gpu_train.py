"""scripts/gpu_check.py's training section runs as-is: its CPU dry run (tiny shapes)
exercises the same code a GPU run does - parity, one step vs the stock model, hashing,
collectives and the distributed trainer on a one-process group."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit.runs import cli_env


@pytest.mark.slow
def test_train_dry_run(tmp_path):
    out = tmp_path / "gc.json"
    r = subprocess.run([sys.executable, "scripts/gpu_check.py", "--train-dry-run", "--out",
                        str(out)], env=cli_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())["train"]
    assert res["parity"]["equal"] and res["collectives"]["collectives_equal_reference"]
    assert res["collectives"]["distributed_trainer_equals_single_process"]
    assert res["golden"]["micro"] == dict(res["golden"]["micro"], steps=2, equal=True)
    assert res["golden"]["demo"]["equal"] and res["golden"]["demo"]["steps"] == 1
    assert res["speed"]["ours_tokens_per_s"] > 0 and 0 < res["speed"]["hash_share_of_step"] < 1
    assert "IDENTICAL" in r.stdout and "golden micro trajectory, 2 steps" in r.stdout


def _gpu_train():
    sys.path.insert(0, "scripts")
    try:
        import gpu_train
    finally:
        sys.path.remove("scripts")
    return gpu_train


def test_a_section_that_raises_is_recorded_flushed_and_fails_the_check(monkeypatch):
    """A device lease is short: one broken section must neither hide the others' results
    nor pass as agreement."""
    gpu_train = _gpu_train()

    def broken(*a):
        raise RuntimeError("triton: out of resources")

    monkeypatch.setattr(gpu_train, "golden", broken)
    monkeypatch.setattr(gpu_train, "collectives", lambda *a: {
        "collectives_equal_reference": True, "distributed_trainer_equals_single_process": True,
        "backend": "gloo", "bytes_per_rank": 4, "seconds_ours": 0.001})
    flushed = []
    res = gpu_train.train_check(dry_run=True, sections=("collectives", "golden"),
                                on_section=lambda r: flushed.append(sorted(r)))
    assert res["golden"]["error"] == "RuntimeError: triton: out of resources"
    assert flushed == [["device", "golden"], ["collectives", "device", "golden"]]  # bitwise order
    assert not gpu_train.passed(res) and "golden: ERROR RuntimeError" in gpu_train.format_report(res)
    del res["golden"]
    assert gpu_train.passed(res)
    res["collectives"]["distributed_trainer_equals_single_process"] = False
    assert not gpu_train.passed(res)
    with pytest.raises(ValueError, match=r"unknown training sections \['spead'\]"):
        gpu_train.train_check(dry_run=True, sections=("spead",))


def test_a_differing_golden_trajectory_fails_the_check():
    gpu_train = _gpu_train()
    golden = {"micro": {"steps": 100, "equal": True, "seconds": 1.0},
              "demo": {"steps": 3, "equal": False, "seconds": 1.0,
                       "first_difference": {"step": 2, "component": "grad"}},
              "section_seconds": 2.0}
    res = {"device": "cuda", "golden": golden}
    assert not gpu_train.passed(res)
    assert "golden demo trajectory, 3 steps on cuda: DIFFERS at step 2 (grad)" in (
        gpu_train.format_report(res))
    golden["demo"]["equal"] = True
    assert gpu_train.passed(res)


def test_compare_mixes_names_the_files_that_differ_and_whether_tokens_agree(tmp_path):
    """On a machine whose pyarrow differs the rebuilt golden mix has other shard files and
    the same fingerprint (content); the report must say which files differ and whether any
    token did. The edited manifests are re-stamped (a stale fingerprint is refused on
    loading)."""
    import json
    import shutil

    from open1b_audit.selftest import trajectory as tj
    from open1b_data.formats.manifest import ManifestError, fingerprint

    gpu_train = _gpu_train()
    a = tj.build_mix("micro", str(tmp_path / "a"))
    b = str(tmp_path / "b")
    shutil.copytree(a, b)
    assert gpu_train.compare_mixes(a, b) == {
        "fingerprint_equal": True, "files_differing": [], "tokens_equal": True}
    path = tmp_path / "b" / "manifest.json"
    m = json.loads(path.read_text())
    shard = m["sources"][0]["shards"][0]

    def stamp() -> None:
        m["fingerprint"] = fingerprint(m)
        path.write_text(json.dumps(m))

    shard["sha256"] = "0" * 64                                  # another writer's footer
    stamp()
    assert gpu_train.compare_mixes(a, b) == {
        "fingerprint_equal": True, "files_differing": [shard["path"]], "tokens_equal": True}
    shard["merkle"]["root"] = "1" * 64                          # another token somewhere
    stamp()
    assert not gpu_train.compare_mixes(a, b)["tokens_equal"]
    m["totals"]["tokens"] += 1                                  # edited, not re-stamped
    path.write_text(json.dumps(m))
    with pytest.raises(ManifestError, match="fingerprint"):
        gpu_train.compare_mixes(a, b)
