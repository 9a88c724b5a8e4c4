"""The recipe a run is audited against is the one its owner announced: its preset, the
schedule and held-out rule that preset publishes, and the mix. A run that departs from its
preset is flagged by the replay and in the certificate, field by field - however honestly
its steps reproduce - and the schedule counts as much as the config: a mix with 20x the
peak learning rate and no warmup used to certify with ``departures: []``. Announced values
(``--expect-preset``, ``--expect-mix``) are refused before any work when the run's hashed
records contradict them, and ``coverage`` counts only certificates on the announced recipe,
reporting the others apart (never added up) and failing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from open1b_audit.replay import replay
from open1b_train import recipe
from open1b_train.config import config_departures, demo, micro, open1b
from open1b_train.train import train
from testkit import released as forge
from testkit.runs import cli_env, micro_cfg


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "open1b_audit.cli", *args], env=cli_env(),
                          capture_output=True, text=True, timeout=600)


def test_departures_name_every_changed_recipe_field():
    cfg = micro_cfg(inject_spike=(3,), lr_scale=20.0, beta2=0.99, seed=42)
    got = {k: (a, b) for k, a, b in config_departures(cfg, mix_seed=42)}
    assert got == {"inject_spike": ([], [3]), "lr_scale": (10.0, 20.0), "beta2": (0.95, 0.99)}
    assert config_departures(micro(), mix_seed=42) == []           # the preset itself: none
    assert config_departures(micro_cfg(seed=7), mix_seed=42) == [("seed", 42, 7)]


def test_the_shipped_mixes_are_their_presets_recipes():
    """``make demo`` and Mix 0626 are on recipe: the presets' schedules are the shipped
    definitions' (so the two cannot drift)."""
    for cfg in (demo(), open1b()):
        d = json.loads(json.dumps(recipe.reference_definition(cfg.preset)))
        assert recipe.departures(cfg, d, d["seed"]) == []
    assert recipe.schedule_departures("micro", {}) is None      # publishes no schedule


def test_schedule_and_heldout_departures_are_named():
    d = json.loads(json.dumps(recipe.reference_definition("demo")))
    d["schedule"].update(lr_peak=20 * d["schedule"]["lr_peak"], warmup_tokens=0)
    d["heldout"] = {"fraction": "0.050"}                   # the same number: not a departure
    d["sources"][0]["heldout"] = "0"
    got = {k for k, _, _ in recipe.departures(demo(), d, d["seed"])}
    assert got == {"schedule.lr_peak", "schedule.warmup_tokens", "heldout.dclm-baseline"}


@pytest.fixture(scope="module")
def hot_run(tmp_path_factory) -> str:
    """The demo preset trained on a mix whose schedule has 20x the peak LR and no warmup."""
    base = recipe.reference_definition("demo")["schedule"]
    mix = forge.demo_recipe_mix(tmp_path_factory.mktemp("hotmix"),
                                lr_peak=20 * base["lr_peak"], warmup_tokens=0)
    return forge.demo_run(mix, str(tmp_path_factory.mktemp("hot") / "run"))


def test_a_schedule_departure_is_flagged_and_refused_when_the_preset_is_announced(
        hot_run, tmp_path):
    res = replay(hot_run, 2, from_step=1)
    assert res.ok                                       # the steps reproduce...
    fields = [d["field"] for d in res.recipe["departures"]]
    assert fields == ["schedule.lr_peak", "schedule.warmup_tokens"], res.recipe  # ...flagged
    certs = str(tmp_path / "certs")
    key = str(tmp_path / "k.pem")
    assert _audit("keygen", key).returncode == 0
    p = _audit("replay", hot_run, "--step", "2", "--certify", certs, "--key", key)
    assert p.returncode == 0, p.stderr
    assert ("RECIPE: the run departs from the published 'demo' preset in schedule.lr_peak"
        in p.stdout)
    p = _audit("replay", hot_run, "--step", "2", "--expect-preset", "demo", "--json")
    assert p.returncode == 1
    f = json.loads(p.stdout)["finding"]
    assert (f["step"], f["component"]) == (0, "recipe") and "schedule.lr_peak" in f["detail"]
    # the certificate signed the departures: coverage reports it apart and fails
    p = _audit("coverage", hot_run, certs, "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and rep["covered"] == 0 and rep["off_recipe_steps"] == [2], rep


def test_a_certificate_with_config_departures_is_not_coverage(mix4, tmp_path):
    run = str(tmp_path / "run")
    train(micro_cfg(steps=3, inject_spike=(3,)), mix4, run, progress=False)
    res = replay(run, 3, from_step=2)
    assert res.ok
    assert res.recipe["departures"] == [{"field": "inject_spike", "preset": [], "run": [3]}]
    certs, key = str(tmp_path / "certs"), str(tmp_path / "k.pem")
    assert _audit("keygen", key).returncode == 0
    p = _audit("replay", run, "--step", "3", "--certify", certs, "--key", key)
    assert p.returncode == 0, p.stderr
    assert "RECIPE: the run departs from the published 'micro' preset in inject_spike" in p.stdout
    cert = json.load(open(os.path.join(certs, "step-00000003.json")))
    assert cert["recipe"]["departures"] == [{"field": "inject_spike", "preset": [], "run": [3]}]
    p = _audit("coverage", run, certs, "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and rep["covered"] == 0 and rep["off_recipe_steps"] == [3]
    assert "inject_spike" in rep["off_recipe"][0]["why"]


def test_an_honest_run_certifies_on_its_announced_recipe(ref_run, tmp_path):
    res = replay(ref_run, 2, from_step=0)
    assert res.recipe["preset"] == "micro" and res.recipe["departures"] == []
    fp = res.recipe["mix_fingerprint"]
    certs, key = str(tmp_path / "certs"), str(tmp_path / "k.pem")
    assert _audit("keygen", key).returncode == 0
    p = _audit("replay", ref_run, "--step", "2", "--from-step", "0", "--certify", certs,
               "--key", key, "--expect-preset", "micro", "--expect-mix", fp)
    assert p.returncode == 0, p.stderr
    assert f"recipe: preset 'micro', mix {fp}" in p.stdout
    p = _audit("coverage", ref_run, certs, "--expect-preset", "micro", "--expect-mix", fp,
               "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["covered"] == 2 and not rep["off_recipe"], rep


def test_another_announced_mix_or_preset_is_refused_before_any_work(ref_run, mix4, tmp_path):
    """A planted document in the owner's own mix certifies with full coverage unless the
    auditor pins the announced mix; pinned, the run is refused by name."""
    other = "ab" * 32
    for args in (("--expect-mix", other), ("--expect-preset", "demo")):
        p = _audit("replay", ref_run, "--step", "2", *args, "--json")
        assert p.returncode == 1
        f = json.loads(p.stdout)["finding"]
        assert (f["step"], f["component"]) == (0, "recipe"), f
        assert json.loads(p.stdout)["verified_steps"] == []
        p = _audit("coverage", ref_run, str(tmp_path), *args, "--json")
        assert p.returncode == 1 and json.loads(p.stdout)["run_recipe"], p.stdout
        p = _audit("bisect", ref_run, "--until", "2", *args, "--json")
        assert p.returncode == 1 and json.loads(p.stdout)["finding"]["component"] == "recipe"


def test_the_explorer_shows_the_recipe_and_refuses_another_announced_one(ref_run, mix4,
                                                                          tmp_path):
    fp = replay(ref_run, 1, from_step=0).recipe["mix_fingerprint"]
    out = tmp_path / "site"
    p = _audit("site", ref_run, "--mix", mix4, "--out", str(out), "--steps", "1:1")
    assert p.returncode == 0, p.stderr
    assert "no --expect-preset or --expect-mix" in p.stderr
    index = (out / "index.html").read_text()
    assert 'id="recipe"' in index and f"<code>{fp}</code>" in index
    assert 'id="unannounced"' in index
    p = _audit("site", ref_run, "--mix", mix4, "--out", str(tmp_path / "s2"), "--steps", "1:1",
               "--expect-preset", "micro", "--expect-mix", fp)
    assert p.returncode == 0 and "--expect-preset" not in p.stderr, p.stderr
    assert 'id="announced"' in (tmp_path / "s2" / "index.html").read_text()
    p = _audit("site", ref_run, "--mix", mix4, "--out", str(tmp_path / "s3"),
               "--expect-preset", "demo")
    assert p.returncode == 1 and "not the announced recipe" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "s3").exists()


def test_the_explorer_does_not_count_an_off_recipe_certificate(hot_run, tmp_path):
    """The demo run with a 20x learning rate, certified by a real replay: the explorer's
    coverage page lists its certificate as off recipe and counts nothing."""
    certs, key = str(tmp_path / "certs"), str(tmp_path / "k.pem")
    assert _audit("keygen", key).returncode == 0
    assert _audit("replay", hot_run, "--step", "2", "--certify", certs,
                  "--key", key).returncode == 0
    out = tmp_path / "site"
    p = _audit("site", hot_run, "--certs", certs, "--out", str(out), "--steps", "2:2")
    assert p.returncode == 0, p.stderr
    cov = (out / "coverage.html").read_text()
    assert "0 of 2 steps certified" in cov and "off recipe:" in cov
    assert "OFF RECIPE" in (out / "index.html").read_text()
