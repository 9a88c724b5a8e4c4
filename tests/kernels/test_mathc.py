"""The compiled CPU loops of open1b_kernels.core.mathc give exactly mathfn's torch bits."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import intmatrix, mathc, mathfn, slicer

pytest.importorskip("open1b_kernels.core._mathc", reason="the optional extension was not compiled")


def _inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    specials = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -104.0,
                             -104.00001, 89.0, 89.00001, 88.72, -87.33, 1e-45, -1e-45,
                             1.1754942e-38, 1.17549435e-38, 3.4028235e38, -3.4028235e38,
                             0.5, 1.0, 2.0, 0.6931472, -0.6931472])
    # every float32 exponent and sign, with random mantissas
    bits = (torch.arange(512, dtype=torch.int64).repeat_interleave(2048) << 23) | \
        torch.randint(0, 1 << 23, (512 * 2048,), generator=g)
    every = bits.to(torch.int32).view(torch.float32)          # (int64 -> int32 wraps the sign)
    random_bits = torch.randint(-2**31, 2**31, (1 << 20,), generator=g,
                                dtype=torch.int64).to(torch.int32).view(torch.float32)
    ranges = torch.cat([torch.randn(1 << 18, generator=g) * s for s in (1e-3, 1.0, 30.0, 1e4)])
    return torch.cat([specials, every, random_bits, ranges])


@pytest.mark.parametrize("name,ref", [("exp", mathfn._exp), ("log", mathfn._log)])
def test_compiled_loop_equals_the_torch_definition(name, ref):
    x = _inputs()
    want = mathfn.map_chunks(ref, x)
    got = mathc.apply(name, x)
    assert got is not None
    same = (got.view(torch.int32) == want.view(torch.int32))
    assert bool(same.all()), f"{int((~same).sum())} mismatches, e.g. x={x[~same][:4].tolist()}"
    # non-contiguous input and odd lengths take the same path
    assert torch.equal(mathc.apply(name, x[1::3]).view(torch.int32),
                       want[1::3].view(torch.int32))


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    assert mathc.apply("exp", torch.ones(3)) is None
    assert torch.equal(mathfn.exp(torch.zeros(3)), torch.ones(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slices", [2, 3])
def test_compiled_slicer_equals_the_torch_slicer(dtype, slices, monkeypatch):
    from open1b_kernels.ops import lmhead

    g = torch.Generator().manual_seed(5)
    x = torch.randn(67, 301, generator=g) * 10.0 ** torch.randint(-35, 35, (67, 301),
                                                                   generator=g).float()
    x[3, 4], x[5, :] = float("inf"), 0.0                 # a non-finite row, a zero row
    x[7, 9] = 1e-40                                      # a subnormal
    x = x.to(dtype)
    got = slicer.slice_rows(x, slices)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = lmhead.slice_rows_cpu(x, slices)
    assert got is not None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    monkeypatch.setenv("OPEN1B_MATHC", "1")
    t = slicer.slice_rows(x.t(), slices)                  # a transposed view: same as its copy
    assert torch.equal(t[0], slicer.slice_rows(x.t().contiguous(), slices)[0])
    assert torch.equal(t[1], slicer.slice_rows(x.t().contiguous(), slices)[1])
    assert t[0].stride(-1) != 1                           # sliced in the storage's layout
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want_t = lmhead.slice_rows_cpu(x.t(), slices)         # the torch slicer of the view
    assert torch.equal(t[0], want_t[0]) and torch.equal(t[1], want_t[1])


def test_compiled_slicer_writes_into_a_given_buffer():
    x = torch.randn(40, 70).to(torch.bfloat16)
    buf = torch.full((3 * 40 * 70,), 99, dtype=torch.int8)
    got = slicer.slice_rows(x.t(), 3, buf)
    assert got is not None and got[0].data_ptr() == buf.data_ptr()
    assert torch.equal(got[0], slicer.slice_rows(x.t(), 3)[0])
    with pytest.raises(ValueError, match="out must be contiguous int8 with 8400 elements"):
        slicer.slice_rows(x, 3, torch.empty(100, dtype=torch.int8))


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_row", [True, False])
def test_compiled_dequantization_equals_torch(out_dtype, per_row):
    """open1b_kernels.int8.gemm's dequantization (int32 -> float32 rounded, two float32 multiplies,
    bf16 rounding) and the guard's sums from the same pass, against the torch code - int32
    extremes (conversion rounds above 2^24), scales that overflow to inf and underflow to
    subnormals and zero, a zero scale - on shapes that split among threads."""
    from open1b_kernels.int8.checksum import row_col_sums
    from open1b_kernels.int8.gemm import dequantize_cpu

    g = torch.Generator().manual_seed(8)
    acc = torch.randint(-2**31, 2**31 - 1, (301, 1200), generator=g,
                        dtype=torch.int64).to(torch.int32)
    acc[0], acc[1, :7] = 2**31 - 1, torch.tensor([-2**31, 16777217, -16777219, 1, 0, -1, 3])
    rs = torch.rand(301 if per_row else 1, generator=g) * 1e-3
    cs = torch.rand(1200, generator=g) * 1e-4
    cs[:4] = torch.tensor([1e30, 1e-30, 0.0, 3.0e-39])
    if per_row:
        rs[5] = 1e-38
    out = torch.empty(acc.shape, dtype=out_dtype)
    sums = intmatrix.dequant(acc, rs, cs, out, sums=True)
    want = dequantize_cpu(acc, rs, cs, out_dtype)
    bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out.view(bits), want.view(bits))
    assert all(torch.equal(a, b) for a, b in zip(sums, row_col_sums(acc)))
    out2 = torch.empty(acc.shape, dtype=out_dtype)
    assert intmatrix.dequant(acc, rs, cs, out2, sums=False) == ()
    assert torch.equal(out2.view(bits), want.view(bits))
    assert intmatrix.dequant(acc.t(), rs, cs, out2, sums=False) is None   # not contiguous


@pytest.mark.parametrize("dtype", [torch.int32, torch.int8])
def test_compiled_integer_sums_equal_torch(dtype):
    """The guard's row and column sums (open1b_kernels.int8.checksum) by the compiled loop: exact
    int64 sums equal to torch's, at the dtype's extremes (int32 sums past 2^31 per row),
    for shapes that split among threads and for a transposed view."""
    from open1b_kernels.int8.checksum import col_sums, row_col_sums

    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(info.min, info.max, (513, 1031), generator=g, dtype=torch.int64)
    x[0], x[1] = info.max, info.min
    x = x.to(dtype)
    rows, cols = intmatrix.int_sums(x)
    assert torch.equal(rows, x.sum(1, dtype=torch.int64))
    assert torch.equal(cols, x.sum(0, dtype=torch.int64))
    assert torch.equal(row_col_sums(x)[0], rows)
    assert torch.equal(col_sums(x.t()), rows)         # a transposed view: its storage's rows
    assert intmatrix.int_sums(x.t()) is None              # not contiguous: the caller's torch sums


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


def test_compiled_int8_matrix_vector_product_is_exact():
    """The guard's products (open1b_kernels.int8.checksum._mv) by the compiled loop: exact int64
    values, row-major and transposed views, at int8's extremes and sums past 2^53."""
    from open1b_kernels.int8.checksum import _mv

    g = torch.Generator().manual_seed(8)
    a = torch.randint(-128, 128, (300, 517), generator=g, dtype=torch.int64)
    a[0] = -128
    a = a.to(torch.int8)
    v = torch.randint(-2**48, 2**48, (517,), generator=g, dtype=torch.int64)
    v[:5] = 2**52
    want = (a.to(torch.int64) * v).sum(1)
    assert torch.equal(intmatrix.mv_int8(a, v), want)
    at = a.t().contiguous().t()                          # a transposed view of (517, 300)
    assert not at.is_contiguous() and torch.equal(intmatrix.mv_int8(at, v), want)
    small = torch.randint(-2**20, 2**20, (517,), generator=g).to(torch.float64)
    assert torch.equal(_mv(a, small), (a.to(torch.float64) @ small))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("per_row", [True, False])
def test_compiled_ste_and_bf16_rounding_equal_the_torch_code(monkeypatch, x_dtype, per_row):
    """The linear's straight-through estimator (open1b_kernels.int8.quantize.ste_cpu) and the
    float32 -> bf16 rounding (open1b_kernels.int8.gemm.bf16_rne) compiled vs the torch code: codes
    clipped on both sides, exact +-127 and .5 ties of v, a zero step, subnormal and huge
    gradients, NaN."""
    from open1b_kernels.int8.gemm import bf16_rne
    from open1b_kernels.int8.quantize import ste_cpu

    g = torch.Generator().manual_seed(9)
    r, c = 33, 257
    step = (torch.rand(r if per_row else 1, generator=g) * 0.1 + 0.01)
    if per_row:
        step[4] = 0.0                                    # a zero step: divisor 1
    x = torch.randn(r, c, generator=g) * 3.0
    x[1, :8] = step[1 if per_row else 0] * torch.tensor([127.0, -127.0, 127.5, -127.5,
                                                         2.5, -3.5, 300.0, -0.0])
    x = x.to(x_dtype)
    grad = torch.randn(r, c, generator=g) * 10.0 ** torch.randint(-42, 38, (r, c),
                                                                   generator=g).float()
    grad[2, 3] = float("nan")
    got = [ste_cpu(grad, x, step, want_term=w, out_bf16=True) for w in (True, False)]
    rne = bf16_rne(grad)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = [ste_cpu(grad, x, step, want_term=w, out_bf16=True) for w in (True, False)]
    assert torch.equal(bf16_rne(grad).view(torch.int16), rne.view(torch.int16))
    for (dx, t), (dx_w, t_w) in zip(got, want):
        assert torch.equal(dx.view(torch.int16), dx_w.view(torch.int16))
        assert (t is None and t_w is None) or torch.equal(t.view(torch.int32), t_w.view(torch.int32))


@pytest.mark.parametrize("d", [2048, 300, 1])
@pytest.mark.parametrize("with_gain", [True, False])
@pytest.mark.parametrize("dy_dtype", [torch.bfloat16, torch.float32])
def test_compiled_rmsnorm_equals_torch(d, with_gain, dy_dtype, monkeypatch):
    """open1b_kernels.ops.rmsnorm's CPU forward and backward by the compiled rows against the torch
    code (OPEN1B_MATHC=0): the same bits for dx, y, rstd and the gain gradient - a row width
    that is not a power of two (the tree's zero padding), one of width 1, a row holding inf
    (NaN row), an all-zero row, subnormals and large values, threads splitting the rows."""
    from open1b_kernels.ops.rmsnorm import rmsnorm_bwd_cpu, rmsnorm_fwd_cpu

    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 67, d, generator=g) * 10.0 ** torch.randint(-20, 20, (2, 67, d),
                                                                    generator=g).float()
    x[0, 3, 0], x[0, 4] = float("inf"), 0.0
    x[1, 5, :1] = 1e-40
    x = x.to(torch.bfloat16)
    dy = (torch.randn(2, 67, d, generator=g) * 3).to(dy_dtype)
    gain = (1 + 0.1 * torch.randn(d, generator=g)).to(torch.bfloat16) if with_gain else None

    def run():
        y, rstd = rmsnorm_fwd_cpu(x, gain, 1e-6)
        dx, dgain = rmsnorm_bwd_cpu(dy, x, gain, rstd)
        return y, rstd, dx, dgain

    got = run()
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = run()
    assert bool(want[0].isnan().any())                    # the inf row is in the case
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        bits = torch.int16 if b.dtype == torch.bfloat16 else torch.int32
        assert a.dtype == b.dtype and a.shape == b.shape
        # NaN payloads are outside rmsnorm's contract (torch's own bf16 conversion gives
        # 0xFFFF in its vector loop and 0x7FC0 in its scalar one): NaN where torch has NaN
        nan = b.isnan()
        assert torch.equal(a.isnan(), nan)
        assert torch.equal(a[~nan].view(bits), b[~nan].view(bits))


def test_compiled_swiglu_equals_torch(monkeypatch):
    """open1b_kernels.ops.swiglu's CPU forward and backward by the compiled rows against the torch
    code: gates far below zero (exp overflows: s = -0, sig = 0), large and subnormal
    values, zeros of both signs, inf and NaN (NaN where torch has NaN: payloads are outside
    the contract), rows split among threads."""
    from open1b_kernels.ops.swiglu import swiglu_bwd_cpu, swiglu_fwd_cpu

    g = torch.Generator().manual_seed(12)
    h = torch.randn(301, 2 * 700, generator=g) * 10.0 ** torch.randint(-3, 3, (301, 1400),
                                                                       generator=g).float()
    h[0, :8] = torch.tensor([-200.0, -88.0, 90.0, 1e-40, -0.0, 0.0, float("inf"),
                             float("nan")])
    h[1, :3] = torch.tensor([-float("inf"), 3e38, -3e38])
    h = h.to(torch.bfloat16)
    dy = (torch.randn(301, 700, generator=g) * 2).to(torch.bfloat16)
    got = swiglu_fwd_cpu(h), swiglu_bwd_cpu(dy, h)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = swiglu_fwd_cpu(h), swiglu_bwd_cpu(dy, h)
    for a, b in zip(got, want):
        nan = b.isnan()
        assert a.shape == b.shape and bool(nan.any()) and torch.equal(a.isnan(), nan)
        assert torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))


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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("per_row", [True, False])
def test_compiled_quantizer_equals_torch(dtype, per_row, monkeypatch):
    """open1b_kernels.int8.quantize.quantize_cpu by the compiled loop against the torch steps:
    values past the clamp, exact ties (rounded half to even), a zero step (the safe
    divisor 1), subnormal steps, huge values, rows split among threads."""
    from open1b_kernels.int8.quantize import quantize_cpu

    g = torch.Generator().manual_seed(14)
    x = torch.randn(300, 1111, generator=g) * 50
    x[0, :8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 126.5, -127.5, 1e30])
    x = x.to(dtype)
    step = (torch.rand(300 if per_row else 1, generator=g) + 0.5)
    step[0] = 1.0
    if per_row:
        step[1], step[2] = 0.0, 1e-40
    got = quantize_cpu(x, step)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = quantize_cpu(x, step)
    assert got.dtype == torch.int8 and torch.equal(got, want)
    assert got[0, :7].tolist() == [0, 2, 2, 0, -2, 126, -127]


@pytest.mark.parametrize("p_dtype", [torch.bfloat16, torch.float32])
def test_compiled_adamw_equals_the_torch_code(p_dtype, monkeypatch):
    """open1b_kernels.ops.adamw's CPU update by the compiled loop vs its torch code (the
    definition): the same parameter and moment bits, for bf16 and float32 parameters, over
    a size that splits into pieces, with zeros, subnormal and huge gradients (g * g
    overflows to inf), zero moments, a learning rate of 0 and a late step. NaN results
    (inf / inf) must agree in place; their payloads are outside the contract (the trainer
    refuses a non-finite gradient before its update)."""
    from open1b_kernels.ops import adamw

    g = torch.Generator().manual_seed(12)
    n = 3 * mathc.PARALLEL_MIN + 77
    p0 = (torch.randn(n, generator=g) * 0.05).to(p_dtype)
    grad = torch.randn(n, generator=g) * 1e-3
    grad[:6] = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 3e20, -2e25])
    m0 = torch.randn(n, generator=g) * 1e-4
    v0 = torch.rand(n, generator=g) * 1e-6
    m0[6:9], v0[6:9] = 0.0, 0.0
    for step, lr, wd in ((1, 3e-4, 0.1), (5000, 0.0, 0.0), (37, 1e-2, 0.1)):
        s = adamw.step_scalars(step, lr, wd)
        got = [t.clone() for t in (p0, m0, v0)]
        adamw.adamw_step_cpu_(got[0], grad, got[1], got[2], s)
        monkeypatch.setenv("OPEN1B_MATHC", "0")
        want = [t.clone() for t in (p0, m0, v0)]
        adamw.adamw_step_cpu_(want[0], grad, want[1], want[2], s)
        monkeypatch.setenv("OPEN1B_MATHC", "1")
        for a, b in zip(got, want):
            nan = torch.isnan(a.float())
            assert torch.equal(nan, torch.isnan(b.float()))
            bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
            assert torch.equal(a[~nan].view(bits), b[~nan].view(bits))


def test_compiled_tree_sum_equals_the_torch_tree(monkeypatch):
    """open1b_kernels.core.reduce's pairwise tree of a long vector by the compiled blocks and the
    tree over their partials vs the torch levels: the same bits for lengths at, past and far
    from a power of two (padding inside the last block and whole padded blocks), with
    cancelling magnitudes (the order shows in the result), signed zeros, subnormals and
    inf; shorter vectors stay on the torch code."""
    from open1b_kernels.core import reduce

    g = torch.Generator().manual_seed(13)
    for n in (mathc.TREE_BLOCK, mathc.TREE_BLOCK + 1, 3 * mathc.TREE_BLOCK + 5,
              (1 << 20) + 3, 2_564_096):
        x = torch.randn(n, generator=g) * torch.pow(10.0, torch.randint(-20, 20, (n,),
                                                                         generator=g).float())
        x[:4] = torch.tensor([-0.0, 1e-45, -3e-39, 1e30])
        got = reduce.tree_sum_cpu(x, 0)
        monkeypatch.setenv("OPEN1B_MATHC", "0")
        want = reduce.tree_sum_cpu(x, 0)
        monkeypatch.setenv("OPEN1B_MATHC", "1")
        assert got.shape == want.shape == ()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), n
        assert float(got) != float(x.double().sum())          # the order matters here
    x = torch.full((2 * mathc.TREE_BLOCK,), -0.0)
    assert torch.equal(reduce.tree_sum_cpu(x, 0).view(torch.int32),
                       torch.tensor(-0.0).view(torch.int32))
    inf = torch.zeros(mathc.TREE_BLOCK + 9)
    inf[7] = float("inf")
    assert reduce.tree_sum_cpu(inf, 0) == float("inf")
    assert mathc.tree_sum_1d(torch.ones(100)) is None            # short: the torch tree


def test_compiled_integer_sums_alone_and_over_long_columns():
    """Row sums alone (no column sums), and int8 column sums over more rows than one int16
    partial holds (255 rows a part) at int8's extremes: the exact int64 values."""
    x = torch.full((1000, 37), -128, dtype=torch.int8)
    x[::3] = 127
    rows, cols = intmatrix.int_sums(x)
    assert torch.equal(cols, x.sum(0, dtype=torch.int64))
    assert torch.equal(rows, x.sum(1, dtype=torch.int64))
    only, none = intmatrix.int_sums(x, want_cols=False)
    assert none is None and torch.equal(only, rows)
    acc = torch.full((300, 5), 2**31 - 1, dtype=torch.int32)
    only, none = intmatrix.int_sums(acc, want_cols=False)
    assert none is None and torch.equal(only, acc.sum(1, dtype=torch.int64))
    assert intmatrix.int_sums(x, want_rows=False, want_cols=False) is None


def _check_mv_extremes(seed: int, lo: int, hi: int, first: int, second: int,
                       every_other: int | None = None) -> None:
    """mv_int8 against exact int64 sums, row-major and transposed, for lengths with a partial
    last block of 128: rows of -128 and of 127, v drawn from [lo, hi) with v[0] = first,
    v[1] = second and (when given) every other entry from v[2] = every_other."""
    g = torch.Generator().manual_seed(seed)
    for k in (1, 127, 128, 129, 1000):
        a = torch.randint(-128, 128, (301, k), generator=g, dtype=torch.int64)
        a[0] = -128
        a[1] = 127
        a = a.to(torch.int8)
        v = torch.randint(lo, hi, (k,), generator=g, dtype=torch.int64)
        v[0] = first
        if k > 1:
            v[1] = second
        if every_other is not None:
            v[2::2] = every_other
        want = (a.to(torch.int64) * v).sum(1)
        assert torch.equal(intmatrix.mv_int8(a, v), want), k
        at = a.t().contiguous().t()
        assert torch.equal(intmatrix.mv_int8(at, v), want), k


@pytest.mark.parametrize("bound", [2**15 - 1, 2**15])
def test_compiled_int8_matrix_vector_product_in_int16_is_exact(bound):
    """The guard's products when every |v| < 2^15 (one int16 product per element, int32
    block sums): exact at the extremes - a = -128 and 127 against v = +-(2^15 - 1), every
    row of -128 against a v of 2^15 - 1 (the largest block sum) - row-major and
    transposed, lengths with a partial last block; at |v| = 2^15 the int32 halves run,
    with the same values."""
    _check_mv_extremes(15, -bound + 1, bound, bound - 1 if bound == 2**15 - 1 else bound,
                       -bound + 1, bound - 1)
    top = torch.full((4, 1000), -128, dtype=torch.int8)
    v = torch.full((1000,), 2**15 - 1, dtype=torch.int64)
    assert torch.equal(intmatrix.mv_int8(top, v), torch.full((4,), -128 * (2**15 - 1) * 1000))


def test_compiled_int8_matrix_vector_product_in_int32_blocks_is_exact():
    """The guard's products when every |v| < 2^31 (int32 halves summed in blocks of 128):
    exact int64 values at the extremes - a = -128 against v = +-(2^31 - 1) and -2^31 + 1,
    lengths with a partial last block - row-major and transposed, split into pieces."""
    _check_mv_extremes(14, -2**31 + 1, 2**31, 2**31 - 1, -2**31 + 1)


@pytest.mark.parametrize("n_ops", [2, 3])
def test_compiled_bf16_add_equals_the_torch_code(n_ops, monkeypatch):
    """open1b_train.model.add_bf16 (the residual adds) by the compiled loop against its torch
    code: rounding ties both ways, subnormal sums, overflow to inf, inf - inf, signed zeros
    (-0 + -0 = -0, -0 + +0 = +0), NaN positions; and the model's function takes it."""
    from open1b_train import model
    if not mathc.has("add_bf16"):
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(12)
    xs = [(torch.randn(3, 1000, generator=g) * torch.exp(torch.randn(3, 1000, generator=g) * 4))
          .to(torch.bfloat16) for _ in range(n_ops)]
    specials = [(1.0, 2.0 ** -8), (1.0, 3 * 2.0 ** -9), (1e-39, 1e-39), (3e38, 3e38),
                (float("inf"), float("-inf")), (-0.0, -0.0), (-0.0, 0.0), (float("nan"), 1.0),
                (-1e-40, 1e-40), (1.0 + 2.0 ** -7, 2.0 ** -8)]
    for i, (a, b) in enumerate(specials):
        xs[0][0, i], xs[1][0, i] = a, b
        if n_ops == 3:
            xs[2][0, i] = 0.0 if i != 5 else -0.0
    want = xs[0].float()
    for x in xs[1:]:
        want = want + x.float()
    want = want.to(torch.bfloat16)
    got = mathc.add_bf16(xs)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert torch.equal(model.add_bf16(*xs)[~nan].view(torch.int16), want[~nan].view(torch.int16))
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    assert torch.equal(model.add_bf16(*xs)[~nan].view(torch.int16), want[~nan].view(torch.int16))

