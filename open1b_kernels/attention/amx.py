"""Attention's exact tile products on AMX tiles (``open1b_kernels/attention/_tileamx.c``): the
float64 values of ``open1b_kernels.attention.compiled``'s products, from int8 digits.

The C file says why the values are the same bits: each product is an integer T (from the
nine int8 digit products of fixed.py's N = d0 2^14 + d1 2^7 + d2, summed exactly in int32 by
the tiles and combined exactly in float64) times the same powers of two, so the float64
value and its one rounding to float32 are those of the float64 matrix product, whatever
order either sums in. compiled.py keeps its loops and asks here for the products where
``available()``; ``OPEN1B_AMX=0`` (every AMX loop off: the tile GEMM too,
``open1b_kernels.int8.amxmm``) or a CPU without AMX-INT8 keeps the float64 products.

The operands' digits are prepared once per call (``digit_planes``: per plane of the
batch x heads, per 64-row block, the tile order of the side they multiply from), where the
float64 path prepared its fixed-point values: three bytes an element instead of eight.
"""
from __future__ import annotations

import functools
import os

import torch

from open1b_kernels.attention.tiles import BLOCK_M
from open1b_kernels.core import mathc, pieces
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8.amxmm import SWITCH  # "0": every AMX loop off, this and the GEMM

try:
    from open1b_kernels.attention import _tilesc
except ImportError:  # pragma: no cover - the extension is optional
    _tilesc = None

DIGITS = 3 * 1024         # one 64-wide chunk's three digit blocks of 16 lines
_np = mathc.flat


@functools.lru_cache(maxsize=1)
def _cpu() -> bool:
    return bool(_tilesc is not None and hasattr(_tilesc, "amx_tiles") and _tilesc.amx_tiles())


def available() -> bool:
    """True when the compiled loops are available, built with the tile products, this
    process runs AMX-INT8 tiles and ``OPEN1B_AMX`` is not 0."""
    return mathc.available() and os.environ.get(SWITCH, "1") != "0" and _cpu()


class Digits:
    """The fixed-point digits of bf16 x (B, H, S, D) and their exponents (``digit_planes``):
    by rows over D (``cols`` False: one exponent per row) or by 64-row column groups (True:
    one per column and block), in the A or the B side's tile order."""

    def __init__(self, x: torch.Tensor, cols: bool, b_side: bool) -> None:
        b, h, s, d = x.shape
        self.planes, self.n_blk, self.d = b * h, -(-s // BLOCK_M), d
        chunks = -(-d // 64)
        per_block = (d // 16) * DIGITS if cols else 4 * chunks * DIGITS
        self.data = torch.empty(self.planes * self.n_blk * per_block, dtype=torch.int8)
        self.exps = torch.empty((self.planes, self.n_blk, d) if cols
                                else (self.planes, self.n_blk * BLOCK_M), dtype=torch.int32)
        src = _np(x.contiguous().view(torch.int16))
        out, exps = _np(self.data), _np(self.exps)
        pieces.parallel(lambda lo, hi, p: _tilesc.digit_planes(
            src, out, exps, self.planes, s, self.n_blk * BLOCK_M, d, cols, b_side, lo, hi, p),
            self.planes, grain=1)


def scores(q: torch.Tensor, k: torch.Tensor):
    """compiled.forward's exact scores: a function (qb, first, nk, out) filling ``out``
    (float32 (B * Hkv, G * 64, nk * 64)) with query block qb's scores against the band of nk
    key blocks from ``first`` - the float64 product Q K^T's values rounded to float32, as
    ``fwd_rows`` rounds them first."""
    hkv, g = k.shape[1], q.shape[1] // k.shape[1]
    qd, kd = Digits(q, False, False), Digits(k, False, True)
    bk = kd.planes
    args = (_np(qd.data), _np(qd.exps), _np(kd.data), _np(kd.exps))

    def fill(qb: int, first: int, nk: int, out: torch.Tensor) -> torch.Tensor:
        o = _np(out)
        pieces.parallel(lambda lo, hi, p: _tilesc.amx_scores(
            *args, o, bk, hkv, g, kd.n_blk, qb, nk, first, kd.d, lo, hi, p),
            bk * g * BLOCK_M // 16, grain=1)
        return out
    return fill


def value_tiles(v8: torch.Tensor) -> torch.Tensor:
    """V's int8 codes (B * Hkv, n_blk * 64, D) in the tiles' B order (``amx_value_tiles``):
    per plane, per key block, D / 16 blocks of 1 KiB."""
    bk, keys, d = v8.shape
    vb = torch.empty(bk * keys * d, dtype=torch.int8)
    src, vbn = _np(v8.contiguous()), _np(vb)
    pieces.parallel(lambda lo, hi, p: _tilesc.amx_value_tiles(src, vbn, bk, keys // BLOCK_M, d,
                                                              lo, hi, p), bk, grain=1)
    return vb


def values(v8: torch.Tensor):
    """compiled.forward's P V products: V's int8 codes (B * Hkv, n_blk * 64, D) in the tiles'
    order once, then a function (p8, first, out) filling ``out`` (float32 (B * Hkv, nk, R,
    D)) with the exact products of int8 ``p8`` (B * Hkv, nk, R, 64) and the band's values."""
    bk, keys, d = v8.shape
    n_blk = keys // BLOCK_M
    vbn = _np(value_tiles(v8))

    def fill(p8: torch.Tensor, first: int, out: torch.Tensor) -> torch.Tensor:
        _, nk, rows, _ = p8.shape
        args = (_np(p8), vbn, _np(out), bk, rows, nk, first, n_blk, d)
        pieces.parallel(lambda lo, hi, p: _tilesc.amx_pv(*args, lo, hi, p),
                        bk * nk * rows // 16, grain=1)
        return out
    return fill


def forward_loop(q: torch.Tensor, k: torch.Tensor, v8: torch.Tensor, u: torch.Tensor,
                 lo: torch.Tensor, hi: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 seq: int, window: int, scale: float) -> None:
    """compiled.forward's loop over query blocks in one call on the OpenMP team
    (``_tileloops.c``, ``amx_forward``): every 16-row panel taken from its scores
    (``scores``' tiles) through the softmax pass (``fwd_rows32``), its P V (``values``) and
    its ordered sum (``fwd_acc``) in one member's scratch - the same functions on the same
    rows, so the same bits, without four dispatches and barriers a query block. ``v8``: V's
    codes (B * Hkv, keys, D), ``u`` their row exponents (contiguous int32 (B * Hkv, keys));
    ``lo``, ``hi``: each query block's band; ``out`` (n_qb, B * Hkv, G * 64, D) and ``lse``
    (n_qb, B * Hkv, G * 64), contiguous float32."""
    qd, kd = Digits(q, False, False), Digits(k, False, True)
    lo64, hi64 = lo.to(torch.int64).contiguous(), hi.to(torch.int64).contiguous()
    bufs = (qd.data, qd.exps, kd.data, kd.exps, value_tiles(v8), u, lo64, hi64, out, lse)
    _tilesc.amx_forward(*(_np(x) for x in bufs), kd.planes, k.shape[1], q.shape[1] // k.shape[1],
                        kd.n_blk, lo64.numel(), kd.d, seq, window, scale,
                        torch.get_num_threads())


class Operands:
    """The backward's operands as digits, prepared once per call: the rows of Q and dO (A
    side: left of S = Q K^T and dP = dO V^T), of K and V (B side), the 64-row column groups
    of Q and dO (A side: left of [dK^T] = Q^T dS and [dV^T] = dO^T P) and of K (B side:
    right of dQ = dS K)."""

    def __init__(self, q, k, v, do) -> None:
        self.q, self.do = Digits(q, False, False), Digits(do, False, False)
        self.k, self.v = Digits(k, False, True), Digits(v, False, True)
        self.qc, self.doc = Digits(q, True, False), Digits(do, True, False)
        self.kc = Digits(k, True, True)
        self.hkv, self.g = k.shape[1], q.shape[1] // k.shape[1]


def backward_step(ops: Operands, h: int, qb: int, first: int, nk: int, lse: torch.Tensor,
                  drow: torch.Tensor, out_dq: torch.Tensor, acc_dk: torch.Tensor,
                  acc_dv: torch.Tensor, seq: int, window: int, scale: float) -> None:
    """One step of compiled.backward's loop (query head h of every KV group, query block
    qb, its band of nk key blocks from ``first``) on the tiles: p and ds of its tiles as
    digits (``amx_bwd_tiles``), dQ's tile products summed into ``out_dq`` (B * Hkv, 64, D)
    (``amx_dq``), dK's and dV's added to ``acc_dk`` / ``acc_dv`` (B * Hkv, D, keys)
    (``amx_kv``) - compiled.backward's values and order (``lse``, ``drow``: the step's
    (B * Hkv, 64) rows)."""
    bk, d, n_blk = ops.k.planes, ops.k.d, ops.k.n_blk
    dsr, dsc, pc = (scratch(f"attn.amx.{n}", (bk * nk * 4 * DIGITS,), torch.int8)
                    for n in ("dsr", "dsc", "pc"))
    erow, ecd, ecp = (scratch(f"attn.amx.{n}", (bk * nk * BLOCK_M,), torch.int32)
                      for n in ("erow", "ecd", "ecp"))
    tiles = (*(_np(x) for x in (ops.q.data, ops.q.exps, ops.do.data, ops.do.exps, ops.k.data,
                                ops.k.exps, ops.v.data, ops.v.exps, lse, drow, dsr, erow, dsc,
                                ecd, pc, ecp)),
             bk, ops.hkv, ops.g, n_blk, h, qb, nk, first, d, seq, window, scale)
    pieces.parallel(lambda lo, hi, p: _tilesc.amx_bwd_tiles(*tiles, lo, hi, p), bk * nk,
                    grain=1)
    dq = (_np(dsr), _np(erow), _np(ops.kc.data), _np(ops.kc.exps), _np(out_dq), bk, nk, d,
          n_blk, first)
    pieces.parallel(lambda lo, hi, p: _tilesc.amx_dq(*dq, lo, hi, p), bk * 4, grain=1)
    for lhs, rhs, ex, acc in ((ops.qc, dsc, ecd, acc_dk), (ops.doc, pc, ecp, acc_dv)):
        kv = (_np(lhs.data), _np(lhs.exps), _np(rhs), _np(ex), _np(acc), bk, ops.hkv, ops.g,
              n_blk, h, qb, nk, d, acc.shape[2], first * BLOCK_M)
        pieces.parallel(lambda lo, hi, p: _tilesc.amx_kv(*kv, lo, hi, p), bk * (d // 16),
                        grain=1)


def backward_loop(ops: Operands, lse: torch.Tensor, drow: torch.Tensor, lo: torch.Tensor,
                  hi: torch.Tensor, acc_dq: torch.Tensor, acc_dk: torch.Tensor,
                  acc_dv: torch.Tensor, seq: int, window: int, scale: float) -> None:
    """Every step of compiled.backward's loop (``backward_step`` for each query head h of the
    KV groups, then each query block qb with its band [lo[qb], hi[qb]] of key blocks) in one
    call on the OpenMP team (``_tileloops.c``): the same units in the same order, so the same
    bits, without a Python call and four thread dispatches a step. ``lse``, ``drow``: (G,
    n_qb, B * Hkv, 64); ``acc_dq`` (G, n_qb, B * Hkv, 64, D), ``acc_dk`` / ``acc_dv`` (B *
    Hkv, D, keys), all contiguous float32."""
    bk, d, n_blk = ops.k.planes, ops.k.d, ops.k.n_blk
    lo64, hi64 = lo.to(torch.int64).contiguous(), hi.to(torch.int64).contiguous()
    nk_max = int((hi64 - lo64).max()) + 1
    dsr, dsc, pc = (scratch(f"attn.amx.{n}", (bk * nk_max * 4 * DIGITS,), torch.int8)
                    for n in ("dsr", "dsc", "pc"))
    erow, ecd, ecp = (scratch(f"attn.amx.{n}", (bk * nk_max * BLOCK_M,), torch.int32)
                      for n in ("erow", "ecd", "ecp"))
    bufs = (ops.q.data, ops.q.exps, ops.do.data, ops.do.exps, ops.k.data, ops.k.exps,
            ops.v.data, ops.v.exps, ops.kc.data, ops.kc.exps, ops.qc.data, ops.qc.exps,
            ops.doc.data, ops.doc.exps, lse, drow, lo64, hi64, dsr, erow, dsc, ecd, pc, ecp,
            acc_dq, acc_dk, acc_dv)
    _tilesc.amx_backward(*(_np(x) for x in bufs), bk, ops.hkv, ops.g, n_blk, lo64.numel(), d,
                         seq, window, scale, nk_max, torch.get_num_threads())
