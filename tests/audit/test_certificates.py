"""Certificates (signed and not), assignment, coverage with gaps and conflicts, through
the real open1b-audit command."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from open1b_audit import certificate
from open1b_audit.assign import assign
from open1b_audit.coverage import coverage
from open1b_train import runlog
from testkit.runs import cli_env


def _audit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "open1b_audit.cli", *args], env=cli_env(),
                          capture_output=True, text=True, timeout=600)


def test_assignment_covers_every_step_r_times_by_distinct_auditors():
    steps = list(range(1, 101))
    a = assign(steps, 7, 3, seed=11)
    per_step = {s: [k for k, v in a.items() if s in v] for s in steps}
    assert all(len(set(v)) == 3 for v in per_step.values())
    sizes = sorted(len(v) for v in a.values())
    assert sizes[-1] - sizes[0] <= 1 and sum(sizes) == 300
    assert assign(steps, 7, 3, seed=11) == a and assign(steps, 7, 3, seed=12) != a
    with pytest.raises(Exception, match="redundancy"):
        assign(steps, 2, 3, seed=1)


@pytest.mark.slow
def test_replay_certify_sign_and_cover(ref_run, tmp_path):
    key = str(tmp_path / "auditor.pem")
    r = _audit("keygen", key)
    assert r.returncode == 0, r.stderr
    certs = tmp_path / "certs"
    r = _audit("replay", ref_run, "--step", "4", "--certify", str(certs), "--key", key,
               "--auditor", "alice", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["verdict"] == "match" and rep["verified_steps"] == [3, 4]
    assert rep["peak_memory_bytes"] > 0 and rep["treefold_peak_partials"] == 1
    c4 = certificate.read(str(certs / "step-00000004.json"))
    lines = runlog.read(ref_run)
    assert c4["output_state"]["hash"] == lines[4]["hash"]
    assert c4["input_state"]["hash"] == lines[3]["hash"]
    assert c4["components"] == lines[4]["components"]
    assert certificate.verify(c4) == c4["signature"]["public_key"]
    # coverage: steps 3 and 4 by one signed auditor, the rest are gaps
    cov = coverage(lines, [(p.name, certificate.read(str(p))) for p in certs.iterdir()])
    assert sorted(cov["certified"]) == [3, 4] and cov["gaps"] == [1, 2, 5, 6, 7, 8]
    assert not cov["conflicts"]
    r = _audit("coverage", ref_run, str(certs), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["covered"] == 2
    # an edited certificate no longer verifies; a conflicting one fails loudly
    bad = dict(c4, output_state={**c4["output_state"], "hash": "0" * 64})
    with pytest.raises(certificate.CertificateError, match="does not verify"):
        certificate.verify(bad)
    forged = certificate.sign(bad, key)                      # signed, but another hash
    path = tmp_path / "forged.json"
    certificate.write(forged, str(path))
    r = _audit("coverage", ref_run, str(certs), str(path))
    assert r.returncode == 1 and "CONFLICT step 4" in r.stdout
