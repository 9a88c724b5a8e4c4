"""The exact int8 GEMM on AMX tiles (``open1b_kernels/int8/_amxmm.c``): int32 ``a @ b.T`` at
the tile rate of an Intel Xeon with AMX-INT8.

The C file says why it is exact (int32 sums of int8 products below 2^31 for K <= MAX_K,
in any order: TDPBSSD adds without saturating) and why it is faster there than the
library's integer GEMM (oneDNN's VNNI ``gemm_api``); the route that picks it, with the
library route's probe and checksums, is ``open1b_kernels.int8.route`` ("amx"). Both operands
are packed into tile panels (scratch buffers reused across calls), then C's 32-line units -
rows, or columns where there are few rows - are cut between the threads: each thread
writes its own part of C, so the result does not depend on the cut.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from open1b_kernels.core.mathc import Loops, flat, span
from open1b_kernels.core.pieces import parallel, piece_sums
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8.pairmm import source

LOOPS = Loops("open1b_kernels.int8._int8c")    # the tile GEMM: _amxmm.c

MAX_K = 131_071    # int32 sums of K products of at most 2^14
UNIT = 32          # C's lines per unit of work (the tile block's rows or columns)


@functools.lru_cache(maxsize=1)
def _cpu() -> bool:
    return bool(LOOPS.amx_cpu())


SWITCH = "OPEN1B_AMX"     # "0": every AMX loop off (this GEMM and attention's tile products)


def available() -> bool:
    """True when the extension is built with the AMX intrinsics, this process runs AMX-INT8
    tiles (CPUID, the OS's tile state and its permission: probed once) and neither the
    compiled loops (OPEN1B_MATHC=0) nor the AMX loops (OPEN1B_AMX=0) are switched off."""
    return LOOPS.available() and os.environ.get(SWITCH, "1") != "0" and _cpu()


@dataclass(frozen=True, eq=False)
class Packed:
    """An operand for the tile product: ``lines`` x ``k`` int8 values packed into tile
    panels on the A (``b_side`` False) or the B side (``pack``); an A side may instead be
    read in place (``direct``: a flat view of a row-major matrix with row stride ``lda``),
    ``data`` then holding only its last ``lines % 32`` rows packed. A ``window`` of a
    packing is its contraction values [k0, k0 + k) of the ``stored_k`` packed a line."""
    data: torch.Tensor
    lines: int
    k: int
    b_side: bool
    direct: torch.Tensor | None = None
    lda: int = 0
    stored_k: int = 0       # 0: k (the whole packing)
    k0: int = 0

    def geometry(self) -> tuple[int, int]:
        """(values packed a line, the first chunk read): the C products' (ka, a0)."""
        return (self.stored_k or self.k), self.k0 // 64


def window(p: Packed, k0: int, k: int) -> Packed | None:
    """The contraction values [k0, k0 + k) of the packed ``p`` as an operand of its own,
    without a copy (the products of several K ranges of one operand - the LM head's level
    runs - pack it once), or None where the tiles cannot read it so: ``k0`` not on a 64-wide
    chunk, a window ending inside a chunk before the packing's end (the product would read
    the next values as its padding), or an A side read in place."""
    stored, end = p.stored_k or p.k, p.k0 + k0 + k
    if (p.direct is not None or k < 1 or k0 < 0 or k0 % 64 or k0 + k > p.k
            or (end % 64 and end != stored)):
        return None
    return Packed(p.data, p.lines, k, p.b_side, None, 0, stored, p.k0 + k0)


def _pack_into(x: torch.Tensor, b_side: bool, out: torch.Tensor) -> None:
    lines, k = x.shape
    src, sl, sk = source(x)
    if lines == 1:
        sl = 1 if sk != 1 else max(sl, 1)
    if k == 1:
        sk = 1 if sl != 1 else max(sk, 1)
    xs, o = flat(src), flat(out)
    panels = -(-lines // UNIT) * 2
    parallel(lambda lo, hi, p: LOOPS.amx_pack(xs, o, sl, sk, lines, k, b_side, lo, hi, p),
             panels, grain=max(1, 8192 // max(k, 1)))


def pack(x: torch.Tensor, b_side: bool, name: str) -> Packed:
    """``x`` (int8 (lines, K) on the CPU: row-major, a transposed view or a block of either)
    as the A side (its rows are C's rows) or the B side (its rows are C's columns), packed
    in the scratch buffer ``name`` - or, an A side whose rows are row-major with K a
    multiple of 64, read in place, only its last ``lines % 32`` rows packed."""
    lines, k = x.shape
    if x.dtype != torch.int8 or x.device.type != "cpu" or not (lines and 1 <= k <= MAX_K):
        raise ValueError(f"amxmm.pack needs an int8 CPU (lines >= 1, 1 <= K <= {MAX_K}) "
                         f"matrix, got {x.dtype} {tuple(x.shape)} on {x.device}")
    if not b_side and k % 64 == 0 and x.stride(1) == 1 and x.stride(0) >= k:
        whole = lines // UNIT * UNIT
        tail = scratch(name, (LOOPS.amx_packed_bytes(lines - whole, k) if lines > whole
                              else 0,), torch.int8)
        if lines > whole:
            _pack_into(x[whole:], False, tail)
        src, lda, _ = source(x)
        return Packed(tail, lines, k, False, src, lda)
    out = scratch(name, (LOOPS.amx_packed_bytes(lines, k),), torch.int8)
    _pack_into(x, b_side, out)
    return Packed(out, lines, k, b_side)


def _cut(a: Packed, b: Packed, who: str):
    """(M, N, by_cols, units, the loops' A and B arguments) of the product of an A side and a
    B side of one K (refused otherwise): C's 32-line units of rows, or of columns where
    there are few rows and many columns."""
    if a.b_side or not b.b_side or a.k != b.k:
        raise ValueError(f"amxmm.{who}: an A side and a B side of one K, got "
                         f"({a.lines}, {a.k}, B={a.b_side}) and ({b.lines}, {b.k}, B={b.b_side})")
    m, n = a.lines, b.lines
    by_cols = m < UNIT * torch.get_num_threads() * 2 <= n
    sides = (flat(a.direct) if a.direct is not None else _EMPTY, a.lda, flat(a.data),
             flat(b.data))
    return m, n, by_cols, -(-(n if by_cols else m) // UNIT), sides, (*a.geometry(),
                                                                     *b.geometry())


def product(a: Packed, b: Packed, out: torch.Tensor) -> torch.Tensor:
    """``out`` (contiguous int32 (M, N)) = the exact product of an A side (M lines) and a
    B side (N lines) of one K. Needs ``available()``."""
    m, n, by_cols, units, sides, win = _cut(a, b, "product")
    if out.dtype != torch.int32 or out.shape != (m, n) or not out.is_contiguous():
        raise ValueError(f"amxmm.product: out must be contiguous int32 {(m, n)}")
    c = flat(out)
    parallel(lambda lo, hi, p: LOOPS.amx_product(*sides, c, m, n, a.k, *win, by_cols, lo, hi,
                                                 p), units, grain=1)
    return out


def product_dequant(a: Packed, b: Packed, row_scale: torch.Tensor, col_scale: torch.Tensor,
                    out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``product(a, b)`` dequantized as ``open1b_kernels.int8.gemm.dequantize_cpu`` does it,
    per 32 x 32 block while it is in cache, into ``out`` (contiguous float32 or bfloat16
    (M, N)): ``rn(rn(float(acc) * row_scale[m]) * col_scale[n])``, then RNE to bf16 - the
    int32 product never reaches memory. Returns the int32 product's exact int64 (row sums,
    column sums), taken from the values dequantized, for the caller's check. ``row_scale``
    float32 (M,) or (1,), ``col_scale`` float32 (N,). Needs ``available()``."""
    m, n, by_cols, units, sides, win = _cut(a, b, "product_dequant")
    if (out.dtype not in (torch.float32, torch.bfloat16) or out.shape != (m, n)
            or not out.is_contiguous()):
        raise ValueError(f"amxmm.product_dequant: out must be contiguous float32 or bfloat16 "
                         f"{(m, n)}, got {out.dtype} {tuple(out.shape)}")
    rs = row_scale.reshape(-1).to(torch.float32).contiguous()
    cs = col_scale.reshape(-1).to(torch.float32).contiguous()
    if rs.numel() not in (1, m) or cs.numel() != n:
        raise ValueError(f"amxmm.product_dequant: scales of {m} rows (or 1) and {n} columns, "
                         f"got {rs.numel()} and {cs.numel()}")
    bf = out.dtype == torch.bfloat16
    args = (*sides, rs.numpy(), cs.numpy(), flat(out.view(torch.int16) if bf else out), bf)
    rows, cols = piece_sums(units, units, (m, n), lambda lo, hi, rp, cp, p: LOOPS.amx_product_dq(
        *args, rp, cp, m, n, a.k, *win, by_cols, lo, hi, p))
    return rows, cols


MAX_LEVELS = 4      # _amxlevels.h's


def product_levels(levels: list[tuple[Packed, Packed, int]], rowf: torch.Tensor,
                   colf: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The LM head's output block from its levels (``open1b_kernels.ops.lmhead_int``), the
    level products summed per 32 x 32 block in cache and never written: ``levels`` =
    [(A side, B side, shift), ...] (1 to MAX_LEVELS, each pair of one K, every A of M lines
    and every B of N), T = sum of ``product(a, b) * 2^shift`` (exact: an integer below
    2^53), ``out`` (float32 (M, N), unit stride along its rows, e.g. a block of the logits)
    = ``fp32((T * rowf[m]) * colf[n])`` for float64 ``rowf`` (M,) and ``colf`` (N,) - the
    bits of ``_lmhead_sums.c``'s levels_round_weighted. Returns T's (row sums, column sums)
    modulo 2^64 as int64, for the caller's check. Needs ``available()``."""
    if not 1 <= len(levels) <= MAX_LEVELS:
        raise ValueError(f"amxmm.product_levels: 1 to {MAX_LEVELS} levels, got {len(levels)}")
    cuts = [_cut(a, b, "product_levels") for a, b, _ in levels]
    m, n, by_cols, units = cuts[0][:4]
    if any(cut[:4] != (m, n, by_cols, units) for cut in cuts):
        raise ValueError("amxmm.product_levels: every level's A of the same lines, its B too, "
                         f"got {[(a.lines, b.lines) for a, b, _ in levels]}")
    if (out.dtype != torch.float32 or out.shape != (m, n) or out.stride(1) != 1
            or out.stride(0) < n):
        raise ValueError(f"amxmm.product_levels: out must be float32 {(m, n)} with a unit "
                         f"stride along its rows, got {out.dtype} {tuple(out.shape)} "
                         f"strides {out.stride()}")
    if (rowf.dtype != torch.float64 or colf.dtype != torch.float64 or rowf.numel() != m
            or colf.numel() != n):
        raise ValueError(f"amxmm.product_levels: float64 rowf ({m},) and colf ({n},), got "
                         f"{rowf.dtype} {tuple(rowf.shape)} and {colf.dtype} {tuple(colf.shape)}")
    spec = [(*cut[4], a.k, *cut[5], shift) for (a, _, shift), cut in zip(levels, cuts)]
    rf, cf = rowf.contiguous().numpy(), colf.contiguous().numpy()
    o, ldo = flat(span(out)), out.stride(0)     # a block of the logits, written in place
    return tuple(piece_sums(units, units, (m, n), lambda lo, hi, rp, cp, p: LOOPS.amx_levels(
        spec, rf, cf, o, ldo, rp, cp, m, n, by_cols, lo, hi, p)))


def stream_min_bytes(n: int | None = None) -> int:
    """The smallest result (bytes) the tile products write by streaming stores, past the
    caches (``streams`` in _amxmm.c: 8 MB); ``n`` sets it (a huge ``n``: never, as before
    2026-12-07 - what the benchmarks compare with). Returns the setting before the call."""
    return LOOPS.amx_stream() if n is None else LOOPS.amx_stream(n)


_EMPTY = torch.empty(0, dtype=torch.int8).numpy()


def amx_mm(a: torch.Tensor | Packed, b: torch.Tensor | Packed,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact int32 ``a @ b.T`` of int8 (M, K) and (N, K) CPU matrices (row-major or
    transposed views), 1 <= K <= MAX_K, into ``out`` (contiguous int32 (M, N)) when given;
    either side may be packed already (``pack(b, True, ...)``, ``pack(a, False, ...)`` or a
    ``window`` of either: an operand used several times). Needs ``available()``."""
    if isinstance(a, Packed) or isinstance(b, Packed):      # pack and _cut check the sides
        ap = a if isinstance(a, Packed) else pack(a, False, "amxmm.a")
        bp = b if isinstance(b, Packed) else pack(b, True, "amxmm.b")
        c = out if out is not None else torch.empty((ap.lines, bp.lines), dtype=torch.int32)
        return product(ap, bp, c)
    m, k = a.shape
    n = b.shape[0]
    if (a.dtype != torch.int8 or b.dtype != torch.int8 or b.shape[1] != k
            or a.device.type != "cpu" or b.device.type != "cpu"):
        raise ValueError(f"amx_mm needs int8 (M, K) and (N, K) CPU matrices, got {a.dtype} "
                         f"{tuple(a.shape)} on {a.device} and {b.dtype} {tuple(b.shape)} "
                         f"on {b.device}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"amx_mm: K = {k} outside [1, {MAX_K}] (int32 sums stay exact)")
    c = out if out is not None else torch.empty((m, n), dtype=torch.int32)
    if out is not None and (out.dtype != torch.int32 or out.shape != (m, n)
                            or not out.is_contiguous()):
        raise ValueError(f"amx_mm: out must be contiguous int32 {(m, n)}")
    if not (m and n):
        return c
    return product(pack(a, False, "amxmm.a"), pack(b, True, "amxmm.b"), c)
