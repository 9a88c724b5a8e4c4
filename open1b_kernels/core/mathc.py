"""Compiled CPU loops for ``open1b_kernels.core.mathfn``'s exp and log (the same bits, ~15x faster),
``open1b_kernels.ops.lmhead``'s row slicer, the Hadamard butterflies and ``open1b_kernels.ops.philox``'s
word generator (integer or exactly specified operations: the same result).

``open1b_kernels/core/_mathc.c`` evaluates exactly the float32 operations of ``mathfn._exp`` /
``mathfn._log`` in the same order (its build flags forbid fused multiply-add contraction
and value-changing optimizations), one element at a time in a vectorized C loop, instead
of torch's one full pass per operation. The torch code stays the definition and the
fallback: where the extension was not compiled (no C compiler at install time), or with
``OPEN1B_MATHC=0`` in the environment, ``apply`` returns None and mathfn runs its torch
code. tests/kernels/test_mathc.py checks bit equality with the torch code on every class
of input.

Large inputs are split into one contiguous piece per torch intra-op thread
(``open1b_kernels.core.pieces``: on torch's OpenMP threads where the extension was built with
OpenMP, else on a thread pool). Every loop's result is the same whatever the cut.
"""
from __future__ import annotations

import os

import torch

from open1b_kernels.core.pieces import parallel, row_pieces

try:
    from open1b_kernels.core import _mathc
except ImportError:  # pragma: no cover - the extension is optional
    _mathc = None

PARALLEL_MIN = 1 << 18   # elements below which one thread is faster than a hand-off


def available() -> bool:
    """True when the compiled loops are present (built from this source: ``openmp`` marks
    the build whose loops take a piece count) and not disabled by OPEN1B_MATHC=0."""
    return (_mathc is not None and hasattr(_mathc, "openmp")
            and os.environ.get("OPEN1B_MATHC", "1") != "0")


def has(name: str) -> bool:
    """True when the compiled loop ``name`` is present (an extension built from an older
    source lacks the newer ones) and the loops are not disabled."""
    return available() and hasattr(_mathc, name)


def flat(x: torch.Tensor):
    """The numpy view of a contiguous CPU tensor's memory, for a compiled loop to write into
    or read (never a copy: a copy would drop what the loop writes)."""
    if not x.is_contiguous():
        raise ValueError("the compiled loops need contiguous tensors")
    return x.reshape(-1).numpy()


def philox_words(seed: int, stream: int, offset: int, n: int) -> torch.Tensor | None:
    """``open1b_kernels.ops.philox.random_words_cpu`` by the compiled loop (integer arithmetic
    only: the same words), or None when the loop is unavailable."""
    if not has("philox_words"):
        return None
    out = torch.empty((n,), dtype=torch.int64)
    o = out.numpy()
    parallel(lambda lo, hi, p: _mathc.philox_words(seed, stream, offset, o[lo:hi], lo, hi, p),
             n)
    return out


def apply(name: str, x: torch.Tensor) -> torch.Tensor | None:
    """``mathfn.<name>(x)`` by the compiled loop for a CPU float32 tensor, or None when
    the loop is unavailable (the caller then evaluates the torch code)."""
    if not available() or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    fn = getattr(_mathc, name)
    src = x.contiguous()
    out = torch.empty_like(src)
    a, b = flat(src), flat(out)
    parallel(lambda lo, hi, p: fn(a[lo:hi], b[lo:hi], p), a.shape[0], grain=PARALLEL_MIN)
    return out.reshape(x.shape)


def fwht_dim0_(y: torch.Tensor, block: int, rows: slice, cols: slice) -> bool:
    """The butterfly stages of ``open1b_kernels.int8.hadamard.hadamard_dim0_cpu_`` on the tile
    ``y[rows, cols]`` of a contiguous float32 (R, C) tensor, in place, by the compiled loop
    (the same IEEE adds and subtracts: the same bits); False when the loop is unavailable.
    Columns are independent, so the tile is split by columns among the torch threads."""
    if not has("fwht_dim0"):
        return False
    r, c = y.shape
    buf = y.reshape(-1).numpy()
    c0, c1 = cols.start, cols.stop
    parallel(lambda lo, hi, p: _mathc.fwht_dim0(buf, r, c, rows.start, rows.stop, block,
                                                 c0 + lo, c0 + hi, p), c1 - c0)
    return True


def rotate_cols(kind: int, src: torch.Tensor, row_scale: torch.Tensor | None, valid: int,
                y: torch.Tensor, block: int, scale: float, cmax: torch.Tensor,
                cmin: torch.Tensor, tile_rows: int, tile_cols: int) -> bool:
    """``open1b_kernels.int8.quantize.rotate_quantize_cols_cpu``'s fill, rotation, scale and column
    extremes by the compiled loop (see ``rotq`` in _mathc.c for the source kinds; ``src``
    is the source's contiguous storage), columns split among the threads; False when the
    loop is unavailable."""
    if not has("rotq"):
        return False
    r, c = y.shape
    bits = src.view(torch.int16) if src.dtype == torch.bfloat16 else src
    if kind == 1:     # a transposed bf16 source: y filled first by one blocked transpose
        sb = flat(bits)
        parallel(lambda lo, hi, p: _mathc.widen_t(sb, flat(y), valid, c, r, lo * 64,
                                                  min(r, hi * 64), p), -(-r // 64), grain=4)
    rs = (flat(row_scale.to(torch.float32).contiguous()) if row_scale is not None
          else torch.empty(0, dtype=torch.float32).numpy())
    args = (kind, flat(bits), rs, valid, flat(y), r, c, block, scale, flat(cmax), flat(cmin),
            tile_rows, tile_cols)
    parallel(lambda lo, hi, p: _mathc.rotq(*args, lo, hi, p), c, grain=16)
    return True


def quantize(x: torch.Tensor, div: torch.Tensor) -> torch.Tensor | None:
    """``open1b_kernels.int8.quantize.quantize_cpu``'s int8 codes of a 2-D bf16 or float32 CPU
    tensor for the safe step ``div`` ((R,) per row or (1,)) by the compiled loop - the same
    division, clamp and rounding - or None when the loop is unavailable."""
    if (not has("quant") or x.device.type != "cpu" or x.dim() != 2
            or x.dtype not in (torch.bfloat16, torch.float32)):
        return None
    r, c = x.shape
    d = div.reshape(-1).to(torch.float32).contiguous()
    if d.numel() not in (1, r):
        return None
    xc = x.contiguous()
    out = torch.empty((r, c), dtype=torch.int8)
    bf = x.dtype == torch.bfloat16
    args = (flat(xc.view(torch.int16) if bf else xc), bf, flat(d), flat(out), r, c)
    parallel(lambda lo, hi, p: _mathc.quant(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // max(c, 1)))
    return out


def rotation_steps(cmax: torch.Tensor, cmin: torch.Tensor, inv127: float):
    """``open1b_kernels.int8.quantize.rotate_quantize_cols_cpu``'s (step, divisor, subnormal) from
    the rotation's column extremes by the compiled loop - step = |max(cmax, -cmin)| *
    inv127, the divisor 1 where step == 0, whether a step is subnormal: the torch code's
    operations - or None when the loop is unavailable."""
    if not has("rot_steps"):
        return None
    step, div = torch.empty_like(cmax), torch.empty_like(cmax)
    sub = _mathc.rot_steps(flat(cmax), flat(cmin), flat(step), flat(div), inv127)
    return step, div, sub


def int8_codes(y: torch.Tensor, div: torch.Tensor, clamp: bool, out: torch.Tensor,
               transposed: bool) -> bool:
    """int8 ``rne(clamp(y / div[col]))`` of float32 (R, C) ``y`` into ``out`` ((R, C), or
    (C, R) when ``transposed``) by the compiled loop; False when it is unavailable."""
    if not has("codes"):
        return False
    r, c = y.shape
    args = (flat(y), flat(div.to(torch.float32).contiguous()), clamp, flat(out), transposed, r, c)
    parallel(lambda lo, hi, p: _mathc.codes(*args, lo, hi, p), r,
             grain=max(64, PARALLEL_MIN // max(c, 1)))
    return True


def levels_round(accs: torch.Tensor, weights: list[float], rowf: torch.Tensor,
                 colf: torch.Tensor, out: torch.Tensor, c0: int, rows: torch.Tensor,
                 cols: torch.Tensor, base: torch.Tensor | None = None) -> bool:
    """``open1b_kernels.ops.lmhead``'s integer route for one output block: the int32 products
    ``accs`` (n, R, C) summed with their ``weights`` (powers of two) onto ``base`` (an int64
    (R, C) part of T computed elsewhere, or None) into an exact float64 T, rounded once into
    ``out[:, c0:c0 + C]`` as ``fp32((T * rowf[r]) * colf[c])``, and T's row and column sums
    added into ``rows`` (R,) and ``cols`` (C,) int64 modulo 2^64 (the check's sums) - exact
    integer arithmetic and one rounding, so the torch code's values. False when the loop is
    unavailable (a build from an older source has only the unweighted sums' loop). Rows split
    among the torch threads, each with its own column sums."""
    if not has("levels_round_weighted"):
        return False
    n, r, c = accs.shape
    w = torch.tensor(weights, dtype=torch.float64)
    none = torch.empty(0, dtype=torch.int64)
    args = (flat(accs), n, w.numpy(), flat(rowf.contiguous()), flat(colf.contiguous()),
            flat(out), flat(rows))
    tail = flat(base if base is not None else none)
    cols += row_pieces(r, c, r // 16, lambda lo, hi, parts, p: _mathc.levels_round_weighted(
        *args, parts, tail, r, c, out.shape[1], c0, lo, hi, p))
    return True


def float_sum(parts: torch.Tensor, weights: list[float], t: torch.Tensor, from_t: bool,
              rounding: tuple | None = None) -> bool:
    """``open1b_kernels.ops.float_products``' float route for one output block: the float32
    products ``parts`` (n, R, C) - exact integers - times their ``weights`` (powers of two)
    added in float64 to ``t`` (R, C) (from its values with ``from_t``, else from 0), exactly;
    then stored into ``t``, or with ``rounding`` = (out, c0, rowf, colf) rounded once into
    ``out[:, c0:c0 + C]`` as ``fp32((T * rowf[r]) * colf[c])`` (``t`` left as it was).
    False when the loop is unavailable. Rows split among the torch threads."""
    if not has("float_sum"):
        return False
    n, r, c = parts.shape
    w = torch.tensor(weights, dtype=torch.float64)
    if rounding is None:
        none64 = torch.empty(0, dtype=torch.float64).numpy()
        tail = (none64, none64, torch.empty(0, dtype=torch.float32).numpy(), False, r, c, c, 0)
    else:
        out, c0, rowf, colf = rounding
        f64 = [flat(x.to(torch.float64).contiguous()) for x in (rowf, colf)]
        tail = (*f64, flat(out), True, r, c, out.shape[1], c0)
    args = (flat(parts), n, w.numpy(), flat(t), from_t, *tail)
    parallel(lambda lo, hi, p: _mathc.float_sum(*args, lo, hi, p), r, grain=16)
    return True


def xent_grad(x: torch.Tensor, t: torch.Tensor, lse: torch.Tensor, g: float):
    """``open1b_kernels.ops.xent.xent_backward_cpu``'s dlogits for float32 logits by the compiled
    loop (the same float32 operations in the same order: the same bits), or None when the
    loop is unavailable or the inputs are not contiguous CPU float32/int64."""
    if (not has("xent_grad") or x.device.type != "cpu"
            or x.dtype != torch.float32 or x.dim() != 2 or not x.is_contiguous()):
        return None
    r, v = x.shape
    t64 = t.to(torch.int64).contiguous()
    lse32 = lse.to(torch.float32).contiguous()
    out = torch.empty_like(x)
    args = (x.reshape(-1).numpy(), t64.numpy(), lse32.numpy(), g, out.reshape(-1).numpy(), r, v)
    parallel(lambda lo, hi, p: _mathc.xent_grad(*args, lo, hi, p), r, grain=1)
    return out


def xent_lse(x: torch.Tensor, chunk: int) -> torch.Tensor | None:
    """``open1b_kernels.ops.xent.row_lse_cpu`` for contiguous float32 CPU logits by the compiled
    rows (the same operations in the same order), or None when the loop is unavailable or
    the layout does not fit."""
    if (not has("xent_lse") or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 2 or not x.is_contiguous() or x.shape[1] == 0):
        return None
    r, v = x.shape
    lse = torch.empty(r, dtype=torch.float32)
    args = (flat(x), flat(lse), r, v, chunk)
    parallel(lambda lo, hi, p: _mathc.xent_lse(*args, lo, hi, p), r, grain=1)
    return lse


def _rms_ok(x: torch.Tensor, gain: torch.Tensor | None, name: str) -> bool:
    return (has(name) and x.device.type == "cpu" and x.dtype == torch.bfloat16
            and (gain is None or gain.dtype in (torch.bfloat16, torch.float32)))


def _gain32(gain: torch.Tensor | None):
    if gain is None:
        return torch.empty(0, dtype=torch.float32).numpy()
    return gain.to(torch.float32).contiguous().numpy()


def rms_fwd(x: torch.Tensor, gain: torch.Tensor | None, rd: float, eps: float):
    """``open1b_kernels.ops.rmsnorm.rmsnorm_fwd_cpu`` for bf16 x by the compiled loop (the same
    float32 operations in the same order, the pairwise tree for the row sums): (y, rstd), or
    None when the loop is unavailable or x is not bf16."""
    if not _rms_ok(x, gain, "rms_fwd"):
        return None
    d = x.shape[-1]
    xc = x.contiguous()
    r = xc.numel() // d
    y = torch.empty_like(xc)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32)
    args = (flat(xc.view(torch.int16)), _gain32(gain), rd, eps, flat(y.view(torch.int16)),
            flat(rstd), r, d)
    parallel(lambda lo, hi, p: _mathc.rms_fwd(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // d))
    return y, rstd


def rms_bwd(dy: torch.Tensor, x: torch.Tensor, gain: torch.Tensor | None, rstd: torch.Tensor,
            rd: float, prod: torch.Tensor | None):
    """``open1b_kernels.ops.rmsnorm.rmsnorm_bwd_cpu``'s dx (bf16) for bf16 x by the compiled loop,
    writing the gain gradient's terms dy * xhat into ``prod`` (float32, x's shape) when
    given; None when the loop is unavailable or a dtype does not fit."""
    if not _rms_ok(x, gain, "rms_bwd") or dy.dtype not in (torch.bfloat16, torch.float32):
        return None
    d = x.shape[-1]
    xc, dyc = x.contiguous(), dy.contiguous()
    r = xc.numel() // d
    dx = torch.empty_like(xc)
    bf = dyc.dtype == torch.bfloat16
    pr = flat(prod) if prod is not None else torch.empty(0, dtype=torch.float32).numpy()
    args = (flat(dyc.view(torch.int16) if bf else dyc), bf, flat(xc.view(torch.int16)),
            _gain32(gain), flat(rstd.to(torch.float32).contiguous()), rd,
            flat(dx.view(torch.int16)), pr, r, d)
    parallel(lambda lo, hi, p: _mathc.rms_bwd(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // d))
    return dx


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float
         ) -> torch.Tensor | None:
    """``open1b_kernels.ops.rope._rotate_cpu`` for bf16 x (..., T, H, D) with the float32 tables
    (T, D/2) by the compiled rows - the same float32 operations in the same order - or None
    when the loop is unavailable or a dtype or sign does not fit."""
    if (not has("rope") or x.device.type != "cpu" or x.dtype != torch.bfloat16
            or cos.dtype != torch.float32 or sin.dtype != torch.float32
            or sign not in (1.0, -1.0)):
        return None
    t, h, d = x.shape[-3:]
    xc = x.contiguous()
    r = xc.numel() // max(d, 1)
    out = torch.empty_like(xc)
    args = (flat(xc.view(torch.int16)), flat(cos.contiguous()), flat(sin.contiguous()),
            float(sign), flat(out.view(torch.int16)), r, t, h, d // 2)
    parallel(lambda lo, hi, p: _mathc.rope(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 4 // max(d, 1)))
    return out


def swiglu(h: torch.Tensor, dy: torch.Tensor | None = None) -> torch.Tensor | None:
    """``open1b_kernels.ops.swiglu``'s CPU forward (dy None: y (..., F)) or backward (dh (..., 2F))
    for bf16 h (..., 2F) and dy (..., F) by the compiled rows - the same float32 operations
    in the same order - or None when the loop is unavailable or a dtype does not fit."""
    if (not has("swiglu") or h.device.type != "cpu" or h.dtype != torch.bfloat16
            or (dy is not None and dy.dtype != torch.bfloat16) or h.shape[-1] % 2):
        return None
    f = h.shape[-1] // 2
    hc = h.contiguous()
    r = hc.numel() // max(2 * f, 1)
    shape = (*h.shape[:-1], f if dy is None else 2 * f)
    out = torch.empty(shape, dtype=torch.bfloat16)
    d = (flat(dy.contiguous().view(torch.int16)) if dy is not None
         else torch.empty(0, dtype=torch.int16).numpy())
    args = (flat(hc.view(torch.int16)), d, flat(out.view(torch.int16)), r, f)
    parallel(lambda lo, hi, p: _mathc.swiglu(*args, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // 8 // max(f, 1)))
    return out


def bf16_rne(x: torch.Tensor) -> torch.Tensor | None:
    """``open1b_kernels.int8.gemm.bf16_rne`` (float32 -> bf16, round to nearest even by bit
    arithmetic, NaN -> 0x7FC0) by the compiled loop, or None when unavailable."""
    if (not has("bf16_rne") or x.device.type != "cpu"
            or x.dtype != torch.float32):
        return None
    src = x.contiguous()
    out = torch.empty(src.shape, dtype=torch.bfloat16)
    a, b = src.reshape(-1).numpy(), out.reshape(-1).view(torch.int16).numpy()
    n = a.shape[0]
    parallel(lambda lo, hi, p: _mathc.bf16_rne(a[lo:hi], b[lo:hi], p), n, grain=PARALLEL_MIN)
    return out


def add_bf16(xs) -> torch.Tensor | None:
    """bf16(((fp32(a) + fp32(b)) [+ fp32(c)])) of two or three bf16 CPU tensors of one shape
    by the compiled loop - the exact widenings, the float32 adds in order, one rounding to
    nearest even - or None when unavailable (the caller runs the torch code)."""
    if (not has("add_bf16") or len(xs) not in (2, 3)
            or any(x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.shape != xs[0].shape
                   for x in xs)):
        return None
    bits = [flat(x.contiguous().view(torch.int16)) for x in xs]
    if len(bits) == 2:
        bits.append(torch.empty(0, dtype=torch.int16).numpy())
    out = torch.empty(xs[0].shape, dtype=torch.bfloat16)
    o = flat(out.view(torch.int16))
    parallel(lambda lo, hi, p: _mathc.add_bf16(*bits, o, lo, hi, p), o.shape[0],
             grain=PARALLEL_MIN)
    return out


def ste(g: torch.Tensor, x: torch.Tensor, div: torch.Tensor, want_term: bool):
    """``open1b_kernels.int8.quantize.ste_cpu`` with bf16 dx by the compiled loop - the same float32
    operations (division, comparisons, clamp, round half to even, subtraction, product) -
    for contiguous (R, C) float32 ``g`` and bf16/float32 ``x``, ``div`` the safe step per
    row (R,) or for all (1,): (dx bf16, term float32 or None), or None when unavailable."""
    if (not has("ste") or g.device.type != "cpu"
            or g.dtype != torch.float32 or x.dtype not in (torch.bfloat16, torch.float32)
            or g.dim() != 2 or g.shape != x.shape or not (g.is_contiguous() and x.is_contiguous())):
        return None
    r, c = g.shape
    d = div.reshape(-1).to(torch.float32).contiguous()
    if d.numel() not in (1, r):
        return None
    dx = torch.empty((r, c), dtype=torch.bfloat16)
    term = torch.empty((r, c)) if want_term else torch.empty(0)
    xs = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
    args = (g.reshape(-1).numpy(), xs.reshape(-1).numpy(), x.dtype == torch.bfloat16,
            d.numpy(), d.numel() == r and r != 1, dx.view(torch.int16).reshape(-1).numpy(),
            term.reshape(-1).numpy())
    parallel(lambda lo, hi, p: _mathc.ste(*args, r, c, lo, hi, p), r, grain=16)
    return dx, (term if want_term else None)


def adamw(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
          scalars) -> bool:
    """``open1b_kernels.ops.adamw.adamw_step_cpu_``'s update of contiguous CPU tensors in place -
    bf16 or float32 ``param``, float32 ``grad``, ``m``, ``v`` - by the compiled loop (the
    same float32 operations in the same order); False when the loop is unavailable or a
    layout does not fit (nothing was written). ``scalars``: the step's ``StepScalars``."""
    if (not has("adamw") or param.device.type != "cpu"
            or param.dtype not in (torch.bfloat16, torch.float32)
            or any(t.dtype != torch.float32 or t.device.type != "cpu" for t in (grad, m, v))
            or not all(t.is_contiguous() for t in (param, grad, m, v))
            or not param.numel() == grad.numel() == m.numel() == v.numel()):
        return False
    n = param.numel()
    bf = param.dtype == torch.bfloat16
    args = (flat(param.view(torch.int16) if bf else param), bf, flat(grad), flat(m), flat(v),
            scalars.a, scalars.r2, scalars.decay, scalars.b1, scalars.b2, scalars.c1,
            scalars.c2, scalars.eps, n)
    parallel(lambda lo, hi, p: _mathc.adamw(*args, lo, hi, p), n, grain=PARALLEL_MIN // 4)
    return True


TREE_BLOCK = 4096  # values per block of the compiled tree sum (16 KB: in L1 through its levels)


def tree_rows(x: torch.Tensor) -> torch.Tensor | None:
    """``open1b_kernels.core.reduce.tree_sum_cpu(x, -1)`` of a contiguous float32 (R, N) CPU matrix
    (N >= 1) by the compiled rows - each row zero-padded to the next power of two and summed
    by the same adds in the same order - as (R,); None when the loop is unavailable or
    ``x`` does not fit (the caller sums with torch)."""
    if (not has("tree_rows") or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 2 or not x.is_contiguous() or x.shape[1] < 1):
        return None
    r, n = x.shape
    out = torch.empty(r, dtype=torch.float32)
    src, dst = flat(x), flat(out)
    parallel(lambda lo, hi, p: _mathc.tree_rows(src, dst, r, n, lo, hi, p), r,
             grain=max(1, PARALLEL_MIN // n))
    return out


def tree_sum_1d(x: torch.Tensor) -> torch.Tensor | None:
    """``open1b_kernels.core.reduce.tree_sum_cpu`` of a contiguous float32 CPU vector of at least
    TREE_BLOCK values by the compiled blocks (the tree's first levels inside each aligned
    block), then the same tree over the block partials - the blockable tree of reduce's
    docstring, so the same adds in the same order - as a 0-d tensor; None when the loop is
    unavailable or ``x`` does not fit (the caller sums with torch)."""
    if (not has("tree_blocks") or x.device.type != "cpu" or x.dtype != torch.float32
            or x.dim() != 1 or not x.is_contiguous() or x.numel() < TREE_BLOCK):
        return None
    n = x.numel()
    p = 1 << (n - 1).bit_length()
    partials = torch.empty(p // TREE_BLOCK, dtype=torch.float32)
    src, out = flat(x), flat(partials)
    parallel(lambda lo, hi, k: _mathc.tree_blocks(src, out, n, TREE_BLOCK, lo, hi, k),
             partials.numel(), grain=8)
    while partials.numel() > 1:       # P / B partials: a power of two, summed by the tree
        m = partials.numel()
        b = min(m, TREE_BLOCK)
        nxt = torch.empty(m // b, dtype=torch.float32)
        _mathc.tree_blocks(flat(partials), flat(nxt), m, b, 0, m // b)
        partials = nxt
    return partials.reshape(())
