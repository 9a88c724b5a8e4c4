"""A run that departs from its published preset is flagged by the replay and in the
certificate, field by field - however honestly its steps reproduce (a config that injects
spikes, or changes any recipe constant, was audited like any other)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from open1b_audit.replay import replay
from open1b_train.config import departures, micro
from open1b_train.train import train
from tests.fixtures.runs import cli_env, micro_cfg


def test_departures_name_every_changed_recipe_field():
    cfg = micro_cfg(inject_spike=(3,), lr_scale=20.0, beta2=0.99, seed=42)
    got = {k: (a, b) for k, a, b in departures(cfg, mix_seed=42)}
    assert got == {"inject_spike": ([], [3]), "lr_scale": (10.0, 20.0), "beta2": (0.95, 0.99)}
    assert departures(micro(), mix_seed=42) == []           # the preset itself: none
    assert departures(micro_cfg(seed=7), mix_seed=42) == [("seed", 42, 7)]


def test_a_replay_and_its_certificate_name_the_departures(mix4, tmp_path):
    run = str(tmp_path / "run")
    train(micro_cfg(steps=3, inject_spike=(3,)), mix4, run, progress=False)
    res = replay(run, 3, from_step=2)
    assert res.ok                                  # the steps do reproduce...
    assert res.recipe == {"preset": "micro", "departures": [              # ...but it is flagged
        {"field": "inject_spike", "preset": [], "run": [3]}]}
    certs = tmp_path / "certs"
    p = subprocess.run([sys.executable, "-m", "open1b_audit.cli", "replay", run, "--step", "3",
                        "--certify", str(certs)], env=cli_env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "RECIPE: the run departs from the published 'micro' preset in inject_spike" in p.stdout
    cert = json.load(open(os.path.join(certs, "step-00000003.json")))
    assert cert["recipe"]["departures"] == [{"field": "inject_spike", "preset": [], "run": [3]}]


def test_a_run_on_its_preset_has_no_departures(ref_run):
    assert replay(ref_run, 2, from_step=0).recipe == {"preset": "micro", "departures": []}
