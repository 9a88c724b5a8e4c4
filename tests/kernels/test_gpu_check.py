"""scripts/gpu_check.py: clear exit without CUDA; the compile-only PTX scan of every
registered op finds no forbidden instruction; the scan patterns catch what they must."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from open1b_kernels.core.backend import HAVE_TRITON
from open1b_kernels.core.registry import FORBIDDEN, discover

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # hermetic: no shared cache
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=850)  # under pytest-timeout 900 (make test)


@pytest.mark.skipif(torch.cuda.is_available() or not HAVE_TRITON, reason="tests the no-CUDA path")
def test_exits_2_with_a_clear_message_without_cuda(tmp_path):
    proc = run(tmp_path, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--ptx-only" in proc.stderr


def registered_checks() -> list[str]:
    checks, errors = discover(None)
    assert errors == []
    return [c.name for _, c in checks]


# Slow (every op compiled for sm_90: 2.2 min for 32 checks on the idle 2-vCPU VM, 3-5 min for
# 34 at load 3-5) and the only test that can see an approximate instruction: the interpreter
# runs kernels with numpy, so a Triton `/` or `tl.sqrt` gives the same bits there as
# div_rn / sqrt_rn; only the compiled PTX differs.
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton")
def test_every_registered_op_compiles_for_sm90_without_a_forbidden_instruction(tmp_path):
    out = tmp_path / "ptx.json"
    proc = run(tmp_path, "--ptx-only", "--out", str(out))
    assert out.exists(), proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["results"]
    bad = {r["name"]: r.get("error") or r["ptx_forbidden"] for r in rows
           if r.get("error") or r.get("ptx_forbidden")}
    assert bad == {}, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["name"] for r in rows] == registered_checks()
    assert all(r["kernels"] for r in rows), [r["name"] for r in rows if not r["kernels"]]
    by_name = {r["name"]: r["kernels"] for r in rows}
    assert any(k.endswith("_fwd_kernel") for k in by_name["rmsnorm.fwd_bwd"])
    assert any(k.endswith("_tree_sum_cols_kernel") for k in by_name["rmsnorm.fwd_bwd"])  # dgain
    assert any(k.endswith("_adamw_kernel") for k in by_name["adamw.step"])


def test_the_scan_patterns_catch_what_the_contract_forbids():
    bad = ["fma.rn.f32 %r1, %r2, %r3, %r4;", "ex2.approx.f32 %r1, %r2;", "add.ftz.f32 %r1, %r2, %r3;",
           "div.full.f32 %r1, %r2, %r3;", "rsqrt.approx.ftz.f32 %r1, %r2;", "lg2.approx.f32 %r1, %r2;",
           "fma.rn.bf16x2 %r1, %r2, %r3, %r4;"]
    good = ["mad.lo.s32 %r1, %r2, %r3, %r4;", "mul.rn.f32 %r1, %r2, %r3;", "div.rn.f32 %r1, %r2, %r3;",
            "sqrt.rn.f32 %r1, %r2;", "mad.wide.s32 %rd1, %r2, 4, %rd3;"]
    hit = lambda line: any(p.search(line) for p in FORBIDDEN.values())  # noqa: E731
    assert all(hit(b) for b in bad) and not any(hit(g) for g in good)
