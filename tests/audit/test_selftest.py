"""``open1b-audit selftest``: MATCH on this machine against the committed expected values,
the machine described for a certificate, and a genuine difference (one exp result off by
one ulp) named by step, component and operator."""
from __future__ import annotations

import json
import re

import torch
from click.testing import CliRunner

from open1b_audit.cli import main
from open1b_audit.selftest import run_selftest


def test_selftest_matches_and_describes_the_machine(tmp_path):
    r = CliRunner().invoke(main, ["selftest", "--steps", "2", "--json", "--work", str(tmp_path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["verdict"] == "MATCH" and rep["ok"]
    checks = {c["check"] + c.get("backend", ""): c for c in rep["checks"]}
    assert checks["demo init"]["verdict"] == "MATCH"
    assert checks["micro trajectory steps 1-2cpu"]["verdict"] == "MATCH"
    m = rep["machine"]
    assert m["torch"] == torch.__version__ and m["flush"] == {"ftz": False, "daz": False}
    assert m["cpu"]["arch"] and isinstance(m["cpu"]["flags"], list)
    assert "torch_cpu_capability" in m and isinstance(m["mathc"], bool)
    assert isinstance(m["attention_loops"], bool)
    # the exact integer GEMM route that ran is named, with its checksum failures counted
    assert m["int_gemm"]["route"] in ("amx", "int", "pairs", "float")
    assert m["int_gemm"]["failures"] == 0 and isinstance(m["attention_tiles"], bool)
    # the loops on, or the extension that is missing named with its reason
    assert isinstance(m["attention_vnni"], bool) and (m["mathc"] or m["mathc_errors"])


def test_selftest_names_the_first_differing_step_component_and_operator(tmp_path,
                                                                         monkeypatch):
    from open1b_kernels.core import mathfn

    exp = mathfn.exp

    def off_by_one_ulp(x, *a, **k):      # a machine whose exp differs in the last bit
        y = exp(x, *a, **k)
        bits = y.view(torch.int32)
        return torch.where(y > 0.5, (bits + 1).view(torch.float32), y)
    monkeypatch.setattr(mathfn, "exp", off_by_one_ulp)
    # RoPE's tables are the step's exp calls outside the compiled loops; the process keeps
    # them per shape (open1b_kernels.ops.rope._tables_cached), so this simulated machine builds its
    # own - uncached, and without leaving its tables in the cache for later tests
    from open1b_kernels.ops import rope
    monkeypatch.setattr(rope, "_tables_cached", rope.tables)
    rep = run_selftest(steps=1, work=str(tmp_path))
    assert rep["verdict"] == "MISMATCH"
    (cpu,) = [c for c in rep["checks"] if c.get("backend") == "cpu"]
    assert cpu["difference"]["step"] == 1 and cpu["difference"]["component"] == "grad"
    assert cpu["operator"]["why"] == "the op's output differs"
    # the first op whose output differs in the trace's order (which rank's op comes first
    # depends on where the one-ulp change survives bf16 rounding), named down to rank,
    # micro-batch and op
    op = cpu["operator"]
    assert re.fullmatch(r"rank\d+\.mb0\..+", op["name"]) and op["op"] and op["stage"] == "model"


def test_selftest_refuses_a_process_that_flushes_subnormals(tmp_path):
    before = torch.set_flush_denormal(True)
    try:
        if not before:
            return                    # this CPU has no FTZ/DAZ: nothing to refuse
        r = CliRunner().invoke(main, ["selftest", "--steps", "1", "--work", str(tmp_path)])
    finally:
        torch.set_flush_denormal(False)
    assert r.exit_code == 1
    assert "flushes subnormal floats to zero" in r.output and "FTZ" in r.output


def test_selftest_names_a_missing_extension(tmp_path, monkeypatch):
    """An extension that failed to load is said in the human report, with what runs instead:
    a broken build must not pass for a plain "off"."""
    from open1b_kernels.core import mathc

    monkeypatch.setattr(mathc, "import_errors",
                        lambda: {"open1b_kernels.int8._int8c": "undefined symbol: pack"})
    r = CliRunner().invoke(main, ["selftest", "--steps", "1", "--work", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert ("C math extension open1b_kernels.int8._int8c missing: undefined symbol: pack - "
            "the torch definitions run instead") in r.output
