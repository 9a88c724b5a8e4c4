"""lm-evaluation-harness's own ``lm_eval`` command (the executable of the environment
running the tests, in a subprocess: the ``open1b`` model comes from the installed startup
hook, open1b_eval/lmeval_hook.py) runs the model on two local tasks - multiple choice and
generation, YAML + JSON lines in tests/eval/tasks, nothing downloaded - and reports the
scores this test computes itself from the runtime's own log-likelihoods and greedy tokens."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.runs import cli_env

TASKS = Path(__file__).parent / "tasks"

MC_YAML = """task: open1b_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""
GEN_YAML = """task: open1b_tiny_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""


def write_tasks(dst: Path) -> str:
    """The two task YAMLs, pointing at the committed JSON lines by absolute path."""
    (dst / "mc.yaml").write_text(MC_YAML.format(data=TASKS / "mc.jsonl"))
    (dst / "gen.yaml").write_text(GEN_YAML.format(data=TASKS / "gen.jsonl"))
    return str(dst)


def _rows(name):
    return [json.loads(line) for line in (TASKS / name).read_text().splitlines()]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def lm_eval_command(args: list[str], out: Path) -> dict:
    """Run this environment's ``lm_eval`` executable with ``args``; its results JSON."""
    exe = Path(sys.executable).parent / "lm_eval"
    if not exe.exists():
        pytest.skip("lm-eval is not installed (the test extra installs it)")
    env = cli_env()
    probe = subprocess.run([sys.executable, "-c", "import sys; print('open1b_eval.lmeval_hook' "
                            "in sys.modules)"], env=env, capture_output=True, text=True)
    assert probe.stdout.strip() == "True", (
        f"the startup hook open1b_lmeval.pth is not installed in {sys.prefix} (or fails): "
        f"reinstall the package there (pip install -e .); {probe.stderr[-2000:]}")
    r = subprocess.run([str(exe), *args, "--output_path", str(out)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    found = sorted(out.rglob("results*.json"))
    assert len(found) == 1, f"expected one results file under {out}, got {found}"
    return json.loads(found[0].read_text())


def test_lm_eval_command_scores_are_the_runtimes(ref_run, tmp_path):
    pytest.importorskip("lm_eval")
    from open1b_eval.harness import Open1bLM

    res = lm_eval_command(["--model", "open1b", "--model_args", f"run={ref_run},backend=cpu",
                           "--tasks", "open1b_tiny_mc,open1b_tiny_gen", "--num_fewshot", "0",
                           "--include_path", write_tasks(tmp_path)],
                          tmp_path / "out")["results"]
    lm = Open1bLM(run=ref_run, backend="cpu")
    right = 0
    for row in _rows("mc.jsonl"):
        ctx = lm.trained.encode_prompt(row["question"])
        scores = []
        for choice in row["choices"]:
            ids = lm.trained.encode_prompt(row["question"] + choice)
            lp, _ = lm.token_logprobs(ids)
            scores.append(sum(lp[len(ctx) - 1:]))
        right += max(range(len(scores)), key=scores.__getitem__) == row["answer"]
    assert res["open1b_tiny_mc"]["acc,none"] == pytest.approx(right / 4, abs=1e-12)

    from open1b_eval.generate import generate
    hits = 0
    for row in _rows("gen.jsonl"):
        g = generate(lm.dec, [lm.trained.encode_prompt(row["prompt"])], 6,
                     stop_id=lm.trained.eot)[0]
        text = lm.trained.decode([t for t in g if t != lm.trained.eot]).split("\n")[0]
        hits += text == row["target"]
    assert res["open1b_tiny_gen"]["exact_match,none"] == pytest.approx(hits / 3, abs=1e-12)


def test_loglikelihood_rolling_sums_every_token(ref_run):
    pytest.importorskip("lm_eval")
    from lm_eval.api.instance import Instance

    from open1b_eval.harness import Open1bLM

    lm = Open1bLM(run=ref_run, backend="cpu", max_length=16)
    text = "Coulomb wave functions describe the scattering of charged particles in a field."
    got = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])[0]
    ids = lm.trained.encode(text)
    assert len(ids) > 16
    full, want = [lm.trained.eot] + ids, 0.0
    for start in range(1, len(full), 16):  # disjoint windows of 16 predictions, 16 inputs
        end = min(start + 16, len(full))
        lp, _ = lm.token_logprobs(full[max(0, end - 17):end])
        want += sum(lp[-(end - start):])
    assert got == pytest.approx(want, abs=1e-6) and got < 0


def test_suite_over_two_checkpoints_writes_table_json_and_png(ref_run, tmp_path):
    pytest.importorskip("lm_eval")
    from click.testing import CliRunner

    from open1b_eval.cli import main

    out = tmp_path / "suite"
    r = CliRunner().invoke(main, ["suite", ref_run, "--tasks", "open1b_tiny_mc", "--steps",
                                  "4,8", "--include-path", write_tasks(tmp_path),
                                  "--out", str(out), "--backend", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output[r.output.index("{"):])["rows"]
    assert [(x["step"], x["tokens"], x["metric"]) for x in rows] == [(4, 512, "acc"),
                                                                      (8, 1024, "acc")]
    assert (out / "suite.png").stat().st_size > 1000 and (out / "suite.md").exists()
