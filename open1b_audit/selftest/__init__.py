"""``open1b-audit selftest``: does this machine compute the runtime's bits? The first thing
an auditor runs (docs/AUDIT.md), in minutes on a laptop CPU, with nothing but the package:

1. re-derives the ``demo`` preset's initial weights from the seed (the demo mix's
   vocabulary and seed) and compares their digest with the committed one;
2. builds the golden micro trajectory's mix from the corpus shipped in ``data/``
   (``trajectory.py``; its fingerprint must be the golden one) and trains its first
   ``STEPS`` steps on each backend available here - the CPU reference always; the Triton
   kernels when CUDA is present, or under the Triton interpreter (in a subprocess with
   ``TRITON_INTERPRET=1``) when triton is installed and ``interpreter=True`` - comparing
   every component of every step with the committed golden lines;
3. on a difference, re-runs the step's per-op trace and names the first operator whose
   output differs from the committed trace.

The report (``run_selftest``) holds the machine's description (``machine.describe``) and a
verdict per check; ``--json`` prints it whole, to attach to a certificate. What it trusts:
the committed expected values (``data/expected.json``, written with the goldens by the
test module's ``--write``, never by hand) - they come with the release the auditor trusts.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from open1b_audit.errors import SelftestError
from open1b_audit.selftest import expected as expected_mod
from open1b_audit.selftest import machine, trajectory


def check_init(exp: dict[str, Any]) -> dict[str, Any]:
    want = exp["demo_init"]
    got = expected_mod.demo_init_digest(want["vocab"], want["seed"])
    return {"check": "demo init", "vocab": want["vocab"], "seed": want["seed"],
            "verdict": "MATCH" if got == want["params"] else "MISMATCH",
            "expected": want["params"], "got": got}


def replay_prefix(backend: str, mix: str, work: str, steps: int,
                  exp: dict[str, Any]) -> dict[str, Any]:
    """Train the micro trajectory's first ``steps`` steps on ``backend`` in this process,
    compare with the golden lines, name the first differing operator."""
    from open1b_audit import trace as tracemod
    from open1b_train import trace as traintrace

    t0 = time.perf_counter()
    run = os.path.join(work, f"run-{backend}")
    lines = trajectory.train_lines("micro", mix, run, steps=steps, backend=backend,
                                   trace_steps=frozenset(range(1, steps + 1)))
    golden = dict(exp["micro"], lines=exp["micro"]["lines"][:steps])
    diff = trajectory.first_difference(golden, lines)
    out: dict[str, Any] = {"check": f"micro trajectory steps 1-{steps}", "backend": backend,
                           "steps": steps, "verdict": "MATCH" if diff is None else "MISMATCH",
                           "difference": diff, "seconds": round(time.perf_counter() - t0, 2)}
    if diff is not None and str(diff["step"]) in exp["traces"]:
        _, ours = traintrace.read(traintrace.path_of(run, diff["step"]))
        theirs = [tuple(x) for x in exp["traces"][str(diff["step"])]]
        out["operator"] = tracemod.first_difference(theirs, ours)
    return out


def _interpreted(mix: str, work: str, steps: int) -> dict[str, Any]:
    """``replay_prefix`` on the Triton interpreter, in a child with TRITON_INTERPRET=1 (the
    kernels read it when triton is imported)."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    code = ("import json, sys; from open1b_audit.selftest import expected, replay_prefix; "
            f"print(json.dumps(replay_prefix('triton', {mix!r}, {work!r}, {steps}, "
            "expected.load())))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if p.returncode != 0:
        return {"check": f"micro trajectory steps 1-{steps}", "backend": "triton-interpreter",
                "verdict": "ERROR", "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["backend"] = "triton-interpreter"
    return out


def backends(interpreter: bool) -> list[str]:
    """The backends this machine can check: cpu, and triton (CUDA) or triton-interpreter."""
    import torch

    from open1b_kernels.core.backend import HAVE_TRITON

    out = ["cpu"]
    if HAVE_TRITON and torch.cuda.is_available():
        out.append("triton")
    elif HAVE_TRITON and interpreter:
        out.append("triton-interpreter")
    return out


def run_selftest(steps: int = expected_mod.STEPS, interpreter: bool = False,
                 interpreter_steps: int = 1, work: str | None = None) -> dict[str, Any]:
    """The whole selftest (module docstring); ``ok`` is True when every check matched."""
    if not 1 <= steps <= expected_mod.STEPS:
        raise ValueError(f"steps must be in [1, {expected_mod.STEPS}] (the committed golden "
                         f"lines), got {steps}")
    from open1b_kernels.core import ieee

    try:
        ieee.require_ieee()                  # before minutes of work it could not trust
    except ieee.FlushToZeroError as e:
        raise SelftestError(str(e)) from None
    t0 = time.perf_counter()
    exp = expected_mod.load()
    report: dict[str, Any] = {"machine": machine.describe(), "checks": []}
    report["checks"].append(check_init(exp))
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        mix = trajectory.build_mix("micro", os.path.join(tmp, "mix"))
        with open(os.path.join(mix, "manifest.json")) as f:
            fp = json.load(f)["fingerprint"]
        ok_mix = fp == exp["micro"]["mix_fingerprint"]
        report["checks"].append({"check": "trajectory mix", "verdict": "MATCH" if ok_mix
                                 else "MISMATCH", "expected": exp["micro"]["mix_fingerprint"],
                                 "got": fp})
        if ok_mix:
            for b in backends(interpreter):
                if b == "triton-interpreter":
                    report["checks"].append(_interpreted(mix, tmp, min(steps, interpreter_steps)))
                else:
                    report["checks"].append(replay_prefix(b, mix, tmp, steps, exp))
    # after the work: the integer GEMM route may have switched (a failed checksum) and the
    # count of failed results is only known now
    from open1b_kernels.int8.route import int_gemm_status
    report["machine"]["int_gemm"] = int_gemm_status()
    report["ok"] = all(c["verdict"] == "MATCH" for c in report["checks"])
    report["verdict"] = "MATCH" if report["ok"] else "MISMATCH"
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report
