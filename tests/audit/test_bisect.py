"""Dispute bisection: a one-ULP change in one op on the auditor's side is found - first the
step, then the operator (virtual rank, micro-batch, layer, direction, op)."""
from __future__ import annotations

import shutil

import pytest
import torch

import open1b_audit.replay as replay_mod
import open1b_train.model as model_mod
from open1b_audit.bisect import bisect, trace_step
from open1b_audit.trace import first_difference, path_of
from testkit.tamper import Patch


@pytest.mark.slow
def test_one_ulp_in_one_op_is_found_step_then_operator(ref_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    # the run's owner publishes the trace of the disputed step from their machine
    published = trace_step(run, 7, out=path_of(run, 7))
    assert published.replay.ok and len(published.ops) > 100
    # the auditor's machine: one swiglu output element off by one bf16 ULP, in step 7 only
    real_step, real_swiglu = replay_mod.compute_step, model_mod.swiglu_fwd
    now = {"step": None, "calls": 0}

    def stepping(run_, state, batches, step, *a, **kw):
        now.update(step=step, calls=0)
        return real_step(run_, state, batches, step, *a, **kw)

    def off_by_one_ulp(h):
        y = real_swiglu(h)
        if now["step"] == 7:
            now["calls"] += 1
            if now["calls"] == 3:                 # micro-batch 1, layer 0 (2 layers per mb)
                y = y.clone()
                y.view(torch.int16).view(-1)[5] += 1
        return y

    with (Patch(replay_mod, "compute_step", stepping),
            Patch(model_mod, "swiglu_fwd", off_by_one_ulp)):
        rep = bisect(run, until=8)
    assert rep["step"] == 7 and rep["finding"]["component"] == "grad"
    op = rep["operator"]
    assert op["name"] == "rank0.mb1.layers.0.fwd.mlp.swiglu", op
    assert (op["rank"], op["mb"], op["layer"], op["dir"], op["op"]) == (0, 1, 0, "fwd", "mlp.swiglu")
    assert op["why"] == "the op's output differs"


def test_first_difference_reports_divergent_sequences():
    a = [("rank0.mb0.embed.fwd", "aa"), ("rank0.mb0.layers.1.bwd.attn.o.dx", "bb")]
    b = [("rank0.mb0.embed.fwd", "aa"), ("rank0.mb0.layers.1.bwd.attn.o.dx", "cc")]
    d = first_difference(a, b)
    assert d["index"] == 1 and d["layer"] == 1 and d["dir"] == "bwd" and d["op"] == "attn.o.dx"
    assert first_difference(a, a) is None
    assert "more ops" in first_difference(a, a[:1])["why"]
