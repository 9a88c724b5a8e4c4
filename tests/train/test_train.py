"""open1b-train on the micro preset: bit-exact paths and meshes, the recipe's protocols,
refusals, and the loss going down."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from open1b_train import checkpoint, runlog
from open1b_train.errors import CheckpointError, DivergenceError, ResumeError
from open1b_train.show import f32_from_hex
from open1b_train.train import train
from tests.kernels.support import needs_interpreter
from testkit.runs import REF_STEPS, micro_cfg
from testkit.trainmix import SEQ, train_mix


def _lines(run: str) -> list[dict]:
    return runlog.read(run)


@pytest.mark.slow
@needs_interpreter
def test_cpu_reference_and_triton_path_give_the_same_step_hashes(tmp_path):
    """Three micro steps on the CPU reference and on the Triton kernels (interpreter):
    every component of every step hash identical. The schedule ramps from one window a
    step to two at step 3, so the run crosses a batch-ramp phase, accumulates two
    micro-batches, and updates AdamW moments that earlier steps wrote. Four micro-batches
    in all: the interpreter runs ~15 s per micro-batch on 2 cores, and every op's own
    parity tests cover the rest."""
    mix = train_mix(tmp_path / "mix", steps=4, batch=1,
                    phases=[{"start_tokens": 0, "batch_sequences": 1},
                            {"start_tokens": 2 * SEQ, "batch_sequences": 2}])
    runs = {}
    for backend in ("cpu", "triton"):
        runs[backend] = str(tmp_path / backend)
        train(micro_cfg(steps=3, backend=backend), mix, runs[backend], progress=False)
    a, b = _lines(runs["cpu"]), _lines(runs["triton"])
    assert len(a) == len(b) == 4
    assert [x["windows"][1] - x["windows"][0] for x in a[1:]] == [1, 1, 2]
    assert a[3]["components"]["optim"] != a[2]["components"]["optim"]
    for x, y in zip(a, b):
        assert x.get("components") == y.get("components")
        assert x["hash"] == y["hash"]


def test_the_mesh_fixes_the_bits_not_the_data(tmp_path, mix12):
    """Meshes 1x1, 2x2 and 3x1 consume the same windows each step (identical data
    digests), but reduce the gradient in different trees, so their gradient bits differ;
    the same mesh twice gives the same bits."""
    lines = {}
    for mesh in ((1, 1), (2, 2), (3, 1)):
        run = str(tmp_path / f"m{mesh[0]}x{mesh[1]}")
        train(micro_cfg(steps=2, mesh=mesh), mix12, run, progress=False)
        lines[mesh] = _lines(run)
    for s in (1, 2):
        datas = {m: ln[s]["components"]["data"] for m, ln in lines.items()}
        assert len(set(datas.values())) == 1, datas
        # the logged windows are the step's, in mesh order (a permutation per mesh)
        assert lines[(1, 1)][s]["windows"] == lines[(2, 2)][s]["windows"]
    grads = {m: ln[1]["components"]["grad"] for m, ln in lines.items()}
    assert len(set(grads.values())) == 3, "three reduction trees gave identical bits"
    again = str(tmp_path / "again")
    train(micro_cfg(steps=2, mesh=(2, 2)), mix12, again, progress=False)
    assert [x["hash"] for x in _lines(again)] == [x["hash"] for x in lines[(2, 2)]]


def test_loss_decreases(ref_run):
    lines = _lines(ref_run)[1:]
    first, last = lines[0]["loss"], sum(x["loss"] for x in lines[-3:]) / 3
    assert last < first - 0.3, (first, last)
    assert all(not x["scalars"]["skipped"] for x in lines)


def test_log_and_checkpoints_agree(ref_run):
    lines = _lines(ref_run)
    assert [x["step"] for x in lines] == list(range(REF_STEPS + 1))
    for a, b in zip(lines, lines[1:]):
        assert b["prev"] == a["hash"]
    assert checkpoint.list_steps(ref_run) == [0, 2, 4, 6, 8]
    ck = checkpoint.load(checkpoint.step_dir(ref_run, 4))
    assert ck.record["run_hash"] == lines[4]["hash"]
    assert ck.params["layers.0.attn.q.weight"].dtype == torch.bfloat16
    assert ck.params["layers.0.attn.q.step"].dtype == torch.float32
    assert ck.m["embed.weight"].dtype == torch.float32
    # LR follows the mix schedule at tokens_after, times lr_scale
    lr = [float.fromhex(x["scalars"]["lr"]) for x in lines[1:]]
    assert lr[0] > 0 and lr[1] > lr[0]


def test_resume_in_process_continues_bit_exactly(tmp_path, mix4, ref_run):
    run = str(tmp_path / "run")
    train(micro_cfg(steps=3), mix4, run, progress=False)
    train(micro_cfg(steps=REF_STEPS), mix4, run, progress=False)
    assert [x["hash"] for x in _lines(run)] == [x["hash"] for x in _lines(ref_run)]


def test_spike_skips_its_update_and_the_next_four(tmp_path, mix4, ref_run):
    """An injected spike at step 3 (gradient x 1e4): steps 3-7 consume their windows and
    log loss and norm, but parameters, moments and the Adam counter stay as after step 2;
    the LR keeps following the tokens; step 8 updates again."""
    run = str(tmp_path / "spike")
    train(micro_cfg(steps=REF_STEPS, inject_spike=(3,)), mix4, run, progress=False)
    lines, ref = _lines(run), _lines(ref_run)
    sk = [x["scalars"]["skipped"] for x in lines[1:]]
    assert sk == [False, False, True, True, True, True, True, False]
    assert lines[3]["scalars"]["spike"] and not lines[4]["scalars"]["spike"]
    assert f32_from_hex(lines[3]["scalars"]["grad_norm"]) > 5.0
    for s in range(3, 8):
        assert lines[s]["components"]["params"] == lines[2]["components"]["params"]
        assert lines[s]["components"]["data"] == ref[s]["components"]["data"]
        assert lines[s]["scalars"]["lr"] == ref[s]["scalars"]["lr"]
    assert lines[8]["components"]["params"] != lines[7]["components"]["params"]
    before, during = (checkpoint.load(checkpoint.step_dir(run, s)) for s in (2, 6))
    for name in before.m:                       # the moments did not move while skipping
        assert torch.equal(before.m[name], during.m[name])
        assert torch.equal(before.v[name], during.v[name])
    assert before.record["adam_step"] == during.record["adam_step"] == 2
    assert during.record["skip_left"] == 1      # step 7 is the fifth and last skipped


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_last_checkpoint(
        tmp_path, mix4, monkeypatch):
    import open1b_train.reduction.gradient as gradient_mod

    real = gradient_mod.forward_backward
    calls = {"n": 0}

    def poisoned(cfg, p, ids, labels, trace=None, lean=False, grads=None, kept=frozenset()):
        calls["n"] += 1
        loss, per, grads = real(cfg, p, ids, labels, trace, lean=lean, grads=grads, kept=kept)
        if calls["n"] > 12:            # 4 micro-batches per step: step 4 onwards
            loss = loss * float("nan")
        return loss, per, grads

    monkeypatch.setattr(gradient_mod, "forward_backward", poisoned)
    run = str(tmp_path / "nan")
    with pytest.raises(DivergenceError, match="step 4: non-finite loss"):
        train(micro_cfg(steps=6), mix4, run, progress=False)
    assert [x["step"] for x in _lines(run)] == [0, 1, 2, 3]
    assert checkpoint.list_steps(run) == [0, 2]


def test_resume_refuses_another_seed_mix_config_or_a_corrupt_checkpoint(
        tmp_path, mix4, mix12, ref_run):
    import shutil

    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    with pytest.raises(ResumeError, match=r"another config \(differs in seed"):
        train(micro_cfg(steps=10, seed=7), mix4, run, progress=False)
    with pytest.raises(ResumeError, match=r"another config \(differs in mesh"):
        train(micro_cfg(steps=10, mesh=(2, 1)), mix4, run, progress=False)
    with pytest.raises(ResumeError, match="mix_fingerprint"):
        train(micro_cfg(steps=10), mix12, run, progress=False)
    # one flipped byte in the newest checkpoint's parameters
    path = checkpoint.step_dir(run, REF_STEPS) + "/params.safetensors"
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0x10
    open(path, "wb").write(bytes(data))
    with pytest.raises(CheckpointError, match=r"params.safetensors: sha256 .* differs"):
        train(micro_cfg(steps=10), mix4, run, progress=False)


def test_an_edited_log_line_is_refused_on_resume(tmp_path, mix4, ref_run):
    import shutil

    run = str(tmp_path / "run")
    shutil.copytree(ref_run, run)
    lines = _lines(run)
    lines[REF_STEPS]["components"]["params"] = "0" * 64
    runlog.rewrite(run, lines)
    with pytest.raises(ResumeError, match="differs from the log's step 8"):
        train(micro_cfg(steps=10), mix4, run, progress=False)


def test_window_losses_are_logged_per_window(ref_run):
    line = _lines(ref_run)[1]
    losses = [f32_from_hex(h) for h in line["scalars"]["window_loss"]]
    assert len(losses) == 4 and all(math.isfinite(x) and x > 0 for x in losses)
    assert abs(sum(losses) / 4 - line["loss"]) < 1e-4
    json.dumps(line)
    assert dataclasses.is_dataclass(micro_cfg())
