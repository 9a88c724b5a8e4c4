"""Claimed properties of the recipe, each checked against a reference written here from the
contract it claims (not from the code under test), on inputs where the likely wrong
implementation gives other bits:

* the learning rate follows the consumed tokens across a batch-ramp phase change, not the
  step count (``open1b_data/stream/schedule.py``, docs/TRAINING.md);
* ``reduce_step`` is Algorithm 1 (``open1b_train/reduction/gradient.py``) bit for bit on a mesh with
  three replicas, three shards and three micro-batches per rank, where multiplying by
  fp32(1/3) and dividing by 3 round differently.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from open1b_data.stream.cospi import cos_pi
from open1b_data.stream.schedule import Schedule
from open1b_train import runlog
from open1b_train.reduction import gradient as gradient_mod
from open1b_train.params import Layout, ParamSpec
from open1b_train.reduction.gradient import MicroBatch
from open1b_train.train import train
from testkit.runs import micro_cfg
from testkit.trainmix import train_mix

# ---------------------------------------------------------------- LR across a batch ramp

SEQ, PEAK, FINAL_RATIO = 32, 1e-3, 0.1
RAMP = [{"start_tokens": 0, "batch_sequences": 2}, {"start_tokens": 128, "batch_sequences": 4}]
RAMP_STEPS = 5                    # steps 1-2 at batch 2 (warmup), 3-5 at batch 4 (cosine)


def _tokens_after(steps: int) -> list[int]:
    """tokens_after of steps 1..steps, walking the phases (schedule.py's exact rule)."""
    out, tokens = [], 0
    for _ in range(steps):
        batch = [p["batch_sequences"] for p in RAMP if p["start_tokens"] <= tokens][-1]
        tokens += batch * SEQ
        out.append(tokens)
    return out


def _lr(t: int, warmup: int, stop: int, cos=cos_pi) -> float:
    """docs/TRAINING.md's warmup + cosine, binary64, in the documented order."""
    if t < warmup:
        return PEAK * t / warmup
    final = PEAK * FINAL_RATIO
    p = min(Fraction(1), Fraction(t - warmup, stop - warmup))
    return final + (PEAK - final) * 0.5 * (1.0 + cos(p))


@pytest.fixture(scope="module")
def ramp_mix(tmp_path_factory) -> str:
    return train_mix(tmp_path_factory.mktemp("ramp"), steps=6, batch=4, phases=RAMP)


def test_lr_follows_consumed_tokens_across_a_batch_ramp(ramp_mix, tmp_path):
    from open1b_data.formats.manifest import load_manifest

    sched = Schedule.from_definition(load_manifest(ramp_mix).definition)
    warmup, stop = sched.spec.warmup_tokens, sched.spec.stop_tokens
    assert (warmup, stop, sched.spec.lr_peak) == (2 * 4 * SEQ, 6 * 4 * SEQ, PEAK)
    after = _tokens_after(RAMP_STEPS)
    assert after == [64, 128, 256, 384, 512]
    want = [_lr(t, warmup, stop) for t in after]
    # the schedule's value is the formula's; libm's cos agrees to rounding (accuracy only)
    assert [sched.step(s).lr for s in range(1, RAMP_STEPS + 1)] == want
    assert all(abs(w - _lr(t, warmup, stop, lambda p: math.cos(math.pi * p))) <= 1e-15
               for w, t in zip(want, after))
    # the test can tell tokens from steps: after the change a step count (at the current
    # or the first batch) lands elsewhere on the curve
    for batch in (4, 2):
        assert _lr(3 * batch * SEQ, warmup, stop) != want[2]

    cfg = micro_cfg(steps=RAMP_STEPS)
    run = str(tmp_path / "run")
    train(cfg, ramp_mix, run, progress=False)
    scalars = [ln["scalars"] for ln in runlog.read(run)[1:]]
    assert [s["tokens"] for s in scalars] == after
    assert [s["lr"] for s in scalars] == [float(w * cfg.lr_scale).hex() for w in want]


# ---------------------------------------------------------------- Algorithm 1, mesh 3 x 3

REPS, SHARDS, ACC = 3, 3, 3
SPECS = [ParamSpec("w", (3, 5), torch.float32, True, "normal"),
         ParamSpec("b", (4100,), torch.float32, False, "ones")]


def _synthetic(window: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """A micro-batch's (loss, per-window loss, gradients): float32, a function of its
    window, spread over many binades so every rounding shows."""
    g = torch.Generator().manual_seed(1000 + window)
    grads = {s.name: torch.randn(s.shape, generator=g)
             * torch.exp2(torch.randint(-20, 20, s.shape, generator=g).float()) for s in SPECS}
    loss = (5.0 + torch.rand((), generator=g)).float()
    return loss, loss.reshape(1).clone(), grads


def _fake_forward_backward(model, params, input_ids, labels, trace=None, lean=False,
                           grads=None, kept=frozenset()):
    return _synthetic(int(input_ids[0, 0]))


def _batches() -> list[list[MicroBatch]]:
    """Virtual rank v's micro-batch j holds window 3v + j (its id in every token)."""
    return [[MicroBatch(v, j, (ACC * v + j,), torch.full((1, 3), ACC * v + j))
             for j in range(ACC)] for v in range(REPS * SHARDS)]


def _algorithm_1(x, mean) -> torch.Tensor:
    """Algorithm 1 (reduction/gradient.py's docstring) on x(window): ``mean(t, n)`` is the average step."""
    partials = []
    for rep in range(REPS):
        p = None
        for shard in range(SHARDS):
            v = rep * SHARDS + shard
            g_v = mean(x(ACC * v), ACC)                     # g_v = g_0 * r
            for j in range(1, ACC):
                g_v = g_v + mean(x(ACC * v + j), ACC)       # g_v = g_v + g_j * r
            p = g_v if p is None else p + g_v               # shards in ascending order
        partials.append(mean(p, SHARDS))                    # * fp32(1/S) at the last shard
    return mean((partials[0] + partials[1]) + partials[2], REPS)   # TreeFold of 3 = 2 + 1


def _times_reciprocal(t: torch.Tensor, n: int) -> torch.Tensor:
    return t * float(np.float32(1.0) / np.float32(n))


def _divided(t: torch.Tensor, n: int) -> torch.Tensor:
    return t / n


def test_reduce_step_is_algorithm_1_on_a_3x3_mesh(monkeypatch):
    monkeypatch.setattr(gradient_mod, "forward_backward", _fake_forward_backward)
    layout = Layout(SPECS)
    red = gradient_mod.reduce_step(micro_cfg(mesh=(REPS, SHARDS)), {}, layout, _batches())
    got = layout.views(red.grad)
    gaps = torch.ones(layout.numel, dtype=torch.bool)
    for s in layout.slots:
        gaps[s.offset:s.offset + s.numel] = False
    assert not red.grad[gaps].any()                          # alignment gaps stay zero
    for spec in SPECS:
        want = _algorithm_1(lambda w: _synthetic(w)[2][spec.name], _times_reciprocal)
        assert torch.equal(got[spec.name], want), spec.name
        # the inputs tell a reciprocal multiply from a true division
        assert not torch.equal(_algorithm_1(lambda w: _synthetic(w)[2][spec.name], _divided),
                               want)
    loss = _algorithm_1(lambda w: _synthetic(w)[0], _times_reciprocal)
    assert torch.equal(red.loss, loss)
    assert torch.equal(red.window_losses,
                       torch.cat([_synthetic(w)[1] for w in range(REPS * SHARDS * ACC)]))


def test_three_shards_and_three_replicas_give_the_same_step(mix12, tmp_path):
    """A real step through ``train``: with R = 3 the replica fold is ((r0 + r1) + r2), the
    shard sum's order, and both multiply by fp32(1/3) once, so meshes (1, 3) and (3, 1)
    must give the same bits (a true division in either average would split them)."""
    lines = {}
    for mesh in ((1, 3), (3, 1)):
        run = str(tmp_path / f"m{mesh[0]}x{mesh[1]}")
        train(micro_cfg(steps=1, mesh=mesh), mix12, run, progress=False)
        lines[mesh] = runlog.read(run)[1]
    # every component (the chain's hashes differ: the mesh is part of the config identity)
    assert lines[(1, 3)]["components"] == lines[(3, 1)]["components"]
    assert lines[(1, 3)]["scalars"] == lines[(3, 1)]["scalars"]
