"""Counter-based randomness: Philox4x32-10 indexed by (seed, stream, logical position).

Generator: Philox4x32-10 exactly as published (Salmon, Moraes, Dror, Shaw, SC'11;
Random123's known-answer vectors are checked in tests/kernels/test_philox.py): multipliers
0xD2511F53 / 0xCD9E8D57, Weyl key increments 0x9E3779B9 / 0xBB67AE85, 10 rounds.

Stream layout (the contract, independent of tensor shape, launch grid and device):
    key     = (seed mod 2^32, seed >> 32)                 seed in [0, 2^64)
    counter = (b mod 2^32, b >> 32, stream, 0)            b = position // 4
    word    = output word (position mod 4) of philox(counter, key)
so the 32-bit word at ``position`` of ``stream`` depends on (seed, stream, position) only.
A tensor's elements take positions ``offset + flat row-major index``.

Derived values (exact, no transcendental beyond ``open1b_kernels.core.mathfn``):
- uniform(w) = ((w >> 9) + 0.5) * 2^-23 in float32: 2^23 equally spaced values strictly
  inside (0, 1), every step exact (k + 0.5 needs 24 bits for k < 2^23).
- truncated normal, mean 0, std ``std``, truncated at +-2 sigma, by inverse CDF (no
  rejection, so element i needs exactly word i): v = (2u - 1) * erf(sqrt 2) (one rounding;
  2u - 1 is exact), z = sqrt(2) * erfinv(v) (``mathfn.erfinv``), z clamped to [-2, 2],
  w = z * std. All float32, round-to-nearest-even, never fused; callers round to bf16.
"""
from __future__ import annotations

import torch

from open1b_kernels.core.backend import HAVE_TRITON, LAUNCH_OPTIONS, use_triton
from open1b_kernels.core.mathc import Loops
from open1b_kernels.core.pieces import parallel
from open1b_kernels.core.mathfn import erfinv
from open1b_kernels.core.registry import Cost, GpuCheck, scaled

if HAVE_TRITON:
    import triton
    import triton.language as tl

    from open1b_kernels.core.mathfn import erfinv_tl

M0, M1 = 0xD2511F53, 0xCD9E8D57
W0, W1 = 0x9E3779B9, 0xBB67AE85
ROUNDS = 10
MASK32 = 0xFFFFFFFF
TWO_M23 = 1.1920928955078125e-07
ERF_SQRT2 = 0.9544997215270996  # erf(sqrt(2)) rounded to float32: mass within +-2 sigma
SQRT2 = 1.4142135381698608  # sqrt(2) rounded to float32
TRUNC = 2.0  # truncation bound in standard deviations (Open-1B: +-2 sigma)
BLOCK = 1024
CPU_CHUNK = 1 << 22  # elements per chunk of the CPU truncated normal (16 MB of float32)
LOOPS = Loops("open1b_kernels.ops._opsc")    # the words and the normal compiled: _philox.c


def _check_ids(seed: int, stream: int, offset: int = 0) -> None:
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2^64), got {seed}")
    if not 0 <= stream < 2**32:
        raise ValueError(f"stream must be in [0, 2^32), got {stream}")
    if not 0 <= offset < 2**62:
        raise ValueError(f"offset must be in [0, 2^62), got {offset}")


def _mulhilo(m: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of m * b for uint32 values held in int64 (no overflow)."""
    lo_part = m * (b & 0xFFFF)  # < 2^48
    t = m * (b >> 16) + (lo_part >> 16)  # < 2^49: product = t * 2^16 + (lo_part & 0xFFFF)
    return t >> 16, ((t & 0xFFFF) << 16) | (lo_part & 0xFFFF)


def philox4x32_10(counter: torch.Tensor, key: tuple[int, int]) -> torch.Tensor:
    """Philox4x32-10 of int64 ``counter`` (..., 4) holding uint32 words; returns (..., 4)."""
    if counter.shape[-1] != 4 or counter.dtype != torch.int64:
        raise ValueError(f"counter must be int64 (..., 4), got {counter.dtype} {tuple(counter.shape)}")
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key[0] & MASK32, key[1] & MASK32
    for r in range(ROUNDS):
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        if r + 1 < ROUNDS:
            k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return torch.stack([c0, c1, c2, c3], dim=-1)


def random_words_cpu(seed: int, stream: int, offset: int, n: int) -> torch.Tensor:
    """The uint32 words at positions offset .. offset+n-1 (int64 tensor, CPU reference):
    the compiled loop (``_philox.c``) when built (integer arithmetic: the same words,
    ~50x faster), else ``random_words_torch``, the definition."""
    _check_ids(seed, stream, offset)
    fast = _words_compiled(seed, stream, offset, n)
    return fast if fast is not None else random_words_torch(seed, stream, offset, n)


def _words_compiled(seed: int, stream: int, offset: int, n: int) -> torch.Tensor | None:
    """``random_words_cpu`` by the compiled loop (integer arithmetic only: the same words), or
    None when the loop is unavailable."""
    if not LOOPS.available():
        return None
    out = torch.empty((n,), dtype=torch.int64)
    o = out.numpy()
    parallel(lambda lo, hi, p: LOOPS.philox_words(seed, stream, offset, o[lo:hi], lo, hi, p),
             n)
    return out


def random_words_torch(seed: int, stream: int, offset: int, n: int) -> torch.Tensor:
    """``random_words_cpu`` as torch integer operations (the definition the loop follows)."""
    _check_ids(seed, stream, offset)
    first, last = offset // 4, (offset + n + 3) // 4
    blocks = torch.arange(first, last, dtype=torch.int64)
    counter = torch.stack(
        [blocks & MASK32, blocks >> 32, torch.full_like(blocks, stream), torch.zeros_like(blocks)], -1
    )
    words = philox4x32_10(counter, (seed & MASK32, seed >> 32)).reshape(-1)  # (4 * blocks,)
    start = offset - 4 * first
    return words[start:start + n]


def uniform_from_words(w: torch.Tensor) -> torch.Tensor:
    """uint32 words (int64) -> float32 ((w >> 9) + 0.5) * 2^-23, strictly inside (0, 1)."""
    return ((w >> 9).to(torch.float32) + 0.5) * TWO_M23


def truncnormal_from_uniform(u: torch.Tensor, std: float) -> torch.Tensor:
    """float32 uniforms -> truncated normal (+-2 sigma) of standard deviation ``std``."""
    v = (u * 2.0 - 1.0) * ERF_SQRT2
    z = (erfinv(v) * SQRT2).clamp(-TRUNC, TRUNC)
    return z * std


if HAVE_TRITON:

    @triton.jit
    def philox_tl(c0, c1, c2, c3, k0, k1):
        """Philox4x32-10 on uint32 tensors: same words as ``philox4x32_10``."""
        m0 = tl.full(c0.shape, 0xD2511F53, tl.uint32)
        m1 = tl.full(c0.shape, 0xCD9E8D57, tl.uint32)
        w0 = tl.full(c0.shape, 0x9E3779B9, tl.uint32)
        w1 = tl.full(c0.shape, 0xBB67AE85, tl.uint32)
        for r in tl.static_range(10):
            hi0 = tl.umulhi(c0, m0)
            lo0 = c0 * m0
            hi1 = tl.umulhi(c2, m1)
            lo1 = c2 * m1
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
            if r < 9:
                k0 = k0 + w0
                k1 = k1 + w1
        return c0, c1, c2, c3

    @triton.jit
    def word_at_tl(pos, seed_lo, seed_hi, stream):
        """The uint32 word at int64 positions ``pos`` of ``stream`` (one Philox per element)."""
        b = pos // 4
        lane = pos % 4
        c0 = (b & 0xFFFFFFFF).to(tl.uint32)
        c1 = (b >> 32).to(tl.uint32)
        c2 = tl.zeros_like(c0) + stream.to(tl.uint32)
        c3 = tl.zeros_like(c0)
        k0 = tl.zeros_like(c0) + seed_lo.to(tl.uint32)
        k1 = tl.zeros_like(c0) + seed_hi.to(tl.uint32)
        x0, x1, x2, x3 = philox_tl(c0, c1, c2, c3, k0, k1)
        return tl.where(lane == 0, x0, tl.where(lane == 1, x1, tl.where(lane == 2, x2, x3)))

    @triton.jit
    def uniform_tl(w):
        """uint32 words -> float32 in (0, 1): same as ``uniform_from_words``."""
        return ((w >> 9).to(tl.int32).to(tl.float32) + 0.5) * 1.1920928955078125e-07

    @triton.jit
    def _philox_kernel(out_ptr, n, offset, seed_lo, seed_hi, stream, std,
                       KIND: tl.constexpr, BLOCK: tl.constexpr):
        idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = idx < n
        w = word_at_tl(idx + offset, seed_lo, seed_hi, stream)
        if KIND == "words":
            tl.store(out_ptr + idx, w.to(tl.int64), mask=mask)
        else:
            u = uniform_tl(w)
            if KIND == "uniform":
                tl.store(out_ptr + idx, u, mask=mask)
            else:
                v = (u * 2.0 - 1.0) * 0.9544997215270996
                z = erfinv_tl(v) * 1.4142135381698608
                z = tl.minimum(tl.maximum(z, -2.0), 2.0)
                tl.store(out_ptr + idx, z * std, mask=mask)


def _generate(kind: str, seed: int, stream: int, offset: int, out: torch.Tensor, std: float) -> None:
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK),)
    _philox_kernel[grid](out, n, offset, seed & MASK32, seed >> 32, stream, std,
                         KIND=kind, BLOCK=BLOCK, **LAUNCH_OPTIONS)


def random_words(seed: int, stream: int, offset: int, n: int, device="cpu") -> torch.Tensor:
    """uint32 words (as int64) at positions offset .. offset+n-1 of (seed, stream)."""
    _check_ids(seed, stream, offset)
    out = torch.empty(n, dtype=torch.int64, device=device)
    if not use_triton(out):
        return random_words_cpu(seed, stream, offset, n).to(device)
    _generate("words", seed, stream, offset, out, 0.0)
    return out


def uniform(seed: int, stream: int, shape, offset: int = 0, device="cpu") -> torch.Tensor:
    """float32 uniforms in (0, 1) for positions offset + flat index of ``shape``."""
    _check_ids(seed, stream, offset)
    out = torch.empty(shape, dtype=torch.float32, device=device)
    if not use_triton(out):
        return uniform_from_words(random_words_cpu(seed, stream, offset, out.numel())).reshape(shape)
    _generate("uniform", seed, stream, offset, out, 0.0)
    return out


def truncated_normal(seed: int, stream: int, shape, std: float = 0.02, offset: int = 0,
                     device="cpu") -> torch.Tensor:
    """float32 truncated normal (mean 0, ``std``, +-2 sigma): the Open-1B initializer.

    ``std`` is rounded to float32 first; each element i depends on (seed, stream, offset+i).
    """
    _check_ids(seed, stream, offset)
    if not std > 0.0:
        raise ValueError(f"std must be positive, got {std}")
    std32 = float(torch.tensor(std, dtype=torch.float32))
    out = torch.empty(shape, dtype=torch.float32, device=device)
    if not use_triton(out):
        flat = out.reshape(-1)
        if LOOPS.available():           # the compiled loop (_philox.c): the same operations
            o = flat.numpy()
            parallel(lambda lo, hi, p: LOOPS.philox_truncnormal(seed, stream, offset, std32,
                                                                o[lo:hi], lo, hi, p),
                     flat.numel())
            return out
        # element i depends on position offset + i alone, so chunks give the same bits and
        # keep erfinv's temporaries small (a whole embedding at once held ~9 GB)
        for i in range(0, flat.numel(), CPU_CHUNK):
            k = min(CPU_CHUNK, flat.numel() - i)
            u = uniform_from_words(random_words_cpu(seed, stream, offset + i, k))
            flat[i:i + k] = truncnormal_from_uniform(u, std32)
        return out
    _generate("truncnormal", seed, stream, offset, out, std32)
    return out


# ---------------------------------------------------------------- GPU check registry
def _make(scale: float, device):
    # The tensor only carries the device, so moving args moves where the draw runs.
    return (scaled(5_632 * 2_048, scale, 1024), torch.zeros(1, device=device))


GPU_CHECKS = [
    GpuCheck(
        name="philox.truncated_normal",
        make_inputs=_make,
        run=lambda a: (truncated_normal(42, 7, (a[0],), device=a[1].device),),
        torch_baseline=lambda a: (torch.nn.init.trunc_normal_(
            torch.empty(a[0], device=a[1].device), std=0.02, a=-0.04, b=0.04),),
        cost=lambda a: Cost(flops=400 * a[0], bytes=4 * a[0]),
        describe=lambda s: f"[{scaled(5_632 * 2_048, s, 1024)}] fp32 (one FFN weight)",
        bound="compute",
    ),
]
