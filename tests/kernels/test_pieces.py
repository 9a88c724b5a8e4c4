"""The compiled loops' pieces (open1b_kernels/core/_pieces.h): the same bits however a loop's range
is cut - one piece, pieces on torch's OpenMP threads, pieces on open1b_kernels.core.pieces' own
pool - and the OpenMP team is torch's runtime, not a second one."""
from __future__ import annotations

import dataclasses
import os
import re

import pytest
import torch

from open1b_kernels.core import mathc, pieces
from open1b_kernels.int8 import checksum, gemm, quantize
from open1b_kernels.ops import rmsnorm, swiglu

pytestmark = pytest.mark.skipif(not mathc.available(), reason="compiled loops not built")

# (torch threads, OPEN1B_MATHC_OMP): one piece; three pieces on torch's OpenMP team; three
# pieces as three calls on the module's pool
REGIMES = [(1, "1"), (3, "1"), (3, "0")]


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes (NaN payloads and signed zeros compared too)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def _battery() -> dict[str, torch.Tensor]:
    """Every compiled loop at least once, at shapes that split into several pieces: the
    micro model's forward and backward (norms, SwiGLU, the W8A8 linears' rotations, codes,
    dequantization and STE, attention's tile loops, the LM head's slices, level sums and
    checks, the loss) plus the loops the model does not reach on its own."""
    from open1b_kernels.core import mathfn
    from open1b_kernels.core.reduce import tree_sum_cpu
    from open1b_kernels.int8.hadamard import hadamard_dim0_cpu_
    from open1b_kernels.ops.philox import random_words_cpu
    from open1b_train.config import micro
    from open1b_train.model import forward_backward
    from open1b_train.params import init_params

    cfg = dataclasses.replace(micro().model, vocab=512)
    params = init_params(cfg, 7)
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(0, cfg.vocab, (3, 97), generator=g)
    loss, per_seq, grads = forward_backward(cfg, params, ids[:, :-1], ids[:, 1:])
    out = {"loss": loss, "per_seq": per_seq}
    out.update({f"grad.{k}": v for k, v in grads.items()})
    # the micro model's rows are too few for these loops to split: their own calls, sized
    # for three pieces
    x = torch.randn(3 * mathc.PARALLEL_MIN + 5, generator=g) * 20
    out["exp"], out["log"] = mathfn.exp(x), mathfn.log(x.abs())
    out["philox"] = random_words_cpu(5, 2, 3, 1_000_003)
    y = torch.randn(256, 777, generator=g)
    hadamard_dim0_cpu_(y, 64)
    out["hadamard"] = y
    out["bf16_rne"] = gemm._bf16_rne_compiled(x)
    out["tree_sum"] = tree_sum_cpu(x, 0)
    m = torch.randn(1025, 800, generator=g) * 3
    step = torch.rand(1025, generator=g) * 0.1 + 0.01
    out["quant"] = quantize._quantize_compiled(m.bfloat16(), step)
    div = torch.rand(800, generator=g) * 0.05 + 0.01
    for transposed in (False, True):
        codes = torch.empty((800, 1025) if transposed else (1025, 800), dtype=torch.int8)
        assert quantize._codes_compiled(m, div, True, codes, transposed)
        out[f"codes.{transposed}"] = codes
    acc = torch.randint(-2**31, 2**31 - 1, (1025, 800), generator=g, dtype=torch.int64)
    acc = acc.to(torch.int32)
    out["int_sums.rows"], out["int_sums.cols"] = checksum._sums_compiled(acc)
    deq = torch.empty((1025, 800), dtype=torch.bfloat16)
    out["dequant.rows"], out["dequant.cols"] = gemm._dequant_compiled(acc, step, div, deq, sums=True)
    out["dequant"] = deq
    deq32 = torch.empty((1025, 800))
    assert gemm._dequant_compiled(acc, step, div, deq32, sums=False) == ()
    out["dequant.fp32"] = deq32
    h = (torch.randn(3075, 64, generator=g) * 2).bfloat16()
    gain = torch.rand(64, generator=g) + 0.5
    out["rms"], rstd = rmsnorm._rms_fwd_compiled(h, gain, 1 / 64, 1e-5)
    out["rms.rstd"] = rstd
    out["rms.dx"] = rmsnorm._rms_bwd_compiled(h, h, gain, rstd, 1 / 64, None)
    gu = (torch.randn(2050, 128, generator=g) * 3).bfloat16()
    out["swiglu"] = swiglu._swiglu_compiled(gu)
    out["swiglu.dh"] = swiglu._swiglu_compiled(gu, gu[:, :64].contiguous())
    src = (torch.randn(800, 1030, generator=g)).bfloat16()       # (Q, P): read transposed
    yt = torch.empty(1088, 800)
    cmax, cmin = torch.full((800,), -float("inf")), torch.full((800,), float("inf"))
    assert quantize._rotate_cols_compiled(1, src, None, 1030, yt, 64, 0.125, cmax, cmin, 256, 64)
    out["widen_t"], out["widen_t.max"], out["widen_t.min"] = yt, cmax, cmin
    return out


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_every_loop_gives_the_same_bits_however_it_is_cut(threads, monkeypatch):
    got = {}
    for n, omp in REGIMES:
        torch.set_num_threads(n)
        monkeypatch.setenv("OPEN1B_MATHC_OMP", omp)
        got[(n, omp)] = _battery()
    base = got[REGIMES[0]]
    for regime in REGIMES[1:]:
        assert got[regime].keys() == base.keys()
        for name, t in base.items():
            assert torch.equal(_bits(got[regime][name]), _bits(t)), (regime, name)


def test_the_team_is_torchs_openmp_runtime():
    """Built with OpenMP, the loops run on torch's own OpenMP threads: one runtime loaded
    in the process (a second one would be a second set of threads competing for the cores)
    and the team in use. Built without it, the pool does the work and team() says so."""
    if not mathc.Loops("open1b_kernels.core._corec").openmp():
        assert not pieces.team()
        return
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("torch's intra-op threads are not OpenMP threads in this build")
    with open("/proc/self/maps", encoding="utf-8") as f:
        runtimes = {os.path.realpath(p) for p in re.findall(
            r"(/\S*/lib(?:gomp|iomp5|omp)[^/\s]*\.so[^/\s]*)$", f.read(), re.M)}
    assert len(runtimes) == 1, runtimes
    assert pieces.team()


def test_team_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("OPEN1B_MATHC_OMP", "0")
    assert not pieces.team()


def test_a_loop_takes_more_pieces_than_units_and_refuses_a_bad_count():
    """More pieces than rows leaves the extra pieces empty (the same result); a piece count
    below 1 or past the bound, or partial sums sized for another count, is an error that
    names the loop - nothing is written."""
    lib = checksum.LOOPS

    g = torch.Generator().manual_seed(2)
    a = torch.randint(-128, 128, (5, 40), generator=g, dtype=torch.int64).to(torch.int8)
    v = torch.randint(-1000, 1000, (40,), generator=g, dtype=torch.int64)
    want = (a.to(torch.int64) * v).sum(1)
    for count in (1, 2, 5, 64):
        out = torch.zeros(5, dtype=torch.int64)
        lib.mv_int8(a.numpy().reshape(-1), v.numpy(), out.numpy(), 5, 40, False, 0, 5, count)
        assert torch.equal(out, want)
    for bad in (0, -1, 1 << 20):
        out = torch.zeros(5, dtype=torch.int64)
        with pytest.raises(ValueError, match="mv_int8"):
            lib.mv_int8(a.numpy().reshape(-1), v.numpy(), out.numpy(), 5, 40, False, 0, 5, bad)
        assert not out.any()
    parts = torch.zeros((3, 40), dtype=torch.int64)          # three pieces' column sums
    rows = torch.zeros(5, dtype=torch.int64)
    with pytest.raises(ValueError, match="int_sums"):
        lib.int_sums(a.numpy().reshape(-1), True, rows.numpy(), parts.reshape(-1).numpy(),
                     5, 40, 0, 5, 2)
    lib.int_sums(a.numpy().reshape(-1), True, rows.numpy(), parts.reshape(-1).numpy(),
                 5, 40, 0, 5, 3)
    assert torch.equal(parts.sum(0), a.to(torch.int64).sum(0))
    assert torch.equal(rows, a.to(torch.int64).sum(1))
