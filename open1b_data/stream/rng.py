"""The stream's random numbers: a counter-based generator, unbiased bounded integers and
keyed permutations, all defined here exactly (STREAM.md restates them for re-implementers).

Contract:
- ``derive_key(purpose, seed, source, epoch, shard)`` -> uint64: the first 8 bytes
  (little-endian) of SHA-256 over a canonical byte string (below). Never Python's ``hash()``.
- ``rand64(key, ctr)``: draw ``ctr`` of the stream ``key`` is the SplitMix64 output function
  applied to ``key + GAMMA * (ctr + 1) mod 2^64``. It is a pure function of (key, ctr), so
  draw i is computed without generating draws 0..i-1, and ``rand64(key, 0..n-1)`` is exactly
  the first n outputs of a standard SplitMix64 seeded with ``key`` (test vector in STREAM.md).
- ``bounded(key, ctr, n)``: unbiased integer in [0, n) by modulo with rejection: attempt a
  uses counter ``a * 2^48 + ctr`` and is accepted iff ``x < 2^64 - (2^64 mod n)``; the value
  is ``x mod n``. Counters must stay below 2^48 (2.8e14 draws).
- ``feistel_permute(key, x, n)`` / ``feistel_invert``: a keyed bijection of [0, n): a
  6-round Feistel network on ``b = max(2, bitlength(n - 1))`` bits (so the domain is < 2n),
  split into a left part of ``b - b//2`` bits and a right part of ``b//2`` bits, each round
  ``(L, R) -> (R, L ^ (rand64(key, r * 2^32 + R) mod 2^width(L)))`` (the widths swap each
  round), made a bijection of [0, n) by cycle walking. O(1) per element, so any position of a
  permutation is found without computing the rest of it.

All functions take and return numpy arrays (uint64 / int64); uint64 arithmetic wraps mod
2^64 by design (numpy does not warn for array operations). Pure-Python reference versions
(``*_ref``) exist for the tests and for readers.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np

GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MASK64 = (1 << 64) - 1
ATTEMPT_STRIDE = 1 << 48   # bounded(): counter of attempt a is a * 2^48 + ctr
ROUND_STRIDE = 1 << 32     # feistel: counter of round r on half-value R is r * 2^32 + R
FEISTEL_ROUNDS = 6
KEY_DOMAIN = b"open1b-stream/v1"

_G = np.uint64(GAMMA)
_M1 = np.uint64(MIX1)
_M2 = np.uint64(MIX2)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def source_hash(name: str) -> bytes:
    """H(source): SHA-256 of the UTF-8 source name (32 bytes)."""
    return hashlib.sha256(name.encode("utf-8")).digest()


def derive_key(purpose: str, seed: int, source: str = "", epoch: int = 0, shard: int = 0) -> int:
    """The 64-bit key of one random stream.

    Canonical bytes: ``b"open1b-stream/v1" 0x00 purpose(UTF-8) 0x00 seed(u64 LE)
    SHA-256(source name)(32 bytes) epoch(u64 LE) shard(u64 LE)``; key = first 8 bytes of
    SHA-256 of that, read little-endian. The mix stream uses source "" and epoch = shard = 0.
    """
    for name, v in (("seed", seed), ("epoch", epoch), ("shard", shard)):
        if not 0 <= v < 2**64:
            raise ValueError(f"derive_key: {name} must be in [0, 2^64), got {v!r}")
    data = (KEY_DOMAIN + b"\x00" + purpose.encode("utf-8") + b"\x00" + struct.pack("<Q", seed)
            + source_hash(source) + struct.pack("<QQ", epoch, shard))
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


# --------------------------------------------------------------------------- reference (int)

def fmix_ref(z: int) -> int:
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def rand64_ref(key: int, ctr: int) -> int:
    return fmix_ref((key + GAMMA * (ctr + 1)) & MASK64)


def bounded_ref(key: int, ctr: int, n: int) -> int:
    limit = (1 << 64) - ((1 << 64) % n)
    attempt = 0
    while True:
        x = rand64_ref(key, attempt * ATTEMPT_STRIDE + ctr)
        if x < limit:
            return x % n
        attempt += 1


def feistel_widths(n: int) -> tuple[int, int]:
    """(left, right) bit widths of the Feistel domain 2^b, b = max(2, bitlength(n - 1)), used
    for a permutation of [0, n): right = b // 2, left = b - right (so 2^b < 2n)."""
    b = max(2, (n - 1).bit_length())
    return b - b // 2, b // 2


def feistel_permute_ref(key: int, x: int, n: int) -> int:
    wl0, wr0 = feistel_widths(n)
    while True:
        left, right, wl, wr = x >> wr0, x & ((1 << wr0) - 1), wl0, wr0
        for r in range(FEISTEL_ROUNDS):
            f = rand64_ref(key, r * ROUND_STRIDE + right) & ((1 << wl) - 1)
            left, right, wl, wr = right, left ^ f, wr, wl
        x = (left << wr) | right
        if x < n:
            return x


# --------------------------------------------------------------------------- numpy (vectorized)

def _u64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.uint64)


def fmix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def rand64(key: int, ctr) -> np.ndarray:
    """Draws ``ctr`` (array of counters) of stream ``key``, as uint64."""
    c = _u64(ctr) + np.uint64(1)
    return fmix(np.uint64(key & MASK64) + _G * c)


def rand64_range(key: int, start: int, count: int) -> np.ndarray:
    """``rand64(key, start .. start+count-1)`` without materializing the counters twice."""
    c = np.arange(count, dtype=np.uint64)
    c += np.uint64(start + 1)
    return fmix(np.uint64(key & MASK64) + _G * c)


def bounded(key: int, ctr, n: int) -> np.ndarray:
    """Unbiased integers in [0, n) for the counters ``ctr`` (modulo with rejection)."""
    if not 1 <= n < 2**63:
        raise ValueError(f"bounded: n must be in [1, 2^63), got {n!r}")
    ctr = _u64(ctr)
    x = rand64(key, ctr)
    if n & (n - 1) == 0:   # a power of two divides 2^64: nothing to reject
        return x & np.uint64(n - 1)
    limit = np.uint64((1 << 64) - ((1 << 64) % n))
    bad = np.flatnonzero(x >= limit)
    attempt = 1
    while bad.size:   # probability < n / 2^64 per draw: almost never entered
        y = rand64(key, ctr[bad] + np.uint64(attempt * ATTEMPT_STRIDE))
        ok = y < limit
        x[bad[ok]] = y[ok]
        bad = bad[~ok]
        attempt += 1
    return x % np.uint64(n)


def bounded_range(key: int, start: int, count: int, n: int) -> np.ndarray:
    return bounded(key, np.arange(start, start + count, dtype=np.uint64), n)


def _feistel_rounds(key: int, x: np.ndarray, widths: tuple[int, int], inverse: bool
                    ) -> np.ndarray:
    """One pass of the (possibly unbalanced) network. Each round maps (L, R) of widths
    (wl, wr) to (R, L ^ (F_r(R) mod 2^wl)) of widths (wr, wl); an even round count brings
    the widths back, so input and output split alike."""
    wl, wr = widths
    left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
    k = np.uint64(key & MASK64)
    if inverse:
        for r in range(FEISTEL_ROUNDS - 1, -1, -1):   # state widths are (wl, wr) here
            # before round r: (L0, R0) of widths (wr, wl); L = R0, R = L0 ^ F(R0)
            f = fmix(k + _G * (left + np.uint64(r * ROUND_STRIDE + 1)))
            left, right = right ^ (f & np.uint64((1 << wr) - 1)), left
            wl, wr = wr, wl
    else:
        for r in range(FEISTEL_ROUNDS):
            f = fmix(k + _G * (right + np.uint64(r * ROUND_STRIDE + 1)))
            left, right = right, left ^ (f & np.uint64((1 << wl) - 1))
            wl, wr = wr, wl
    return (left << np.uint64(wr)) | right


def _cycle_walk(key: int, x: np.ndarray, n: int, inverse: bool) -> np.ndarray:
    widths = feistel_widths(n)
    y = _feistel_rounds(key, x, widths, inverse)
    nn = np.uint64(n)
    todo = np.flatnonzero(y >= nn)
    while todo.size:
        z = _feistel_rounds(key, y[todo], widths, inverse)
        y[todo] = z
        todo = todo[z >= nn]
    return y


def feistel_permute(key: int, x, n: int) -> np.ndarray:
    """pi_key(x) for x in [0, n): position x of the permutation (int64 array)."""
    x = _u64(x)
    if n <= 0:
        if x.size:
            raise ValueError(f"feistel_permute: empty domain n={n} with {x.size} inputs")
        return x.astype(np.int64)
    return _cycle_walk(key, x, n, inverse=False).astype(np.int64)


def feistel_invert(key: int, y, n: int) -> np.ndarray:
    """pi_key^-1(y): the position holding element y (int64 array)."""
    y = _u64(y)
    if n <= 0:
        return y.astype(np.int64)
    return _cycle_walk(key, y, n, inverse=True).astype(np.int64)


def permutation(key: int, n: int) -> np.ndarray:
    """The whole permutation ``[pi(0), ..., pi(n-1)]`` (int64)."""
    return feistel_permute(key, np.arange(n, dtype=np.uint64), n)
