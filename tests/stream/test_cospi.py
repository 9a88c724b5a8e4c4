"""The learning rate's cosine (stream/cospi.py) is the correctly rounded binary64 cosine:
exact at the rational values, equal to a 400-bit mpmath reference rounded to nearest, and
every step of the Open-1B schedule is far enough from a rounding midpoint that the
fixed-point error cannot flip a bit; ``Schedule.lr_at`` uses it (``math.cos(math.pi * p)``
differs in the last bit for about half the steps)."""
import math
import random
from fractions import Fraction

import pytest

from open1b_data.stream.cospi import ONE, PI, cos_pi, cos_pi_fixed
from open1b_data.stream.schedule import Schedule, open1b_spec


@pytest.mark.parametrize("p,want", [(0, 1.0), (Fraction(1, 3), 0.5), (Fraction(1, 2), 0.0),
                                    (Fraction(2, 3), -0.5), (1, -1.0)])
def test_exact_values(p, want):
    assert cos_pi(p) == want


def test_bad_argument():
    with pytest.raises(ValueError, match="0 <= p <= 1"):
        cos_pi(Fraction(3, 2))


def test_equals_correctly_rounded_reference():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 400
    assert abs(mpmath.mpf(PI) / ONE - mpmath.pi) < mpmath.mpf(2) ** -195
    rng = random.Random(3)
    for _ in range(3000):
        d = rng.randint(1, 10**12)
        n = rng.randint(0, d)
        want = float(mpmath.cos(mpmath.pi * mpmath.mpf(n) / d))    # rounds to nearest
        assert cos_pi(Fraction(n, d)) == want, (n, d)


def lr_reference(sched: Schedule, t: int, mpmath) -> float:
    s = sched.spec
    final = s.lr_peak * s.lr_final_ratio
    p = min(Fraction(1), Fraction(t - s.warmup_tokens, s.stop_tokens - s.warmup_tokens))
    c = float(mpmath.cos(mpmath.pi * mpmath.mpf(p.numerator) / p.denominator))
    return final + (s.lr_peak - final) * 0.5 * (1.0 + c)


def test_lr_uses_the_portable_cosine():
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.prec = 300
    sched = Schedule(open1b_spec())
    steps = random.Random(4).sample(range(668, sched.last_step + 1), 400)
    libm = 0
    for s in steps:
        info = sched.step(s)
        assert info.lr == lr_reference(sched, info.tokens_after, mpmath), s
        p = (info.tokens_after - sched.spec.warmup_tokens) / (
            sched.spec.stop_tokens - sched.spec.warmup_tokens)
        final = sched.spec.lr_peak * sched.spec.lr_final_ratio
        libm += info.lr != final + (sched.spec.lr_peak - final) * 0.5 * (
            1.0 + math.cos(math.pi * p))
    assert libm > 0          # the old evaluation really gives other bits at some steps


@pytest.mark.slow
def test_open1b_steps_are_clear_of_rounding_midpoints():
    """~80,000 cosines at 200 bits (~5-10 s): the whole error interval of each step's
    fixed-point cosine (+-2^10 units) rounds to one binary64, so cos_pi's rounding is the
    correct one at every step of the Open-1B schedule."""
    sched = Schedule(open1b_spec())
    spec = sched.spec
    span = spec.stop_tokens - spec.warmup_tokens
    steps = 0
    for run in sched.runs:
        for i in range(1, run.steps + 1):
            t = run.tokens_before + i * run.batch * spec.seq_tokens
            if t < spec.warmup_tokens:
                continue
            c = cos_pi_fixed(min(Fraction(1), Fraction(t - spec.warmup_tokens, span)))
            assert (c - 2**10) / ONE == c / ONE == (c + 2**10) / ONE, t
            steps += 1
    assert steps == sched.last_step - 666


@pytest.mark.parametrize("step,bits", [(1, "0x1.6a34ee5e682efp-21"), (667, "0x1.d7dbf487fcb92p-12"),
                                       (1782, "0x1.d7bc7d8d81170p-12"),
                                       (43737, "0x1.fbe3e224cc98ep-13"),
                                       (80957, "0x1.797cc39ffd60fp-15")])
def test_stream_md_lr_vectors(step, bits):
    """The learning-rate test vectors STREAM.md publishes."""
    assert Schedule(open1b_spec()).step(step).lr == float.fromhex(bits)
