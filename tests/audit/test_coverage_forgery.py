"""Coverage counts what a forger cannot fake: signed certificates, one per distinct key,
and with ``--trusted-keys`` only the keys listed. Unsigned certificates under invented
names, and certificates signed by keys nobody trusts, are listed and never counted; a bad
signature, a malformed certificate and a "mismatch" verdict are conflicts, and the report
still completes."""
from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from open1b_audit import certificate
from open1b_audit.cli import main as audit_cli
from open1b_audit.coverage import coverage
from open1b_train.chain import Finding
from testkit.auditors import on_recipe
from testkit.fakelog import lines_of, write_run

STEPS = 8


def _cli(*args: str):
    return CliRunner().invoke(audit_cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    lines = lines_of(STEPS)
    return write_run(str(tmp_path_factory.mktemp("cov") / "run"), lines), lines


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("alice", "mallory1", "mallory2", "mallory3"):
        p = str(d / f"{name}.pem")
        out[name] = (p, certificate.keygen(p))
    return out


def _cert(lines, step, auditor, key=None, finding=None):
    """What replay --certify writes - but written straight from the log: nothing replayed."""
    c = certificate.build(lines, step, {"components": lines[step]["components"]}, finding,
                          auditor, "cpu", {}, step - 1, on_recipe(lines))
    return certificate.sign(c, key) if key else c


def _write(d, certs) -> str:
    os.makedirs(d, exist_ok=True)
    for i, c in enumerate(certs):
        path = os.path.join(d, f"c{i:03d}.json")
        if isinstance(c, (bytes, str)):
            with open(path, "wb") as f:
                f.write(c if isinstance(c, bytes) else c.encode())
        else:
            certificate.write(c, path)
    return d


def test_unsigned_certificates_under_invented_names_count_for_nothing(run, tmp_path):
    run_dir, lines = run
    d = _write(str(tmp_path / "c"), [_cert(lines, s, who) for s in range(1, STEPS + 1)
                                     for who in ("ann", "bob", "cat")])
    res = _cli("coverage", run_dir, d, "--redundancy", "3", "--json")
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["covered"] == 0 and rep["gaps"] == list(range(1, STEPS + 1))
    assert len(rep["unsigned"]) == 3 * STEPS and rep["keys_counted"] == 0
    res = _cli("coverage", run_dir, d, "--redundancy", "3")
    assert "0 of 8 steps" in res.stdout and "unsigned (not counted)" in res.stdout


def test_fresh_keys_count_only_when_trusted(run, keys, tmp_path):
    run_dir, lines = run
    certs = [_cert(lines, s, n, keys[n][0]) for s in range(1, STEPS + 1)
             for n in ("mallory1", "mallory2", "mallory3")]
    certs += [_cert(lines, s, "alice", keys["alice"][0]) for s in (1, 2)]
    d = _write(str(tmp_path / "c"), certs)
    # without a trust list any key counts - said on standard error, with the count
    res = _cli("coverage", run_dir, d, "--redundancy", "3")
    assert res.exit_code == 0 and "8 of 8 steps" in res.stdout
    assert ("warning" in res.stderr and "any key counts" in res.stderr and
        "4 distinct key(s)" in res.stderr)
    # the trust list: alice's KEY.pub as keygen wrote it, plus a raw hex key and a comment
    trust = tmp_path / "trusted"
    trust.write_text("# the audit committee\n" + open(keys["alice"][0] + ".pub").read()
                     + "\n" + "ab" * 32 + "\n")
    assert certificate.read_trusted_keys(str(trust)) == {keys["alice"][1], "ab" * 32}
    rep = json.loads(_cli("coverage", run_dir, d, "--trusted-keys", str(trust), "--json").stdout)
    assert rep["covered"] == 2 and rep["certified"] == {"1": [keys["alice"][1]],
                                                        "2": [keys["alice"][1]]}
    assert len(rep["untrusted"]) == 3 * STEPS and rep["trusted_keys"] == 2
    res = _cli("coverage", run_dir, d, "--trusted-keys", str(trust), "--redundancy", "3")
    assert "0 of 8 steps" in res.stdout and "untrusted key (not counted)" in res.stdout
    assert "warning" not in res.stderr
    trust.write_text("not a key\n")
    res = _cli("coverage", run_dir, d, "--trusted-keys", str(trust))
    assert (res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1 and
        "line 1 is neither" in res.stderr)


def test_a_signed_mismatch_is_a_conflict_never_credited(run, keys, tmp_path):
    run_dir, lines = run
    bad = _cert(lines, 3, "alice", keys["alice"][0],
                finding=Finding(3, "grad", "the reduced gradient differs"))
    assert bad["input_state"]["hash"] == lines[2]["hash"]       # the log's own hashes
    rep = coverage(lines, [("bad.json", bad)])
    assert rep["certified"] == {} and rep["covered"] == 0 and 3 in rep["gaps"]
    assert [(c["step"], c["certificate"]) for c in rep["conflicts"]] == [(3, "bad.json")]
    res = _cli("coverage", run_dir, _write(str(tmp_path / "c"), [bad]))
    assert res.exit_code == 1 and "CONFLICT step 3" in res.stdout and "0 of 8" in res.stdout


def test_bad_signature_and_malformed_certificates_are_listed_conflicts(run, keys, tmp_path):
    run_dir, lines = run
    good = _cert(lines, 1, "alice", keys["alice"][0])
    edited = json.loads(json.dumps(_cert(lines, 2, "alice", keys["alice"][0])))
    edited["auditor"] = "someone else"                         # signature no longer holds
    wrong = [dict(good, step="3"), dict(good, run=5), {k: v for k, v in good.items()
                                                       if k != "output_state"},
             dict(good, signature={"algorithm": "ed25519", "public_key": 7, "value": []}),
             dict(good, components=[1, 2])]
    d = _write(str(tmp_path / "c"), [good, edited, *wrong, "[" * 100000, b"\xff\x00", "[]"])
    res = _cli("coverage", run_dir, d, "--json")
    assert res.exit_code == 1 and "Traceback" not in res.output
    rep = json.loads(res.stdout)
    assert rep["covered"] == 1 and rep["certified"] == {"1": [keys["alice"][1]]}
    assert len(rep["conflicts"]) == 1 + len(wrong) + 3
    whys = " | ".join(c["why"] for c in rep["conflicts"])
    assert "does not verify" in whys and "nested too deeply" in whys and "step must be" in whys
    res = _cli("coverage", run_dir, d)
    assert res.stdout.count("CONFLICT") == len(rep["conflicts"])
