"""``cos_pi(p)``: cos(pi * p) for an exact rational p in [0, 1], as the binary64 value
nearest to the exact real result - the same bits on every platform.

Why not ``math.cos(math.pi * p)``: it rounds pi and the product before the cosine, and
``math.cos`` is the platform's libm, which is not correctly rounded everywhere, so the
learning rate of a step (``schedule.py``) could differ in its last bit between the machine
that trained and the one that replays.

Algorithm (integers only): with ``F = 2^200``, ``PI = floor(pi * F)`` (Machin's formula in
fixed point); reduce p to q in [0, 1/4] with ``cos(pi p) = -cos(pi (1 - p))`` for p > 1/2
and ``cos(pi p) = sin(pi (1/2 - p))`` for p > 1/4; ``x = floor(PI * q)``; sum the Taylor
series of cos or sin at x in fixed point until a term is 0; round ``sum / F`` to the nearest
binary64 (Python's int division is correctly rounded). The absolute error before that
rounding is below ``2^-190``, so the result is the correctly rounded cosine unless the true
value lies within ``2^-190`` of a midpoint between two binary64 values (never exactly on
one: by Niven's theorem cos(pi p) is irrational except 0, +-1/2, +-1). The Open-1B
schedule's steps are checked to be clear of that (tests/stream/test_cospi.py).
"""
from __future__ import annotations

from fractions import Fraction

BITS = 200
ONE = 1 << BITS


def _atan_inv(n: int, one: int) -> int:
    """floor-ish atan(1/n) * one by its alternating series (error a few units)."""
    term = one // n
    total, k, n2 = term, 1, n * n
    while term:
        term //= n2
        k += 2
        total += -(term // k) if k % 4 == 3 else term // k
    return total


PI = (16 * _atan_inv(5, ONE << 16) - 4 * _atan_inv(239, ONE << 16)) >> 16   # 16 guard bits


def _series(x: int, first: int, start: int) -> int:
    """sum_k (-1)^k x^(2k+start) / (2k+start)! in fixed point, ``first`` = x^start/start!."""
    x2 = x * x // ONE
    term, total, k = first, first, start
    while term:
        term = term * x2 // (ONE * (k + 1) * (k + 2))
        k += 2
        total += -term if (k - start) % 4 == 2 else term
    return total


def cos_pi_fixed(p: Fraction) -> int:
    """cos(pi * p) * 2^200 for 0 <= p <= 1, within 2^10 (i.e. 2^-190 absolute)."""
    p = Fraction(p)
    if not 0 <= p <= 1:
        raise ValueError(f"cos_pi needs 0 <= p <= 1, got {p}")
    sign = 1
    if p > Fraction(1, 2):
        p, sign = 1 - p, -1
    if p > Fraction(1, 4):
        x = PI * (Fraction(1, 2) - p)
        x = x.numerator // x.denominator
        return sign * _series(x, x, 1)
    x = PI * p
    return sign * _series(x.numerator // x.denominator, ONE, 0)


def cos_pi(p: Fraction) -> float:
    """cos(pi * p), 0 <= p <= 1, correctly rounded to binary64 (module docstring)."""
    return cos_pi_fixed(p) / ONE
