"""The LM head's slices (``open1b_kernels.ops.lmhead_slices``): the compiled slicer against the
torch slicer, and the level-ready store (``LevelSlices``) - the same int8 values and
exponents as ``slice_rows_cpu``'s planes in every layout (row-major and transposed
operands, ascending and descending order, bf16 and float32, 2 and 3 slices), level operands
that are the slices side by side, the guard's sums over the whole store, and the library's
int8 GEMM reading the views as it reads contiguous copies."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.int8 import pairmm
from open1b_kernels.int8 import route as gemm_route
from open1b_kernels.int8.checksum import _mv, col_sums
from open1b_kernels.ops.lmhead import slice_rows_cpu
from open1b_kernels.ops.lmhead_slices import LevelSlices, slice_rows
from tests.kernels.support import needs_loops

pytestmark = needs_loops


def _operand(transposed: bool, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(37, 70, generator=g) * torch.exp(torch.randn(37, 70, generator=g) * 3)
    x[4] = 0.0                                        # an all-zero row
    x[5, :3] = torch.tensor([1e-39, -0.0, -3e38])     # subnormal, signed zero, huge
    x = x.to(dtype)
    return x.t().contiguous().t() if transposed else x  # a transposed view: sliced by columns


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("slices", [2, 3])
def test_level_slices_are_the_planes_values_and_levels_are_views(transposed, descending,
                                                                 dtype, slices):
    x = _operand(transposed, dtype)
    want, want_e = slice_rows_cpu(x, slices)
    ls = LevelSlices.make(x, slices, f"test.slices.{transposed}{descending}", descending)
    assert ls.by_cols == transposed and ls.shape == tuple(want.shape)
    assert torch.equal(ls.exps, want_e)
    for i in range(slices):
        assert torch.equal(ls[i], want[i]), i
    rows = slice(3, 30)
    for count in range(1, slices + 1):
        order = range(count - 1, -1, -1) if descending else range(count)
        lvl = ls.level(count, rows)
        assert lvl.data_ptr() >= ls.store.data_ptr()          # a view of the store
        assert lvl.untyped_storage().data_ptr() == ls.store.untyped_storage().data_ptr()
        assert torch.equal(lvl, torch.cat([want[i][rows] for i in order], 1)), count
    sums = ls.col_sums()
    for i in range(slices):
        assert torch.equal(sums[i], col_sums(want[i].contiguous())), i
    g = torch.Generator().manual_seed(3)
    vs = [torch.randint(-2**40, 2**40, (70,), generator=g).to(torch.float64)
          for _ in range(slices)]
    vs[0][0] = 2.0 ** 45
    ref = sum(_mv(want[i].contiguous(), v) for i, v in enumerate(vs))
    assert torch.equal(ls.mv(vs), ref)


@pytest.mark.parametrize("transposed", [False, True])
def test_the_int8_gemm_reads_level_views_as_contiguous_copies(transposed):
    """The integer GEMM reads a level view (a row stride of S K, or a transposed store with
    a leading dimension of R) exactly as the contiguous copy the route made before. Only
    where the route uses an integer GEMM: the library (its probe passed: exact integer
    sums) or the pair GEMM (open1b_kernels.int8.pairmm)."""
    route = gemm_route.int_gemm_route()
    if route not in ("int", "pairs"):
        pytest.skip("no integer GEMM route in use on this CPU")
    mm = (lambda x, y: torch._int_mm(x, y.t())) if route == "int" else pairmm.pair_mm
    a = LevelSlices.make(_operand(transposed, torch.bfloat16, 1), 3, "test.gemm.a", False)
    b = LevelSlices.make(_operand(False, torch.bfloat16, 2)[:29], 3, "test.gemm.b", True)
    for count in (1, 2, 3):
        al, bl = a.level(count, slice(2, 35)), b.level(count, slice(0, 29))
        try:
            got = mm(al, bl)
        except RuntimeError:                      # the library refuses the shape: not here
            pytest.skip("torch._int_mm unavailable for these shapes")
        assert torch.equal(got, mm(al.contiguous(), bl.contiguous()))
        exact = (al.to(torch.int64) @ bl.to(torch.int64).t()).to(torch.int32)
        assert torch.equal(got, exact)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("descending", [False, True])
def test_planes_arranged_without_the_compiled_slicer_give_the_same_levels(transposed,
                                                                          descending,
                                                                          monkeypatch):
    """The fallback (``from_planes``: the torch slicer's planes copied into the
    row-interleaved layout) holds the compiled store's values: the same planes, level
    operands, column sums and guard product."""
    x = _operand(transposed, torch.bfloat16, 4)
    fast = LevelSlices.make(x, 3, "test.planes.fast", descending)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    planes, exps = slice_rows_cpu(x, 3)
    slow = LevelSlices.from_planes(planes, exps, "test.planes.slow", descending)
    assert not slow.by_cols and torch.equal(slow.exps, fast.exps)
    for i in range(3):
        assert torch.equal(slow[i], fast[i]), i
    rows = slice(1, 33)
    for count in (1, 2, 3):
        assert torch.equal(slow.level(count, rows), fast.level(count, rows)), count
    for a, b in zip(slow.col_sums(), fast.col_sums()):
        assert torch.equal(a, b)
    vs = [torch.arange(70, dtype=torch.float64) * (i + 1) for i in range(3)]
    assert torch.equal(slow.mv(vs), fast.mv(vs))


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
    got = slice_rows(x, slices)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want = lmhead.slice_rows_cpu(x, slices)
    assert got is not None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    monkeypatch.setenv("OPEN1B_MATHC", "1")
    t = slice_rows(x.t(), slices)                  # a transposed view: same as its copy
    assert torch.equal(t[0], slice_rows(x.t().contiguous(), slices)[0])
    assert torch.equal(t[1], slice_rows(x.t().contiguous(), slices)[1])
    assert t[0].stride(-1) != 1                           # sliced in the storage's layout
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want_t = lmhead.slice_rows_cpu(x.t(), slices)         # the torch slicer of the view
    assert torch.equal(t[0], want_t[0]) and torch.equal(t[1], want_t[1])


def test_compiled_slicer_writes_into_a_given_buffer():
    x = torch.randn(40, 70).to(torch.bfloat16)
    buf = torch.full((3 * 40 * 70,), 99, dtype=torch.int8)
    got = slice_rows(x.t(), 3, buf)
    assert got is not None and got[0].data_ptr() == buf.data_ptr()
    assert torch.equal(got[0], slice_rows(x.t(), 3)[0])
    with pytest.raises(ValueError, match="out must be contiguous int8 with 8400 elements"):
        slice_rows(x, 3, torch.empty(100, dtype=torch.int8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("descending", [None, False, True])
def test_blocks_of_a_wider_matrix_are_sliced_in_place(dtype, descending, monkeypatch):
    # a column block of a row-major matrix (rows ld apart) and the transpose of one (the
    # lean head's weight gradient: a column block of dlogits, transposed): read in place,
    # no copy, the same slices and exponents as the block's contiguous copy and as the
    # torch slicer of the view
    from open1b_kernels.ops import lmhead

    g = torch.Generator().manual_seed(8)
    wide = (torch.randn(37, 300, generator=g)
            * torch.exp(torch.randn(37, 300, generator=g) * 3)).to(dtype)
    wide[2, 100:170] = 0.0
    block = wide[:, 100:170]                             # (37, 70), rows 300 apart
    copies = []
    real = torch.Tensor.contiguous
    monkeypatch.setattr(torch.Tensor, "contiguous",
                        lambda t, *a, **k: copies.append(t.shape) or real(t, *a, **k))
    for x in (block, block.t()):
        copies.clear()
        if descending is None:
            got = slice_rows(x, 3)
            assert not copies, copies
            want = slice_rows(real(x), 3)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        else:
            ls = LevelSlices.make(x, 3, f"test.block.{descending}", descending)
            assert not copies, copies
            ref, ref_e = lmhead.slice_rows_cpu(real(x), 3)
            assert torch.equal(ls.exps, ref_e)
            for i in range(3):
                assert torch.equal(ls[i], ref[i]), i
    monkeypatch.setattr(torch.Tensor, "contiguous", real)
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    want_t = lmhead.slice_rows_cpu(block.t(), 3)
    monkeypatch.setenv("OPEN1B_MATHC", "1")
    got_t = slice_rows(block.t(), 3)
    assert torch.equal(got_t[0], want_t[0]) and torch.equal(got_t[1], want_t[1])
