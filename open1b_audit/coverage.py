"""``open1b-audit coverage RUN CERTS...``: what a set of certificates establishes.

Every certificate is read, its signature verified (a bad signature is an error), and
checked against the run's log: the same genesis, and for its step the same input and
output state hashes as the published log - a "match" certificate about other hashes is a
*conflict* (it certifies a different run), as is a "mismatch" certificate, and as are two
certificates of one step that disagree with each other. An auditor is identified by its
public key when the certificate is signed, else by its declared name (marked unsigned).
The report lists, per step, the distinct auditors that certified it; the steps certified
fewer than ``redundancy`` times (gaps); and every conflict. Conflicts fail the command.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from open1b_audit import certificate


def coverage(lines: list[dict[str, Any]], certs: list[tuple[str, dict]],
             redundancy: int = 1) -> dict[str, Any]:
    by_step: dict[int, set[str]] = defaultdict(set)
    conflicts: list[dict[str, Any]] = []
    seen: dict[int, tuple[str, dict]] = {}
    last = len(lines) - 1
    for path, cert in certs:
        key = certificate.verify(cert)             # raises on a bad signature
        who = key if key is not None else f"unsigned:{cert.get('auditor')}"
        s = cert.get("step")
        if not isinstance(s, int) or not 1 <= s <= last:
            conflicts.append({"certificate": path, "step": s,
                              "why": f"certifies step {s!r}, which this run does not log"})
            continue
        if cert["run"]["genesis"] != lines[0]["hash"]:
            conflicts.append({"certificate": path, "step": s,
                              "why": "it is about another run (its genesis differs)"})
            continue
        if cert["verdict"] != "match":
            conflicts.append({"certificate": path, "step": s, "auditor": who,
                              "why": f"the auditor's replay disagrees: {cert.get('finding')}"})
            continue
        pub_in, pub_out = lines[s - 1]["hash"], lines[s]["hash"]
        if (cert["input_state"]["hash"], cert["output_state"]["hash"]) != (pub_in, pub_out):
            conflicts.append({"certificate": path, "step": s, "auditor": who,
                              "why": "it certifies other state hashes than the run's log"})
            continue
        prev = seen.get(s)
        if prev is not None and prev[1]["components"] != cert["components"]:
            conflicts.append({"certificate": path, "step": s, "auditor": who,
                              "why": f"it disagrees with {prev[0]} about the step's "
                                     f"component digests"})
            continue
        seen.setdefault(s, (path, cert))
        by_step[s].add(who)
    steps = list(range(1, last + 1))
    gaps = [s for s in steps if len(by_step[s]) < redundancy]
    return {"steps": last, "redundancy": redundancy,
            "certified": {s: sorted(by_step[s]) for s in steps if by_step[s]},
            "covered": sum(1 for s in steps if len(by_step[s]) >= redundancy),
            "gaps": gaps, "conflicts": conflicts, "run_hash": lines[-1]["hash"]}
