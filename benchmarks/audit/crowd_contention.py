"""Claim contention when a thousand auditors join the Open-1B crowd at the same moment.

The plan is Open-1B's shape (``open1b_audit.crowd.plan.derive``: 80,957 steps, a checkpoint
every 100, ``--leg-steps`` per leg, redundancy ``--redundancy``), the store a local
directory, the claims the real code (``claim.choose`` on the ledger as listed, then
``claim.try_claim``: a conditional create of a signed claim). The worst case is modelled: all
``--auditors`` list the ledger before any of them claims (one snapshot), then take turns in
rounds, in a random order, one create each, as ``join`` does: a lost create moves to the
auditor's next candidate, and after ``join.RESCAN_AFTER`` lost in a row it lists the ledger
again and chooses afresh. Counted: creates that lost (the name was taken), creates per claim
won, listings again, and the listing's and the choice's time.

    python -m benchmarks.audit.crowd_contention [--auditors 1000] [--leg-steps 4]
        [--redundancy 2] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

from benchmarks.machine import RESULTS, LoadLog, describe

STEPS, EVERY = 80_957, 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--auditors", type=int, default=1000)
    ap.add_argument("--leg-steps", type=int, default=4)
    ap.add_argument("--redundancy", type=int, default=2)
    ap.add_argument("--out", default=str(RESULTS / "results-crowd-contention.md"))
    args = ap.parse_args()

    from open1b_audit import certificate
    from open1b_audit.crowd import claim as cl
    from open1b_audit.crowd.ledger import scan
    from open1b_audit.crowd.plan import derive
    from open1b_audit.crowd.join import RESCAN_AFTER
    from open1b_audit.crowd.store import Store

    load = LoadLog()
    work = tempfile.mkdtemp(prefix="open1b-contention-")
    try:
        plan = derive("ab" * 32, STEPS, list(range(EVERY, STEPS, EVERY)), args.leg_steps,
                      args.redundancy, 24 * 3600.0, 1800.0)
        store = Store(os.path.join(work, "store"))
        keys = []
        for i in range(args.auditors):
            p = os.path.join(work, f"k{i}.pem")
            keys.append((p, certificate.keygen(p)))
        t0 = time.perf_counter()
        views = scan(store, plan)
        scan_s = time.perf_counter() - t0
        holders = cl.Holders(store)
        now = time.time()
        # every auditor lists the ledger before any claims: the worst burst
        t0 = time.perf_counter()
        lists = [cl.choose(views, plan, holders, k, now, random.Random(i))
                 for i, (_, k) in enumerate(keys)]
        choose_s = (time.perf_counter() - t0) / len(keys)
        startable = len(lists[0])
        lost, attempts, rescans = [0] * len(keys), 0, 0
        streak = [0] * len(keys)
        won: set[int] = set()
        rng = random.Random(7)
        t0 = time.perf_counter()
        while len(won) < len(keys):
            turn = [i for i in range(len(keys)) if i not in won]
            rng.shuffle(turn)                      # one attempt each, in a random order
            progress = False
            for i in turn:
                path, key = keys[i]
                if not lists[i] or streak[i] >= RESCAN_AFTER:   # join lists the ledger again
                    lists[i] = cl.choose(scan(store, plan), plan, holders, key, time.time(),
                                         random.Random(f"{i}:{rescans}"))
                    streak[i] = 0
                    rescans += 1
                if not lists[i]:
                    continue
                leg, slot, gen = lists[i].pop(0)
                attempts += 1
                if cl.try_claim(store, plan, path, key, leg, slot, gen) is not None:
                    won.add(i)
                    progress = True
                else:
                    lost[i] += 1
                    streak[i] += 1
            if not progress and all(not lists[i] for i in range(len(keys)) if i not in won):
                break
        claim_s = time.perf_counter() - t0
        load.sample("claimed")
        t0 = time.perf_counter()
        views = scan(store, plan)
        rescan_s = time.perf_counter() - t0
        held = sum(1 for lv in views.values() for cv in lv.claims.values())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    won = len(won)
    text = [
        "# Claim contention at Open-1B scale (benchmarks/audit/crowd_contention.py)", "",
        f"- command: `python -m benchmarks.audit.crowd_contention --auditors {args.auditors} "
        f"--leg-steps {args.leg_steps} --redundancy {args.redundancy}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {describe()}",
        f"- {load.summary()}",
        f"- plan: {STEPS:,} steps, a checkpoint every {EVERY} ({len(plan.checkpoints) + 1} "
        f"units), {len(plan.legs):,} legs of <= {args.leg_steps} steps, redundancy "
        f"{args.redundancy}; startable at the start (a published state): {startable:,} "
        f"(leg, slot) pairs", "",
        "| auditors | claims won | creates that lost | lost per claim | most lost by one | "
        "creates per claim | listings again | claims held after | listing s (empty / after) "
        "| choice ms per auditor | claims s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {len(keys):,} | {won:,} | {sum(lost):,} | **{sum(lost) / max(won, 1):.2f}** | "
        f"{max(lost)} | {attempts / max(won, 1):.2f} | {rescans:,} | {held:,} | "
        f"{scan_s:.3f} / {rescan_s:.3f} | {1000 * choose_s:.1f} | {claim_s:.1f} |", ""]
    with open(args.out, "w") as f:
        f.write("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
