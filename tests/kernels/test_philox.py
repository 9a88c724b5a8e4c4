"""Philox4x32-10: published known answers, layout independence, init distribution."""
import json
import math
from pathlib import Path

import pytest
import torch

from open1b_kernels.hashing import tensorbytes as hashing
from open1b_kernels.ops import philox
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# Random123 kat_vectors (Salmon et al., SC'11): counter, key -> output.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]
SEED = 0x0123456789ABCDEF


@pytest.mark.parametrize("counter,key,expected", KAT)
def test_known_answers(counter, key, expected):
    assert philox.philox4x32_10(torch.tensor(counter), key).tolist() == list(expected)


def test_word_depends_only_on_position():
    whole = philox.random_words_cpu(SEED, 3, 0, 1000)
    assert torch.equal(philox.random_words_cpu(SEED, 3, 123, 77), whole[123:200])
    a = philox.truncated_normal(SEED, 3, (10, 100))
    b = philox.truncated_normal(SEED, 3, (1000,))
    c = philox.truncated_normal(SEED, 3, (500,), offset=500)
    assert torch.equal(a.reshape(-1), b) and torch.equal(b[500:], c)
    assert not torch.equal(philox.random_words_cpu(SEED, 4, 0, 8), whole[:8])
    assert not torch.equal(philox.random_words_cpu(SEED + 1, 3, 0, 8), whole[:8])


def test_counter_layout():
    # position p of stream s is word p % 4 of philox((p//4 lo, p//4 hi, s, 0), (seed lo, hi)).
    p = (5 << 32) + 4 * 9 + 2
    ctr = torch.tensor([(p // 4) & 0xFFFFFFFF, (p // 4) >> 32, 7, 0])
    want = philox.philox4x32_10(ctr, (SEED & 0xFFFFFFFF, SEED >> 32))[2]
    assert philox.random_words_cpu(SEED, 7, p, 1).item() == want.item()


@needs_triton
def test_triton_matches_cpu_bitwise():
    for kind in ("words", "uniform", "normal"):
        out = {}
        for backend in ("cpu", "triton"):
            with force(backend):
                if kind == "words":
                    out[backend] = philox.random_words(SEED, 5, 3, 1001)
                elif kind == "uniform":
                    out[backend] = philox.uniform(SEED, 5, (7, 13), offset=(1 << 33) + 1)
                else:
                    out[backend] = philox.truncated_normal(SEED, 5, (37, 29), std=0.02)
        a, b = out["cpu"], out["triton"]
        assert torch.equal(a.view(torch.int32) if a.is_floating_point() else a,
                           b.view(torch.int32) if b.is_floating_point() else b), kind


def test_uniform_is_open_interval_and_exact_grid():
    u = philox.uniform(SEED, 1, (100_000,))
    assert (u > 0).all() and (u < 1).all()
    k = u.double() * 2**23 - 0.5
    assert torch.equal(k, k.round())


def test_truncated_normal_distribution():
    w = philox.truncated_normal(42, 0, (400_000,), std=0.02).double()
    assert w.abs().max() <= 0.04 * (1 + 2**-23)
    # Moments of N(0, 1) truncated to [-2, 2]: variance 1 - 2*2*phi(2)/(Phi(2)-Phi(-2)).
    phi2 = math.exp(-2.0) / math.sqrt(2 * math.pi)
    mass = math.erf(2 / math.sqrt(2))
    std = 0.02 * math.sqrt(1 - 4 * phi2 / mass)
    assert abs(w.mean().item()) < 5 * std / math.sqrt(w.numel())
    assert abs(w.std().item() / std - 1) < 5e-3
    # Inverse-CDF exactness: the empirical CDF matches the truncated normal's.
    for t in (-0.03, -0.01, 0.0, 0.015):
        z = t / 0.02
        cdf = (math.erf(z / math.sqrt(2)) + mass) / (2 * mass)
        assert abs((w <= t).double().mean().item() - cdf) < 3e-3


def test_bad_ids_are_rejected():
    with pytest.raises(ValueError, match="seed"):
        philox.random_words_cpu(-1, 0, 0, 4)
    with pytest.raises(ValueError, match="stream"):
        philox.random_words_cpu(0, 2**32, 0, 4)


def test_golden_init_digest():
    golden = json.loads((Path(__file__).parents[1] / "assets" / "kernels_k1_golden.json").read_text())
    w = philox.truncated_normal(42, 7, (2, 3000)).to(torch.bfloat16)
    assert hashing.digest({"w": w}) == golden["philox_truncated_normal_seed42_stream7_2x3000"]


# The compiled loops (open1b_kernels/ops/_philox.c) against the torch definition at these ids:
# the edges of every id (largest seed, stream and offset), offsets not aligned to a 4-word
# block, and a count split across threads (each thread starts mid-block) and across the
# truncated normal's 2,048-word passes.
EDGE_IDS = [
    (0, 0, 0, 1), (SEED, 3, 1, 7), (2**64 - 1, 2**32 - 1, 2**62 - 9, 9),
    (SEED, 5, (1 << 33) + 2, 300_001), (0xFFFFFFFF, 1 << 31, 3, 1 << 19)]


@pytest.mark.parametrize("seed,stream,offset,n", EDGE_IDS)
def test_compiled_words_equal_the_definition(seed, stream, offset, n):
    if not philox.LOOPS.available():
        pytest.skip("the C extension is not built")
    fast = philox._words_compiled(seed, stream, offset, n)
    assert fast is not None and torch.equal(fast, philox.random_words_torch(seed, stream,
                                                                            offset, n))


def test_compiled_words_catch_a_changed_round(monkeypatch):
    # the comparison above can fail: a definition with one round fewer differs everywhere
    monkeypatch.setattr(philox, "ROUNDS", 9)
    if not philox.LOOPS.available():
        pytest.skip("the C extension is not built")
    a, b = philox._words_compiled(SEED, 3, 0, 64), philox.random_words_torch(SEED, 3, 0, 64)
    assert not torch.equal(a, b)


def test_chunked_truncated_normal_is_the_whole_tensor_formula(monkeypatch):
    # the CPU path without the compiled loops draws in chunks of CPU_CHUNK; element i
    # depends on position offset + i alone, so a chunk boundary mid-tensor (and mid-block)
    # changes nothing
    monkeypatch.setenv("OPEN1B_MATHC", "0")
    monkeypatch.setattr(philox, "CPU_CHUNK", 1001)
    with force("cpu"):
        got = philox.truncated_normal(SEED, 9, (37, 129), std=0.02, offset=5)
    u = philox.uniform_from_words(philox.random_words_torch(SEED, 9, 5, 37 * 129))
    want = philox.truncnormal_from_uniform(u, float(torch.tensor(0.02, dtype=torch.float32)))
    assert torch.equal(got, want.reshape(37, 129))


def _definition(seed, stream, offset, n, std=0.02):
    u = philox.uniform_from_words(philox.random_words_torch(seed, stream, offset, n))
    return philox.truncnormal_from_uniform(u, float(torch.tensor(std, dtype=torch.float32)))


# The compiled truncated normal (words, uniform, erfinv, clamp and scale in one loop), bit
# for bit, at the same ids.
@pytest.mark.parametrize("seed,stream,offset,n", EDGE_IDS)
def test_compiled_truncated_normal_is_the_definition(seed, stream, offset, n):
    if not philox.LOOPS.available():
        pytest.skip("the C extension is not built")
    with force("cpu"):
        got = philox.truncated_normal(seed, stream, (n,), std=0.02, offset=offset)
    want = _definition(seed, stream, offset, n)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    if n > 1000:                          # the draw reaches out to its +-2 sigma
        assert 0.0399 < float(got.abs().max()) <= 0.04


def test_compiled_truncated_normal_comparison_can_fail():
    # a std one float32 ulp away changes the draw: the loop takes std as given, and the
    # comparison above sees a difference of one ulp
    if not philox.LOOPS.available():
        pytest.skip("the C extension is not built")
    std = float(torch.tensor(0.02, dtype=torch.float32))
    nxt = float(torch.nextafter(torch.tensor(std), torch.tensor(1.0)))
    with force("cpu"):
        got = philox.truncated_normal(SEED, 3, (4096,), std=nxt)
    assert not torch.equal(got, _definition(SEED, 3, 0, 4096))
    assert torch.equal(got, _definition(SEED, 3, 0, 4096, std=nxt))
