"""scripts/gpu_check.py's training section runs as-is: its CPU dry run (tiny shapes)
exercises the same code a GPU run does - parity, one step vs the stock model, hashing,
collectives and the distributed trainer on a one-process group."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fixtures.runs import cli_env


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
