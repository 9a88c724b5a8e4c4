"""build-mix's error paths through the real command (the installed ``open1b-data`` entry
point in a subprocess): a bad option or a typo in the mix file exits non-zero with one
``Error:`` line naming the value and what to do, no traceback, and writes nothing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from open1b_data.formats.definition import default_mix_path


def _cli() -> list[str]:
    script = Path(sys.executable).parent / "open1b-data"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from open1b_data.cli import main; main()"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*_cli(), "build-mix", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))


def _one_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.mark.parametrize("args,expected", [
    (["--workers", "0"], "Invalid value for '--workers': 0 is not in the range x>=1"),
    (["--workers", "-3"], "Invalid value for '--workers': -3 is not in the range x>=1"),
    (["--tasks", "0", "--task", "0"], "Invalid value for '--tasks': 0 is not in the range"),
    (["--task", "-1", "--tasks", "2"], "Invalid value for '--task': -1 is not in the range"),
    (["--task", "3", "--tasks", "3"], "--task must be in [0, --tasks=3), got 3"),
    (["--tasks", "4"], "--tasks needs --task i"),
    (["--tokenizer-only", "--task", "0", "--tasks", "2"], "--tokenizer-only runs alone"),
], ids=["workers0", "workers-3", "tasks0", "task-1", "task=tasks", "tasks-alone",
        "tokenizer-only-task"])
def test_bad_options_fail_in_one_line(tmp_path, args, expected):
    proc = _run(*args, "--out", str(tmp_path / "mix"), cwd=tmp_path)
    assert expected in _one_error(proc)
    assert not (tmp_path / "mix").exists()


def test_a_typo_in_the_mix_file_fails_in_one_line(tmp_path):
    text = Path(default_mix_path()).read_text()
    first = text.index("[sources.filters]")
    second = text.index("[sources.filters]", first + 1)   # FineWeb-Edu's: the score filter
    bad = tmp_path / "typo.toml"
    bad.write_text(text[:second] + "[sources.filter]" + text[second + len("[sources.filters]"):])
    proc = _run("--manifest", str(bad), "--out", str(tmp_path / "mix"), cwd=tmp_path)
    assert proc.returncode == 1
    error = _one_error(proc)
    assert "sources[1].filter: unknown table; did you mean 'filters'?" in error
    assert not (tmp_path / "mix").exists()
