"""open1b-train through its real command line: outputs, and every error path as one line
(non-zero exit, no traceback)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit.runs import REF_STEPS, cli_env


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "open1b_train.cli", *args], env=cli_env(),
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def test_show_and_plot(ref_run, tmp_path):
    r = _cli("show", ref_run, "--step", "3", "--top", "2")
    assert r.returncode == 0, r.stderr
    assert "step 3" in r.stdout and "components" not in r.stdout and "params" in r.stdout
    assert ".parquet" in r.stdout              # the source documents behind the windows
    j = json.loads(_cli("show", ref_run, "--step", "3", "--json").stdout)
    assert j["step"] == 3 and len(j["windows"]) == 4 and len(j["top"]) == 4 * 0 + 4
    assert all(d["doc_id"] for w in j["top"] for d in w["documents"])
    png = tmp_path / "t.png"
    r = _cli("plot", ref_run, "--out", str(png))
    assert r.returncode == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,code,needle", [
    (["run", "--preset", "micro", "--mix", "/nonexistent/mix"], 1, "/nonexistent/mix"),
    (["run", "--preset", "micro", "--mesh", "2x"], 2, "--mesh"),
    (["run", "--preset", "nano"], 1, "unknown preset 'nano'"),
    (["run", "--steps", "0"], 2, "--steps"),
    (["resume", "/nonexistent/run"], 1, "/nonexistent/run"),
    (["show", "/nonexistent/run", "--step", "1"], 1, "/nonexistent/run"),
    (["plot", "/nonexistent/run"], 1, "/nonexistent/run"),
])
def test_error_paths_are_one_line(args, code, needle, tmp_path):
    r = _cli(*args, cwd=str(tmp_path))
    assert r.returncode == code, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("Error")]
    assert len(err) == 1 and needle in err[0], r.stderr


def test_bad_config_fields_name_the_field(tmp_path, mix4):
    cases = {'preset = "micro"\nmseh = [2, 1]\n': "mseh: unknown field (did you mean 'mesh'?)",
             'preset = "micro"\n[model]\nd_model = -4\n': "model.d_model: must be an integer >= 1",
             'preset = "micro"\n[model]\nhead_dim = 48\n': "model.head_dim: must be a power of two",
             'preset = "micro"\nbeta2 = 1.5\n': "beta2: must be in [0.0, 1.0)",
             'preset = "micro"\nclip = "big"\n': "clip: expected float"}
    for text, needle in cases.items():
        cfg = tmp_path / "c.toml"
        cfg.write_text(text)
        r = _cli("run", "--config", str(cfg), "--mix", mix4, "--out", str(tmp_path / "r"))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert needle in r.stderr, (needle, r.stderr)


def test_show_out_of_range_step(ref_run):
    r = _cli("show", ref_run, "--step", str(REF_STEPS + 5))
    assert r.returncode == 1 and f"steps 0..{REF_STEPS}" in r.stderr
