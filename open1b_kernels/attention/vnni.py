"""Attention's exact row products Q K^T and dO V^T on AVX-512 VNNI
(``open1b_kernels/attention/_tilevnni.c``, which says why they are exact): the float64 values
of ``open1b_kernels.attention.compiled``'s BLAS products, from int8 digits.

Both operands group one row over the head dim (one exponent a row), so each fixed-point
integer N (|N| < 2^21) splits as 2^7 H + L with L nonzero only for values 7 or more binades
below their row's largest: H H runs dense as four int8 digit products at VPDPBUSD's rate,
the terms with an L run over L's nonzeros. That pays while L is sparse - ~2% of a Gaussian
row; every value of a row with one large outlier is not - so ``Rows.share`` (L's nonzeros
over all elements) decides per call: above ``SPARSE_MAX`` compiled.py keeps the float64
product. Either way the values are the same. ``OPEN1B_VNNI=0`` keeps the float64 products.

The forward's P V is one int8 product a key block (``Values``, ``accumulate``): P's integers
0..127 times V's int8 codes, summed in int32 below 2^24 - the value compiled.py's float32
product of the same integers gives, at VPDPBUSD's rate instead of a float32 GEMM's - and added
into the forward's output as it is made (fwd_acc's operations), so none reaches memory.

The products P^T dO, dS^T Q and dS K multiply probabilities and their gradients, whose small
values fill L, and stay float64 (compiled.py's ``_tilesc`` loops).
"""
from __future__ import annotations

import functools
import os

import torch

from open1b_kernels.attention.tiles import BLOCK_M
from open1b_kernels.core import mathc, pieces

try:
    from open1b_kernels.attention import _tilesc
except ImportError:  # pragma: no cover - the extension is optional
    _tilesc = None

SWITCH = "OPEN1B_VNNI"  # "0": the float64 products
# L's share of nonzeros above which an operand's products stay float64. Each nonzero adds
# 64 multiply-adds at float64's rate to a tile's 4 x 64 x 64 x D int8 ones; measured on the
# Zen 4 (2 cores, ``python -m benchmarks.kernels.attention_rows``, the forward's product at
# 16 key blocks, two runs): 1.39x the float64 product at a Gaussian's 1.7%, 1.26-1.31x at
# 5.5-7.4%, 1.16-1.17x at 9.3%, 1.07-1.19x at 13% - so a tenth
SPARSE_MAX = 1 / 10
_np = mathc.flat


@functools.lru_cache(maxsize=1)
def _cpu() -> bool:
    return bool(_tilesc is not None and hasattr(_tilesc, "vnni_tiles") and _tilesc.vnni_tiles())


def available() -> bool:
    """True when the compiled loops are available, this CPU runs AVX-512 VNNI and
    ``OPEN1B_VNNI`` is not 0."""
    return mathc.available() and os.environ.get(SWITCH, "1") != "0" and _cpu()


class Rows:
    """bf16 x (B, H, S, D) as the left (``b_side`` False: Q, dO) or right (True: K, V)
    operand of a row product: digits, k-major H or N, L's nonzeros, exponents."""

    def __init__(self, x: torch.Tensor, b_side: bool) -> None:
        b, h, s, d = x.shape
        self.planes, self.n_blk, self.d, self.b_side = b * h, -(-s // BLOCK_M), d, b_side
        rows = self.n_blk * BLOCK_M
        self.dig = torch.empty(self.planes * rows * d * 2, dtype=torch.int8)
        self.tr, self.sp = (torch.empty(self.planes * rows * d, dtype=torch.int32)
                            for _ in range(2))
        self.spn = torch.empty(self.planes * self.n_blk, dtype=torch.int32)
        self.exps = torch.empty(self.planes * rows, dtype=torch.int32)
        self.corr = torch.empty(self.planes * rows, dtype=torch.float64)
        src = _np(x.contiguous().view(torch.int16))
        bufs = tuple(_np(t) for t in (self.dig, self.tr, self.sp, self.spn, self.exps,
                                      self.corr))
        pieces.parallel(lambda lo, hi, p: _tilesc.vnni_rows(
            src, *bufs, self.planes, s, rows, d, b_side, lo, hi, p), self.planes, grain=1)
        self.share = int(self.spn.sum()) / max(1, self.sp.numel())
        own = (self.dig, self.tr, self.sp, self.spn, self.exps)
        # the loop's arguments, made once: a layer's backward calls it 512 times
        self._args = tuple(_np(t) for t in (*own, self.corr) if b_side or t is not self.corr)

    def args(self) -> tuple:
        """The loop's arguments for this side: the right one adds its column sums."""
        return self._args


def sparse_enough(*operands: Rows) -> bool:
    """Whether every operand's L is sparse enough for the VNNI products to pay."""
    return all(x.share <= SPARSE_MAX for x in operands)


def products(a: Rows, b: Rows, g: int, h: int, qb: int, first: int, nk: int,
             out: torch.Tensor) -> torch.Tensor:
    """Fill float64 ``out`` (B * Hkv, heads * 64, nk * 64) with the exact row products of
    query block ``qb`` of ``a``'s planes (grouped G to a KV plane: head ``h``, or every head
    of the group for ``h`` < 0) and the band of ``nk`` key blocks of ``b`` from ``first``:
    compiled.py's float64 products, the same values."""
    if a.b_side or not b.b_side:
        raise ValueError("products(a, b): a must be a left side (Rows(x, False)), b a right "
                         "side (Rows(x, True))")
    heads = g if h < 0 else 1
    args = (*a.args(), *b.args(), _np(out), b.planes, g, h, qb, first, nk, a.n_blk, b.n_blk, a.d)
    pieces.parallel(lambda lo, hi, p: _tilesc.vnni_products(*args, lo, hi, p),
                    b.planes * heads * nk, grain=1)
    return out


class Values:
    """int8 V codes (B * Hkv, n_kb * 64, D) (``tiles.quantize_v``) in the order the forward's
    P V reads them (``accumulate``)."""

    def __init__(self, v8: torch.Tensor) -> None:
        self.planes, keys, self.d = v8.shape
        self.n_kb = keys // BLOCK_M
        if keys % BLOCK_M or v8.dtype != torch.int8:
            raise ValueError(f"Values needs int8 V codes in whole key blocks, got {v8.dtype} "
                             f"{tuple(v8.shape)}")
        self.vq = torch.empty(v8.numel(), dtype=torch.int8)
        src, dst, units = _np(v8.contiguous()), _np(self.vq), self.planes * self.n_kb
        pieces.parallel(lambda lo, hi, p: _tilesc.vnni_values(src, dst, units, self.d, lo, hi,
                                                              p), units, grain=1)


def accumulate(p8: torch.Tensor, v: Values, first: int, alpha: torch.Tensor, t: torch.Tensor,
               m: torch.Tensor, l: torch.Tensor, out: torch.Tensor,
               lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's output of one query block: P V of each key block of the band
    added into float32 ``out`` (B * Hkv, R, D) as compiled.py's ``fwd_acc`` adds it (``alpha``,
    ``t`` (B * Hkv, R, nk), ``m``, ``l`` (B * Hkv, R) from ``fwd_rows_i8``), then out / l and
    ``lse`` = m + log(l) - the same operations on the same values, none of the products in
    memory."""
    bk, nk, r, _ = p8.shape
    args = (*(_np(x) for x in (p8, v.vq, alpha, t, m, l, out, lse)), bk, r, nk, first, v.n_kb,
            v.d)
    pieces.parallel(lambda lo, hi, p: _tilesc.vnni_pv_acc(*args, lo, hi, p), bk * (r // 4),
                    grain=1)
    return out, lse
