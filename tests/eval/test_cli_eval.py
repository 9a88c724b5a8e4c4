"""The commands: open1b-train generate / export, open1b-eval perplexity (one step and
--all-steps) - outputs, JSON shapes and one-line errors."""
from __future__ import annotations

import json
import math
import os

from click.testing import CliRunner

from open1b_eval.cli import main as eval_main
from open1b_train.cli import main as train_main

TEXT = "Coulomb wave functions describe the scattering of charged particles.\n" * 3


def test_generate_json_is_reproducible_and_names_the_step(ref_run):
    args = ["generate", ref_run, "--step", "6", "--prompt", "The electric", "--prompt", "def",
            "--max-tokens", "5", "--temperature", "0.9", "--seed", "4", "--json"]
    a = CliRunner().invoke(train_main, args)
    assert a.exit_code == 0, a.output
    rep = json.loads(a.stdout)
    assert rep["step"] == 6 and len(rep["outputs"]) == 2
    assert all(1 <= len(o["ids"]) <= 5 for o in rep["outputs"])
    b = CliRunner().invoke(train_main, args[:4] + args[6:])      # the second prompt alone
    assert json.loads(b.stdout)["outputs"][0]["ids"] == rep["outputs"][1]["ids"]


def test_generate_refuses_a_missing_step_in_one_line(ref_run):
    r = CliRunner().invoke(train_main, ["generate", ref_run, "--step", "5", "--prompt", "x"])
    assert r.exit_code == 1 and "no checkpoint at step 5" in r.output
    assert "Traceback" not in r.output


def test_export_writes_a_transformers_directory(ref_run, tmp_path):
    out = tmp_path / "hf"
    r = CliRunner().invoke(train_main, ["export", ref_run, "--out", str(out)])
    assert r.exit_code == 0, r.output
    names = set(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json"} <= names
    assert json.loads((out / "config.json").read_text())["model_type"] == "open1b"


def test_perplexity_per_source_and_over_steps(ref_run, tmp_path):
    f1, f2 = tmp_path / "physics.txt", tmp_path / "code.txt"
    f1.write_text(TEXT)
    f2.write_text("def main():\n    return 0\n" * 4)
    r = CliRunner().invoke(eval_main, ["perplexity", ref_run, str(f1), str(f2), "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert set(rep["sources"]) == {"physics.txt", "code.txt"} and rep["window"] == 32
    s = rep["sources"]["physics.txt"]
    assert math.isclose(s["perplexity"], math.exp(s["loss"]))
    png = tmp_path / "val.png"
    r = CliRunner().invoke(eval_main, ["perplexity", ref_run, str(f1), "--all-steps",
                                       "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert png.stat().st_size > 1000 and r.stdout.count("step ") == 5
    bad = CliRunner().invoke(eval_main, ["perplexity", ref_run])
    assert bad.exit_code == 1 and "no text files" in bad.output


def test_export_without_transformers_names_the_extra_to_install(ref_run, tmp_path):
    """After `make demo` (the runtime dependencies only) `export` failed with "No module
    named 'transformers'" as an internal error (exit 3); it now names the extra."""
    import subprocess
    import sys

    from testkit.runs import cli_env

    code = ("import sys; sys.modules['transformers'] = None; from open1b_train.cli import main;"
            f" sys.argv = ['open1b-train', 'export', {ref_run!r}, '--out', "
            f"{str(tmp_path / 'hf')!r}]; main()")
    p = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "pip install -e '.[eval]'" in p.stderr and "'transformers'" in p.stderr
