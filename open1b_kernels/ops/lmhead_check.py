"""The LM head's checks on the CPU: what stops a wrong T from becoming a logit or a gradient,
whatever grouping of the slice pairs computed it (``open1b_kernels.ops.lmhead_plan``).

- **The integer routes** (the library's int8 GEMM, ``lmhead_int``; the pair GEMM,
  ``lmhead_pairs``) take T's own row and column sums, accumulated over the output blocks,
  and ``check_sums`` compares them with the definition's: ``sum_i a_i @ (sum_j w_ij
  colsum(b_j))`` for the rows and the same for b for the columns - S exact matrix-vector
  products per operand (O((R + C) K S)) against the GEMMs' O(R C K S (S + 1) / 2). A
  product dropped, doubled, given the wrong weight or operand, a compacted union that lost
  a nonzero column, a faulty library GEMM: each changes a sum. On a mismatch the failure is
  recorded (``open1b_kernels.int8.route.record_failure``: the process moves to the float
  route) and the caller recomputes on the float route - the bits never change.
- **The float route** is that fallback and has no checksum; its only departure from the
  definition's products is the compaction, so ``verified`` checks each compacted union by
  an independent count before it is used - the slice's nonzeros over the block's rows
  against those in its gathered columns (one byte pass, ~1/1000 of the block's GEMMs) - and
  a union that misses one runs uncompacted: a wrong union costs speed, never a bit.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from open1b_kernels.int8.checksum import _sum_dtype
from open1b_kernels.int8.route import record_failure
from open1b_kernels.ops.lmhead_plan import Plan, weight_shift
from open1b_kernels.ops.lmhead_slices import LevelSlices


def check_sums(sa: LevelSlices, sb: LevelSlices, rows_got: torch.Tensor,
               cols_got: torch.Tensor, slices: int, what: str) -> bool:
    """T's row and column sums (``rows_got``, ``cols_got``) against the definition's
    (module docstring): exact in float64 while every value is below 2^53 (|T| < 2^28 K),
    else int64 modulo 2^64. On a mismatch the failure is recorded and False returned: the
    caller recomputes."""
    r, c, k = rows_got.numel(), cols_got.numel(), sa.shape[2]
    dt = _sum_dtype(k << 14, r, c)
    col_a = [x.to(dt) for x in sa.col_sums()]
    col_b = [x.to(dt) for x in sb.col_sums()]

    def w(i: int, j: int) -> int:
        return 1 << weight_shift(slices, i, j)

    # every pair (i, j) once with its weight, whatever grouping computed T
    v_a = [sum(col_b[j - 1] * w(i, j) for j in range(1, slices + 2 - i))
           for i in range(1, slices + 1)]
    v_b = [sum(col_a[i - 1] * w(i, j) for i in range(1, slices + 2 - j))
           for j in range(1, slices + 1)]
    if torch.equal(rows_got.to(dt), sa.mv(v_a)) and torch.equal(cols_got.to(dt), sb.mv(v_b)):
        return True
    record_failure(f"checksum failed on the LM head's {what} ({r}x{k}x{c})")
    return False


def verified(sa: LevelSlices, p: Plan) -> Plan:
    """``p``, or ``p`` without its compacted slices where one of their unions misses a
    nonzero of its part (module docstring; warns)."""
    for part, got in p.parts:
        for i, cols in got.items():
            plane = sa[i - 1][part]
            if int(plane.count_nonzero()) != int(
                    sa.gather(i, part, cols, "lmhead.check").count_nonzero()):
                warnings.warn(f"the LM head's compacted slice {i} missed a nonzero column "
                              f"(rows {p.rows.start}..{p.rows.stop}); this block runs "
                              "uncompacted", RuntimeWarning, stacklevel=3)
                return dataclasses.replace(p, parts=tuple((q, {}) for q, _ in p.parts))
    return p
