"""The promise: every way of tampering with a published run is caught, and the report names
the step and the component. An honest micro run is tampered with, a copy per case; the
audit replays every checkpoint interval (what auditors covering the whole run do)."""
from __future__ import annotations

import os

import pytest

from open1b_train import runlog
from testkit import auditors, hostile, tamper
from testkit.runs import cli_env

audit_all = tamper.audit_all


def test_the_honest_run_passes(ref_run):
    assert audit_all(ref_run) is None


@pytest.fixture(scope="module")
def other_run(mix4, tmp_path_factory) -> str:
    """Another run (mesh 2x1) whose checkpoint gets substituted."""
    return tamper.rank_gradient(mix4, str(tmp_path_factory.mktemp("other")))[0]


def test_every_case_has_one_maker_of_its_own():
    # the makers were an if/elif chain on name prefixes whose last branch made an edited log
    # line: a new case without its own branch would have tested another forgery than its
    # name says; now a case without a maker fails here (and in make, by name)
    assert set(tamper.MAKERS) | set(hostile.REPLAY_CASES) == set(tamper.CASES)
    assert not set(tamper.MAKERS) & set(hostile.REPLAY_CASES)
    with pytest.raises(KeyError):
        tamper.make("a case nobody wrote", "run", "mix", "other", "work")


@pytest.mark.slow
@pytest.mark.parametrize("case", list(tamper.CASES))
def test_tampering_is_caught_naming_step_and_component(case, tmp_path, ref_run, mix4,
                                                       other_run):
    component, step = tamper.CASES[case]
    run, mix, caught_at = tamper.make(case, ref_run, mix4, other_run, str(tmp_path))
    step = caught_at if step is None else step
    assert os.path.exists(run)
    expect = runlog.read(ref_run)[-1]["hash"] if any(k in case for k in tamper.PINNED) else None
    found = audit_all(run, mix, expect)
    assert found is not None, f"not caught: {case}"
    assert (found.component, found.step) == (component, step), str(found)


def test_forged_auditors_are_never_counted(ref_run, tmp_path):
    """The tamper table's second half: certificates written without replaying anything."""
    for name, (rep, step) in auditors.coverage_forgeries(runlog.read(ref_run),
                                                       str(tmp_path)).items():
        assert auditors.coverage_caught(rep, step), (name, rep)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(hostile.CASES))
def test_hostile_files_are_refused_naming_the_file(case, tmp_path, ref_run, mix4):
    """The tamper table's third part: files planted in a run, mix or certificate folder,
    through the real ``open1b-audit`` command (testkit/hostile.py)."""
    got = hostile.run(hostile.make(case, ref_run, mix4, str(tmp_path)), cli_env())
    assert got.caught, f"{case}: {got.detail}"
