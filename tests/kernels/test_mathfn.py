"""mathfn: CPU reference == Triton (interpreter) bit for bit; accuracy against float64."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from open1b_kernels.hashing import tensorbytes as hashing
from open1b_kernels.core import mathfn
from open1b_kernels.ops import philox
from open1b_kernels.core.backend import force
from tests.kernels.support import needs_triton, same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow inside the interpreter

SPECIALS = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), float("nan"), 1e-45, -1e-45,
            1e-40, 1.17549435e-38, 3.4028235e38, -3.4028235e38, 88.72, 88.73, -103.9, -104.1,
            0.5, 0.999, -0.999, 0.9999999, 8192.0, 65536.0, 65537.0, 1e-30]


def inputs(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(3000, generator=g) * torch.exp(torch.randn(3000, generator=g) * 8)
    domain = {
        "exp": torch.randn(3000, generator=g) * 40,
        "log": torch.exp(torch.rand(3000, generator=g) * 190 - 100),
        "sigmoid": torch.randn(3000, generator=g) * 30,
        "silu": torch.randn(3000, generator=g) * 30,
        "erfinv": torch.rand(3000, generator=g) * 2 - 1,
        "sincos": (torch.rand(3000, generator=g) * 2 - 1) * 9000,
    }[name]
    sub = torch.randint(1, 1 << 23, (200,), generator=g, dtype=torch.int32).view(torch.float32)
    return torch.cat([domain, wide, sub, -sub, torch.tensor(SPECIALS)])[:7001]  # odd length


@needs_triton
@pytest.mark.parametrize("name", mathfn.FUNCTIONS)
def test_triton_matches_cpu_bitwise(name):
    x = inputs(name)
    with force("cpu"):
        ref = mathfn.apply(name, x)
    with force("triton"):
        got = mathfn.apply(name, x)
    for r, o in zip(ref, got):
        assert same_bits(r, o), f"{name}: {(r.view(torch.int32) != o.view(torch.int32)).sum()} differ"


@needs_triton
def test_bf16_rounding_is_nearest_even_on_ties():
    import triton
    import triton.language as tl

    @triton.jit
    def k(x_ptr, y_ptr, N: tl.constexpr):
        o = tl.arange(0, N)
        tl.store(y_ptr + o, mathfn.to_bf16_tl(tl.load(x_ptr + o)))

    g = torch.Generator().manual_seed(2)
    ties = (torch.randint(-2**15, 2**15, (1024,), generator=g, dtype=torch.int32) * 65536 + 32768)
    ties = ties.view(torch.float32)
    ties = torch.where(torch.isnan(ties), 1.0, ties)  # NaN payloads are outside the contract
    x = torch.cat([ties, torch.randn(512, generator=g) * 1e-39,  # subnormals
                   torch.tensor([3.4028235e38, -3.39e38, float("inf"), -0.0] * 128)])  # 2048
    y = torch.empty(x.numel(), dtype=torch.bfloat16)
    k[(1,)](x, y, N=x.numel())
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))


def test_nan_is_canonical_and_limits():
    nan = torch.tensor([float("nan")])
    for name in ("exp", "log", "sigmoid", "silu", "erfinv", "sincos"):
        for y in mathfn.apply(name, nan):
            assert y.view(torch.int32).item() == mathfn.NAN_BITS
    got = mathfn.exp(torch.tensor([0.0, float("-inf"), float("inf"), -104.5])).tolist()
    assert got == [1.0, 0.0, float("inf"), 0.0]
    assert mathfn.log(torch.tensor([1.0, 0.0, float("inf")])).tolist() == [0.0, float("-inf"), float("inf")]
    assert torch.isnan(mathfn.log(torch.tensor([-1.0]))).all()
    assert mathfn.silu(torch.tensor([float("-inf")])).view(torch.int32).item() == -2**31  # -0.0
    assert mathfn.erfinv(torch.tensor([1.0, -1.0])).tolist() == [float("inf"), float("-inf")]


def test_cody_waite_products_are_exact():
    n = np.arange(-(1 << 16), 1 << 16, dtype=np.float64)
    for c in (mathfn.P1, mathfn.P2):
        assert np.array_equal((n.astype(np.float32) * np.float32(c)).astype(np.float64), n * c)
    k = np.arange(-151, 129, dtype=np.float64)
    assert np.array_equal((k.astype(np.float32) * np.float32(mathfn.LN2_HI)).astype(np.float64),
                          k * mathfn.LN2_HI)


def max_ulps(y: torch.Tensor, ref: torch.Tensor) -> float:
    spacing = np.spacing(np.abs(ref.to(torch.float32).numpy())).astype(np.float64)
    return float(((y.double() - ref).abs().numpy() / spacing).max())


def test_accuracy_against_float64():
    """Max error vs float64, printed (pytest -s) and bounded (CONTRACT.md section 3)."""
    measured = {}
    x = torch.linspace(-87, 88, 400_001)
    measured["exp ulp"] = max_ulps(mathfn.exp(x), torch.exp(x.double()))
    x = torch.logspace(-44, 38, 400_001, dtype=torch.float64).float()
    x = x[x > 0]
    measured["log ulp"] = max_ulps(mathfn.log(x), torch.log(x.double()))
    x = torch.linspace(-8192, 8192, 800_001)
    s, c = mathfn.sincos(x)
    measured["sin abs"] = float((s.double() - torch.sin(x.double())).abs().max())
    measured["cos abs"] = float((c.double() - torch.cos(x.double())).abs().max())
    x = torch.linspace(-80, 80, 400_001)
    r = torch.sigmoid(x.double())
    measured["sigmoid rel"] = float(((mathfn.sigmoid(x).double() - r).abs() / r).max())
    r = torch.nn.functional.silu(x.double())
    measured["silu rel"] = float(((mathfn.silu(x).double() - r).abs() / r.abs().clamp_min(1e-300)).max())
    x = torch.linspace(-0.999, 0.999, 400_001)
    r = torch.erfinv(x.double())
    measured["erfinv rel"] = float(((mathfn.erfinv(x).double() - r).abs() / r.abs().clamp_min(1e-30)).max())
    print("mathfn accuracy vs float64:", {k: f"{v:.3g}" for k, v in measured.items()})
    bounds = {"exp ulp": 1.5, "log ulp": 1.0, "sin abs": 1e-7, "cos abs": 1e-7,
              "sigmoid rel": 2.5e-7, "silu rel": 2.5e-7, "erfinv rel": 4e-7}
    assert all(measured[k] <= bounds[k] for k in bounds), (measured, bounds)


def test_subnormal_inputs_and_outputs_are_kept():
    tiny = torch.tensor([1e-45, 1e-40, 5e-39])
    ref = torch.log(tiny.double())
    assert max_ulps(mathfn.log(tiny), ref) <= 1.0
    y = mathfn.exp(torch.tensor([-100.0, -103.0]))  # subnormal results, not flushed
    assert (y > 0).all() and (y < 1.17549435e-38).all()
    assert ((y.double() - torch.exp(torch.tensor([-100.0, -103.0], dtype=torch.float64))).abs()
            <= 2 * 1.4e-45).all()


def test_golden_digest_pins_the_arithmetic():
    golden = json.loads((Path(__file__).parents[1] / "assets" / "kernels_k1_golden.json").read_text())
    u = philox.uniform(2026, 1, (4096,))  # our own RNG: stable across torch versions
    x = (u - 0.5) * 200.0
    s, c = mathfn.sincos(x * 40)
    got = hashing.digest({"exp": mathfn.exp(x * 0.5), "log": mathfn.log(u * 1e3), "sin": s,
                          "cos": c, "silu": mathfn.silu(x), "erfinv": mathfn.erfinv(u * 2 - 1)})
    assert got == golden["mathfn_on_philox_grid"]


def test_chunked_evaluation_is_bit_identical():
    x = (philox.uniform(7, 2, (3, 50_001)) - 0.5) * 300.0  # > CPU_CHUNK: several chunks
    assert torch.equal(mathfn.exp(x).view(torch.int32), mathfn._exp(x).view(torch.int32))
    s, c = mathfn.sincos(x)
    s1, c1 = mathfn._sincos(x)
    assert torch.equal(s.view(torch.int32), s1.view(torch.int32))
    assert torch.equal(c.view(torch.int32), c1.view(torch.int32))
