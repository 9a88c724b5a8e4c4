"""scripts/gpu_check.py: clear exit without CUDA; the compile-only PTX scan works offline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.backend import HAVE_TRITON

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def run(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")  # hermetic: no shared cache
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.skipif(torch.cuda.is_available() or not HAVE_TRITON, reason="tests the no-CUDA path")
def test_exits_2_with_a_clear_message_without_cuda(tmp_path):
    proc = run(tmp_path, "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr and "--ptx-only" in proc.stderr


@pytest.mark.skipif(not HAVE_TRITON, reason="needs triton")
def test_ptx_only_compiles_for_sm90_and_finds_no_forbidden_instruction(tmp_path):
    out = tmp_path / "ptx.json"
    proc = run(tmp_path, "--ptx-only", "--only", "rmsnorm.fwd_bwd", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = json.loads(out.read_text())["results"]
    assert row["name"] == "rmsnorm.fwd_bwd" and row["ptx_forbidden"] == {}
    assert any(k.endswith("_fwd_kernel") for k in row["kernels"])
    assert any(k.endswith("_tree_sum_cols_kernel") for k in row["kernels"])  # dgain tree


def test_the_scan_patterns_catch_what_the_contract_forbids():
    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_check

    bad = ["fma.rn.f32 %r1, %r2, %r3, %r4;", "ex2.approx.f32 %r1, %r2;", "add.ftz.f32 %r1, %r2, %r3;",
           "div.full.f32 %r1, %r2, %r3;", "rsqrt.approx.ftz.f32 %r1, %r2;", "lg2.approx.f32 %r1, %r2;",
           "fma.rn.bf16x2 %r1, %r2, %r3, %r4;"]
    good = ["mad.lo.s32 %r1, %r2, %r3, %r4;", "mul.rn.f32 %r1, %r2, %r3;", "div.rn.f32 %r1, %r2, %r3;",
            "sqrt.rn.f32 %r1, %r2;", "mad.wide.s32 %rd1, %r2, 4, %rd3;"]
    hit = lambda line: any(p.search(line) for p in gpu_check.FORBIDDEN.values())  # noqa: E731
    assert all(hit(b) for b in bad) and not any(hit(g) for g in good)
