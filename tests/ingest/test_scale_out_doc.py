"""docs/SCALE-OUT.md's job scripts are copy-pasteable: every shell block is valid bash,
every YAML block is a valid Job, every ``open1b-data build-mix`` command in them parses
with the real command's options, and N is the same wherever it is written."""
from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
import yaml

from open1b_data.cli.build import build_mix

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "SCALE-OUT.md")
# Values for the scripts' variables, as a job would have them.
ENV = {"MIX": "manifests/mix-0626.toml", "OUT": "s3://my-bucket/mix-0626", "N": "64",
       "SLURM_ARRAY_TASK_ID": "5", "SLURM_CPUS_PER_TASK": "8", "JOB_COMPLETION_INDEX": "5"}


def _blocks(lang: str) -> list[str]:
    with open(DOC) as f:
        return re.findall(rf"```{lang}\n(.*?)```", f.read(), flags=re.S)


def _build_mix_commands(script: str) -> list[list[str]]:
    """Every ``open1b-data build-mix`` command of a shell script, its arguments expanded."""
    joined = script.replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        if "open1b-data build-mix" not in line:
            continue
        line = line[line.index("open1b-data build-mix"):].split("&&")[0].split(">")[0]
        line = re.sub(r'"?\$\{?(\w+)\}?"?', lambda m: ENV[m.group(1)], line)
        commands.append(shlex.split(line)[2:])
    return commands


def _parses(args: list[str]) -> dict:
    ctx = build_mix.make_context("build-mix", list(args))
    return ctx.params


def test_shell_blocks_are_valid_bash():
    blocks = _blocks("bash")
    assert len(blocks) >= 5
    for block in blocks:
        proc = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True)
        assert proc.returncode == 0, (proc.stderr, block)


def test_slurm_commands_parse_and_agree_on_n():
    scripts = "\n".join(_blocks("bash"))
    commands = _build_mix_commands(scripts)
    stages = [("tokenizer_only", True), ("task", 5), ("merge_only", True)]
    assert len(commands) == 3
    for args, (key, value) in zip(commands, stages):
        params = _parses(args)
        assert params[key] == value, (args, params)
        assert params["manifest_path"] == ENV["MIX"] and params["out"] == ENV["OUT"]
    assert _parses(commands[1])["tasks"] == 64
    n = re.search(r"export N=(\d+)", scripts).group(1)
    last = re.search(r"#SBATCH --array=0-(\d+)", scripts).group(1)
    assert int(last) + 1 == int(n) == int(ENV["N"])


def test_kubernetes_jobs_are_valid_and_agree_on_n():
    jobs = {}
    for block in _blocks("yaml"):
        job = yaml.safe_load(block)
        assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        (container,) = job["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        script = shlex.join(command) if command[0] != "sh" else command[2]
        (args,) = _build_mix_commands(script)
        jobs[job["metadata"]["name"]] = (job, _parses(args))
    assert set(jobs) == {"mix0626-tokenizer", "mix0626-build", "mix0626-merge"}
    build, params = jobs["mix0626-build"]
    assert build["spec"]["completionMode"] == "Indexed"
    assert params["tasks"] == build["spec"]["completions"]
    assert params["task"] == int(ENV["JOB_COMPLETION_INDEX"])
    assert jobs["mix0626-tokenizer"][1]["tokenizer_only"]
    assert jobs["mix0626-merge"][1]["merge_only"]
    outs = {p["out"] for _, p in jobs.values()}
    assert outs == {"s3://my-bucket/mix-0626"}


@pytest.mark.parametrize("bad", [["--tasks", "0"], ["--workers", "0"]])
def test_the_parser_used_here_rejects_bad_options(bad):
    import click

    with pytest.raises(click.BadParameter):
        _parses(bad)
