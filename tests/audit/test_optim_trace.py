"""The per-op trace covers the optimizer: the norm, the clip and every parameter's AdamW.

A difference in one parameter's Adam moment is named as that parameter's optimizer op, not
only as a step; tracing changes no bits, and an honest replay's trace equals the run's own.
"""
from __future__ import annotations

import shutil

import pytest
import torch

import open1b_audit.replay as replay_mod
import open1b_train.step as step_mod
from open1b_audit.bisect import bisect, trace_step
from open1b_audit.trace import describe, first_difference
from open1b_train import checkpoint, runlog
from open1b_train.params import param_specs
from open1b_train.trace import path_of, read
from open1b_train.run import read_run
from open1b_train.train import train
from testkit.tamper import Patch
from testkit.runs import REF_STEPS, micro_cfg

PARAM = "layers.1.mlp.down.weight"


def test_describe_parses_optimizer_ops():
    d = describe(f"optim.adamw.{PARAM}.v")
    assert ((d["stage"], d["op"], d["param"], d["tensor"], d["layer"]) ==
        ("optim", "adamw", PARAM, "v", 1))
    assert d["rank"] is None and d["mb"] is None and d["dir"] is None
    d = describe("optim.clip.embed.weight")
    assert ((d["stage"], d["op"], d["param"], d["tensor"], d["layer"]) ==
        ("optim", "clip", "embed.weight", "grad", None))
    for name in ("norm", "clip_coef"):
        d = describe(f"optim.{name}")
        assert (d["stage"], d["op"], d["param"], d["tensor"]) == ("optim", name, None, None)
    d = describe("rank1.grad")
    assert (d["stage"], d["rank"], d["op"]) == ("reduce", 1, "grad")
    d = describe("rank0.mb1.layers.0.fwd.mlp.swiglu")
    assert ((d["stage"], d["rank"], d["mb"], d["layer"], d["dir"], d["op"]) ==
        ("model", 0, 1, 0, "fwd", "mlp.swiglu"))


def _optim_names(run: str) -> list[str]:
    names = ["optim.norm", "optim.clip_coef"]
    for spec in param_specs(read_run(run)[0].model):
        names += [f"optim.clip.{spec.name}"] + [f"optim.adamw.{spec.name}.{t}"
                                                for t in ("m", "v", "param")]
    return names


@pytest.mark.slow
def test_an_honest_replay_trace_equals_the_runs_own(ref_run, mix4, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    shutil.rmtree(checkpoint.step_dir(run, REF_STEPS))
    # steps 7 and 8 are recomputed with step 7 traced; a recomputed step must equal its
    # published line (train raises otherwise): tracing changes no bits
    train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False, trace_steps=frozenset({7}))
    assert [ln["hash"] for ln in runlog.read(run)] == [ln["hash"] for ln in runlog.read(ref_run)]
    step, own = read(path_of(run, 7))
    assert step == 7 and [op for op, _ in own[-len(_optim_names(run)):]] == _optim_names(run)
    replayed = trace_step(run, 7)
    assert replayed.replay.ok
    assert replayed.ops == own and first_difference(own, replayed.ops) is None


@pytest.mark.slow
def test_one_ulp_in_one_parameters_moment_is_named(ref_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    published = trace_step(run, 7, out=path_of(run, 7))    # the run's owner's trace
    assert published.replay.ok
    index = [s.name for s in param_specs(read_run(run)[0].model)].index(PARAM)
    # the auditor's machine: that parameter's v off by one float32 ULP after AdamW, step 7
    real_step, real_adamw = replay_mod.compute_step, step_mod.adamw_step_
    now = {"step": None, "calls": 0}

    def stepping(run_, state, batches, step, *a, **kw):
        now.update(step=step, calls=0)
        return real_step(run_, state, batches, step, *a, **kw)

    def off_by_one_ulp(param, grad, m, v, *a):
        real_adamw(param, grad, m, v, *a)
        if now["step"] == 7:
            if now["calls"] == index:
                v.view(torch.int32).view(-1)[5] += 1
            now["calls"] += 1

    with (Patch(replay_mod, "compute_step", stepping),
            Patch(step_mod, "adamw_step_", off_by_one_ulp)):
        rep = bisect(run, until=REF_STEPS)
    assert rep["step"] == 7 and rep["finding"]["component"] == "optim", rep
    op = rep["operator"]
    assert op["name"] == f"optim.adamw.{PARAM}.v", op
    assert (op["stage"], op["op"], op["param"], op["tensor"]) == ("optim", "adamw", PARAM, "v")
    assert op["why"] == "the op's output differs"
