"""The LM head's level loop on the int route (``open1b_kernels.core.mathc.levels_round``,
``levels_round_weighted`` in ``_mathc.c``): the weighted level sum T on an optional int64
base part, its one rounding, and T's own row and column sums modulo 2^64 - the exactness
check's - against the torch operations and Python's integers."""
from __future__ import annotations

import pytest
import torch

from open1b_kernels.core import mathc

pytest.importorskip("open1b_kernels.core._mathc", reason="the optional extension was not compiled")


@pytest.mark.parametrize("n, with_base", [(n, b) for n in (0, 2, 3, 6) for b in (False, True)
                                          if n or b])   # nothing at all: refused, tested below
def test_compiled_lmhead_level_loop_equals_torch(n, with_base):
    """open1b_kernels.ops.lmhead's pass after the level GEMMs of one block (the weighted level sum
    T on an int64 base part - the row-sparse slices' - or on zero, its one rounding into the
    output's columns, T's row and column sums modulo 2^64) against the torch operations it
    replaces - int32 extremes, the two levels of S = 2 and the three of S = 3 (the loop's
    unrolled cases), S = 3 with two contraction chunks per level (six products: the general
    loop) and the base alone, rows split among threads, sums added to what is there."""
    g = torch.Generator().manual_seed(4)
    accs = torch.randint(-2**31, 2**31 - 1, (n, 37, 70), generator=g,
                         dtype=torch.int64).to(torch.int32)
    if n:
        accs[0, 0], accs[-1, 1] = 2**31 - 1, -2**31
    weights = {0: [], 2: [float(1 << 7), 1.0], 3: [float(1 << 14), float(1 << 7), 1.0],
               6: [float(1 << 14)] * 2 + [float(1 << 7)] * 2 + [1.0] * 2}[n]
    base = None
    if with_base:                      # |T| < 2^53 keeps float64 exact: the base below 2^51
        base = torch.randint(-2**51, 2**51, (37, 70), generator=g, dtype=torch.int64)
    rowf = torch.pow(2.0, torch.randint(-60, 60, (37,), generator=g).double())
    colf = torch.pow(2.0, torch.randint(-200, -100, (70,), generator=g).double())
    out = torch.zeros((37, 90))
    # sums near the int64 limits: T's row sums wrap modulo 2^64, as the check's do
    rows = torch.full((37,), 2**63 - 5, dtype=torch.int64)
    cols = torch.full((70,), -2**63 + 3, dtype=torch.int64)
    want_rows, want_cols = rows.clone(), cols.clone()
    assert mathc.levels_round(accs, weights, rowf, colf, out, 11, rows, cols, base)
    t = base.double() if with_base else torch.zeros((37, 70), dtype=torch.float64)
    u = base.clone() if with_base else torch.zeros((37, 70), dtype=torch.int64)
    for a, w in zip(accs, weights):
        t = t + a.to(torch.float64) * w
        u = u + a.to(torch.int64) * int(w)
    ref = (t * rowf[:, None] * colf[None, :]).to(torch.float32)
    assert torch.equal(out[:, 11:81].view(torch.int32), ref.view(torch.int32))
    assert not out[:, :11].any() and not out[:, 81:].any()
    # the reference sums in Python integers, reduced modulo 2^64 to int64
    def wrap(x: int) -> int:
        return (x + 2**63) % 2**64 - 2**63
    uu = u.tolist()
    assert rows.tolist() == [wrap(r0 + sum(row)) for r0, row in zip(want_rows.tolist(), uu)]
    assert cols.tolist() == [wrap(c0 + sum(uu[r][c] for r in range(37)))
                             for c, c0 in enumerate(want_cols.tolist())]


def test_compiled_lmhead_level_loop_refuses_bad_arguments():
    # a weight that is not a power of two (the sums' shifts), or no products and no base:
    # refused by name, nothing written
    accs = torch.ones((2, 4, 5), dtype=torch.int32)
    out = torch.zeros((4, 5))
    rows, cols = torch.zeros(4, dtype=torch.int64), torch.zeros(5, dtype=torch.int64)
    one = torch.ones(4, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
    for weights in ([3.0, 1.0], [0.5, 1.0], [float(2**63), 1.0]):
        with pytest.raises(ValueError, match="power of two"):
            mathc.levels_round(accs, weights, *one, out, 0, rows, cols)
    with pytest.raises(ValueError, match="levels_round_weighted"):
        mathc.levels_round(accs[:0], [], *one, out, 0, rows, cols)
    assert not out.any() and not rows.any() and not cols.any()
