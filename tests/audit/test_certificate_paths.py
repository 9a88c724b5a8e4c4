"""Two auditors certifying into one folder keep both certificates (the forgery-free failure
this stops: the second replay silently replacing the first auditor's signed certificate,
so coverage counts one auditor where two certified)."""
from __future__ import annotations

import os

from open1b_audit import certificate


def _signed(tmp_path, name: str, step: int) -> dict:
    key = str(tmp_path / f"{name}.pem")
    if not os.path.exists(key):
        certificate.keygen(key)
    return certificate.sign({"step": step, "auditor": name}, key)


def test_a_second_signer_gets_its_own_file_and_the_same_signer_replaces_its_own(tmp_path):
    folder = str(tmp_path / "certs")
    os.makedirs(folder)
    a, b = _signed(tmp_path, "a", 4), _signed(tmp_path, "b", 4)
    pa = certificate.path_for(folder, 4, a)
    assert pa == os.path.join(folder, "step-00000004.json")
    certificate.write(a, pa)
    pb = certificate.path_for(folder, 4, b)
    assert pb != pa and pb.endswith(f"-{b['signature']['public_key'][:16]}.json")
    certificate.write(b, pb)
    assert certificate.path_for(folder, 4, _signed(tmp_path, "a", 4)) == pa   # a again: its own
    assert certificate.path_for(folder, 4, b) == pb
    signers = {certificate.read(os.path.join(folder, n))["signature"]["public_key"]
               for n in os.listdir(folder)}
    assert signers == {a["signature"]["public_key"], b["signature"]["public_key"]}


def test_an_unsigned_certificate_never_replaces_a_signed_one(tmp_path):
    folder = str(tmp_path)
    a = _signed(tmp_path, "a", 7)
    certificate.write(a, certificate.path_for(folder, 7, a))
    p = certificate.path_for(folder, 7, {"step": 7})
    assert p.endswith("step-00000007-unsigned.json")
