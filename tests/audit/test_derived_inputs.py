"""What a replay or a resume reads is hashed or re-derived, never trusted: the forgeries of
a run owner who edits what no hash covers.

* The stream position in a checkpoint's ``record.json`` (``loader``): an edited buffer
  offset, trained on from that checkpoint, gave a run whose later steps used windows that
  are not the stream's, and every interval replay said MATCH. Now the position is derived
  from (seed, mix, step); a stored one that differs is refused naming the step and field.
* Resume destroyed the published lines past the checkpoint before recomputing them.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from open1b_audit.replay import replay
from open1b_data import StreamPlan
from open1b_data.errors import StateMismatchError
from open1b_data.stream.state import StreamState
from open1b_train import checkpoint, runlog
from open1b_train.errors import ReproducibilityError, ResumeError
from open1b_train.train import train
from testkit import tamper
from testkit.runs import REF_STEPS, micro_cfg


def _edit_loader_offset(ck_dir: str) -> tuple[int, int]:
    """Shift the packing buffer's offset in a checkpoint's record (no hash covers it)."""
    rpath = os.path.join(ck_dir, "record.json")
    rec = json.load(open(rpath))
    buf = rec["loader"]["stream"]["buffer"]
    assert buf is not None, "the fixture's boundary should fall inside a document"
    old = buf["offset"]
    buf["offset"] = old - 1 if old > 1 else old + 1
    json.dump(rec, open(rpath, "w"), sort_keys=True, indent=1)
    return old, buf["offset"]


def _forged_run(ref_run: str, mix4: str, work: str) -> str:
    """The stream offset edited in checkpoint 4, then trained on from it: a forger's run
    whose steps 5.. used windows that are not the stream's (the old code resumed from the
    stored position)."""
    run = os.path.join(work, "run")
    shutil.copytree(ref_run, run)
    _edit_loader_offset(checkpoint.step_dir(run, 4))
    for s in (6, 8):
        shutil.rmtree(checkpoint.step_dir(run, s))
    runlog.rewrite(run, runlog.read(run)[:5])
    return run


def test_a_resume_refuses_an_edited_stream_position(ref_run, mix4, tmp_path):
    run = _forged_run(ref_run, mix4, str(tmp_path))
    with pytest.raises(ResumeError, match=r"loader\.stream\.buffer\.offset .* after step 4"):
        train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)


def test_a_replay_refuses_an_edited_stream_position(ref_run, tmp_path):
    run = os.path.join(tmp_path, "run")
    shutil.copytree(ref_run, run)
    _edit_loader_offset(checkpoint.step_dir(run, 4))
    res = replay(run, 5, from_step=4)
    assert not res.ok
    assert (res.finding.step, res.finding.component) == (4, "checkpoint"), str(res.finding)
    assert "loader.stream.buffer.offset" in res.finding.detail


def test_the_plan_refuses_a_state_whose_offset_was_edited(mix4):
    """The mechanism itself: a stream state is accepted only if it is exactly the stream's."""
    plan = StreamPlan.open(mix4, use_index=False)
    m = next(m for m in range(1, 40) if plan.state_at(m).buffer is not None)
    d = plan.state_at(m).to_dict()
    d["buffer"]["offset"] = d["buffer"]["offset"] - 1 or 2
    fresh = StreamPlan.open(mix4, use_index=False)
    with pytest.raises(StateMismatchError, match=r"buffer\.offset"):
        fresh.from_state(StreamState.from_dict(d))
    assert fresh.from_state(plan.state_at(m)) == m


def test_an_honest_resume_keeps_the_published_lines_until_they_are_recomputed(ref_run, mix4,
                                                                              tmp_path):
    run = os.path.join(tmp_path, "run")
    shutil.copytree(ref_run, run)
    for s in (6, 8):
        shutil.rmtree(checkpoint.step_dir(run, s))
    before = open(runlog.path_of(run), "rb").read()
    train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)
    assert open(runlog.path_of(run), "rb").read() == before      # byte for byte


def test_a_failed_reproduction_keeps_both_lines_and_says_where(ref_run, mix4, tmp_path):
    """A published step 6 whose recomputation differs: the 9 published lines stay (they
    became 6 before), the recomputed line is written beside them, the error names both."""
    run = os.path.join(tmp_path, "run")
    shutil.copytree(ref_run, run)
    for s in (6, 8):
        shutil.rmtree(checkpoint.step_dir(run, s))
    lines = runlog.read(run)
    lines[6]["components"]["grad"] = "0" * 64           # a published line this build won't give
    tamper.rehash_chain(lines, 6)
    runlog.rewrite(run, lines)
    before = open(runlog.path_of(run), "rb").read()
    with pytest.raises(ReproducibilityError) as e:
        train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)
    msg = str(e.value)
    assert "step 6" in msg and "grad" in msg and "line 7 of" in msg
    assert open(runlog.path_of(run), "rb").read() == before
    recomputed = os.path.join(run, "recomputed", "step-00000006.json")
    assert recomputed in msg and os.path.exists(recomputed)
    assert json.load(open(recomputed))["components"]["grad"] != "0" * 64


def test_a_partial_last_line_is_set_aside_not_dropped(ref_run, mix4, tmp_path):
    run = os.path.join(tmp_path, "run")
    shutil.copytree(ref_run, run)
    with open(runlog.path_of(run), "ab") as f:
        f.write(b'{"step":9,"hash":"ab')
    train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)
    aside = runlog.path_of(run) + ".partial-0"
    assert open(aside, "rb").read() == b'{"step":9,"hash":"ab'
    assert open(runlog.path_of(run), "rb").read().endswith(b"\n")
