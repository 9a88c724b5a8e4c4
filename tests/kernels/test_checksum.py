"""The exactness guard's sums and products (open1b_kernels.int8.checksum) by their compiled
loops (open1b_kernels/int8/_checksum.c): exact int64 values, equal to torch's integer sums, at
the extremes of every integer width they take."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.int8.checksum import _mv_compiled, _sums_compiled
from tests.kernels.support import needs_loops


@needs_loops
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
    rows, cols = _sums_compiled(x)
    assert torch.equal(rows, x.sum(1, dtype=torch.int64))
    assert torch.equal(cols, x.sum(0, dtype=torch.int64))
    assert torch.equal(row_col_sums(x)[0], rows)
    assert torch.equal(col_sums(x.t()), rows)         # a transposed view: its storage's rows
    assert _sums_compiled(x.t()) is None              # not contiguous: the caller's torch sums


@needs_loops
def test_compiled_integer_sums_alone_and_over_long_columns():
    """Row sums alone (no column sums), and int8 column sums over more rows than one int16
    partial holds (255 rows a part) at int8's extremes: the exact int64 values."""
    x = torch.full((1000, 37), -128, dtype=torch.int8)
    x[::3] = 127
    rows, cols = _sums_compiled(x)
    assert torch.equal(cols, x.sum(0, dtype=torch.int64))
    assert torch.equal(rows, x.sum(1, dtype=torch.int64))
    only, none = _sums_compiled(x, want_cols=False)
    assert none is None and torch.equal(only, rows)
    acc = torch.full((300, 5), 2**31 - 1, dtype=torch.int32)
    only, none = _sums_compiled(acc, want_cols=False)
    assert none is None and torch.equal(only, acc.sum(1, dtype=torch.int64))
    assert _sums_compiled(x, want_rows=False, want_cols=False) is None


@needs_loops
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
    assert torch.equal(_mv_compiled(a, v), want)
    at = a.t().contiguous().t()                          # a transposed view of (517, 300)
    assert not at.is_contiguous() and torch.equal(_mv_compiled(at, v), want)
    small = torch.randint(-2**20, 2**20, (517,), generator=g).to(torch.float64)
    assert torch.equal(_mv(a, small), (a.to(torch.float64) @ small))


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
        assert torch.equal(_mv_compiled(a, v), want), k
        at = a.t().contiguous().t()
        assert torch.equal(_mv_compiled(at, v), want), k


@needs_loops
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
    assert torch.equal(_mv_compiled(top, v), torch.full((4,), -128 * (2**15 - 1) * 1000))


@needs_loops
def test_compiled_int8_matrix_vector_product_in_int32_blocks_is_exact():
    """The guard's products when every |v| < 2^31 (int32 halves summed in blocks of 128):
    exact int64 values at the extremes - a = -128 against v = +-(2^31 - 1) and -2^31 + 1,
    lengths with a partial last block - row-major and transposed, split into pieces."""
    _check_mv_extremes(14, -2**31 + 1, 2**31, 2**31 - 1, -2**31 + 1)
