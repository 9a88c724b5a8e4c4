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


NO_SPILL = {"_fwd_kernel", "_bwd_kernel", "_block_tree_kernel", "_scale_kernel", "_dw_kernel",
            "_dq_kernel", "_weight_codes_kernel", "_tree_sum_rows_kernel",
            "_tree_sum_cols_kernel"}


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
    # the redesigned kernels keep everything in registers (no stack frame: a spill to
    # local memory is what made RMSNorm's forward 28x slower than torch on the H200)
    res = {k: v for r in rows for k, v in r["resources"].items()}
    if any(v is not None for v in res.values()):       # cuobjdump ships with Triton
        spilled = {k: v["stack_bytes"] for k, v in res.items()
                   if k.rsplit(".", 1)[-1] in NO_SPILL and v["stack_bytes"]}
        assert spilled == {}
        assert NO_SPILL <= {k.rsplit(".", 1)[-1] for k in res}


def test_the_scan_patterns_catch_what_the_contract_forbids():
    bad = ["fma.rn.f32 %r1, %r2, %r3, %r4;", "ex2.approx.f32 %r1, %r2;", "add.ftz.f32 %r1, %r2, %r3;",
           "div.full.f32 %r1, %r2, %r3;", "rsqrt.approx.ftz.f32 %r1, %r2;", "lg2.approx.f32 %r1, %r2;",
           "fma.rn.bf16x2 %r1, %r2, %r3, %r4;"]
    good = ["mad.lo.s32 %r1, %r2, %r3, %r4;", "mul.rn.f32 %r1, %r2, %r3;", "div.rn.f32 %r1, %r2, %r3;",
            "sqrt.rn.f32 %r1, %r2;", "mad.wide.s32 %rd1, %r2, 4, %rd3;"]
    hit = lambda line: any(p.search(line) for p in FORBIDDEN.values())  # noqa: E731
    assert all(hit(b) for b in bad) and not any(hit(g) for g in good)


# ------------------------------------------------------------------ the plan and its budget
def _scripts():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
        import gpu_plan
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return gpu_check, gpu_plan


def test_the_plan_puts_the_unmeasured_and_the_headline_figures_first():
    _, plan = _scripts()
    names = registered_checks()
    keys = [s.key for s in plan.make_plan(names, ("parity", "golden", "collectives", "speed"),
                                          True, True, plan.previous_seconds())]
    assert keys[:3] == ["ceilings", "attention.fwd_bwd_causal", "train:speed"]
    assert keys[3:3 + len(plan.GOAL_OPS)] == list(plan.GOAL_OPS)
    assert keys[3 + len(plan.GOAL_OPS)] == "train:golden"
    assert keys[-2:] == ["train:parity", "train:collectives"]
    assert sorted(k for k in keys if ":" not in k and k != "ceilings") == sorted(names)
    fitted = plan.fit(plan.make_plan(names, ("speed", "golden"), True, True,
                                     plan.previous_seconds()), 480.0)
    running = [s for s, what in fitted if what == "run"]
    # the default budget holds the causal check, the step and every goal op
    assert {"attention.fwd_bwd_causal", "train:speed", *plan.GOAL_OPS} <= {s.key for s in running}
    assert sum(s.estimate_s for s in running) <= 480.0


def test_dry_run_prints_the_plan_without_a_gpu(tmp_path):
    proc = run(tmp_path, "--dry-run", "--budget-s", "100")
    assert proc.returncode == 0, proc.stderr
    assert "plan for a budget of 100 s" in proc.stdout
    assert "attention.fwd_bwd_causal" in proc.stdout and "over budget" in proc.stdout


def _fake_plan(monkeypatch, gpu_check, durations: dict[str, float]):
    """gpu_check's sections replaced by sleeps of the given seconds."""
    import time as _time

    def op(module, check, *a):
        _time.sleep(durations[check.name])
        return {"name": check.name, "module": module, "mismatched": [0], "ptx_forbidden": {}}

    def train(sections, out, payload, mixes):
        _time.sleep(durations["train:" + sections[0]])
        payload.setdefault("train", {})[sections[0]] = {"equal": True}
        return True

    monkeypatch.setattr(gpu_check, "run_check", op)
    monkeypatch.setattr(gpu_check, "train_checks", train)
    monkeypatch.setattr(gpu_check.gpu_device, "ceilings", lambda: {"copy_gbps": 1.0})


class _Check:
    def __init__(self, name):
        self.name = name


def test_sections_over_budget_are_skipped_and_an_overrun_is_cut(tmp_path, monkeypatch):
    gpu_check, plan = _scripts()
    _fake_plan(monkeypatch, gpu_check, {"a.x": 0.0, "b.y": 3.0, "c.z": 0.0, "train:golden": 0.0})
    sections = [plan.Section("ceilings", "ceilings", 0.1), plan.Section("op", "a.x", 0.1),
                plan.Section("op", "c.z", 50.0), plan.Section("op", "b.y", 0.1),
                plan.Section("train", "golden", 0.1)]
    checks = {n: ("m", _Check(n)) for n in ("a.x", "b.y", "c.z")}
    out = tmp_path / "r.json"
    payload = {"meta": {}, "results": []}
    ok = gpu_check.run_plan(plan.fit(sections, 2.0), checks, payload, out, 2.0, 1, True, True,
                            None)
    written = json.loads(out.read_text())
    assert not ok                                          # a cut run is not a pass
    assert [r["name"] for r in written["results"]] == ["a.x"]
    assert written["ceilings"] == {"copy_gbps": 1.0}
    assert [(s["section"], s["why"][:4]) for s in written["not_run"]] == [
        ("c.z", "over"), ("b.y", "cut:")]                  # b.y overran what was left
    assert "train" not in written                          # nothing runs after a cut
    # the rerun resumes: only what the first run did not hold
    assert plan.done_keys(written) == {"ceilings", "a.x"}
    _fake_plan(monkeypatch, gpu_check, {"a.x": 0.0, "b.y": 0.0, "c.z": 0.0, "train:golden": 0.0})
    payload = {"meta": {}, "results": written["results"]}
    fitted = plan.fit(sections, 100.0, plan.done_keys(written))
    assert [w for _, w in fitted] == ["done", "done", "run", "run", "run"]
    assert gpu_check.run_plan(fitted, checks, payload, out, 100.0, 1, True, True, None)
    assert [r["name"] for r in json.loads(out.read_text())["results"]] == ["a.x", "c.z", "b.y"]


def test_resume_refuses_what_is_not_a_full_run(tmp_path):
    for text, why in (("nope", "is not a gpu_check JSON"),
                      ('{"mode": "ptx-only"}', "not the JSON of a full gpu_check run")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        proc = run(tmp_path, "--dry-run", "--resume", str(bad))
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
