"""``fetch-step --run RUN``: a step's data is verified against the run, not the mix alone.
The plan uses the seed the run's genesis records (a run trained with another seed than
the mix's drew other windows), the mix must be the one the genesis names, and the rebuilt
data digest must be the step's logged ``components.data`` - any difference exits 1 naming
the step. ``--expect-run-hash`` pins the run."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from open1b_audit.cli import main as audit_cli
from open1b_audit.fetch import fetch_step
from open1b_data import StreamPlan
from open1b_train import runlog
from open1b_train.train import train
from testkit.tamper import rehash_chain
from tests.formats.test_s3 import s3_endpoint  # noqa: F401  (the loopback S3 server)
from testkit.runs import micro_cfg

SEED = 7
BUCKET = "fetch-run-test"


def _cli(*args: str):
    return CliRunner().invoke(audit_cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def seeded_run(mix4, tmp_path_factory) -> str:
    """A run trained with seed 7 on a mix whose own seed is another."""
    assert StreamPlan.open(mix4).seed != SEED
    run = str(tmp_path_factory.mktemp("seeded") / "run")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(micro_cfg(steps=2, seed=SEED), mix4, run, progress=False)
    finally:
        torch.set_num_threads(n)
    assert runlog.read(run)[0]["genesis"]["seed"] == SEED
    return run


def _forged(run: str, dst: Path, edit) -> str:
    out = str(dst)
    shutil.copytree(run, out)
    lines = runlog.read(out)
    edit(lines)
    rehash_chain(lines, 0)
    runlog.rewrite(out, lines)
    return out


def test_run_seed_plans_the_windows_the_run_trained_on(mix4, seeded_run):
    logged = runlog.read(seeded_run)[2]["components"]["data"]
    assert fetch_step(mix4, 2).data_digest != logged      # the mix's seed: other windows
    h = runlog.read(seeded_run)[-1]["hash"]
    res = _cli("fetch-step", mix4, "--step", "2", "--run", seeded_run, "--expect-run-hash", h,
               "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["seed"] == SEED and rep["data_digest"] == logged
    assert rep["run"]["matches"] is True and rep["run"]["logged_data_digest"] == logged
    res = _cli("fetch-step", mix4, "--step", "2", "--run", seeded_run)
    assert res.exit_code == 0 and "MATCH" in res.stdout and "seed 7" in res.stdout


def test_another_digest_or_mix_fails_naming_the_step(mix4, seeded_run, tmp_path):
    def data(lines):
        lines[2]["components"]["data"] = "0" * 64

    run = _forged(seeded_run, tmp_path / "data", data)
    res = _cli("fetch-step", mix4, "--step", "2", "--run", run)
    assert res.exit_code == 1 and "MISMATCH" in res.stdout, res.output
    assert res.stderr.strip().splitlines() == [
        f"step 2: the data rebuilt from the mix differs from what {run} logged "
        f"(components.data)"]
    assert json.loads(_cli("fetch-step", mix4, "--step", "2", "--run", run, "--json")
                      .stdout)["run"]["matches"] is False
    # the published hash was the honest run's: the forged log is refused before any fetch
    res = _cli("fetch-step", mix4, "--step", "2", "--run", run, "--expect-run-hash",
               runlog.read(seeded_run)[-1]["hash"])
    assert res.exit_code == 1 and "not the published run" in res.stderr

    def mix(lines):
        lines[0]["genesis"]["mix_fingerprint"] = "ab" * 32

    run = _forged(seeded_run, tmp_path / "mix", mix)
    res = _cli("fetch-step", mix4, "--step", "1", "--run", run)
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "step 1" in res.stderr and "not the run's mix" in res.stderr
    res = _cli("fetch-step", mix4, "--step", "5", "--run", seeded_run)
    assert res.exit_code == 1 and "no step 5" in res.stderr
    res = _cli("fetch-step", mix4, "--step", "1", "--expect-run-hash", "ab" * 32)
    assert res.exit_code == 2 and "--run" in res.output


@pytest.mark.s3
@pytest.mark.slow
def test_fetch_run_step_over_s3(mix4, seeded_run, s3_endpoint, tmp_path):  # noqa: F811
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    try:
        up = tmp_path / "up"
        shutil.copytree(mix4, up, ignore=shutil.ignore_patterns("_work"))
        fs.put(str(up) + "/", f"{BUCKET}/mix4/", recursive=True)
        res = _cli("fetch-step", f"s3://{BUCKET}/mix4", "--step", "1", "--run", seeded_run,
                   "--json")
        assert res.exit_code == 0, res.output
        rep = json.loads(res.stdout)
        assert rep["run"]["matches"] is True and rep["seed"] == SEED
    finally:
        fs.rm(BUCKET, recursive=True)
