"""Portable float32 transcendentals: the runtime's own exp, log, sin/cos, sigmoid, SiLU
and erfinv, identical bit for bit on the CPU and in Triton.

Each function exists twice with the same algorithm, step for step: a torch CPU function
(``exp``, ``log``, ...) built only from exactly specified operations (IEEE binary32
add/sub/mul/div, round-to-nearest-even, as separate ops; comparisons, selects, int32 bit
operations and exact float<->int conversions of integral values), and a ``@triton.jit``
device function (``exp_tl``, ``log_tl``, ...) written with the same operations in the
same order (``tl.div_rn``; kernels launched with ``enable_fp_fusion=False`` so no
multiply-add is contracted). Constants are float32-exact values (no double rounding).

Algorithms (all steps float32 unless said otherwise):
- exp: clamp x to [-104, 89]; k = rint(x*log2e) by the 1.5*2^23 add/sub trick;
  r = (x - k*LN2_HI) - k*LN2_LO (LN2_HI has 9 significant bits, so k*LN2_HI is exact);
  exp(r) = ((r*r)*q + r) + 1 with q the degree-5 Horner of Taylor terms 1/2..1/5040;
  scaled by 2^k as two exact power-of-two multiplies 2^(k>>1) * 2^(k-(k>>1)) built from
  int32 bits, so subnormal results round once, in the last multiply.
- log: subnormals pre-scaled by 2^25; x = m * 2^e with m in (sqrt(1/2), sqrt(2)] from the
  bits; f = m - 1 (exact); s = f/(2+f); log(1+f) = f - (hfsq - s*(hfsq + R)), hfsq =
  (0.5*f)*f, R = z*(2/3 + z*(2/5 + z*(2/7 + z*(2/9 + z*2/11)))), z = s*s; the result
  e*LN2_HI - ((hfsq - (s*(hfsq+R) + e*LN2_LO)) - f).
- sincos: n = rint(x*2/pi); r = ((x - n*P1) - n*P2) - n*P3 (P1, P2 have 8 and 7
  significant bits: exact products for |n| < 2^16); sin r and cos r by Taylor polynomials
  through r^9 and r^10; the quadrant n & 3 picks +-sin r / +-cos r. Accuracy is stated for
  |x| <= 8192 (RoPE needs <= 4096); |x| > 65536 gives NaN (outside the contract).
- sigmoid(x) = 1 / (1 + exp(-x)); silu(x) = x / (1 + exp(-x)) (one rounding fewer than
  x * sigmoid(x)); silu(-inf) = -0.0.
- erfinv (Giles' single-precision approximation, both branches): w = -log((1-x)*(1+x));
  w < 5: Horner in w - 2.5; else Horner in sqrt(w) - 3 (sqrt correctly rounded); times x.

Policies: IEEE subnormals are kept in and out (no flush-to-zero). NaN in -> the canonical
quiet NaN (0x7fc00000) out, so payloads cannot differ between x86 and the GPU. Infinities:
exp(-inf) = 0, exp(inf) = inf, log(0) = -inf, log(inf) = inf, log(x < 0) = NaN,
sin/cos(+-inf) = NaN, erfinv(+-1) = +-inf, erfinv(|x| > 1) = NaN.

Measured accuracy against float64 (asserted in tests/kernels/test_mathfn.py): see
CONTRACT.md for the table. The CPU functions evaluate in cache-sized chunks
(``map_chunks``; elementwise, so the bits cannot change).

The exact bf16 <-> fp32 conversions (``widen_tl``, ``cast_tl``, ``to_bf16_tl``) and
``sqrt_rn`` are open1b_kernels/core/rounding.py's, re-exported here. This file is near 500 lines
because each function exists twice, CPU and Triton, side by side so the two can be read
line by line.
"""
from __future__ import annotations

import torch

from open1b_kernels.core import mathc
from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.registry import Cost, GpuCheck, scaled, seeded_generator
from open1b_kernels.core.rounding import sqrt_rn

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.rounding import cast_tl, to_bf16_tl, widen_tl  # noqa: F401 (re-exported)

LOOPS = mathc.Loops("open1b_kernels.core._corec")    # exp, log, erfinv compiled: _mathfn.c

# --- constants: every value is exactly representable in float32 ------------------------
RND = 12582912.0  # 1.5 * 2^23: (t + RND) - RND rounds t to the nearest integer, ties even
LOG2E = 1.4426950216293335
LN2_HI = 0.693359375  # 355/512: k * LN2_HI is exact for |k| < 2^15
LN2_LO = -0.00021219444170128554
EXP_LO, EXP_HI = -104.0, 89.0  # exp(-104) rounds to 0, exp(89) overflows
E2, E3, E4, E5, E6, E7 = (0.5, 0.1666666716337204, 0.0416666679084301,
                          0.008333333767950535, 0.0013888889225199819, 0.00019841270113829523)
TWO_M126 = 1.1754943508222875e-38  # smallest normal float32
TWO_P25 = 33554432.0
L1, L2, L3, L4, L5 = (0.6666666865348816, 0.4000000059604645, 0.2857142984867096,
                      0.2222222238779068, 0.1818181872367859)
TWO_OVER_PI = 0.6366197466850281
P1, P2, P3 = 1.5703125, 0.000484466552734375, -6.397578431460715e-07
SINCOS_MAX = 65536.0
S3, S5, S7, S9 = (-0.1666666716337204, 0.008333333767950535, -0.00019841270113829523,
                  2.7557318844628753e-06)
C4, C6, C8, C10 = (0.0416666679084301, -0.0013888889225199819, 2.4801587642286904e-05,
                   -2.755731998149713e-07)
# Giles, "Approximating the erfinv function" (GPU Computing Gems), single precision, the
# published decimals rounded to float32: central branch (w < 5) and tail branch.
EI_C = (2.810226362726098e-08, 3.432739390518691e-07, -3.523387704262859e-06,
        -4.391506536194356e-06, 0.00021858086984138936, -0.001253725029528141,
        -0.004177681636065245, 0.24664072692394257, 1.5014094114303589)
EI_T = (-0.0002002142573473975, 0.0001009505576803349, 0.0013493432197719812,
        -0.003673428436741233, 0.005739507731050253, -0.007622461300343275,
        0.00943887047469616, 1.0016740560531616, 2.832976818084717)
NAN_BITS = 0x7FC00000

if HAVE_TRITON:
    # @triton.jit code may read a module global only when it is a tl.constexpr, so each
    # float constant above has a mirror <NAME>_K with the same (float32-exact) value.
    (RND_K, LOG2E_K, LN2_HI_K, LN2_LO_K, EXP_LO_K, EXP_HI_K, E2_K, E3_K, E4_K, E5_K, E6_K,
     E7_K, TWO_M126_K, TWO_P25_K, L1_K, L2_K, L3_K, L4_K, L5_K, TWO_OVER_PI_K, P1_K, P2_K,
     P3_K, SINCOS_MAX_K, S3_K, S5_K, S7_K, S9_K, C4_K, C6_K, C8_K, C10_K, NAN_BITS_K) = (
        tl.constexpr(v) for v in (
            RND, LOG2E, LN2_HI, LN2_LO, EXP_LO, EXP_HI, E2, E3, E4, E5, E6, E7, TWO_M126,
            TWO_P25, L1, L2, L3, L4, L5, TWO_OVER_PI, P1, P2, P3, SINCOS_MAX, S3, S5, S7, S9,
            C4, C6, C8, C10, NAN_BITS))
    EI_C0_K, EI_C1_K, EI_C2_K, EI_C3_K, EI_C4_K, EI_C5_K, EI_C6_K, EI_C7_K, EI_C8_K = (
        tl.constexpr(v) for v in EI_C)
    EI_T0_K, EI_T1_K, EI_T2_K, EI_T3_K, EI_T4_K, EI_T5_K, EI_T6_K, EI_T7_K, EI_T8_K = (
        tl.constexpr(v) for v in EI_T)


def _f32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.float32:
        raise TypeError(f"mathfn functions take float32 tensors, got {t.dtype}; convert first")
    return t


def _canon_nan(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.where(x != x, torch.tensor(NAN_BITS, dtype=torch.int32).view(torch.float32), y)


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2^k as float32 from int32 k in [-126, 127] (exact, by building the exponent bits)."""
    return ((k + 127) << 23).view(torch.float32)


CPU_CHUNK = 1 << 16  # elements per chunk: 256 KiB temporaries stay in L2, and at >= 2 x torch's
# 32,768-element grain both threads share each op (at 2^14 the chunks ran on one core)


def map_chunks(fn, *xs: torch.Tensor, chunk: int = CPU_CHUNK):
    """``fn(*xs)`` evaluated over flat chunks of same-shaped CPU tensors.

    Only for elementwise ``fn`` (each output element depends on the same-index input
    elements alone), so chunking cannot change a bit; it keeps the dozens of temporaries
    of a polynomial evaluation in cache instead of allocating full-size tensors, which
    makes the CPU reference several times faster. ``fn`` returns a tensor or a tuple.
    """
    shape = xs[0].shape
    if any(x.shape != shape for x in xs):
        raise ValueError(f"map_chunks needs same-shaped inputs, got {[tuple(x.shape) for x in xs]}")
    n = xs[0].numel()
    if n <= chunk:
        return fn(*xs)
    flats = [x.reshape(-1) for x in xs]
    first = fn(*(f[:chunk] for f in flats))
    single = isinstance(first, torch.Tensor)
    first = (first,) if single else first
    outs = [torch.empty(n, dtype=t.dtype) for t in first]
    for o, t in zip(outs, first):
        o[:chunk] = t
    for start in range(chunk, n, chunk):
        part = fn(*(f[start:start + chunk] for f in flats))
        for o, t in zip(outs, (part,) if single else part):
            o[start:start + chunk] = t
    outs = [o.reshape(shape) for o in outs]
    return outs[0] if single else tuple(outs)


def _exp(x: torch.Tensor) -> torch.Tensor:
    """One chunk of ``exp``: the algorithm, step for step as ``exp_tl``."""
    _f32(x)
    xs = torch.where(x != x, 0.0, x).clamp(EXP_LO, EXP_HI)
    t = xs * LOG2E
    kf = (t + RND) - RND
    r = xs - kf * LN2_HI
    r = r - kf * LN2_LO
    q = r * E7 + E6
    q = q * r + E5
    q = q * r + E4
    q = q * r + E3
    q = q * r + E2
    y = (r * r) * q + r
    y = y + 1.0
    k = kf.to(torch.int32)
    k1 = k >> 1
    y = (y * _pow2(k1)) * _pow2(k - k1)
    return _canon_nan(x, y)


def _log(x: torch.Tensor) -> torch.Tensor:
    """One chunk of ``log``: the algorithm, step for step as ``log_tl``."""
    _f32(x)
    ok = (x > 0.0) & (x < float("inf"))
    xs = torch.where(ok, x, 1.0)
    sub = xs < TWO_M126
    xs = torch.where(sub, xs * TWO_P25, xs)
    bits = xs.view(torch.int32)
    e = (bits >> 23) - 127 - torch.where(sub, 25, 0).to(torch.int32)
    mbits = bits & 0x7FFFFF
    big = mbits > 0x3504F3
    m = (mbits | torch.where(big, 126 << 23, 127 << 23).to(torch.int32)).view(torch.float32)
    e = e + big.to(torch.int32)
    f = m - 1.0
    s = f / (f + 2.0)
    z = s * s
    q = z * L5 + L4
    q = q * z + L3
    q = q * z + L2
    q = q * z + L1
    big_r = q * z
    hfsq = (f * 0.5) * f
    ef = e.to(torch.float32)
    y = s * (hfsq + big_r) + ef * LN2_LO
    y = ef * LN2_HI - ((hfsq - y) - f)
    y = torch.where(x == 0.0, float("-inf"), y)
    y = torch.where(x == float("inf"), float("inf"), y)
    y = torch.where(x < 0.0, float("nan"), y)
    return _canon_nan(torch.where(x < 0.0, float("nan"), x), y)


def _sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of ``sincos``: the algorithm, step for step as ``sincos_tl``."""
    _f32(x)
    bad = ~(x.abs() <= SINCOS_MAX)  # NaN, inf and out-of-domain
    xs = torch.where(bad, 0.0, x)
    t = xs * TWO_OVER_PI
    nf = (t + RND) - RND
    r = xs - nf * P1
    r = r - nf * P2
    r = r - nf * P3
    z = r * r
    q = z * S9 + S7
    q = q * z + S5
    q = q * z + S3
    s = (r * z) * q + r
    q = z * C10 + C8
    q = q * z + C6
    q = q * z + C4
    c = (z * z) * q - z * 0.5
    c = c + 1.0
    quad = nf.to(torch.int32) & 3
    sin = torch.where(quad == 0, s, torch.where(quad == 1, c, torch.where(quad == 2, -s, -c)))
    cos = torch.where(quad == 0, c, torch.where(quad == 1, -s, torch.where(quad == 2, -c, s)))
    nan = torch.tensor(NAN_BITS, dtype=torch.int32).view(torch.float32)
    return torch.where(bad, nan, sin), torch.where(bad, nan, cos)


def _sigmoid(x: torch.Tensor) -> torch.Tensor:
    """One chunk of ``sigmoid``: the algorithm, step for step as ``sigmoid_tl``."""
    return _canon_nan(x, torch.ones_like(x) / (_exp(-x) + 1.0))


def _silu(x: torch.Tensor) -> torch.Tensor:
    """One chunk of ``silu``: the algorithm, step for step as ``silu_tl``."""
    y = x / (_exp(-x) + 1.0)
    return _canon_nan(x, torch.where(x == float("-inf"), -0.0, y))


def _erfinv(x: torch.Tensor) -> torch.Tensor:
    """One chunk of ``erfinv``: the algorithm, step for step as ``erfinv_tl``."""
    _f32(x)
    w = -_log((1.0 - x) * (x + 1.0))
    wc = w - 2.5
    p = torch.full_like(x, EI_C[0])
    for c in EI_C[1:]:
        p = p * wc + c
    wt = sqrt_rn(torch.where(w < 5.0, 5.0, w)) - 3.0
    pt = torch.full_like(x, EI_T[0])
    for c in EI_T[1:]:
        pt = pt * wt + c
    y = torch.where(w < 5.0, p, pt) * x
    y = torch.where(x.abs() == 1.0, x * float("inf"), y)
    y = torch.where(x.abs() > 1.0, float("nan"), y)
    return _canon_nan(x, y)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x (float32, CPU reference; same bits as ``exp_tl``). The compiled loop
    (open1b_kernels/core/_mathfn.c) when it is built (same operations, same bits), else ``_exp``."""
    out = mathc.unary(LOOPS, "exp", _f32(x))
    return out if out is not None else map_chunks(_exp, x)


def log(x: torch.Tensor) -> torch.Tensor:
    """Natural log (float32, CPU reference; same bits as ``log_tl``); compiled as ``exp``."""
    out = mathc.unary(LOOPS, "log", _f32(x))
    return out if out is not None else map_chunks(_log, x)


def sincos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin x, cos x) (float32, CPU reference; same bits as ``sincos_tl``)."""
    return map_chunks(_sincos, _f32(x))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)) (float32, CPU reference; same bits as ``sigmoid_tl``)."""
    return map_chunks(_sigmoid, _f32(x))


def silu(x: torch.Tensor) -> torch.Tensor:
    """x / (1 + exp(-x)), silu(-inf) = -0.0 (CPU reference; same bits as ``silu_tl``)."""
    return map_chunks(_silu, _f32(x))


def erfinv(x: torch.Tensor) -> torch.Tensor:
    """Giles' float32 inverse error function (same bits as ``erfinv_tl``); compiled as ``exp``."""
    out = mathc.unary(LOOPS, "erfinv", _f32(x))
    return out if out is not None else map_chunks(_erfinv, x)


if HAVE_TRITON:

    @triton.jit
    def _canon_nan_tl(x, y):
        return tl.where(x != x, tl.full(y.shape, NAN_BITS_K, tl.int32).to(tl.float32, bitcast=True), y)

    @triton.jit
    def _pow2_tl(k):
        return ((k + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def exp_tl(x):
        """e^x: same algorithm and bits as ``mathfn.exp``."""
        xs = tl.where(x != x, 0.0, x)
        xs = tl.minimum(tl.maximum(xs, EXP_LO_K), EXP_HI_K)
        t = xs * LOG2E_K
        kf = (t + RND_K) - RND_K
        r = xs - kf * LN2_HI_K
        r = r - kf * LN2_LO_K
        q = r * E7_K + E6_K
        q = q * r + E5_K
        q = q * r + E4_K
        q = q * r + E3_K
        q = q * r + E2_K
        y = (r * r) * q + r
        y = y + 1.0
        k = kf.to(tl.int32)
        k1 = k >> 1
        y = (y * _pow2_tl(k1)) * _pow2_tl(k - k1)
        return _canon_nan_tl(x, y)

    @triton.jit
    def log_tl(x):
        """Natural log: same algorithm and bits as ``mathfn.log``."""
        ok = (x > 0.0) & (x < float("inf"))
        xs = tl.where(ok, x, 1.0)
        sub = xs < TWO_M126_K
        xs = tl.where(sub, xs * TWO_P25_K, xs)
        bits = xs.to(tl.int32, bitcast=True)
        e = (bits >> 23) - 127 - tl.where(sub, 25, 0)
        mbits = bits & 0x7FFFFF
        big = mbits > 0x3504F3
        m = (mbits | tl.where(big, 126 << 23, 127 << 23)).to(tl.float32, bitcast=True)
        e = e + big.to(tl.int32)
        f = m - 1.0
        s = tl.div_rn(f, f + 2.0)
        z = s * s
        q = z * L5_K + L4_K
        q = q * z + L3_K
        q = q * z + L2_K
        q = q * z + L1_K
        big_r = q * z
        hfsq = (f * 0.5) * f
        ef = e.to(tl.float32)
        y = s * (hfsq + big_r) + ef * LN2_LO_K
        y = ef * LN2_HI_K - ((hfsq - y) - f)
        y = tl.where(x == 0.0, float("-inf"), y)
        y = tl.where(x == float("inf"), float("inf"), y)
        y = tl.where(x < 0.0, float("nan"), y)
        return _canon_nan_tl(tl.where(x < 0.0, float("nan"), x), y)

    @triton.jit
    def sincos_tl(x):
        """(sin x, cos x): same algorithm and bits as ``mathfn.sincos``."""
        bad = ~(tl.abs(x) <= SINCOS_MAX_K)
        xs = tl.where(bad, 0.0, x)
        t = xs * TWO_OVER_PI_K
        nf = (t + RND_K) - RND_K
        r = xs - nf * P1_K
        r = r - nf * P2_K
        r = r - nf * P3_K
        z = r * r
        q = z * S9_K + S7_K
        q = q * z + S5_K
        q = q * z + S3_K
        s = (r * z) * q + r
        q = z * C10_K + C8_K
        q = q * z + C6_K
        q = q * z + C4_K
        c = (z * z) * q - z * 0.5
        c = c + 1.0
        quad = nf.to(tl.int32) & 3
        sin = tl.where(quad == 0, s, tl.where(quad == 1, c, tl.where(quad == 2, -s, -c)))
        cos = tl.where(quad == 0, c, tl.where(quad == 1, -s, tl.where(quad == 2, -c, s)))
        nan = tl.full(x.shape, NAN_BITS_K, tl.int32).to(tl.float32, bitcast=True)
        return tl.where(bad, nan, sin), tl.where(bad, nan, cos)

    @triton.jit
    def sigmoid_tl(x):
        """1 / (1 + exp(-x)): same bits as ``mathfn.sigmoid``."""
        return _canon_nan_tl(x, tl.div_rn(tl.full(x.shape, 1.0, tl.float32), exp_tl(-x) + 1.0))

    @triton.jit
    def silu_tl(x):
        """x / (1 + exp(-x)): same bits as ``mathfn.silu``."""
        y = tl.div_rn(x, exp_tl(-x) + 1.0)
        return _canon_nan_tl(x, tl.where(x == float("-inf"), -0.0, y))

    @triton.jit
    def erfinv_tl(x):
        """Giles' float32 erfinv: same bits as ``mathfn.erfinv``."""
        w = -log_tl((1.0 - x) * (x + 1.0))
        wc = w - 2.5
        p = tl.full(x.shape, EI_C0_K, tl.float32)
        p = p * wc + EI_C1_K
        p = p * wc + EI_C2_K
        p = p * wc + EI_C3_K
        p = p * wc + EI_C4_K
        p = p * wc + EI_C5_K
        p = p * wc + EI_C6_K
        p = p * wc + EI_C7_K
        p = p * wc + EI_C8_K
        wt = tl.sqrt_rn(tl.where(w < 5.0, 5.0, w)) - 3.0
        pt = tl.full(x.shape, EI_T0_K, tl.float32)
        pt = pt * wt + EI_T1_K
        pt = pt * wt + EI_T2_K
        pt = pt * wt + EI_T3_K
        pt = pt * wt + EI_T4_K
        pt = pt * wt + EI_T5_K
        pt = pt * wt + EI_T6_K
        pt = pt * wt + EI_T7_K
        pt = pt * wt + EI_T8_K
        y = tl.where(w < 5.0, p, pt) * x
        y = tl.where(tl.abs(x) == 1.0, x * float("inf"), y)
        y = tl.where(tl.abs(x) > 1.0, float("nan"), y)
        return _canon_nan_tl(x, y)

    @triton.jit
    def _apply_kernel(x_ptr, out_ptr, out2_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=1.0)
        if FN == "exp":
            y = exp_tl(x)
        elif FN == "log":
            y = log_tl(x)
        elif FN == "sigmoid":
            y = sigmoid_tl(x)
        elif FN == "silu":
            y = silu_tl(x)
        elif FN == "erfinv":
            y = erfinv_tl(x)
        else:
            y, y2 = sincos_tl(x)
            tl.store(out2_ptr + offs, y2, mask=mask)
        tl.store(out_ptr + offs, y, mask=mask)


FUNCTIONS = ("exp", "log", "sigmoid", "silu", "erfinv", "sincos")
_CPU = {"exp": exp, "log": log, "sigmoid": sigmoid, "silu": silu, "erfinv": erfinv}
APPLY_BLOCK = 1024


def apply(name: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Elementwise ``name`` of float32 ``x`` through the dispatcher (Triton on CUDA).

    Returns a 1-tuple, or (sin, cos) for ``"sincos"``. Ops call the device functions
    directly; this entry point exists for tests and the GPU check.
    """
    if name not in FUNCTIONS:
        raise ValueError(f"unknown mathfn {name!r}; choose one of {FUNCTIONS}")
    _f32(x)
    if not use_triton(x):
        return sincos(x) if name == "sincos" else (_CPU[name](x),)
    xc = x.contiguous()
    out, out2 = torch.empty_like(xc), torch.empty_like(xc)
    n = xc.numel()
    grid = (triton.cdiv(n, APPLY_BLOCK),)
    _apply_kernel[grid](xc, out, out2, n, FN=name, BLOCK=APPLY_BLOCK, **LAUNCH_OPTIONS)
    return (out, out2) if name == "sincos" else (out,)


_TORCH_BASELINE = {"exp": torch.exp, "log": torch.log, "sigmoid": torch.sigmoid,
                   "silu": torch.nn.functional.silu, "erfinv": torch.erfinv}


def _check(name: str) -> GpuCheck:
    def make(scale: float, device):
        g = seeded_generator(7)
        n = scaled(16_384 * 2_048, scale, 1024)
        if name in ("log",):
            x = torch.rand(n, generator=g) * 100.0
        elif name == "erfinv":
            x = torch.rand(n, generator=g) * 2.0 - 1.0
        elif name == "sincos":
            x = torch.rand(n, generator=g) * 4096.0
        else:
            x = torch.randn(n, generator=g) * 8.0
        return (x.to(device),)

    def baseline(a):
        if name == "sincos":
            return (torch.sin(a[0]), torch.cos(a[0]))
        return (_TORCH_BASELINE[name](a[0]),)

    outs = 2 if name == "sincos" else 1
    return GpuCheck(
        name=f"mathfn.{name}",
        make_inputs=make,
        run=lambda a: apply(name, a[0]),
        torch_baseline=baseline,
        cost=lambda a: Cost(flops=30 * a[0].numel(), bytes=4 * a[0].numel() * (1 + outs)),
        describe=lambda s: f"fp32 [{scaled(16_384 * 2_048, s, 1024)}]",
    )


GPU_CHECKS = [_check(n) for n in FUNCTIONS]
