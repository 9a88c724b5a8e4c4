"""quantize.py: the W8A8 linear's quantizers - codes, STE and the fused rotate-then-quantize
- bit for bit on the CPU and in Triton (interpreter), and their rounding rules."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import backend, mathc
from open1b_kernels.int8 import hadamard, linear as linear_int8, quantize, rotrows
from open1b_kernels.int8 import ste as ste_mod
from tests.kernels.support import bits, needs_interpreter, same_bits
from tests.kernels.support import needs_loops


def _operands(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(19, 150, generator=g) * 2.0
    x[1] *= 80.0  # far outside the clip range
    x[2] *= 1e-39  # subnormal inputs
    x[3, :7] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 127.5, -127.5])  # ties
    rows = (torch.rand(19, generator=g) * 0.05).to(torch.float32)
    rows[4] = 0.0  # an all-zero step: codes 0
    return x, rows, torch.tensor([3.0 / 127])


def test_codes_round_half_to_even_and_clamp():
    x = torch.tensor([[0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.4, 200.0, -1e9, 0.0]])
    q = quantize.quantize_cpu(x, torch.tensor([1.0]))
    assert q.tolist() == [[0, 2, 2, 0, -2, 126, 127, 127, -127, 0]]
    assert quantize.quantize_cpu(x, torch.tensor([0.0])).abs().max() <= 127  # safe divisor


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quantize_parity(dtype):
    x, rows, tensor = _operands(1)
    x = x.to(dtype)
    for t, step in ((x, rows), (x, tensor), (x[:, :19].t(), rows)):  # per row, per tensor, strided
        with backend.force("cpu"):
            ref = quantize.quantize(t, step)
        with backend.force("triton"):
            got = quantize.quantize(t, step)
        assert torch.equal(ref, got)


@needs_interpreter
@pytest.mark.parametrize("want_term,out_bf16", [(True, True), (False, False)])
def test_ste_parity(want_term, out_bf16):
    x, rows, tensor = _operands(2)
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    for xt, step in ((x.to(torch.bfloat16), tensor), (x, rows)):
        with backend.force("cpu"):
            ref = ste_mod.ste(g, xt, step, want_term, out_bf16)
        with backend.force("triton"):
            got = ste_mod.ste(g, xt, step, want_term, out_bf16)
        for r, o in zip(ref, got):
            assert (r is None and o is None) or torch.equal(bits(r), bits(o))


@needs_interpreter
def test_fused_rotate_quantize_parity():
    # the GPU's fused rotate + absmax + quantize kernel vs the three separate CPU ops, on
    # the operand kinds the backward feeds it: bf16 (with subnormals), transposed views,
    # float32 and int8 codes; an all-zero row has step 0
    g = torch.Generator().manual_seed(8)
    bf = (torch.randn(37, 300, generator=g) * 1e-38).to(torch.bfloat16)
    bf[3] = 0.0
    cases = [bf, bf.t(), torch.randn(20, 513, generator=g),
             torch.randint(-127, 128, (90, 33), dtype=torch.int8, generator=g).t()]
    for t in cases:
        with backend.force("cpu"):
            q0, s0 = quantize.rotate_quantize(t)
        with backend.force("triton"):
            q1, s1 = quantize.rotate_quantize(t)
        assert torch.equal(q0, q1) and torch.equal(bits(s0), bits(s1))
    assert s0.shape == (33,) and q0.shape == (33, 256)


def test_dim0_layout_gives_the_same_bits():
    g = torch.Generator().manual_seed(9)
    t = torch.randn(40, 300, generator=g).to(torch.bfloat16)
    q, s = quantize.rotate_quantize(t)
    y = torch.zeros(512, 40)
    y[:300] = t.t().float()
    qt, st = quantize.rotate_quantize_dim0_cpu(y, "test.codes")
    assert torch.equal(qt.t(), q) and torch.equal(bits(st), bits(s))


@pytest.fixture(params=["v4", "v3", "clones"])
def copies(request):
    """The compiled rotation's plain x86-64-v4 copy, its 8-lane x86-64-v3 copy (each where
    this CPU runs it) and the target_clones copies older CPUs run: all tested on an AVX-512
    machine, the last two on an AVX2 one."""
    lib = quantize.LOOPS
    if not lib.available():
        yield request.param
        return
    before = lib.v4(), lib.v3()
    want = {"v4": (1, 1), "v3": (0, 1), "clones": (0, 0)}[request.param]
    if (lib.v4(want[0]), lib.v3(want[1])) != tuple(bool(w) for w in want):
        lib.v4(before[0]), lib.v3(before[1])
        pytest.skip(f"this CPU has no {request.param} copy")
    yield request.param
    lib.v4(before[0]), lib.v3(before[1])


@pytest.mark.parametrize("compiled", [True, False])
def test_rotate_quantize_cols_gives_the_definitions_bits(compiled, monkeypatch, copies):
    """The backward's rotate-then-quantize from its sources (a bf16 matrix, a transposed
    bf16 view, int8 codes, int8 codes times a row scale) against ``rotate_quantize`` of the
    matrix it stands for, by the compiled pass and by the torch steps (OPEN1B_MATHC=0), in
    both output layouts: subnormal and zero columns (step 0), a subnormal step (the clamp),
    a row count that is not a multiple of the Hadamard block, tiles smaller than the
    matrix (several row and column tiles)."""
    if not compiled:
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    monkeypatch.setattr(quantize, "STRIP", 32)                  # the compiled pass's strips
    monkeypatch.setattr(hadamard, "DIM0_TILE", 256 * 32)        # the torch steps' tiles
    g = torch.Generator().manual_seed(21)
    bf = (torch.randn(300, 70, generator=g) * 3).to(torch.bfloat16)   # s (K, R): t = s^T
    bf[:, 3] = 0.0
    bf[:, 5] = (torch.randn(300, generator=g) * 1e-39).to(torch.bfloat16)
    q8 = torch.randint(-127, 128, (300, 70), dtype=torch.int8, generator=g)
    rs = torch.rand(300, generator=g) * 1e-2
    rs[7] = 1e-30
    cases = [(bf, None, bf.float()), (bf.t().contiguous().t(), None, bf.float()),
             (q8, None, q8.float()), (q8, rs, q8.float() * rs[:, None])]
    for s, row_scale, dense in cases:
        want_q, want_s = quantize.rotate_quantize(dense.t().contiguous())   # (R, Kp), (R,)
        for transposed in (False, True):
            q, st = quantize.rotate_quantize_cols_cpu(s, "test.rq", row_scale, transposed)
            assert torch.equal(q if transposed else q.t(), want_q)
            assert torch.equal(bits(st), bits(want_s))


@needs_loops
@pytest.mark.parametrize("rows, cols", [(300, 96), (513, 64), (256, 128)])
def test_fused_columns_pass_gives_the_definitions_bits(rows, cols, monkeypatch, copies):
    """The columns' rotation in one pass per strip (``rotq_codes``: 64- or 32-column strips
    through L2, the float32 values never in memory) against ``rotate_quantize`` of the
    matrix it stands for, from a bf16 matrix, int8 codes and int8 codes times a row scale,
    in both output layouts, by every compiled copy: a zero column (step 0), a subnormal
    column (a subnormal step: the clamp), a NaN and an infinity, rows that are not a
    multiple of the Hadamard block. The tiles' path is made to refuse, so that the fused
    pass is what ran."""
    def refuse(*a, **k):
        raise AssertionError("the tiles' path ran: the fused pass was meant to")
    monkeypatch.setattr(quantize, "_rotate_cols_compiled", refuse)
    g = torch.Generator().manual_seed(36)
    bf = (torch.randn(rows, cols, generator=g) * 3).to(torch.bfloat16)   # s (K, R): t = s^T
    bf[:, 3] = 0.0
    bf[:, 5] = (torch.randn(rows, generator=g) * 1e-39).to(torch.bfloat16)
    bf[7, 9] = float("nan")
    bf[8, 10] = float("inf")
    q8 = torch.randint(-127, 128, (rows, cols), dtype=torch.int8, generator=g)
    rs = torch.rand(rows, generator=g) * 1e-2
    rs[7] = 1e-30
    for s, row_scale, dense in ((bf, None, bf.float()), (q8, None, q8.float()),
                                (q8, rs, q8.float() * rs[:, None])):
        want_q, want_s = quantize.rotate_quantize(dense.t().contiguous())   # (R, Kp), (R,)
        finite = want_s.isfinite()            # a non-finite column's codes are unspecified
        for transposed in (False, True):
            q, st = quantize.rotate_quantize_cols_cpu(s, "test.rq", row_scale, transposed)
            q = q if transposed else q.t()
            assert torch.equal(q[finite], want_q[finite]), (rows, cols, transposed)
            assert same_bits(st, want_s)


@needs_loops
def test_fused_columns_loop_refuses_inconsistent_buffers():
    """The fused columns' loop checks its kind, strip and buffers against the shapes before
    touching them."""
    s = torch.zeros((300, 64), dtype=torch.bfloat16).view(torch.int16)
    out, step = torch.empty((512, 64), dtype=torch.int8), torch.empty(64)
    f = mathc.flat
    good = (0, f(s), mathc.none(), 300, 512, 64, 32, 0.0625, quantize.INV_127, False, f(out),
            f(step), 0, 2)
    quantize.LOOPS.rotq_codes(*good)
    for i, bad in ((0, 1), (4, 500), (6, 24), (6, 48), (13, 3), (3, 400), (5, 96)):
        args = list(good)        # kind 1, R, S (not of 16, not dividing C), s1, P, C
        args[i] = bad
        with pytest.raises(ValueError, match="rotq_codes"):
            quantize.LOOPS.rotq_codes(*args)


@pytest.mark.parametrize("compiled", [True, False])
def test_rotate_quantize_rows_gives_the_definitions_bits(compiled, monkeypatch, copies):
    """The dX product's rotation of its gradient's rows, one row at a time through cache
    (``rotate_quantize_rows_cpu``), against ``rotate_quantize`` of the same matrix - codes
    row-major, steps bit for bit - by every compiled copy and by the columns' path it falls
    back to (OPEN1B_MATHC=0): widths that are not a multiple of a vector or of the Hadamard
    block (the zero padding inside a block's last vector), a zero row (step 0), a
    subnormal row (the clamp), a NaN (a NaN step), infinities, -0."""
    if not compiled:
        monkeypatch.setenv("OPEN1B_MATHC", "0")
    g = torch.Generator().manual_seed(34)
    for rows, width in ((9, 70), (33, 256), (17, 600), (4, 2048)):
        x = (torch.randn(rows, width, generator=g) * 3).to(torch.bfloat16)
        x[1] = 0.0
        x[2] = (torch.randn(width, generator=g) * 1e-39).to(torch.bfloat16)
        x[3, 0] = -0.0
        if rows > 4:
            x[4, width // 2] = float("nan")
            x[5, 1] = float("inf")
            x[6, width - 1] = -float("inf")
        want_q, want_s = quantize.rotate_quantize(x.float())
        q, st = rotrows.rotate_quantize_rows_cpu(x, "test.rq_rows")
        assert q.shape == want_q.shape and q.is_contiguous()
        finite = want_s.isfinite()                  # a non-finite row's codes are unspecified
        assert torch.equal(q[finite], want_q[finite]), (rows, width)
        assert same_bits(st, want_s), (rows, width)     # NaN payloads aside


@needs_loops
def test_rotate_quantize_rows_loop_refuses_inconsistent_buffers():
    """The compiled row loop checks its buffers against the shapes before touching them."""
    x = torch.zeros((4, 300), dtype=torch.bfloat16).view(torch.int16)
    out, step = torch.empty((4, 512), dtype=torch.int8), torch.empty(4)
    f = mathc.flat
    good = (f(x), 4, 300, 512, 0.0625, quantize.INV_127, f(out), f(step), 0, 4)
    quantize.LOOPS.rotq_rows(*good)
    for i, bad in ((3, 500), (2, 600), (9, 5), (1, 5)):     # C, P, r1, R
        args = list(good)
        args[i] = bad
        with pytest.raises(ValueError, match="rotq_rows"):
            quantize.LOOPS.rotq_rows(*args)


def _rows_rotated(x: torch.Tensor, stages, scale: float):
    """rotate_quantize of bf16 rows written out in torch: the butterflies of each 256-block
    in the stage order ``stages``, times ``scale``, the absmax step, the codes."""
    r, k = x.shape
    y = x.float().reshape(r, k // 256, 256)
    for h in stages:
        y = y.reshape(r, k // 256, 256 // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
    y = y.reshape(r, k) * scale
    step = torch.maximum(y.amax(1), -y.amin(1)).abs() * quantize.INV_127
    return quantize.quantize_cpu(y, step), step


def test_rotate_quantize_rows_is_the_stage_order_and_the_scale():
    """What the row path's equality with the definition rules out, as forgeries of it: the
    same butterflies in the reverse stage order (h = 128 down to 1), or the scale one ulp
    off. Written out in torch with the right order and scale the row path's codes and steps
    come out bit for bit (the control); either forgery gives other steps on a gradient whose
    rows span many binades (rounding then depends on the order)."""
    g = torch.Generator().manual_seed(35)
    mag = 2.0 ** torch.randint(-20, 20, (64, 1024), generator=g).float()
    x = (torch.randn(64, 1024, generator=g) * mag).to(torch.bfloat16)
    q, st = rotrows.rotate_quantize_rows_cpu(x, "test.rq_rows")
    up = [1, 2, 4, 8, 16, 32, 64, 128]
    q_ok, st_ok = _rows_rotated(x, up, 0.0625)
    assert torch.equal(q, q_ok) and torch.equal(bits(st), bits(st_ok))
    nudged = float(torch.nextafter(torch.tensor(0.0625), torch.tensor(1.0)))
    for forged in (_rows_rotated(x, up[::-1], 0.0625), _rows_rotated(x, up, nudged)):
        assert not torch.equal(bits(st), bits(forged[1]))


def test_linear_int8_keeps_exporting_the_quantizers():
    for name in ("quantize", "quantize_cpu", "rotate_quantize", "row_absmax_step",
                 "row_absmax_step_cpu", "Q_MAX", "RND", "INV_127", "HADAMARD_BLOCK"):
        assert getattr(linear_int8, name) is getattr(quantize, name), name
    for name in ("ste", "ste_cpu", "ste_term_sum_cpu"):
        assert getattr(linear_int8, name) is getattr(ste_mod, name), name


@pytest.mark.parametrize("kind", [0, 2, 3])
def test_rotated_column_extremes_are_the_definitions(kind, copies):
    """The compiled rotation's column maxima and minima (kept in registers, lane by lane,
    where the CPU has x86-64-v4) against the definition - NaN wherever a column holds one,
    else the largest / smallest rotated value - over whole 16-column vectors and the scalar
    columns after them, with NaN and infinities. (Which zero a column of zeros keeps
    depends on the order rows are met; the caller takes max(|max|, |min|).)"""
    if not mathc.available():
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(5)
    p, c = 300, 37                                  # two vectors of columns and 5 more
    if kind == 0:
        src = (torch.randn(p, c, generator=g) * 3).to(torch.bfloat16)
        src[17, 2] = float("nan")
        src[200, 20] = float("nan")                 # a NaN in the second row block only
        src[3, 9] = float("inf")                    # +-inf down its block: extremes inf
        src[290, 33] = float("nan")                 # a scalar column
        src[:, 5] = -0.0
    else:
        src = torch.randint(-127, 128, (p, c), dtype=torch.int8, generator=g)
        src[:, 5] = 0
    rs = torch.rand(p, generator=g) if kind == 3 else None
    y = torch.empty(512, c)
    cmax, cmin = torch.full((c,), -float("inf")), torch.full((c,), float("inf"))
    assert quantize._rotate_cols_compiled(kind, src, rs, p, y, 256, 0.0625, cmax, cmin, 256, 64)
    nan = y.isnan().any(0)
    assert nan.tolist() == [kind == 0 and j in (2, 20, 33) for j in range(c)]
    assert kind != 0 or (cmax[9] == float("inf") and cmin[9] == -float("inf"))
    assert torch.equal(cmax.isnan(), nan) and torch.equal(cmin.isnan(), nan)
    ok = ~nan
    assert torch.equal(cmax[ok], y[:, ok].amax(0)) and torch.equal(cmin[ok], y[:, ok].amin(0))


def test_rotation_steps_are_the_torch_operations():
    """The compiled steps of the rotated columns (one call) against the torch operations
    they replace: zero columns (divisor 1), subnormal steps (the clamp flag), signed zeros,
    infinities, and NaN extremes."""
    if quantize._steps_compiled(torch.zeros(1), torch.zeros(1), quantize.INV_127) is None:
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(8)
    cmax = torch.randn(40, generator=g) * 3
    cmin = -torch.rand(40, generator=g) * 5
    cmax[0], cmin[0] = 0.0, 0.0                 # an all-zero column: step 0, divisor 1
    cmax[1], cmin[1] = -0.0, -0.0
    cmax[2], cmin[2] = 1e-40, -3e-40            # a subnormal step
    cmax[3], cmin[3] = float("inf"), -1.0
    cmax[4], cmin[4] = float("nan"), -1.0
    cmax[5], cmin[5] = 2.0, float("nan")
    cmax[6], cmin[6] = -2.0, -7.0               # all negative: |min| wins
    subs = []
    for lo, hi in ((cmin, cmax), (cmin[6:], cmax[6:])):   # with and without the subnormal
        want = torch.maximum(hi, lo.neg()).abs_().mul_(quantize.INV_127)
        step, div, sub = quantize._steps_compiled(hi, lo, quantize.INV_127)
        assert torch.equal(step.isnan(), want.isnan())
        ok = ~want.isnan()
        assert torch.equal(bits(step[ok]), bits(want[ok]))
        assert torch.equal(bits(div[ok]), bits(quantize.safe_step(want)[ok]))
        subs.append(sub)
        assert sub == bool(((want > 0) & (want < quantize.FLT_MIN)).any())
    assert subs == [True, False]
    step, div, _ = quantize._steps_compiled(cmax[:2], cmin[:2], quantize.INV_127)
    assert step.tolist() == [0.0, 0.0] and div.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("p, q", [(1, 1), (3, 5), (67, 130), (130, 67), (256, 64)])
def test_compiled_transposed_widening_equals_torch(p, q):
    # widen_t (the fill of a transposed bf16 source, rotate_cols kind 1): y[i, j] = s[j, i]
    # widened exactly (4 x 4 tiles in 64-bit words inside each
    # 64 x 64 block, the edges element by element), zero rows from P; row ranges that start
    # and stop off the blocks and tiles (the pieces' cuts)
    if not mathc.available():
        pytest.skip("the compiled loops are not built")
    g = torch.Generator().manual_seed(p * 1000 + q)
    src = torch.randn(q, p, generator=g).bfloat16()          # (Q, P): read transposed
    src[0, 0] = float("nan")
    src.view(torch.int16)[-1, -1] = 1                        # a subnormal
    r = p + 9
    want = torch.zeros(r, q)
    want[:p] = src.t().float()
    for cuts in ([0, r], [0, min(5, r), min(70, r), r], [0, r // 2, r]):
        y = torch.full((r, q), -7.0)
        for lo, hi in zip(cuts, cuts[1:]):
            quantize.LOOPS.widen_t(mathc.flat(src.view(torch.int16)), mathc.flat(y), p, q, r,
                                 lo, hi)
        assert torch.equal(y.view(torch.int32), want.view(torch.int32))


@needs_loops
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


@needs_loops
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("per_row", [True, False])
def test_compiled_ste_and_bf16_rounding_equal_the_torch_code(monkeypatch, x_dtype, per_row):
    """The linear's straight-through estimator (open1b_kernels.int8.ste.ste_cpu) and the
    float32 -> bf16 rounding (open1b_kernels.int8.gemm.bf16_rne) compiled vs the torch code: codes
    clipped on both sides, exact +-127 and .5 ties of v, a zero step, subnormal and huge
    gradients, NaN."""
    from open1b_kernels.int8.gemm import bf16_rne
    from open1b_kernels.int8.ste import ste_cpu

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


@needs_loops
@pytest.mark.parametrize("per_row", [True, False])
def test_ste_with_its_terms_tree_sum_gives_the_definitions_bits(monkeypatch, per_row):
    """``ste_term_sum_cpu`` - the STE's dx with its term summed block by block of the tree as
    it is made, the term never written - against ``ste_cpu``'s term summed by the torch tree
    (OPEN1B_MATHC=0): bits of dx and of the sum. Shapes whose rows cross the tree's blocks
    (a row of 4,099 and of 1,500 values), a last block partly past the values (the padding's
    +0.0 inside it) and whole padding blocks, exactly one block, a sum a block of -0.0 terms
    ends in (a tree that skipped the padding's +0.0 keeps -0.0), a NaN, a vector too short
    for a block (the torch path). A block cut one value off, a run given another row's
    divisor, or a last block's tree cut to its values (no padding) each fails it (tried)."""
    from open1b_kernels.core.reduce import TREE_BLOCK, tree_sum_cpu
    from open1b_kernels.int8.quantize import safe_step
    from open1b_kernels.int8.ste import _ste_sums_compiled, ste_cpu, ste_term_sum_cpu

    g = torch.Generator().manual_seed(46)
    cases = []
    for r, c in ((7, 4099), (11, 1500), (2, TREE_BLOCK // 2), (3, 5), (40, 1000)):
        step = torch.rand(r if per_row else 1, generator=g) * 0.1 + 0.01
        x = (torch.randn(r, c, generator=g) * 3.0).to(torch.bfloat16)
        grad = torch.randn(r, c, generator=g) * 10.0 ** torch.randint(-30, 30, (r, c),
                                                                       generator=g).float()
        cases.append((grad, x, step))
    grad, x, step = cases[1]
    nan = grad.clone()
    nan[5, 7] = float("nan")
    cases.append((nan, x, step))
    # every term -0.0 (x = 0: rne(0) - 0 = +0.0, times a -0.0 gradient), 3 whole blocks and
    # 64 values of a 4th, no block of padding alone: the definition's sum is +0.0 (the
    # padding's +0.0 inside the 4th block), not -0.0
    cases.append((torch.full((4, 3088), -0.0), torch.zeros(4, 3088, dtype=torch.bfloat16),
                  torch.full((4 if per_row else 1,), 0.05)))
    got = [ste_term_sum_cpu(*case) for case in cases]
    assert [_ste_sums_compiled(grad, x, safe_step(step)) is not None
            for grad, x, step in cases] == [True, True, True, False, True, True, True]
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    for (grad, x, step), (dx, total) in zip(cases, got):
        dx_w, term = ste_cpu(grad, x, step, want_term=True, out_bf16=True)
        want = tree_sum_cpu(term.reshape(-1), 0)
        assert torch.equal(dx.view(torch.int16), dx_w.view(torch.int16))
        assert total.shape == () and total.view(torch.int32) == want.view(torch.int32)
    assert got[-1][1].view(torch.int32) == 0               # +0.0


@needs_loops
def test_ste_sums_loop_refuses_inconsistent_buffers():
    """The fused STE's loop checks its block size, block range and buffers against the shape
    before touching them."""
    f = mathc.flat
    g, x = torch.zeros(3, 4000), torch.zeros(3, 4000, dtype=torch.bfloat16)
    div, dx, partials = torch.ones(1), torch.empty(3, 4000, dtype=torch.bfloat16), torch.empty(4)
    good = [f(g), f(x.view(torch.int16)), True, f(div), False, f(dx.view(torch.int16)),
            f(partials), 3, 4000, 4096, 0, 3]
    ste_mod.LOOPS.ste_sums(*good)
    for i, bad in ((8, 4001), (9, 4095), (9, 1 << 21), (11, 4), (10, 4), (6, f(torch.empty(3))),
                   (4, True)):
        args = list(good)        # C, B (not a power of two, too big), b1, b0 > b1, partials,
        args[i] = bad            # per-row divisors for one
        with pytest.raises(ValueError, match="ste_sums"):
            ste_mod.LOOPS.ste_sums(*args)
