"""The cheap part of the portability matrix (docs/PORTABILITY.md), on every push: a prefix
of the golden micro trajectory under other thread counts, ATen CPU dispatch levels and the
C math extension on and off, each in its own process (``scripts/portability_check.py
--inside``), must give the golden lines; a process that flushes subnormals is refused
naming the setting; and the negative control - the math extension compiled with FMA
contraction - must be seen to differ, so the check is known to detect a difference."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from open1b_audit.selftest import trajectory as tj

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 6

VARIANTS = {   # name -> (environment, arguments): every value of each axis at least once
    "1 thread, ATen default, extension on": ({"ATEN_CPU_CAPABILITY": "default"},
                                             ["--threads", "1"]),
    "2 threads, ATen avx2, extension off": ({"ATEN_CPU_CAPABILITY": "avx2",
                                             "OPEN1B_MATHC": "0"}, ["--threads", "2"]),
    "3 threads, extension off, matmul precision medium": (
        {"OPEN1B_MATHC": "0"}, ["--threads", "3", "--matmul-precision", "medium"]),
}


def inside(mix: str, work: str, env: dict, args: list[str], steps: int = STEPS,
           root: str = ROOT) -> dict:
    e = dict(os.environ, PYTHONPATH=root, **env)
    e.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, os.path.join(root, "scripts", "portability_check.py"),
                        "--inside", "--trajectory", "micro", "--steps",
                        str(steps), "--mix", mix, "--work", work, "--no-replay", *args],
                       env=e, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def micro_mix(tmp_path_factory) -> str:
    return tj.build_mix("micro", str(tmp_path_factory.mktemp("traj") / "mix"))


def test_a_trajectory_prefix_is_the_golden_one_under_every_cheap_variant(micro_mix, tmp_path):
    def one(item):
        name, (env, args) = item
        return name, inside(micro_mix, str(tmp_path / str(abs(hash(name)))), env, args)
    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(one, VARIANTS.items()))
    for name, res in results.items():
        r = res["rows"]["micro"]
        assert "error" not in r, (name, r["error"])
        assert r["result"] is None, (f"{name}: step {r['result']['step']} "
                                    f"{r['result']['component']} differs from the golden")
    env = {n: r["machine"] for n, r in results.items()}
    assert env["1 thread, ATen default, extension on"]["torch_cpu_capability"] == "DEFAULT"
    assert env["2 threads, ATen avx2, extension off"]["mathc"] is False
    assert env["2 threads, ATen avx2, extension off"]["attention_loops"] is False
    on = env["1 thread, ATen default, extension on"]
    assert on["attention_loops"] is on["mathc"]          # both built, or neither
    # switched off is not broken: no extension failed to load (an unloadable build is named)
    assert env["2 threads, ATen avx2, extension off"]["mathc_errors"] == on["mathc_errors"]
    assert on["mathc"] or on["mathc_errors"]
    assert env["3 threads, extension off, matmul precision medium"]["torch_threads"] == 3
    assert results["3 threads, extension off, matmul precision medium"][
        "matmul_precision_set"] == {"mkldnn": "bf16", "cuda": "tf32"}


def test_flush_to_zero_is_refused_naming_the_setting(micro_mix, tmp_path):
    r = inside(micro_mix, str(tmp_path), {}, ["--flush-denormal"], steps=1)
    if not r.get("flush_denormal_set"):
        pytest.skip("this CPU has no flush-to-zero mode")
    assert "flushes subnormal floats to zero" in r["rows"]["micro"]["error"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_fma_contracted_extension_is_detected(micro_mix, tmp_path):
    if os.uname().machine != "x86_64":
        pytest.skip("-mfma is an x86 flag")
    r = inside(micro_mix, str(tmp_path), {}, ["--fma-control"], steps=2)
    diff = r["rows"]["micro"]["result"]
    assert diff is not None and diff["step"] == 1, "FMA contraction went unnoticed"


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_loops_built_as_an_avx2_cpu_give_the_golden_lines(micro_mix, tmp_path):
    """The matrix's avx2-build row, as a prefix: this checkout with its loops built with
    -DOPEN1B_CPU_CAP=1 runs the AVX2 copies of every compiled loop (an AVX-512 CPU runs its
    own otherwise, so they went untested here), the pair GEMM and the float64 attention
    products - the golden lines all the same. A cap the build ignored (the x86-64-v4 copies,
    VNNI rows or the library's int8 GEMM still chosen) fails the machine record's checks."""
    if os.uname().machine != "x86_64":
        pytest.skip("the cap names x86-64 levels")
    from open1b_kernels.int8.route import cpu_flags
    if "avx2" not in cpu_flags():
        pytest.skip("this CPU has no AVX2: the build's copies are above what it runs")
    spec = importlib.util.spec_from_file_location(
        "portability_check", os.path.join(ROOT, "scripts", "portability_check.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    root = script.copy_tree(sys.executable, str(tmp_path / "tree"), script.BUILDS["avx2-build"])
    env, _, _ = script.ROWS["avx2-build"]
    r = inside(micro_mix, str(tmp_path / "work"), env, [], root=root)
    m = r["machine"]
    assert m["mathc"] and m["mathc_cpu_cap"] == 1, m
    assert m["int_gemm"]["route"] == "pairs" and m["attention"] == "float64", m
    assert m["torch_cpu_capability"] == "AVX2", m
    micro = r["rows"]["micro"]
    assert "error" not in micro, micro["error"]
    assert micro["result"] is None, (f"step {micro['result']['step']} "
                                     f"{micro['result']['component']} differs from the golden")


def test_a_row_whose_copy_does_not_build_is_reported_not_run(tmp_path, monkeypatch):
    # the avx2-build row's copy of the checkout built by an interpreter that fails: the row
    # says so by name ("crashed", the build) instead of running a copy without its loops
    spec = importlib.util.spec_from_file_location(
        "portability_check", os.path.join(ROOT, "scripts", "portability_check.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script.sys, "executable", shutil.which("false") or "/bin/false")
    got = script.run_row("avx2-build", None, str(tmp_path))
    assert got["status"] == "crashed" and "building the row's copy" in got["detail"], got
