"""The golden trajectories (``open1b_audit.selftest.trajectory``): every component of every
step of a fresh run must equal tests/assets/trajectory_<name>.json, and the test names the
first step and component that differs. The micro trajectory is trained to step 52, then
resumed from that checkpoint to step 100 - the resumed lines must be the golden lines too.
Regenerate only on purpose (a change of the bits, the hash format or the trajectories),
then say why in the commit:
    .venv/bin/python -m tests.train.test_trajectory --write
which also rewrites what ``open1b-audit selftest`` compares with
(open1b_audit/selftest/data/expected.json).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

import pytest

from open1b_audit.selftest import expected as expected_mod
from open1b_audit.selftest import trajectory as tj
from open1b_train import trace as tracemod

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets")


def asset(name: str) -> str:
    return os.path.join(ASSETS, f"trajectory_{name}.json")


def load(name: str) -> dict:
    with open(asset(name)) as f:
        return json.load(f)


def fingerprint(mix: str) -> str:
    with open(os.path.join(mix, "manifest.json")) as f:
        return json.load(f)["fingerprint"]


def check(name: str, want: dict, mix: str, lines: list[dict]) -> None:
    assert fingerprint(mix) == want["mix_fingerprint"], (
        f"the {name} trajectory's mix changed: regenerate (module docstring) if intended")
    assert tj.config(name).identity_sha256() == want["config_identity"]
    diff = tj.first_difference(want, lines)
    assert diff is None, f"{name} trajectory: step {diff['step']} {diff['component']} differs"


@pytest.mark.slow
def test_micro_trajectory_with_a_resume_in_the_middle_is_the_golden_one(tmp_path):
    t, want = tj.TRAJECTORIES["micro"], load("micro")
    mix = tj.build_mix("micro", str(tmp_path / "mix"))
    run = str(tmp_path / "run")
    first = tj.train_lines("micro", mix, run, steps=t.resume_at)
    assert len(first) == t.resume_at + 1
    check("micro", want, mix, first)
    lines = tj.train_lines("micro", mix, run)          # resumes from step resume_at
    assert len(lines) == t.steps + 1 == want["steps"] + 1
    check("micro", want, mix, lines)
    # what the 100 steps are there to exercise
    by = {ln["step"]: ln for ln in lines[1:]}
    assert [by[s]["phase"] for s in (80, 81)] == [0, 1]
    assert [len(by[s]["scalars"]["window_loss"]) for s in (80, 81)] == [3, 9]  # A = 1, 3
    skipped = {s for s, ln in by.items() if ln["scalars"]["skipped"]}
    assert {50, 51, 52, 53, 54} <= skipped and by[50]["scalars"]["spike"]   # injected
    assert any(ln["scalars"]["spike"] for s, ln in by.items() if s != 50)   # and genuine
    lr = [by[s]["lr"] for s in sorted(by)]
    peak = lr.index(max(lr))
    assert 5 <= peak <= 11 and lr[-1] < lr[peak] / 5


@pytest.mark.slow
def test_demo_trajectory_is_the_golden_one(tmp_path):
    want = load("demo")
    mix = tj.build_mix("demo", str(tmp_path / "mix"))
    check("demo", want, mix, tj.train_lines("demo", mix, str(tmp_path / "run")))


def test_the_selftest_expects_the_golden_trajectory():
    exp, want = expected_mod.load(), load("micro")
    assert exp["micro"]["genesis"] == want["genesis"]
    assert exp["micro"]["mix_fingerprint"] == want["mix_fingerprint"]
    assert exp["micro"]["lines"] == want["lines"][:len(exp["micro"]["lines"])]
    assert sorted(int(s) for s in exp["traces"]) == [ln["step"] for ln in exp["micro"]["lines"]]


def write() -> None:
    exp: dict = {}
    with tempfile.TemporaryDirectory() as d:
        for name in tj.TRAJECTORIES:
            mix = tj.build_mix(name, os.path.join(d, f"mix-{name}"))
            run = os.path.join(d, f"run-{name}")
            traced = frozenset(range(1, expected_mod.STEPS + 1)) if name == "micro" else frozenset()
            lines = tj.train_lines(name, mix, run, trace_steps=traced)
            rec = tj.record(name, fingerprint(mix), lines)
            with open(asset(name), "w") as f:
                json.dump(rec, f, indent=1, sort_keys=True)
                f.write("\n")
            print(f"wrote {asset(name)}")
            if name == "micro":
                exp["micro"] = dict(rec, steps=expected_mod.STEPS,
                                    lines=rec["lines"][:expected_mod.STEPS])
                exp["traces"] = {str(s): tracemod.read(tracemod.path_of(run, s))[1]
                                 for s in sorted(traced)}
    exp["demo_init"] = expected_mod.demo_init()
    expected_mod.write(exp)
    print(f"wrote {expected_mod.PATH}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        print(__doc__)
