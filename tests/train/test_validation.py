"""Validation loss on held-out windows (``eval_every``): hashed into the step's scalars,
recomputed bit for bit by the audit replay, a forged value named as ``scalars``; a run
without it keeps its identity and lines."""
from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from open1b_audit.replay import replay
from open1b_train import runlog
from open1b_train.config import micro
from open1b_train.errors import ConfigError
from open1b_train.train import train
from testkit.runs import micro_cfg
from testkit.tamper import rehash_chain
from testkit.trainmix import train_mix


@pytest.fixture(scope="module")
def hmix(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("hmix"), steps=8, batch=4, heldout="0.2")


@pytest.fixture(scope="module")
def val_run(hmix, tmp_path_factory) -> str:
    run = str(tmp_path_factory.mktemp("val") / "run")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(micro_cfg(steps=4, eval_every=2, eval_windows=3), hmix, run, progress=False)
    finally:
        torch.set_num_threads(n)
    return run


def test_identity_unchanged_without_validation():
    cfg = micro()
    assert "eval_every" not in cfg.to_dict() and "eval_every" not in cfg.identity()
    on = dataclasses.replace(cfg, eval_every=5)
    assert on.identity()["eval_every"] == 5 and on.identity()["eval_windows"] == 8
    assert on.identity_sha256() != cfg.identity_sha256()


def test_val_loss_on_due_steps_and_replayed_bit_for_bit(val_run, hmix):
    lines = runlog.read(val_run)
    for ln in lines[1:]:
        val = ln["scalars"].get("val_loss")
        if ln["step"] % 2:
            assert val is None
        else:
            assert sorted(val) == sorted(["dclm-baseline", "fineweb-edu", "the-stack-v2",
                                          "proof-pile-2"])
            assert all(isinstance(v, str) and len(v) == 8 for v in val.values())
    res = replay(val_run, 4, backend="cpu")
    assert res.ok, res.finding
    assert res.lines[4]["scalars"]["val_loss"] == lines[4]["scalars"]["val_loss"]


def test_forged_val_loss_is_named_as_scalars(val_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(val_run, run)
    lines = runlog.read(run)
    name = sorted(lines[4]["scalars"]["val_loss"])[0]
    lines[4]["scalars"]["val_loss"][name] = "3f800000"     # a better-looking 1.0
    rehash_chain(lines, 4)
    runlog.rewrite(run, lines)
    res = replay(run, 4, backend="cpu", from_step=2)
    assert not res.ok and res.finding.step == 4 and res.finding.component == "scalars"
    assert "val_loss" in res.finding.detail


def test_eval_every_needs_a_heldout_set(mix4, tmp_path):
    with pytest.raises(ConfigError, match="held-out"):
        train(micro_cfg(steps=1, eval_every=1), mix4, str(tmp_path / "run"), progress=False)
