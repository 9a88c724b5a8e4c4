"""The promise: every way of tampering with a published run is caught, and the report names
the step and the component. An honest micro run is tampered with, a copy per case; the
audit replays every checkpoint interval (what auditors covering the whole run do)."""
from __future__ import annotations

import os

import pytest

from open1b_audit.chain import Finding
from open1b_audit.replay import replay
from open1b_train import checkpoint
from tests.audit import tamper


def audit_all(run: str, mix: str | None = None) -> Finding | None:
    """The first finding of replaying every interval between checkpoints, in order."""
    marks = [0] + [c for c in checkpoint.list_steps(run) if c > 0]
    last = max(marks)
    for a, b in zip(marks, marks[1:] + ([last] if last == marks[-1] else [])):
        if b <= a:
            continue
        res = replay(run, b, mix=mix, from_step=a if a in checkpoint.list_steps(run) else 0)
        if res.finding is not None:
            return res.finding
    return None


def test_the_honest_run_passes(ref_run):
    assert audit_all(ref_run) is None


@pytest.fixture(scope="module")
def other_run(mix4, tmp_path_factory) -> str:
    """Another run (mesh 2x1) whose checkpoint gets substituted."""
    return tamper.rank_gradient(mix4, str(tmp_path_factory.mktemp("other")))[0]


CASES = {
    "a token of one window changed in a shard": ("data", None),   # the shard's first use
    "two windows of a step swapped": ("data", 5),
    "one weight changed by 1 ULP in a checkpoint": ("params", 6),
    "a step skipped (its line removed)": ("log", 5),
    "the LR of one step changed": ("scalars", 5),
    "one virtual rank's gradient altered": ("grad", 5),
    "a different seed": ("params", 0),          # the init re-derived from the claimed seed
    "optimizer moments altered": ("optim", 6),
    "a checkpoint of another run substituted": ("checkpoint", 6),
    "a steps.jsonl line edited": ("scalars", 7),
    "a steps.jsonl line edited, the chain rehashed": ("params", 7),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_tampering_is_caught_naming_step_and_component(case, tmp_path, ref_run, mix4,
                                                       other_run):
    work = str(tmp_path)
    mix = None
    component, step = CASES[case]
    if case.startswith("a token"):
        run, mix, step = tamper.token_in_shard(ref_run, mix4, work)
    elif case.startswith("two windows"):
        run, _ = tamper.swapped_windows(mix4, work)
    elif case.startswith("one weight"):
        run, _ = tamper.ulp_weight(ref_run, work)
    elif case.startswith("a step skipped"):
        run, _ = tamper.skipped_step(ref_run, work)
    elif case.startswith("the LR"):
        run, _ = tamper.lr_changed(mix4, work)
    elif case.startswith("one virtual rank"):
        run = other_run
    elif case.startswith("a different seed"):
        run, _ = tamper.other_seed(mix4, work)
    elif case.startswith("optimizer"):
        run, _ = tamper.moments(ref_run, work)
    elif case.startswith("a checkpoint of another"):
        run, _ = tamper.other_checkpoint(ref_run, other_run, work)
    else:
        run, _ = tamper.edited_line(ref_run, work, rehash="rehashed" in case)
    assert os.path.exists(run)
    found = audit_all(run, mix)
    assert found is not None, f"not caught: {case}"
    assert (found.component, found.step) == (component, step), str(found)
