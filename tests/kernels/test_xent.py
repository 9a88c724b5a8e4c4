"""Fused cross-entropy + z-loss: bit parity of loss, lse and dlogits (interpreter vs CPU
reference) and accuracy of loss and gradient against float64."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.ops.xent import CHUNK, Z_LOSS, xent_backward, xent_forward
from testkit.kernels.autograd import xent
from tests.kernels.support import bits, needs_interpreter
from tests.kernels.support import needs_loops


def _case(m, v, seed, kind="normal"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, v, generator=g) * 3.0
    t = torch.randint(0, v, (m,), generator=g)
    if kind == "extreme":
        x[0] = x[0] * 30.0  # logits of +-300: exp underflows to subnormals and zero
        x[1] = x[1] * 1e-40  # subnormal logits: a flat softmax
        x[2, t[2]] = 80.0  # a confident, correct token
        x[3, :] = -50.0  # a constant row
    elif kind == "bf16":
        x[0, :8] = torch.tensor([1e-39, -1e-40, 0.0, -0.0, 5e-39, 3.0, -3.0, 1e-38])
        x = x.to(torch.bfloat16)
    return x, t


def _float64(x, t):
    xd = x.double().requires_grad_(True)
    lse = torch.logsumexp(xd, 1)
    ce = torch.nn.functional.cross_entropy(xd, t, reduction="none")
    loss = (ce + Z_LOSS * lse * lse).mean()
    loss.backward()
    return loss.detach(), lse.detach(), xd.grad


@needs_interpreter
@pytest.mark.parametrize("m,v,kind", [(5, CHUNK + 900, "normal"), (9, 300, "extreme"),
                                      (4, 2 * CHUNK, "bf16"), (1, 1, "normal")])
def test_parity(m, v, kind):
    x, t = _case(m, v, m * v, kind)
    outs = {}
    for path in ("cpu", "triton"):
        with backend.force(path):
            loss, lse = xent_forward(x, t)
            outs[path] = (loss, lse, xent_backward(torch.tensor(0.75), x, t, lse))
    for name, ref, got in zip(("loss", "lse", "dlogits"), outs["cpu"], outs["triton"]):
        assert torch.equal(bits(ref), bits(got)), name


@pytest.mark.parametrize("kind", ["normal", "extreme"])
def test_accuracy_vs_float64(kind):
    x, t = _case(16, 2 * CHUNK + 37, 3, kind)
    loss, lse = xent_forward(x, t)
    dlogits = xent_backward(torch.tensor(1.0), x, t, lse)
    ref_loss, ref_lse, ref_grad = _float64(x, t)
    # portable exp/log (<= 2 ulp) and fixed-tree sums over ~2^13 terms: well under 1e-6
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    assert ((lse.double() - ref_lse).abs() <= 1e-6 * ref_lse.abs().clamp(min=1.0)).all()
    assert ((dlogits.double() - ref_grad).abs() <= 1e-6 * ref_grad.abs().max()).all()


def test_autograd_wrapper_matches_functional():
    x, t = _case(6, 700, 4)
    xp = x.clone().requires_grad_(True)
    loss, lse = xent(xp, t)
    (2.0 * loss).backward()
    ref_loss, ref_lse = xent_forward(x, t)
    assert torch.equal(bits(loss), bits(ref_loss)) and torch.equal(bits(lse), bits(ref_lse))
    ref = xent_backward(torch.tensor(2.0), x, t, ref_lse)
    assert torch.equal(bits(xp.grad), bits(ref))


def test_rejects_bad_inputs():
    x, t = _case(3, 10, 0)
    with pytest.raises(ValueError, match="targets"):
        xent_forward(x, torch.tensor([0, 1, 10]))
    with pytest.raises(ValueError, match="logits"):
        xent_forward(x[0], t)


@needs_interpreter
def test_lmhead_xent_chain_parity():
    # the loss head as training composes it: bf16 hidden -> LM head -> fused loss, through
    # autograd on both paths; every output and gradient bit must agree
    from testkit.kernels.autograd import lmhead

    g = torch.Generator().manual_seed(12)
    h = torch.randn(6, 40, generator=g).to(torch.bfloat16)
    w = (torch.randn(300, 40, generator=g) * 0.05).to(torch.bfloat16)
    t = torch.randint(0, 300, (6,), generator=g)
    outs = {}
    for path in ("cpu", "triton"):
        hp, wp = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
        with backend.force(path):
            loss, lse = xent(lmhead(hp, wp), t)
            loss.backward()
        outs[path] = (loss, lse, hp.grad, wp.grad)
    for name, ref, got in zip(("loss", "lse", "dh", "dw"), outs["cpu"], outs["triton"]):
        view = torch.int16 if ref.dtype == torch.bfloat16 else torch.int32
        assert torch.equal(ref.view(view), got.view(view)), name


@needs_loops
def test_compiled_xent_backward_equals_the_torch_code(monkeypatch):
    from open1b_kernels.ops import xent

    g = torch.Generator().manual_seed(6)
    x = torch.randn(7, 5000, generator=g) * 30.0       # > CHUNK columns, wide logits
    x[2, 17] = float("nan")                             # a non-finite row
    x[4] = -1e30                                        # exp underflows to 0 (subnormal path)
    t = torch.tensor([0, 4999, 17, 3, 2500, 1, 77])
    lse = xent.row_lse_cpu(torch.nan_to_num(x, nan=0.0))
    dloss = torch.tensor(0.37)
    got = xent.xent_backward_cpu(dloss, x, t, lse)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = xent.xent_backward_cpu(dloss, x, t, lse)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))


@needs_loops
def test_compiled_row_logsumexp_equals_torch(monkeypatch):
    """open1b_kernels.ops.xent's online logsumexp by the compiled rows against the torch code: a
    vocabulary that is not a multiple of the chunk (the -inf padding), a NaN logit, a row
    of -inf, huge and tiny logits, a maximum that moves between chunks, chunks whose
    maximum is a zero of either sign."""
    from open1b_kernels.ops.xent import CHUNK, row_lse_cpu, xent_forward_cpu

    g = torch.Generator().manual_seed(13)
    v = 2 * CHUNK + 77
    x = torch.randn(9, v, generator=g) * 5
    x[1, 5] = float("nan")
    x[2] = -float("inf")
    x[3, :10] = torch.tensor([3e38, -3e38, 1e-40, 88.0, 89.0, -104.0, 0.0, -0.0, 50.0, 60.0])
    x[4, -1] = 300.0                                     # the maximum in the padded chunk
    x[6] = -x[6].abs() - 1.0                             # maxima of zero: the first's sign
    x[6, 100], x[6, 200] = -0.0, 0.0
    x[7] = -x[7].abs() - 1.0
    x[7, 100], x[7, 200] = 0.0, -0.0
    got = row_lse_cpu(x)
    t = torch.randint(0, v, (9,), generator=g)
    loss = xent_forward_cpu(x[5:], t[5:])[0]
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = row_lse_cpu(x)
    nan = want.isnan()
    assert bool(nan[1]) and torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    assert torch.equal(loss.view(torch.int32), xent_forward_cpu(x[5:], t[5:])[0].view(torch.int32))


@pytest.mark.parametrize("path", ["cpu", "cpu-torch", "triton"])
@pytest.mark.parametrize("kind", ["normal", "extreme", "bf16"])
def test_overwrite_gives_the_same_bits_in_the_logits_buffer(path, kind, monkeypatch):
    """dlogits written over the logits (the trainer's head, done with them) equal a fresh
    buffer's bit for bit - every target column too, whose logit an in-place loop that read
    it after writing its row would get wrong - on the compiled loop, the torch code and the
    Triton kernel; bf16 logits cannot hold them and are left alone."""
    if path == "triton" and not backend.HAVE_TRITON:
        pytest.skip("triton not installed")
    if path == "cpu-torch":
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    x, t = _case(9, CHUNK + 300, 11, kind)
    t[3] = 0                                  # targets at both ends of a row
    t[4] = x.shape[1] - 1
    with backend.force("triton" if path == "triton" else "cpu"):
        _, lse = xent_forward(x, t)
        want = xent_backward(torch.tensor(0.75), x, t, lse)
        logits = x.clone()
        got = xent_backward(torch.tensor(0.75), logits, t, lse, overwrite=True)
    assert torch.equal(bits(got), bits(want))
    if kind == "bf16":
        assert torch.equal(bits(logits), bits(x))                     # untouched
    else:
        assert got.data_ptr() == logits.data_ptr()                     # no second buffer


def test_overwrite_in_row_blocks_gives_the_whole_bits():
    """The lean head's way: each block of rows overwritten in place, ``rows`` the whole's M."""
    x, t = _case(10, 700, 12, "normal")
    _, lse = xent_forward(x, t)
    whole = xent_backward(torch.tensor(1.0), x, t, lse)
    logits = x.clone()
    for r0 in range(0, 10, 4):
        rows = slice(r0, r0 + 4)
        logits[rows] = xent_backward(torch.tensor(1.0), logits[rows], t[rows], lse[rows],
                                     rows=10, overwrite=True)
    assert torch.equal(bits(logits), bits(whole))
