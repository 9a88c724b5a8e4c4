"""The stock-PyTorch anchors of scripts/gpu_check.py do the job they are timed against.

A ratio is only as good as its anchor: the H200 run of 2026-12-04 timed
``clip_grads_with_norm_`` on gradients that have no ``.grad``, which returns without a
multiply, so grad-norm + clip was compared with a norm alone (reported 0.13x). Here each
goal op's ``torch_baseline`` runs on the CPU at a tiny scale next to ``run`` and must give
the same outputs within the op's own accuracy (int8 quantization, bf16 products): an
anchor that skips its work is off by its whole size.
"""
import pytest
import torch

from open1b_kernels.core.registry import discover

# check -> relative Frobenius tolerance of baseline vs ours (the op's accuracy, with room)
TOLERANCE = {
    "rmsnorm.fwd_bwd": 2e-2,
    "gradnorm.clip": 5e-3,     # torch's float32 norm sums in its own order
    "attention.fwd_bwd_w512": 5e-2,
    "attention.fwd_bwd_causal": 5e-2,
    "linear_int8.attn_kv_fwd_bwd": 0.15,
    "lmhead.fwd": 1e-2,
    "lmhead.bwd": 1e-2,
    "lmhead.bwd_dense": 1e-2,
}
SCALE = {"attention.fwd_bwd_w512": 1 / 8, "gradnorm.clip": 1 / 24}
# ours' outputs the anchor also gives (attention's lse and the linear's step gradient are
# ours alone)
OURS = {"attention.fwd_bwd_w512": (0, 2, 3, 4), "attention.fwd_bwd_causal": (0, 2, 3, 4),
        "linear_int8.attn_kv_fwd_bwd": (0, 1, 2)}


def _checks():
    checks, errors = discover(None)
    assert errors == []
    return {c.name: c for _, c in checks}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("name", sorted(TOLERANCE))
def test_the_anchor_does_the_same_job(name):
    check = _checks()[name]
    args = check.make_inputs(SCALE.get(name, 1 / 64), "cpu")
    ours = check.run(check.fresh(args) if check.fresh else args)
    ours = [ours[i] for i in OURS.get(name, range(len(ours)))]
    theirs = [t.detach() for t in check.torch_baseline(check.fresh(args) if check.fresh else args)]
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert _rel(b, a) <= TOLERANCE[name], (name, _rel(b, a))


def test_a_clip_that_does_not_clip_is_caught():
    check = _checks()["gradnorm.clip"]
    args = check.make_inputs(1 / 24, "cpu")
    ours = check.run(check.fresh(args))
    grads = check.fresh(args)[0]
    torch.nn.utils.clip_grads_with_norm_(grads, 1.0, torch.nn.utils.get_total_norm(grads))
    assert _rel(grads[0], ours[1]) > 0.5          # the old anchor left the gradients as they were
