"""``open1b-audit coverage RUN CERTS...``: what a set of certificates establishes.

Anyone can write a certificate, and anyone can make a key, so redundancy counts only what
a name cannot fake: *signed* certificates whose signature verifies, one per distinct public
key - and with ``trusted`` (``--trusted-keys FILE``) only the keys listed there. Unsigned
certificates and those signed by an untrusted key are listed, marked, and never counted.

Every certificate is checked (never an exception, the report always completes):

* unreadable or malformed (not JSON, wrong types, missing fields, nested too deeply), or a
  signature that does not verify: a *conflict*, listed with why;
* about another run (genesis), a step this run does not log, a "mismatch" verdict, other
  input or output state hashes than the run's log, or other component digests than the
  log's for that step: a *conflict* - a "mismatch" certificate is never credited.

The report lists per step the distinct keys that certified it, the steps certified by
fewer than ``redundancy`` of them (gaps), the unsigned and untrusted certificates, and
every conflict. Conflicts fail the command.

Recipe: a certificate counts only when the recipe it signs (preset, mix fingerprint and
departures, ``open1b_train.recipe``) is the announced one - ``announce.preset`` and
``announce.mix`` when given - with no departure. Others are *off recipe*: listed with why,
and the steps they certify are reported apart (``off_recipe_steps``), never added to the
coverage; any of them fails the command, as does a run whose own genesis or config is not
the announced recipe (``run_recipe``).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from open1b_audit import certificate
from open1b_audit.certificate import CertificateError
from open1b_train.recipe import Announcement, on_recipe


def read_all(paths: list[str]) -> list[tuple[str, dict[str, Any] | CertificateError]]:
    """Each certificate file, or the error that makes it unreadable."""
    out: list[tuple[str, dict[str, Any] | CertificateError]] = []
    for p in paths:
        try:
            out.append((p, certificate.read(p)))
        except CertificateError as e:
            out.append((p, e))
    return out


def spans(steps: list[int]) -> str:
    """Ascending ``steps`` as ranges: ``1-20, 23-24, 30`` (every step, however many)."""
    out: list[str] = []
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def _why_not(lines: list[dict[str, Any]], cert: dict[str, Any]) -> str | None:
    """Why a well-formed certificate is not about the published steps as logged (None: it
    is a match certificate of a logged step, with the log's hashes and digests)."""
    s, last = cert["step"], len(lines) - 1
    if not 1 <= s <= last:
        return f"certifies step {s!r}, which this run does not log"
    if cert["run"]["genesis"] != lines[0].get("hash"):
        return "it is about another run (its genesis differs)"
    if cert["verdict"] != "match":
        return f"the auditor's replay disagrees: {cert.get('finding')}"
    if ((cert["input_state"]["hash"], cert["output_state"]["hash"]) !=
            (lines[s - 1].get("hash"), lines[s].get("hash"))):
        return "it certifies other state hashes than the run's log"
    if cert["components"] is not None and cert["components"] != lines[s].get("components"):
        return "its component digests differ from the run's log for the step"
    return None


def coverage(lines: list[dict[str, Any]],
             certs: list[tuple[str, dict[str, Any] | CertificateError]],
             redundancy: int = 1, trusted: set[str] | None = None,
             announce: Announcement = Announcement(), run_recipe: str | None = None
             ) -> dict[str, Any]:
    """The report (see the module docstring); ``run_recipe``: why the run itself is not the
    announced recipe (``Announcement.refusal``), or None."""
    by_step: dict[int, set[str]] = defaultdict(set)
    off_step: dict[int, set[str]] = defaultdict(set)
    conflicts: list[dict[str, Any]] = []
    unsigned: list[dict[str, Any]] = []
    untrusted: list[dict[str, Any]] = []
    off_recipe: list[dict[str, Any]] = []
    for path, cert in certs:
        if isinstance(cert, CertificateError):
            conflicts.append({"certificate": path, "step": None,
                              "why": f"unreadable: {cert}"})
            continue
        try:
            key = certificate.verify(cert)
        except CertificateError as e:
            step = cert.get("step") if isinstance(cert, dict) else None
            conflicts.append({"certificate": path,
                              "step": step if type(step) is int else None, "why": str(e)})
            continue
        s = cert["step"]
        who = key if key is not None else f"unsigned:{cert.get('auditor')}"
        why = _why_not(lines, cert)
        if why is not None:
            conflicts.append({"certificate": path, "step": s, "auditor": who, "why": why})
            continue
        if key is None:
            unsigned.append({"certificate": path, "step": s, "auditor": cert.get("auditor")})
        elif trusted is not None and key not in trusted:
            untrusted.append({"certificate": path, "step": s, "key": key,
                              "auditor": cert.get("auditor")})
        else:
            off = run_recipe or on_recipe(cert.get("recipe"), announce.preset, announce.mix)
            if off is None:
                by_step[s].add(key)
            else:
                off_step[s].add(key)
                off_recipe.append({"certificate": path, "step": s, "key": key, "why": off})
    last = len(lines) - 1
    steps = list(range(1, last + 1))
    keys = set().union(*by_step.values()) if by_step else set()
    return {"steps": last, "redundancy": redundancy,
            "certified": {s: sorted(by_step[s]) for s in steps if by_step[s]},
            "covered": sum(1 for s in steps if len(by_step[s]) >= redundancy),
            "gaps": [s for s in steps if len(by_step[s]) < redundancy],
            "keys_counted": len(keys),
            "trusted_keys": None if trusted is None else len(trusted),
            "unsigned": unsigned, "untrusted": untrusted,
            "off_recipe": off_recipe, "run_recipe": run_recipe,
            "off_recipe_steps": sorted(s for s in off_step if not by_step[s]),
            "announced": {"preset": announce.preset, "mix": announce.mix},
            "conflicts": conflicts, "run_hash": lines[-1].get("hash")}


def not_counted(rep: dict[str, Any]) -> dict[str, str]:
    """Certificate path -> why ``coverage``'s report ``rep`` does not count it."""
    return {x["certificate"]: f"no: {why}" for kind, why in (
        ("conflicts", "a conflict (see coverage)"), ("unsigned", "unsigned"),
        ("untrusted", "not a trusted key")) for x in rep[kind]}
