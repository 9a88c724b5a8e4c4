"""Attention: bit parity of the Triton kernels (interpreter) with the CPU reference, exact
masks, and accuracy against a float64 reference (separate, tolerance-based tests)."""

from __future__ import annotations

import math

import pytest
import torch

from open1b_kernels.core import backend
from open1b_kernels.attention.forward import BLOCK_N, attention_forward, forward_cpu
from open1b_kernels.attention.backward import attention_backward, backward_cpu
from open1b_kernels.attention.fixed import (
    exact_matmul,
    fixed_point,
    fixed_row_values,
    fixed_rows,
    fixed_values,
)
from testkit.kernels.autograd import attention
from tests.kernels.support import bits, needs_interpreter


# (batch, query heads, kv heads, seq, head dim, window)
CASES = [
    (1, 4, 2, 67, 16, None),  # odd length, GQA group 2, fully causal
    (2, 4, 2, 130, 32, 40),  # window inside the sequence, crossing blocks
    (1, 4, 1, 75, 16, 500),  # window larger than the sequence, GQA group 4
    (1, 2, 2, 200, 16, 64),  # window == block size, plain MHA, 4 key blocks
    (1, 2, 1, 9, 16, 1),  # a query sees only itself
]


def _inputs(case, seed: int, kind: str = "normal"):
    b, hq, hkv, s, d, window = case
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    q, k, v, do = r(b, hq, s, d), r(b, hkv, s, d), r(b, hkv, s, d), r(b, hq, s, d)
    if kind == "tiny":  # scores ~2^-128: subnormal fp32 scores; dq, dk ~2^-104
        q, k, do = q * 2.0**-64, k * 2.0**-64, do * 2.0**-40
    elif kind == "peaked":  # scores in the thousands: softmax near one-hot, exp underflows
        q, k = q * 16.0, k * 16.0
    elif kind == "subnormal":  # bf16 subnormals mixed into every operand
        for t in (q, k, v, do):
            t[..., ::3] *= 2.0**-130
    elif kind == "v_extreme":  # V rows from 2^-120 to 2^100
        v = v * torch.pow(2.0, torch.randint(-120, 100, (b, hkv, s, 1), generator=g).float())
    q, k, v, do = (t.to(torch.bfloat16) for t in (q, k, v, do))
    return q, k, v, do, window


def _both_paths(q, k, v, do, window):
    results = []
    for path in ("cpu", "triton"):
        with backend.force(path):
            out, lse = attention_forward(q, k, v, window)
            results.append((out, lse) + tuple(attention_backward(q, k, v, out, lse, do, window)))
    return results


@needs_interpreter
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"b{c[0]}h{c[1]}/{c[2]}s{c[3]}d{c[4]}w{c[5]}")
def test_triton_matches_cpu_bitwise(case):
    cpu, tri = _both_paths(*_inputs(case, seed=sum(case[:5])))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), cpu, tri):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        mismatched = (bits(a) != bits(b)).sum().item()
        assert mismatched == 0, f"{name}: {mismatched} of {a.numel()} elements differ in bits"


@needs_interpreter
@pytest.mark.parametrize("kind", ["tiny", "peaked", "subnormal", "v_extreme"])
def test_triton_matches_cpu_bitwise_extreme_magnitudes(kind):
    cpu, tri = _both_paths(*_inputs((1, 2, 1, 70, 16, 33), seed=7, kind=kind))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), cpu, tri):
        mismatched = (bits(a) != bits(b)).sum().item()
        assert mismatched == 0, (
            f"{kind} {name}: {mismatched} of {a.numel()} elements differ in bits"
        )
        assert torch.isfinite(a.float()).all() and (a != 0).any(), (
            f"{kind} {name}: degenerate values"
        )


def _reference(q, k, v, do, window, o=None):
    """float64 attention with an explicit mask; its backward uses ``o`` for D when given
    (so the kernels' backward is judged on its own, not on the int8 forward's error)."""
    b, hq, s, d = q.shape
    group = hq // k.shape[1]
    qq, kk, vv, dd = (
        q.double(),
        k.double().repeat_interleave(group, 1),
        v.double().repeat_interleave(group, 1),
        do.double(),
    )
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    mask = (j <= i) if window is None else (j <= i) & (j > i - window)
    sc = (qq @ kk.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, -math.inf)
    p = torch.softmax(sc, -1)
    out = p @ vv
    oo = out if o is None else o.double()
    ds = p * (dd @ vv.transpose(-1, -2) - (dd * oo).sum(-1, keepdim=True))

    def fold(x):  # sum over the query heads of each KV group
        return x.reshape(b, k.shape[1], group, s, d).sum(2)

    dq = ds @ kk / math.sqrt(d)
    dk = fold(ds.transpose(-1, -2) @ qq / math.sqrt(d))
    dv = fold(p.transpose(-1, -2) @ dd)
    return out, torch.logsumexp(sc, -1), dq, dk, dv


@pytest.mark.parametrize("case", CASES[:4])
def test_forward_accuracy_against_float64(case):
    """int8 P V: max error <= 2.5% and mean <= 0.3% of max|v| (measured: 1.2-1.3%, 0.08-0.13%);
    lse (fp32 scores from exact products) within 1e-5 * (1 + |lse|)."""
    q, k, v, do, window = _inputs(case, seed=3)
    out, lse = forward_cpu(q, k, v, window)
    ref_out, ref_lse, *_ = _reference(q, k, v, do, window)
    vmax = v.double().abs().max()
    err = (out.double() - ref_out).abs()
    assert err.max() <= 0.025 * vmax, f"max error {err.max():.4g} vs max|v| {vmax:.4g}"
    assert err.mean() <= 0.003 * vmax, f"mean error {err.mean():.4g} vs max|v| {vmax:.4g}"
    assert ((lse.double() - ref_lse).abs() <= 1e-5 * (1 + ref_lse.abs())).all()


@pytest.mark.parametrize("case", CASES[:4])
def test_backward_accuracy_against_float64(case):
    """Given the forward's O, every gradient is within 1% of its max magnitude (measured
    0.2-0.5%: the bf16 rounding of p and ds, as in a bf16 flash backward)."""
    q, k, v, do, window = _inputs(case, seed=4)
    out, lse = forward_cpu(q, k, v, window)
    grads = backward_cpu(q, k, v, out, lse, do, window)
    _, _, *ref = _reference(q, k, v, do, window, o=out)
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        rel = ((g.double() - r).abs().max() / r.abs().max()).item()
        assert rel <= 0.01, f"{name}: max error {rel:.4g} of max |{name}|"


def test_autograd_function_matches_functional_api_and_float64():
    q, k, v, do, window = _inputs((1, 4, 2, 67, 16, 20), seed=5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, window=window)
    out.backward(do)
    f_out, f_lse = forward_cpu(q, k, v, window)
    assert torch.equal(bits(out.detach()), bits(f_out))
    for leaf, g in zip(leaves, backward_cpu(q, k, v, f_out, f_lse, do, window)):
        assert torch.equal(bits(leaf.grad), bits(g))
    _, _, *ref = _reference(q, k, v, do, window)  # end to end, including the int8 forward's O
    for leaf, r in zip(leaves, ref):
        assert (leaf.grad.double() - r).abs().max() <= 0.05 * r.abs().max()


@pytest.mark.parametrize("window", [None, 30])
def test_hidden_keys_do_not_touch_the_output_bits(window):
    """Masks are exact: rewriting every key/value a query cannot see leaves its output and
    lse bit-identical (no shared quantization scale leaks across the mask)."""
    q, k, v, _, _ = _inputs((1, 2, 1, 150, 16, window), seed=6)
    out, lse = forward_cpu(q, k, v, window)
    for first, last in ((70, 75), (128, 140)):  # query rows first..last, inside a block
        k2, v2 = k.clone(), v.clone()
        k2[:, :, last + 1 :] = (torch.randn_like(k2[:, :, last + 1 :].float()) * 50).bfloat16()
        v2[:, :, last + 1 :] = (torch.randn_like(v2[:, :, last + 1 :].float()) * 50).bfloat16()
        if window is not None:  # keys at or before first - window are hidden too
            k2[:, :, : first - window + 1] = 7.0
            v2[:, :, : first - window + 1] = -3.0
        out2, lse2 = forward_cpu(q, k2, v2, window)
        assert torch.equal(bits(out2[:, :, first : last + 1]), bits(out[:, :, first : last + 1]))
        assert torch.equal(bits(lse2[:, :, first : last + 1]), bits(lse[:, :, first : last + 1]))
        assert not torch.equal(bits(out2[:, :, last + 1 :]), bits(out[:, :, last + 1 :]))


def test_window_at_least_seq_is_fully_causal_bitwise():
    q, k, v, do, _ = _inputs((1, 2, 1, 90, 16, None), seed=8)
    a = forward_cpu(q, k, v, None)
    b = forward_cpu(q, k, v, 90)
    assert all(torch.equal(bits(x), bits(y)) for x, y in zip(a, b))
    ga = backward_cpu(q, k, v, *a, do, None)
    gb = backward_cpu(q, k, v, *b, do, 1000)
    assert all(torch.equal(bits(x), bits(y)) for x, y in zip(ga, gb))


def test_fixed_point_products_are_exact():
    """For operands whose rows span < 2^13 in magnitude the product is the correctly
    rounded exact dot product: equal to a float64 matmul (exact here) rounded once."""
    g = torch.Generator().manual_seed(9)
    a = (
        (torch.rand(5, 7, 96, generator=g) + 0.01)
        .mul(torch.sign(torch.randn(5, 7, 96, generator=g)))
        .bfloat16()
    )
    b = torch.randn(5, 96, 33, generator=g).clamp(-8, 8).bfloat16()
    b = torch.where(b.abs() < 2.0**-9, 2.0**-9, b.float()).bfloat16()
    a64, b64 = fixed_row_values(a), fixed_values(b, 1, 96)
    assert torch.equal(a64, a.double()) and torch.equal(b64, b.double())  # exact here
    assert torch.equal(exact_matmul(a64, b64), (a.double() @ b.double()).float())
    # the integers behind them: x == N * 2^(E - 147) with |N| < 2^21
    na, ea = fixed_rows(a)
    assert na.abs().max() < 2**21
    assert torch.equal(torch.ldexp(na.double(), (ea - 147).unsqueeze(-1).double()), a.double())


def test_fixed_point_truncates_toward_zero_below_the_group_unit():
    # row max 1.0: the unit is 2^-20; bits below it are cut, magnitudes rounded toward zero
    vals = [1.0, -(2.0**-18 + 2.0**-25), 1.5 * 2.0**-20, 2.0**-21, -(2.0**-30), 3 * 2.0**-15]
    got = fixed_row_values(torch.tensor([vals]).bfloat16())
    assert got.tolist() == [[1.0, -(2.0**-18), 2.0**-20, 0.0, 0.0, 3 * 2.0**-15]]


def test_bad_inputs_are_rejected_with_the_value():
    q = torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16)
    kv = torch.zeros(1, 3, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of KV heads 3"):
        forward_cpu(q, kv, kv, None)
    with pytest.raises(TypeError, match="float32"):
        forward_cpu(q.float(), q, q, None)
    with pytest.raises(ValueError, match="window must be >= 1"):
        forward_cpu(q, q, q, 0)
    with pytest.raises(ValueError, match="head_dim"):
        forward_cpu(q[..., :12], q[..., :12], q[..., :12], None)
    assert BLOCK_N >= 16  # int8 tl.dot needs tiles of at least 16


@pytest.mark.gpu
@pytest.mark.skipif(
    not (backend.HAVE_TRITON and torch.cuda.is_available()), reason="needs a CUDA device"
)
def test_compiled_kernels_match_cpu_bitwise_on_gpu():
    """The compiled kernels at Open-1B head shapes (16/4 heads, D 128), short sequence."""
    from open1b_kernels.attention.forward import GPU_CHECKS

    for check in GPU_CHECKS:
        args = check.make_inputs(1 / 16, "cpu")  # 4 x 256 tokens
        cpu = check.run(args)
        gpu = check.run(
            {k: (t.cuda() if isinstance(t, torch.Tensor) else t) for k, t in args.items()}
        )
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), cpu, gpu):
            mismatched = (bits(a) != bits(b.cpu())).sum().item()
            assert mismatched == 0, (
                f"{check.name} {name}: {mismatched} of {a.numel()} elements differ"
            )


def test_fixed_values_equal_the_integer_formula():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 50, 24, generator=g) * torch.pow(
        2.0, torch.randint(-140, 60, (3, 50, 24), generator=g).float()
    )
    x = x.bfloat16()
    for dim, group in ((-1, 24), (1, 16), (1, 50)):
        n_int, e = fixed_point(x, dim, group)
        want = torch.ldexp(n_int.double(), (e - 147).repeat_interleave(group, dim % 3).double())
        assert torch.equal(fixed_values(x, dim, group), want)
