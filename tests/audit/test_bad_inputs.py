"""Every bad input an auditor can be handed ends in one line and a non-zero exit through the
real ``open1b-audit`` / ``open1b-train`` commands - never a traceback, never a hang.

``CASES``: (name, how to break a copy of the reference run, argv, kind, what the output
must name). ``kind`` "error": exit 1 and exactly one line on standard error; "finding": the
command reports (standard output names the step and what is wrong) and exits 1, standard
error holds at most one line (coverage's warning). Each runs in a subprocess with a
timeout, so a FIFO that blocks an ``open`` fails the test instead of hanging it.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from open1b_train import checkpoint, runlog
from testkit.runs import cli_env

TIMEOUT = 120          # seconds: an import of torch on a busy machine, not a hang


def _set(field, value):
    def edit(run):
        lines = runlog.read(run)
        lines[3][field] = value
        runlog.rewrite(run, lines)
    return edit


def _raw_line(raw: bytes):
    def edit(run):
        p = runlog.path_of(run)
        kept = open(p, "rb").read().split(b"\n")
        kept[3] = raw
        open(p, "wb").write(b"\n".join(kept))
    return edit


def _fifo(rel):
    def edit(run):
        p = os.path.join(run, rel)
        os.remove(p)
        os.mkfifo(p)
    return edit


def _device(rel):
    def edit(run):
        p = os.path.join(run, rel)
        os.remove(p)
        os.symlink("/dev/zero", p)
    return edit


def _cert(content):
    def edit(run):
        p = os.path.join(run, "cert.json")
        if content == "fifo":
            os.mkfifo(p)
        else:
            open(p, "wb").write(content)
    return edit


CK = os.path.join(checkpoint.DIR, "step-00000002")
A, T = ("audit",), ("train",)
LOG = runlog.NAME
CASES = [
    # log lines whose fields have the wrong type
    ("step-str", _set("step", "3"), A + ("chain", "{run}"), "finding", "step 3: log"),
    ("comps-list", _set("components", []), A + ("chain", "{run}"), "finding", "components"),
    ("scalars-int", _set("scalars", 5), A + ("chain", "{run}"), "finding", "scalars"),
    ("hash-int", _set("hash", 7), A + ("chain", "{run}"), "finding", "hash 7"),
    ("comps-list-replay", _set("components", []), A + ("replay", "{run}", "--step", "4"),
     "finding", "its components are list"),
    ("comps-list-bisect", _set("components", []), A + ("bisect", "{run}", "--until", "4"),
     "finding", "first differing step: 3"),
    ("comps-list-coverage", _set("components", []),
     A + ("coverage", "{run}", "{run}/config.json"), "error", "not one chain"),
    ("comps-list-trace", _set("components", []),
     A + ("trace", "{run}", "--step", "4", "--out", "{run}/t.jsonl"), "error", "not replayed"),
    ("comps-list-show", _set("components", []),
     T + ("show", "{run}", "--step", "3"), "error", "components"),
    # JSON nested 100000 deep
    *[(f"deep-{c[0]}", _raw_line(b"[" * 100000), A + c, "error", "nested too deeply")
      for c in (("chain", "{run}"), ("replay", "{run}", "--step", "4"),
                ("bisect", "{run}", "--until", "4"),
                ("coverage", "{run}", "{run}/config.json"),
                ("trace", "{run}", "--step", "4", "--out", "{run}/t.jsonl"))],
    ("deep-show", _raw_line(b"[" * 100000), T + ("show", "{run}", "--step", "3"), "error",
     "nested too deeply"),
    # a FIFO or a device in place of the log
    *[(f"fifo-{c[0]}", _fifo(LOG), A + c, "error", "FIFO")
      for c in (("chain", "{run}"), ("replay", "{run}", "--step", "4"),
                ("bisect", "{run}", "--until", "4"),
                ("coverage", "{run}", "{run}/config.json"),
                ("trace", "{run}", "--step", "4", "--out", "{run}/t.jsonl"))],
    ("fifo-show", _fifo(LOG), T + ("show", "{run}", "--step", "3"), "error", "FIFO"),
    # a link to a device in place of the log: never followed (a link could name any file)
    ("zero-chain", _device(LOG), A + ("chain", "{run}"), "error", "symbolic link"),
    ("zero-replay", _device(LOG), A + ("replay", "{run}", "--step", "4"), "error",
     "symbolic link"),
    # certificates: a FIFO, JSON nested too deeply, wrong types
    ("cert-fifo", _cert("fifo"), A + ("coverage", "{run}", "{run}/cert.json"), "finding",
     "FIFO"),
    ("cert-deep", _cert(b"[" * 100000), A + ("coverage", "{run}", "{run}/cert.json"),
     "finding", "nested too deeply"),
    ("cert-types", _cert(json.dumps({"format": "open1b-certificate", "version": 1,
                                     "step": "3", "run": 5}).encode()),
     A + ("coverage", "{run}", "{run}/cert.json"), "finding", "step must be an integer"),
    # a checkpoint's files (open1b_train/checkpoint.py reads them)
    ("ck-record-fifo", _fifo(os.path.join(CK, "record.json")),
     A + ("replay", "{run}", "--step", "3"), "finding", "FIFO"),
    ("ck-params-fifo", _fifo(os.path.join(CK, "params.safetensors")),
     A + ("replay", "{run}", "--step", "3"), "finding", "FIFO"),
]


def _cmd(prog: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "open1b_audit.cli" if prog == A else "open1b_train"]


def _id(c) -> str:
    return c.values[0] if hasattr(c, "values") else c[0]


@pytest.mark.parametrize("name,edit,argv,kind,needle", CASES, ids=[_id(c) for c in CASES])
def test_bad_input_is_one_line_and_nonzero(ref_run, tmp_path, name, edit, argv, kind, needle):
    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    edit(run)
    args = [a.replace("{run}", run) for a in argv[1:]]
    try:
        r = subprocess.run(_cmd(argv[:1]) + args, env=cli_env(), capture_output=True,
                           text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: {' '.join(argv[:2])} hung for {TIMEOUT} s")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out, out
    err = r.stderr.strip().splitlines()
    if kind == "error":
        assert r.returncode == 1 and len(err) == 1, out
        assert needle in err[0], out
    else:
        assert r.returncode == 1 and len(err) <= 1, out
        assert needle in out, out
