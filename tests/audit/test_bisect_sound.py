"""Bisect is sound: it vouches only for the checkpoint intervals it replayed.

Each checkpoint interval is an independent claim (a replay starts from the published
checkpoint, checked against the log), so a forger can make one interval wrong and every
later one right. The forgery here changes the Adam moments in checkpoint 4, fixes the
file's sha256 and the record, rewrites the log's optim digest for step 4, re-hashes the
chain and trains steps 5..8 honestly from the forged state: interval [2, 4] does not
reproduce, [4, 6] and [6, 8] do. A binary search that samples [4, 6] and [6, 8] sees
nothing; an exhaustive bisect must name step 4 and exit non-zero.
"""
from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from open1b_audit.cli import main as audit_cli
from open1b_train import checkpoint, runlog, statehash
from open1b_train.params import Layout, param_specs
from open1b_train.run import read_run
from open1b_train.train import train
from testkit.forger import rewrite_in_record
from testkit.tamper import rehash_chain
from testkit.runs import REF_STEPS, micro_cfg

FORGED = 4


def forge_checkpoint_then_train_on(ref_run: str, mix: str, out: str, at: int = FORGED) -> str:
    """A copy of ``ref_run`` whose checkpoint ``at`` holds altered Adam moments, with a log
    and record made consistent with them, and every later step trained honestly from it."""
    shutil.copytree(ref_run, out)
    ck = checkpoint.step_dir(out, at)
    name = next(n for n in sorted(os.listdir(ck)) if n.startswith("optim-"))
    t = st_load(open(os.path.join(ck, name), "rb").read())
    key = next(k for k in sorted(t) if k.startswith("m."))
    t[key].view(-1)[3] += 1e-3
    rewrite_in_record(ck, name, st_save(t))
    loaded = checkpoint.load(ck)
    layout = Layout(param_specs(read_run(out)[0].model))
    m, v = layout.zeros(), layout.zeros()
    for flat, part in ((m, loaded.m), (v, loaded.v)):
        for n, view in layout.views(flat).items():
            view.copy_(part[n])
    rec = loaded.record
    lines = runlog.read(out)[:at + 1]
    lines[at]["components"]["optim"] = statehash.optim_digest(
        layout.views(m), layout.views(v), int(rec["adam_step"]), int(rec["skip_left"]))
    rehash_chain(lines, at)
    runlog.rewrite(out, lines)
    rec["run_hash"] = lines[at]["hash"]
    if "components" in rec:
        rec["components"]["optim"] = lines[at]["components"]["optim"]
    with open(os.path.join(ck, "record.json"), "w") as f:
        json.dump(rec, f, sort_keys=True, indent=1)
    for s in checkpoint.list_steps(out):
        if s > at:
            shutil.rmtree(checkpoint.step_dir(out, s))
    shutil.rmtree(os.path.join(out, "traces"), ignore_errors=True)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(micro_cfg(steps=REF_STEPS), mix, out, progress=False)   # resumes from ``at``
    finally:
        torch.set_num_threads(n)
    return out


@pytest.fixture(scope="module")
def forged_run(ref_run, mix4, tmp_path_factory) -> str:
    return forge_checkpoint_then_train_on(ref_run, mix4,
                                          str(tmp_path_factory.mktemp("forged") / "run"))


def _bisect(*args: str) -> tuple[int, dict, str]:
    res = CliRunner().invoke(audit_cli, ["bisect", *args, "--json"])
    human = CliRunner().invoke(audit_cli, ["bisect", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    assert human.exit_code == res.exit_code, human.output
    return res.exit_code, json.loads(res.output), human.output


def test_the_forgery_is_a_consistent_chain(forged_run):
    lines = runlog.read(forged_run)
    assert len(lines) == REF_STEPS + 1 and checkpoint.list_steps(forged_run) == [0, 2, 4, 6, 8]
    res = CliRunner().invoke(audit_cli, ["chain", forged_run])
    assert res.exit_code == 0, res.output


@pytest.mark.slow
def test_a_forged_checkpoint_interval_is_found_and_fails(forged_run):
    code, rep, human = _bisect(forged_run, "--until", str(REF_STEPS))
    assert code != 0
    assert rep["step"] == FORGED and rep["finding"]["component"] == "optim", rep
    assert rep["vouched"] is False
    assert rep["replayed_intervals"] == [[0, 2], [2, 4]]
    assert rep["not_replayed"] == [[4, 6], [6, 8]]
    assert rep["verified_steps"] == [1, 2, 3]
    assert "all reproduce" not in human
    assert f"first differing step: {FORGED}" in human
    assert "not replayed" in human and "5..6" in human and "7..8" in human


@pytest.mark.slow
def test_binary_search_says_what_it_did_not_replay(forged_run):
    code, rep, human = _bisect(forged_run, "--until", str(REF_STEPS), "--search", "binary")
    assert code != 0
    assert rep["search"] == "binary" and rep["vouched"] is False
    assert rep["step"] is None                        # it sampled only honest intervals
    assert rep["replayed_intervals"] == [[4, 6], [6, 8]]
    assert rep["not_replayed"] == [[0, 2], [2, 4]]
    assert rep["verified_steps"] == [5, 6, 7, 8]
    assert "all reproduce" not in human
    assert "not replayed" in human and "1..2" in human and "3..4" in human
    assert "NOT vouched" in human


@pytest.mark.slow
def test_an_honest_range_is_vouched_for(ref_run):
    code, rep, human = _bisect(ref_run, "--until", "5")
    assert code == 0, human
    assert rep["vouched"] is True and rep["step"] is None and rep["not_replayed"] == []
    assert rep["replayed_intervals"] == [[0, 2], [2, 4], [4, 5]]
    assert rep["verified_steps"] == [1, 2, 3, 4, 5]
    assert "steps 1..5" in human and "all reproduce" in human
