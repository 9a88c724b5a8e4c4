"""``open1b-audit assign``: which auditor checks which steps.

A deterministic function of (steps, K auditors, redundancy r, seed S): the steps are put in
a seeded pseudorandom order (sorted by SHA-256 of ``"open1b-assign/1:<S>:<step>"``), and the
j-th step of that order goes to auditors ``(j * r + i) mod K`` for i = 0 .. r-1. So every
step is covered by exactly r distinct auditors (r <= K), every auditor gets
``ceil(r * n / K)`` or ``floor`` of them, and which steps an auditor gets cannot be
predicted without the seed (publish the seed after the run, so the trainer could not know
which steps go unchecked by whom).
"""
from __future__ import annotations

import hashlib

from open1b_audit.errors import Open1bAuditError


def assign(steps: list[int], auditors: int, redundancy: int, seed: int) -> dict[int, list[int]]:
    """{auditor index: ascending steps}."""
    if auditors < 1 or not 1 <= redundancy <= auditors:
        raise Open1bAuditError(f"need 1 <= --redundancy ({redundancy}) <= --auditors "
                               f"({auditors}): a step's auditors must be distinct")
    order = sorted(steps, key=lambda s: hashlib.sha256(
        f"open1b-assign/1:{seed}:{s}".encode()).digest())
    out: dict[int, list[int]] = {a: [] for a in range(auditors)}
    for j, s in enumerate(order):
        for i in range(redundancy):
            out[(j * redundancy + i) % auditors].append(s)
    return {a: sorted(v) for a, v in out.items()}
