"""What users take away is what the chain commits to: every command that loads a run's
weights for use - ``open1b-train generate`` / ``export``, ``open1b-eval perplexity``, the
lm-eval model - checks them (and the config and tokenizer they are used with) against the
run's log before use, and the audit commands compare the released (last) checkpoint too.
Each forgery here went through before (the released weights swapped with their sha256
rewritten in ``record.json``; the record's config edited; the mix's tokenizer edited or
replaced by a self-consistent mix), and is refused by name now."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit import released as forge
from testkit.runs import REF_STEPS, cli_env


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], env=cli_env(),
                          capture_output=True, text=True, timeout=600)


def _train(*args):
    return _run("open1b_train.cli", *args)


def _audit(*args):
    return _run("open1b_audit.cli", *args)


def _refused(p: subprocess.CompletedProcess, *needles: str) -> None:
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    text = p.stdout + p.stderr
    for n in needles:
        assert n in text, text


GEN = ("--prompt", "def f(", "--max-tokens", "4", "--backend", "cpu", "--json")


@pytest.fixture(scope="module")
def swapped(ref_run, tmp_path_factory) -> str:
    return forge.swapped_release(ref_run, str(tmp_path_factory.mktemp("swap")))


def test_swapped_released_weights_are_refused_by_generate_and_export(swapped, tmp_path):
    _refused(_train("generate", swapped, *GEN), f"step-{REF_STEPS:08d}",
             "parameters are not step", "swapped or edited")
    _refused(_train("export", swapped, "--out", str(tmp_path / "hf")), "parameters are not step")
    assert not (tmp_path / "hf").exists()


def test_swapped_released_weights_are_refused_by_eval_and_the_lm_eval_model(swapped):
    from open1b_eval.errors import EvalError
    from open1b_eval.harness import Open1bLM

    _refused(_run("open1b_eval.cli", "perplexity", swapped, "README.md", "--backend", "cpu"),
             "parameters are not step")
    with pytest.raises(EvalError, match="parameters are not step"):
        Open1bLM(run=swapped)


def test_the_audit_compares_the_released_checkpoint(swapped, ref_run):
    h = forge.last_hash(ref_run)
    # the last step's replay starts from the checkpoint before: it reproduces the log, and
    # now also compares the published state of the step it reproduced
    p = _audit("replay", swapped, "--step", str(REF_STEPS), "--expect-run-hash", h, "--json")
    assert p.returncode == 1, p.stdout
    f = json.loads(p.stdout)["finding"]
    assert (f["step"], f["component"]) == (REF_STEPS, "params"), f
    assert "the published checkpoint" in f["detail"]
    p = _audit("bisect", swapped, "--until", str(REF_STEPS), "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and not rep["vouched"], rep
    assert (rep["step"], rep["finding"]["component"]) == (REF_STEPS, "params")
    p = _audit("coverage", swapped, str(ref_run), "--json")     # no certificates needed
    rep = json.loads(p.stdout)
    assert p.returncode == 1 and rep["final_checkpoint"]["matches"] is False, rep


def test_an_honest_run_reports_its_released_weights_compared(ref_run, tmp_path):
    p = _audit("bisect", ref_run, "--until", str(REF_STEPS), "--json")
    rep = json.loads(p.stdout)
    assert p.returncode == 0 and rep["vouched"], rep
    assert rep["final_checkpoint"] == {"step": REF_STEPS, "compared": True}
    p = _audit("coverage", ref_run, str(tmp_path), "--json")
    rep = json.loads(p.stdout)
    assert rep["final_checkpoint"]["matches"] is True, rep


def test_the_record_config_is_never_read(ref_run, tmp_path):
    """Editing ``record.json``'s config changed RoPE's theta and the window in generation
    and in the export; the config now comes from the hashed ``config.json`` only."""
    forged = forge.record_config(ref_run, str(tmp_path))
    honest = json.loads(_train("generate", ref_run, *GEN).stdout)["outputs"]
    p = _train("generate", forged, *GEN)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outputs"] == honest
    assert _train("export", forged, "--out", str(tmp_path / "hf")).returncode == 0
    cfg = json.load(open(tmp_path / "hf" / "config.json"))
    assert cfg["sliding_window"] == 16 and cfg.get("rope_theta", 500_000.0) == 500_000.0


def test_an_edited_config_json_is_refused(ref_run, tmp_path):
    forged = forge.config_json(ref_run, str(tmp_path))
    _refused(_train("generate", forged, *GEN), "config.json is not the config the run's "
                                               "genesis hashes")


def test_a_tokenizer_edited_in_place_is_refused(ref_run, mix4, tmp_path):
    mix = forge.tokenizer_edited(mix4, str(tmp_path))
    run = forge.point_run_at(ref_run, mix, str(tmp_path))
    _refused(_train("generate", run, *GEN), "tokenizer.json", "not the tokenizer of mix",
             "edited or replaced")
    _refused(_train("export", run, "--out", str(tmp_path / "hf")), "tokenizer.json")


def test_a_self_consistent_mix_with_another_tokenizer_is_refused(ref_run, mix4, tmp_path):
    mix = forge.other_tokenizer(mix4, str(tmp_path))
    run = forge.point_run_at(ref_run, mix, str(tmp_path))
    _refused(_train("generate", run, *GEN), "the run's genesis names", "not the run's mix")


def test_the_run_hash_is_pinned_or_the_output_says_it_is_not(ref_run):
    p = _train("generate", ref_run, *GEN)
    assert p.returncode == 0 and "the run hash is not pinned" in p.stderr
    assert json.loads(p.stdout)["run_hash_pinned"] is False
    h = forge.last_hash(ref_run)
    p = _train("generate", ref_run, *GEN, "--expect-run-hash", h)
    assert p.returncode == 0 and "not pinned" not in p.stderr
    assert json.loads(p.stdout)["run_hash"] == h
    other = "0" * 64
    _refused(_train("generate", ref_run, *GEN, "--expect-run-hash", other),
             "is not the published run")
