"""The command-line tools make OpenMP threads wait passively (open1b/cli.py says why and
BENCHMARKS.md has the measurement), before torch loads libgomp - unless the user chose a
policy. No tool imports torch when it is imported, which is what makes the setting take."""
from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.runs import cli_env

CODE = ("import os, sys, {m}; print(os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules)")


@pytest.mark.parametrize("module", ["open1b_train.cli", "open1b_audit.cli", "open1b_eval.cli",
                                    "open1b_data.cli"])
def test_the_tools_wait_passively_and_load_torch_later(module):
    env = {k: v for k, v in cli_env().items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", CODE.format(m=module)], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["PASSIVE", "False"]


def test_a_policy_the_user_chose_is_kept():
    env = dict(cli_env(), OMP_WAIT_POLICY="ACTIVE")
    out = subprocess.run([sys.executable, "-c", CODE.format(m="open1b_train.cli")], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "ACTIVE"
