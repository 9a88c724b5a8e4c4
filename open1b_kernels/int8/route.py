"""The CPU's exact int8 GEMM (``open1b_kernels.int8.gemm``'s CPU path): which route computes it,
the library's integer GEMM checked, the project's own int16-pair GEMM or float32 GEMMs of
the integer values, and the process-wide decision between them (probe, checks, failures,
status).

Every route gives the exact integer product, so the route changes the speed, never the
bits; the comment below says why each is exact and when each is picked.
"""
from __future__ import annotations

import os

import torch

from open1b_kernels.core import mathc
from open1b_kernels.core.mathc import PARALLEL_MIN, Loops, flat, none
from open1b_kernels.core.pieces import parallel, row_pieces
from open1b_kernels.core.workspace import scratch
from open1b_kernels.int8 import amxmm, pairmm
from open1b_kernels.int8.checksum import SlabCheck, checksum_ok

# |a*b| <= 128*128 = 2^14 and MAX_K * 2^14 = 2^31 - 2^14 < 2^31: no int32 overflow.
MAX_K = 131_071


# Exact int8 GEMMs on the CPU have three routes, all giving the exact integer product:
#
# "float": float32 GEMMs of the int8 values: |a * b| <= 128 * 128 = 2^14, so over a
# contraction of at most SGEMM_K = 1,024 every partial sum is an integer of magnitude <= 2^24,
# which float32 holds exactly - whatever order, blocking or fused multiply-add the BLAS
# uses, the result is the exact integer. Longer contractions are cut into SGEMM_K chunks
# whose exact results add in int32 (|total| < 2^31 while K <= MAX_K). Exact by construction
# on any IEEE machine; needs no special case for dimensions of 1.
#
# "int": the library's integer GEMM, ``torch._int_mm`` (int8 x int8 -> int32; oneDNN on
# x86). Integer sums are exact in any order *if* the library computes them in int32 - but
# some x86 paths without VNNI multiply u8 x s8 pairs with vpmaddubsw, whose pair sums
# saturate at int16, and wrong ``_int_mm`` results have been reported on some CPUs. So the
# project never trusts it blindly: ``int_gemm_route`` runs ``probe_int_mm`` (worst-case
# operands at every contraction length class, compared with an exact int64 reference)
# once per process before the route is used, and every "int" result is checked against
# exact row and column sums (``checksum_ok``: O((M + N) K) integer work against the GEMM's
# O(M N K); a weight gradient computed in row slabs against one large b checks each slab's
# rows and all slabs' columns once, ``SlabCheck``, since a column check per slab cost more
# than the VNNI GEMMs themselves). A failed probe or checksum switches the process to the
# "float" route, names the platform and the failing case (``int_gemm_status``), and the
# result is recomputed on the float route: the bits never change, only the speed.
#
# "amx": the project's own AMX tile GEMM (``open1b_kernels.int8.amxmm``): int8 tiles multiplied
# by TDPBSSD into int32 accumulators that add without saturating, so the integer product
# below 2^31 (K <= MAX_K), exact in any order by construction - and checked all the same,
# as the library's GEMM is (the same probe once per process, the same row and column sums
# of every result, a failure recomputed on the float route): it runs on hardware state the
# OS and a hypervisor must save and restore per thread (the tile registers), which no
# construction argument covers. Picked first on CPUs with AMX-INT8 whose OS grants the tile
# state (``amxmm.available``): on the project's 2-core Sapphire Rapids VM the library's
# ``_int_mm`` runs oneDNN's AVX-512 VNNI ``gemm_api`` (ONEDNN_VERBOSE), not its AMX kernels.
#
# "pairs": the project's own compiled GEMM (``open1b_kernels.int8.pairmm``): int8 widened to
# int16 pairs, AVX2's vpmaddwd multiplying 16 of them per instruction into int32 lanes.
# Integer sums below 2^31 (K <= MAX_K): exact in any order, by construction - no library to
# trust, so no probe and no checksum; x86-64 with AVX2 only.
#
# Which route: OPEN1B_INT_GEMM=float|int|pairs|amx|auto (default auto: "amx" where it runs
# and its probe passes; else "int" on CPUs with an int8 dot-product instruction - AVX-512
# VNNI, AVX-VNNI or AMX-INT8 - where it is the faster one, and only if the probe passes;
# else "pairs" where the CPU runs it; else "float"). Measured on the project's 2-core AMD
# EPYC (Zen 3: AVX2, FMA, no AVX-512, no VNNI; torch capability AVX2),
# benchmarks/kernels/int_gemm.py: torch._int_mm is exact there but 13-20x slower than the
# float route at the linear's shapes (the float route runs at 0.75-0.9x of a float32 GEMM);
# the pair GEMM runs them 1.5-1.7x faster than a float32 GEMM. On a 2-core AMD EPYC with
# AVX-512 VNNI (2026-12-02, benchmarks/HISTORY.md) the int route runs the linear's GEMMs 1.3-1.7x
# faster than a float32 GEMM of the same shape.
#
# A contraction of length 1 always takes the float route: torch 2.13's CPU ``_int_mm``
# returns uninitialized memory for K = 1 and N >= 2 (the (1, N) operand's strides are
# (1, 1), and the library misreads them; measured on the AVX-512 VNNI EPYC, caught by the
# checksum in the test suite). It is not a platform fault, so it is not counted as one.
SGEMM_K = 1024
# Longer contractions run as one float32 GEMM where the operands themselves bound every
# partial sum below 2^24 (``float_mm``): a partial sum over any subset of k is at most
# sum_k |a_ik b_jk| <= |a_i| |b_j| (Cauchy-Schwarz), so max_i |a_i| max_j |b_j| < 2^24
# makes every intermediate of any order, blocking or fused multiply-add an exactly held
# integer. Quantized activations and weights meet it at the linears' shapes (codes of RMS
# ~30-40 along 2,048-5,632: |a| |b| ~ 2^21-2^23); worst-case operands (codes at +-127) do
# not, and take the chunks - exact either way, so the bits never depend on which.
ONE_GEMM_BOUND = 1 << 48     # (2^24)^2: compared with exact integer squared norms
INT_GEMM_ENV = "OPEN1B_INT_GEMM"
ROUTES = ("auto", "amx", "int", "pairs", "float")
CHECKED = ("int", "amx")     # the routes whose every result is checked by its sums
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
LOOPS = Loops("open1b_kernels.int8._int8c")    # the float route's operand compiled: _route.c


def _library_int_mm(a: torch.Tensor, b_t: torch.Tensor, out: torch.Tensor | None = None
                     ) -> torch.Tensor:
    """The library's int8 GEMM, a (M, K) @ b_t (K, N) -> int32, into ``out`` (contiguous
    int32 (M, N)) when given: reused memory, where a fresh product of the linear's size
    costs a third of the GEMM in page faults."""
    return torch._int_mm(a, b_t) if out is None else torch._int_mm(a, b_t, out=out)


def _amx_int_mm(a: torch.Tensor, b_t, out: torch.Tensor | None = None) -> torch.Tensor:
    """The AMX tile GEMM with ``_library_int_mm``'s signature (``b_t`` may be a B side
    packed by ``prepare_b``)."""
    return amxmm.amx_mm(a, b_t if isinstance(b_t, amxmm.Packed) else b_t.t(), out)


def _amx_dequant_mm(a: torch.Tensor, b, row_scale: torch.Tensor, col_scale: torch.Tensor,
                    out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The AMX tile GEMM of int8 (M, K) ``a`` and (N, K) ``b`` (or ``b`` packed already)
    dequantized into ``out`` block by block (``amxmm.product_dequant``); returns the int32
    product's (row sums, column sums) for the caller's check (tests replace this)."""
    bp = b if isinstance(b, amxmm.Packed) else amxmm.pack(b, True, "amxmm.b")
    return amxmm.product_dequant(amxmm.pack(a, False, "amxmm.a"), bp, row_scale, col_scale,
                                 out)


def _raw_int_mm(a: torch.Tensor, b_t: torch.Tensor, out: torch.Tensor | None = None
                ) -> torch.Tensor:
    """The checked routes' int8 GEMM, a (M, K) @ b_t (K, N) -> int32 (into ``out`` when
    given): the AMX tile GEMM on "amx", the library's on "int" (tests replace this)."""
    if _Route.route == "amx":
        return _amx_int_mm(a, b_t, out)
    return _library_int_mm(a, b_t, out)


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def platform_name() -> str:
    """CPU model, the VNNI-class flags present and torch's CPU capability (for messages)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    vnni = sorted(cpu_flags() & set(_VNNI_FLAGS)) or ["no VNNI"]
    cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")()
    return f"{model} ({', '.join(vnni)}; torch {torch.__version__} CPU capability {cap})"


def _exact_ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int64 a @ b.T, exact (int64 products and sums)."""
    return torch.mm(a.to(torch.int64), b.to(torch.int64).t())


def _probe_cases():
    """(name, a (M, K), b (N, K)) worst cases for an int8 GEMM: saturating u8 x s8 pair
    sums (127 * 127 pairs once a is shifted to u8), -128 * -128 (the one product of 2^14),
    mixed-sign extremes, alternating signs along k, random extremes, odd shapes, and the
    full contraction lengths: SGEMM_K, a non-multiple of 64, and MAX_K (the largest
    partial sum an int32 accumulator must hold, 2^31 - 2^14)."""
    g = torch.Generator().manual_seed(0x1A7)
    for k in (SGEMM_K, 4_099, MAX_K):
        m = n = 3 if k == MAX_K else 17
        for va, vb in ((-128, -128), (127, 127), (127, -128), (-128, 127), (-128, 1)):
            yield (f"all {va} x all {vb}, K={k}", torch.full((m, k), va, dtype=torch.int8),
                   torch.full((n, k), vb, dtype=torch.int8))
        alt = torch.tensor([127, -128], dtype=torch.int8).repeat(k // 2 + 1)[:k]
        yield (f"alternating 127/-128 x same, K={k}", alt.repeat(m, 1), alt.repeat(n, 1))
        ext = torch.tensor([-128, -127, 127], dtype=torch.int8)
        yield (f"random extremes, K={k}",
               ext[torch.randint(0, 3, (m, k), generator=g)],
               ext[torch.randint(0, 3, (n, k), generator=g)])
    t = torch.randint(-128, 128, (1000, 19), generator=g, dtype=torch.int8)
    yield ("random, transposed a, 19x1000x7", t.t(),
           torch.randint(-128, 128, (7, 1000), generator=g, dtype=torch.int8))
    yield ("random, odd shape 33x1000x65", torch.randint(-128, 128, (33, 1000), generator=g,
                                                          dtype=torch.int8),
           torch.randint(-128, 128, (65, 1000), generator=g, dtype=torch.int8))


def probe_int_mm(mm=None) -> str | None:
    """None if ``mm`` (default: the library's integer GEMM) is exact on every worst case of
    ``_probe_cases``; otherwise the first failing case, with the wrong and exact values."""
    mm = mm or _raw_int_mm
    for name, a, b in _probe_cases():
        want = _exact_ref(a, b)
        try:
            got = mm(a, b.t())
        except (RuntimeError, TypeError, ValueError) as e:
            return f"{name}: raised {type(e).__name__}: {e}"
        if got.shape != want.shape or got.dtype != torch.int32 or not torch.equal(
                got.to(torch.int64), want):
            bad = (got.to(torch.int64) != want).nonzero()
            i, j = (bad[0].tolist() if len(bad) else (0, 0))
            return (f"{name}: [{i}, {j}] = {int(got[i, j])}, exact {int(want[i, j])}"
                    if got.shape == want.shape else f"{name}: shape {tuple(got.shape)}")
    return None


class _Route:
    route: str | None = None        # "amx", "int", "pairs" or "float" once decided
    reason: str = "not decided yet"
    failures: int = 0


def reset_int_gemm_route() -> None:
    """Forget the decision (tests, or after changing OPEN1B_INT_GEMM)."""
    _Route.route, _Route.reason, _Route.failures = None, "not decided yet", 0


def _refuse(why: str) -> None:
    import warnings
    _Route.route = "float"
    _Route.reason = f"integer GEMM not exact on {platform_name()}: {why}; using the float route"
    warnings.warn(_Route.reason, RuntimeWarning, stacklevel=3)


def _amx_decision(want: str) -> bool:
    """Whether the "amx" route is taken (``want`` amx or auto): it runs here and its probe
    passes. A failed probe is reported (and, forced, leaves the float route)."""
    if "amx_int8" not in cpu_flags() or not amxmm.available():
        if want == "amx":
            _Route.route = "float"
            _Route.reason = (f"{INT_GEMM_ENV}=amx: no AMX-INT8 tiles on {platform_name()} (not "
                             "an AMX CPU, the OS does not grant the tile state, or not built)")
        return False
    bad = probe_int_mm(_amx_int_mm)
    if bad is None:
        _Route.route, _Route.reason = "amx", f"{INT_GEMM_ENV}={want}: AMX tiles, probe passed"
        return True
    if want == "amx":
        _refuse(f"the AMX tile GEMM's probe failed - {bad}")
    else:
        import warnings
        warnings.warn(f"the AMX tile GEMM is not exact on {platform_name()}: probe failed - "
                      f"{bad}; trying the other routes", RuntimeWarning, stacklevel=3)
    return False


def int_gemm_route() -> str:
    """"amx", "int", "pairs" or "float" for this process (decided once; see the comment
    above)."""
    if _Route.route is None:
        want = os.environ.get(INT_GEMM_ENV, "auto").lower()
        if want not in ROUTES:
            raise ValueError(f"{INT_GEMM_ENV} must be one of {', '.join(ROUTES)}, got {want!r}")
        if want in ("auto", "amx") and (_amx_decision(want) or want == "amx"):
            return _Route.route
        # a build capped to run as an AVX2 CPU (mathc.cpu_cap) takes that CPU's route too
        vnni = bool(cpu_flags() & set(_VNNI_FLAGS)) and mathc.cpu_cap() >= 2
        if want == "pairs" or (want == "auto" and not vnni):
            if pairmm.available():
                _Route.route = "pairs"
                _Route.reason = (
                    f"{INT_GEMM_ENV}={want}" if want == "pairs" else
                    f"auto: loops built to run as an AVX2 CPU on {platform_name()}"
                    if mathc.cpu_cap() < 2 else
                    f"auto: no VNNI-class instruction, AVX2 on {platform_name()}")
            else:
                _Route.route = "float"
                _Route.reason = (f"{INT_GEMM_ENV}={want}: no AVX2 pair GEMM on "
                                 f"{platform_name()} (not x86-64 with AVX2, or not built)")
        elif want == "float":
            _Route.route, _Route.reason = "float", f"{INT_GEMM_ENV}={want}"
        else:
            bad = probe_int_mm()
            if bad is not None:
                _refuse(f"probe failed - {bad}")
            else:
                _Route.route, _Route.reason = "int", f"{INT_GEMM_ENV}={want}: probe passed"
    return _Route.route


def int_gemm_status() -> dict:
    """The route, why, and how many results failed their checksum (for logs and reports)."""
    return {"route": int_gemm_route(), "reason": _Route.reason, "failures": _Route.failures,
            "platform": platform_name()}


def _sq_max(x32: torch.Tensor) -> int:
    """max over the rows of float32 ``x32`` (integer values) of their exact sums of squares
    (squares <= 2^14 summed in float64, below 2^53: exact); torch's fallback of widen_sq."""
    if not (x32.shape[0] and x32.shape[1]):
        return 0
    return int(x32.square().sum(1, dtype=torch.float64).max())


def _widen_sq_compiled(x: torch.Tensor, out: torch.Tensor, by_rows: bool) -> torch.Tensor | None:
    """``out`` (contiguous float32, ``x``'s shape) = the contiguous int8 (R, C) CPU matrix
    ``x`` widened, in one compiled pass with the exact int64 sums of squares of its rows
    (``by_rows``, (R,)) or of its columns ((C,)), which are returned; None when the loop is
    unavailable or the layouts do not fit (the caller then uses torch)."""
    if (not LOOPS.available() or x.device.type != "cpu" or x.dtype != torch.int8
            or x.dim() != 2 or not x.is_contiguous() or out.dtype != torch.float32
            or out.shape != x.shape or not out.is_contiguous()):
        return None
    r, c = x.shape
    src, y = flat(x), flat(out)
    if by_rows:
        rows = torch.empty(r, dtype=torch.int64)
        rr, empty = rows.numpy(), none(torch.int64)
        parallel(lambda lo, hi, p: LOOPS.widen_sq(src, y, rr, empty, r, c, lo, hi, p), r,
                 grain=max(1, PARALLEL_MIN // max(c, 1)))
        return rows
    empty = none(torch.int64)
    return row_pieces(r, c, (r * c) // PARALLEL_MIN, lambda lo, hi, parts, p: LOOPS.widen_sq(
        src, y, empty, parts, r, c, lo, hi, p))


def _f32(x: torch.Tensor, name: str, norm: bool) -> tuple[torch.Tensor, int | None]:
    """(``x`` (int8) as float32 in the scratch buffer ``name``, and with ``norm`` the largest
    exact sum of squares of its rows). In ``x``'s own layout: a transposed view is widened
    as its storage's rows and returned transposed (the BLAS takes either), so the copy reads
    and writes contiguous rows; the compiled loop takes the sums in the same pass."""
    flip = not (x.stride(-1) == 1 or x.shape[-1] == 1 or x.stride(0) != 1)
    src = x.t() if flip else x
    buf = scratch(name, tuple(src.shape), torch.float32)
    sq = _widen_sq_compiled(src, buf, by_rows=not flip) if norm else None
    if sq is None:
        buf.copy_(src)
    out = buf.t() if flip else buf
    if not norm:
        return out, None
    return out, (int(sq.max()) if sq is not None and sq.numel() else _sq_max(out))


def float_mm(a: torch.Tensor, b: torch.Tensor, part: torch.Tensor) -> torch.Tensor | None:
    """The float route's exact ``a @ b.T`` of int8 (M, K) and (N, K): None when one float32
    GEMM gave it in ``part`` (float32 (M, N), contiguous) - K <= SGEMM_K, or the operands'
    norms below ONE_GEMM_BOUND (the comment above SGEMM_K: every value is then an integer
    below 2^24, which float32 holds); else the int32 product of SGEMM_K chunks, ``part``
    their scratch. The operands are widened once either way."""
    long = a.shape[1] > SGEMM_K
    a32, na = _f32(a, "route.a32", long)
    b32, nb = _f32(b, "route.b32", long)
    if not (long and na * nb >= ONE_GEMM_BOUND):
        torch.mm(a32, b32.t(), out=part)
        return None
    acc = None
    for k0 in range(0, a.shape[1], SGEMM_K):
        torch.mm(a32[:, k0:k0 + SGEMM_K], b32[:, k0:k0 + SGEMM_K].t(), out=part)
        if acc is None:
            acc = part.to(torch.int32)
        else:
            acc.add_(part.to(torch.int32))
    return acc


def _float_int_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    part = scratch("route.part", (a.shape[0], b.shape[0]), torch.float32)
    acc = float_mm(a, b, part)
    if acc is None:
        return part.to(torch.int32) if out is None else out.copy_(part)
    return acc if out is None else out.copy_(acc)


def int_mm_unchecked(a, b, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """int32 ``a @ b.T`` by the checked routes' int8 GEMM (``_raw_int_mm``: the AMX tiles or
    the library's; into ``out``, contiguous int32 (M, N), when given), *not* checked - for a
    caller on a checked route ("int", "amx") that checks the exact row
    and column sums of the whole product itself, once, instead of per block
    (``open1b_kernels.ops.lmhead_int`` through ``lmhead_check``); None where the library
    refuses the layout or shape. On "amx" ``a`` and ``b`` may be packed already
    (``amxmm.pack``, ``amxmm.window``: an operand several products share)."""
    if (a.k if isinstance(a, amxmm.Packed) else a.shape[1]) < 2:   # K = 1: the float route
        return None                                                # (comment above SGEMM_K)
    try:
        return _raw_int_mm(a, b if isinstance(b, amxmm.Packed) else b.t(), out=out)
    except RuntimeError:
        return None


def record_failure(why: str) -> None:
    """A caller's own checksum failed: count it and switch the process to the float route."""
    _Route.failures += 1
    _refuse(why)


def exact_int_mm_cpu(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None,
                     slabs: SlabCheck | None = None) -> torch.Tensor:
    """Exact int32 ``a @ b.T`` of int8 (M, K) and (N, K) on the CPU (K <= MAX_K).

    The process's route (``int_gemm_route``): the library's integer GEMM, checked, the
    pair GEMM, or float32 GEMMs of the int8 values in contraction chunks of SGEMM_K (see
    above); every way the exact integer product. Operands may be row-major or transposed
    views; ``out`` (int32 (M, N), contiguous) receives the result. ``slabs``: this is one
    slab of several sharing ``b``; its rows are checked here and the caller checks the
    columns of all slabs at the end (``SlabCheck``; the pair route needs no check).
    """
    route = int_gemm_route() if a.shape[0] and b.shape[0] and a.shape[1] else "float"
    if route == "pairs":
        return pairmm.pair_mm(a, b, out)
    if a.shape[1] > 1 and route in CHECKED:
        try:
            acc = _raw_int_mm(a, b.t(), out=out)
        except RuntimeError:        # a layout or shape the library refuses: not a fault
            return _float_int_mm(a, b, out)
        if slabs.rows_ok(acc, a) if slabs is not None else checksum_ok(acc, a, b):
            return acc
        _Route.failures += 1
        _refuse(f"checksum failed on a {a.shape[0]}x{a.shape[1]}x{b.shape[0]} GEMM")
    return _float_int_mm(a, b, out)
