"""Attention's CPU reference at BLAS speed: the same arithmetic, the same bits, fewer passes.

``forward_reference`` and ``backward_reference`` (``open1b_kernels.attention.forward`` /
``.backward``) are the definition. Their loop goes over a query block's band position, so
every step gathers the active blocks' rows and runs ~30 torch operations, each one pass over
memory. Here the loop goes over query blocks (and, in the backward, the query heads of a KV
group first, as the dK/dV order requires), and each step is:

- the exact products in torch's BLAS, one matrix product per step for the whole band:
  fixed-point values are integers times one power of two per row or column, so every
  float64 partial sum is exact and the product is the same in any order
  (``open1b_kernels.attention.fixed``); P V in float32 is exact (integers below 2^24);
- everything between the products in the compiled loops of ``open1b_kernels/attention/_tilesc.c``:
  the elementwise float32 operations of the reference in its order (no fused multiply-add),
  maxima, integer and bit operations - so the same bits
  (tests/kernels/test_attention_compiled.py compares both on windows, GQA, padded sequences
  and extreme values).

Without the extension (no C compiler at install) or with ``OPEN1B_MATHC=0`` the reference
runs. Threads split rows or tiles, which are independent: the bits do not depend on the
thread count.
"""
from __future__ import annotations

import functools

import torch

from open1b_kernels.attention import amx, vnni
from open1b_kernels.attention.tiles import (BLOCK_M, BLOCK_N, block_band, pad_rows, quantize_v,
                                     row_delta, softmax_scale)
from open1b_kernels.core import mathc, pieces
from open1b_kernels.core.workspace import scratch

try:
    from open1b_kernels.attention import _tilesc
except ImportError:  # pragma: no cover - the extension is optional
    _tilesc = None

assert BLOCK_M == BLOCK_N == 64, "the compiled loops are written for 64 x 64 tiles"
_np = mathc.flat


# Band elements (KV heads x band keys x head dim) up to which a tile product of every KV
# head at once - one batched call, the band copied into it - beats a call per KV head on
# its contiguous band: demo shapes (4 x 192 x 64) 0.63x / 0.68x the time for P V / dQ,
# Open-1B's (4 x 576 x 128) 1.1x / 1.25x (Zen 4 host). The products are exact, so either
# form gives the same values.
BATCH_BAND = 1 << 16
# The AMX forward's query blocks and backward's steps each in one compiled call on the
# OpenMP team (``amx.forward_loop``, ``amx.backward_loop``) rather than four calls a block
# or a step from Python: at Open-1B's 4,096 tokens (AMX Xeon VM, 2 threads) the backward
# 0.34-0.35 -> 0.27-0.28 s under a window of 512, 0.89-0.94 -> 0.82-0.87 s fully causal; the
# forward 97 -> 82 ms and 304 -> 259 ms (``benchmarks.kernels.attention_loop``). The same
# bits either way (tests switch it off to compare).
ONE_LOOP = True


def _band_products(lhs: torch.Tensor, band: torch.Tensor, out: torch.Tensor) -> None:
    """out[i] = lhs[i] @ band[i] for every KV head i (tile products, batched over the
    band's blocks): in one call for a small band, else one call per KV head."""
    if band.numel() <= BATCH_BAND:
        torch.matmul(lhs, band, out=out)
        return
    for i in range(lhs.shape[0]):       # band[i] is contiguous: no copy
        torch.matmul(lhs[i], band[i], out=out[i])


def tiles_in_use() -> bool:
    """Whether this call's products run on AMX tiles: ``amx.available`` and the tiles agreed
    with the float64 products on the probe (``tiles_agree``, once per process)."""
    return amx.available() and tiles_agree()


@functools.lru_cache(maxsize=1)
def tiles_agree() -> bool:
    """Run once: the forward and backward with every product on the tiles and with the
    float64 products, on worst-case operands (every value at bf16's extreme exponents and
    significands, so every digit reaches -128 or 127; subnormals; zeros; GQA; a window; a
    partial block; head dims 16 and 128); False, with a warning naming the platform and the
    first differing output, where any bit differs - the process then keeps the float64
    products. The tile products are exact by construction (open1b_kernels/attention/
    _tileamx.c); this guards the hardware state they run on (tile registers an OS or a
    hypervisor must save and restore), as the int8 GEMM's probe does."""
    for case in _PROBE_CASES:
        q, k, v, do, window = _probe_inputs(*case)
        got = _run_both(q, k, v, do, window, True)
        want = _run_both(q, k, v, do, window, False)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            if not torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                               b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)):
                import warnings

                from open1b_kernels.int8.route import platform_name
                warnings.warn(f"attention's AMX tile products differ from the float64 products "
                              f"on {platform_name()} ({name} of the probe case {case}); using "
                              "the float64 products", RuntimeWarning, stacklevel=3)
                return False
    return True


# (B, Hq, Hkv, S, D, window): GQA with a partial last block; head dim 16 under a window
_PROBE_CASES = ((1, 4, 2, 80, 128, None), (1, 2, 1, 70, 16, 40))


def _probe_inputs(b, hq, hkv, s, d, window):
    """Operands whose digits reach every extreme, finite throughout (attention's inputs are:
    open1b_kernels/attention/fixed.py): values of the largest significand (255 / 128, both
    signs: the digit -128) beside much smaller ones in one group, zeros, -0, subnormals,
    and whole rows of subnormals and of zeros (groups of exponent 1)."""
    g = torch.Generator().manual_seed(0x7A11)
    ext = torch.tensor([-255.0 / 128 * 2 ** 20, 255.0 / 128 * 2 ** 20, -2.0 ** -20,
                        2.0 ** -133, 0.0, -0.0, 1.0, -255.0 / 128])

    def x(*shape):
        t = torch.randn(*shape, generator=g)
        pick = torch.randint(0, len(ext) + 1, shape, generator=g)
        t = torch.where(pick < len(ext), ext[pick.clamp(max=len(ext) - 1)], t)
        t[..., 3, :] = 2.0 ** -133 * torch.randn(shape[:-2] + (shape[-1],), generator=g)
        t[..., 5, :] = 0.0
        return t.to(torch.bfloat16)
    # queries scaled so that the scores stay moderate (softmax not one-hot): a power of two
    # changes no digit, only the group exponents
    q = (x(b, hq, s, d).float() * 2.0 ** -40).to(torch.bfloat16)
    return q, x(b, hkv, s, d), x(b, hkv, s, d), x(b, hq, s, d), window


def _run_both(q, k, v, do, window, tiles: bool):
    out, lse = _forward(q, k, v, window, tiles)
    return (out, lse, *(_backward_amx if tiles else _backward)(q, k, v, out, lse, do, window))


def available() -> bool:
    """True when the compiled tile loops are built (from this source: ``openmp`` marks the
    build whose loops take a piece count) and not disabled (OPEN1B_MATHC=0)."""
    return _tilesc is not None and hasattr(_tilesc, "openmp") and mathc.available()


def _group_rows(x: torch.Tensor, hkv: int) -> torch.Tensor:
    """(B, Hq, n, blk, ...) -> (G, n, B * Hkv, blk, ...): query head kv * G + h at [h, :, kv]."""
    b, hq, n = x.shape[:3]
    g = hq // hkv
    y = x.reshape(b, hkv, g, n, *x.shape[3:]).movedim(2, 0).movedim(3, 1)
    return y.reshape(g, n, b * hkv, *x.shape[3:]).contiguous()


def _ungroup_rows(x: torch.Tensor, b: int, hkv: int, seq: int) -> torch.Tensor:
    """Inverse of ``_group_rows`` for (G, n, B * Hkv, blk, D), unblocked to (B, Hq, seq, D)."""
    g, n, _, blk, d = x.shape
    y = x.reshape(g, n, b, hkv, blk, d).movedim(0, 3).movedim(0, 3)  # (B, Hkv, G, n, blk, D)
    return y.reshape(b, hkv * g, n * blk, d)[:, :, :seq].contiguous()


def _fixed(x: torch.Tensor, block: int, columns: bool, hkv: int = 0) -> torch.Tensor:
    """``blocked_rows(x, block)`` (columns False) or ``column_values(x, block)`` (True) of
    bf16 x (B, H, S, D) by the compiled loop: float64 (B, H, n_blocks, block, D), or with
    ``hkv`` (query heads grouped by KV head) directly in ``_group_rows``'s layout
    (G, n_blocks, B * hkv, block, D) - the same values, no copy."""
    b, h, s, d = x.shape
    n = -(-s // block)
    g = h // hkv if hkv else 0
    shape = (g, n, b * hkv, block, d) if hkv else (b, h, n, block, d)
    out = torch.empty(shape, dtype=torch.float64)
    src, dst = _np(x.contiguous().view(torch.int16)), _np(out)
    pieces.parallel(lambda a, z, p: _tilesc.fixed_planes(src, dst, b * h, s, n * block, d,
                                                        block if columns else 0, g, h, a, z, p),
                   b * h, grain=1)
    return out


def _row_products(a: torch.Tensor, b: torch.Tensor, hkv: int):
    """The exact products A B^T (A: Q or dO, B: K or V, both grouped by rows) as a function
    (h, qb, first, nk, out) -> out: float64 (B * Hkv, rows, nk * 64) for query block qb of
    head h of every KV group (h < 0: every head of the group, stacked) against the band of nk
    key blocks from ``first`` - VNNI row products where they run and pay (``_vnni_rows``),
    else the BLAS's float64 products of the fixed-point values (``amx.scores``: the same
    values from int8 tiles)."""
    g = a.shape[1] // hkv
    rows = _vnni_rows(a, b)
    if rows is not None:
        return lambda h, qb, first, nk, out: vnni.products(*rows, g, h, qb, first, nk, out)
    bk, d, n_kb = b.shape[0] * hkv, a.shape[3], -(-b.shape[2] // BLOCK_N)
    a64 = _fixed(a, BLOCK_M, False, hkv)                             # (G, n_qb, bk, 64, D)
    b64 = _fixed(b, BLOCK_N, False).reshape(bk, n_kb * BLOCK_N, d)

    def fill(h: int, qb: int, first: int, nk: int, out: torch.Tensor) -> torch.Tensor:
        lhs = a64[h, qb] if h >= 0 else a64[:, qb].movedim(0, 1).reshape(bk, -1, d)
        keys = slice(first * BLOCK_N, (first + nk) * BLOCK_N)
        return torch.matmul(lhs, b64[:, keys].transpose(1, 2), out=out)
    return fill


def _vnni_rows(a: torch.Tensor, b: torch.Tensor) -> tuple[vnni.Rows, vnni.Rows] | None:
    """The VNNI operands of the row product A B^T (A: Q or dO, B: K or V) where the VNNI
    products run (``vnni_in_use``) and L is sparse enough in both to pay
    (``vnni.sparse_enough``); else None, for the float64 products."""
    if not vnni_in_use():
        return None
    rows = vnni.Rows(a, False), vnni.Rows(b, True)
    return rows if vnni.sparse_enough(*rows) else None


def vnni_in_use() -> bool:
    """Whether the row products may run on VNNI: ``vnni.available``, no AMX tiles (they run
    every product where they agree, and their probe's float64 side must stay float64) and
    the VNNI products agreed with the float64 ones on the probe (``rows_agree``, once per
    process)."""
    return vnni.available() and not amx.available() and rows_agree()


@functools.lru_cache(maxsize=1)
def rows_agree() -> bool:
    """Run once: ``_PROBE_CASES``' Q K^T and dO V^T (worst-case operands: every digit at
    its extremes, subnormals, zeros, whole rows of both) as VNNI row products and as float64
    products, every query block against every key block, and P V (P's integers at 0 and 127
    beside random ones, V's codes of those operands) against the float32 product; False,
    with a warning naming the platform, where any bit differs - the process then keeps the
    float products. Exact by construction (open1b_kernels/attention/_tilevnni.c); this
    guards the platform it runs on, as the int8 GEMM's and the tiles' probes do."""
    for case in _PROBE_CASES:
        q, k, v, do, _ = _probe_inputs(*case)
        hkv, d = k.shape[1], q.shape[3]
        g, bk, n = q.shape[1] // hkv, q.shape[0] * hkv, -(-q.shape[2] // BLOCK_M)
        if not _pv_agrees(v, bk, g, n):
            return _disagree(case, "P V")
        for a, b in ((q, k), (do, v)):
            ra, rb = vnni.Rows(a, False), vnni.Rows(b, True)
            a64 = _fixed(a, BLOCK_M, False, hkv).movedim(0, 2).reshape(n, bk, -1, d)
            b64 = _fixed(b, BLOCK_N, False).reshape(bk, n * BLOCK_N, d)
            for qb in range(n):
                got = vnni.products(ra, rb, g, -1, qb, 0, n, torch.empty(
                    (bk, g * BLOCK_M, n * BLOCK_N), dtype=torch.float64))
                want = torch.matmul(a64[qb], b64.transpose(1, 2))
                if not torch.equal(got.view(torch.int64), want.view(torch.int64)):
                    return _disagree(case, f"query block {qb}")
    return True


def _pv_agrees(v: torch.Tensor, bk: int, g: int, n: int) -> bool:
    """``rows_agree``'s P V: the forward's output of every key block of the probe's V codes
    (one column of them all negative) against P's integers - 0 and 127 in whole rows and
    columns, random between - with its softmax weights (alpha 0, 1 and between, shifts t,
    sums l), by ``vnni.accumulate`` and by the float32 products and ``fwd_acc``, compared bit
    for bit (a zero sum is +0 both ways: the BLAS's sums start at +0)."""
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32))
               for x, y in zip(*_pv_outputs(quantize_v(v)[0].reshape(bk, n * BLOCK_N, -1), g)))


def _pv_outputs(v8: torch.Tensor, g: int, first: int = 0, nk: int | None = None, seed: int = 0x9F):
    """(VNNI, float) (out, lse) of one query block's P V over nk key blocks from ``first`` of
    int8 codes v8 (B * Hkv, keys, D), P's integers and the softmax's weights drawn from
    ``seed`` with their extremes: ``_pv_agrees``' operands, and the tests'."""
    bk, keys, d = v8.shape
    nk = keys // BLOCK_N - first if nk is None else nk
    rows, gen = g * BLOCK_M, torch.Generator().manual_seed(seed)
    v8 = v8.clone()
    v8[..., 3] = -127
    p8 = torch.randint(0, 128, (bk, nk, rows, BLOCK_N), generator=gen, dtype=torch.int8)
    p8[..., 0, :], p8[..., 1, :], p8[..., :, 5] = 127, 0, 127
    alpha = torch.rand((bk, rows, nk), generator=gen)
    alpha[:, :, 0], alpha[:, 0] = 0.0, 1.0                  # the first block's 0, a row of 1
    t = torch.randint(0, 127, (bk, rows, nk), generator=gen, dtype=torch.int32)
    m = torch.randn((bk, rows), generator=gen)
    l = torch.rand((bk, rows), generator=gen) * 64 + 1
    band = v8.float().reshape(bk, keys // BLOCK_N, BLOCK_N, d)[:, first:first + nk]
    ii = torch.empty((bk, nk, rows, d))
    _band_products(p8.float(), band, ii)
    want = torch.empty((bk, rows, d)), torch.empty((bk, rows))
    _accumulate(ii, alpha, t, m, l, *want)
    got = vnni.accumulate(p8, vnni.Values(v8), first, alpha, t, m, l, torch.empty((bk, rows, d)),
                          torch.empty((bk, rows)))
    return got, want


def _disagree(case, where: str) -> bool:
    import warnings

    from open1b_kernels.int8.route import platform_name
    warnings.warn(f"attention's VNNI products differ from the float products on "
                  f"{platform_name()} (probe case {case}, {where}); using the float products",
                  RuntimeWarning, stacklevel=3)
    return False


def forward(q, k, v, window: int | None):
    """``forward_reference``'s (out, lse), the same bits (inputs already checked). With AMX
    tiles (``tiles_in_use``) the scores come from them rounded to float32 (``fwd_rows32`` rounds
    first what ``fwd_rows`` would) and P V is an int8 tile product: the same values."""
    return _forward(q, k, v, window, tiles_in_use())


def _forward(q, k, v, window: int | None, tiles: bool):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    g, bk = hq // hkv, b * hkv
    rows = g * BLOCK_M  # one query block of the group's heads, stacked
    scale = softmax_scale(d)
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    v8, u = quantize_v(v)
    v8, u = v8.reshape(bk, n_kb * BLOCK_N, d), u.reshape(bk, n_kb * BLOCK_N).contiguous()
    lo, hi = block_band(torch.arange(n_qb), window, n_kb)
    out = torch.empty((n_qb, bk, rows, d))
    lse = torch.empty((n_qb, bk, rows))
    if tiles and ONE_LOOP and pieces.team():
        amx.forward_loop(q, k, v8, u, lo, hi, out, lse, s, window or 0, scale)
        return _outputs(out, lse, b, hkv, g, s)
    # (qb, first, nk, out) -> out: every head of the group at once
    product = amx.scores(q, k) if tiles else functools.partial(_row_products(q, k, hkv), -1)
    # P V: int8 tile products (AMX), int8 products on VNNI, or float32 products of the
    # same integers - the same values
    pv = amx.values(v8) if tiles else None
    vq = vnni.Values(v8) if not tiles and vnni_in_use() else None
    v8f = None if tiles or vq else v8.to(torch.float32).reshape(bk, n_kb, BLOCK_N, d)
    win = window or 0
    rows_loop = (_tilesc.fwd_rows32 if tiles else _tilesc.fwd_rows_i8 if vq
                 else _tilesc.fwd_rows)
    for qb in range(n_qb):
        first, nk = int(lo[qb]), int(hi[qb] - lo[qb]) + 1
        sc = product(qb, first, nk, scratch("attn.s32" if tiles else "attn.s64",
                                            (bk, rows, nk * BLOCK_N),
                                            torch.float32 if tiles else torch.float64))
        p8 = scratch("attn.p8", (bk, nk, rows, BLOCK_N),
                     torch.int8 if tiles or vq else torch.float32)
        alpha = scratch("attn.alpha", (bk, rows, nk), torch.float32)
        t = scratch("attn.t", (bk, rows, nk), torch.int32)
        m, l = scratch("attn.m", (bk, rows), torch.float32), scratch("attn.l", (bk, rows),
                                                                     torch.float32)
        args = (_np(sc), _np(u), _np(p8), _np(alpha), _np(t), _np(m), _np(l), bk, rows, nk,
                n_kb * BLOCK_N, first * BLOCK_N, qb * BLOCK_M, s, win, scale)
        pieces.parallel(lambda a, z, p: rows_loop(*args, a, z, p), bk * rows, grain=8)
        if vq is not None:      # P V made and added in one pass: fwd_acc's operations
            vnni.accumulate(p8, vq, first, alpha, t, m, l, out[qb], lse[qb])
            continue
        ii = scratch("attn.pv", (bk, nk, rows, d), torch.float32)  # (bk, nk, rows, D), exact
        if tiles:
            pv(p8, first, ii)
        else:
            _band_products(p8, v8f[:, first:first + nk], ii)
        _accumulate(ii, alpha, t, m, l, out[qb], lse[qb])
    return _outputs(out, lse, b, hkv, g, s)


def _outputs(out, lse, b: int, hkv: int, g: int, s: int):
    """(out bf16 (B, Hq, S, D), lse (B, Hq, S)) from the forward's (n_qb, B * Hkv, G * 64, D)
    float32 rows and their (n_qb, B * Hkv, G * 64) lse."""
    n_qb, bk, _, d = out.shape
    out = out.reshape(n_qb, bk, g, BLOCK_M, d).movedim(2, 0)  # (G, n_qb, bk, BM, D)
    lse = lse.reshape(n_qb, bk, g, BLOCK_M, 1).movedim(2, 0)
    out = _ungroup_rows(out.to(torch.bfloat16), b, hkv, s)
    return out, _ungroup_rows(lse, b, hkv, s).squeeze(-1)


def _accumulate(ii, alpha, t, m, l, out, lse) -> None:
    """One query block's output from its key blocks' P V products ii (B * Hkv, nk, R, D):
    ``fwd_acc``'s ordered float32 sum into out (B * Hkv, R, D), then out / l and lse."""
    bk, nk, rows, d = ii.shape
    args = tuple(_np(x) for x in (ii, alpha, t, m, l, out, lse)) + (bk, rows, nk, d)
    pieces.parallel(lambda a, z, p: _tilesc.fwd_acc(*args, a, z, p), bk * rows, grain=8)


def backward(q, k, v, o, lse, do, window: int | None):
    """``backward_reference``'s (dq, dk, dv), the same bits (inputs already checked).

    Loop order: query head h of every KV group outer, query blocks ascending inner - the
    order in which dK and dV sum their tiles (heads ascending, then query blocks); dQ of a
    query block sums its band's tiles ascending within one step. With AMX tiles
    (``tiles_in_use``) the same loop takes its products from them."""
    if tiles_in_use():
        return _backward_amx(q, k, v, o, lse, do, window)
    return _backward(q, k, v, o, lse, do, window)


def _backward(q, k, v, o, lse, do, window: int | None):
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    g, bk = hq // hkv, b * hkv
    scale = softmax_scale(d)
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    drow = _group_rows(pad_rows(row_delta(o, do), BLOCK_M, 0.0), hkv)  # (G, n_qb, bk, BM)
    lse_b = _group_rows(pad_rows(lse, BLOCK_M, 0.0), hkv)
    qc64, doc64 = (_fixed(x, BLOCK_M, True, hkv) for x in (q, do))
    kc64 = _fixed(k, BLOCK_N, True).reshape(bk, n_kb, BLOCK_N, d)
    s_rows, dp_rows = _row_products(q, k, hkv), _row_products(do, v, hkv)
    lo, hi = block_band(torch.arange(n_qb), window, n_kb)
    acc_dq = torch.empty((g, n_qb, bk, BLOCK_M, d))
    # dK and dV transposed, (BK, D, keys): their tile products run as (D, 64) x (64, band),
    # the BLAS's faster form of the same exact values; each element's ordered sum is the
    # same whatever the layout
    acc_dk = torch.zeros((bk, d, n_kb * BLOCK_N))
    acc_dv = torch.zeros((bk, d, n_kb * BLOCK_N))
    win = window or 0
    for h in range(g):
        for qb in range(n_qb):
            first, nk = int(lo[qb]), int(hi[qb] - lo[qb]) + 1
            s64, dp64 = (scratch(f"attn.{name}", (bk, BLOCK_M, nk * BLOCK_N), torch.float64)
                         for name in ("s64", "dp64"))
            s_rows(h, qb, first, nk, s64)
            dp_rows(h, qb, first, nk, dp64)
            # ds16's tiles grouped by rows (dQ) and ds16's and p16's grouped by columns
            # (dK, dV), all three laid out by query rows
            dsr = scratch("attn.dsr", (bk, nk, BLOCK_M, BLOCK_N), torch.float64)
            dsc, pc = (scratch(f"attn.{name}", (bk, BLOCK_M, nk * BLOCK_N), torch.float64)
                       for name in ("dsc", "pc"))
            args = (_np(s64), _np(dp64), _np(lse_b[h, qb]), _np(drow[h, qb]), _np(dsr),
                    _np(dsc), _np(pc), bk, nk, first * BLOCK_N, qb * BLOCK_M, s, win, scale)
            pieces.parallel(lambda a, z, p: _tilesc.bwd_tiles(*args, a, z, p), bk * nk, grain=1)
            # the tile products and their ordered sum in one pass (check_inputs: D is a
            # power of two >= 16, the loop's column block)
            dq_args = (_np(dsr), _np(kc64), _np(acc_dq[h, qb]), bk, nk, d, n_kb, first)
            pieces.parallel(lambda a, z, p: _tilesc.dq_tiles(*dq_args, a, z, p),
                            bk * BLOCK_M, grain=8)
            for rhs, lhs, acc in ((dsc, qc64, acc_dk), (pc, doc64, acc_dv)):
                # [dK^T]_tiles = Q^T dS (D, 64) x (64, band), added to the running sums
                kv_args = (_np(lhs[h, qb]), _np(rhs), _np(acc), bk, d, nk * BLOCK_N,
                           n_kb * BLOCK_N, first * BLOCK_N)
                pieces.parallel(lambda a, z, p: _tilesc.kv_tiles(*kv_args, a, z, p),
                                bk * d, grain=8)
    return _gradients(acc_dq, acc_dk, acc_dv, scale, b, hkv, s)


def _gradients(acc_dq, acc_dk, acc_dv, scale: float, b: int, hkv: int, s: int):
    """(dq, dk, dv) bf16 from the backward's float32 sums: dQ (G, n_qb, B * Hkv, 64, D),
    dK^T and dV^T (B * Hkv, D, keys); dQ and dK scaled, each rounded once."""
    d, keys = acc_dk.shape[1], acc_dk.shape[2]
    dq = _ungroup_rows((acc_dq * scale).to(torch.bfloat16), b, hkv, s)
    dk = (acc_dk * scale).to(torch.bfloat16).transpose(1, 2).reshape(b, hkv, keys, d)[:, :, :s]
    dv = acc_dv.to(torch.bfloat16).transpose(1, 2).reshape(b, hkv, keys, d)[:, :, :s]
    return dq, dk.contiguous(), dv.contiguous()


def _backward_amx(q, k, v, o, lse, do, window: int | None):
    """``backward``'s loop with every tile product on AMX tiles (``amx.backward_step``):
    the same steps in the same order, the same values, so the same bits."""
    b, hq, s, d = q.shape
    hkv = k.shape[1]
    g, bk = hq // hkv, b * hkv
    scale = softmax_scale(d)
    n_qb, n_kb = -(-s // BLOCK_M), -(-s // BLOCK_N)
    drow = _group_rows(pad_rows(row_delta(o, do), BLOCK_M, 0.0), hkv)  # (G, n_qb, bk, BM)
    lse_b = _group_rows(pad_rows(lse, BLOCK_M, 0.0), hkv)
    ops = amx.Operands(q, k, v, do)
    lo, hi = block_band(torch.arange(n_qb), window, n_kb)
    acc_dq = torch.empty((g, n_qb, bk, BLOCK_M, d))
    acc_dk = torch.zeros((bk, d, n_kb * BLOCK_N))
    acc_dv = torch.zeros((bk, d, n_kb * BLOCK_N))
    if ONE_LOOP and pieces.team():
        # the steps in one call on the OpenMP team: without it the loop's phases would run
        # on one thread, where the per-step calls below split each across the pool
        amx.backward_loop(ops, lse_b.contiguous(), drow.contiguous(), lo, hi, acc_dq, acc_dk,
                          acc_dv, s, window or 0, scale)
        return _gradients(acc_dq, acc_dk, acc_dv, scale, b, hkv, s)
    for h in range(g):
        for qb in range(n_qb):
            first, nk = int(lo[qb]), int(hi[qb] - lo[qb]) + 1
            amx.backward_step(ops, h, qb, first, nk, lse_b[h, qb], drow[h, qb], acc_dq[h, qb],
                              acc_dk, acc_dv, s, window or 0, scale)
    return _gradients(acc_dq, acc_dk, acc_dv, scale, b, hkv, s)
